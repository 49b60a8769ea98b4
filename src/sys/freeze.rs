//! Filesystem freeze and thaw (FIFREEZE, FITHAW on the mount point): a
//! frozen filesystem has flushed everything and blocks new writes until
//! it is thawed. Both act on a descriptor [`open_mount_root`] proved to be
//! the root of a mount of the expected device, never on whatever the path
//! leads to by then.
//!
//! The descriptor a freeze went through is kept until the thaw, which
//! goes through it again: a mount or a link placed over the path while
//! the filesystem is frozen cannot keep it frozen. Only a thaw without a
//! kept descriptor (a driver that restarted) opens and checks the path.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use nix::errno::Errno;

use super::{open_mount_root, Result, SysError};

pub(crate) mod ioctl {
    use crate::sys::Request;

    /// `_IOWR('X', 119, int)`: FIFREEZE.
    pub const FIFREEZE: Request = nix::request_code_readwrite!(b'X', 119, 4);
    /// `_IOWR('X', 120, int)`: FITHAW.
    pub const FITHAW: Request = nix::request_code_readwrite!(b'X', 120, 4);
    nix::ioctl_write_int_bad!(fifreeze, FIFREEZE);
    nix::ioctl_write_int_bad!(fithaw, FITHAW);
}

/// The descriptors of the filesystems this process froze, by device, kept
/// for their thaw.
static FROZEN: Mutex<BTreeMap<(u32, u32), OwnedFd>> = Mutex::new(BTreeMap::new());

/// Freezes the filesystem of block device `device` (major, minor) mounted
/// at `mountpoint`, and keeps the descriptor for [`thaw`]. A filesystem
/// frozen already (by anyone) is `EBUSY`; another one at the path is
/// [`super::SysErrorKind::NotTheMount`].
pub fn freeze(mountpoint: &Path, device: (u32, u32)) -> Result<()> {
    let fd = open_mount_root(mountpoint, device)?;
    // SAFETY: the fd is open; FIFREEZE takes no argument worth reading.
    unsafe { ioctl::fifreeze(fd.as_raw_fd(), 0) }
        .map_err(|e| SysError::new("FIFREEZE", mountpoint, e))?;
    tracing::info!(mountpoint = %mountpoint.display(), major = device.0, minor = device.1, "froze filesystem");
    FROZEN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(device, fd);
    Ok(())
}

/// Thaws the filesystem of `device`: through the descriptor its freeze
/// kept, else through `mountpoint` (checked as for [`freeze`]). One that
/// is not frozen (`EINVAL`) is fine. Returns whether it was frozen.
pub fn thaw(mountpoint: &Path, device: (u32, u32)) -> Result<bool> {
    let kept = FROZEN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&device);
    let fd = match kept {
        Some(fd) => fd,
        None => open_mount_root(mountpoint, device)?,
    };
    // SAFETY: as for `freeze`.
    match unsafe { ioctl::fithaw(fd.as_raw_fd(), 0) } {
        Ok(_) => {
            tracing::info!(mountpoint = %mountpoint.display(), major = device.0, minor = device.1, "thawed filesystem");
            Ok(true)
        }
        Err(Errno::EINVAL) => Ok(false),
        Err(e) => Err(SysError::new("FITHAW", mountpoint, e)),
    }
}

/// Whether a kernel freeze (device-mapper's lockfs, as LVM's suspend of
/// a snapshot origin takes) nests inside a userspace freeze (FIFREEZE) we
/// hold. Linux 6.6 brought freeze holders, but its block-device freeze
/// still froze as userspace and met EBUSY; 6.8's holder ops (and
/// FREEZE_MAY_NEST) made the two nest. Before 6.8 the nested freeze fails.
pub fn kernel_freeze_nests() -> bool {
    let uts = nix::sys::utsname::uname();
    match uts {
        Ok(u) => release_has_freeze_holders(&u.release().to_string_lossy()),
        Err(e) => {
            tracing::warn!(error = %e, "uname failed; assuming freezes do not nest");
            false
        }
    }
}

/// `release` is a kernel release string such as `6.1.0-48-amd64`.
pub(crate) fn release_has_freeze_holders(release: &str) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (6, 8),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_freezes_nest_from_6_8() {
        for (release, nests) in [
            ("6.1.0-48-amd64", false),
            ("5.15.0-91-generic", false),
            ("6.5.13", false),
            ("6.6.0", false),
            ("6.7.12", false),
            ("6.8.0-49-generic", true),
            ("6.12.57+deb13-amd64", true),
            ("7.0.1", true),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(release_has_freeze_holders(release), nests, "{release}");
        }
    }
}
