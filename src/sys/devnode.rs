//! Device nodes: mknod, and the numbers a node (or a path through
//! symlinks) refers to.

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
