//! Making a filesystem: the mkfs command line (no discard, no forcing,
//! no table zeroing on a pool that zeroes new chunks) and its run.

use std::path::Path;

use crate::error::{Error, Result};
use crate::fs_options::MkfsOptions;
use crate::node::Tools;

/// The mkfs command line. No discard pass (a fresh thin volume has nothing
/// to discard, and discarding 100 GiB takes long), and no inode table
/// zeroing: on ext4 `lazy_itable_init`, and `assume_storage_prezeroed`
/// (`prezeroed`) when the pool zeroes newly provisioned chunks, which
/// marks the tables as zeroed so the kernel's lazy-init thread does not
/// write them either (thin volumes read zeros where never written). The
/// journal is zeroed at mkfs unless the device reads zeros (`zeroed`): a
/// crypt mapping over a zeroed LV reads their decryption, and a stale
/// journal block could be replayed after a crash.
///
/// The volume's own options (`fs_options`, checked) come after the
/// driver's; ext4's `-E` list is joined to the driver's, since mke2fs
/// keeps only the last `-E` it is given.
pub fn mkfs_command(
    fs_type: &str,
    dev: &Path,
    zeroed: bool,
    prezeroed: bool,
    opts: &MkfsOptions,
) -> Result<(String, Vec<String>)> {
    let dev = dev.to_string_lossy().into_owned();
    let mut args: Vec<String> = vec!["-q".into()];
    let program = match fs_type {
        "ext4" => {
            let mut ext = format!(
                "nodiscard,lazy_itable_init=1,lazy_journal_init={}",
                u8::from(zeroed)
            );
            if zeroed && prezeroed {
                ext.push_str(",assume_storage_prezeroed=1");
            }
            for (opt, value) in opts.pairs() {
                match (opt, value) {
                    ("-E", Some(v)) => {
                        ext.push(',');
                        ext.push_str(v);
                    }
                    _ => args.extend([opt.to_string()].into_iter().chain(value.map(String::from))),
                }
            }
            args.extend(["-E".to_string(), ext]);
            "mkfs.ext4"
        }
        "xfs" => {
            args.push("-K".into());
            for (opt, value) in opts.pairs() {
                args.extend([opt.to_string()].into_iter().chain(value.map(String::from)));
            }
            "mkfs.xfs"
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "fs_type {other:?} is not supported"
            )))
        }
    };
    args.push(dev);
    Ok((program.into(), args))
}

/// Makes a filesystem on `dev`. Never forced: mkfs.ext4 and mkfs.xfs
/// themselves refuse a device that is mounted or holds a filesystem, a
/// second guard behind blkid.
pub(super) async fn mkfs(
    tools: &Tools,
    fs_type: &str,
    dev: &Path,
    prezeroed: bool,
    opts: &MkfsOptions,
) -> Result<()> {
    let started = std::time::Instant::now();
    // e2fsprogs before 1.47 does not know assume_storage_prezeroed (and
    // rejects the whole command line): asked of its version, not guessed
    // from a failure.
    let zeroed = prezeroed;
    let prezeroed = zeroed && (fs_type != "ext4" || ext4_knows_prezeroed(tools).await?);
    let (program, args) = mkfs_command(fs_type, dev, zeroed, prezeroed, opts)?;
    tools.run(&program, &args).await?;
    tracing::info!(device = %dev.display(), fs_type, prezeroed, options = opts.text(),
        elapsed = ?started.elapsed(), "made filesystem");
    Ok(())
}

/// Whether this node's mkfs.ext4 knows `-E assume_storage_prezeroed`
/// (e2fsprogs 1.47.0 and later), from `mkfs.ext4 -V`.
async fn ext4_knows_prezeroed(tools: &Tools) -> Result<bool> {
    let out = tools.run("mkfs.ext4", &["-V".to_string()]).await?;
    let version = e2fsprogs_version(&out.stderr).or_else(|| e2fsprogs_version(&out.stdout));
    if version.is_none() {
        tracing::warn!(
            stderr = out.stderr,
            "cannot read mkfs.ext4's version; not using assume_storage_prezeroed"
        );
    }
    Ok(version.is_some_and(|v| v >= (1, 47)))
}

/// The (major, minor) of `mke2fs 1.47.0 (5-Feb-2023)`, the first line
/// `mkfs.ext4 -V` prints.
fn e2fsprogs_version(text: &str) -> Option<(u32, u32)> {
    let version = text.lines().next()?.strip_prefix("mke2fs ")?;
    let mut parts = version.split(|c: char| c == '.' || c.is_whitespace());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkfs_never_discards_nor_forces() {
        let none = MkfsOptions::default();
        let (p, a) = mkfs_command("ext4", Path::new("/dev/v/l"), true, true, &none).unwrap();
        assert_eq!(p, "mkfs.ext4");
        assert_eq!(
            a,
            vec![
                "-q",
                "-E",
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1,assume_storage_prezeroed=1",
                "/dev/v/l"
            ]
        );
        let (_, a) = mkfs_command("ext4", Path::new("/dev/v/l"), true, false, &none).unwrap();
        assert_eq!(a[2], "nodiscard,lazy_itable_init=1,lazy_journal_init=1");
        // A device that does not read zeros (a crypt mapping) gets its
        // journal zeroed, and is never said to be prezeroed.
        let (_, a) = mkfs_command("ext4", Path::new("/dev/v/l"), false, true, &none).unwrap();
        assert_eq!(a[2], "nodiscard,lazy_itable_init=1,lazy_journal_init=0");
        let (p, a) = mkfs_command("xfs", Path::new("/dev/v/l"), true, true, &none).unwrap();
        assert_eq!(
            (p.as_str(), a),
            (
                "mkfs.xfs",
                vec!["-q".to_string(), "-K".into(), "/dev/v/l".into()]
            )
        );
        for (_, args) in [
            mkfs_command("ext4", Path::new("/d"), true, true, &none).unwrap(),
            mkfs_command("xfs", Path::new("/d"), true, true, &none).unwrap(),
        ] {
            assert!(!args.iter().any(|a| a == "-F" || a == "-f"));
        }
        assert!(mkfs_command("btrfs", Path::new("/d"), false, false, &none).is_err());
    }

    #[test]
    fn a_volumes_options_follow_the_drivers_and_join_its_extended_list() {
        let dev = Path::new("/dev/v/l");
        let opts = crate::fs_options::mkfs_options("ext4", "-b 1024 -E stride=16 -L data").unwrap();
        let (_, a) = mkfs_command("ext4", dev, true, false, &opts).unwrap();
        assert_eq!(
            a,
            vec![
                "-q",
                "-b",
                "1024",
                "-L",
                "data",
                "-E",
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1,stride=16",
                "/dev/v/l"
            ]
        );
        let opts = crate::fs_options::mkfs_options("xfs", "-m reflink=0 -L db").unwrap();
        let (_, a) = mkfs_command("xfs", dev, true, true, &opts).unwrap();
        assert_eq!(
            a,
            vec!["-q", "-K", "-m", "reflink=0", "-L", "db", "/dev/v/l"]
        );
    }

    #[test]
    fn e2fsprogs_versions_are_read_from_the_first_line() {
        let v147 = "mke2fs 1.47.0 (5-Feb-2023)\n\tUsing EXT2FS Library version 1.47.0\n";
        assert_eq!(e2fsprogs_version(v147), Some((1, 47)));
        assert_eq!(
            e2fsprogs_version("mke2fs 1.46.5 (30-Dec-2021)\n"),
            Some((1, 46))
        );
        assert_eq!(e2fsprogs_version("mkfs.xfs version 6.1.0"), None);
        assert_eq!(e2fsprogs_version(""), None);
    }
}
