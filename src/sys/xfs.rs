//! XFS geometry and online growth of the data section, as ioctls on a
//! descriptor of the mounted filesystem (one [`super::open_mount_root`]
//! checked), instead of `xfs_growfs <path>`, which would look the path up
//! again and act on whatever filesystem is there by then.

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use super::{Result, SysError};

/// `struct xfs_fsop_geom_v1` of `<xfs/xfs_fs.h>` (112 bytes), the answer
/// to `XFS_IOC_FSGEOMETRY_V1`, which every kernel with XFS answers.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GeomV1 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    logblocks: u32,
    sectsize: u32,
    inodesize: u32,
    imaxpct: u32,
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    logstart: u64,
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
}

/// `struct xfs_growfs_data` (16 bytes with its tail padding), the
/// argument of `XFS_IOC_FSGROWFSDATA`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GrowfsData {
    newblocks: u64,
    imaxpct: u32,
}

/// ioctl request codes of this module and their nix wrappers; unit tests
/// compare the codes with the values of the C headers.
pub(crate) mod ioctl {
    use super::{GeomV1, GrowfsData};
    use crate::sys::Request;
    use std::mem::size_of;

    /// `_IOR('X', 100, struct xfs_fsop_geom_v1)`.
    pub const XFS_IOC_FSGEOMETRY_V1: Request =
        nix::request_code_read!(b'X', 100, size_of::<GeomV1>());
    /// `_IOW('X', 110, struct xfs_growfs_data)`.
    pub const XFS_IOC_FSGROWFSDATA: Request =
        nix::request_code_write!(b'X', 110, size_of::<GrowfsData>());

    nix::ioctl_read_bad!(fsgeometry_v1, XFS_IOC_FSGEOMETRY_V1, GeomV1);
    nix::ioctl_write_ptr_bad!(fsgrowfsdata, XFS_IOC_FSGROWFSDATA, GrowfsData);
}

/// What the driver needs of an XFS filesystem's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per filesystem block.
    pub blocksize: u32,
    /// Blocks of the data section (the filesystem's size).
    pub datablocks: u64,
    /// The most space inodes may take, in percent (kept as it is on grow).
    pub imaxpct: u32,
}

/// The geometry of the XFS filesystem `fd` is on (`XFS_IOC_FSGEOMETRY_V1`).
/// `shown` names it in errors. Not XFS: `ENOTTY`.
pub fn geometry(fd: &impl AsFd, shown: &Path) -> Result<Geometry> {
    let mut geo = GeomV1::default();
    // SAFETY: the fd is open for the call; `geo` has the layout the kernel
    // writes (checked against the header by a unit test).
    unsafe { ioctl::fsgeometry_v1(fd.as_fd().as_raw_fd(), &mut geo) }
        .map_err(|e| SysError::new("XFS_IOC_FSGEOMETRY_V1", shown, e))?;
    Ok(Geometry {
        blocksize: geo.blocksize,
        datablocks: geo.datablocks,
        imaxpct: geo.imaxpct,
    })
}

/// Grows the data section of the XFS filesystem `fd` is on to `newblocks`
/// blocks, keeping `imaxpct` (`XFS_IOC_FSGROWFSDATA`). The kernel never
/// adds an allocation group smaller than its minimum, so the filesystem
/// may end a little short of `newblocks`; read [`geometry`] again for what
/// it became. Never called with fewer blocks than the filesystem has:
/// that would ask a kernel that can shrink to shrink.
pub fn grow_data(fd: &impl AsFd, shown: &Path, newblocks: u64, imaxpct: u32) -> Result<()> {
    let arg = GrowfsData { newblocks, imaxpct };
    // SAFETY: the fd is open for the call; the kernel only reads `arg`.
    unsafe { ioctl::fsgrowfsdata(fd.as_fd().as_raw_fd(), &arg) }
        .map_err(|e| SysError::new("XFS_IOC_FSGROWFSDATA", shown, e))?;
    tracing::info!(mountpoint = %shown.display(), newblocks, "XFS_IOC_FSGROWFSDATA");
    Ok(())
}
