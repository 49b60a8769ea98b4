//! Filesystem volumes: mount options, mkfs, the staging mount, the publish
//! bind mount, online growth, usage and health.

use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::error::{Error, Result};
use crate::mountinfo::{self, MountInfo};
use crate::node::{blkid, dm, left_alone, marker, mount_table, paths, Device, Tools};
use crate::sys::{self, MsFlags};

/// Mount flags as the kernel takes them: `MS_*` bits plus the
/// filesystem's own option words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlags,
    pub data: Vec<String>,
}

/// Words of mount(8) that only steer mount(8) or fstab; they mean nothing
/// to the kernel and are dropped.
const IGNORED: &[&str] = &["defaults", "auto", "noauto", "nofail", "_netdev"];

/// Words that would change *how* the mount is made (bind, move,
/// propagation) rather than set an option; refused.
const OPERATIONS: &[&str] = &[
    "bind",
    "rbind",
    "move",
    "remount",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "private",
    "rprivate",
    "unbindable",
    "runbindable",
];

/// Generic option words and the `MS_*` bit each sets (`true`) or clears.
const GENERIC: &[(&str, MsFlags, bool)] = &[
    ("ro", MsFlags::MS_RDONLY, true),
    ("rw", MsFlags::MS_RDONLY, false),
    ("nosuid", MsFlags::MS_NOSUID, true),
    ("suid", MsFlags::MS_NOSUID, false),
    ("nodev", MsFlags::MS_NODEV, true),
    ("dev", MsFlags::MS_NODEV, false),
    ("noexec", MsFlags::MS_NOEXEC, true),
    ("exec", MsFlags::MS_NOEXEC, false),
    ("sync", MsFlags::MS_SYNCHRONOUS, true),
    ("async", MsFlags::MS_SYNCHRONOUS, false),
    ("dirsync", MsFlags::MS_DIRSYNC, true),
    ("noatime", MsFlags::MS_NOATIME, true),
    ("atime", MsFlags::MS_NOATIME, false),
    ("nodiratime", MsFlags::MS_NODIRATIME, true),
    ("diratime", MsFlags::MS_NODIRATIME, false),
    ("relatime", MsFlags::MS_RELATIME, true),
    ("norelatime", MsFlags::MS_RELATIME, false),
    ("strictatime", MsFlags::MS_STRICTATIME, true),
    ("nostrictatime", MsFlags::MS_STRICTATIME, false),
    ("lazytime", MsFlags::MS_LAZYTIME, true),
    ("nolazytime", MsFlags::MS_LAZYTIME, false),
    ("silent", MsFlags::MS_SILENT, true),
    ("loud", MsFlags::MS_SILENT, false),
];

impl MountOptions {
    /// Turns the capability's mount flags (single words, already checked by
    /// `validate::mount_flag`) into kernel flags and data. xfs always gets
    /// `nouuid`: snapshots and clones of a volume share its UUID, and xfs
    /// refuses to mount a second filesystem with a UUID it already has.
    pub fn parse(fs_type: &str, words: &[String]) -> Result<MountOptions> {
        let mut flags = MsFlags::empty();
        let mut data: Vec<String> = Vec::new();
        for w in words {
            let w = w.as_str();
            if IGNORED.contains(&w) {
                continue;
            }
            if OPERATIONS.contains(&w) {
                return Err(Error::InvalidArgument(format!(
                    "mount flag {w:?} changes how a mount is made, it is not a mount option"
                )));
            }
            if let Some((_, bit, set)) = GENERIC.iter().find(|(name, _, _)| *name == w) {
                flags.set(*bit, *set);
            } else if !data.iter().any(|d| d == w) {
                data.push(w.to_string());
            }
        }
        if fs_type == "xfs" && !data.iter().any(|d| d == "nouuid") {
            data.push("nouuid".into());
        }
        Ok(MountOptions { flags, data })
    }

    /// The data argument of mount(2).
    pub fn data(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }
}

/// The mkfs command line. No discard pass (a fresh thin volume has nothing
/// to discard, and discarding 100 GiB takes long), and no inode table or
/// journal zeroing: on ext4 `lazy_*_init`, and `assume_storage_prezeroed`
/// when the pool zeroes newly provisioned chunks, which marks the tables
/// as zeroed so the kernel's lazy-init thread does not write them either
/// (thin volumes read zeros where never written).
pub fn mkfs_command(fs_type: &str, dev: &Path, prezeroed: bool) -> Result<(String, Vec<String>)> {
    let dev = dev.to_string_lossy().into_owned();
    match fs_type {
        "ext4" => {
            let mut ext = String::from("nodiscard,lazy_itable_init=1,lazy_journal_init=1");
            if prezeroed {
                ext.push_str(",assume_storage_prezeroed=1");
            }
            Ok(("mkfs.ext4".into(), crate::argv!["-q", "-E", ext, dev]))
        }
        "xfs" => Ok(("mkfs.xfs".into(), crate::argv!["-q", "-K", dev])),
        other => Err(Error::InvalidArgument(format!(
            "fs_type {other:?} is not supported"
        ))),
    }
}

/// Makes a filesystem on `dev`. Never forced: mkfs.ext4 and mkfs.xfs
/// themselves refuse a device that is mounted or holds a filesystem, a
/// second guard behind blkid.
async fn mkfs(tools: &Tools, fs_type: &str, dev: &Path, prezeroed: bool) -> Result<()> {
    let started = std::time::Instant::now();
    // e2fsprogs before 1.47 does not know assume_storage_prezeroed (and
    // rejects the whole command line): asked of its version, not guessed
    // from a failure.
    let prezeroed = prezeroed && (fs_type != "ext4" || ext4_knows_prezeroed(tools).await?);
    let (program, args) = mkfs_command(fs_type, dev, prezeroed)?;
    tools.run(&program, &args).await?;
    tracing::info!(device = %dev.display(), fs_type, prezeroed, elapsed = ?started.elapsed(), "made filesystem");
    Ok(())
}

/// Whether this node's mkfs.ext4 knows `-E assume_storage_prezeroed`
/// (e2fsprogs 1.47.0 and later), from `mkfs.ext4 -V`.
async fn ext4_knows_prezeroed(tools: &Tools) -> Result<bool> {
    let out = tools.run("mkfs.ext4", &["-V".to_string()]).await?;
    let version = e2fsprogs_version(&out.stderr).or_else(|| e2fsprogs_version(&out.stdout));
    if version.is_none() {
        tracing::warn!(
            stderr = out.stderr,
            "cannot read mkfs.ext4's version; not using assume_storage_prezeroed"
        );
    }
    Ok(version.is_some_and(|v| v >= (1, 47)))
}

/// The (major, minor) of `mke2fs 1.47.0 (5-Feb-2023)`, the first line
/// `mkfs.ext4 -V` prints.
fn e2fsprogs_version(text: &str) -> Option<(u32, u32)> {
    let version = text.lines().next()?.strip_prefix("mke2fs ")?;
    let mut parts = version.split(|c: char| c == '.' || c.is_whitespace());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// What staging needs to know that LVM knows: of the thin pool, and of the
/// volume's origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageFacts {
    /// The pool zeroes newly provisioned chunks, so a never-written volume
    /// reads zeros everywhere and mkfs may skip zeroing its tables.
    pub zeroes_new_chunks: bool,
    /// Why the pool cannot take writes now (full, failed, read-only
    /// metadata); formatting is then refused, mounting still allowed.
    pub problem: Option<crate::lvm::report::Problem>,
    /// The volume was made from a snapshot or another volume and may be
    /// larger than the filesystem it holds: that filesystem is grown to
    /// the device once mounted (the spec's rule for larger restores).
    pub made_from_source: bool,
}

/// NodeStageVolume for mount access: format only a never-written device
/// without signature (see [`blkid`]), then mount it at `staging`.
/// Idempotent: a staging path that already is a mount of this device is
/// left as it is.
///
/// `marker` is the volume's formatting marker: written (and synced) before
/// mkfs runs and removed once mkfs exited 0.
/// A marker still present means a format this driver began on a blank
/// device did not finish (the driver was killed, or mkfs timed out): the
/// device then holds only what that mkfs wrote, and it is formatted again
/// instead of being refused for good. Without a marker, the format guard
/// stands: data the driver did not write is never formatted.
pub async fn stage(
    tools: &Tools,
    dev: &Device,
    staging: &Path,
    fs_type: &str,
    opts: &MountOptions,
    pool: &StageFacts,
    marker: &Path,
) -> Result<()> {
    let (d, st, fs) = (dev.clone(), staging.to_path_buf(), fs_type.to_string());
    let roots = tools.roots.clone();
    let already = tools
        .blocking("stage: inspect the staging path", move || {
            staging_in_place(&d, &st, &fs, &roots)
        })
        .await?;
    // A copy larger than its source grows once mounted; a retry after a
    // grow that did not finish grows it then (a no-op at full size).
    let grow_it = pool.made_from_source && !opts.flags.contains(MsFlags::MS_RDONLY);
    if already {
        if grow_it {
            grow(tools, fs_type, dev, staging).await?;
        }
        return Ok(());
    }
    let m = marker.to_path_buf();
    let unfinished = tools
        .blocking("read the formatting marker", move || marker::exists(&m))
        .await?;

    // A thin volume that maps no sector of its pool was never written
    // and reads zeros everywhere: it holds no signature, and blkid need
    // not read it to say so.
    let mapped = dm::thin_mapped_sectors(tools, dev.major, dev.minor).await?;
    let found = match mapped {
        0 => blkid::Signature::None,
        _ => blkid::probe(tools, &dev.path).await?,
    };
    let plan = match blkid::plan(&found, fs_type, mapped) {
        _ if unfinished => {
            tracing::warn!(volume = dev.volume_id, ?found, marker = %marker.display(),
                "a format this driver began did not finish; formatting again");
            blkid::Plan::Format
        }
        plan => plan,
    };
    let existing_fs = matches!(plan, blkid::Plan::Mount);
    match plan {
        blkid::Plan::Refuse(why) => {
            return Err(Error::FailedPrecondition(format!(
                "cannot stage volume {} as {fs_type}: {why}",
                dev.volume_id
            ))
            .advise(format!(
                "stage it with the fs_type its data holds, or, if that data is not wanted (an interrupted format), wipe the LV by hand (wipefs, blkdiscard) and stage it again as {fs_type}"
            )))
        }
        blkid::Plan::Format => {
            if let Some(problem) = &pool.problem {
                // mkfs writes; into a pool that cannot take writes it would
                // hang or fail half-way, leaving a device we then refuse.
                return Err(Error::ResourceExhausted(format!(
                    "cannot format volume {}: {}",
                    dev.volume_id, problem.what
                ))
                .advise(format!("{}, then stage the volume again", problem.remedy)));
            }
            let (m, v) = (marker.to_path_buf(), dev.volume_id.clone());
            tools
                .blocking("write the formatting marker", move || marker::write(&m, &v))
                .await?;
            // mkfs syncs the device before it exits 0: the format is
            // finished, and its marker can go.
            mkfs(tools, fs_type, &dev.path, pool.zeroes_new_chunks).await?;
            let m = marker.to_path_buf();
            tools
                .blocking("remove the formatting marker", move || marker::remove(&m))
                .await?;
        }
        blkid::Plan::Mount => {}
    }
    let (src, st, fs, flags, data) = (
        dev.path.clone(),
        staging.to_path_buf(),
        fs_type.to_string(),
        opts.flags,
        opts.data(),
    );
    let roots = tools.roots.clone();
    tools
        .blocking("mount the staging filesystem", move || {
            paths::beneath(&st, &roots, |at| {
                sys::mount_fs_beneath(&src, at, &fs, flags, data.as_deref())
            })
        })
        .await?;
    if grow_it && existing_fs {
        grow(tools, fs_type, dev, staging).await?;
    }
    tracing::info!(volume = dev.volume_id, staging = %staging.display(), fs_type, "NodeStageVolume: mounted");
    Ok(())
}

/// The blocking first step of [`stage`]: `true` when the staging path is
/// already a mount of this device with this fs; refuses another device, or
/// the volume mounted elsewhere; otherwise makes sure the directory exists.
fn staging_in_place(
    dev: &Device,
    staging: &Path,
    fs_type: &str,
    roots: &[PathBuf],
) -> Result<bool> {
    let info = mount_table()?;
    if let Some(m) = info.top_mount_at(staging) {
        if m.device() != dev.numbers() {
            return Err(left_alone(format!(
                "staging path {} already is a mount of another device ({}:{}, {})",
                staging.display(),
                m.major,
                m.minor,
                m.fs_type
            )));
        }
        if m.fs_type != fs_type {
            return Err(Error::AlreadyExists(format!(
                "volume {} is already staged at {} as {}, not {fs_type}",
                dev.volume_id,
                staging.display(),
                m.fs_type
            )));
        }
        tracing::info!(volume = dev.volume_id, staging = %staging.display(), "NodeStageVolume: already staged");
        return Ok(true);
    }
    if let Some(m) = info.mounts_of_device(dev.major, dev.minor).first() {
        return Err(Error::FailedPrecondition(format!(
            "volume {} is already mounted at {}; one volume has one staging path",
            dev.volume_id,
            m.mount_point.display()
        ))
        .advise("stage it at the path where it is mounted, or unmount it there first"));
    }
    ensure_dir(staging, roots)?;

    Ok(false)
}

/// Creates the staging directory if the CO has not (its parent exists:
/// the path was resolved), beneath its allowed root.
pub(crate) fn ensure_dir(path: &Path, roots: &[PathBuf]) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::FailedPrecondition(format!(
            "{} exists and is not a directory",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            paths::beneath(path, roots, |at| sys::mkdir_beneath(at, 0o750))?;
            Ok(())
        }
        Err(e) => Err(Error::io(format!("stat {}", path.display()), e)),
    }
}

/// NodePublishVolume for mount access: bind-mounts the staging mount at
/// `target` (created when missing), read-only when asked.
/// `single_writer` refuses a second target (SINGLE_NODE_SINGLE_WRITER).
/// `recorded`: the node record already names this publish, so a writable
/// bind of ours found where read-only was asked is one a killed driver
/// did not finish, and it is made read-only.
pub fn publish(
    dev: &Device,
    staging: &Path,
    target: &Path,
    readonly: bool,
    single_writer: bool,
    recorded: bool,
    roots: &[PathBuf],
) -> Result<()> {
    let info = mount_table()?;
    match info.top_mount_at(staging) {
        Some(m) if m.device() == dev.numbers() => {}
        _ => {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is not staged at {}",
                dev.volume_id,
                staging.display()
            ))
            .advise("call NodeStageVolume with this staging_target_path first, then retry"))
        }
    }
    if let Some(m) = info.top_mount_at(target) {
        if m.device() != dev.numbers() {
            return Err(left_alone(format!(
                "target {} is a mount of another device ({}:{}, {})",
                target.display(),
                m.major,
                m.minor,
                m.fs_type
            )));
        }
        let is_ro = m.mount_option("ro").is_some();
        if recorded && readonly && !is_ro {
            // Our own read-only publish, cut off between its bind and its
            // read-only remount (the driver was killed): finish it.
            let want = per_mount_of(m) | MsFlags::MS_RDONLY;
            paths::beneath(target, roots, |at| sys::remount_flags_beneath(at, want))?;
            tracing::warn!(volume = dev.volume_id, target = %target.display(),
                "NodePublishVolume: finished a read-only publish left writable");
            return Ok(());
        }
        if is_ro != readonly {
            return Err(Error::AlreadyExists(format!(
                "volume {} is already published at {} with readonly={}",
                dev.volume_id,
                target.display(),
                !readonly
            ))
            .advise("publish it there with the first call's readonly, use another target_path, or NodeUnpublishVolume it first"));
        }
        tracing::info!(volume = dev.volume_id, target = %target.display(), "NodePublishVolume: already published");
        return Ok(());
    }
    if single_writer {
        let staging_n = mountinfo::normalize(staging);
        let target_n = mountinfo::normalize(target);
        if let Some(other) = info
            .mounts_of_device(dev.major, dev.minor)
            .into_iter()
            .map(|m| mountinfo::normalize(&m.mount_point))
            .find(|p| *p != staging_n && *p != target_n)
        {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is SINGLE_NODE_SINGLE_WRITER and already published at {}",
                dev.volume_id,
                other.display()
            ))
            .advise(
                "NodeUnpublishVolume it there first, or publish it with SINGLE_NODE_MULTI_WRITER",
            ));
        }
    }
    let created = match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => false,
        Ok(_) => {
            return Err(left_alone(format!(
                "target {} exists and is not a directory (published as raw block?)",
                target.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            paths::beneath(target, roots, |at| sys::mkdir_beneath(at, 0o750))?
        }
        Err(e) => return Err(Error::io(format!("stat {}", target.display()), e)),
    };
    let (staging_root, target_root) = (
        paths::root_of(staging, roots)?,
        paths::root_of(target, roots)?,
    );
    let (source, at) = (
        sys::Under {
            root: &staging_root,
            path: staging,
        },
        sys::Under {
            root: &target_root,
            path: target,
        },
    );
    if let Err(e) = sys::bind_mount_beneath(source, at, readonly) {
        if created {
            let _ = sys::remove_beneath(at, true);
        }
        return Err(e.into());
    }
    tracing::info!(volume = dev.volume_id, target = %target.display(), readonly, "NodePublishVolume: bind-mounted");
    Ok(())
}

/// The per-mount flags, as mountinfo spells them: the part of a mount's
/// options that a bind mount carries on its own.
const PER_MOUNT: &[(MsFlags, &str)] = &[
    (MsFlags::MS_RDONLY, "ro"),
    (MsFlags::MS_NOSUID, "nosuid"),
    (MsFlags::MS_NODEV, "nodev"),
    (MsFlags::MS_NOEXEC, "noexec"),
];

/// The per-mount flags among `flags`.
pub fn per_mount(flags: MsFlags) -> MsFlags {
    PER_MOUNT
        .iter()
        .filter(|(bit, _)| flags.contains(*bit))
        .fold(MsFlags::empty(), |acc, (bit, _)| acc | *bit)
}

/// The per-mount flags a mount carries.
pub fn per_mount_of(m: &mountinfo::Mount) -> MsFlags {
    PER_MOUNT
        .iter()
        .filter(|(_, word)| m.mount_option(word).is_some())
        .fold(MsFlags::empty(), |acc, (bit, _)| acc | *bit)
}

/// Makes the mount on top of `path` carry exactly the per-mount flags of
/// `want`; returns what it changed, `None` when they were right already.
pub fn ensure_per_mount_flags(
    path: &Path,
    want: MsFlags,
    roots: &[PathBuf],
) -> Result<Option<String>> {
    let want = per_mount(want);
    let info = mount_table()?;
    let have = match info.top_mount_at(path) {
        Some(m) => per_mount_of(m),
        None => {
            return Err(Error::FailedPrecondition(format!(
                "{} is not a mount point",
                path.display()
            )))
        }
    };
    if have == want {
        return Ok(None);
    }
    paths::beneath(path, roots, |at| sys::remount_flags_beneath(at, want))?;
    Ok(Some(format!(
        "mount at {} had flags {have:?}, not the recorded {want:?}: remounted it with them",
        path.display()
    )))
}

/// A mount point and the block device whose filesystem must be the one
/// mounted there: what is done through the path (freeze, thaw, grow) is
/// done only if, once opened, it is the root of a mount of that device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountOf {
    pub path: PathBuf,
    /// (major, minor).
    pub device: (u32, u32),
}

/// Where the filesystem of device `dev` is mounted on this node (its
/// staging mount), if anywhere.
pub fn mounted_at(dev: (u32, u32)) -> Result<Option<MountOf>> {
    Ok(mount_table()?
        .mounts_of_device(dev.0, dev.1)
        .first()
        .map(|m| MountOf {
            path: m.mount_point.clone(),
            device: dev,
        }))
}

/// Freezes the filesystem of `at.device` at `at.path` (FIFREEZE).
pub fn freeze(at: &MountOf) -> Result<()> {
    Ok(sys::freeze::freeze(&at.path, at.device)?)
}

/// Freezes every mount point, after writing them (with their devices)
/// durably to `record`, so a driver killed while they are frozen thaws
/// them when it starts again ([`thaw_left_frozen`]). On failure, thaws
/// what it froze.
pub fn freeze_recorded(record: &Path, points: &[MountOf]) -> Result<()> {
    let json = serde_json::to_vec(points)
        .map_err(|e| Error::Internal(format!("encode the frozen mount points: {e}")))?;
    crate::node::durable::write_atomic(record, &json)?;
    for (i, p) in points.iter().enumerate() {
        if let Err(e) = freeze(p) {
            thaw_recorded(record, &points[..i]);
            return Err(e);
        }
    }
    Ok(())
}

/// Thaws every mount point (one not frozen is fine), then drops `record`
/// if every thaw worked; a record left behind is tried again at start-up.
pub fn thaw_recorded(record: &Path, points: &[MountOf]) {
    let mut all = true;
    for p in points {
        if let Err(e) = thaw(p) {
            all = false;
            tracing::error!(mountpoint = %p.path.display(), error = %e, "could not thaw a filesystem");
        }
    }
    if !all {
        return;
    }
    if let Err(e) = crate::node::durable::remove(record) {
        tracing::error!(record = %record.display(), error = %e, "could not remove a freeze record");
    }
}

/// One entry of a freeze record: a mount point with its device, or (as
/// versions before the device was recorded wrote them) a bare path.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Recorded {
    At(MountOf),
    Path(PathBuf),
}

impl Recorded {
    /// Where to thaw: the recorded path if it is still a mount of the
    /// recorded device (a bare path: of the device mounted there now).
    /// After a reboot a recorded path is a plain directory again, or
    /// another filesystem's: a thaw there would reach the wrong one.
    fn still_mounted(self, table: &MountInfo) -> Result<MountOf, PathBuf> {
        let (path, want) = match self {
            Recorded::At(m) => (m.path, Some(m.device)),
            Recorded::Path(p) => (p, None),
        };
        match table.top_mount_at(&path).map(|m| m.device()) {
            Some(device) if want.is_none_or(|w| w == device) => Ok(MountOf { path, device }),
            _ => Err(path),
        }
    }
}

/// Start-up: thaws what the freeze records in `dir` name (a driver killed
/// while filesystems were frozen for it) and removes the records. Returns
/// the mount points it went through.
pub fn thaw_left_frozen(dir: &Path) -> Result<Vec<MountOf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("read {}", dir.display()), e)),
    };
    let mut all = Vec::new();
    for record in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let points: Vec<Recorded> = match std::fs::read(&record)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(record = %record.display(), error = %e, "unreadable freeze record; left for an admin");
                continue;
            }
        };
        let table = mount_table()?;
        let (mounted, gone): (Vec<_>, Vec<_>) = points
            .into_iter()
            .map(|p| p.still_mounted(&table))
            .partition(|r| r.is_ok());
        let mounted: Vec<MountOf> = mounted.into_iter().filter_map(|r| r.ok()).collect();
        let gone: Vec<PathBuf> = gone.into_iter().filter_map(|r| r.err()).collect();
        tracing::warn!(record = %record.display(), ?mounted, not_mounted = ?gone,
            "start-up: thawing filesystems a killed driver froze");
        thaw_recorded(&record, &mounted);
        all.extend(mounted);
    }
    Ok(all)
}

/// Whether LVM's own freeze of a snapshot origin nests inside a FIFREEZE
/// we hold (Linux 6.8 and later).
pub fn freezes_nest() -> bool {
    sys::freeze::kernel_freeze_nests()
}

/// Thaws the filesystem of `at.device` at `at.path` (FITHAW); whether it
/// was frozen.
pub fn thaw(at: &MountOf) -> Result<bool> {
    Ok(sys::freeze::thaw(&at.path, at.device)?)
}

/// Grows the filesystem of `dev` mounted at `mountpoint` to the size of
/// the device, online. Already full size is a no-op.
///
/// ext4: `resize2fs <device>`. xfs: the grow ioctls on a descriptor of
/// `mountpoint` checked to be the root of a mount of `dev`
/// ([`sys::open_mount_root`]), not `xfs_growfs <mountpoint>`, which would
/// look the path up again and grow whatever filesystem is there by then.
pub async fn grow(tools: &Tools, fs_type: &str, dev: &Device, mountpoint: &Path) -> Result<()> {
    match fs_type {
        "ext4" => {
            tools
                .run("resize2fs", &[dev.path.to_string_lossy().into_owned()])
                .await?;
            tracing::info!(device = %dev.path.display(), mountpoint = %mountpoint.display(), fs_type, "grew filesystem");
            Ok(())
        }
        "xfs" => {
            let (d, at) = (dev.clone(), mountpoint.to_path_buf());
            tools
                .blocking("grow the xfs filesystem", move || grow_xfs(&d, &at))
                .await
        }
        other => Err(Error::InvalidArgument(format!(
            "cannot grow a {other} filesystem"
        ))),
    }
}

/// The xfs half of [`grow`], blocking.
pub fn grow_xfs(dev: &Device, mountpoint: &Path) -> Result<()> {
    let root = sys::open_mount_root(mountpoint, dev.numbers())?;
    let bytes = sys::block_size_bytes(&dev.path)?;
    let before = sys::xfs::geometry(&root, mountpoint)?;
    let Some(newblocks) = xfs_grow_to(&before, bytes).map_err(|why| {
        Error::FailedPrecondition(format!(
            "cannot grow the xfs filesystem of volume {} at {}: {why}",
            dev.volume_id,
            mountpoint.display()
        ))
    })?
    else {
        tracing::info!(volume = dev.volume_id, mountpoint = %mountpoint.display(),
            blocks = before.datablocks, "xfs filesystem already spans its device");
        return Ok(());
    };
    sys::xfs::grow_data(&root, mountpoint, newblocks, before.imaxpct)?;
    let after = sys::xfs::geometry(&root, mountpoint)?;
    tracing::info!(volume = dev.volume_id, device = %dev.path.display(), mountpoint = %mountpoint.display(),
        blocksize = before.blocksize, old_blocks = before.datablocks, new_blocks = after.datablocks,
        "grew xfs filesystem");
    Ok(())
}

/// The block count to grow an xfs filesystem of geometry `geo` to on a
/// device of `device_bytes`: `None` when it spans the device already
/// (whole blocks), an error when the device is smaller than the
/// filesystem (growing to that would ask the kernel to shrink it).
pub fn xfs_grow_to(geo: &sys::xfs::Geometry, device_bytes: u64) -> Result<Option<u64>, String> {
    if geo.blocksize == 0 {
        return Err("the kernel reported a block size of 0".into());
    }
    let fits = device_bytes / u64::from(geo.blocksize);
    match fits.cmp(&geo.datablocks) {
        std::cmp::Ordering::Equal => Ok(None),
        std::cmp::Ordering::Greater => Ok(Some(fits)),
        std::cmp::Ordering::Less => Err(format!(
            "the device holds {fits} blocks of {} bytes, fewer than the filesystem's {}",
            geo.blocksize, geo.datablocks
        )),
    }
}

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

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn mount_flags_become_kernel_flags_and_data() {
        let o =
            MountOptions::parse("ext4", &words(&["noatime", "ro", "discard", "defaults"])).unwrap();
        assert_eq!(o.flags, MsFlags::MS_NOATIME | MsFlags::MS_RDONLY);
        assert_eq!(o.data(), Some("discard".into()));
        let o = MountOptions::parse("ext4", &words(&["ro", "rw", "nosuid"])).unwrap();
        assert_eq!(o.flags, MsFlags::MS_NOSUID);
        assert_eq!(o.data(), None);
        let o = MountOptions::parse("xfs", &[]).unwrap();
        assert_eq!(o.data(), Some("nouuid".into()));
        let o = MountOptions::parse("xfs", &words(&["nouuid", "noquota"])).unwrap();
        assert_eq!(o.data(), Some("nouuid,noquota".into()));
        for op in ["bind", "remount", "rshared", "move"] {
            assert!(matches!(
                MountOptions::parse("ext4", &words(&[op])),
                Err(Error::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn mkfs_never_discards_nor_forces() {
        let (p, a) = mkfs_command("ext4", Path::new("/dev/v/l"), true).unwrap();
        assert_eq!(p, "mkfs.ext4");
        assert_eq!(
            a,
            vec![
                "-q",
                "-E",
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1,assume_storage_prezeroed=1",
                "/dev/v/l"
            ]
        );
        let (_, a) = mkfs_command("ext4", Path::new("/dev/v/l"), false).unwrap();
        assert!(!a[2].contains("prezeroed"));
        let (p, a) = mkfs_command("xfs", Path::new("/dev/v/l"), true).unwrap();
        assert_eq!(
            (p.as_str(), a),
            (
                "mkfs.xfs",
                vec!["-q".to_string(), "-K".into(), "/dev/v/l".into()]
            )
        );
        for (_, args) in [
            mkfs_command("ext4", Path::new("/d"), true).unwrap(),
            mkfs_command("xfs", Path::new("/d"), true).unwrap(),
        ] {
            assert!(!args.iter().any(|a| a == "-F" || a == "-f"));
        }
        assert!(mkfs_command("btrfs", Path::new("/d"), false).is_err());
    }

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

    #[test]
    fn e2fsprogs_versions_are_read_from_the_first_line() {
        let v147 = "mke2fs 1.47.0 (5-Feb-2023)\n\tUsing EXT2FS Library version 1.47.0\n";
        assert_eq!(e2fsprogs_version(v147), Some((1, 47)));
        assert_eq!(
            e2fsprogs_version("mke2fs 1.46.5 (30-Dec-2021)\n"),
            Some((1, 46))
        );
        assert_eq!(e2fsprogs_version("mkfs.xfs version 6.1.0"), None);
        assert_eq!(e2fsprogs_version(""), None);
    }

    #[test]
    fn xfs_grows_to_whole_blocks_of_the_device_and_never_shrinks() {
        let geo = sys::xfs::Geometry {
            blocksize: 4096,
            datablocks: 1000,
            imaxpct: 25,
        };
        assert_eq!(xfs_grow_to(&geo, 1000 * 4096), Ok(None));
        // A tail shorter than a block is not a block.
        assert_eq!(xfs_grow_to(&geo, 1000 * 4096 + 4095), Ok(None));
        assert_eq!(xfs_grow_to(&geo, 2000 * 4096 + 512), Ok(Some(2000)));
        let e = xfs_grow_to(&geo, 999 * 4096).unwrap_err();
        assert!(e.contains("999") && e.contains("1000"), "{e}");
        let zero = sys::xfs::Geometry {
            blocksize: 0,
            ..geo
        };
        assert!(xfs_grow_to(&zero, 1 << 30).is_err());
    }

    /// Freeze records name each mount point with its device; records of
    /// versions that wrote bare paths are still read.
    #[test]
    fn freeze_records_keep_the_device_and_read_bare_paths() {
        let at = MountOf {
            path: "/k/a".into(),
            device: (253, 4),
        };
        let json = serde_json::to_string(&[&at]).unwrap();
        assert_eq!(json, r#"[{"path":"/k/a","device":[253,4]}]"#);
        let read: Vec<Recorded> = serde_json::from_str(&json).unwrap();
        assert!(matches!(&read[..], [Recorded::At(m)] if *m == at));
        let old: Vec<Recorded> = serde_json::from_str(r#"["/k/b"]"#).unwrap();
        assert!(matches!(&old[..], [Recorded::Path(p)] if p == Path::new("/k/b")));

        // Thawed only where the recorded device is still mounted; a bare
        // path takes the device mounted there now.
        let table = MountInfo::parse(
            "30 1 253:4 / /k/a rw - xfs /dev/dm-4 rw\n\
             31 1 7:3 / /k/b rw - ext4 /dev/loop3 rw\n",
        )
        .unwrap();
        let at_a = |device| {
            Recorded::At(MountOf {
                path: "/k/a".into(),
                device,
            })
        };
        assert_eq!(at_a((253, 4)).still_mounted(&table), Ok(at.clone()));
        assert_eq!(
            at_a((253, 5)).still_mounted(&table),
            Err(PathBuf::from("/k/a"))
        );
        assert_eq!(
            Recorded::Path("/k/b".into()).still_mounted(&table),
            Ok(MountOf {
                path: "/k/b".into(),
                device: (7, 3)
            })
        );
        assert_eq!(
            Recorded::Path("/k/c".into()).still_mounted(&table),
            Err(PathBuf::from("/k/c"))
        );
    }
}
