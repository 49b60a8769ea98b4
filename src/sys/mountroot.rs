//! A mount point opened as a descriptor that is proven to be the root of a
//! mount of one block device, so that what the driver then does through
//! it (FIFREEZE, FITHAW, the XFS grow ioctls) reaches that filesystem and
//! no other, whatever was swapped in at the path after the driver looked.
//!
//! [`open_mount_root`] opens the path through no symlink (see
//! [`super::beneath`]: openat2 `RESOLVE_NO_SYMLINKS` from `/`, the
//! no-follow walk without openat2), as a directory with `O_NOFOLLOW` and
//! `O_CLOEXEC`, and then checks the descriptor itself, not the path:
//!
//! - its `st_dev` is the expected device's numbers (a filesystem on a
//!   block device reports that device as `st_dev`; what a bind mount or a
//!   symlink put over the path reports another);
//! - it is the root of a mount, not a directory inside one. The kernel
//!   says so directly with `statx`'s `STATX_ATTR_MOUNT_ROOT` (Linux 5.8).
//!   Where statx does not report that attribute, the mount ids of the
//!   directory and of its `..` are compared (`/proc/self/fdinfo`, Linux
//!   3.15): `..` of a mount's root leaves the mount, `..` of any other
//!   directory stays in it. Comparing `st_dev` with `..` would not do: a
//!   filesystem bind-mounted inside itself has the same device on both
//!   sides, and inode numbers of different filesystems may be equal.
//!
//! A mismatch is [`SysErrorKind::NotTheMount`], which the error layer
//! answers with FAILED_PRECONDITION.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, Mode};

use super::{open_beneath, split_dev, Result, SysError, SysErrorKind};

/// Opens `path` as a directory (`O_RDONLY`: ioctls need a real open, not
/// `O_PATH`) and returns it only if it is the root of a mount of the block
/// device `device` (major, minor). See the module documentation.
pub fn open_mount_root(path: &Path, device: (u32, u32)) -> Result<OwnedFd> {
    let op = "open mount root";
    let fd =
        open_beneath(Path::new("/"), path, OFlag::O_RDONLY | OFlag::O_DIRECTORY).map_err(|e| {
            match e.errno() {
                // openat2 answers a symlink at the end with ENOTDIR (O_DIRECTORY
                // is checked first) or ELOOP; the walk with ELOOP.
                Errno::ELOOP | Errno::ENOTDIR => not_the_mount(
                    op,
                    path,
                    "found a symbolic link, or something that is not a directory, on the path"
                        .into(),
                ),
                _ => e,
            }
        })?;
    let st = stat::fstat(&fd).map_err(|e| SysError::new("fstat", path, e))?;
    let found = split_dev(st.st_dev);
    if found != device {
        return Err(not_the_mount(
            op,
            path,
            format!(
                "found a filesystem of device {}:{} there, not of the volume's device {}:{}",
                found.0, found.1, device.0, device.1
            ),
        ));
    }
    if !is_mount_root(&fd, path)? {
        return Err(not_the_mount(
            op,
            path,
            format!(
                "found a directory inside the filesystem of device {}:{} there, not the root of a mount of it",
                device.0, device.1
            ),
        ));
    }
    tracing::debug!(path = %path.display(), major = device.0, minor = device.1, "opened and checked mount root");
    Ok(fd)
}

fn not_the_mount(op: &'static str, path: &Path, found: String) -> SysError {
    SysError::new(op, path, Errno::EXDEV)
        .with_kind(SysErrorKind::NotTheMount)
        .with_detail(found)
}

/// Whether `fd` is the root of a mount: statx's answer where it gives
/// one, else the mount ids of `fd` and its `..`.
fn is_mount_root(fd: &OwnedFd, shown: &Path) -> Result<bool> {
    match statx_mount_root(fd) {
        Some(root) => Ok(root),
        None => parent_is_another_mount(fd, shown),
    }
}

/// `STATX_ATTR_MOUNT_ROOT` of `fd`; `None` where the kernel does not
/// report it (before 5.8) or statx itself is missing or filtered.
fn statx_mount_root(fd: &OwnedFd) -> Option<bool> {
    // SAFETY: statx is plain data; all zeros is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a NUL-terminated empty string (AT_EMPTY_PATH:
    // the descriptor itself), `sx` is valid for the kernel to write.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &mut sx,
        )
    };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (rc == 0 && sx.stx_attributes_mask & bit != 0).then_some(sx.stx_attributes & bit != 0)
}

/// The fallback: `..` of a mount's root is in the parent mount (another
/// mount id); `..` of any other directory is in the same mount.
pub(crate) fn parent_is_another_mount(fd: &OwnedFd, shown: &Path) -> Result<bool> {
    let parent = fcntl::openat(
        fd,
        "..",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SysError::new("openat(..)", shown, e))?;
    Ok(mount_id(fd, shown)? != mount_id(&parent, shown)?)
}

/// The mount id of an open descriptor, from `/proc/self/fdinfo`.
fn mount_id(fd: &impl AsFd, shown: &Path) -> Result<u64> {
    let info = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
    let text = std::fs::read_to_string(&info)
        .map_err(|e| SysError::io("read fdinfo", Path::new(&info), e))?;
    parse_mnt_id(&text).ok_or_else(|| {
        SysError::new("read fdinfo", shown, Errno::EINVAL)
            .with_detail(format!("no mnt_id line in {info}"))
    })
}

/// The `mnt_id:` field of an fdinfo text.
pub(crate) fn parse_mnt_id(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_id_is_read_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02100000\nmnt_id:\t31\nino:\t2\n";
        assert_eq!(parse_mnt_id(text), Some(31));
        assert_eq!(parse_mnt_id("pos:\t0\nflags:\t0\n"), None);
        assert_eq!(parse_mnt_id("mnt_id:\tx\n"), None);
    }

    /// `/proc` is a mount root whose device is not a block device's; a
    /// directory inside it is not a mount root. Both ways agree.
    #[test]
    fn mount_roots_are_told_from_directories_inside_them() {
        let proc_dev = split_dev(stat::stat("/proc").unwrap().st_dev);
        let root = open_beneath(Path::new("/"), Path::new("/proc"), OFlag::O_RDONLY).unwrap();
        // None: a kernel before 5.8; the fallback answers then.
        assert_ne!(statx_mount_root(&root), Some(false));
        assert!(parent_is_another_mount(&root, Path::new("/proc")).unwrap());
        assert!(open_mount_root(Path::new("/proc"), proc_dev).is_ok());

        let inside = Path::new("/proc/self/fdinfo");
        let fd = super::super::open("open", inside, OFlag::O_RDONLY | OFlag::O_DIRECTORY).unwrap();
        assert_ne!(statx_mount_root(&fd), Some(true));
        assert!(!parent_is_another_mount(&fd, inside).unwrap());
        // /proc/self is a symlink: refused before anything is checked.
        let e = open_mount_root(inside, proc_dev).unwrap_err();
        assert_eq!(e.kind(), SysErrorKind::NotTheMount, "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = open_mount_root(Path::new("/proc/1"), proc_dev).unwrap_err();
        assert_eq!(e.kind(), SysErrorKind::NotTheMount, "{e}");
        assert!(e.to_string().contains("not the root of a mount"), "{e}");
        let e = open_mount_root(Path::new("/proc"), (proc_dev.0, proc_dev.1 + 1)).unwrap_err();
        assert_eq!(e.kind(), SysErrorKind::NotTheMount, "{e}");
        assert!(
            e.to_string().contains("found a filesystem of device"),
            "{e}"
        );
    }
}
