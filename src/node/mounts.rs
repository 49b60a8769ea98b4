//! The mounts of filesystem volumes: the staging mount (formatting a
//! blank device first), the publish bind mount, and the per-mount flags of
//! either put right.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fs_options::MkfsOptions;
use crate::mountinfo;
use crate::node::grow::grow;
use crate::node::mkfs::mkfs;
use crate::node::mount_options::{per_mount, per_mount_of, MountOptions};
use crate::node::{blkid, dm, left_alone, marker, mount_table, paths, Device, Tools};
use crate::sys::{self, MsFlags};

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
    /// The options the volume is formatted with, should it be blank: the
    /// ones recorded with it at creation (`fs_options`, checked again).
    pub mkfs: MkfsOptions,
    /// The device staged is a crypt mapping over the LV with these
    /// numbers: the LV's thin status, not the mapping's, says whether it
    /// was ever written (and it was: its LUKS2 header), so its filesystem
    /// is made only under the formatting marker.
    pub under: Option<(u32, u32)>,
    /// This stage wrote the LUKS2 of that mapping under the formatting
    /// marker: the marker is its own, and the filesystem it makes now is
    /// the rest of the same format (nothing was cut; no warning).
    pub luks_written: bool,
}

/// NodeStageVolume for mount access: format only a never-written device
/// without signature (see [`blkid`]), then mount it at `staging`.
/// Idempotent: a staging path that already is a mount of this device is
/// left as it is.
///
/// `marker` is the volume's formatting marker ([`marker`]): written (and
/// synced) before mkfs runs, or for an encrypted volume before its LUKS2,
/// and removed once mkfs exited 0. A marker found here that this stage did
/// not write (`pool.luks_written` is false) means a format an earlier call
/// began on a blank device did not finish (the driver was killed, or mkfs
/// timed out): the device then holds only what that format wrote, and it
/// is formatted again, with a warning, instead of being refused for good.
/// Without a marker, the format guard stands: data the driver did not
/// write is never formatted.
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
    // The marker of the LUKS2 this stage wrote is not an earlier call's.
    let m = marker.to_path_buf();
    let unfinished = !pool.luks_written
        && tools
            .blocking("read the formatting marker", move || marker::exists(&m))
            .await?;

    // A thin volume that maps no sector of its pool was never written
    // and reads zeros everywhere: it holds no signature, and blkid need
    // not read it to say so.
    let (major, minor) = pool.under.unwrap_or(dev.numbers());
    let mapped = dm::thin_mapped_sectors(tools, major, minor).await?;
    let found = match mapped {
        0 => blkid::Signature::None,
        _ => blkid::probe(tools, &dev.path).await?,
    };
    let plan = match blkid::plan(&found, fs_type, mapped) {
        _ if pool.luks_written => {
            tracing::info!(
                volume = dev.volume_id,
                fs_type,
                "formatting the filesystem inside the LUKS2 this stage wrote"
            );
            blkid::Plan::Format
        }
        _ if unfinished => {
            tracing::warn!(volume = dev.volume_id, ?found, marker = %marker.display(),
                "{}", marker::UNFINISHED);
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
            mkfs(tools, fs_type, &dev.path, pool.zeroes_new_chunks, &pool.mkfs).await?;
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
