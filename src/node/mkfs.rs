//! Making a filesystem: the mkfs command line (no discard, no forcing,
//! no table zeroing on a pool that zeroes new chunks) and its run.

use std::path::Path;

use crate::error::{Error, Result};
use crate::node::Tools;

/// The mkfs command line. No discard pass (a fresh thin volume has nothing
/// to discard, and discarding 100 GiB takes long), and no inode table or
/// journal zeroing: on ext4 `lazy_*_init`, and `assume_storage_prezeroed`
/// when the pool zeroes newly provisioned chunks, which marks the tables
/// as zeroed so the kernel's lazy-init thread does not write them either
/// (thin volumes read zeros where never written).
pub fn mkfs_command(fs_type: &str, dev: &Path, prezeroed: bool) -> Result<(String, Vec<String>)> {
    let dev = dev.to_string_lossy().into_owned();
    match fs_type {
        "ext4" => {
            let mut ext = String::from("nodiscard,lazy_itable_init=1,lazy_journal_init=1");
            if prezeroed {
                ext.push_str(",assume_storage_prezeroed=1");
            }
            Ok(("mkfs.ext4".into(), crate::argv!["-q", "-E", ext, dev]))
        }
        "xfs" => Ok(("mkfs.xfs".into(), crate::argv!["-q", "-K", dev])),
        other => Err(Error::InvalidArgument(format!(
            "fs_type {other:?} is not supported"
        ))),
    }
}

/// Makes a filesystem on `dev`. Never forced: mkfs.ext4 and mkfs.xfs
/// themselves refuse a device that is mounted or holds a filesystem, a
/// second guard behind blkid.
pub(super) async fn mkfs(tools: &Tools, fs_type: &str, dev: &Path, prezeroed: bool) -> Result<()> {
    let started = std::time::Instant::now();
    // e2fsprogs before 1.47 does not know assume_storage_prezeroed (and
    // rejects the whole command line): asked of its version, not guessed
    // from a failure.
    let prezeroed = prezeroed && (fs_type != "ext4" || ext4_knows_prezeroed(tools).await?);
    let (program, args) = mkfs_command(fs_type, dev, prezeroed)?;
    tools.run(&program, &args).await?;
    tracing::info!(device = %dev.display(), fs_type, prezeroed, elapsed = ?started.elapsed(), "made filesystem");
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
        let (p, a) = mkfs_command("ext4", Path::new("/dev/v/l"), true).unwrap();
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
        let (_, a) = mkfs_command("ext4", Path::new("/dev/v/l"), false).unwrap();
        assert!(!a[2].contains("prezeroed"));
        let (p, a) = mkfs_command("xfs", Path::new("/dev/v/l"), true).unwrap();
        assert_eq!(
            (p.as_str(), a),
            (
                "mkfs.xfs",
                vec!["-q".to_string(), "-K".into(), "/dev/v/l".into()]
            )
        );
        for (_, args) in [
            mkfs_command("ext4", Path::new("/d"), true).unwrap(),
            mkfs_command("xfs", Path::new("/d"), true).unwrap(),
        ] {
            assert!(!args.iter().any(|a| a == "-F" || a == "-f"));
        }
        assert!(mkfs_command("btrfs", Path::new("/d"), false).is_err());
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
