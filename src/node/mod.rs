//! The node layer: everything that happens on the node once the gRPC layer
//! has validated a request and the LVM layer has the LV active. It probes
//! and formats devices, mounts and bind-mounts, creates and removes device
//! nodes, grows filesystems and reads usage and health.
//!
//! Ground rules:
//! - "Is this mounted, and by what?" is answered from /proc/self/mountinfo
//!   (`crate::mountinfo`), comparing device numbers, never from our own
//!   bookkeeping or `mount` output.
//! - Nothing is removed or unmounted unless it is proven to be ours: a
//!   mount of the volume's device, a device node of the LV or of one of our
//!   read-only overlays of it (or a node leading to no device at all).
//! - Privileged syscalls go through `crate::sys`, external programs
//!   (blkid, mkfs, resize2fs, dmsetup) through `crate::exec`.
//!
//! Modules: [`paths`] (which paths are accepted), [`blkid`] (what is on a
//! device and whether it may be formatted); for filesystem volumes
//! [`mount_options`], [`mkfs`], [`mounts`] (stage and publish), [`grow`],
//! [`freeze`] and [`usage`] (usage and health); [`block`] (raw block
//! volumes), [`dm`] (thin mapping counts and read-only overlays).

pub mod blkid;
pub mod block;
pub mod cgroup;
pub mod crypt;
pub mod dm;
pub mod durable;
pub mod freeze;
pub mod grow;
pub mod marker;
pub mod mkfs;
pub mod mount_options;
pub mod mounts;
pub mod paths;
pub mod reclaim;
pub mod record;
pub mod usage;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{self, Output};
use crate::mountinfo::MountInfo;
use crate::sys;

/// How the node layer runs external programs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub timeout: Duration,
    /// No udevd: device-mapper tools must create /dev nodes themselves and
    /// not wait for udev (same rule as the LVM layer's).
    pub no_udev: bool,
    /// `allowed_roots`: every staging and target path is opened beneath
    /// one of them before the driver acts on it (`sys::beneath`).
    pub roots: Vec<PathBuf>,
}

/// FAILED_PRECONDITION: `what` is at a staging or target path and is not
/// this driver's; the driver leaves it alone, and says what to do.
pub(crate) fn left_alone(what: String) -> Error {
    Error::FailedPrecondition(format!("{what}; it is left alone")).advise(
        "unmount or remove what is at that path (the driver touches only what it made there), or pass another path, then retry",
    )
}

impl Tools {
    pub fn new(cfg: &Config) -> Tools {
        Tools {
            timeout: cfg.command_timeout(),
            no_udev: cfg.no_udev(),
            roots: cfg.allowed_roots.clone(),
        }
    }

    pub async fn run(&self, program: &str, args: &[String]) -> Result<Output> {
        exec::run(program, args, &[], self.timeout).await
    }

    /// Runs a blocking step (syscall, sysfs or mountinfo read) off the
    /// runtime, bounded by the command timeout (`crate::blocking`).
    pub async fn blocking<T, F>(&self, what: &str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        crate::blocking::run(what, self.timeout, f).await
    }
}

/// An active volume on this node: its id, /dev path and device numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub volume_id: String,
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl Device {
    pub fn numbers(&self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

/// The mount table of this process.
pub fn mount_table() -> Result<MountInfo> {
    MountInfo::read().map_err(|e| Error::Internal(format!("mount table: {e}")))
}

/// Makes sure the LV's /dev node exists and is the device the kernel has
/// for it. LVM creates it (with udev, or itself when udev is off); where
/// neither happened, it is created here from the kernel numbers.
pub fn ensure_dev_node(volume_id: &str, dev_path: &Path, kernel: (u32, u32)) -> Result<Device> {
    let device = Device {
        volume_id: volume_id.to_string(),
        path: dev_path.to_path_buf(),
        major: kernel.0,
        minor: kernel.1,
    };
    match sys::device_numbers(dev_path) {
        Ok(Some(n)) if n == kernel => return Ok(device),
        Ok(other) => {
            return Err(Error::FailedPrecondition(format!(
                "{} is {} but the kernel has the LV as {}:{}",
                dev_path.display(),
                match other {
                    Some((ma, mi)) => format!("device {ma}:{mi}"),
                    None => "not a block device".into(),
                },
                kernel.0,
                kernel.1
            ))
            .advise("fix the node in /dev (vgmknodes re-creates LVM's device nodes), then retry"))
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    if let Some(dir) = dev_path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    }
    sys::make_block_node(dev_path, kernel.0, kernel.1, 0o660)?;
    tracing::info!(path = %dev_path.display(), major = kernel.0, minor = kernel.1, "created the LV's /dev node (no udev)");
    Ok(device)
}

/// NodeUnpublishVolume: undoes a publish at `target` of the volume whose LV
/// has the numbers `lv` (`None` when the LV is not active). A mount of the
/// volume is unmounted and the directory removed; a device node of ours is
/// removed (with its read-only overlay). A missing target is success.
/// Anything else at the target is refused and left as it is.
pub async fn unpublish(
    tools: &Tools,
    lv: Option<(u32, u32)>,
    volume_id: &str,
    target: &Path,
    recorded: bool,
) -> Result<()> {
    let (v, t, roots) = (
        volume_id.to_string(),
        target.to_path_buf(),
        tools.roots.clone(),
    );
    let left = tools
        .blocking("unpublish: unmount and remove", move || {
            unpublish_mounts(lv, &v, &t, &roots)
        })
        .await?;
    match left {
        Some(node) => block::unpublish_node(tools, lv, volume_id, target, node, recorded).await,
        None => Ok(()),
    }
}

/// The blocking part of [`unpublish`]: unmounts and removes a target
/// directory; returns the numbers of a block node left for the caller.
fn unpublish_mounts(
    lv: Option<(u32, u32)>,
    volume_id: &str,
    target: &Path,
    roots: &[PathBuf],
) -> Result<Option<(u32, u32)>> {
    let mut unmounted = false;
    // Stacked mounts of the volume (a publish repeated behind our back)
    // come off one by one; the bound keeps a kernel surprise from looping.
    for _ in 0..16 {
        let info = mount_table()?;
        let Some(m) = info.top_mount_at(target) else {
            break;
        };
        if Some(m.device()) != lv {
            return Err(Error::FailedPrecondition(format!(
                "target {} is a mount of another device ({}:{}, {}), not of volume {volume_id}; it is left mounted",
                target.display(),
                m.major,
                m.minor,
                m.fs_type
            )));
        }
        paths::beneath(target, roots, sys::unmount_beneath)?;
        tracing::info!(volume = volume_id, target = %target.display(), "NodeUnpublishVolume: unmounted");
        unmounted = true;
    }
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(volume = volume_id, target = %target.display(), "NodeUnpublishVolume: target already gone");
            return Ok(None);
        }
        Err(e) => return Err(Error::io(format!("stat {}", target.display()), e)),
    };
    use std::os::unix::fs::FileTypeExt;
    if meta.file_type().is_block_device() {
        return numbers_of_node(target).map(Some);
    }
    if meta.is_dir() {
        let not_empty =
            |e: &Error| matches!(e, Error::Sys(s) if s.errno() == nix::errno::Errno::ENOTEMPTY);
        return match paths::beneath(target, roots, |at| sys::remove_beneath(at, true)) {
            Ok(()) => {
                tracing::info!(volume = volume_id, target = %target.display(), "NodeUnpublishVolume: removed target directory");
                Ok(None)
            }
            Err(e) if not_empty(&e) && unmounted => {
                // Data written into the directory underneath the mount is
                // not the volume's and not ours to delete.
                tracing::warn!(target = %target.display(), "target directory is not empty after unmount; left in place");
                Ok(None)
            }
            Err(e) if not_empty(&e) => Err(left_alone(format!(
                "target {} is a non-empty directory that is not a mount of volume {volume_id}",
                target.display()
            ))),
            Err(e) => Err(e),
        };
    }
    Err(left_alone(format!(
        "target {} is neither a mount nor a device node of volume {volume_id}",
        target.display()
    )))
}

fn numbers_of_node(path: &Path) -> Result<(u32, u32)> {
    sys::device_numbers(path)?.ok_or_else(|| {
        Error::Aborted(format!(
            "{} changed while it was inspected; retry",
            path.display()
        ))
    })
}

/// NodeUnstageVolume: unmounts the staging mount of the volume, or removes
/// a block volume's read-only overlays. Refuses while the volume is still
/// published from it, and never unmounts another device. The staging
/// directory itself belongs to the CO and stays.
pub async fn unstage(
    tools: &Tools,
    dev: Option<&Device>,
    volume_id: &str,
    staging: &Path,
) -> Result<()> {
    let lv = dev.map(Device::numbers);
    let (v, st, roots) = (
        volume_id.to_string(),
        staging.to_path_buf(),
        tools.roots.clone(),
    );
    let was_mount = tools
        .blocking("unstage: unmount", move || {
            unmount_staging(lv, &v, &st, &roots)
        })
        .await?;
    if was_mount {
        return Ok(());
    }
    block::unstage(tools, dev).await
}

/// The blocking part of [`unstage`]: unmounts the staging mount of the
/// volume; `false` when the staging path is no mount at all.
fn unmount_staging(
    lv: Option<(u32, u32)>,
    volume_id: &str,
    staging: &Path,
    roots: &[PathBuf],
) -> Result<bool> {
    let info = mount_table()?;
    let Some(m) = info.top_mount_at(staging) else {
        return Ok(false);
    };
    if Some(m.device()) != lv {
        return Err(Error::FailedPrecondition(format!(
            "staging path {} is a mount of another device ({}:{}, {}), not of volume {volume_id}; it is left mounted",
            staging.display(),
            m.major,
            m.minor,
            m.fs_type
        )));
    }
    let staging_n = crate::mountinfo::normalize(staging);
    if let Some(other) = info
        .mounts_of_device(m.major, m.minor)
        .into_iter()
        .find(|o| crate::mountinfo::normalize(&o.mount_point) != staging_n)
    {
        return Err(Error::FailedPrecondition(format!(
            "volume {volume_id} is still mounted at {}",
            other.mount_point.display()
        ))
        .advise("call NodeUnpublishVolume for that target first, then retry"));
    }
    paths::beneath(staging, roots, sys::unmount_beneath)?;
    tracing::info!(volume = volume_id, staging = %staging.display(), "NodeUnstageVolume: unmounted");
    if mount_table()?.top_mount_at(staging).map(|m| m.device()) == lv {
        return Err(Error::FailedPrecondition(format!(
            "volume {volume_id} was mounted more than once at {}",
            staging.display()
        ))
        .advise("call NodeUnstageVolume again: each call removes one mount"));
    }
    Ok(true)
}

/// True when nothing on this node uses the volume any more: no mount of
/// it, and no exclusive holder (mount, device-mapper device stacked on it,
/// O_EXCL opener). The LV may then be deactivated; LVM itself still
/// refuses if a plain opener remains.
pub fn device_unused(dev: &Device) -> Result<bool> {
    if !mount_table()?
        .mounts_of_device(dev.major, dev.minor)
        .is_empty()
    {
        return Ok(false);
    }
    Ok(sys::is_block_device_unused(&dev.path)?)
}

/// What NodeGetVolumeStats found at a volume path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    Filesystem(usage::Usage),
    /// A raw block volume of this many bytes.
    Block(u64),
    /// Nothing measurable (see the problems).
    Unknown,
}

/// Usage and problems of the volume at `path` (a staging or publish path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub usage: Usage,
    pub problems: Vec<String>,
}

/// What is at `path` (a resolved staging, target or volume path), opened
/// once beneath its allowed root through no symlink: its stat, and an
/// `O_PATH` descriptor to measure it through. NOT_FOUND, naming
/// `volume_id`, when nothing is there or a symlink is.
fn open_volume_path(
    volume_id: &str,
    path: &Path,
    roots: &[PathBuf],
) -> Result<(std::os::fd::OwnedFd, nix::sys::stat::FileStat)> {
    let root = paths::root_of(path, roots)?;
    match sys::stat_beneath(sys::Under { root: &root, path }) {
        Ok(found) => Ok(found),
        Err(e) if e.is_not_found() => Err(not_at(volume_id, path, "the path does not exist")),
        Err(e) if e.errno() == nix::errno::Errno::ELOOP => {
            Err(not_at(volume_id, path, "it is a symbolic link"))
        }
        Err(e) => Err(e.into()),
    }
}

/// NOT_FOUND: the volume is not at `path`, and why.
fn not_at(volume_id: &str, path: &Path, what: &str) -> Error {
    Error::NotFound(format!(
        "volume {volume_id} is not at {}: {what}",
        path.display()
    ))
}

fn file_kind(st: &nix::sys::stat::FileStat) -> nix::sys::stat::SFlag {
    nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT
}

/// The usage of a block device node at `path` whose stat is `st`, if its
/// numbers are the active LV's or one of its read-only overlays'; else
/// NOT_FOUND.
fn device_node_stats(dev: &Device, path: &Path, st: &nix::sys::stat::FileStat) -> Result<Stats> {
    let node = sys::split_dev(st.st_rdev);
    match block::classify(node, Some(dev.numbers())) {
        block::NodeKind::Lv | block::NodeKind::Overlay(_) => Ok(Stats {
            usage: Usage::Block(sys::block_size_bytes(&dev.path)?),
            problems: Vec::new(),
        }),
        _ => Err(not_at(
            &dev.volume_id,
            path,
            &format!("it is a device node of {}:{}", node.0, node.1),
        )),
    }
}

/// NodeGetVolumeStats for an active volume at a path the node record names
/// (its staging path or a publish target). NOT_FOUND when `path` does not
/// exist or holds something that is not this volume. `block_staging` is
/// the staging directory the record names for a block volume.
pub fn stats(
    dev: &Device,
    path: &Path,
    block_staging: Option<&Path>,
    roots: &[PathBuf],
) -> Result<Stats> {
    let not_here = |what: String| not_at(&dev.volume_id, path, &what);
    // One open beneath the allowed root: what is there, and a descriptor
    // to measure it through, never a path looked up again.
    let (fd, st) = open_volume_path(&dev.volume_id, path, roots)?;
    let kind = file_kind(&st);
    // A device node is judged by its numbers, also when it is a bind
    // mount of a node (the mount then shows the device of the filesystem
    // holding the node, not the node's).
    if kind == nix::sys::stat::SFlag::S_IFBLK {
        return device_node_stats(dev, path, &st);
    }
    let info = mount_table()?;
    if let Some(m) = info.top_mount_at(path) {
        if m.device() != dev.numbers() {
            return Err(not_here(format!(
                "it is a mount of another device ({}:{})",
                m.major, m.minor
            )));
        }
        let mut problems = usage::problems(&info, dev);
        let usage = match usage::usage(&sys::fd_path(&fd)) {
            Ok(u) => Usage::Filesystem(u),
            Err(nix::errno::Errno::EIO) => {
                problems.push(format!(
                    "the {} filesystem of volume {} answers with I/O errors (xfs shuts down after \
                     corruption or a full thin pool): check dmesg and the thin pool, unstage it and repair it",
                    m.fs_type, dev.volume_id
                ));
                Usage::Unknown
            }
            Err(e) => return Err(Error::Internal(format!("statvfs {}: {e}", path.display()))),
        };
        return Ok(Stats { usage, problems });
    }
    if kind == nix::sys::stat::SFlag::S_IFDIR {
        if block_staging == Some(path) {
            return Ok(Stats {
                usage: Usage::Block(sys::block_size_bytes(&dev.path)?),
                problems: Vec::new(),
            });
        }
        return Ok(Stats {
            usage: Usage::Unknown,
            problems: vec![format!(
                "volume {} is not mounted at {}: the mount was removed outside the driver; \
                 restart the workload (or unstage and stage the volume) to mount it again",
                dev.volume_id,
                path.display()
            )],
        });
    }
    Err(not_here(
        "it is neither a mount, a device node nor a staging directory".into(),
    ))
}

/// NodeGetVolumeStats of a raw block volume at a path its node record does
/// not name. kubelet asks at
/// `<kubelet>/plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>`,
/// a bind mount it makes of the device node the driver published at the
/// NodePublishVolume target (`volumeDevices/publish/<pv>/<pod uid>`). The
/// volume is at such a path only if what is there (opened beneath its
/// allowed root, through no symlink) is a block device node that is, in
/// fact, the volume's:
/// - its numbers are the LV's, or one of its read-only overlays', while the
///   LV is active (`dev`); or
/// - the LV is not active, and the node is the very file published at one
///   of the recorded `targets` (the same inode on the same filesystem:
///   kubelet's bind mount of it). Its usage is unknown then (`Ok(None)`),
///   as at the target itself.
///
/// Anything else is NOT_FOUND.
pub fn block_node_stats(
    volume_id: &str,
    dev: Option<&Device>,
    path: &Path,
    targets: &[PathBuf],
    roots: &[PathBuf],
) -> Result<Option<Stats>> {
    let (_fd, st) = open_volume_path(volume_id, path, roots)?;
    if file_kind(&st) != nix::sys::stat::SFlag::S_IFBLK {
        return Err(not_at(
            volume_id,
            path,
            "the volume is neither staged nor published there on this node, and it is no device node",
        ));
    }
    if let Some(dev) = dev {
        return device_node_stats(dev, path, &st).map(Some);
    }
    let same_file = |target: &PathBuf| {
        open_volume_path(volume_id, target, roots)
            .is_ok_and(|(_, t)| (t.st_dev, t.st_ino) == (st.st_dev, st.st_ino))
    };
    if targets.iter().any(same_file) {
        return Ok(None);
    }
    let node = sys::split_dev(st.st_rdev);
    Err(not_at(
        volume_id,
        path,
        &format!(
            "it is a device node of {}:{}, and the volume's LV is not active",
            node.0, node.1
        ),
    ))
}

/// NodeExpandVolume for an active volume: grows the filesystem (mounted at
/// one of `paths`, or anywhere) online, or for a block volume resizes its
/// read-only overlays. Returns the device size in bytes.
pub async fn expand(
    tools: &Tools,
    dev: &Device,
    block_access: bool,
    paths: &[&Path],
) -> Result<u64> {
    let d = dev.clone();
    let paths: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
    let (size, overlays, mount) = tools
        .blocking("expand: read size and mounts", move || {
            let size = sys::block_size_bytes(&d.path)?;
            if block_access {
                return Ok((size, dm::overlays_of(d.numbers()), None));
            }
            let info = mount_table()?;
            // The request's paths first, then every mount of the device;
            // a writable one on top of its path where there is one (xfs
            // grows through it: a read-only bind refuses with EROFS).
            let ours: Vec<&crate::mountinfo::Mount> = paths
                .iter()
                .filter_map(|p| info.top_mount_at(p))
                .filter(|m| m.device() == d.numbers())
                .chain(info.mounts_of_device(d.major, d.minor))
                .collect();
            let usable = |m: &&&crate::mountinfo::Mount| {
                m.mount_option("ro").is_none()
                    && info
                        .top_mount_at(&m.mount_point)
                        .is_some_and(|top| top.device() == d.numbers())
            };
            let mount = ours
                .iter()
                .find(usable)
                .or(ours.first())
                .map(|m| (*m).clone());
            Ok((size, Vec::new(), mount))
        })
        .await?;
    if block_access {
        for (name, _) in overlays {
            dm::resize_overlay(tools, &name, dev.numbers(), size / 512).await?;
        }
        tracing::info!(
            volume = dev.volume_id,
            size,
            "NodeExpandVolume: block volume, nothing to grow"
        );
        return Ok(size);
    }
    let mount = mount.ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "volume {} is not mounted on this node",
            dev.volume_id
        ))
        .advise("call NodeStageVolume first, then NodeExpandVolume")
    })?;
    grow::grow(tools, &mount.fs_type, dev, &mount.mount_point).await?;
    tracing::info!(
        volume = dev.volume_id,
        size,
        fs_type = mount.fs_type,
        "NodeExpandVolume: filesystem grown"
    );
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubelet's `volumeDevices/<pv>/dev/<pod uid>`, a bind mount of the
    /// node published at `volumeDevices/publish/<pv>/<pod uid>`, is the
    /// volume by the node's numbers (or, with the LV inactive, by being the
    /// published file); anything else there is NOT_FOUND. Natively, with a
    /// loop device standing in for the LV (root).
    #[test]
    fn kubelets_bind_mount_of_a_published_node_is_the_volume() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root (loop, mknod, mount)"
        );
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let roots = vec![root.clone()];
        let img = root.join("img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let loopdev = crate::pool::loopdev::attach_loop(&img).unwrap();
        let (major, minor) = sys::device_numbers(&loopdev).unwrap().unwrap();
        let dev = Device {
            volume_id: "csi-x".into(),
            path: loopdev.clone(),
            major,
            minor,
        };
        let published = root.join("publish/pv/pod");
        std::fs::create_dir_all(published.parent().unwrap()).unwrap();
        sys::make_block_node(&published, major, minor, 0o600).unwrap();
        let at = root.join("pv/dev/pod");
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::File::create(&at).unwrap();
        nix::mount::mount(
            Some(&published),
            &at,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let not_found = |r: Result<Option<Stats>>| match r {
            Err(Error::NotFound(m)) => m,
            other => panic!("expected NOT_FOUND, got {other:?}"),
        };
        let block = Stats {
            usage: Usage::Block(4 << 20),
            problems: vec![],
        };

        // The mount at the path shows the filesystem holding the node, not
        // the node's device: judged by the node's numbers all the same.
        assert_eq!(stats(&dev, &at, None, &roots).unwrap(), block);
        assert_eq!(
            block_node_stats("csi-x", Some(&dev), &at, &[], &roots).unwrap(),
            Some(block)
        );
        // The LV inactive: the published file itself, or nothing.
        assert_eq!(
            block_node_stats("csi-x", None, &at, std::slice::from_ref(&published), &roots).unwrap(),
            None
        );
        let m = not_found(block_node_stats("csi-x", None, &at, &[], &roots));
        assert!(m.contains("not active"), "{m}");
        // Another device's node.
        let other = Device {
            minor: minor + 4096,
            ..dev.clone()
        };
        let m = not_found(block_node_stats("csi-x", Some(&other), &at, &[], &roots));
        assert!(
            m.contains(&format!("device node of {major}:{minor}")),
            "{m}"
        );
        // A file, a directory, nothing, a symlink to the node.
        let file = root.join("pv/dev/file");
        std::fs::File::create(&file).unwrap();
        let link = root.join("pv/dev/link");
        std::os::unix::fs::symlink(&published, &link).unwrap();
        for p in [file, root.join("pv/dev"), root.join("pv/dev/gone"), link] {
            not_found(block_node_stats("csi-x", Some(&dev), &p, &[], &roots));
        }

        nix::mount::umount2(&at, nix::mount::MntFlags::empty()).unwrap();
        crate::pool::loopdev::detach_loop(&loopdev).unwrap();
    }
}
