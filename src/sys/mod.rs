//! Privileged syscalls, wrapped once, in one module per subject: block
//! devices ([`block`]: size, exclusive opens, discard, FITRIM), paths
//! opened beneath a root through no symlink ([`beneath`]), device
//! nodes ([`devnode`]), device-mapper status ([`dm`]), files that must be
//! created once or locked ([`file`]), filesystem freezes ([`freeze`]),
//! the process's heap (freed memory back to the kernel: [`heap`]),
//! mounts ([`mount`]), a mount point opened as the proven root of a
//! device's mount ([`mountroot`]), and XFS geometry and growth ([`xfs`]).
//! Loop devices
//! are the pool's business: `crate::pool::loopdev`.
//!
//! Everything in the driver that needs root and talks to the kernel
//! directly goes through these modules, so that each call is written,
//! reviewed and logged in one place. State-changing functions log at
//! `info`, read-only ones at `debug`. Failures come back as [`SysError`],
//! which names the operation, the path and the errno, and classifies the
//! errnos callers branch on ([`SysErrorKind`]). Callers on the async
//! runtime run them through `crate::blocking`.
//!
//!
//! ## Exclusive opens
//!
//! Opening a block device with `O_EXCL` (and without `O_CREAT`) asks the kernel
//! for an exclusive claim. It fails with `EBUSY` while the device is mounted,
//! held by device-mapper/md, or claimed exclusively by another opener, which
//! makes it the kernel's own answer to "is anybody using this device?". It does
//! not see plain (non-exclusive) openers such as a running `dd`. Destructive
//! operations here ([`discard_range`], [`detach_loop`]) take that claim first.

pub mod beneath;
pub mod block;
pub mod devnode;
pub mod dm;
pub mod file;
pub mod freeze;
pub mod heap;
pub mod mount;
pub mod mountroot;
pub mod xfs;

pub use beneath::*;
pub use block::*;
pub use devnode::*;
pub use dm::*;
pub use file::*;
pub use heap::release_free_memory;
pub use mount::*;
pub use mountroot::open_mount_root;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, Mode};

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
    /// A mount point was, once opened, not the root of a mount of the
    /// expected device ([`mountroot`]); the detail says what was there.
    NotTheMount,
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
    pub(crate) fn new(op: &'static str, path: &Path, errno: Errno) -> Self {
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
    pub(crate) fn io(op: &'static str, path: &Path, err: io::Error) -> Self {
        match err.raw_os_error() {
            Some(raw) => Self::new(op, path, Errno::from_raw(raw)),
            None => Self::new(op, path, Errno::EIO).with_detail(err.to_string()),
        }
    }

    pub(crate) fn with_kind(mut self, kind: SysErrorKind) -> Self {
        self.kind = kind;
        self
    }

    pub(crate) fn with_detail(mut self, detail: impl Into<String>) -> Self {
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

/// `open(2)` with `O_CLOEXEC` always added.
pub(crate) fn open(op: &'static str, path: &Path, flags: OFlag) -> Result<OwnedFd> {
    fcntl::open(path, flags | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| SysError::new(op, path, e))
}

/// Fails with `ENOTBLK` unless `path` (after following symlinks) is a block
/// device node. Guards the `O_EXCL` opens: on a regular file `O_EXCL` without
/// `O_CREAT` silently means nothing.
pub(crate) fn require_block_device(op: &'static str, path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| SysError::io(op, path, e))?;
    if meta.file_type().is_block_device() {
        Ok(())
    } else {
        Err(SysError::new(op, path, Errno::ENOTBLK))
    }
}

pub(crate) fn split_dev(rdev: u64) -> (u32, u32) {
    // Linux majors are 12 bits and minors 20 bits, so both fit in u32.
    (stat::major(rdev) as u32, stat::minor(rdev) as u32)
}

/// Type of an ioctl request number on this target.
pub(crate) type Request = nix::sys::ioctl::ioctl_num_type;

#[cfg(test)]
mod root_tests;
#[cfg(test)]
mod tests;
