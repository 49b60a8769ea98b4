//! Node operations: stage, unstage, publish, unpublish, stats and expand.
//! Each proves the volume is ours (from the cached LVM report, which our
//! own writes keep current, or from this node's record of a stage that
//! proved it), asks device-mapper whether its LV is active, keeps the
//! volume's node record (`node::record`) in step with what it does, gets
//! the LV active when it must be, and hands the work to the node layer.
//!
//! Error codes follow the spec's tables: a capability that does not fit
//! the volume's recorded access is FAILED_PRECONDITION (INVALID_ARGUMENT
//! for NodeExpandVolume); a staged volume staged again with other
//! arguments, or a target published again with other arguments, is
//! ALREADY_EXISTS.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Capability, NodePath, Owned, SizeRange, VolumeId};
use crate::error::{Error, Result};
use crate::fs_options::{self, MkfsOptions};
use crate::naming::{self, Access};
use crate::node::cgroup::IoLimits;
use crate::node::crypt::Keys;
use crate::node::mount_options::MountOptions;
use crate::node::record::{Kind, Publish, Record};
use crate::node::{self, block, mounts};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::volume::Volumes;

/// Whether a capability fits how the volume was created; `Err` says why
/// not. Volumes without a recorded access accept either.
fn access_fits(vol: &Owned, wanted: &Access) -> std::result::Result<(), String> {
    naming::fits(&vol.lv.name, vol.tags.access.as_ref(), wanted)
}

/// The mkfs options and the mount options a stage of `vol` as `fs_type`
/// uses: the ones recorded with the volume at creation, checked against
/// `fs_options`' lists again (tags are only text), then the CO's mount
/// flags, which win where both set one.
///
/// `recorded`: the flags come from a node record, and a word an earlier
/// version accepted is taken as it was then
/// (`MountOptions::parse_recorded`).
pub(super) fn formatting(
    vol: &Owned,
    fs_type: &str,
    mount_flags: &[String],
    recorded: bool,
) -> Result<(MkfsOptions, MountOptions)> {
    let refused = |what: &str, why: String| {
        Error::FailedPrecondition(format!(
            "volume {} carries {what} that this driver no longer accepts: {why}",
            vol.lv.name
        ))
        .advise("recreate the volume, or fix its tpcsi.p.mkfs / tpcsi.c.* tags by hand")
    };
    let mkfs = fs_options::mkfs_options(fs_type, vol.tags.mkfs_options())
        .map_err(|why| refused("mkfs options", why))?;
    let mut words = vol.tags.class_mount_options();
    for w in &words {
        fs_options::mount_word(fs_type, w).map_err(|why| refused("mount options", why))?;
    }
    words.extend(mount_flags.iter().cloned());
    let opts = if recorded {
        MountOptions::parse_recorded(fs_type, &words)?
    } else {
        MountOptions::parse(fs_type, &words)?
    };
    Ok((mkfs, opts))
}

/// The record's kind for an access type.
pub fn kind_of(access: &Access) -> Kind {
    match access {
        Access::Mount { fs_type } => Kind::Filesystem {
            fs_type: fs_type.clone(),
        },
        Access::Block => Kind::Block,
    }
}

/// What NodeGetVolumeStats reports: usage, and every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    pub usage: node::Usage,
    pub problems: Vec<String>,
}

impl Volumes {
    /// The real location of a checked path whose parent must exist.
    async fn resolve_existing_parent(&self, field: &str, p: &NodePath) -> Result<PathBuf> {
        self.resolve(p).await?.ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "the parent directory of {field} {} does not exist",
                p.display()
            ))
            .advise(format!(
                "create the parent directory of {field} (the CO does, for the paths it hands out), then retry"
            ))
        })
    }

    /// Where the formatting marker of a volume lives; see `mounts::stage`.
    pub fn formatting_marker(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("formatting").join(id)
    }

    pub(super) async fn load_record(&self, id: &str) -> Result<Option<Record>> {
        let (records, id) = (self.records.clone(), id.to_string());
        self.tools
            .blocking("read a node record", move || records.load(&id))
            .await
    }

    pub(super) async fn save_record(&self, r: &Record) -> Result<()> {
        let (records, r) = (self.records.clone(), r.clone());
        self.tools
            .blocking("write a node record", move || records.save(&r))
            .await
    }

    pub(super) async fn remove_record(&self, id: &str) -> Result<()> {
        let (records, id) = (self.records.clone(), id.to_string());
        self.tools
            .blocking("remove a node record", move || records.remove(&id))
            .await
    }

    /// Drops the node record and formatting marker of a deleted volume.
    pub(super) async fn forget_node_state(&self, id: &str) -> Result<()> {
        let (records, marker, id) = (
            self.records.clone(),
            self.formatting_marker(id),
            id.to_string(),
        );
        self.tools
            .blocking("drop a deleted volume's node state", move || {
                records.remove(&id)?;
                crate::node::marker::remove(&marker)
            })
            .await
    }

    /// NodeStageVolume.
    pub async fn stage(
        self: &Arc<Self>,
        id: VolumeId,
        staging: NodePath,
        cap: Capability,
        keys: Option<Keys>,
    ) -> Result<()> {
        self.detached(&id.clone(), "NodeStageVolume", move |d, _| async move {
            d.stage_held(&id, &staging, &cap, keys.as_ref()).await
        })
        .await
    }

    async fn stage_held(
        &self,
        id: &VolumeId,
        staging: &NodePath,
        cap: &Capability,
        keys: Option<&Keys>,
    ) -> Result<()> {
        let report = self.lvm.known().await?;
        let vol = self.must_own(&report, id)?;
        access_fits(&vol, &cap.access).map_err(Error::FailedPrecondition)?;
        // Secrets are read only for an encrypted volume.
        let keys = match (vol.tags.encrypted, keys) {
            (true, None) => return Err(super::crypt::missing_passphrase(id)),
            (true, Some(k)) => Some(k),
            (false, _) => None,
        };
        // Checked before anything is recorded: options the volume carries
        // that the lists no longer take refuse the stage, touching nothing.
        let formats = match &cap.access {
            Access::Mount { fs_type } => Some(formatting(&vol, fs_type, &cap.mount_flags, false)?),
            Access::Block => None,
        };
        let mut pool = self.stage_facts(&report, &vol);
        if pool.problem.is_some() {
            // A refusal to format rests on a fresh view, not the cache.
            let fresh = self.lvm.fresh_report().await?;
            pool = self.stage_facts(&fresh, &self.must_own(&fresh, id)?);
        }
        let staging = self
            .resolve_existing_parent("staging_target_path", staging)
            .await?;
        let kind = kind_of(&cap.access);
        // From here on, an error that is not a stall drops a record this
        // call created: nothing before it may fail after the record is saved.
        let created = match self.load_record(id).await? {
            Some(r) if !r.unstaging => {
                if r.staging != staging {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is already staged at {}; one volume has one staging path",
                        r.staging.display()
                    ))
                    .advise(format!(
                        "stage it at {} as before, or NodeUnstageVolume it there first",
                        r.staging.display()
                    )));
                }
                if r.adopted && r.kind == kind {
                    // An earlier version staged it; the CO now says with
                    // which flags.
                    let mut r = r;
                    r.mount_flags = cap.mount_flags.clone();
                    r.adopted = false;
                    self.save_record(&r).await?;
                } else if r.kind != kind || !r.same_flags(&cap.mount_flags) {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is already staged at {} as {:?} with mount flags {:?}, not as {kind:?} with {:?}",
                        staging.display(),
                        r.kind,
                        r.mount_flags,
                        cap.mount_flags
                    ))
                    .advise("stage it with the capability and mount flags of the first NodeStageVolume, or NodeUnstageVolume it first"));
                }
                false
            }
            _ => {
                // Recorded before anything is mounted, so a restart in the
                // middle knows what this stage was for.
                self.save_record(&Record {
                    volume_id: id.to_string(),
                    staging: staging.clone(),
                    kind,
                    mount_flags: cap.mount_flags.clone(),
                    publishes: Vec::new(),
                    unstaging: false,
                    adopted: false,
                    io_limits: IoLimits::from_params(&vol.tags.mutable),
                    encrypted: vol.tags.encrypted,
                })
                .await?;
                true
            }
        };
        let mount = formats.map(|(mkfs, opts)| {
            pool.mkfs = mkfs;
            opts
        });
        let res = async {
            let (lv, activated) = self.activate(vol.lv).await?;
            let (dev, opened) = match keys {
                Some(keys) => {
                    pool.under = Some(lv.numbers());
                    let block = mount.is_none();
                    match self.open_crypt(&vol, &lv, keys, &pool, block).await {
                        Ok(open) => {
                            pool.luks_written = open.formatted;
                            (open.dev, open.opened)
                        }
                        Err(e) => {
                            if activated {
                                self.deactivate_if_unused(&lv).await;
                            }
                            return Err(e);
                        }
                    }
                }
                None => (lv.clone(), false),
            };
            let res = match (&cap.access, &mount) {
                (Access::Mount { fs_type }, Some(opts)) => {
                    let marker = self.formatting_marker(id);
                    mounts::stage(&self.tools, &dev, &staging, fs_type, opts, &pool, &marker).await
                }
                _ => {
                    let (d, st, roots) = (dev.clone(), staging.clone(), self.tools.roots.clone());
                    self.tools
                        .blocking("stage a block volume", move || {
                            block::stage(&d, &st, &roots)
                        })
                        .await
                }
            };
            if res.as_ref().is_err_and(|e| !e.is_stalled()) {
                // Leave the LV as it was found.
                if opened {
                    if let Err(e) = self.close_crypt(id).await {
                        tracing::warn!(%id, error = %e, "could not close the crypt mapping again");
                    }
                }
                if activated {
                    self.deactivate_if_unused(&lv).await;
                }
            }
            res
        }
        .await;
        // A step that stalled may still finish: the record stays, so a
        // retry or the start-up heal knows what it was for.
        if created && res.as_ref().is_err_and(|e| !e.is_stalled()) {
            self.remove_record(id).await?;
        }
        res
    }

    /// NodeUnstageVolume.
    pub async fn unstage(self: &Arc<Self>, id: VolumeId, staging: NodePath) -> Result<()> {
        self.detached(&id.clone(), "NodeUnstageVolume", move |d, _| async move {
            let recorded = d.load_record(&id).await?;
            if recorded.is_none() {
                d.must_own(&*d.lvm.report().await?, &id)?;
            }
            let staging_real = d.resolve(&staging).await?;
            // The record of this staging: at the real path, or, when the
            // path's parent is gone (and so any mount there), at the path
            // as asked.
            let asked = crate::mountinfo::normalize(&staging);
            let staged_elsewhere = recorded.as_ref().filter(|r| match &staging_real {
                Some(real) => r.staging != *real,
                None => r.staging != asked,
            });
            if let Some(r) = staged_elsewhere {
                // Staged at another path: nothing of it is here, and its
                // devices (a crypt mapping, the LV) serve that staging.
                tracing::info!(%id, staged_at = %r.staging.display(), asked = %staging.display(),
                    "NodeUnstageVolume: the volume is staged at another path; nothing to do here");
                return Ok(());
            }
            let record = recorded;
            if let Some(mut r) = record.clone() {
                // A recorded publish whose target holds nothing any more
                // (removed behind the driver's back) no longer counts.
                // (A filesystem publish is a mount; a block one a node.)
                let targets: Vec<PathBuf> = r.publishes.iter().map(|p| p.target.clone()).collect();
                let block = r.kind == Kind::Block;
                let present = d
                    .tools
                    .blocking("unstage: look at the publish targets", move || {
                        let table = node::mount_table()?;
                        Ok(targets
                            .into_iter()
                            .filter(|t| {
                                if block {
                                    t.symlink_metadata().is_ok()
                                } else {
                                    table.is_mount_point(t)
                                }
                            })
                            .collect::<Vec<_>>())
                    })
                    .await?;
                r.publishes.retain(|p| present.contains(&p.target));
                if let Some(p) = r.publishes.first() {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is still published at {}",
                        p.target.display()
                    ))
                    .advise("call NodeUnpublishVolume for that target first, then retry"));
                }
                if !r.unstaging {
                    r.unstaging = true;
                    d.save_record(&r).await?;
                }
            }
            d.finish_unstage(&id, staging_real.as_deref()).await?;
            if record.is_some() {
                d.remove_record(&id).await?;
            }
            Ok(())
        })
        .await
    }

    /// The node part of an unstage: unmount (or drop overlays), close an
    /// encrypted volume's mapping, then deactivate the LV when nothing
    /// uses it.
    pub(super) async fn finish_unstage(&self, id: &str, staging: Option<&Path>) -> Result<()> {
        let lv = self.live_device(id).await?;
        let mapped = match &lv {
            Some(lv) => self.crypt_device(id, lv).await?,
            None => None,
        };
        let encrypted = mapped.is_some();
        let dev = mapped.or_else(|| lv.clone());
        let dev = dev.as_ref();
        let present = match staging {
            Some(p) => {
                let p = p.to_path_buf();
                self.tools
                    .blocking("look at the staging path", move || {
                        Ok(p.symlink_metadata().is_ok())
                    })
                    .await?
            }
            None => false,
        };
        match staging {
            Some(p) if present => node::unstage(&self.tools, dev, id, p).await?,
            _ => tracing::info!(id, staging = ?staging, "NodeUnstageVolume: staging path is gone"),
        }
        if encrypted {
            self.close_crypt(id).await?;
        }
        if let Some(lv) = &lv {
            self.deactivate_if_unused(lv).await;
        }
        Ok(())
    }

    /// NodePublishVolume.
    pub async fn publish(
        self: &Arc<Self>,
        id: VolumeId,
        staging: NodePath,
        target: NodePath,
        cap: Capability,
        readonly: bool,
    ) -> Result<()> {
        self.detached(&id.clone(), "NodePublishVolume", move |d, _| async move {
            // A record proves the volume ours and how it was staged: no
            // LVM command. Without one, the report says what is wrong.
            let recorded = d.load_record(&id).await?;
            if recorded.is_none() {
                let report = d.lvm.report().await?;
                let vol = d.must_own(&report, &id)?;
                access_fits(&vol, &cap.access).map_err(Error::FailedPrecondition)?;
            }
            let not_staged = || {
                Error::FailedPrecondition(format!(
                    "volume {id} is not staged at {}",
                    staging.display()
                ))
                .advise("call NodeStageVolume with this staging_target_path first, then retry")
            };
            let staging = d.resolve(&staging).await?.ok_or_else(not_staged)?;
            let target = d.resolve_existing_parent("target_path", &target).await?;
            let mut record = recorded
                .filter(|r| r.staging == staging && !r.unstaging)
                .ok_or_else(not_staged)?;
            if record.kind != kind_of(&cap.access) {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is staged as {:?}, not as {:?}",
                    record.kind,
                    kind_of(&cap.access)
                ))
                .advise("publish it with the access type it was staged with, or unstage and stage it again"));
            }
            let dev = d
                .data_device(&id, record.encrypted)
                .await?
                .ok_or_else(not_staged)?;
            let (vid, path, numbers) = (id.to_string(), dev.path.clone(), dev.numbers());
            let dev = d
                .tools
                .blocking("check the volume's /dev node", move || {
                    node::ensure_dev_node(&vid, &path, numbers)
                })
                .await?;
            let wanted = Publish {
                target: target.clone(),
                readonly: cap.readonly(readonly),
                mode: cap.mode.as_str_name().to_string(),
                removing: false,
            };
            let known = record.publish(&target).is_some();
            let added = match record.publish(&target) {
                Some(p)
                    if !p.removing
                        && (p.readonly != wanted.readonly
                            || (!p.mode.is_empty() && p.mode != wanted.mode)) =>
                {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is already published at {} with readonly={} and {}",
                        target.display(),
                        p.readonly,
                        p.mode
                    ))
                    .advise("publish it there with the first call's readonly and access mode, use another target_path, or NodeUnpublishVolume it first"));
                }
                Some(p) if !p.removing => {
                    if p.mode.is_empty() {
                        // Adopted from an earlier version: now known.
                        record
                            .publishes
                            .iter_mut()
                            .filter(|p| p.target == target)
                            .for_each(|p| p.mode = wanted.mode.clone());
                        d.save_record(&record).await?;
                    }
                    false
                }
                _ => {
                    record.publishes.retain(|p| p.target != target);
                    record.publishes.push(wanted.clone());
                    d.save_record(&record).await?;
                    true
                }
            };
            let others: Vec<Publish> = record
                .publishes
                .iter()
                .filter(|p| p.target != target)
                .cloned()
                .collect();
            let res = d
                .place_publish(&dev, &record, &wanted, known, &others)
                .await;
            if res.is_ok() {
                d.enforce_io(&id, record.io_limits, &target, dev.numbers(), false)
                    .await;
            }
            if added && res.as_ref().is_err_and(|e| !e.is_stalled()) {
                // Back to what was recorded: nothing, or an unpublish still
                // to finish.
                if known {
                    record
                        .publishes
                        .iter_mut()
                        .filter(|p| p.target == target)
                        .for_each(|p| p.removing = true);
                } else {
                    record.publishes.retain(|p| p.target != target);
                }
                d.save_record(&record).await?;
            }
            res
        })
        .await
    }

    /// Makes the publish `p` of the record's volume exist: a bind mount of
    /// the staging mount, or a device node (`recorded`: a node there is
    /// ours whatever its numbers).
    pub(super) async fn place_publish(
        &self,
        dev: &node::Device,
        record: &Record,
        p: &Publish,
        recorded: bool,
        others: &[Publish],
    ) -> Result<()> {
        let mode = Mode::from_str_name(&p.mode).unwrap_or(Mode::SingleNodeWriter);
        match record.kind {
            Kind::Filesystem { .. } => {
                let (dev, staging, target, ro) = (
                    dev.clone(),
                    record.staging.clone(),
                    p.target.clone(),
                    p.readonly,
                );
                // SINGLE_NODE_SINGLE_WRITER on either side refuses a
                // second target (the spec's publish table).
                let single_name = Mode::SingleNodeSingleWriter.as_str_name();
                let single = mode == Mode::SingleNodeSingleWriter
                    || others.iter().any(|o| o.mode == single_name);
                let roots = self.tools.roots.clone();
                self.tools
                    .blocking("bind-mount a publish", move || {
                        mounts::publish(&dev, &staging, &target, ro, single, recorded, &roots)
                    })
                    .await
            }
            Kind::Block => {
                block::publish(
                    &self.tools,
                    dev,
                    &p.target,
                    mode,
                    p.readonly,
                    others,
                    recorded,
                )
                .await
            }
        }
    }

    /// NodeUnpublishVolume.
    pub async fn unpublish(self: &Arc<Self>, id: VolumeId, target: NodePath) -> Result<()> {
        self.detached(&id.clone(), "NodeUnpublishVolume", move |d, _| async move {
            let record = d.load_record(&id).await?;
            if record.is_none() {
                d.must_own(&*d.lvm.report().await?, &id)?;
            }
            let encrypted = record.as_ref().is_some_and(|r| r.encrypted);
            let lv = d
                .data_device(&id, encrypted)
                .await?
                .map(|dev| dev.numbers());
            let Some(target) = d.resolve(&target).await? else {
                // Nothing can be mounted where no directory is; a publish
                // recorded there must not be healed back, nor its overlay
                // stay.
                let recorded = record.as_ref().is_some_and(|r| r.publish(&target).is_some());
                d.forget_publish(&id, record, recorded, &target, lv).await?;
                tracing::info!(%id, target = %target.display(), "NodeUnpublishVolume: target already gone");
                return Ok(());
            };
            let mut record = record;
            let recorded = record.as_ref().is_some_and(|r| r.publish(&target).is_some());
            if let Some(r) = record.as_mut().filter(|_| recorded) {
                if let Some(p) = r.publishes.iter_mut().find(|p| p.target == target) {
                    if !p.removing {
                        p.removing = true;
                        d.save_record(r).await?;
                    }
                }
            }
            node::unpublish(&d.tools, lv, &id, &target, recorded).await?;
            // The pod's cgroup keeps no limit for a device it no longer has.
            if let (Some(r), Some(lv)) = (record.as_ref().filter(|_| recorded), lv) {
                if !r.io_limits.is_unlimited() {
                    d.enforce_io(&id, IoLimits::default(), &target, lv, true).await;
                }
            }
            d.forget_publish(&id, record, recorded, &target, lv).await
        })
        .await
    }

    /// The end of an unpublish at `target`: a block volume's read-only
    /// overlay for it goes, and so does its entry in the record (when
    /// `recorded`).
    async fn forget_publish(
        &self,
        id: &str,
        record: Option<Record>,
        recorded: bool,
        target: &Path,
        lv: Option<(u32, u32)>,
    ) -> Result<()> {
        if record.as_ref().is_some_and(|r| r.kind == Kind::Block) {
            block::drop_own_overlay(&self.tools, id, target, lv).await?;
        }
        if let Some(mut r) = record.filter(|_| recorded) {
            r.publishes.retain(|p| p.target != target);
            self.save_record(&r).await?;
        }
        Ok(())
    }

    /// NodeGetVolumeStats: usage and condition of the volume at `path`.
    pub async fn volume_stats(&self, id: &VolumeId, path: &NodePath) -> Result<VolumeStats> {
        self.retry_io(id, path).await?;
        let report = self.lvm.report().await?;
        let vol = self.must_own(&report, id)?;
        let missing = || {
            Error::NotFound(format!(
                "volume {id} is not at {}: the path does not exist",
                path.display()
            ))
        };
        let real = self.resolve(path).await?.ok_or_else(missing)?;
        let mut problems: Vec<String> = self.problem(&report, vol.lv).into_iter().collect();
        let dev = self.data_device(id, vol.tags.encrypted).await?;
        let (records, roots) = (self.records.clone(), self.tools.roots.clone());
        let vid = id.to_string();
        let (exists, here, stats) = self
            .tools
            .blocking("read volume stats", move || {
                if std::fs::symlink_metadata(&real).is_err() {
                    return Ok((false, false, None));
                }
                // The volume is where this node staged or published it
                // (its record)...
                let Some(record) = records.load(&vid)? else {
                    return Ok((true, false, None));
                };
                if record.staging == real || record.publish(&real).is_some() {
                    let Some(dev) = dev else {
                        return Ok((true, true, None));
                    };
                    let block_staging = (record.kind == Kind::Block).then_some(&record.staging);
                    return node::stats(&dev, &real, block_staging.map(PathBuf::as_path), &roots)
                        .map(|s| (true, true, Some(s)));
                }
                // ... and, for a raw block volume, wherever a device node
                // that is in fact the volume's is: kubelet asks at its
                // bind mount of the published node.
                if record.kind == Kind::Block {
                    let targets: Vec<PathBuf> =
                        record.publishes.iter().map(|p| p.target.clone()).collect();
                    return node::block_node_stats(&vid, dev.as_ref(), &real, &targets, &roots)
                        .map(|s| (true, true, s));
                }
                Ok((true, false, None))
            })
            .await?;
        if !exists {
            return Err(missing());
        }
        if !here {
            return Err(Error::NotFound(format!(
                "volume {id} is not at {}: it is neither staged nor published there on this node",
                path.display()
            )));
        }
        let usage = match stats {
            Some(s) => {
                problems.extend(s.problems);
                s.usage
            }
            None if vol.tags.encrypted => {
                problems.push(format!(
                    "the crypt mapping of encrypted volume {id} is not open: the volume is not staged on \
                     this node, or the node restarted; unstage and stage it again with its passphrase \
                     (restart the workload)"
                ));
                node::Usage::Unknown
            }
            None => {
                problems.push(format!(
                    "LV {} is not active: the volume is not staged on this node, or was deactivated \
                     outside the driver; unstage and stage it again (restart the workload)",
                    self.lvm.lv_path(id)
                ));
                node::Usage::Unknown
            }
        };
        Ok(VolumeStats { usage, problems })
    }

    /// NodeExpandVolume: grows the filesystem (or a block volume's
    /// read-only overlays) to the LV's size and returns it. With
    /// `controller_expansion` off it first grows the LV to `range` (a CO
    /// that sends no ControllerExpandVolume).
    pub async fn node_expand(
        self: &Arc<Self>,
        id: VolumeId,
        path: NodePath,
        staging: Option<NodePath>,
        requested: Option<Access>,
        range: SizeRange,
    ) -> Result<u64> {
        self.detached(&id.clone(), "NodeExpandVolume", move |d, _| async move {
            let report = d.lvm.fresh_report().await?;
            let vol = d.must_own(&report, &id)?;
            if let Some(a) = &requested {
                access_fits(&vol, a).map_err(Error::InvalidArgument)?;
            }
            let block_access = matches!(
                vol.tags.access.as_ref().or(requested.as_ref()),
                Some(Access::Block)
            );
            let real = d
                .resolve(&path)
                .await?
                .filter(|p| p.symlink_metadata().is_ok())
                .ok_or_else(|| {
                    Error::NotFound(format!(
                        "volume {id} is not at {}: the path does not exist",
                        path.display()
                    ))
                })?;
            let staging = d.resolve_optional(staging.as_ref()).await?;
            let not_staged = || {
                Error::FailedPrecondition(format!("volume {id} is not staged on this node"))
                    .advise("call NodeStageVolume first, then NodeExpandVolume")
            };
            let lv = d.current_device(vol.lv).ok_or_else(not_staged)?;
            let dev = match vol.tags.encrypted {
                true => d.crypt_device(&id, &lv).await?.ok_or_else(not_staged)?,
                false => lv.clone(),
            };
            // Checked and staged here: with controller_expansion off, the
            // LV grows now (its device numbers stay), then what is on it.
            if !d.cfg.controller_expansion && range.required > vol.lv.size {
                d.grow_lv(&id, &range, "NodeExpandVolume").await?;
            }
            if vol.tags.encrypted {
                // The LV, then the mapping over it, then the filesystem.
                crate::node::crypt::resize(&d.tools, &crate::node::crypt::mapping_name(&id))
                    .await?;
            }
            let mut at: Vec<&Path> = vec![&real];
            at.extend(staging.as_deref());
            let size = node::expand(&d.tools, &dev, block_access, &at).await?;
            // An encrypted volume is its LV: the mapping is smaller by its
            // LUKS2 header.
            let size = match vol.tags.encrypted {
                true => {
                    let p = lv.path.clone();
                    d.tools
                        .blocking("read the LV's size", move || {
                            Ok(crate::sys::block_size_bytes(&p)?)
                        })
                        .await?
                }
                false => size,
            };
            if range.required > size {
                return Err(Error::OutOfRange(format!(
                    "volume {id} is {size} bytes, less than the required {}",
                    range.required
                ))
                .advise("call ControllerExpandVolume to grow it first, then NodeExpandVolume"));
            }
            if range.limit > 0 && size > range.limit {
                return Err(Error::OutOfRange(format!(
                    "volume {id} is {size} bytes, more than limit_bytes {}",
                    range.limit
                )));
            }
            Ok(size)
        })
        .await
    }
}

/// FAILED_PRECONDITION while this node's record says the volume is
/// staged or published: a CO must unpublish and unstage it before `what`
/// (DeleteVolume). A published raw block volume need not be open, so the
/// LV's open count cannot tell; a removed LV would leave a device node
/// whose numbers the next LV takes.
pub(super) fn refuse_if_recorded(record: Option<&Record>, id: &str, what: &str) -> Result<()> {
    let Some(r) = record else {
        return Ok(());
    };
    let targets: Vec<String> = r
        .publishes
        .iter()
        .map(|p| p.target.display().to_string())
        .collect();
    Err(Error::FailedPrecondition(format!(
        "{what}: volume {id} is staged on this node at {}{}",
        r.staging.display(),
        if targets.is_empty() {
            String::new()
        } else {
            format!(" and published at {}", targets.join(", "))
        }
    ))
    .advise("call NodeUnpublishVolume for each target and NodeUnstageVolume first, then retry"))
}
