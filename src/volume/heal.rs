//! NodeHealer, the start-up heal and the start-up clean-up.
//!
//! A heal restores exactly what the volume's node record says the CO asked
//! for, and nothing else: the LV active with its /dev node, the staging
//! mount with its recorded fs type and mount flags, every publish with its
//! recorded read-only flag (a bind mount, or a device node with the LV's
//! current numbers). A part of the record marked as going away (an
//! interrupted unstage or unpublish) is finished instead. What cannot be
//! healed (a failed or full pool, filesystem errors, a mount gone
//! read-only) is reported and left alone.
//!
//! At start-up every recorded volume is healed under its guard, several at
//! once, after the record is read again under that guard: a call the CO
//! made meanwhile is never undone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::node::kind_of;
use super::{Capability, NodePath, VolumeId};
use crate::error::{Error, Result};
use crate::naming;
use crate::node::record::{self, Kind, Publish, Record};
use crate::node::{self, block, dm, freeze, mount_options, mounts};
use crate::sys::{self, MsFlags};
use crate::volume::Volumes;

/// The outcome of one check: `abnormal` when anything was wrong, whether
/// or not it could be healed, with a message saying what and what was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub abnormal: bool,
    pub message: String,
}

/// How many volumes the start-up heal works on at once.
const HEAL_PARALLEL: usize = 8;
/// How long the start-up heal waits for a volume the CO is busy with.
const HEAL_BUSY_WAIT: Duration = Duration::from_secs(120);

impl Volumes {
    /// NodeHealer: checks volume `id` at `target` (and `staging`), and
    /// heals what it safely can, as its node record says.
    pub async fn heal(
        self: &Arc<Self>,
        id: VolumeId,
        target: NodePath,
        staging: Option<NodePath>,
        cap: Option<Capability>,
    ) -> Result<Verdict> {
        let target = self.resolve(&target).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "the parent directory of volume_path {} does not exist",
                target.display()
            ))
            .advise("pass the target or staging path the volume was published or staged at")
        })?;
        let staging = self.resolve_optional(staging.as_ref()).await?;
        self.detached(&id.clone(), "NodeHealer", move |d, _| async move {
            let Some(record) = d.load_record(&id).await? else {
                // The Healer spec's table: a volume that does not exist is
                // NOT_FOUND; one that exists but is not staged here is a
                // precondition the caller can meet.
                let report = d.lvm.fresh_report().await?;
                d.must_own(&report, &id)?;
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is not staged on this node (it has no node record): nothing to heal"
                ))
                .advise("call NodeStageVolume (and NodePublishVolume) instead: only a staged volume can be healed"));
            };
            if let Some(st) = staging.as_ref().filter(|st| **st != record.staging) {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is staged at {}, not at {}",
                    record.staging.display(),
                    st.display()
                ))
                .advise(format!(
                    "pass staging_target_path {} (or none)",
                    record.staging.display()
                )));
            }
            if record.staging != target && record.publish(&target).is_none() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is not published at {} on this node",
                    target.display()
                )));
            }
            if let Some(c) = &cap {
                if kind_of(&c.access) != record.kind {
                    return Err(Error::InvalidArgument(format!(
                        "volume {id} is staged as {:?}, not as {:?}",
                        record.kind,
                        kind_of(&c.access)
                    )));
                }
            }
            d.heal_held(&id, record, Some(&target), Instant::now()).await
        })
        .await
    }

    /// Heals one volume from its record; `only` limits the publishes
    /// looked at to one target (NodeHealer), `None` heals them all. LVM's
    /// state is read as of `since` or later (our own writes since are in
    /// it; the volume's guard keeps every other change to it out).
    async fn heal_held(
        &self,
        id: &str,
        mut record: Record,
        only: Option<&Path>,
        since: Instant,
    ) -> Result<Verdict> {
        let report = self.lvm.report_since(since).await?;
        let Some(vol) = self.owned(&report, id)? else {
            // The volume was deleted: nothing of it can be on this node.
            self.drop_overlays_of(id).await;
            self.forget_node_state(id).await?;
            return Ok(Verdict {
                abnormal: true,
                message: format!("volume {id} no longer exists: dropped its node record"),
            });
        };
        // A broken pool or LV is reported and nothing is touched.
        if let Some(p) = self.pool(&report)?.problem().or_else(|| vol.lv.problem()) {
            return Ok(Verdict {
                abnormal: true,
                message: format!("{p}; nothing was changed"),
            });
        }
        if record.unstaging {
            self.finish_unstage(id, Some(&record.staging)).await?;
            self.remove_record(id).await?;
            return Ok(Verdict {
                abnormal: true,
                message: format!(
                    "an unstage of volume {id} was interrupted: finished it and dropped the record"
                ),
            });
        }
        let mut found = Vec::new();
        let dev_path = PathBuf::from(self.lvm.dev_path(id));
        let node_missing = vol.lv.is_active() && {
            let p = dev_path.clone();
            self.tools
                .blocking("look for the LV's device node", move || {
                    Ok(std::fs::symlink_metadata(&p).is_err())
                })
                .await?
        };
        let (lv, activated) = self.activate(vol.lv).await?;
        let under = vol.tags.encrypted.then(|| lv.numbers());
        let dev = match vol.tags.encrypted {
            true => match self.crypt_device(id, &lv).await? {
                Some(mapped) => mapped,
                None => {
                    // The driver keeps no key: only a stage re-opens it.
                    if activated {
                        self.deactivate_if_unused(&lv).await;
                    }
                    return Ok(Verdict {
                        abnormal: true,
                        message: format!(
                            "encrypted volume {id} is staged but its crypt mapping is closed (the node restarted, \
                             or it was closed outside the driver); the driver keeps no passphrase, so the next \
                             NodeStageVolume (kubelet's, when the pod restarts) re-opens it; nothing was changed"
                        ),
                    });
                }
            },
            false => lv,
        };
        if activated {
            found.push(format!(
                "LV {} was inactive: re-activated it",
                self.lvm.lv_path(id)
            ));
        } else if node_missing {
            found.push(format!(
                "device node {} was missing: re-created it",
                dev_path.display()
            ));
        }
        let staging = record.staging.clone();
        // The per-mount flags the record asks of the staging mount (and
        // that its bind mounts inherit).
        let mut staged_flags = MsFlags::empty();
        match &record.kind {
            Kind::Filesystem { fs_type } => {
                let (mkfs, opts) =
                    super::node::formatting(&vol, fs_type, &record.mount_flags, true)?;
                staged_flags = mount_options::per_mount(opts.flags);
                if !self.mounted_from(&staging, &dev).await? {
                    let pool = mounts::StageFacts {
                        mkfs,
                        under,
                        ..self.stage_facts(&report, &vol)
                    };
                    let marker = self.formatting_marker(id);
                    mounts::stage(&self.tools, &dev, &staging, fs_type, &opts, &pool, &marker)
                        .await?;
                    found.push(format!(
                        "staging mount at {} was missing: re-mounted it from {} with mount flags {:?}",
                        staging.display(),
                        dev.path.display(),
                        record.mount_flags
                    ));
                } else if !record.adopted {
                    found.extend(self.ensure_flags(&staging, staged_flags).await?);
                }
            }
            Kind::Block => {
                let (d, st, roots) = (dev.clone(), staging.clone(), self.tools.roots.clone());
                self.tools
                    .blocking("stage a block volume", move || {
                        block::stage(&d, &st, &roots)
                    })
                    .await?;
            }
        }
        let publishes: Vec<_> = record
            .publishes
            .iter()
            .filter(|p| only.is_none_or(|t| p.target == t))
            .cloned()
            .collect();
        // One publish that cannot be restored does not stop the others.
        let mut failed = Vec::new();
        for p in publishes {
            match self
                .heal_publish(id, &mut record, &p, &dev, staged_flags)
                .await
            {
                Ok(done) => {
                    found.extend(done);
                    if !p.removing {
                        self.enforce_io(id, record.io_limits, &p.target, dev.numbers(), false)
                            .await;
                    }
                }
                Err(e) => failed.push(format!(
                    "could not restore the publish at {}: {e}",
                    p.target.display()
                )),
            }
        }
        // What healing cannot fix: filesystem errors, error-remounts.
        let block_staging = (record.kind == Kind::Block).then(|| staging.clone());
        let paths: Vec<PathBuf> = record
            .publishes
            .iter()
            .map(|p| p.target.clone())
            .filter(|t| only.is_none_or(|o| t == o))
            .chain(std::iter::once(staging.clone()))
            .collect();
        let (d2, roots) = (dev.clone(), self.tools.roots.clone());
        let problems = self
            .tools
            .blocking("check the volume's filesystem", move || {
                let mut out = Vec::new();
                for p in &paths {
                    out.extend(node::stats(&d2, p, block_staging.as_deref(), &roots)?.problems);
                }
                Ok(out)
            })
            .await?;
        for problem in problems {
            if !found.contains(&problem) {
                found.push(problem);
            }
        }
        found.extend(failed);
        let verdict = Verdict {
            abnormal: !found.is_empty(),
            message: if found.is_empty() {
                "volume is healthy: LV active, device node, mounts and filesystem in order".into()
            } else {
                found.join("; ")
            },
        };
        tracing::info!(
            id,
            abnormal = verdict.abnormal,
            message = verdict.message,
            "heal"
        );
        Ok(verdict)
    }

    /// Restores one recorded publish; says what it did, `None` when it was
    /// in place. `staged_flags`: the staging mount's per-mount flags.
    async fn heal_publish(
        &self,
        id: &str,
        record: &mut Record,
        p: &Publish,
        dev: &node::Device,
        staged_flags: MsFlags,
    ) -> Result<Option<String>> {
        if p.removing {
            node::unpublish(&self.tools, Some(dev.numbers()), id, &p.target, true).await?;
            record.publishes.retain(|q| q.target != p.target);
            self.save_record(record).await?;
            return Ok(Some(format!(
                "an unpublish at {} was interrupted: finished it",
                p.target.display()
            )));
        }
        let mut want = staged_flags;
        if p.readonly {
            want |= MsFlags::MS_RDONLY;
        }
        if self.publish_in_place(id, &record.kind, p, dev).await? {
            return match record.kind {
                // Flags an earlier version set are not known: left as found.
                Kind::Filesystem { .. } if !record.adopted => {
                    self.ensure_flags(&p.target, want).await
                }
                _ => Ok(None),
            };
        }
        let others: Vec<_> = record
            .publishes
            .iter()
            .filter(|q| q.target != p.target)
            .cloned()
            .collect();
        self.place_publish(dev, record, p, true, &others).await?;
        Ok(Some(match record.kind {
            Kind::Filesystem { .. } => format!(
                "publish mount at {} was missing: re-bound it from {} (readonly={})",
                p.target.display(),
                record.staging.display(),
                p.readonly
            ),
            Kind::Block => format!(
                "device node at {} was missing or stale: re-created it (readonly={})",
                p.target.display(),
                p.readonly
            ),
        }))
    }

    /// Gives the mount at `path` the per-mount flags `want`; says what it
    /// changed.
    async fn ensure_flags(&self, path: &Path, want: MsFlags) -> Result<Option<String>> {
        let (p, roots) = (path.to_path_buf(), self.tools.roots.clone());
        self.tools
            .blocking("check a mount's flags", move || {
                mounts::ensure_per_mount_flags(&p, want, &roots)
            })
            .await
    }

    async fn mounted_from(&self, path: &Path, dev: &node::Device) -> Result<bool> {
        let (p, n) = (path.to_path_buf(), dev.numbers());
        self.tools
            .blocking("read the mount table", move || {
                Ok(node::mount_table()?
                    .top_mount_at(&p)
                    .is_some_and(|m| m.device() == n))
            })
            .await
    }

    /// Whether a publish is in place as recorded: a bind mount of the
    /// volume (its flags are checked apart), or a device node that opens
    /// the LV (read-write) or this publish's own overlay of it (read-only)
    /// by their current numbers.
    async fn publish_in_place(
        &self,
        id: &str,
        kind: &Kind,
        p: &Publish,
        dev: &node::Device,
    ) -> Result<bool> {
        match kind {
            Kind::Filesystem { .. } => self.mounted_from(&p.target, dev).await,
            Kind::Block => {
                let (t, n, ro) = (p.target.clone(), dev.numbers(), p.readonly);
                let own = dm::overlay_name(id, &p.target);
                self.tools
                    .blocking("inspect a device node", move || {
                        Ok(sys::device_numbers(&t).ok().flatten().is_some_and(|node| {
                            match block::classify(node, Some(n)) {
                                block::NodeKind::Lv => !ro,
                                block::NodeKind::Overlay(name) => ro && name == own,
                                _ => false,
                            }
                        }))
                    })
                    .await
            }
        }
    }

    /// Removes the read-only overlays stacked on volume `id`'s LV.
    async fn drop_overlays_of(&self, id: &str) {
        let (lv, vg) = (
            crate::lvm::lv_dm_name(&self.lvm.vg, id),
            self.lvm.vg.clone(),
        );
        let overlays = self
            .tools
            .blocking("list overlays", move || Ok(dm::overlays_in_vg(&vg)))
            .await
            .unwrap_or_default();
        for (name, on) in overlays {
            if on == lv {
                if let Err(e) = dm::remove_overlay(&self.tools, &name).await {
                    tracing::warn!(name, error = %e, "could not remove a leftover overlay");
                }
            }
        }
    }

    /// Start-up: turns what versions before the node record kept (a
    /// `tpcsi.staged=` LV tag, and a block file in the staging directory)
    /// into node records, then drops the tag. Runs before the clean-up,
    /// which would otherwise take the overlays of such volumes for debris.
    pub async fn adopt_legacy(&self) {
        // Start-up's report (`pool::ensure` read it): no second `lvs` of
        // every LV before the sockets come up.
        let report = match self.lvm.known().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "start-up: cannot read the LVM report; earlier versions' staging tags not looked at");
                return;
            }
        };
        for lv in report.thin_volumes(&self.lvm.pool) {
            let Some((tag, staging)) = naming::legacy_staged_path(&lv.tags) else {
                continue;
            };
            let Ok(Some(vol)) = self.owned(&report, &lv.name) else {
                continue;
            };
            let (records, id, access) = (
                self.records.clone(),
                lv.name.clone(),
                vol.tags.access.clone(),
            );
            let numbers = self.current_device(lv).map(|d| d.numbers());
            let (st, state_dir) = (staging.clone(), self.cfg.state_dir.clone());
            let adopted = self
                .tools
                .blocking("adopt an earlier version's staging", move || {
                    if records.load(&id)?.is_some() {
                        return Ok(false);
                    }
                    let r = record::adopt_legacy(&id, &st, access.as_ref(), numbers, &state_dir)?;
                    records.save(&r)?;
                    record::drop_legacy_block_file(&st);
                    Ok(true)
                })
                .await;
            match adopted {
                Ok(made) => {
                    if let Err(e) = self.lvm.retag(&lv.name, Some(tag), None).await {
                        tracing::warn!(id = lv.name, error = %e, "start-up: could not drop an earlier version's staging tag");
                    }
                    tracing::info!(id = lv.name, staging = %staging.display(), made_record = made,
                        "start-up: adopted a staging an earlier version recorded in an LV tag");
                }
                Err(e) => {
                    tracing::warn!(id = lv.name, error = %e, "start-up: could not adopt an earlier version's staging; the tag stays")
                }
            }
        }
    }

    /// Start-up, first of all (it needs no LVM): thaws the filesystems a
    /// group snapshot froze when the driver was killed, as the freeze
    /// records under `state_dir/frozen/` name them.
    pub async fn thaw_left_frozen(&self) {
        let frozen = self.cfg.state_dir.join("frozen");
        if let Err(e) = self
            .tools
            .blocking("thaw what a killed driver froze", move || {
                freeze::thaw_left_frozen(&frozen).map(drop)
            })
            .await
        {
            tracing::warn!(error = %e, "start-up: could not go through the freeze records");
        }
    }

    /// Start-up clean-up of what a killed driver can leave: private
    /// reclaim mounts under `state_dir`, read-only overlays over our VG's
    /// LVs that no node record names, and table-less overlays (a killed
    /// `dmsetup create`) of our volumes that no record names. Runs before
    /// the sockets are bound, so no call runs beside it. Logs what it did.
    pub async fn clean_debris(&self) {
        let dir = self.cfg.state_dir.join("reclaim");
        let res = self
            .tools
            .blocking("clean private reclaim mounts", move || {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(Error::io(format!("read {}", dir.display()), e)),
                };
                for e in entries.filter_map(|e| e.ok()) {
                    let p = e.path();
                    while node::mount_table()?.is_mount_point(&p) {
                        sys::unmount(&p)?;
                        tracing::warn!(path = %p.display(), "start-up: unmounted a private reclaim mount a killed driver left");
                    }
                    let _ = std::fs::remove_dir(&p);
                }
                Ok(())
            })
            .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "start-up: could not clean private reclaim mounts");
        }
        // Table-less overlays carry no VG; their name says the volume. A
        // volume an earlier version staged and whose adoption failed keeps
        // its overlays: they may serve a pod.
        let (ours, legacy): (Vec<String>, Vec<String>) = match self.lvm.report().await {
            Ok(r) => (
                r.thin_volumes(&self.lvm.pool)
                    .map(|lv| lv.name.clone())
                    .collect(),
                r.thin_volumes(&self.lvm.pool)
                    .filter(|lv| naming::legacy_staged_path(&lv.tags).is_some())
                    .map(|lv| lv.name.clone())
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "start-up: cannot read the LVM report; overlays are left alone");
                return;
            }
        };
        let tableless = match dm::tableless_overlays(&self.tools).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "start-up: cannot list device-mapper devices; table-less overlays are left alone");
                Vec::new()
            }
        };
        self.close_unrecorded_mappings(&ours).await;
        let (records, vg) = (self.records.clone(), self.lvm.vg.clone());
        let unnamed = self
            .tools
            .blocking("find overlays no record names", move || {
                let mut named = Vec::new();
                for id in records.ids()? {
                    if let Some(r) = records.load(&id)? {
                        named.extend(
                            r.publishes
                                .iter()
                                .filter(|p| p.readonly && r.kind == Kind::Block)
                                .map(|p| dm::overlay_name(&r.volume_id, &p.target)),
                        );
                    }
                }
                let tableless = tableless.into_iter().filter(|name| {
                    dm::overlay_volume(name).is_some_and(|id| ours.iter().any(|o| o == id))
                });
                Ok(dm::overlays_in_vg(&vg)
                    .into_iter()
                    .map(|(name, _)| name)
                    .chain(tableless)
                    .filter(|name| !named.contains(name))
                    .filter(|name| {
                        !dm::overlay_volume(name).is_some_and(|id| legacy.iter().any(|l| l == id))
                    })
                    .collect::<Vec<_>>())
            })
            .await;
        let unnamed = match unnamed {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "start-up: cannot read the node records; leaving overlays alone");
                return;
            }
        };
        for name in unnamed {
            match dm::remove_overlay(&self.tools, &name).await {
                Ok(()) => tracing::warn!(
                    name,
                    "start-up: removed a read-only overlay no record names"
                ),
                Err(e) => {
                    tracing::warn!(name, error = %e, "start-up: could not remove an overlay no record names")
                }
            }
        }
    }

    /// Start-up: closes the crypt mappings over this class's LVs (`ours`)
    /// that no node record names and nothing holds (a stage that failed
    /// and was killed before it closed what it opened). A held one is
    /// left, and said.
    async fn close_unrecorded_mappings(&self, ours: &[String]) {
        // Left without a table (a cryptsetup killed half-way): removed, as
        // nothing can use them. Names only; the class's own volumes only.
        match dm::tableless(&self.tools, crate::node::crypt::MAPPING_PREFIX).await {
            Ok(names) => {
                for name in names.iter().filter(|n| {
                    ours.iter()
                        .any(|id| crate::node::crypt::mapping_name(id) == **n)
                }) {
                    if let Err(e) = crate::node::crypt::remove_stale(&self.tools, name).await {
                        tracing::warn!(name, error = %e, "start-up: could not remove a crypt mapping left without a table");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "start-up: cannot list device-mapper devices; table-less crypt mappings are left alone")
            }
        }
        let (records, vg, ours) = (self.records.clone(), self.lvm.vg.clone(), ours.to_vec());
        let found = self
            .tools
            .blocking("find crypt mappings no record names", move || {
                let mut out = Vec::new();
                for (name, lv) in dm::stacked_in_vg(&vg, crate::node::crypt::MAPPING_PREFIX) {
                    let Some(id) = ours.iter().find(|id| crate::lvm::lv_dm_name(&vg, id) == lv)
                    else {
                        continue;
                    };
                    if name != crate::node::crypt::mapping_name(id) || records.load(id)?.is_some() {
                        continue;
                    }
                    let Some((major, minor)) = sys::dm_numbers(&name)? else {
                        continue;
                    };
                    let dev = node::Device {
                        volume_id: id.clone(),
                        path: crate::node::crypt::mapping_path(&name),
                        major,
                        minor,
                    };
                    out.push((name, id.clone(), node::device_unused(&dev).unwrap_or(false)));
                }
                Ok(out)
            })
            .await;
        let found = match found {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "start-up: cannot look for crypt mappings; left alone");
                return;
            }
        };
        for (name, id, unused) in found {
            if !unused {
                tracing::warn!(
                    name,
                    id,
                    "start-up: a crypt mapping no record names is in use; left open"
                );
                continue;
            }
            match crate::node::crypt::close(&self.tools, &name).await {
                Ok(()) => {
                    tracing::warn!(name, id, "start-up: closed a crypt mapping no record names")
                }
                Err(e) => {
                    tracing::warn!(name, id, error = %e, "start-up: could not close a crypt mapping no record names")
                }
            }
        }
    }

    /// The start-up heal: every volume with a node record, several at a
    /// time, each under its guard with its record read again there.
    pub async fn heal_recorded(self: &Arc<Self>) {
        let records = self.records.clone();
        let ids = match self
            .tools
            .blocking("list node records", move || records.ids())
            .await
        {
            // The records of every class share state_dir: this class heals
            // its own.
            Ok(ids) => ids
                .into_iter()
                .filter(|id| self.holds(id))
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(error = %e, "start-up heal: cannot list node records");
                return;
            }
        };
        // One `lvs` from here on serves every volume's heal: a report of
        // every LV per staged volume would cost a dense node minutes.
        let started = Instant::now();
        let total = ids.len();
        let limit = Arc::new(tokio::sync::Semaphore::new(HEAL_PARALLEL));
        let mut tasks = tokio::task::JoinSet::new();
        for id in ids {
            let (d, limit) = (self.clone(), limit.clone());
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                d.heal_at_start(VolumeId::new_unchecked(id), started).await;
            });
        }
        while tasks.join_next().await.is_some() {}
        tracing::info!(class = self.class_name(), volumes = total, elapsed = ?started.elapsed(), "start-up heal done");
    }

    async fn heal_at_start(self: &Arc<Self>, id: VolumeId, since: Instant) {
        let deadline = Instant::now() + HEAL_BUSY_WAIT;
        loop {
            let res = self
                .detached(&id.clone(), "start-up heal", {
                    let id = id.clone();
                    move |d, _| async move {
                        match d.load_record(&id).await? {
                            Some(r) => d.heal_held(&id, r, None, since).await.map(Some),
                            None => Ok(None),
                        }
                    }
                })
                .await;
            match res {
                Err(Error::Aborted(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Some(v)) => {
                    tracing::info!(%id, abnormal = v.abnormal, message = v.message, "start-up heal");
                    return;
                }
                Ok(None) => {
                    tracing::info!(%id, "start-up heal: the record went away meanwhile; nothing to do");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%id, error = %e, "start-up heal failed");
                    return;
                }
            }
        }
    }
}
