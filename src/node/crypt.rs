//! LUKS2 volumes through dm-crypt, with Debian's `cryptsetup`.
//!
//! A passphrase is a [`Secret`]: it reaches `cryptsetup` only on a pipe
//! (`exec::run_with_input`: stdin, and fd 3 for a second key), never a
//! command line, the environment, a file or a log line, and its `Debug`
//! prints nothing of it. What a failure means is decided by `cryptsetup`'s
//! exit code (its man page: 1 wrong parameters, 2 no permission (bad
//! passphrase), 3 out of memory, 4 wrong device, 5 device exists or busy),
//! never by its text.
//!
//! Mappings are opened with `--disable-keyring`: the volume key sits in the
//! dm-crypt table, so `cryptsetup resize` grows an open mapping without
//! the passphrase (NodeExpandVolume has no secret), and no kernel keyring
//! (often restricted in containers) is involved.

use std::path::{Path, PathBuf};

use crate::config::{Encryption, Pbkdf};
use crate::error::{Error, Result};
use crate::exec;
use crate::node::Tools;

/// Name prefix of the dm-crypt mappings this driver opens.
pub const MAPPING_PREFIX: &str = "tpcsi-crypt-";

/// The secret key a passphrase comes in (`csi.storage.k8s.io/node-stage-secret-*`,
/// and the rotation's `secrets`).
pub const PASSPHRASE_KEY: &str = "passphrase";
/// The secret key of a passphrase tried when `passphrase` is refused
/// (the one a rotation in progress is replacing).
pub const PREVIOUS_PASSPHRASE_KEY: &str = "previousPassphrase";
/// The secret key of the passphrase a rotation moves to when its call
/// names none (the csi-addons sidecar sends the node-stage Secret and no
/// `encryption_key`); tried last by a stage.
pub const NEXT_PASSPHRASE_KEY: &str = "nextPassphrase";

/// cryptsetup's exit code for a passphrase that opens no key slot.
const EXIT_BAD_PASSPHRASE: i32 = 2;
/// cryptsetup's exit code for "device already exists or is busy".
const EXIT_BUSY: i32 = 5;

/// A passphrase. Its bytes are overwritten when it is dropped; `Debug`
/// shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// The passphrases a stage may open a volume with: `passphrase`, then
/// `previousPassphrase` and `nextPassphrase` (a rotation under way)
/// when the first is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    pub current: Secret,
    pub previous: Option<Secret>,
    pub next: Option<Secret>,
}

impl Keys {
    pub fn each(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .chain(self.next.as_ref())
    }
}

/// The dm-crypt mapping name of a volume: the prefix and its id, the id's
/// tail replaced by a digest where the whole would pass device-mapper's
/// 127 characters.
pub fn mapping_name(volume_id: &str) -> String {
    const MAX: usize = 127;
    let whole = format!("{MAPPING_PREFIX}{volume_id}");
    if whole.len() <= MAX {
        return whole;
    }
    let digest = crate::node::paths::digest(Path::new(volume_id));
    let keep = MAX - MAPPING_PREFIX.len() - digest.len() - 1;
    format!("{MAPPING_PREFIX}{}-{digest}", &volume_id[..keep])
}

/// Where device-mapper's node of a mapping is.
pub fn mapping_path(name: &str) -> PathBuf {
    Path::new("/dev/mapper").join(name)
}

/// The argv of `luksFormat` for `dev` with the class's key-derivation
/// settings; the key comes on stdin.
pub fn format_args(enc: &Encryption, dev: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "luksFormat",
        "--type",
        "luks2",
        "--batch-mode",
        "--key-file=-",
    ]
    .map(String::from)
    .to_vec();
    a.extend(pbkdf_args(enc));
    a.push(dev.display().to_string());
    a
}

/// The key-derivation options of a new key slot.
fn pbkdf_args(enc: &Encryption) -> Vec<String> {
    let mut a = vec!["--pbkdf".to_string(), enc.pbkdf.as_str().to_string()];
    if enc.pbkdf != Pbkdf::Pbkdf2 && enc.pbkdf_memory_kib > 0 {
        a.extend(["--pbkdf-memory".into(), enc.pbkdf_memory_kib.to_string()]);
    }
    if enc.pbkdf_iterations > 0 {
        a.extend([
            "--pbkdf-force-iterations".into(),
            enc.pbkdf_iterations.to_string(),
        ]);
    } else if enc.iter_time_ms > 0 {
        a.extend(["--iter-time".into(), enc.iter_time_ms.to_string()]);
    }
    a
}

/// The argv of `open` of `dev` as `name`; the key comes on stdin.
pub fn open_args(dev: &Path, name: &str, discards: bool) -> Vec<String> {
    let mut a: Vec<String> = [
        "open",
        "--type",
        "luks2",
        "--key-file=-",
        "--disable-keyring",
    ]
    .map(String::from)
    .to_vec();
    if discards {
        a.push("--allow-discards".into());
    }
    a.extend([dev.display().to_string(), name.to_string()]);
    a
}

fn exit_code(e: &Error) -> Option<i32> {
    match e {
        Error::Command { code, .. } => *code,
        Error::Advised { error, .. } => exit_code(error),
        _ => None,
    }
}

/// How many key derivations run at once. Each takes the key slot's
/// memory cost (`encryption.pbkdf_memory_kib`, 256 MiB by default) in the
/// driver's cgroup: kubelet stages many volumes at once after a reboot,
/// and the node plugin's memory limit (1 GiB in the shipped manifests)
/// must hold them.
pub const PARALLEL_KDF: usize = 2;
static KDF: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(PARALLEL_KDF);

/// Runs cryptsetup with `keys` on its pipes, at most [`PARALLEL_KDF`] at once.
async fn cryptsetup(tools: &Tools, args: Vec<String>, keys: &[&Secret]) -> Result<()> {
    let _slot = KDF
        .acquire()
        .await
        .map_err(|_| Error::Internal("the key-derivation semaphore is closed".into()))?;
    let inputs: Vec<&[u8]> = keys.iter().map(|k| k.bytes()).collect();
    exec::run_with_input("cryptsetup", &args, env(tools), tools.timeout, &inputs).await?;
    Ok(())
}

/// cryptsetup's environment: without udev, its device-mapper library
/// must neither wait for udev nor leave /dev/mapper to it.
fn env(tools: &Tools) -> &'static [(&'static str, &'static str)] {
    if tools.no_udev {
        &[("DM_DISABLE_UDEV", "1")]
    } else {
        &[]
    }
}

/// cryptsetup with no key.
async fn run_keyless(tools: &Tools, args: &[String]) -> Result<exec::Output> {
    exec::run("cryptsetup", args, env(tools), tools.timeout).await
}

/// Whether `dev` holds a LUKS header (`cryptsetup isLuks`: 0 yes, 1 no).
pub async fn is_luks(tools: &Tools, dev: &Path) -> Result<bool> {
    let args = vec!["isLuks".to_string(), dev.display().to_string()];
    match run_keyless(tools, &args).await {
        Ok(_) => Ok(true),
        Err(e) if exit_code(&e) == Some(1) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes a new LUKS2 header with one key slot for `key` on `dev`. The
/// caller has proven `dev` blank (or holding only an unfinished format of
/// its own).
pub async fn format(tools: &Tools, enc: &Encryption, dev: &Path, key: &Secret) -> Result<()> {
    cryptsetup(tools, format_args(enc, dev), &[key]).await?;
    tracing::info!(device = %dev.display(), pbkdf = enc.pbkdf.as_str(), "wrote a LUKS2 header");
    Ok(())
}

/// UNAUTHENTICATED: no passphrase given opens `what`.
pub fn refused(what: &str) -> Error {
    Error::Unauthenticated(format!(
        "the passphrase in the secret's {PASSPHRASE_KEY:?} (and {PREVIOUS_PASSPHRASE_KEY:?}, if given) opens no key slot of {what}; nothing was changed"
    ))
}

/// Opens `dev` as the mapping `name`, trying each of `keys` in turn;
/// UNAUTHENTICATED when none opens it (nothing changes then).
pub async fn open(
    tools: &Tools,
    dev: &Path,
    name: &str,
    keys: &Keys,
    discards: bool,
) -> Result<()> {
    for key in keys.each() {
        match cryptsetup(tools, open_args(dev, name, discards), &[key]).await {
            Ok(()) => {
                tracing::info!(device = %dev.display(), name, discards, "opened the LUKS2 volume");
                return Ok(());
            }
            Err(e) if exit_code(&e) == Some(EXIT_BAD_PASSPHRASE) => continue,
            Err(e) if exit_code(&e) == Some(EXIT_BUSY) => {
                return Err(Error::FailedPrecondition(format!(
                    "cannot open {} as {name}: a device of that name exists or the LV is busy ({e})",
                    dev.display()
                ))
                .advise(format!("close what holds it (cryptsetup close {name}, after unmounting), then retry")))
            }
            Err(e) => return Err(e),
        }
    }
    Err(refused(&dev.display().to_string()))
}

/// Whether `key` opens a key slot of `dev` (`open --test-passphrase`).
pub async fn opens(tools: &Tools, dev: &Path, key: &Secret) -> Result<bool> {
    let args: Vec<String> = [
        "open",
        "--type",
        "luks2",
        "--test-passphrase",
        "--key-file=-",
    ]
    .map(String::from)
    .into_iter()
    .chain([dev.display().to_string()])
    .collect();
    match cryptsetup(tools, args, &[key]).await {
        Ok(()) => Ok(true),
        Err(e) if exit_code(&e) == Some(EXIT_BAD_PASSPHRASE) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes a device of the mapping's name that has no live table (a
/// cryptsetup killed between making the device and loading it leaves
/// one, which no `open` could replace). `true` when it removed one.
pub async fn remove_stale(tools: &Tools, name: &str) -> Result<bool> {
    let n = name.to_string();
    let stale = tools
        .blocking("look for a table-less crypt mapping", move || {
            Ok(crate::sys::dm_has_table(&n)? == Some(false))
        })
        .await?;
    if !stale {
        return Ok(false);
    }
    let mut args = crate::argv!["remove", "--retry", name];
    args.extend(crate::node::dm::udev_args(tools));
    tools.run("dmsetup", &args).await?;
    tracing::warn!(name, "removed a crypt mapping left without a table");
    Ok(true)
}

/// Closes the mapping `name` when it exists (one left without a table
/// is removed).
pub async fn close(tools: &Tools, name: &str) -> Result<()> {
    if remove_stale(tools, name).await? {
        return Ok(());
    }
    let n = name.to_string();
    let open = tools
        .blocking("look for a crypt mapping", move || {
            Ok(crate::sys::dm_numbers(&n)?.is_some())
        })
        .await?;
    if !open {
        return Ok(());
    }
    match run_keyless(tools, &["close".to_string(), name.to_string()]).await {
        Ok(_) => {
            tracing::info!(name, "closed the LUKS2 mapping");
            Ok(())
        }
        Err(e) if exit_code(&e) == Some(EXIT_BUSY) => Err(Error::FailedPrecondition(format!(
            "the crypt mapping {name} is still in use: {e}"
        ))
        .advise("unmount or close what holds it, then retry")),
        Err(e) => Err(e),
    }
}

/// Grows the open mapping `name` to its LV (the key is in its table).
pub async fn resize(tools: &Tools, name: &str) -> Result<()> {
    run_keyless(tools, &["resize".to_string(), name.to_string()]).await?;
    tracing::info!(name, "grew the LUKS2 mapping to its LV");
    Ok(())
}

/// Adds `new` as a key slot of `dev`, authenticated by `current` (stdin;
/// the new key on fd 3).
pub async fn add_key(
    tools: &Tools,
    enc: &Encryption,
    dev: &Path,
    current: &Secret,
    new: &Secret,
) -> Result<()> {
    let mut args: Vec<String> = ["luksAddKey", "--batch-mode", "--key-file=-"]
        .map(String::from)
        .to_vec();
    args.extend(pbkdf_args(enc));
    args.extend([dev.display().to_string(), "/proc/self/fd/3".to_string()]);
    match cryptsetup(tools, args, &[current, new]).await {
        Err(e) if exit_code(&e) == Some(EXIT_BAD_PASSPHRASE) => {
            Err(refused(&dev.display().to_string()))
        }
        other => other,
    }?;
    tracing::info!(device = %dev.display(), "added a LUKS2 key slot");
    Ok(())
}

/// The key slots of the LUKS2 header on `dev`, from its JSON metadata
/// (`luksDump --dump-json-metadata`).
pub async fn key_slots(tools: &Tools, dev: &Path) -> Result<Vec<u32>> {
    let args = crate::argv![
        "luksDump",
        "--dump-json-metadata",
        dev.display().to_string()
    ];
    let out = run_keyless(tools, &args).await?;
    parse_key_slots(&out.stdout)
}

/// The key slot numbers of a LUKS2 JSON metadata document.
pub fn parse_key_slots(json: &str) -> Result<Vec<u32>> {
    let bad = |why: String| Error::Internal(format!("LUKS2 metadata: {why}"));
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let slots = v
        .get("keyslots")
        .and_then(|k| k.as_object())
        .ok_or_else(|| bad("no keyslots object".into()))?;
    let mut out = slots
        .keys()
        .map(|k| k.parse::<u32>().map_err(|_| bad(format!("key slot {k:?}"))))
        .collect::<Result<Vec<u32>>>()?;
    out.sort_unstable();
    Ok(out)
}

/// Whether `key` opens key slot `slot` of `dev`.
pub async fn opens_slot(tools: &Tools, dev: &Path, key: &Secret, slot: u32) -> Result<bool> {
    let args = crate::argv![
        "open",
        "--type",
        "luks2",
        "--test-passphrase",
        "--key-slot",
        slot.to_string(),
        "--key-file=-",
        dev.display().to_string()
    ];
    match cryptsetup(tools, args, &[key]).await {
        Ok(()) => Ok(true),
        Err(e) if exit_code(&e) == Some(EXIT_BAD_PASSPHRASE) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Wipes key slot `slot` of `dev`; cryptsetup first checks that `keep`
/// opens a slot that stays.
pub async fn kill_slot(tools: &Tools, dev: &Path, slot: u32, keep: &Secret) -> Result<()> {
    let args = crate::argv![
        "luksKillSlot",
        "--key-file=-",
        dev.display().to_string(),
        slot.to_string()
    ];
    cryptsetup(tools, args, &[keep]).await?;
    tracing::info!(device = %dev.display(), slot, "wiped a LUKS2 key slot");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_names_fit_device_mapper_and_are_stable() {
        let short = mapping_name("csi-pvc-1-0123456789abcdef");
        assert_eq!(short, "tpcsi-crypt-csi-pvc-1-0123456789abcdef");
        let long_id = format!(
            "{}.{}",
            "c".repeat(32),
            crate::naming::lv_name_for(&"x".repeat(128))
        );
        let long = mapping_name(&long_id);
        assert!(long.len() <= 127, "{long}");
        assert!(long.starts_with(MAPPING_PREFIX));
        assert_eq!(long, mapping_name(&long_id));
        assert_ne!(long, mapping_name(&format!("{long_id}x")));
        assert_eq!(mapping_path(&short), Path::new("/dev/mapper").join(&short));
    }

    #[test]
    fn no_argv_holds_a_key_and_settings_reach_luks_format() {
        let enc = Encryption {
            pbkdf: Pbkdf::Pbkdf2,
            pbkdf_iterations: 1000,
            pbkdf_memory_kib: 4096,
            ..Encryption::default()
        };
        let f = format_args(&enc, Path::new("/dev/vg/lv"));
        assert_eq!(
            f.join(" "),
            "luksFormat --type luks2 --batch-mode --key-file=- --pbkdf pbkdf2 --pbkdf-force-iterations 1000 /dev/vg/lv",
            "pbkdf2 takes no memory cost"
        );
        let argon = Encryption {
            pbkdf_memory_kib: 65536,
            iter_time_ms: 500,
            ..Encryption::default()
        };
        let f = format_args(&argon, Path::new("/dev/vg/lv")).join(" ");
        assert!(
            f.contains("--pbkdf argon2id --pbkdf-memory 65536 --iter-time 500"),
            "{f}"
        );
        let o = open_args(Path::new("/dev/vg/lv"), "tpcsi-crypt-x", false).join(" ");
        assert_eq!(
            o,
            "open --type luks2 --key-file=- --disable-keyring /dev/vg/lv tpcsi-crypt-x"
        );
        assert!(open_args(Path::new("/d"), "n", true).contains(&"--allow-discards".to_string()));
    }

    #[test]
    fn key_slots_come_from_the_json_metadata() {
        let json =
            r#"{"keyslots":{"0":{"type":"luks2"},"2":{"type":"luks2"}},"tokens":{},"segments":{}}"#;
        assert_eq!(parse_key_slots(json).unwrap(), vec![0, 2]);
        assert!(parse_key_slots(r#"{"tokens":{}}"#).is_err());
        assert!(parse_key_slots(r#"{"keyslots":{"x":{}}}"#).is_err());
        assert!(parse_key_slots("not json").is_err());
    }

    #[test]
    fn a_secret_never_prints() {
        let s = Secret::new("hunter2-passphrase");
        let keys = Keys {
            current: s.clone(),
            previous: Some(Secret::new("older")),
            next: None,
        };
        let shown = format!("{keys:?} {s:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("older"),
            "{shown}"
        );
        assert!(shown.contains("18 bytes"), "{shown}");
        assert!(refused("/dev/x").to_string().contains(PASSPHRASE_KEY));
    }
}
