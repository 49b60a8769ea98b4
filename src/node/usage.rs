//! Usage and health of a mounted filesystem: statvfs counts, and what is
//! known to be wrong with it (remounted read-only after errors, ext4's
//! error count).

use std::path::Path;

use nix::errno::Errno;

use crate::mountinfo::MountInfo;
use crate::node::{dm, Device};
use crate::sys;

/// Bytes and inodes of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes_total: u64,
    pub bytes_available: u64,
    pub bytes_used: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
}

/// Usage of the filesystem at `path`, from statvfs.
// statvfs's counts are libc aliases: u64 here, narrower on some targets.
#[allow(clippy::unnecessary_cast)]
pub fn usage(path: &Path) -> std::result::Result<Usage, Errno> {
    let st = sys::mount::statvfs(path)?;
    let frsize = st.fragment_size() as u64;
    let blocks = st.blocks() as u64;
    let free = st.blocks_free() as u64;
    let files = st.files() as u64;
    let ffree = st.files_free() as u64;
    Ok(Usage {
        bytes_total: blocks * frsize,
        bytes_available: st.blocks_available() as u64 * frsize,
        bytes_used: blocks.saturating_sub(free) * frsize,
        inodes_total: files,
        inodes_free: ffree,
        inodes_used: files.saturating_sub(ffree),
    })
}

/// What is wrong with the filesystem on `dev`, in words a person can act
/// on; empty when nothing is known to be wrong.
///
/// - Any mount of it whose superblock is read-only while the mount itself
///   is read-write: the kernel remounted it read-only after errors
///   (`errors=remount-ro`). A filesystem mounted `ro` on request has both
///   flags set and is not reported.
/// - ext4: `/sys/fs/ext4/<dev>/errors_count` above zero.
/// - xfs keeps no error counter; a shut-down xfs fails statvfs with EIO,
///   which the caller reports. That is the best the kernel offers.
pub fn problems(info: &MountInfo, dev: &Device) -> Vec<String> {
    let mut out = Vec::new();
    let mounts = info.mounts_of_device(dev.major, dev.minor);
    if let Some(m) = mounts
        .iter()
        .find(|m| m.super_option("ro").is_some() && m.mount_option("ro").is_none())
    {
        out.push(format!(
            "the {} filesystem of volume {} was remounted read-only by the kernel after errors \
             (mounted at {}): check dmesg, unstage it and repair it (e2fsck / xfs_repair)",
            m.fs_type,
            dev.volume_id,
            m.mount_point.display()
        ));
    }
    if mounts.iter().any(|m| m.fs_type == "ext4") {
        if let Some(count) = ext4_errors(dev.major, dev.minor).filter(|c| *c > 0) {
            out.push(format!(
                "the ext4 filesystem of volume {} has recorded {count} errors: check dmesg, \
                 unstage it and run e2fsck -f on it",
                dev.volume_id
            ));
        }
    }
    out
}

fn ext4_errors(major: u32, minor: u32) -> Option<u64> {
    let name = dm::kernel_name(major, minor)?;
    std::fs::read_to_string(format!("/sys/fs/ext4/{name}/errors_count"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_of_a_real_filesystem() {
        let u = usage(Path::new("/")).unwrap();
        assert!(u.bytes_total > 0 && u.bytes_used <= u.bytes_total);
        assert!(u.bytes_available <= u.bytes_total);
        assert!(u.inodes_used <= u.inodes_total || u.inodes_total == 0);
    }

    #[test]
    fn read_only_after_errors_is_a_problem_but_requested_ro_is_not() {
        let dev = Device {
            volume_id: "csi-v".into(),
            path: "/dev/v/csi-v".into(),
            major: 253,
            minor: 9,
        };
        let table = |mount_opts: &str, super_opts: &str| {
            MountInfo::parse(&format!(
                "30 1 253:9 / /srv/s {mount_opts} - xfs /dev/v/csi-v {super_opts}\n"
            ))
            .unwrap()
        };
        assert!(problems(&table("rw,relatime", "rw"), &dev).is_empty());
        assert!(problems(&table("ro,relatime", "ro"), &dev).is_empty());
        let p = problems(&table("rw,relatime", "ro"), &dev);
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("read-only") && p[0].contains("/srv/s"),
            "{p:?}"
        );
    }
}
