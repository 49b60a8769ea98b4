//! Device-mapper status, straight from the kernel (DM_DEV_STATUS,
//! DM_TABLE_STATUS, DM_LIST_DEVICES), for checks that must be cheap enough to make often:
//! no `dmsetup` process, no LVM command.

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
    /// `_IOWR(0xfd, 12, struct dm_ioctl)`: DM_TABLE_STATUS.
    pub const DM_TABLE_STATUS: Request =
        nix::request_code_readwrite!(0xfd, 12, size_of::<DmIoctl>());
    nix::ioctl_readwrite_bad!(dm_table_status, DM_TABLE_STATUS, DmIoctl);
    /// `_IOWR(0xfd, 8, struct dm_ioctl)`: DM_DEV_WAIT.
    pub const DM_DEV_WAIT: Request = nix::request_code_readwrite!(0xfd, 8, size_of::<DmIoctl>());
    nix::ioctl_readwrite_bad!(dm_dev_wait, DM_DEV_WAIT, DmIoctl);
    /// `_IOWR(0xfd, 2, struct dm_ioctl)`: DM_LIST_DEVICES.
    pub const DM_LIST_DEVICES: Request =
        nix::request_code_readwrite!(0xfd, 2, size_of::<DmIoctl>());
    nix::ioctl_readwrite_bad!(dm_list_devices, DM_LIST_DEVICES, DmIoctl);
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

/// `flags` bit: the answer did not fit the buffer.
const DM_BUFFER_FULL_FLAG: u32 = 1 << 8;

/// `flags` bit: do not flush (a thin pool's status would otherwise commit
/// its metadata first).
const DM_NOFLUSH_FLAG: u32 = 1 << 11;

/// Which device a status ioctl asks about.
pub enum By<'a> {
    Numbers(u32, u32),
    Name(&'a str),
    /// No one device: a request about every device (DM_LIST_DEVICES).
    All,
}

fn header(data_size: usize) -> DmIoctl {
    DmIoctl {
        version: [4, 0, 0],
        data_size: data_size as u32,
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
    }
}

/// Fills in which device `io` asks about; `None` for a name device-mapper
/// cannot hold (no such device).
fn address(io: &mut DmIoctl, by: &By) -> Option<String> {
    Some(match *by {
        By::Numbers(major, minor) => {
            io.dev = libc::makedev(major, minor);
            format!("device {major}:{minor}")
        }
        By::Name(name) => {
            let bytes = name.as_bytes();
            if bytes.len() >= io.name.len() {
                return None;
            }
            io.name[..bytes.len()].copy_from_slice(bytes);
            format!("device {name}")
        }
        By::All => "every device".to_string(),
    })
}

/// DM_DEV_STATUS on `/dev/mapper/control`; `None` when no such device.
fn dev_status(by: By) -> Result<Option<DmIoctl>> {
    let control = Path::new(DM_CONTROL);
    let mut io = header(std::mem::size_of::<DmIoctl>());
    let Some(what) = address(&mut io, &by) else {
        return Ok(None);
    };
    let fd = open("open", control, OFlag::O_RDWR)?;
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

/// The event counter of the device-mapper device `name` (DM_DEV_STATUS):
/// a target raises it on what its watcher must see (a thin pool: its data
/// or metadata passing the low water mark, running out of space, a mode
/// change); `None` when there is no such device.
pub fn dm_event_nr(name: &str) -> Result<Option<u32>> {
    Ok(dev_status(By::Name(name))?.map(|io| io.event_nr))
}

/// Blocks until the event counter of the device-mapper device `name` is no
/// longer `event_nr` (DM_DEV_WAIT, as dmeventd waits), or a signal
/// interrupts the wait; `Ok(false)` when there is no such device. Run it
/// on a thread of its own: it may block for as long as nothing happens.
pub fn dm_wait_event(name: &str, event_nr: u32) -> Result<bool> {
    let control = Path::new(DM_CONTROL);
    let fd = open("open", control, OFlag::O_RDWR)?;
    // Room for the status the kernel writes back, which is not read.
    let Some((_, what, res)) = with_buffer(
        &fd,
        &By::Name(name),
        16 * 1024,
        event_nr,
        ioctl::dm_dev_wait,
    ) else {
        return Ok(false);
    };
    match res {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(true),
        Err(nix::errno::Errno::ENXIO) => Ok(false),
        Err(e) => Err(SysError::new("DM_DEV_WAIT", control, e).with_detail(what)),
    }
}

/// The raw ioctl of a request that answers in a buffer after its header.
type BufferIoctl = unsafe fn(libc::c_int, *mut DmIoctl) -> nix::Result<libc::c_int>;

/// Runs `call` on device `by` with a `size`-byte buffer (u64 words keep
/// it aligned for dm_ioctl and what follows), without flushing; `None`
/// when device-mapper cannot hold the name. The buffer, the device as
/// named in errors, and the ioctl's result.
fn with_buffer(
    fd: &std::os::fd::OwnedFd,
    by: &By,
    size: usize,
    event_nr: u32,
    call: BufferIoctl,
) -> Option<(Vec<u64>, String, nix::Result<libc::c_int>)> {
    let mut buf = vec![0u64; size / 8];
    let mut io = header(size);
    io.flags = DM_NOFLUSH_FLAG;
    io.event_nr = event_nr;
    let what = address(&mut io, by)?;
    let io_ptr = buf.as_mut_ptr() as *mut DmIoctl;
    // SAFETY: `buf` is `size` bytes, aligned to 8, larger than a
    // dm_ioctl; the kernel writes at most `data_size` bytes into it.
    let res = unsafe {
        io_ptr.write(io);
        call(fd.as_raw_fd(), io_ptr)
    };
    Some((buf, what, res))
}

/// The device numbers of the device-mapper device `name`, if it exists
/// (DM_DEV_STATUS): what LVM made when it activated an LV, without asking
/// LVM.
pub fn dm_numbers(name: &str) -> Result<Option<(u32, u32)>> {
    Ok(dev_status(By::Name(name))?
        .filter(|io| io.flags & DM_ACTIVE_PRESENT_FLAG != 0)
        .map(|io| (libc::major(io.dev), libc::minor(io.dev))))
}

/// One target of a device's live table and its status line, as
/// `dmsetup status` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatus {
    pub start: u64,
    pub length: u64,
    pub target_type: String,
    pub status: String,
}

/// `struct dm_target_spec` from `<linux/dm-ioctl.h>` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
struct TargetSpec {
    sector_start: u64,
    length: u64,
    status: i32,
    next: u32,
    target_type: [u8; 16],
}

/// The status of every target of the device `by` (DM_TABLE_STATUS, without
/// flushing); `None` when there is no such device.
pub fn dm_table_status(by: By) -> Result<Option<Vec<TargetStatus>>> {
    Ok(answer(&by, "DM_TABLE_STATUS", ioctl::dm_table_status)?
        .map(|(io, data)| parse_targets(&data, io.target_count)))
}

/// The name of every device-mapper device, with a table or without one
/// (DM_LIST_DEVICES, what `dmsetup ls` asks): a device created but never
/// loaded has no block device in sysfs, so only this list shows it.
pub fn dm_names() -> Result<Vec<String>> {
    Ok(answer(&By::All, "DM_LIST_DEVICES", ioctl::dm_list_devices)?
        .map(|(_, data)| parse_name_list(&data))
        .unwrap_or_default())
}

/// Runs `call` on device `by` with a buffer grown until the answer fits;
/// the header the kernel wrote back and the data it wrote after it, or
/// `None` when there is no such device.
fn answer(
    by: &By,
    ioctl_name: &'static str,
    call: BufferIoctl,
) -> Result<Option<(DmIoctl, Vec<u8>)>> {
    let control = Path::new(DM_CONTROL);
    let fd = open("open", control, OFlag::O_RDWR)?;
    let mut size = 16 * 1024;
    loop {
        let Some((buf, what, res)) = with_buffer(&fd, by, size, 0, call) else {
            return Ok(None);
        };
        match res {
            Ok(_) => {}
            Err(nix::errno::Errno::ENXIO) => return Ok(None),
            Err(e) => return Err(SysError::new(ioctl_name, control, e).with_detail(what)),
        }
        // SAFETY: the kernel filled in the header at the buffer's start.
        let io = unsafe { (buf.as_ptr() as *const DmIoctl).read() };
        if io.flags & DM_BUFFER_FULL_FLAG != 0 {
            size *= 4;
            continue;
        }
        // SAFETY: u64 words viewed as the bytes they hold.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, size) };
        let end = (io.data_size as usize).min(size);
        let data = bytes.get(io.data_start as usize..end).unwrap_or(&[]);
        return Ok(Some((io, data.to_vec())));
    }
}

/// The names DM_LIST_DEVICES wrote: each a `struct dm_name_list` (the
/// device's numbers as a u64, `next` as a u32 counting from this entry, 0
/// on the last) followed by its NUL-terminated name; a first entry whose
/// device is 0 says there is none.
fn parse_name_list(data: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(entry) = data.get(at..).filter(|e| e.len() > 12) {
        let dev = u64::from_ne_bytes(entry[0..8].try_into().unwrap());
        let next = u32::from_ne_bytes(entry[8..12].try_into().unwrap());
        if dev == 0 {
            break;
        }
        let name = entry[12..].split(|c| *c == 0).next().unwrap_or(&[]);
        out.push(String::from_utf8_lossy(name).into_owned());
        if next == 0 {
            break;
        }
        at += next as usize;
    }
    out
}

/// The targets DM_TABLE_STATUS wrote: each a `dm_target_spec` followed by
/// its NUL-terminated status line; `next` counts from the first spec.
fn parse_targets(data: &[u8], count: u32) -> Vec<TargetStatus> {
    let spec_len = std::mem::size_of::<TargetSpec>();
    let mut out = Vec::new();
    let mut at = 0usize;
    for _ in 0..count {
        let Some(raw) = data.get(at..at + spec_len) else {
            break;
        };
        // SAFETY: `raw` holds `spec_len` bytes; read unaligned.
        let spec = unsafe { (raw.as_ptr() as *const TargetSpec).read_unaligned() };
        let text = |b: &[u8]| {
            let b = b.split(|c| *c == 0).next().unwrap_or(&[]);
            String::from_utf8_lossy(b).into_owned()
        };
        out.push(TargetStatus {
            start: spec.sector_start,
            length: spec.length,
            target_type: text(&spec.target_type),
            status: text(data.get(at + spec_len..).unwrap_or(&[])),
        });
        if spec.next as usize <= at {
            break;
        }
        at = spec.next as usize;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(start: u64, len: u64, next: u32, ty: &str, status: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(start.to_ne_bytes());
        b.extend(len.to_ne_bytes());
        b.extend(0i32.to_ne_bytes());
        b.extend(next.to_ne_bytes());
        let mut t = [0u8; 16];
        t[..ty.len()].copy_from_slice(ty.as_bytes());
        b.extend(t);
        b.extend(status.as_bytes());
        b.push(0);
        while b.len() % 8 != 0 {
            b.push(0);
        }
        b
    }

    fn name_entry(dev: u64, next: u32, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(dev.to_ne_bytes());
        b.extend(next.to_ne_bytes());
        b.extend(name.as_bytes());
        b.push(0);
        // Newer kernels put the event counter and flags after the name;
        // `next` steps over them.
        b.extend([0xee; 8]);
        while b.len() % 8 != 0 {
            b.push(0);
        }
        b
    }

    #[test]
    fn device_names_are_read_as_the_kernel_lays_them_out() {
        let first = name_entry(254 << 8, 0, "tpcsi-ro-csi-a-1");
        let mut data = name_entry(254 << 8, first.len() as u32, "tpcsi-ro-csi-a-1");
        data.extend(name_entry((254 << 8) | 3, 0, "vg-pool-tpool"));
        assert_eq!(
            parse_name_list(&data),
            vec!["tpcsi-ro-csi-a-1".to_string(), "vg-pool-tpool".to_string()]
        );
        // No device: one entry of device 0.
        assert!(parse_name_list(&name_entry(0, 0, "")).is_empty());
        // A short or cut answer ends the list, never reads past it.
        assert!(parse_name_list(&data[..10]).is_empty());
        assert_eq!(parse_name_list(&data[..first.len() + 4]).len(), 1);
    }

    #[test]
    fn table_status_targets_are_read_as_the_kernel_lays_them_out() {
        let first = spec(0, 8192, 0, "thin", "2048 4095");
        let next = first.len() as u32;
        let mut data = spec(0, 8192, next, "thin", "2048 4095");
        data.extend(spec(8192, 100, 0, "linear", ""));
        let t = parse_targets(&data, 2);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[0],
            TargetStatus {
                start: 0,
                length: 8192,
                target_type: "thin".into(),
                status: "2048 4095".into()
            }
        );
        assert_eq!(t[1].start, 8192);
        assert_eq!(t[1].target_type, "linear");
        // A count larger than what is there stops at the end.
        assert_eq!(parse_targets(&data[..next as usize], 5).len(), 1);
        assert_eq!(std::mem::size_of::<TargetSpec>(), 40);
        assert_eq!(std::mem::size_of::<DmIoctl>(), 312);
    }
}
