//! Filesystem freeze and thaw (FIFREEZE, FITHAW on the mount point): a
//! frozen filesystem has flushed everything and blocks new writes until
//! it is thawed.

use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::{open, Result, SysError};

pub(crate) mod ioctl {
    use crate::sys::Request;

    /// `_IOWR('X', 119, int)`: FIFREEZE.
    pub const FIFREEZE: Request = nix::request_code_readwrite!(b'X', 119, 4);
    /// `_IOWR('X', 120, int)`: FITHAW.
    pub const FITHAW: Request = nix::request_code_readwrite!(b'X', 120, 4);
    nix::ioctl_write_int_bad!(fifreeze, FIFREEZE);
    nix::ioctl_write_int_bad!(fithaw, FITHAW);
}

/// Freezes the filesystem mounted at `mountpoint`. A filesystem frozen
/// already (by anyone) is `EBUSY`.
pub fn freeze(mountpoint: &Path) -> Result<()> {
    let fd = open("open", mountpoint, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    // SAFETY: the fd is open; FIFREEZE takes no argument worth reading.
    unsafe { ioctl::fifreeze(fd.as_raw_fd(), 0) }
        .map_err(|e| SysError::new("FIFREEZE", mountpoint, e))?;
    tracing::info!(mountpoint = %mountpoint.display(), "froze filesystem");
    Ok(())
}

/// Thaws the filesystem mounted at `mountpoint`; one that is not frozen
/// (`EINVAL`) is fine. Returns whether it was frozen.
pub fn thaw(mountpoint: &Path) -> Result<bool> {
    let fd = open("open", mountpoint, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    // SAFETY: as for `freeze`.
    match unsafe { ioctl::fithaw(fd.as_raw_fd(), 0) } {
        Ok(_) => {
            tracing::info!(mountpoint = %mountpoint.display(), "thawed filesystem");
            Ok(true)
        }
        Err(Errno::EINVAL) => Ok(false),
        Err(e) => Err(SysError::new("FITHAW", mountpoint, e)),
    }
}
