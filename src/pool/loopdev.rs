//! Loop devices for a pool built on a sparse file: attach, find, status,
//! detach.
//!
//! The `loopdev` crates are not used: they generate their kernel bindings with
//! bindgen, which needs libclang at build time, and they attach a device in two
//! separate, non-atomic steps (`LOOP_SET_FD`, then `LOOP_SET_STATUS64`), leaving
//! a window in which another process can see a half-configured device. Here the
//! structs from `<linux/loop.h>` are declared by hand (their sizes are checked by
//! tests) and [`attach_loop`] uses the atomic `LOOP_CONFIGURE` (Linux 5.8+),
//! keeping the two-step sequence only as a fallback for older kernels.
//!
//! Loop devices are attached *without* `LO_FLAGS_AUTOCLEAR`: the thin pool lives
//! on them and must survive the driver process exiting or restarting.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::sys::{make_block_node, open, require_block_device, Result, SysError, SysErrorKind};

/// `LO_NAME_SIZE` from `<linux/loop.h>`.
pub(crate) const LO_NAME_SIZE: usize = 64;
/// `LO_KEY_SIZE` from `<linux/loop.h>`.
pub(crate) const LO_KEY_SIZE: usize = 32;

/// Loop flag: the device is read-only.
pub const LO_FLAGS_READ_ONLY: u32 = 1;
/// Loop flag: detach automatically on last close. Never set by this module.
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Loop flag: scan for partitions.
pub const LO_FLAGS_PARTSCAN: u32 = 8;
/// Loop flag: backing file accessed with direct I/O.
pub const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64` from `<linux/loop.h>` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

impl LoopInfo64 {
    pub(crate) fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        }
    }

    /// Info for a fresh attachment: whole file, no flags (in particular no
    /// autoclear), and the backing path as the informational file name.
    pub(crate) fn for_backing(path: &Path) -> Self {
        let mut info = Self::zeroed();
        info.lo_file_name = file_name_field(path);
        info
    }
}

/// The kernel keeps `LO_NAME_SIZE` bytes and forces the last one to NUL, so at
/// most 63 bytes of the path are stored; longer paths are cut (the
/// authoritative full path is in sysfs `loop/backing_file`).
pub(crate) fn file_name_field(path: &Path) -> [u8; LO_NAME_SIZE] {
    let mut field = [0u8; LO_NAME_SIZE];
    let bytes = path.as_os_str().as_bytes();
    let n = bytes.len().min(LO_NAME_SIZE - 1);
    field[..n].copy_from_slice(&bytes[..n]);
    field
}

/// `struct loop_config` from `<linux/loop.h>` (304 bytes), for `LOOP_CONFIGURE`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// ioctl request codes of the loop driver (`<linux/loop.h>` spells them
/// out) and their nix wrappers.
pub(crate) mod ioctl {
    use super::{LoopConfig, LoopInfo64};
    use crate::sys::Request;

    pub const LOOP_SET_FD: Request = 0x4C00;
    pub const LOOP_CLR_FD: Request = 0x4C01;
    pub const LOOP_SET_STATUS64: Request = 0x4C04;
    pub const LOOP_GET_STATUS64: Request = 0x4C05;
    pub const LOOP_SET_CAPACITY: Request = 0x4C07;
    pub const LOOP_CONFIGURE: Request = 0x4C0A;
    pub const LOOP_CTL_GET_FREE: Request = 0x4C82;

    nix::ioctl_write_int_bad!(loop_set_fd, LOOP_SET_FD);
    nix::ioctl_none_bad!(loop_clr_fd, LOOP_CLR_FD);
    nix::ioctl_write_ptr_bad!(loop_set_status64, LOOP_SET_STATUS64, LoopInfo64);
    nix::ioctl_read_bad!(loop_get_status64, LOOP_GET_STATUS64, LoopInfo64);
    nix::ioctl_write_ptr_bad!(loop_configure, LOOP_CONFIGURE, LoopConfig);
    nix::ioctl_none_bad!(loop_ctl_get_free, LOOP_CTL_GET_FREE);
    nix::ioctl_none_bad!(loop_set_capacity, LOOP_SET_CAPACITY);
}

const LOOP_CONTROL: &str = "/dev/loop-control";
pub(crate) const DEV_DIR: &str = "/dev";
pub(crate) const SYS_BLOCK: &str = "/sys/block";
/// The loop driver's block major (`LOOP_MAJOR`).
pub(crate) const LOOP_MAJOR: u32 = 7;
/// How many free devices [`attach_loop`] tries before giving up when other
/// attachers keep winning the race.
const ATTACH_ATTEMPTS: usize = 16;
/// Suffix the kernel's `d_path` appends to a file that has been unlinked.
const DELETED_SUFFIX: &[u8] = b" (deleted)";

/// What `LOOP_GET_STATUS64` reports about an attached loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopStatus {
    /// The N of `/dev/loopN`.
    pub number: u32,
    /// `st_dev` of the filesystem holding the backing file.
    pub backing_dev: u64,
    /// Inode number of the backing file.
    pub backing_inode: u64,
    /// Offset into the backing file, bytes.
    pub offset: u64,
    /// Size limit in bytes, 0 = whole file.
    pub size_limit: u64,
    /// `LO_FLAGS_*` bits.
    pub flags: u32,
    /// The informational name given at attach time (at most 63 bytes).
    pub file_name: PathBuf,
}

/// Reads the status of an attached loop device. Fails with
/// [`SysErrorKind::NotAttached`] if nothing is attached.
pub fn loop_status(dev: &Path) -> Result<LoopStatus> {
    let fd = open("open", dev, OFlag::O_RDONLY)?;
    let mut info = LoopInfo64::zeroed();
    // SAFETY: the fd is open and `info` is a valid loop_info64 to fill.
    unsafe { ioctl::loop_get_status64(fd.as_raw_fd(), &mut info) }
        .map_err(|e| loop_error("LOOP_GET_STATUS64", dev, e))?;
    let name_len = info
        .lo_file_name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(LO_NAME_SIZE);
    let status = LoopStatus {
        number: info.lo_number,
        backing_dev: info.lo_device,
        backing_inode: info.lo_inode,
        offset: info.lo_offset,
        size_limit: info.lo_sizelimit,
        flags: info.lo_flags,
        file_name: PathBuf::from(OsStr::from_bytes(&info.lo_file_name[..name_len])),
    };
    tracing::debug!(device = %dev.display(), ?status, "read loop status");
    Ok(status)
}

/// Makes the loop device `dev` take its backing file's current size
/// (LOOP_SET_CAPACITY), after the file grew.
pub fn loop_set_capacity(dev: &Path) -> Result<()> {
    let fd = open("open", dev, OFlag::O_RDONLY)?;
    // SAFETY: the fd is open; the ioctl takes no argument.
    unsafe { ioctl::loop_set_capacity(fd.as_raw_fd()) }
        .map_err(|e| loop_error("LOOP_SET_CAPACITY", dev, e))?;
    tracing::info!(device = %dev.display(), "loop device took its backing file's new size");
    Ok(())
}

pub(crate) fn loop_error(op: &'static str, dev: &Path, errno: Errno) -> SysError {
    let err = SysError::new(op, dev, errno);
    if errno == Errno::ENXIO {
        err.with_kind(SysErrorKind::NotAttached)
    } else {
        err
    }
}

/// Finds the loop device currently backed by `backing`.
///
/// Scans `/sys/block/loop*/loop/backing_file` and compares with the
/// canonicalized `backing` path. A device whose backing file has since been
/// unlinked shows as `"<path> (deleted)"` and never matches: it backs a
/// different (dead) inode. A path match is confirmed with `LOOP_GET_STATUS64`
/// (same device and inode as `backing` now), which guards against a file that
/// was replaced under the same name. The lowest matching `/dev/loopN` is
/// returned; its device node is created if missing (see [`attach_loop`]).
///
/// Fails with [`SysErrorKind::NotFound`] if `backing` itself does not exist.
pub fn find_loop_for_file(backing: &Path) -> Result<Option<PathBuf>> {
    let canonical =
        std::fs::canonicalize(backing).map_err(|e| SysError::io("canonicalize", backing, e))?;
    let meta = std::fs::metadata(&canonical).map_err(|e| SysError::io("stat", &canonical, e))?;
    let found = find_loop_in(Path::new(SYS_BLOCK), Path::new(DEV_DIR), &canonical, &meta)?;
    tracing::debug!(backing = %canonical.display(), device = ?found, "looked up loop device for file");
    Ok(found)
}

fn find_loop_in(
    sys_block: &Path,
    dev_dir: &Path,
    canonical: &Path,
    meta: &std::fs::Metadata,
) -> Result<Option<PathBuf>> {
    for n in loop_numbers(sys_block)? {
        let attr = sys_block.join(format!("loop{n}/loop/backing_file"));
        let text = match std::fs::read(&attr) {
            Ok(text) => text,
            // Not attached (the `loop` directory only exists while bound), or
            // detached while we were scanning: between the detach and the
            // removal of the `loop` directory the kernel answers ENODEV (and
            // ENXIO on older kernels) for an attribute it still lists.
            Err(e) if detached_while_read(&e) => continue,
            Err(e) => return Err(SysError::io("read", &attr, e)),
        };
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        if text.ends_with(DELETED_SUFFIX) || text != canonical.as_os_str().as_bytes() {
            continue;
        }
        let dev = ensure_loop_node(sys_block, dev_dir, n)?;
        match loop_status(&dev) {
            Ok(status)
                if status.backing_inode == meta.ino() && status.backing_dev == meta.dev() =>
            {
                return Ok(Some(dev));
            }
            Ok(status) => {
                tracing::debug!(device = %dev.display(), ?status, "path matches but inode differs; skipping");
            }
            Err(e) if e.is_not_attached() => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Whether a failed read of a loop device's sysfs attribute means only that
/// the device is not (or no longer) attached.
fn detached_while_read(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(Errno::ENODEV as i32)
        || e.raw_os_error() == Some(Errno::ENXIO as i32)
}

/// Loop device numbers present in sysfs, ascending.
fn loop_numbers(sys_block: &Path) -> Result<Vec<u32>> {
    let entries =
        std::fs::read_dir(sys_block).map_err(|e| SysError::io("readdir", sys_block, e))?;
    let mut numbers: Vec<u32> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            entry
                .file_name()
                .to_str()
                .and_then(|name| name.strip_prefix("loop"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Returns `<dev_dir>/loopN`, creating the block node if it is missing (as in
/// containers whose /dev is not a devtmpfs). The device numbers come from
/// `/sys/block/loopN/dev`, falling back to `7:N`.
pub(crate) fn ensure_loop_node(sys_block: &Path, dev_dir: &Path, n: u32) -> Result<PathBuf> {
    let path = dev_dir.join(format!("loop{n}"));
    match std::fs::symlink_metadata(&path) {
        Ok(_) => return Ok(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SysError::io("stat", &path, e)),
    }
    let (major, minor) = std::fs::read_to_string(sys_block.join(format!("loop{n}/dev")))
        .ok()
        .and_then(|text| {
            let (major, minor) = text.trim().split_once(':')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .unwrap_or((LOOP_MAJOR, n));
    make_block_node(&path, major, minor, 0o660)?;
    Ok(path)
}

/// How to hand the backing file to the loop driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachMethod {
    /// `LOOP_CONFIGURE`: one atomic call (Linux 5.8+).
    Configure,
    /// `LOOP_SET_FD` then `LOOP_SET_STATUS64` (any kernel).
    SetFd,
}

/// Attaches `backing` to a free loop device and returns its path
/// (`/dev/loopN`).
///
/// Asks `/dev/loop-control` for a free device (`LOOP_CTL_GET_FREE`) and
/// configures it atomically with `LOOP_CONFIGURE`. If the kernel does not know
/// that ioctl (`EINVAL`/`ENOTTY`, before 5.8), falls back to `LOOP_SET_FD` +
/// `LOOP_SET_STATUS64`. If another process grabs the same free device first
/// (`EBUSY`), asks for another one. The device is read-write, covers the whole
/// file, and has no autoclear: it stays attached after this process exits,
/// until [`detach_loop`].
///
/// This does not check whether `backing` is already attached; call
/// [`find_loop_for_file`] first to stay idempotent.
pub fn attach_loop(backing: &Path) -> Result<PathBuf> {
    attach_loop_with(backing, AttachMethod::Configure)
}

pub(crate) fn attach_loop_with(backing: &Path, mut method: AttachMethod) -> Result<PathBuf> {
    let canonical =
        std::fs::canonicalize(backing).map_err(|e| SysError::io("canonicalize", backing, e))?;
    let file = open("open", &canonical, OFlag::O_RDWR)?;
    let control = open("open", Path::new(LOOP_CONTROL), OFlag::O_RDWR)?;
    let info = LoopInfo64::for_backing(&canonical);

    for attempt in 1..=ATTACH_ATTEMPTS {
        // SAFETY: plain ioctl without argument on an open fd.
        let n = unsafe { ioctl::loop_ctl_get_free(control.as_raw_fd()) }
            .map_err(|e| SysError::new("LOOP_CTL_GET_FREE", Path::new(LOOP_CONTROL), e))?;
        // The kernel never returns a negative index on success.
        let n = u32::try_from(n).map_err(|_| {
            SysError::new("LOOP_CTL_GET_FREE", Path::new(LOOP_CONTROL), Errno::ERANGE)
                .with_detail(format!("returned {n}"))
        })?;
        let dev = ensure_loop_node(Path::new(SYS_BLOCK), Path::new(DEV_DIR), n)?;
        let loop_fd = open("open", &dev, OFlag::O_RDWR)?;

        if method == AttachMethod::Configure {
            let config = LoopConfig {
                fd: file.as_raw_fd() as u32,
                block_size: 0, // 0 = the driver's default (512)
                info,
                reserved: [0; 8],
            };
            // SAFETY: both fds are open; `config` is a valid loop_config.
            match unsafe { ioctl::loop_configure(loop_fd.as_raw_fd(), &config) } {
                Ok(_) => {
                    tracing::info!(device = %dev.display(), backing = %canonical.display(), "attached loop device (LOOP_CONFIGURE)");
                    return Ok(dev);
                }
                Err(Errno::EBUSY) => {
                    tracing::debug!(device = %dev.display(), attempt, "loop device taken by someone else; retrying");
                    continue;
                }
                Err(Errno::EINVAL | Errno::ENOTTY) => {
                    tracing::info!(device = %dev.display(), "LOOP_CONFIGURE not supported; falling back to LOOP_SET_FD + LOOP_SET_STATUS64");
                    method = AttachMethod::SetFd;
                }
                Err(e) => return Err(SysError::new("LOOP_CONFIGURE", &dev, e)),
            }
        }

        // SAFETY: both fds are open; LOOP_SET_FD takes the backing fd by value.
        match unsafe { ioctl::loop_set_fd(loop_fd.as_raw_fd(), file.as_raw_fd()) } {
            Ok(_) => {}
            Err(Errno::EBUSY) => {
                tracing::debug!(device = %dev.display(), attempt, "loop device taken by someone else; retrying");
                continue;
            }
            Err(e) => return Err(SysError::new("LOOP_SET_FD", &dev, e)),
        }
        // SAFETY: the fd is open; `info` is a valid loop_info64.
        if let Err(e) = unsafe { ioctl::loop_set_status64(loop_fd.as_raw_fd(), &info) } {
            // Undo the half-done attachment rather than leak a device without
            // its name.
            // SAFETY: plain ioctl without argument on an open fd.
            let _ = unsafe { ioctl::loop_clr_fd(loop_fd.as_raw_fd()) };
            return Err(SysError::new("LOOP_SET_STATUS64", &dev, e));
        }
        tracing::info!(device = %dev.display(), backing = %canonical.display(), "attached loop device (LOOP_SET_FD + LOOP_SET_STATUS64)");
        return Ok(dev);
    }
    Err(
        SysError::new("attach loop", &canonical, Errno::EBUSY).with_detail(format!(
            "every free loop device was taken by another attacher ({ATTACH_ATTEMPTS} attempts)"
        )),
    )
}

/// Detaches the backing file from loop device `dev` (`LOOP_CLR_FD`).
///
/// Refuses with [`SysErrorKind::Busy`] while the device is mounted or claimed
/// exclusively (checked by holding an `O_EXCL` open across the call). Without
/// that check the kernel would accept the request but only mark the device
/// for autoclear, detaching it silently at last close. Plain openers that
/// still hold it delay the actual detach the same way. Fails with
/// [`SysErrorKind::NotAttached`] if nothing is attached.
pub fn detach_loop(dev: &Path) -> Result<()> {
    require_block_device("open(O_EXCL)", dev)?;
    let fd = open("open(O_EXCL)", dev, OFlag::O_RDONLY | OFlag::O_EXCL)?;
    // SAFETY: plain ioctl without argument on an open fd.
    unsafe { ioctl::loop_clr_fd(fd.as_raw_fd()) }.map_err(|e| loop_error("LOOP_CLR_FD", dev, e))?;
    tracing::info!(device = %dev.display(), "detached loop device");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem;

    /// A device detached between the sysfs listing and the attribute read
    /// answers ENODEV; that must read as "not this file", not as a failure
    /// of the whole scan (it made a concurrent-attach test flaky).
    #[test]
    fn a_device_detached_mid_scan_is_skipped_not_fatal() {
        for errno in [Errno::ENOENT, Errno::ENODEV, Errno::ENXIO] {
            assert!(detached_while_read(&io::Error::from_raw_os_error(
                errno as i32
            )));
        }
        for errno in [Errno::EACCES, Errno::EIO, Errno::EINVAL] {
            assert!(!detached_while_read(&io::Error::from_raw_os_error(
                errno as i32
            )));
        }
    }

    #[test]
    fn request_codes_and_layouts_match_the_c_headers() {
        let code = |r: crate::sys::Request| r as u32;
        assert_eq!(code(ioctl::LOOP_CTL_GET_FREE), 0x4C82);
        assert_eq!(code(ioctl::LOOP_CONFIGURE), 0x4C0A);
        assert_eq!(code(ioctl::LOOP_SET_FD), 0x4C00);
        assert_eq!(code(ioctl::LOOP_SET_STATUS64), 0x4C04);
        assert_eq!(code(ioctl::LOOP_CLR_FD), 0x4C01);
        assert_eq!(code(ioctl::LOOP_GET_STATUS64), 0x4C05);
        assert_eq!(mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(mem::size_of::<LoopConfig>(), 304);
        assert_eq!(mem::offset_of!(LoopInfo64, lo_flags), 52);
        assert_eq!(mem::offset_of!(LoopInfo64, lo_file_name), 56);
        assert_eq!(mem::offset_of!(LoopInfo64, lo_init), 216);
        assert_eq!(mem::offset_of!(LoopConfig, info), 8);
        assert_eq!(mem::offset_of!(LoopConfig, reserved), 240);
    }

    #[test]
    fn file_name_is_cut_to_63_bytes_plus_nul() {
        let short = file_name_field(Path::new("/var/lib/pool.img"));
        assert_eq!(&short[..17], b"/var/lib/pool.img");
        assert!(short[17..].iter().all(|&b| b == 0));

        let long = format!("/{}", "x".repeat(100));
        let field = file_name_field(Path::new(&long));
        assert_eq!(&field[..63], &long.as_bytes()[..63]);
        assert_eq!(field[63], 0);
    }

    #[test]
    fn attach_info_never_sets_autoclear() {
        let info = LoopInfo64::for_backing(Path::new("/pool.img"));
        assert_eq!(info.lo_flags & LO_FLAGS_AUTOCLEAR, 0);
        assert_eq!(info.lo_flags, 0);
        assert_eq!((info.lo_offset, info.lo_sizelimit), (0, 0));
    }

    #[test]
    fn clearing_an_unattached_loop_device_is_not_attached() {
        let err = loop_error("LOOP_CLR_FD", Path::new("/dev/loop9"), Errno::ENXIO);
        assert!(err.is_not_attached());
        assert!(
            !loop_error("LOOP_CLR_FD", Path::new("/dev/loop9"), Errno::EBUSY).is_not_attached()
        );
    }
}
