//! Device-mapper status, straight from the kernel (DM_DEV_STATUS), for
//! checks that must be cheap enough to make often.

use std::os::fd::AsRawFd;
use std::path::Path;

use nix::fcntl::OFlag;

use super::{open, Result, SysError};

pub(crate) mod ioctl {
    use super::DmIoctl;
    use crate::sys::Request;
    use std::mem::size_of;

    /// `_IOWR(0xfd, 7, struct dm_ioctl)`: DM_DEV_STATUS.
    pub const DM_DEV_STATUS: Request = nix::request_code_readwrite!(0xfd, 7, size_of::<DmIoctl>());
    nix::ioctl_readwrite_bad!(dm_dev_status, DM_DEV_STATUS, DmIoctl);
}

/// `struct dm_ioctl` from `<linux/dm-ioctl.h>` (312 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DmIoctl {
    version: [u32; 3],
    data_size: u32,
    data_start: u32,
    target_count: u32,
    open_count: i32,
    flags: u32,
    event_nr: u32,
    padding: u32,
    dev: u64,
    name: [u8; 128],
    uuid: [u8; 129],
    data: [u8; 7],
}

const DM_CONTROL: &str = "/dev/mapper/control";

/// `flags` bit of `struct dm_ioctl`: the device has a live table.
const DM_ACTIVE_PRESENT_FLAG: u32 = 1 << 5;

/// Which device DM_DEV_STATUS asks about.
enum By<'a> {
    Numbers(u32, u32),
    Name(&'a str),
}

/// DM_DEV_STATUS on `/dev/mapper/control`; `None` when no such device.
fn dev_status(by: By) -> Result<Option<DmIoctl>> {
    let control = Path::new(DM_CONTROL);
    let fd = open("open", control, OFlag::O_RDWR)?;
    let mut io = DmIoctl {
        version: [4, 0, 0],
        data_size: std::mem::size_of::<DmIoctl>() as u32,
        data_start: 0,
        target_count: 0,
        open_count: 0,
        flags: 0,
        event_nr: 0,
        padding: 0,
        dev: 0,
        name: [0; 128],
        uuid: [0; 129],
        data: [0; 7],
    };
    let what = match by {
        By::Numbers(major, minor) => {
            io.dev = libc::makedev(major, minor);
            format!("device {major}:{minor}")
        }
        By::Name(name) => {
            let bytes = name.as_bytes();
            if bytes.len() >= io.name.len() {
                return Ok(None);
            }
            io.name[..bytes.len()].copy_from_slice(bytes);
            format!("device {name}")
        }
    };
    // SAFETY: the fd is open and `io` is a valid, fully sized dm_ioctl.
    match unsafe { ioctl::dm_dev_status(fd.as_raw_fd(), &mut io) } {
        Ok(_) => Ok(Some(io)),
        Err(nix::errno::Errno::ENXIO) => Ok(None),
        Err(e) => Err(SysError::new("DM_DEV_STATUS", control, e).with_detail(what)),
    }
}

/// How many openers the device-mapper device `major:minor` has
/// (DM_DEV_STATUS on `/dev/mapper/control`): mounts, device-mapper tables
/// stacked on it and processes alike, including the caller's own opens.
pub fn dm_open_count(major: u32, minor: u32) -> Result<u32> {
    let io = dev_status(By::Numbers(major, minor))?.ok_or_else(|| {
        SysError::new(
            "DM_DEV_STATUS",
            Path::new(DM_CONTROL),
            nix::errno::Errno::ENXIO,
        )
        .with_detail(format!("device {major}:{minor}"))
    })?;
    Ok(io.open_count.max(0) as u32)
}

/// Whether the device-mapper device `name` exists and has a live table:
/// `None` when there is no such device, `Some(false)` for a device made
/// but never loaded (what a `dmsetup create` stopped half-way leaves; the
/// kernel shows such a device nowhere in sysfs).
pub fn dm_has_table(name: &str) -> Result<Option<bool>> {
    Ok(dev_status(By::Name(name))?.map(|io| io.flags & DM_ACTIVE_PRESENT_FLAG != 0))
}
