//! Space reclaim (node layer): give blocks that hold no data back to the
//! thin pool. Filesystems get FITRIM on a mount; an unused raw block device
//! gets BLKDISCARD only on runs that read back as all zeroes, so every byte
//! of data stays as it was.

use std::path::Path;

use crate::error::{Error, Result};
use crate::sys::{self, MsFlags};

/// A filesystem mount of the device `major:minor`, if there is one: where
/// FITRIM can run. Found from the mount table, never from a path a caller
/// gave, so no path can point the trim at another filesystem.
pub fn fs_mount_of(major: u32, minor: u32) -> Result<Option<(std::path::PathBuf, String)>> {
    let table = super::mount_table()?;
    Ok(table
        .mounts_of_device(major, minor)
        .into_iter()
        .find(|m| crate::config::FS_TYPES.contains(&m.fs_type.as_str()))
        .map(|m| (m.mount_point.clone(), m.fs_type.clone())))
}

/// FITRIM on a mounted filesystem, after flushing it. XFS skips extents
/// freed by transactions not yet checkpointed, so it gets a second
/// flush-and-trim pass. Returns the bytes the filesystem reports trimmed.
pub fn trim_filesystem(mountpoint: &Path, fs_type: &str) -> Result<u64> {
    let passes = if fs_type == "xfs" { 2 } else { 1 };
    let mut trimmed = 0;
    for _ in 0..passes {
        sys::sync_filesystem(mountpoint)?;
        trimmed += sys::fitrim(mountpoint, 0)?;
    }
    Ok(trimmed)
}

/// Mounts `dev` privately (nosuid, nodev, noexec) at `dir`, trims it and
/// unmounts it again, also when the trim fails.
pub fn trim_unmounted(dev: &Path, fs_type: &str, dir: &Path) -> Result<u64> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let data = (fs_type == "xfs").then_some("nouuid");
    sys::mount_fs(
        dev,
        dir,
        fs_type,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        data,
    )?;
    let res = trim_filesystem(dir, fs_type);
    let unmounted = sys::unmount(dir);
    let _ = std::fs::remove_dir(dir);
    let trimmed = res?;
    unmounted?;
    Ok(trimmed)
}

/// Discards every `run`-byte run of `dev` that reads back as all zeroes
/// (consecutive runs in one call). The device is held with O_EXCL for the
/// whole pass, so no mount or exclusive user can appear meanwhile. Returns
/// the bytes discarded. `run` must be a multiple of 512 and should be a
/// multiple of the pool's chunk size, or discards free nothing.
pub fn discard_zero_runs(dev: &Path, run: u64) -> Result<u64> {
    if run == 0 || run % 512 != 0 {
        return Err(Error::InvalidArgument(format!(
            "zero-run size {run} must be a positive multiple of 512"
        )));
    }
    let claim = sys::open_exclusive(dev)?;
    let size = claim.size_bytes()?;
    let mut buf = vec![0u8; run as usize];
    let mut pending: Option<(u64, u64)> = None;
    let mut discarded = 0;
    let mut flush = |p: &mut Option<(u64, u64)>| -> Result<()> {
        if let Some((off, len)) = p.take() {
            claim.discard(off, len)?;
            discarded += len;
        }
        Ok(())
    };
    let mut off = 0;
    while off + run <= size {
        let n = claim.read_at(off, &mut buf)?;
        if n as u64 == run && is_zero(&buf) {
            pending = Some(match pending {
                Some((start, len)) => (start, len + run),
                None => (off, run),
            });
        } else {
            flush(&mut pending)?;
        }
        off += run;
    }
    flush(&mut pending)?;
    tracing::info!(device = %dev.display(), run, discarded, "discarded zero runs");
    Ok(discarded)
}

fn is_zero(buf: &[u8]) -> bool {
    let words = buf.chunks_exact(8);
    let tail = words.remainder();
    words
        .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
        .all(|w| w == 0)
        && tail.iter().all(|b| *b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        let mut b = vec![0u8; 4096 + 3];
        assert!(is_zero(&b));
        assert!(is_zero(&b[1..]));
        b[4097] = 1;
        assert!(!is_zero(&b));
        assert!(!is_zero(&b[1..]));
        b[4097] = 0;
        b[0] = 9;
        assert!(!is_zero(&b));
    }

    #[test]
    fn bad_run_sizes_are_refused_before_touching_anything() {
        let e = discard_zero_runs(Path::new("/nonexistent"), 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        let e = discard_zero_runs(Path::new("/nonexistent"), 1000).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
    }

    /// Root-only: a loop device over a sparse file with a pattern and zero
    /// regions; only the zero regions are punched out of the file, and
    /// the pattern reads back identical.
    #[test]
    fn zero_runs_are_discarded_and_data_kept() {
        use std::os::unix::fs::MetadataExt;
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root (loop devices)"
        );
        let dir = std::env::temp_dir().join(format!("tpcsi-zero-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("img");
        const MIB: usize = 1 << 20;
        // 8 MiB: odd MiBs hold a pattern, even MiBs hold written zeroes.
        let mut content = vec![0u8; 8 * MIB];
        for m in (1..8).step_by(2) {
            for (i, b) in content[m * MIB..(m + 1) * MIB].iter_mut().enumerate() {
                *b = (i % 251) as u8 + 1;
            }
        }
        std::fs::write(&file, &content).unwrap();
        let before = std::fs::metadata(&file).unwrap().blocks() * 512;
        assert!(
            before >= 8 * MIB as u64,
            "the zeroes must be allocated to start with"
        );
        let dev = sys::attach_loop(&file).unwrap();
        let res = discard_zero_runs(&dev, 64 << 10);
        sys::detach_loop(&dev).unwrap();
        let discarded = res.unwrap();
        let after = std::fs::metadata(&file).unwrap().blocks() * 512;
        let back = std::fs::read(&file).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(discarded, 4 * MIB as u64);
        assert!(
            before - after >= 4 * MIB as u64,
            "before {before} after {after}"
        );
        assert!(back == content, "data changed");
    }
}
