//! Snapshots: a snapshot is a read-only thin snapshot of a volume's LV,
//! named from the CO's snapshot name (`naming::snapshot_lv_name_for`) and
//! carrying its owner, name and source volume in tags. It costs no space
//! until the source diverges, and outlives its source.
//!
//! **Consistency.** When the source is active, LVM suspends it to take the
//! snapshot, and that suspend freezes a filesystem mounted on it
//! (device-mapper's lockfs: the kernel's freeze_bdev, the same freeze as
//! FIFREEZE) and thaws it when the snapshot is made. An explicit FIFREEZE
//! before `lvcreate` is not only redundant, it breaks the snapshot on
//! kernels before 6.8: the nested freeze makes LVM's suspend fail with
//! EBUSY (measured on Debian's 6.1), so the driver leaves the freeze to LVM.
//! An encrypted volume's filesystem is on its crypt mapping, above the LV
//! LVM suspends, and that suspend reaches no filesystem: the driver
//! freezes the mapping's mount itself around `lvcreate` (as a group
//! snapshot does, with its bound and freeze record), and nothing is
//! mounted on the LV to make the freezes nest.

use std::sync::Arc;

use super::{SnapshotId, VolumeId};
use crate::error::{Error, Result};
use crate::lvm::report::{Lv, Report};
use crate::naming::{self, SnapshotTags};
use crate::volume::Volumes;

/// A snapshot LV of our pool that carries our tags.
pub struct OwnedSnapshot<'a> {
    pub lv: &'a Lv,
    pub tags: SnapshotTags,
}

impl AsRef<str> for OwnedSnapshot<'_> {
    fn as_ref(&self) -> &str {
        &self.lv.name
    }
}

/// What the controller reports of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: String,
    pub source: String,
    pub size: u64,
    /// Seconds since the epoch, from LVM.
    pub created: Option<i64>,
    /// The group snapshot it belongs to.
    pub group: Option<String>,
}

impl SnapshotInfo {
    pub(super) fn of(s: &OwnedSnapshot) -> SnapshotInfo {
        SnapshotInfo {
            id: s.lv.name.clone(),
            source: s.tags.source.clone(),
            size: s.lv.size,
            created: s.lv.created,
            group: s.tags.group.as_ref().map(|g| g.id.clone()),
        }
    }
}

/// How long a snapshot taken for a clone on another node is kept when
/// nobody releases it (the controller does, once the clone is whole).
pub const CLONE_SOURCE_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Volumes {
    /// Looks snapshot `id` up in `report` and proves it is ours; a foreign
    /// LV of that name is FAILED_PRECONDITION and never touched.
    pub fn owned_snapshot<'a>(
        &self,
        report: &'a Report,
        id: &str,
    ) -> Result<Option<OwnedSnapshot<'a>>> {
        let Some(lv) = report.find(id) else {
            return Ok(None);
        };
        match SnapshotTags::decode(lv.tags.iter().map(String::as_str)) {
            Some(tags) if self.ours(lv, &tags.owner) => Ok(Some(OwnedSnapshot { lv, tags })),
            _ => Err(self.foreign(id, "snapshot")),
        }
    }

    /// Every snapshot of ours in `report`, sorted by id.
    pub fn owned_snapshots<'a>(&self, report: &'a Report) -> Vec<OwnedSnapshot<'a>> {
        let mut snaps: Vec<OwnedSnapshot> = report
            .thin_volumes(&self.lvm.pool)
            .filter(|lv| naming::is_snapshot_id(&lv.name))
            .filter_map(|lv| self.owned_snapshot(report, &lv.name).ok().flatten())
            .collect();
        snaps.sort_by(|a, b| a.lv.name.cmp(&b.lv.name));
        snaps
    }

    /// Like [`Volumes::owned_snapshot`], but a missing snapshot is NOT_FOUND.
    pub fn must_own_snapshot<'a>(&self, report: &'a Report, id: &str) -> Result<OwnedSnapshot<'a>> {
        self.owned_snapshot(report, id)?
            .ok_or_else(|| Error::NotFound(format!("snapshot {id} does not exist")))
    }

    /// CreateSnapshot; idempotent by name. The same name taken from
    /// another volume is ALREADY_EXISTS.
    pub async fn create_snapshot(
        self: &Arc<Self>,
        co_name: String,
        source: VolumeId,
    ) -> Result<SnapshotInfo> {
        let id = self.in_class_id(naming::snapshot_lv_name_for(&co_name));
        self.detached(&id.clone(), "CreateSnapshot", move |d, _| async move {
            d.snapshot_held(&id, co_name, &source, None).await
        })
        .await
    }

    /// The read-only snapshot of volume `source` that a clone named
    /// `clone_name` on another node is read from (docs/moving.md): the one
    /// taken for it earlier while it is there (a retried clone goes on
    /// reading the same point in time), else a new one, tagged
    /// [`naming::TAG_CLONE_FOR`] and never listed. Its id. Snapshots of
    /// this class taken for clones that have expired are removed first.
    pub async fn clone_source(
        self: &Arc<Self>,
        source: VolumeId,
        clone_name: String,
    ) -> Result<String> {
        self.remove_expired_clone_sources().await;
        let key = format!("clone-source-{source}");
        self.detached(&key, "Transfer.Grant of a clone", move |d, _| async move {
            let report = d.lvm.known().await?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let expires = now.as_secs() + CLONE_SOURCE_TTL.as_secs();
            if let Some((id, was)) = d.clone_sources(&report, &source, Some(&clone_name)).into_iter().next() {
                // Its life starts again: a clone that takes long, or is
                // retried late, keeps reading the same point in time.
                let (old, new) = (naming::clone_for_tag(&clone_name, was), naming::clone_for_tag(&clone_name, expires));
                d.lvm.retag(&id, Some(&old), Some(&new)).await?;
                tracing::info!(id, source = %source, clone = clone_name, expires, "transfer: reading the snapshot taken for this clone again");
                return Ok(id);
            }
            // A name of its own each time: a snapshot taken after an
            // earlier one was released is another point in time, and the
            // clone's via tag tells them apart.
            let co_name = format!("clone-for:{clone_name}:{}", now.as_nanos());
            let id = d.in_class_id(naming::snapshot_lv_name_for(&co_name));
            let tag = naming::clone_for_tag(&clone_name, expires);
            d.snapshot_held(&id, co_name, &source, Some(tag)).await?;
            tracing::info!(id, source = %source, clone = clone_name, expires, "transfer: took a snapshot of a volume for a clone on another node");
            Ok(id)
        })
        .await
    }

    /// The snapshots taken of volume `source` for clones (of clone `name`
    /// only, when given): their ids and expiry.
    fn clone_sources(
        &self,
        report: &Report,
        source: &str,
        name: Option<&str>,
    ) -> Vec<(String, u64)> {
        self.owned_snapshots(report)
            .into_iter()
            .filter(|s| s.tags.source == source)
            .filter_map(|s| {
                let (of, expires) = naming::clone_for(&s.lv.tags)?;
                name.is_none_or(|n| n == of)
                    .then(|| (s.lv.name.clone(), expires))
            })
            .collect()
    }

    /// `Transfer.Release`: removes the snapshots taken of volume `source`
    /// for clone `clone_name`; how many.
    pub async fn release_clone_sources(
        self: &Arc<Self>,
        source: VolumeId,
        clone_name: String,
    ) -> Result<usize> {
        let key = format!("clone-source-{source}");
        self.detached(&key, "Transfer.Release", move |d, _| async move {
            let report = d.lvm.known().await?;
            let ids = d.clone_sources(&report, &source, Some(&clone_name));
            for (id, _) in &ids {
                d.lvm.remove(id).await?;
                tracing::info!(id, source = %source, clone = clone_name, "transfer: removed the snapshot taken for a clone, which is whole");
            }
            Ok(ids.len())
        })
        .await
    }

    /// Removes the snapshots taken for clones that have expired (their
    /// clone abandoned, or the controller gone before it released them),
    /// each under its volume's clone guard and selected by its exact
    /// clone-for tag inside the locked `lvremove` (one a grant just gave
    /// a new life is not removed); a failure is logged, and the next grant
    /// or start tries again.
    pub async fn remove_expired_clone_sources(self: &Arc<Self>) {
        let report = match self.lvm.report().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "transfer: could not look for expired snapshots taken for clones");
                return;
            }
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let expired: Vec<(String, String, String)> = self
            .owned_snapshots(&report)
            .into_iter()
            .filter_map(|s| {
                let (name, e) = naming::clone_for(&s.lv.tags).filter(|(_, e)| *e <= now)?;
                Some((
                    s.lv.name.clone(),
                    s.tags.source.clone(),
                    naming::clone_for_tag(&name, e),
                ))
            })
            .collect();
        drop(report);
        for (id, source, tag) in expired {
            let key = format!("clone-source-{source}");
            let i = id.clone();
            let removed = self
                .detached(
                    &key,
                    "remove an expired clone's snapshot",
                    move |d, _| async move { d.lvm.remove_owned(&i, &tag).await },
                )
                .await;
            match removed {
                Ok(()) => tracing::info!(
                    id,
                    "transfer: removed an expired snapshot taken for a clone"
                ),
                Err(e) => {
                    tracing::warn!(id, error = %e, "transfer: could not remove an expired snapshot taken for a clone")
                }
            }
        }
    }

    async fn snapshot_held(
        &self,
        id: &str,
        co_name: String,
        source: &str,
        clone_for: Option<String>,
    ) -> Result<SnapshotInfo> {
        let report = self.lvm.fresh_report().await?;
        if let Some(existing) = self
            .owned_snapshot(&report, id)
            .map_err(|e| Error::AlreadyExists(format!("cannot create snapshot {co_name:?}: {e}")))?
        {
            if let Some(g) = &existing.tags.group {
                return Err(Error::AlreadyExists(format!(
                    "snapshot name {co_name:?} is taken by a member of group snapshot {}",
                    g.id
                )));
            }
            if existing.tags.source != source || existing.tags.co_name != co_name {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {co_name:?} exists as {id}, taken from volume {}, not {source}",
                    existing.tags.source
                )));
            }
            tracing::info!(id, source, "CreateSnapshot: already exists, returning it");
            return Ok(SnapshotInfo::of(&existing));
        }
        // The source stays as it is (not staged, deleted or grown) while
        // it is snapshotted.
        let _source = self.inflight.try_hold(source, "CreateSnapshot of it")?;
        let _alloc = self.alloc.lock().await;
        let report = self.lvm.fresh_report().await?;
        let vol = self.must_own(&report, source)?;
        self.check_pool_usable(&report)?;
        let (cap, _) = self.capacity(&report)?;
        self.check_headroom(&format!("a snapshot of {source}"), vol.lv.size, &cap)?;
        let tags = SnapshotTags {
            owner: self.cfg.driver_name.clone(),
            co_name,
            source: source.to_string(),
            access: vol.tags.access.clone(),
            group: None,
            encrypted: vol.tags.encrypted,
        };
        let frozen = match vol.tags.encrypted {
            true => Some(self.freeze_crypt_mount(source, id).await?),
            false => None,
        };
        let all: Vec<String> = tags.encode().into_iter().chain(clone_for).collect();
        let made = self
            .lvm
            .create_snapshot(id, source, &all, false, None)
            .await;
        if let Some(f) = frozen {
            let expired = f.expired();
            f.thaw_all().await;
            if made.is_ok() && expired {
                // Thawed by the bound before the snapshot was made: it may
                // not hold a consistent filesystem.
                self.lvm.remove(id).await?;
                return Err(Error::DeadlineExceeded(format!(
                    "volume {source}'s filesystem stayed frozen longer than {:?}: thawed, and the snapshot made was removed",
                    super::group::FREEZE_BOUND
                )));
            }
        }
        made?;
        tracing::info!(
            id,
            source,
            active = vol.lv.is_active(),
            "CreateSnapshot: created"
        );
        let report = self.lvm.fresh_report().await?;
        Ok(SnapshotInfo::of(&self.must_own_snapshot(&report, id)?))
    }

    /// Freezes the filesystem of the encrypted volume `source` where its
    /// crypt mapping is mounted on this node (nothing, when it is not).
    async fn freeze_crypt_mount(&self, source: &str, id: &str) -> Result<super::group::Frozen> {
        let points = match self.data_device(source, true).await? {
            Some(dev) => {
                let n = dev.numbers();
                self.tools
                    .blocking("find the mapping's mount", move || {
                        crate::node::freeze::mounted_at(n)
                    })
                    .await?
                    .into_iter()
                    .collect()
            }
            None => Vec::new(),
        };
        let record = self.cfg.state_dir.join("frozen").join(id);
        super::group::Frozen::freeze_all(&self.tools, record, points).await
    }

    /// DeleteSnapshot: removes the snapshot when it is ours; gone is
    /// success. Volumes restored from it are independent thin LVs and stay.
    pub async fn delete_snapshot(self: &Arc<Self>, id: SnapshotId) -> Result<()> {
        self.detached(&id.clone(), "DeleteSnapshot", move |d, _| async move {
            let report = d.lvm.fresh_report().await?;
            let Some(snap) = d.owned_snapshot(&report, &id)? else {
                tracing::info!(%id, "DeleteSnapshot: already gone");
                return Ok(());
            };
            if let Some(g) = &snap.tags.group {
                return Err(Error::InvalidArgument(format!(
                    "snapshot {id} is part of group snapshot {}",
                    g.id
                ))
                .advise(format!(
                    "delete the whole group with DeleteVolumeGroupSnapshot {}",
                    g.id
                )));
            }
            d.lvm.remove(&id).await?;
            tracing::info!(%id, "DeleteSnapshot: removed");
            Ok(())
        })
        .await
    }

    /// ListSnapshots: one page after `token`, of the snapshots that match
    /// `snapshot` and `source` when given, and the next token.
    pub async fn list_snapshots(
        &self,
        snapshot: Option<&str>,
        source: Option<&str>,
        token: &str,
        max: usize,
    ) -> Result<(Vec<SnapshotInfo>, String)> {
        let report = self.lvm.report().await?;
        let of_source = |s: &OwnedSnapshot| source.is_none_or(|v| s.tags.source == v);
        if let Some(id) = snapshot {
            // One snapshot: looked up, not searched for.
            let one = self
                .owned_snapshot(&report, id)
                .ok()
                .flatten()
                .filter(|s| s.lv.is_thin_volume() && s.lv.pool == self.lvm.pool)
                .filter(of_source)
                .filter(|s| naming::clone_for(&s.lv.tags).is_none())
                .filter(|s| token.is_empty() || s.lv.name.as_str() > token);
            return Ok((one.iter().map(SnapshotInfo::of).collect(), String::new()));
        }
        // The report is sorted by name and this class's snapshot ids share
        // a prefix: a page decodes its own snapshots and one more, not
        // every snapshot of the pool (which made paging through N
        // snapshots cost N² / page), as ListVolumes does.
        let prefix = self.in_class_id(naming::SNAPSHOT_PREFIX.to_string());
        let mut ours = report
            .named_after(&prefix, token)
            .filter(|lv| {
                lv.is_thin_volume() && lv.pool == self.lvm.pool && naming::is_snapshot_id(&lv.name)
            })
            .filter_map(|lv| self.owned_snapshot(&report, &lv.name).ok().flatten())
            .filter(|s| naming::clone_for(&s.lv.tags).is_none())
            .filter(of_source);
        let page: Vec<OwnedSnapshot> = match max {
            0 => ours.by_ref().collect(),
            max => ours.by_ref().take(max).collect(),
        };
        let next = match ours.next() {
            Some(_) => page.last().map(|s| s.lv.name.clone()).unwrap_or_default(),
            None => String::new(),
        };
        Ok((page.iter().map(SnapshotInfo::of).collect(), next))
    }
}
