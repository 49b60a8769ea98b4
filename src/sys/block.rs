//! Block devices: size, exclusive claims, discard, and FITRIM of a
//! mounted filesystem.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;

use super::{open, require_block_device, Result, SysError};

/// `struct fstrim_range` from `<linux/fs.h>` (24 bytes), for `FITRIM`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// ioctl request codes of this module and their nix wrappers; unit tests
/// compare the codes with the values of the C headers.
pub(crate) mod ioctl {
    use super::FstrimRange;
    use crate::sys::Request;
    use std::mem::size_of;

    /// `_IOR(0x12, 114, size_t)`: the kernel always writes a `u64`, but the
    /// code encodes `sizeof(size_t)`, as in `<linux/fs.h>`.
    pub const BLKGETSIZE64: Request = nix::request_code_read!(0x12, 114, size_of::<libc::size_t>());
    /// `_IO(0x12, 119)`, argument `uint64_t[2]` = {offset, length}.
    pub const BLKDISCARD: Request = nix::request_code_none!(0x12, 119);
    /// `_IOWR('X', 121, struct fstrim_range)`.
    pub const FITRIM: Request = nix::request_code_readwrite!(b'X', 121, size_of::<FstrimRange>());

    nix::ioctl_read_bad!(blkgetsize64, BLKGETSIZE64, u64);
    nix::ioctl_write_ptr_bad!(blkdiscard, BLKDISCARD, [u64; 2]);
    nix::ioctl_readwrite_bad!(fitrim, FITRIM, FstrimRange);
}

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
    /// Writes all of `data` at `offset`.
    pub fn write_all_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            let n = nix::sys::uio::pwrite(
                self.fd.as_fd(),
                &data[done..],
                (offset + done as u64) as i64,
            )
            .map_err(|e| SysError::new("pwrite", &self.path, e))?;
            if n == 0 {
                return Err(
                    SysError::new("pwrite", &self.path, Errno::ENOSPC).with_detail(format!(
                        "no byte written at offset {}",
                        offset + done as u64
                    )),
                );
            }
            done += n;
        }
        Ok(())
    }

    /// Flushes what was written to the device (`fdatasync`).
    pub fn sync_data(&self) -> Result<()> {
        nix::unistd::fdatasync(self.fd.as_fd())
            .map_err(|e| SysError::new("fdatasync", &self.path, e))
    }

    /// Drops the device's clean cached pages (`posix_fadvise`
    /// DONTNEED, after a sync): what is read next comes from the device,
    /// not from what this process wrote into the cache.
    pub fn drop_cached(&self) -> Result<()> {
        self.sync_data()?;
        nix::fcntl::posix_fadvise(
            self.fd.as_fd(),
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .map_err(|e| SysError::new("posix_fadvise(DONTNEED)", &self.path, e))
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (fewer only at the end of the device).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        pread_full(self.fd.as_fd(), &self.path, offset, buf)
    }

    /// Exactly `buf.len()` bytes at `offset` (a copy's whole check reads
    /// back what it wrote); a read past the device's end is an error.
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        pread_exact(self.fd.as_fd(), &self.path, offset, buf)
    }
}

/// `buf.len()` bytes of `fd` at `offset`, or fewer at its end.
fn pread_full(fd: BorrowedFd<'_>, path: &Path, offset: u64, buf: &mut [u8]) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = nix::sys::uio::pread(fd, &mut buf[done..], (offset + done as u64) as i64)
            .map_err(|e| SysError::new("pread", path, e))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// Exactly `buf.len()` bytes of `fd` at `offset`; fewer is EIO, named.
fn pread_exact(fd: BorrowedFd<'_>, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    let n = pread_full(fd, path, offset, buf)?;
    if n < buf.len() {
        return Err(
            SysError::new("pread", path, Errno::EIO).with_detail(format!(
                "{n} of {} bytes at offset {offset}: the device ends there",
                buf.len()
            )),
        );
    }
    Ok(())
}

/// A block device opened read-only, shared with whoever else reads it
/// (a snapshot read for a copy on another node).
pub struct ReadOnlyDevice {
    fd: OwnedFd,
    path: PathBuf,
}

/// Opens block device `dev` read-only (`O_RDONLY`, no claim).
pub fn open_read_only(dev: &Path) -> Result<ReadOnlyDevice> {
    require_block_device("open(O_RDONLY)", dev)?;
    let fd = open("open(O_RDONLY)", dev, OFlag::O_RDONLY)?;
    Ok(ReadOnlyDevice {
        fd,
        path: dev.to_path_buf(),
    })
}

impl ReadOnlyDevice {
    /// Exactly `buf.len()` bytes at `offset`; a read that ends early (past
    /// the device's end) is an error.
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        pread_exact(self.fd.as_fd(), &self.path, offset, buf)
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

/// Flushes the filesystem `fd` is on (`syncfs`), so that blocks freed by
/// recent deletes are committed before a FITRIM looks for them. `shown`
/// names it in errors and logs.
pub fn sync_filesystem(fd: &impl AsFd, shown: &Path) -> Result<()> {
    nix::unistd::syncfs(fd.as_fd()).map_err(|e| SysError::new("syncfs", shown, e))?;
    tracing::debug!(path = %shown.display(), "synced filesystem");
    Ok(())
}

/// Asks the filesystem `fd` is on (a mount root [`super::open_mount_root`]
/// checked) to discard its unused blocks in the byte range
/// `start..start+len` of its address space (`FITRIM`, what fstrim(8)
/// does), ignoring free extents shorter than `minlen` bytes. Returns the
/// number of bytes the filesystem reports as trimmed. Some filesystems
/// (ext4) skip block groups already trimmed since mount, so a second call
/// may return less. `shown` names the mount point in errors and logs.
pub fn fitrim(fd: &impl AsFd, shown: &Path, start: u64, len: u64, minlen: u64) -> Result<u64> {
    let mut range = FstrimRange { start, len, minlen };
    // SAFETY: the fd is open and `range` is a valid fstrim_range that the
    // kernel reads and updates in place.
    unsafe { ioctl::fitrim(fd.as_fd().as_raw_fd(), &mut range) }
        .map_err(|e| SysError::new("FITRIM", shown, e))?;
    tracing::info!(mountpoint = %shown.display(), start, len, minlen, trimmed = range.len, "trimmed filesystem");
    Ok(range.len)
}

#[cfg(test)]
mod tests {
    use super::*;

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
