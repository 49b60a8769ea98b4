//! Controller operations: create, delete, expand, capability checks,
//! listing and capacity. Creates and deletes are decided on fresh LVM
//! reports and run as detached operations (see the module above).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::size::{fs_minimum, size, size_fits};
use super::{Owned, PoolWide, SizeRange, VolumeId};
use crate::error::{Error, Result};
use crate::lvm::report::{Capacity, Lv, Report};
use crate::lvm::Cached;
use crate::naming::{self, Access, ContentSource, VolumeTags};
use crate::volume::Volumes;

/// A checked CreateVolume request.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    /// The CO's name for the volume (checked for size and characters).
    pub co_name: String,
    pub access: Access,
    /// Parameters by their short names (`grpc::validate::parameters`).
    pub params: BTreeMap<String, String>,
    pub range: Option<SizeRange>,
    /// A snapshot or volume to copy (CreateVolume's content source).
    pub from: Option<ContentSource>,
    /// Mutable parameters (`grpc::validate::mutable_parameters`).
    pub mutable: BTreeMap<String, String>,
    /// The StorageClass's `encrypted` parameter; `None`: the class's
    /// `encryption.enabled`.
    pub encrypted: Option<bool>,
}

/// What the controller reports of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: String,
    pub size: u64,
    pub access: Option<Access>,
    /// Why the volume or its pool cannot serve I/O; `None` when healthy.
    pub problem: Option<String>,
    pub from: Option<ContentSource>,
    pub mutable: BTreeMap<String, String>,
}

impl VolumeInfo {
    /// A volume this driver just made with `tags`, `size` bytes.
    fn made(id: &str, size: u64, tags: &VolumeTags) -> VolumeInfo {
        VolumeInfo {
            id: id.to_string(),
            size,
            access: tags.access.clone(),
            problem: None,
            from: tags.from.clone(),
            mutable: tags.mutable.clone(),
        }
    }

    pub(super) fn of(d: &Volumes, report: &Report, o: Owned) -> VolumeInfo {
        VolumeInfo::with_pool_wide(d, o, &d.pool_wide(report))
    }

    /// A ListVolumes entry: `lv` if it is a volume of ours, its tags read
    /// for what the entry shows only ([`VolumeTags::listed`], the same
    /// verdict as [`Volumes::owned_lv`]'s decode).
    fn listed(d: &Volumes, lv: &Lv, wide: &PoolWide) -> Option<VolumeInfo> {
        let tags = VolumeTags::listed(&lv.name, lv.tags.iter().map(String::as_str))
            .filter(|t| d.ours(lv, t.owner))?;
        Some(VolumeInfo {
            id: lv.name.clone(),
            size: lv.size,
            access: tags.access,
            problem: d.problem_with(lv, wide),
            from: tags.from,
            mutable: tags.mutable,
        })
    }

    /// The volume, given what is wrong with its pool (looked up once for a
    /// whole page).
    fn with_pool_wide(d: &Volumes, o: Owned, wide: &PoolWide) -> VolumeInfo {
        VolumeInfo {
            id: o.lv.name.clone(),
            size: o.lv.size,
            access: o.tags.access,
            problem: d.problem_with(o.lv, wide),
            from: o.tags.from,
            mutable: o.tags.mutable,
        }
    }
}

/// A copy holds its source's bytes: LUKS2 (opened with the source's
/// passphrase) or not, and the same filesystem or block, whatever the
/// request for `tags` would like. `what` names the source.
pub(super) fn fits_source(
    what: &str,
    src_access: Option<&Access>,
    src_encrypted: bool,
    tags: &VolumeTags,
) -> Result<()> {
    if src_encrypted != tags.encrypted {
        let (have, want) = match src_encrypted {
            true => ("is encrypted", "unencrypted"),
            false => ("is not encrypted", "encrypted"),
        };
        return Err(Error::InvalidArgument(format!(
            "{what} {have}; a volume made from it cannot be {want}"
        ))
        .advise(format!(
            "make the copy with a StorageClass whose encryption matches its source (parameter encrypted: \"{src_encrypted}\")"
        )));
    }
    if let (Some(have), Some(want)) = (src_access, &tags.access) {
        if have != want {
            return Err(Error::InvalidArgument(format!(
                "{what} holds {have:?}; a volume made from it cannot be {want:?}"
            )));
        }
    }
    Ok(())
}

/// Whether a volume made with `existing` tags is what a request for
/// `tags` makes: mutable parameters may have been modified since, and the
/// class's options changed, which is not part of what makes the volume
/// the request's.
pub(super) fn same_request(existing: &VolumeTags, tags: &VolumeTags) -> bool {
    VolumeTags {
        mutable: existing.mutable.clone(),
        class_options: existing.class_options.clone(),
        ..tags.clone()
    } == *existing
}

/// The one mutable parameter: the LV's read-ahead, in 512-byte sectors or
/// `auto` (`lvchange --readahead`), changed on a live LV without moving
/// data.
pub const READ_AHEAD: &str = "readAheadSectors";

pub(super) fn read_ahead(tags: &VolumeTags) -> Option<&str> {
    tags.mutable.get(READ_AHEAD).map(String::as_str)
}

/// Whether `key` is one of the I/O limits (`node::cgroup::KEYS`).
fn is_io_limit(key: &str) -> bool {
    crate::node::cgroup::KEYS.iter().any(|(k, _)| *k == key)
}

/// Whether LVM's `lv_read_ahead` (`auto`, or bytes) is `value` (`auto`,
/// or sectors).
fn read_ahead_is(reported: &str, value: &str) -> bool {
    match (reported, value.parse::<u64>()) {
        (r, _) if value == "auto" => r == "auto",
        (r, Ok(sectors)) => r.parse::<u64>().is_ok_and(|b| b == sectors * 512),
        _ => false,
    }
}

/// A capability must fit how the volume was created: block stays block,
/// and a filesystem volume is mounted with its own filesystem.
pub fn check_access(vol: &Owned, wanted: &Access) -> Result<()> {
    naming::fits(&vol.lv.name, vol.tags.access.as_ref(), wanted).map_err(Error::InvalidArgument)
}

impl Volumes {
    /// The class's options a new volume is recorded with (see
    /// [`VolumeTags::class_options`]): its mkfs options, unless the
    /// request's `mkfsOptions` replaced them, and its mount options, for
    /// the volume's filesystem. None for a raw block volume.
    fn class_options(
        &self,
        access: &Access,
        params: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Access::Mount { fs_type } = access else {
            return out;
        };
        let mkfs = self
            .cfg
            .mkfs_options
            .get(fs_type)
            .map_or("", String::as_str);
        let mkfs = mkfs.split_ascii_whitespace().collect::<Vec<_>>().join(" ");
        if !params.contains_key(naming::PARAM_MKFS) && !mkfs.is_empty() {
            out.insert(naming::PARAM_MKFS.to_string(), mkfs);
        }
        let mount = self
            .cfg
            .mount_options
            .get(fs_type)
            .cloned()
            .unwrap_or_default();
        if !mount.is_empty() {
            out.insert(naming::CLASS_MOUNT.to_string(), mount.join(" "));
        }
        out
    }

    /// CreateVolume; idempotent by name.
    pub async fn create_volume(self: &Arc<Self>, spec: CreateSpec) -> Result<VolumeInfo> {
        if let Some(from) = &spec.from {
            self.refuse_other_class(from.id(), "copy")?;
        }
        let lv_name = self.in_class_id(naming::lv_name_for(&spec.co_name));
        self.detached(&lv_name.clone(), "CreateVolume", move |d, _| async move {
            d.create_held(&lv_name, spec).await
        })
        .await
    }

    /// The tags a new volume of `spec` is made with.
    pub(super) fn tags_for(&self, spec: &CreateSpec) -> VolumeTags {
        VolumeTags {
            owner: self.cfg.driver_name.clone(),
            co_name: spec.co_name.clone(),
            access: Some(spec.access.clone()),
            params: spec.params.clone(),
            mutable: spec.mutable.clone(),
            class_options: self.class_options(&spec.access, &spec.params),
            from: spec.from.clone(),
            encrypted: spec.encrypted.unwrap_or(self.cfg.encryption.enabled),
        }
    }

    async fn create_held(&self, lv_name: &str, spec: CreateSpec) -> Result<VolumeInfo> {
        let name = spec.co_name.as_str();
        let tags = self.tags_for(&spec);
        let range = spec.range.as_ref();
        let report = self.lvm.known().await?;
        if let Some(existing) = self
            .owned(&report, lv_name)
            .map_err(|e| Error::AlreadyExists(format!("cannot create volume {name:?}: {e}")))?
        {
            let size = existing.lv.size;
            // A copy that was made but not yet grown (the driver stopped
            // between the two steps: it still has its origin's size, or
            // the origin is gone) is finished, not refused.
            let origin_size = report.find(&existing.lv.origin).map(|o| o.size);
            let unfinished = tags.from.is_some()
                && origin_size.is_none_or(|o| o == size)
                && range.is_some_and(|r| r.required > size && (r.limit == 0 || r.limit >= size));
            let same = same_request(&existing.tags, &tags);
            if !same || !(unfinished || size_fits(range, size)) {
                return Err(Error::AlreadyExists(format!(
                    "volume {name:?} exists as {lv_name} ({size} bytes, {:?}, parameters {:?}, made from {:?}) and is incompatible with this request",
                    existing.tags.access, existing.tags.params, existing.tags.from
                )));
            }
            if !unfinished {
                tracing::info!(
                    name,
                    lv = lv_name,
                    "CreateVolume: already exists, returning it"
                );
                return Ok(VolumeInfo::of(self, &report, existing));
            }
        }
        match &tags.from {
            None => self.create_empty(lv_name, &tags, range).await,
            Some(from) => self.create_copy(lv_name, &tags, from, range).await,
        }
    }

    /// A new, empty thin volume.
    async fn create_empty(
        &self,
        lv_name: &str,
        tags: &VolumeTags,
        range: Option<&SizeRange>,
    ) -> Result<VolumeInfo> {
        let size = self
            .create_reserved(
                lv_name,
                "a new volume",
                tags,
                &tags.encode(),
                |_, extent| {
                    let size = size(range, extent, self.cfg.default_volume_size)?;
                    fs_minimum(tags.access.as_ref(), tags.encrypted, size, range, extent)
                },
            )
            .await?;
        tracing::info!(
            name = tags.co_name,
            lv = lv_name,
            size,
            "CreateVolume: created"
        );
        // lvcreate made exactly this size (extent-aligned) with these
        // tags: no need to read the report back.
        Ok(VolumeInfo::made(lv_name, size, tags))
    }

    /// Makes thin LV `lv_name` (`what`, for a refusal) of the size
    /// `size_of(report, extent)` says, with `lv_tags` and `tags`'
    /// read-ahead. Checked and reserved under the allocation lock; made
    /// outside it, so concurrent creates overlap their `lvcreate`s (LVM
    /// serialises only their metadata commits). Its size.
    pub(super) async fn create_reserved(
        &self,
        lv_name: &str,
        what: &str,
        tags: &VolumeTags,
        lv_tags: &[String],
        size_of: impl FnOnce(&Report, u64) -> Result<u64>,
    ) -> Result<u64> {
        let (size, reserved) = {
            let _alloc = self.alloc.lock().await;
            let report = self.usable_report().await?;
            let (cap, extent) = self.capacity(&report)?;
            let size = size_of(&report, extent)?;
            self.check_headroom(what, size, &cap)?;
            (size, self.reserved.hold(lv_name, size))
        };
        self.lvm
            .create_thin(lv_name, size, lv_tags, read_ahead(tags))
            .await?;
        // Released under the lock, once the cached report shows the LV: a
        // check that runs meanwhile counts it in one or the other.
        let _alloc = self.alloc.lock().await;
        drop(reserved);
        Ok(size)
    }

    /// A volume made from a snapshot (a restore) or from a volume (a
    /// clone): a writable thin snapshot of the source, grown when the
    /// request is larger. Its filesystem is grown when it is staged.
    async fn create_copy(
        &self,
        lv_name: &str,
        tags: &VolumeTags,
        from: &ContentSource,
        range: Option<&SizeRange>,
    ) -> Result<VolumeInfo> {
        let origin = match from {
            ContentSource::Snapshot(id) | ContentSource::Volume(id) => id.as_str(),
        };
        let _alloc = self.alloc.lock().await;
        let report = self.lvm.fresh_report().await?;
        let (cap, extent) = self.capacity(&report)?;
        let made = self.owned(&report, lv_name)?.map(|o| o.lv.size);
        let (size, now) = match made {
            // Made by a call the driver did not finish: only its growth is
            // left, whether or not the source is still there.
            Some(now) => (size(range, extent, now)?.max(now), now),
            None => {
                // The source stays as it is while it is copied.
                let _source = self.inflight.try_hold(origin, "CreateVolume from it")?;
                let src_size = self.check_source(&report, from, tags, range)?;
                let size = size(range, extent, src_size)?.max(src_size);
                self.check_pool_usable(&report)?;
                self.check_headroom("a copy of its source", size, &cap)?;
                self.lvm
                    .create_snapshot(lv_name, origin, &tags.encode(), true, read_ahead(tags))
                    .await?;
                tracing::info!(
                    name = tags.co_name,
                    lv = lv_name,
                    ?from,
                    "CreateVolume: made from its source"
                );
                // A thin snapshot has its origin's size.
                (size, src_size)
            }
        };
        if size > now {
            if made.is_some() {
                self.check_headroom("growing the copy", size - now, &cap)?;
            }
            self.lvm.extend(lv_name, size).await?;
            tracing::info!(
                lv = lv_name,
                from = now,
                to = size,
                "CreateVolume: grew the copy to the requested size"
            );
        }
        Ok(VolumeInfo::made(lv_name, size.max(now), tags))
    }

    /// Checks a copy's source against the request: it exists and is ours,
    /// holds the requested access, and is not larger than the limit.
    /// Returns its size.
    fn check_source(
        &self,
        report: &Report,
        from: &ContentSource,
        tags: &VolumeTags,
        range: Option<&SizeRange>,
    ) -> Result<u64> {
        let (src_size, src_access, src_encrypted) = match from {
            ContentSource::Snapshot(id) => {
                let snap = self.must_own_snapshot(report, id)?;
                (snap.lv.size, snap.tags.access, snap.tags.encrypted)
            }
            ContentSource::Volume(id) => {
                let vol = self.must_own(report, id)?;
                (vol.lv.size, vol.tags.access, vol.tags.encrypted)
            }
        };
        fits_source(
            &format!("{from:?}"),
            src_access.as_ref(),
            src_encrypted,
            tags,
        )?;
        if let Some(limit) = range.map(|r| r.limit).filter(|l| *l > 0 && *l < src_size) {
            return Err(Error::OutOfRange(format!(
                "{from:?} is {src_size} bytes; a volume made from it cannot be smaller (limit_bytes {limit})"
            )));
        }
        Ok(src_size)
    }

    /// ControllerModifyVolume: applies each mutable parameter that is not
    /// in effect yet (LV and tag), each in one `lvchange`. An empty
    /// `mutable` changes nothing but still answers NOT_FOUND for a volume
    /// that does not exist.
    pub async fn modify_volume(
        self: &Arc<Self>,
        id: VolumeId,
        mutable: BTreeMap<String, String>,
    ) -> Result<()> {
        self.detached(&id.clone(), "ControllerModifyVolume", move |d, _| async move {
            let report = d.lvm.fresh_report().await?;
            let vol = d.must_own(&report, &id)?;
            for (key, value) in &mutable {
                match key.as_str() {
                    READ_AHEAD => {
                        let had = vol.tags.mutable.get(key);
                        if had == Some(value) && read_ahead_is(&vol.lv.read_ahead, value) {
                            tracing::info!(%id, key, value, "ControllerModifyVolume: already set");
                            continue;
                        }
                        // The tag changes only when it says something else
                        // (the LV may have been changed behind our back).
                        let (old, new) = match had {
                            Some(v) if v == value => (None, None),
                            _ => (
                                had.map(|v| naming::mutable_tag(key, v)),
                                Some(naming::mutable_tag(key, value)),
                            ),
                        };
                        if read_ahead_is(&vol.lv.read_ahead, value) {
                            // LVM refuses to set a read-ahead the LV
                            // already has (exit 5): only the tag is new.
                            d.lvm.retag(&id, old.as_deref(), new.as_deref()).await?;
                        } else {
                            d.lvm
                                .set_read_ahead(&id, value, old.as_deref(), new.as_deref())
                                .await?;
                        }
                        tracing::info!(%id, key, value, "ControllerModifyVolume: set");
                    }
                    key if is_io_limit(key) => {
                        let had = vol.tags.mutable.get(key);
                        if had == Some(value) {
                            continue;
                        }
                        d.lvm
                            .retag(
                                &id,
                                had.map(|v| naming::mutable_tag(key, v)).as_deref(),
                                Some(naming::mutable_tag(key, value).as_str()),
                            )
                            .await?;
                        tracing::info!(%id, key, value, "ControllerModifyVolume: set");
                    }
                    other => {
                        return Err(Error::InvalidArgument(format!(
                            "mutable parameter {other:?} is not supported"
                        )))
                    }
                }
            }
            // Pods that have it published here get the new limits.
            if mutable.keys().any(|k| is_io_limit(k)) {
                let mut all = vol.tags.mutable.clone();
                all.extend(mutable.clone());
                d.modify_io_limits(&id, &all).await?;
            }
            Ok(())
        })
        .await
    }

    /// RESOURCE_EXHAUSTED when `what` (a new volume, a growth, a snapshot,
    /// a group) would add more virtual size than the pool may still hand
    /// out at the overprovision ratio.
    pub(super) fn check_headroom(&self, what: &str, size: u64, cap: &Capacity) -> Result<()> {
        if size > cap.virtual_headroom {
            return Err(Error::ResourceExhausted(format!(
                "{what} adds {size} bytes of virtual size, but thin pool {} can hand out only {} more at overprovision ratio {}",
                self.lvm.lv_path(&self.lvm.pool),
                cap.virtual_headroom,
                self.cfg.overprovision_ratio
            ))
            .advise("ask for less, delete volumes or snapshots, extend the pool (lvextend), or raise overprovision_ratio in the config"));
        }
        Ok(())
    }

    /// DeleteVolume: removes the LV when it is ours; gone is success.
    pub async fn delete_volume(self: &Arc<Self>, id: VolumeId) -> Result<()> {
        // A copy being filled stops at its next piece; this call meets it
        // still running (ABORTED), and the retry removes it.
        if self.copies.stop(&id) {
            tracing::info!(%id, "DeleteVolume: stopping the copy being filled from another node");
        }
        self.detached(&id.clone(), "DeleteVolume", move |d, _| async move {
            // The view as known refuses a foreign LV early (a delete starts
            // no background refresh, whose lvs would hold the VG lock its
            // lvremove needs); the removal itself checks name, pool and
            // owner tag inside the locked LVM command, so it can never
            // remove what is not ours.
            let report = d.lvm.known().await?;
            if report
                .find(&id)
                .is_some_and(|lv| d.filling_here(lv).is_some())
            {
                return d.remove_filling(&id).await;
            }
            let cached = d.owned(&report, &id).map(|o| o.is_some());
            let record = d.load_record(&id).await?;
            let recorded = record.is_some();
            // A refusal, or a record of a volume the cache does not show,
            // is decided on a fresh view.
            let known = match cached {
                Ok(false) if !recorded => false,
                Ok(true) => true,
                _ => d.owned(&*d.lvm.fresh_report().await?, &id)?.is_some(),
            };
            if !known && recorded {
                // The LV went behind the driver's back; the record stays,
                // so NodeUnpublish and NodeUnstage can still undo what it
                // names.
                tracing::info!(%id, "DeleteVolume: already gone");
                return Ok(());
            }
            if !known {
                // The view is kept current by the driver's own writes: a
                // volume missing from it is gone (a retried delete), and
                // earns no lvremove.
                tracing::info!(%id, "DeleteVolume: already gone");
                return d.forget_node_state(&id).await;
            }
            super::node::refuse_if_recorded(record.as_ref(), &id, "DeleteVolume")?;
            d.lvm.remove_owned(&id, &d.owner_tag()).await?;
            tracing::info!(%id, "DeleteVolume: removed");
            // Nothing of a deleted volume can be staged here any more.
            d.forget_node_state(&id).await
        })
        .await
    }

    /// ControllerExpandVolume: grows the LV to the range. Returns the size
    /// and whether the node must act too.
    pub async fn expand_volume(
        self: &Arc<Self>,
        id: VolumeId,
        range: SizeRange,
        requested: Option<Access>,
    ) -> Result<(u64, bool)> {
        self.detached(
            &id.clone(),
            "ControllerExpandVolume",
            move |d, _| async move {
                let (size, access) = d.grow_lv(&id, &range, "ControllerExpandVolume").await?;
                // Block volumes need the node step too: a read-only publish is
                // a device-mapper overlay that NodeExpandVolume resizes.
                Ok((size, access.is_some() || requested.is_some()))
            },
        )
        .await
    }

    /// Grows the LV of `id` to fit `range` (nothing when it already
    /// does), within the pool's headroom; returns its size and access
    /// type. The caller holds the volume's guard (ControllerExpandVolume,
    /// or NodeExpandVolume when `controller_expansion` is off).
    pub(super) async fn grow_lv(
        &self,
        id: &VolumeId,
        range: &SizeRange,
        what: &str,
    ) -> Result<(u64, Option<Access>)> {
        let _alloc = self.alloc.lock().await;
        let report = self.lvm.known().await?;
        let vol = self.must_own(&report, id)?;
        let access = vol.tags.access.clone();
        let current = vol.lv.size;
        expandable_within(current, range)?;
        let (_, extent) = self.capacity(&report)?;
        let target = size(Some(range), extent, vol.lv.size)?;
        if target <= current {
            tracing::info!(%id, current, target, "{what}: already large enough");
            return Ok((current, access));
        }
        let report = self.usable_report().await?;
        let (cap, _) = self.capacity(&report)?;
        self.check_headroom(&format!("growing {id}"), target - current, &cap)?;
        self.lvm.extend(id, target).await?;
        tracing::info!(%id, from = current, to = target, "{what}: extended the LV");
        Ok((target, access))
    }

    /// ValidateVolumeCapabilities: `Ok(Err(why))` when the volume exists
    /// but the capability does not fit it.
    pub async fn fits(&self, id: &VolumeId, access: Result<Access>) -> Result<Result<()>> {
        let report = self.lvm.report().await?;
        let vol = self.must_own(&report, id)?;
        Ok(access.and_then(|a| check_access(&vol, &a)))
    }

    /// ControllerGetVolume.
    pub async fn get_volume(&self, id: &VolumeId) -> Result<VolumeInfo> {
        let report = self.lvm.report().await?;
        if let Some(lv) = report.find(id) {
            if let Some(at) = self.filling_here(lv) {
                // A copy from another node: no volume yet, but its progress
                // is what a caller of its id wants to see (docs/moving.md).
                return Ok(VolumeInfo {
                    id: id.to_string(),
                    size: lv.size,
                    access: None,
                    problem: Some(self.copies.describe(id, at, lv.size)),
                    from: None,
                    mutable: BTreeMap::new(),
                });
            }
        }
        let vol = self.must_own(&report, id)?;
        Ok(VolumeInfo::of(self, &report, vol))
    }

    /// ListVolumes: one page after `token` (a volume id or empty), and the
    /// next token.
    ///
    /// Paged on names first (thin volumes of our pool, shaped like our ids,
    /// carrying our owner tag: string compares only); the tags are decoded
    /// for the page alone. A volume whose other tags are damaged is left
    /// out of its page, as [`Volumes::owned`] would leave it out.
    pub async fn list_volumes(&self, token: &str, max: usize) -> Result<(Vec<VolumeInfo>, String)> {
        let report = self.lvm.report().await?;
        let owner = self.owner_tag();
        // The report is sorted by name and this class's ids share a
        // prefix: a page looks at its own volumes and one more, not at
        // every LV of the VG (which made paging through N volumes cost
        // N²/page).
        let prefix = self.in_class_id(naming::ID_PREFIX.to_string());
        let mut ours = report.named_after(&prefix, token).filter(|lv| {
            lv.is_thin_volume()
                && lv.pool == self.lvm.pool
                && naming::is_volume_id(&lv.name)
                && self.holds(&lv.name)
                && lv.tags.contains(&owner)
        });
        let page: Vec<&Lv> = match max {
            0 => ours.by_ref().collect(),
            max => ours.by_ref().take(max).collect(),
        };
        let next = match ours.next() {
            Some(_) => page.last().map(|lv| lv.name.clone()).unwrap_or_default(),
            None => String::new(),
        };
        let wide = self.pool_wide(&report);
        Ok((
            page.into_iter()
                .filter_map(|lv| VolumeInfo::listed(self, lv, &wide))
                .collect(),
            next,
        ))
    }

    /// GetCapacity: what the pool can still hand out, and its extent size.
    pub async fn capacity_now(&self) -> Result<(Capacity, u64)> {
        let report = self.lvm.report().await?;
        self.capacity_in(&report)
    }

    /// What GetCapacity answers from the cached report, without asking
    /// LVM, and for how long that report stays fresh (`Lvm::cached_report`);
    /// unknown with no cached report, or when the figures rest on more
    /// than the report: the autopilot's room in a loop file that may grow,
    /// which the host's free space bounds. The cluster's controller keeps
    /// these (docs/cluster.md).
    pub fn cached_capacity(&self) -> CachedCapacity {
        if self.room_rests_on_host() {
            return CachedCapacity::Unknown;
        }
        match self.lvm.cached_report() {
            Cached::Report(report, fresh_for) => match self.capacity_in(&report) {
                Ok((cap, extent)) => CachedCapacity::Known(cap, extent, fresh_for),
                Err(_) => CachedCapacity::Unknown,
            },
            Cached::Held => CachedCapacity::Held,
            Cached::Missing => CachedCapacity::Unknown,
        }
    }

    /// GetCapacity's figures from `report`.
    fn capacity_in(&self, report: &Report) -> Result<(Capacity, u64)> {
        let (cap, extent) = self.capacity(report)?;
        // While the pool refuses allocation (full, failed, read-only
        // metadata) no volume fits: Kubernetes' scheduler reads
        // maximum_volume_size before capacity, and must stop placing
        // claims here.
        if self.check_pool_usable(report).is_err() {
            return Ok((
                Capacity {
                    virtual_headroom: 0,
                    physical_free: 0,
                },
                extent,
            ));
        }
        Ok((cap, extent))
    }

    /// Our volumes, sorted by id: the order ListVolumes pages through.
    pub fn owned_volumes<'a>(&self, report: &'a Report) -> Vec<Owned<'a>> {
        let mut vols: Vec<Owned> = report
            .thin_volumes(&self.lvm.pool)
            .filter(|lv| naming::is_volume_id(&lv.name))
            .filter_map(|lv| self.owned_lv(lv))
            .collect();
        vols.sort_by(|a, b| a.lv.name.cmp(&b.lv.name));
        vols
    }
}

impl AsRef<str> for Owned<'_> {
    fn as_ref(&self) -> &str {
        &self.lv.name
    }
}

/// What [`Volumes::cached_capacity`] finds.
pub enum CachedCapacity {
    /// GetCapacity's figures, the extent size, and for how much longer
    /// the report they come from is fresh.
    Known(Capacity, u64, std::time::Duration),
    /// The report is held with writes not yet in it: ask again soon.
    Held,
    /// Only LVM (or more than the report) can say.
    Unknown,
}

/// ControllerExpandVolume: a volume already above `limit_bytes` cannot
/// meet it (volumes never shrink): OUT_OF_RANGE, as the spec's table says.
fn expandable_within(current: u64, range: &SizeRange) -> Result<()> {
    if range.limit > 0 && current > range.limit {
        return Err(Error::OutOfRange(format!(
            "the volume is {current} bytes, above limit_bytes {}: volumes never shrink",
            range.limit
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expansion_limit_below_the_current_size_is_out_of_range() {
        let r = |required, limit| SizeRange { required, limit };
        assert!(expandable_within(100, &r(50, 0)).is_ok());
        assert!(expandable_within(100, &r(100, 100)).is_ok());
        assert!(expandable_within(100, &r(200, 300)).is_ok());
        assert!(matches!(
            expandable_within(100, &r(50, 99)),
            Err(Error::OutOfRange(_))
        ));
    }

    #[test]
    fn read_ahead_is_compared_in_lvm_units() {
        assert!(read_ahead_is("262144", "512"));
        assert!(!read_ahead_is("262144", "256"));
        assert!(read_ahead_is("auto", "auto"));
        assert!(!read_ahead_is("auto", "512"));
        assert!(!read_ahead_is("131072", "auto"));
    }

    /// A new volume records its class's options for its filesystem, the
    /// mkfs options only where the request named none; block, none.
    #[test]
    fn a_volume_records_its_class_options_for_its_filesystem() {
        let cfg = crate::config::Config::parse(
            "mkfs_options = { ext4 = \" -m  0 \", xfs = \"-L x\" }\n\
             mount_options = { ext4 = [\"noatime\", \"commit=30\"] }\n",
        )
        .unwrap();
        let d = Volumes::new(cfg, "n".into());
        let fs = |f: &str| Access::Mount {
            fs_type: f.to_string(),
        };
        let none = BTreeMap::new();
        let ext4 = d.class_options(&fs("ext4"), &none);
        assert_eq!(ext4.get(naming::PARAM_MKFS).unwrap(), "-m 0");
        assert_eq!(ext4.get(naming::CLASS_MOUNT).unwrap(), "noatime commit=30");
        let xfs = d.class_options(&fs("xfs"), &none);
        assert_eq!(
            xfs,
            BTreeMap::from([(naming::PARAM_MKFS.to_string(), "-L x".to_string())])
        );
        let given = BTreeMap::from([(naming::PARAM_MKFS.to_string(), "-b 4096".to_string())]);
        assert!(!d
            .class_options(&fs("ext4"), &given)
            .contains_key(naming::PARAM_MKFS));
        assert!(d.class_options(&Access::Block, &none).is_empty());
    }
}
