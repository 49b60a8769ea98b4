//! Device nodes: mknod, and the numbers a node (or a path through
//! symlinks) refers to.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::stat::{self, Mode, SFlag};

use super::{split_dev, Result, SysError};

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
    set_node_mode(path, major, minor, mode & 0o7777)?;
    tracing::info!(path = %path.display(), major, minor, mode = format_args!("{:o}", mode & 0o7777), "created block device node");
    Ok(())
}

/// Sets the mode of the block node just made at `path` through a file
/// descriptor (O_PATH | O_NOFOLLOW), after checking that the descriptor is
/// that node: a symlink swapped in at `path` is never followed, so the
/// chmod cannot reach another file.
pub(super) fn set_node_mode(path: &Path, major: u32, minor: u32, mode: u32) -> Result<()> {
    let fd = super::open(
        "open(O_PATH)",
        path,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_NOFOLLOW,
    )?;
    let st = stat::fstat(&fd).map_err(|e| SysError::new("fstat", path, e))?;
    let is_block = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFBLK;
    if !is_block || split_dev(st.st_rdev) != (major, minor) {
        return Err(SysError::new("mknod", path, Errno::EEXIST)
            .with_detail("replaced by something else before its mode was set".to_string()));
    }
    // fchmod does not take an O_PATH descriptor; its /proc link names
    // exactly the inode checked above.
    let via = std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    std::fs::set_permissions(&via, std::fs::Permissions::from_mode(mode))
        .map_err(|e| SysError::io("chmod", path, e))
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
