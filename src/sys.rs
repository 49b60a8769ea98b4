//! Privileged syscalls, wrapped once.
//!
//! Everything in the driver that needs root and talks to the kernel directly
//! (block device ioctls, loop devices, device nodes, mounts) goes through this
//! module, so that each call is written, reviewed and logged in one place.
//! State-changing functions log at `info`, read-only ones at `debug`. Failures
//! come back as [`SysError`], which names the operation, the path and the errno,
//! and classifies the errnos callers branch on ([`SysErrorKind`]).
//!
//! ## Why loop devices are driven by hand
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
//!
//! ## Exclusive opens
//!
//! Opening a block device with `O_EXCL` (and without `O_CREAT`) asks the kernel
//! for an exclusive claim. It fails with `EBUSY` while the device is mounted,
//! held by device-mapper/md, or claimed exclusively by another opener, which
//! makes it the kernel's own answer to "is anybody using this device?". It does
//! not see plain (non-exclusive) openers such as a running `dd`. Destructive
//! operations here ([`discard_range`], [`detach_loop`]) take that claim first.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::mount::{self as nix_mount, MntFlags};
use nix::sys::stat::{self, Mode, SFlag};
use nix::sys::statvfs::{self, FsFlags};

pub use nix::mount::MsFlags;

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, SysError>;

/// The errno classes callers need to tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SysErrorKind {
    /// `ENOENT`: the path (or something it needs) does not exist.
    NotFound,
    /// [`unmount`] was given a directory that is not a mount point (`EINVAL`).
    NotMounted,
    /// `EBUSY`: the device or mount is in use (mounted, claimed exclusively, or
    /// a loop device that someone else attached first).
    Busy,
    /// A loop device operation found the device unattached (`ENXIO`).
    NotAttached,
    /// Anything else; look at [`SysError::errno`].
    Other,
}

/// A failed privileged operation: which operation, on which path, and why.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {}{}", .path.display(), .errno.desc(), detail_suffix(.detail))]
pub struct SysError {
    op: &'static str,
    path: PathBuf,
    errno: Errno,
    kind: SysErrorKind,
    detail: Option<String>,
}

fn detail_suffix(detail: &Option<String>) -> String {
    detail
        .as_ref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default()
}

impl SysError {
    /// Builds an error from an errno, classifying the common ones.
    fn new(op: &'static str, path: &Path, errno: Errno) -> Self {
        let kind = match errno {
            Errno::ENOENT => SysErrorKind::NotFound,
            Errno::EBUSY => SysErrorKind::Busy,
            _ => SysErrorKind::Other,
        };
        SysError {
            op,
            path: path.to_path_buf(),
            errno,
            kind,
            detail: None,
        }
    }

    /// Builds an error from a `std::io::Error` (OS errors keep their errno).
    fn io(op: &'static str, path: &Path, err: io::Error) -> Self {
        match err.raw_os_error() {
            Some(raw) => Self::new(op, path, Errno::from_raw(raw)),
            None => Self::new(op, path, Errno::EIO).with_detail(err.to_string()),
        }
    }

    fn with_kind(mut self, kind: SysErrorKind) -> Self {
        self.kind = kind;
        self
    }

    fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Name of the failed operation, e.g. `"LOOP_CONFIGURE"` or `"umount2"`.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The path the operation was applied to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The errno reported by the kernel (or chosen to describe a failure the
    /// kernel did not report, such as malformed sysfs content).
    pub fn errno(&self) -> Errno {
        self.errno
    }

    /// Classification of the errno for this operation.
    pub fn kind(&self) -> SysErrorKind {
        self.kind
    }

    /// Extra context, if any (e.g. the mount source and type).
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// Shorthand for `kind() == SysErrorKind::NotFound`.
    pub fn is_not_found(&self) -> bool {
        self.kind == SysErrorKind::NotFound
    }

    /// Shorthand for `kind() == SysErrorKind::NotMounted`.
    pub fn is_not_mounted(&self) -> bool {
        self.kind == SysErrorKind::NotMounted
    }

    /// Shorthand for `kind() == SysErrorKind::Busy`.
    pub fn is_busy(&self) -> bool {
        self.kind == SysErrorKind::Busy
    }

    /// Shorthand for `kind() == SysErrorKind::NotAttached`.
    pub fn is_not_attached(&self) -> bool {
        self.kind == SysErrorKind::NotAttached
    }
}

// ---------------------------------------------------------------------------
// Kernel ABI: structs and ioctl request codes
// ---------------------------------------------------------------------------

/// `LO_NAME_SIZE` from `<linux/loop.h>`.
const LO_NAME_SIZE: usize = 64;
/// `LO_KEY_SIZE` from `<linux/loop.h>`.
const LO_KEY_SIZE: usize = 32;

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
struct LoopInfo64 {
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
    fn zeroed() -> Self {
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
    fn for_backing(path: &Path) -> Self {
        let mut info = Self::zeroed();
        info.lo_file_name = file_name_field(path);
        info
    }
}

/// The kernel keeps `LO_NAME_SIZE` bytes and forces the last one to NUL, so at
/// most 63 bytes of the path are stored; longer paths are cut (the
/// authoritative full path is in sysfs `loop/backing_file`).
fn file_name_field(path: &Path) -> [u8; LO_NAME_SIZE] {
    let mut field = [0u8; LO_NAME_SIZE];
    let bytes = path.as_os_str().as_bytes();
    let n = bytes.len().min(LO_NAME_SIZE - 1);
    field[..n].copy_from_slice(&bytes[..n]);
    field
}

/// `struct loop_config` from `<linux/loop.h>` (304 bytes), for `LOOP_CONFIGURE`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// `struct fstrim_range` from `<linux/fs.h>` (24 bytes), for `FITRIM`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// ioctl request codes and the nix-generated wrappers. The codes are written
/// out (or computed with nix's `_IO*` equivalents) once here, and unit tests
/// compare them with the values of the C headers.
mod ioctl {
    use super::{FstrimRange, LoopConfig, LoopInfo64};
    use std::mem::size_of;

    /// Type of an ioctl request number on this target.
    pub type Request = nix::sys::ioctl::ioctl_num_type;

    /// `_IOR(0x12, 114, size_t)`: the kernel always writes a `u64`, but the
    /// code encodes `sizeof(size_t)`, as in `<linux/fs.h>`.
    pub const BLKGETSIZE64: Request = nix::request_code_read!(0x12, 114, size_of::<libc::size_t>());
    /// `_IO(0x12, 119)`, argument `uint64_t[2]` = {offset, length}.
    pub const BLKDISCARD: Request = nix::request_code_none!(0x12, 119);
    /// `_IOWR('X', 121, struct fstrim_range)`.
    pub const FITRIM: Request = nix::request_code_readwrite!(b'X', 121, size_of::<FstrimRange>());
    // The loop ioctls predate the _IO* encoding; <linux/loop.h> spells them out.
    pub const LOOP_SET_FD: Request = 0x4C00;
    pub const LOOP_CLR_FD: Request = 0x4C01;
    pub const LOOP_SET_STATUS64: Request = 0x4C04;
    pub const LOOP_GET_STATUS64: Request = 0x4C05;
    pub const LOOP_CONFIGURE: Request = 0x4C0A;
    pub const LOOP_CTL_GET_FREE: Request = 0x4C82;

    nix::ioctl_read_bad!(blkgetsize64, BLKGETSIZE64, u64);
    nix::ioctl_write_ptr_bad!(blkdiscard, BLKDISCARD, [u64; 2]);
    nix::ioctl_readwrite_bad!(fitrim, FITRIM, FstrimRange);
    nix::ioctl_write_int_bad!(loop_set_fd, LOOP_SET_FD);
    nix::ioctl_none_bad!(loop_clr_fd, LOOP_CLR_FD);
    nix::ioctl_write_ptr_bad!(loop_set_status64, LOOP_SET_STATUS64, LoopInfo64);
    nix::ioctl_read_bad!(loop_get_status64, LOOP_GET_STATUS64, LoopInfo64);
    nix::ioctl_write_ptr_bad!(loop_configure, LOOP_CONFIGURE, LoopConfig);
    nix::ioctl_none_bad!(loop_ctl_get_free, LOOP_CTL_GET_FREE);
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// `open(2)` with `O_CLOEXEC` always added.
fn open(op: &'static str, path: &Path, flags: OFlag) -> Result<OwnedFd> {
    fcntl::open(path, flags | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| SysError::new(op, path, e))
}

/// Fails with `ENOTBLK` unless `path` (after following symlinks) is a block
/// device node. Guards the `O_EXCL` opens: on a regular file `O_EXCL` without
/// `O_CREAT` silently means nothing.
fn require_block_device(op: &'static str, path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| SysError::io(op, path, e))?;
    if meta.file_type().is_block_device() {
        Ok(())
    } else {
        Err(SysError::new(op, path, Errno::ENOTBLK))
    }
}

fn split_dev(rdev: u64) -> (u32, u32) {
    // Linux majors are 12 bits and minors 20 bits, so both fit in u32.
    (stat::major(rdev) as u32, stat::minor(rdev) as u32)
}

// ---------------------------------------------------------------------------
// Block devices
// ---------------------------------------------------------------------------

/// Size of a block device in bytes (`BLKGETSIZE64`).
pub fn block_size_bytes(dev: &Path) -> Result<u64> {
    let fd = open("open", dev, OFlag::O_RDONLY)?;
    let size = size_of_fd(fd.as_fd(), dev)?;
    tracing::debug!(device = %dev.display(), bytes = size, "read block device size");
    Ok(size)
}

fn size_of_fd(fd: BorrowedFd<'_>, dev: &Path) -> Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: `fd` is open for the duration of the call and `size` is a valid
    // u64 for the kernel to write.
    unsafe { ioctl::blkgetsize64(fd.as_raw_fd(), &mut size) }
        .map_err(|e| SysError::new("BLKGETSIZE64", dev, e))?;
    Ok(size)
}

/// Tells whether nobody holds `dev` exclusively: not mounted, not part of a
/// device-mapper/md device, not claimed with `O_EXCL`. Implemented as an
/// `open(O_RDONLY | O_EXCL)` that is closed right away; `EBUSY` means in use.
///
/// The answer can be stale as soon as it is returned. To act on an unused
/// device safely, keep the claim instead: see [`open_exclusive`].
pub fn is_block_device_unused(dev: &Path) -> Result<bool> {
    require_block_device("open(O_EXCL)", dev)?;
    let unused = match open("open(O_EXCL)", dev, OFlag::O_RDONLY | OFlag::O_EXCL) {
        Ok(_fd) => true,
        Err(e) if e.is_busy() => false,
        Err(e) => return Err(e),
    };
    tracing::debug!(device = %dev.display(), unused, "checked block device for exclusive holders");
    Ok(unused)
}

/// An exclusive, writable claim on a block device. While it is alive, the
/// device cannot be mounted or claimed by anyone else; other `O_EXCL` openers
/// get `EBUSY`. Dropping it releases the claim.
#[derive(Debug)]
pub struct ExclusiveDevice {
    fd: OwnedFd,
    path: PathBuf,
}

/// Opens `dev` with `O_RDWR | O_EXCL`, proving that it is not mounted or
/// otherwise claimed; fails with [`SysErrorKind::Busy`] if it is.
pub fn open_exclusive(dev: &Path) -> Result<ExclusiveDevice> {
    require_block_device("open(O_EXCL)", dev)?;
    let fd = open("open(O_EXCL)", dev, OFlag::O_RDWR | OFlag::O_EXCL)?;
    tracing::debug!(device = %dev.display(), "claimed block device exclusively");
    Ok(ExclusiveDevice {
        fd,
        path: dev.to_path_buf(),
    })
}

impl ExclusiveDevice {
    /// The device path this claim was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the device in bytes.
    pub fn size_bytes(&self) -> Result<u64> {
        size_of_fd(self.fd.as_fd(), &self.path)
    }

    /// Discards (`BLKDISCARD`) `len` bytes starting at `offset`. Both must be
    /// multiples of 512 and the range must lie inside the device. On thin
    /// volumes this returns the blocks to the pool; on a loop device it punches
    /// a hole in the backing file. Discarded data is gone.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let op = "BLKDISCARD";
        if offset % 512 != 0 || len % 512 != 0 {
            return Err(
                SysError::new(op, &self.path, Errno::EINVAL).with_detail(format!(
                    "offset {offset} and length {len} must be multiples of 512"
                )),
            );
        }
        let range: [u64; 2] = [offset, len];
        // SAFETY: the fd is open and writable, `range` is the `uint64_t[2]`
        // the kernel reads.
        unsafe { ioctl::blkdiscard(self.fd.as_raw_fd(), &range) }
            .map_err(|e| SysError::new(op, &self.path, e))?;
        tracing::info!(device = %self.path.display(), offset, len, "discarded block range");
        Ok(())
    }
}

impl ExclusiveDevice {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (fewer only at the end of the device).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = nix::sys::uio::pread(
                self.fd.as_fd(),
                &mut buf[done..],
                (offset + done as u64) as i64,
            )
            .map_err(|e| SysError::new("pread", &self.path, e))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }
}

impl AsFd for ExclusiveDevice {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Discards a byte range of a block device that nobody else is using: takes
/// an exclusive claim ([`open_exclusive`]) first, so a mounted or otherwise
/// claimed device fails with [`SysErrorKind::Busy`] and is left untouched.
/// Callers that already hold an [`ExclusiveDevice`] use
/// [`ExclusiveDevice::discard`].
pub fn discard_range(dev: &Path, offset: u64, len: u64) -> Result<()> {
    open_exclusive(dev)?.discard(offset, len)
}

/// Flushes the filesystem that holds `path` (`syncfs`), so that blocks freed
/// by recent deletes are committed before a FITRIM looks for them.
pub fn sync_filesystem(path: &Path) -> Result<()> {
    let fd = open("open", path, OFlag::O_RDONLY)?;
    nix::unistd::syncfs(fd.as_fd()).map_err(|e| SysError::new("syncfs", path, e))?;
    tracing::debug!(path = %path.display(), "synced filesystem");
    Ok(())
}

/// Asks the filesystem mounted at (or containing) `mountpoint` to discard its
/// unused blocks (`FITRIM`, what fstrim(8) does), ignoring free extents
/// shorter than `minlen` bytes. Returns the number of bytes the filesystem
/// reports as trimmed. Some filesystems (ext4) skip block groups already
/// trimmed since mount, so a second call may return less.
pub fn fitrim(mountpoint: &Path, minlen: u64) -> Result<u64> {
    let fd = open("open", mountpoint, OFlag::O_RDONLY)?;
    let mut range = FstrimRange {
        start: 0,
        len: u64::MAX,
        minlen,
    };
    // SAFETY: the fd is open and `range` is a valid fstrim_range that the
    // kernel reads and updates in place.
    unsafe { ioctl::fitrim(fd.as_raw_fd(), &mut range) }
        .map_err(|e| SysError::new("FITRIM", mountpoint, e))?;
    tracing::info!(mountpoint = %mountpoint.display(), minlen, trimmed = range.len, "trimmed filesystem");
    Ok(range.len)
}

// ---------------------------------------------------------------------------
// Device nodes
// ---------------------------------------------------------------------------

/// Creates a block device node `path` for `major:minor` with permission bits
/// exactly `mode` (the umask is overridden by an explicit chmod).
///
/// Idempotent: if `path` already is a block node for the same device, nothing
/// is changed. If it exists as anything else, fails with `EEXIST`. The node
/// can only be opened if its filesystem is not mounted `nodev`.
pub fn make_block_node(path: &Path, major: u32, minor: u32, mode: u32) -> Result<()> {
    let op = "mknod";
    let perm = Mode::from_bits_truncate(mode & 0o7777);
    let dev = stat::makedev(u64::from(major), u64::from(minor));
    match stat::mknod(path, SFlag::S_IFBLK, perm, dev) {
        Ok(()) => {}
        Err(Errno::EEXIST) => {
            return match device_numbers(path)? {
                Some(existing) if existing == (major, minor) => {
                    tracing::debug!(path = %path.display(), major, minor, "block node already present");
                    Ok(())
                }
                other => Err(
                    SysError::new(op, path, Errno::EEXIST).with_detail(match other {
                        Some((ma, mi)) => format!("exists as block device {ma}:{mi}"),
                        None => "exists and is not a block device".to_string(),
                    }),
                ),
            };
        }
        Err(e) => return Err(SysError::new(op, path, e)),
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|e| SysError::io("chmod", path, e))?;
    tracing::info!(path = %path.display(), major, minor, mode = format_args!("{:o}", mode & 0o7777), "created block device node");
    Ok(())
}

/// `(major, minor)` of the block device that `path` refers to (symlinks are
/// followed, so `/dev/vg/lv` works), or `None` if it is not a block device.
pub fn device_numbers(path: &Path) -> Result<Option<(u32, u32)>> {
    let meta = std::fs::metadata(path).map_err(|e| SysError::io("stat", path, e))?;
    let numbers = meta
        .file_type()
        .is_block_device()
        .then(|| split_dev(meta.rdev()));
    tracing::debug!(path = %path.display(), ?numbers, "read device numbers");
    Ok(numbers)
}

// ---------------------------------------------------------------------------
// Backing files
// ---------------------------------------------------------------------------

/// What [`create_sparse_file`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseFile {
    /// The file was created with the requested size.
    Created,
    /// A regular file was already there; it was left untouched. Its current
    /// size is reported so the caller can decide whether that is acceptable.
    Existed {
        /// Current size in bytes.
        len: u64,
    },
}

/// Creates `path` (and its parent directories) as a sparse file of `size`
/// bytes, mode 0600, durably (file and directory are fsynced). Never touches
/// an existing file: if one is there, its size is returned instead.
pub fn create_sparse_file(path: &Path, size: u64) -> Result<SparseFile> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| SysError::io("mkdir", parent, e))?;
    }
    let file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::metadata(path).map_err(|e| SysError::io("stat", path, e))?;
            if !meta.is_file() {
                return Err(SysError::new("create", path, Errno::EEXIST)
                    .with_detail("exists and is not a regular file"));
            }
            tracing::debug!(path = %path.display(), len = meta.len(), "sparse file already exists");
            return Ok(SparseFile::Existed { len: meta.len() });
        }
        Err(e) => return Err(SysError::io("create", path, e)),
    };
    let finish = || -> io::Result<()> {
        file.set_len(size)?;
        file.sync_all()?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(())
    };
    if let Err(e) = finish() {
        // Do not leave a short file behind that a retry would mistake for a
        // finished one.
        let _ = std::fs::remove_file(path);
        return Err(SysError::io("set_len", path, e));
    }
    tracing::info!(path = %path.display(), size, "created sparse file");
    Ok(SparseFile::Created)
}

// ---------------------------------------------------------------------------
// Loop devices
// ---------------------------------------------------------------------------

const LOOP_CONTROL: &str = "/dev/loop-control";
const DEV_DIR: &str = "/dev";
const SYS_BLOCK: &str = "/sys/block";
/// The loop driver's block major (`LOOP_MAJOR`).
const LOOP_MAJOR: u32 = 7;
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

fn loop_error(op: &'static str, dev: &Path, errno: Errno) -> SysError {
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
            // detached while we were scanning.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
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
fn ensure_loop_node(sys_block: &Path, dev_dir: &Path, n: u32) -> Result<PathBuf> {
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
enum AttachMethod {
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

fn attach_loop_with(backing: &Path, mut method: AttachMethod) -> Result<PathBuf> {
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

// ---------------------------------------------------------------------------
// Mounts
// ---------------------------------------------------------------------------

/// Mounts filesystem `source` (a block device path) of type `fstype` on
/// `target` with `flags` and filesystem-specific `data` (e.g.
/// `"discard,errors=remount-ro"`).
pub fn mount_fs(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    nix_mount::mount(Some(source), target, Some(fstype), flags, data).map_err(|e| {
        SysError::new("mount", target, e).with_detail(format!(
            "source {}, type {fstype}, flags {flags:?}, data {data:?}",
            source.display()
        ))
    })?;
    tracing::info!(source = %source.display(), target = %target.display(), fstype, ?flags, data, "mounted filesystem");
    Ok(())
}

/// Bind-mounts `source` (a directory or file) on `target`, non-recursively.
///
/// The kernel ignores `MS_RDONLY` on the initial bind, so a read-only bind
/// takes a second call, `MS_REMOUNT | MS_BIND | MS_RDONLY`, which changes only
/// this mount (not the source). That remount replaces all per-mount flags, so
/// `nosuid`/`nodev`/`noexec` inherited from the source are read back with
/// statvfs and passed again (atime flags the kernel keeps by itself). If the
/// remount fails, the writable bind is unmounted again before returning.
pub fn bind_mount(source: &Path, target: &Path, readonly: bool) -> Result<()> {
    nix_mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        SysError::new("mount(MS_BIND)", target, e)
            .with_detail(format!("source {}", source.display()))
    })?;
    if readonly {
        let remount = || -> Result<()> {
            let kept = statvfs::statvfs(target)
                .map_err(|e| SysError::new("statvfs", target, e))?
                .flags();
            let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
            for (st, ms) in [
                (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            ] {
                if kept.contains(st) {
                    flags |= ms;
                }
            }
            nix_mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
                .map_err(|e| SysError::new("mount(MS_REMOUNT|MS_BIND|MS_RDONLY)", target, e))
        };
        if let Err(e) = remount() {
            if let Err(undo) = nix_mount::umount2(target, MntFlags::empty()) {
                tracing::error!(target = %target.display(), error = %undo, "could not undo writable bind mount after failed read-only remount");
            }
            return Err(e);
        }
    }
    tracing::info!(source = %source.display(), target = %target.display(), readonly, "bind-mounted");
    Ok(())
}

/// Unmounts the mount on top of `target` (plain `umount2`, no lazy detach:
/// a busy mount fails with [`SysErrorKind::Busy`] instead of lingering).
///
/// Fails with [`SysErrorKind::NotMounted`] if `target` exists but is not a
/// mount point (`EINVAL`), and with [`SysErrorKind::NotFound`] if it does not
/// exist; callers that want idempotent unmounts treat both as done.
pub fn unmount(target: &Path) -> Result<()> {
    nix_mount::umount2(target, MntFlags::empty()).map_err(|e| {
        let err = SysError::new("umount2", target, e);
        if e == Errno::EINVAL {
            err.with_kind(SysErrorKind::NotMounted)
        } else {
            err
        }
    })?;
    tracing::info!(target = %target.display(), "unmounted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem;

    /// Request codes fit in 32 bits; compare them as such whatever the
    /// target's request type is (`c_ulong` on glibc, `c_int` on musl).
    fn code(request: ioctl::Request) -> u32 {
        request as u32
    }

    #[test]
    fn request_codes_match_the_c_headers() {
        assert_eq!(code(ioctl::BLKGETSIZE64), 0x8008_1272);
        assert_eq!(code(ioctl::BLKDISCARD), 0x1277);
        assert_eq!(code(ioctl::FITRIM), 0xc018_5879);
        assert_eq!(code(ioctl::LOOP_CTL_GET_FREE), 0x4C82);
        assert_eq!(code(ioctl::LOOP_CONFIGURE), 0x4C0A);
        assert_eq!(code(ioctl::LOOP_SET_FD), 0x4C00);
        assert_eq!(code(ioctl::LOOP_SET_STATUS64), 0x4C04);
        assert_eq!(code(ioctl::LOOP_CLR_FD), 0x4C01);
        assert_eq!(code(ioctl::LOOP_GET_STATUS64), 0x4C05);
    }

    #[test]
    fn struct_layouts_match_the_c_headers() {
        assert_eq!(mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(mem::size_of::<LoopConfig>(), 304);
        assert_eq!(mem::size_of::<FstrimRange>(), 24);
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
    fn errors_carry_operation_path_errno_and_kind() {
        let err = SysError::new("umount2", Path::new("/mnt/x"), Errno::EINVAL)
            .with_kind(SysErrorKind::NotMounted);
        assert!(err.is_not_mounted());
        assert_eq!(err.op(), "umount2");
        assert_eq!(err.path(), Path::new("/mnt/x"));
        assert_eq!(err.errno(), Errno::EINVAL);
        assert_eq!(err.to_string(), "umount2 /mnt/x: Invalid argument");

        let err =
            SysError::new("mount", Path::new("/m"), Errno::ENOENT).with_detail("source /dev/x");
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            "mount /m: No such file or directory (source /dev/x)"
        );

        assert!(SysError::new("open(O_EXCL)", Path::new("/dev/loop0"), Errno::EBUSY).is_busy());
        assert!(loop_error("LOOP_CLR_FD", Path::new("/dev/loop0"), Errno::ENXIO).is_not_attached());
        assert_eq!(
            SysError::new("x", Path::new("/"), Errno::EPERM).kind(),
            SysErrorKind::Other
        );

        let io = SysError::io(
            "read",
            Path::new("/f"),
            io::Error::from_raw_os_error(libc::EBUSY),
        );
        assert!(io.is_busy());
        let io = SysError::io("read", Path::new("/f"), io::Error::other("boom"));
        assert_eq!(io.errno(), Errno::EIO);
        assert_eq!(io.detail(), Some("boom"));
    }

    #[test]
    fn block_device_checks_reject_regular_files() {
        let this = Path::new(file!())
            .canonicalize()
            .unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        let err = is_block_device_unused(&this).unwrap_err();
        assert_eq!(err.errno(), Errno::ENOTBLK);
        assert_eq!(device_numbers(&this).unwrap(), None);
        assert!(device_numbers(Path::new("/nonexistent/dev"))
            .unwrap_err()
            .is_not_found());
    }

    #[test]
    fn sparse_file_is_created_once_and_never_touched_again() {
        let dir = std::env::temp_dir().join(format!("syscheck-sparse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("nested/dirs/pool.img");

        assert_eq!(
            create_sparse_file(&path, 1 << 30).unwrap(),
            SparseFile::Created
        );
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(meta.blocks() * 512 < 1 << 20, "1 GiB file should be sparse");

        std::fs::write(&path, b"user data").unwrap();
        assert_eq!(
            create_sparse_file(&path, 1 << 30).unwrap(),
            SparseFile::Existed { len: 9 }
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"user data");

        let err = create_sparse_file(&dir, 10).unwrap_err();
        assert_eq!(err.errno(), Errno::EEXIST);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn discard_rejects_unaligned_ranges_before_the_kernel_does() {
        // /dev/null is a char device, so build the claim by hand.
        let dev = ExclusiveDevice {
            fd: open("open", Path::new("/dev/null"), OFlag::O_RDWR).unwrap(),
            path: PathBuf::from("/dev/null"),
        };
        let err = dev.discard(1, 512).unwrap_err();
        assert_eq!(err.errno(), Errno::EINVAL);
        assert!(dev.discard(512, 100).is_err());
    }
}

/// End-to-end tests against the real kernel: loop devices, ext4, mounts.
/// They need root, `mkfs.ext4` and loop support, and fail (never skip)
/// without them.
#[cfg(test)]
mod root_tests {
    use super::*;
    use crate::mountinfo::MountInfo;
    use std::os::unix::fs::FileExt;
    use std::process::Command;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    const MIB: u64 = 1 << 20;
    const POOL_SIZE: u64 = 256 * MIB;

    fn require_root() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "sys root tests drive loop devices, mknod and mount(2): run them as root \
             (euid is {euid}); they fail rather than skip"
        );
    }

    type Step = Box<dyn FnOnce() -> Result<()>>;

    /// Undo steps run in reverse order on drop, including when a test panics.
    /// Errors saying "already undone" are ignored, others are printed.
    struct Cleanup {
        steps: Vec<(String, Step)>,
    }

    impl Cleanup {
        fn new() -> Self {
            Cleanup { steps: Vec::new() }
        }

        fn defer(&mut self, what: impl Into<String>, step: impl FnOnce() -> Result<()> + 'static) {
            self.steps.push((what.into(), Box::new(step)));
        }

        fn unmount_later(&mut self, target: &Path) {
            let target = target.to_path_buf();
            self.defer(format!("unmount {}", target.display()), move || {
                unmount(&target)
            });
        }

        fn detach_later(&mut self, dev: &Path) {
            let dev = dev.to_path_buf();
            self.defer(format!("detach {}", dev.display()), move || {
                detach_loop(&dev)
            });
        }

        /// A fresh directory under the temp dir, removed at the end unless
        /// something is still mounted inside it.
        fn scratch_dir(&mut self, name: &str) -> PathBuf {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "syscheck-{}-{}-{name}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("create scratch dir");
            let d = dir.clone();
            self.defer(format!("remove {}", dir.display()), move || {
                let still_mounted = MountInfo::read()
                    .map(|info| info.mounts().iter().any(|m| m.mount_point.starts_with(&d)))
                    .unwrap_or(true);
                if still_mounted {
                    eprintln!(
                        "cleanup: leaving {} in place, something is still mounted in it",
                        d.display()
                    );
                    return Ok(());
                }
                std::fs::remove_dir_all(&d).map_err(|e| SysError::io("remove_dir_all", &d, e))
            });
            dir
        }
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            while let Some((what, step)) = self.steps.pop() {
                match step() {
                    Ok(()) => {}
                    Err(e) if e.is_not_mounted() || e.is_not_attached() || e.is_not_found() => {}
                    Err(e) => eprintln!("cleanup: {what}: {e}"),
                }
            }
        }
    }

    fn mkfs_ext4(dev: &Path) {
        let path = format!(
            "{}:/usr/sbin:/sbin",
            std::env::var("PATH").unwrap_or_default()
        );
        let status = Command::new("mkfs.ext4")
            .env("PATH", path)
            .args(["-q", "-F"])
            .arg(dev)
            .status()
            .expect("mkfs.ext4 must be installed (e2fsprogs)");
        assert!(
            status.success(),
            "mkfs.ext4 {} failed: {status}",
            dev.display()
        );
    }

    fn allocated_bytes(path: &Path) -> u64 {
        std::fs::metadata(path).expect("stat").blocks() * 512
    }

    fn wait_until_detached(backing: &Path) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while find_loop_for_file(backing)
            .expect("scan loop devices")
            .is_some()
        {
            assert!(
                Instant::now() < deadline,
                "{} still attached after detach",
                backing.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn loop_ext4_lifecycle() {
        require_root();
        let mut cleanup = Cleanup::new();
        let dir = cleanup.scratch_dir("lifecycle");

        // Sparse backing file; a second call leaves it alone.
        let backing = dir.join("pools/pool.img");
        assert_eq!(
            create_sparse_file(&backing, POOL_SIZE).unwrap(),
            SparseFile::Created
        );
        assert_eq!(
            create_sparse_file(&backing, 2 * POOL_SIZE).unwrap(),
            SparseFile::Existed { len: POOL_SIZE }
        );
        assert_eq!(std::fs::metadata(&backing).unwrap().len(), POOL_SIZE);
        assert!(
            allocated_bytes(&backing) < MIB,
            "backing file is not sparse"
        );

        // Attach; find it again by path, also through a detour.
        let dev = attach_loop(&backing).expect("attach_loop");
        cleanup.detach_later(&dev);
        assert_eq!(find_loop_for_file(&backing).unwrap(), Some(dev.clone()));
        assert_eq!(
            find_loop_for_file(&dir.join("pools/./../pools/pool.img")).unwrap(),
            Some(dev.clone())
        );
        let status = loop_status(&dev).unwrap();
        assert_eq!(
            status.flags & LO_FLAGS_AUTOCLEAR,
            0,
            "must survive our exit"
        );
        assert_eq!(status.flags & LO_FLAGS_READ_ONLY, 0);
        assert_eq!(
            status.backing_inode,
            std::fs::metadata(&backing).unwrap().ino()
        );
        assert_eq!(block_size_bytes(&dev).unwrap(), POOL_SIZE);
        let (major, minor) = device_numbers(&dev)
            .unwrap()
            .expect("loop is a block device");
        assert!(is_block_device_unused(&dev).unwrap());

        // Filesystem, mounted nosuid,nodev with an fs option.
        mkfs_ext4(&dev);
        let mnt = dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        mount_fs(
            &dev,
            &mnt,
            "ext4",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("errors=remount-ro"),
        )
        .expect("mount ext4");
        cleanup.unmount_later(&mnt);

        let info = MountInfo::read().unwrap();
        let mounted = info.top_mount_at(&mnt).expect("mountinfo shows the mount");
        assert_eq!(mounted.device(), (major, minor));
        assert_eq!(mounted.fs_type, "ext4");
        assert_eq!(mounted.source, dev.as_os_str());
        assert_eq!(mounted.root, Path::new("/"));
        assert_eq!(mounted.super_option("errors"), Some("remount-ro"));
        assert!(mounted.mount_option("nosuid").is_some());
        assert!(!mounted.is_read_only());
        assert_eq!(info.mounts_of_device(major, minor).len(), 1);

        // In use now: every exclusive operation must refuse.
        assert!(!is_block_device_unused(&dev).unwrap());
        assert!(open_exclusive(&dev).unwrap_err().is_busy());
        assert!(discard_range(&dev, 0, MIB).unwrap_err().is_busy());
        assert!(detach_loop(&dev).unwrap_err().is_busy());
        assert_eq!(
            find_loop_for_file(&backing).unwrap(),
            Some(dev.clone()),
            "still attached"
        );

        // Write and delete a file, then trim.
        let data = dir.join("mnt/data.bin");
        std::fs::write(&data, vec![0x5a_u8; 16 * MIB as usize]).unwrap();
        File::open(&data).unwrap().sync_all().unwrap();
        std::fs::remove_file(&data).unwrap();
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
        let trimmed = fitrim(&mnt, 0).expect("FITRIM");
        eprintln!("FITRIM trimmed {trimmed} bytes");
        assert!(trimmed > 0, "FITRIM reported nothing trimmed");

        // Read-only bind of a subdirectory.
        let sub = mnt.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("hello"), b"hi").unwrap();
        let ro = dir.join("ro-bind");
        std::fs::create_dir(&ro).unwrap();
        bind_mount(&sub, &ro, true).expect("read-only bind");
        cleanup.unmount_later(&ro);

        let err = std::fs::write(ro.join("nope"), b"x").unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EROFS),
            "write through ro bind: {err}"
        );
        assert_eq!(std::fs::read(ro.join("hello")).unwrap(), b"hi");
        std::fs::write(sub.join("still-writable"), b"y").expect("source stays writable");
        assert_eq!(std::fs::read(ro.join("still-writable")).unwrap(), b"y");

        let info = MountInfo::read().unwrap();
        let bind = info.top_mount_at(&ro).expect("mountinfo shows the bind");
        assert_eq!(bind.root, Path::new("/sub"));
        assert_eq!(bind.device(), (major, minor));
        assert!(bind.is_read_only());
        assert!(
            bind.mount_option("nosuid").is_some(),
            "nosuid kept: {bind:?}"
        );
        assert!(bind.mount_option("nodev").is_some(), "nodev kept: {bind:?}");
        assert!(!info.top_mount_at(&mnt).unwrap().is_read_only());
        assert_eq!(info.mounts_of_device(major, minor).len(), 2);

        // Our own device node for the loop device.
        let node = dir.join("node");
        make_block_node(&node, major, minor, 0o600).expect("mknod");
        assert_eq!(
            std::fs::metadata(&node).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        assert_eq!(device_numbers(&node).unwrap(), Some((major, minor)));
        assert_eq!(block_size_bytes(&node).unwrap(), POOL_SIZE);
        let mut magic = [0u8; 2];
        File::open(&node)
            .unwrap()
            .read_exact_at(&mut magic, 1080)
            .unwrap();
        assert_eq!(
            magic,
            [0x53, 0xef],
            "ext4 superblock magic through the new node"
        );
        make_block_node(&node, major, minor, 0o600).expect("same node again is fine");
        let err = make_block_node(&node, major, minor + 1, 0o600).unwrap_err();
        assert_eq!(err.errno(), Errno::EEXIST);

        // Unmount everything; repeated or bogus unmounts are told apart.
        unmount(&ro).unwrap();
        unmount(&mnt).unwrap();
        assert!(unmount(&mnt).unwrap_err().is_not_mounted());
        assert!(unmount(&dir.join("missing")).unwrap_err().is_not_found());
        let info = MountInfo::read().unwrap();
        assert!(!info.is_mount_point(&mnt));
        assert!(info.mounts_of_device(major, minor).is_empty());
        assert!(is_block_device_unused(&dev).unwrap());

        // Discard a region that holds data: the backing file loses the blocks
        // and the region reads back as zeros.
        let (offset, len) = (160 * MIB, 8 * MIB);
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)
            .unwrap();
        raw.write_all_at(&vec![0xab_u8; len as usize], offset)
            .unwrap();
        raw.sync_all().unwrap();
        let before = allocated_bytes(&backing);
        discard_range(&dev, offset, len).expect("BLKDISCARD");
        let after = allocated_bytes(&backing);
        eprintln!("backing file allocation: {before} bytes before discard, {after} after");
        assert!(
            before >= after + len,
            "allocation should drop by {len}: before {before}, after {after}"
        );
        let mut back = vec![0xff_u8; len as usize];
        raw.read_exact_at(&mut back, offset).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "discarded range reads as zeros"
        );
        drop(raw);

        // Detach; a second detach says so.
        detach_loop(&dev).expect("detach");
        wait_until_detached(&backing);
        assert!(detach_loop(&dev).unwrap_err().is_not_attached());
    }

    #[test]
    fn legacy_attach_with_long_path() {
        require_root();
        let mut cleanup = Cleanup::new();
        let dir = cleanup.scratch_dir("legacy");
        let deep = dir.join("a-directory-name-long-enough-to-overflow-lo-file-name-by-itself");
        let backing = deep.join("pool.img");
        assert!(backing.as_os_str().len() > 63);
        assert_eq!(
            create_sparse_file(&backing, 64 * MIB).unwrap(),
            SparseFile::Created
        );

        let dev = attach_loop_with(&backing, AttachMethod::SetFd).expect("LOOP_SET_FD path");
        cleanup.detach_later(&dev);
        let status = loop_status(&dev).unwrap();
        assert_eq!(status.flags & LO_FLAGS_AUTOCLEAR, 0);
        assert_eq!(
            status.file_name.as_os_str().as_bytes(),
            &backing.as_os_str().as_bytes()[..63],
            "name cut to 63 bytes"
        );
        assert_eq!(block_size_bytes(&dev).unwrap(), 64 * MIB);
        // sysfs has the full path even though lo_file_name is cut.
        assert_eq!(find_loop_for_file(&backing).unwrap(), Some(dev.clone()));

        detach_loop(&dev).unwrap();
        wait_until_detached(&backing);
    }

    #[test]
    fn deleted_backing_file_does_not_match() {
        require_root();
        let mut cleanup = Cleanup::new();
        let dir = cleanup.scratch_dir("deleted");
        let backing = dir.join("pool.img");
        create_sparse_file(&backing, 16 * MIB).unwrap();
        let dev = attach_loop(&backing).unwrap();
        cleanup.detach_later(&dev);

        std::fs::remove_file(&backing).unwrap();
        assert!(find_loop_for_file(&backing).unwrap_err().is_not_found());
        let sysfs = std::fs::read_to_string(format!(
            "/sys/block/{}/loop/backing_file",
            dev.file_name().unwrap().to_str().unwrap()
        ))
        .unwrap();
        assert!(sysfs.trim_end().ends_with(" (deleted)"), "{sysfs:?}");

        // A new file under the same name is not what the device backs.
        create_sparse_file(&backing, 16 * MIB).unwrap();
        assert_eq!(find_loop_for_file(&backing).unwrap(), None);

        detach_loop(&dev).unwrap();
    }

    /// Several attachers at once are handed the same free device by
    /// LOOP_CTL_GET_FREE; the losers get EBUSY and must move on to another.
    #[test]
    fn concurrent_attaches_get_distinct_devices() {
        require_root();
        const ATTACHERS: usize = 6;
        let mut cleanup = Cleanup::new();
        let dir = cleanup.scratch_dir("concurrent");
        let files: Vec<PathBuf> = (0..ATTACHERS)
            .map(|i| {
                let f = dir.join(format!("pool-{i}.img"));
                create_sparse_file(&f, 8 * MIB).unwrap();
                f
            })
            .collect();

        let barrier = std::sync::Arc::new(std::sync::Barrier::new(ATTACHERS));
        let handles: Vec<_> = files
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, f)| {
                let barrier = barrier.clone();
                // Half use each method so both retry paths get exercised.
                let method = if i % 2 == 0 {
                    AttachMethod::Configure
                } else {
                    AttachMethod::SetFd
                };
                std::thread::spawn(move || {
                    barrier.wait();
                    attach_loop_with(&f, method)
                })
            })
            .collect();
        let results: Vec<Result<PathBuf>> = handles
            .into_iter()
            .map(|h| h.join().expect("attacher panicked"))
            .collect();
        for dev in results.iter().flatten() {
            cleanup.detach_later(dev);
        }
        let devs: Vec<PathBuf> = results.into_iter().map(|r| r.expect("attach")).collect();

        let mut unique = devs.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ATTACHERS,
            "devices handed out twice: {devs:?}"
        );
        for (file, dev) in files.iter().zip(&devs) {
            assert_eq!(find_loop_for_file(file).unwrap().as_ref(), Some(dev));
        }
        for dev in &devs {
            detach_loop(dev).unwrap();
        }
    }

    #[test]
    fn missing_loop_nodes_are_created() {
        require_root();
        let mut cleanup = Cleanup::new();
        let dev_dir = cleanup.scratch_dir("devdir");
        let sys_block = Path::new(SYS_BLOCK);

        // loop0 exists in sysfs: its numbers come from /sys/block/loop0/dev.
        let expected = std::fs::read_to_string("/sys/block/loop0/dev")
            .expect("the loop driver is loaded and loop0 exists");
        let node = ensure_loop_node(sys_block, &dev_dir, 0).unwrap();
        assert_eq!(node, dev_dir.join("loop0"));
        let (major, minor) = device_numbers(&node).unwrap().unwrap();
        assert_eq!(format!("{major}:{minor}"), expected.trim());
        assert_eq!(ensure_loop_node(sys_block, &dev_dir, 0).unwrap(), node);

        // Unknown to sysfs: falls back to 7:N.
        let node = ensure_loop_node(sys_block, &dev_dir, 4000).unwrap();
        assert_eq!(device_numbers(&node).unwrap(), Some((LOOP_MAJOR, 4000)));
    }
}
