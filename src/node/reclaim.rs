//! Space reclaim (node layer): give blocks that hold no data back to the
//! thin pool. Filesystems get FITRIM on a mount; an unused raw block device
//! gets BLKDISCARD only on runs that read back as all zeroes, so every byte
//! of data stays as it was.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// When a reclaim stops early: its caller went away (the flag is set), or
/// its time is up. Checked between steps, so a reclaim never runs on
/// unbounded and discards nothing once it is told to stop.
#[derive(Debug, Clone)]
pub struct Stop {
    cancelled: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Stop {
    pub fn new(cancelled: Arc<AtomicBool>, bound: Duration) -> Stop {
        Stop {
            cancelled,
            deadline: Instant::now().checked_add(bound),
        }
    }

    /// Never stops early (tests).
    pub fn never() -> Stop {
        Stop {
            cancelled: Arc::default(),
            deadline: None,
        }
    }

    /// Why to stop now, if at all.
    fn why(&self) -> Option<&'static str> {
        if self.cancelled.load(Ordering::Relaxed) {
            Some("its caller went away")
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some("its time bound passed")
        } else {
            None
        }
    }
}

/// FITRIM goes over the filesystem in slices of this many bytes, so a
/// reclaim can stop between two.
const TRIM_SLICE: u64 = 1 << 30;

/// FITRIM on the filesystem of `device` (major, minor), `size` bytes,
/// mounted at `mountpoint`, after flushing it, one slice at a time until
/// done or told to stop: both through one descriptor of the mount point
/// checked to be the root of a mount of `device` ([`sys::open_mount_root`]),
/// so a mount or symlink put over the path meanwhile is refused, not
/// trimmed. XFS skips extents freed by transactions not yet checkpointed,
/// so it gets a second flush-and-trim pass. Returns the bytes the
/// filesystem reports trimmed.
pub fn trim_filesystem(
    mountpoint: &Path,
    device: (u32, u32),
    fs_type: &str,
    size: u64,
    stop: &Stop,
) -> Result<u64> {
    let root = sys::open_mount_root(mountpoint, device)?;
    let passes = if fs_type == "xfs" { 2 } else { 1 };
    let mut trimmed = 0;
    for _ in 0..passes {
        sys::sync_filesystem(&root, mountpoint)?;
        let mut start = 0;
        while start < size {
            if let Some(why) = stop.why() {
                tracing::warn!(mountpoint = %mountpoint.display(), start, why, "trim stopped early");
                return Ok(trimmed);
            }
            trimmed += sys::fitrim(&root, mountpoint, start, TRIM_SLICE, 0)?;
            start += TRIM_SLICE;
        }
    }
    Ok(trimmed)
}

/// Unmounts the private mount at `dir`, waiting out a short busy spell: a
/// program another thread of the driver forked while the trim's fd was
/// open holds a copy of that fd until it execs (CLOEXEC closes it only
/// then), and the mount is busy for that moment. Seen in the VM, where a
/// fork takes milliseconds.
fn unmount_patiently(dir: &Path) -> std::result::Result<(), sys::SysError> {
    let mut tries = 0;
    loop {
        match sys::unmount(dir) {
            Err(e) if e.is_busy() && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => {
                if tries > 0 {
                    tracing::info!(dir = %dir.display(), tries, ok = other.is_ok(), "private mount was busy for a moment");
                }
                return other;
            }
        }
    }
}

/// Mounts `dev` privately (nosuid, nodev, noexec) at `dir`, trims it and
/// unmounts it again, also when the trim fails.
pub fn trim_unmounted(dev: &Path, fs_type: &str, dir: &Path, stop: &Stop) -> Result<u64> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let data = (fs_type == "xfs").then_some("nouuid");
    sys::mount_fs(
        dev,
        dir,
        fs_type,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        data,
    )
    .map_err(|e| {
        Error::FailedPrecondition(format!(
            "cannot mount the volume's {fs_type} filesystem to trim it: {e}"
        ))
        .advise("stage the volume once (a volume never staged holds no filesystem to trim), or check it with fsck")
    })?;
    let res = (|| {
        let numbers = sys::device_numbers(dev)?
            .ok_or_else(|| Error::Internal(format!("{} is not a block device", dev.display())))?;
        let size = sys::block_size_bytes(dev)?;
        trim_filesystem(dir, numbers, fs_type, size, stop)
    })();
    let unmounted = unmount_patiently(dir);
    let _ = std::fs::remove_dir(dir);
    let trimmed = res?;
    unmounted?;
    Ok(trimmed)
}

/// The longest stretch discarded at once: a run read as zero is discarded
/// soon after it was read, never minutes later.
const MAX_PENDING: u64 = 64 << 20;

/// Discards every `run`-byte run of `dev` that reads back as all zeroes
/// (consecutive runs in one call, up to [`MAX_PENDING`]). The device is
/// held with O_EXCL for the whole pass, so no mount or exclusive user can
/// appear meanwhile; before each discard the scan makes sure it still
/// should run (`stop`) and that nobody else has opened the device (its
/// device-mapper open count, for LVs). It discards nothing more once
/// either fails. Returns the bytes discarded. `run` must be a multiple of
/// 512 and should be a multiple of the pool's chunk size, or discards free
/// nothing.
pub fn discard_zero_runs(dev: &Path, run: u64, stop: &Stop) -> Result<u64> {
    if run == 0 || run % 512 != 0 {
        return Err(Error::InvalidArgument(format!(
            "zero-run size {run} must be a positive multiple of 512"
        )));
    }
    let claim = sys::open_exclusive(dev)?;
    let size = claim.size_bytes()?;
    let numbers = sys::device_numbers(dev)?;
    // Our own claim is one opener; a device-mapper device shows more once
    // anybody else opens it.
    let baseline = numbers.and_then(|(ma, mi)| sys::dm_open_count(ma, mi).ok());
    let opened_by_others = || match (numbers, baseline) {
        (Some((ma, mi)), Some(base)) => sys::dm_open_count(ma, mi).map_or(true, |n| n > base),
        _ => false,
    };
    let mut buf = vec![0u8; run as usize];
    let mut pending: Option<(u64, u64)> = None;
    let mut discarded = 0;
    let mut stopped: Option<&'static str> = None;
    let mut flush =
        |p: &mut Option<(u64, u64)>, stopped: &mut Option<&'static str>| -> Result<()> {
            if let Some((off, len)) = p.take() {
                if let Some(why) = stop.why() {
                    *stopped = Some(why);
                    return Ok(());
                }
                if opened_by_others() {
                    *stopped = Some("the device was opened");
                    return Ok(());
                }
                claim.discard(off, len)?;
                discarded += len;
            }
            Ok(())
        };
    let mut off = 0;
    while off + run <= size && stopped.is_none() {
        let n = claim.read_at(off, &mut buf)?;
        if n as u64 == run && is_zero(&buf) {
            pending = Some(match pending {
                Some((start, len)) => (start, len + run),
                None => (off, run),
            });
            if pending.is_some_and(|(_, len)| len >= MAX_PENDING) {
                flush(&mut pending, &mut stopped)?;
            }
        } else {
            flush(&mut pending, &mut stopped)?;
        }
        if stopped.is_none() {
            if let Some(why) = stop.why() {
                stopped = Some(why);
            }
        }
        off += run;
    }
    if stopped.is_none() {
        flush(&mut pending, &mut stopped)?;
    }
    match stopped {
        Some(why) => {
            tracing::warn!(device = %dev.display(), run, discarded, at = off, why, "zero-run discard stopped early; nothing more discarded")
        }
        None => tracing::info!(device = %dev.display(), run, discarded, "discarded zero runs"),
    }
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
        let e = discard_zero_runs(Path::new("/nonexistent"), 0, &Stop::never()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
        let e = discard_zero_runs(Path::new("/nonexistent"), 1000, &Stop::never()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
    }

    /// A loop device over a file (8 MiB: odd MiBs hold a pattern, even
    /// MiBs hold written zeroes), detached again on drop, by its file.
    struct Scratch {
        dir: std::path::PathBuf,
        file: std::path::PathBuf,
        dev: std::path::PathBuf,
        content: Vec<u8>,
    }

    const MIB: usize = 1 << 20;

    impl Scratch {
        fn new(name: &str) -> Scratch {
            assert!(
                nix::unistd::geteuid().is_root(),
                "needs root (loop devices)"
            );
            let dir = std::env::temp_dir().join(format!("tpcsi-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("img");
            let mut content = vec![0u8; 8 * MIB];
            for m in (1..8).step_by(2) {
                for (i, b) in content[m * MIB..(m + 1) * MIB].iter_mut().enumerate() {
                    *b = (i % 251) as u8 + 1;
                }
            }
            std::fs::write(&file, &content).unwrap();
            assert!(
                Scratch::allocated(&file) >= 8 * MIB as u64,
                "the zeroes must be allocated to start with"
            );
            let dev = crate::pool::loopdev::attach_loop(&file).unwrap();
            Scratch {
                dir,
                file,
                dev,
                content,
            }
        }

        fn allocated(file: &Path) -> u64 {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(file).unwrap().blocks() * 512
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            // By file, never by number: the number may be another test's
            // by now.
            if let Ok(Some(dev)) = crate::pool::loopdev::find_loop_for_file(&self.file) {
                let _ = crate::pool::loopdev::detach_loop(&dev);
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Root-only: only the zero regions are punched out of the file, and
    /// the pattern reads back identical.
    #[test]
    fn zero_runs_are_discarded_and_data_kept() {
        let s = Scratch::new("zero");
        let before = Scratch::allocated(&s.file);
        let discarded = discard_zero_runs(&s.dev, 64 << 10, &Stop::never()).unwrap();
        let after = Scratch::allocated(&s.file);
        assert_eq!(discarded, 4 * MIB as u64);
        assert!(
            before - after >= 4 * MIB as u64,
            "before {before} after {after}"
        );
        assert!(std::fs::read(&s.file).unwrap() == s.content, "data changed");
    }

    /// Root-only: a scan whose task was cancelled discards nothing more.
    #[test]
    fn a_cancelled_scan_discards_nothing() {
        let s = Scratch::new("zero-cancelled");
        let before = Scratch::allocated(&s.file);
        let cancelled = Arc::new(AtomicBool::new(true));
        let stop = Stop::new(cancelled, Duration::from_secs(3600));
        let discarded = discard_zero_runs(&s.dev, 64 << 10, &stop).unwrap();
        assert_eq!(discarded, 0);
        assert_eq!(Scratch::allocated(&s.file), before);
        // Past its bound, the same.
        let late = Stop::new(Arc::default(), Duration::ZERO);
        assert_eq!(discard_zero_runs(&s.dev, 64 << 10, &late).unwrap(), 0);
        assert_eq!(Scratch::allocated(&s.file), before);
        assert!(std::fs::read(&s.file).unwrap() == s.content, "data changed");
    }
}
