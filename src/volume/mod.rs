//! The volume layer: the one place that orchestrates. The gRPC layer hands
//! it typed values ([`request`]); it proves a volume is ours from an LVM
//! report, holds the volume's guard, and drives the LVM layer
//! (`crate::lvm`) and the node layer (`crate::node`).
//!
//! **Operations outlive their caller.** A CO cancels a call at its
//! deadline and retries it. Every mutation therefore runs as a task
//! ([`Volumes::detached`]) that holds the volume's guard until its work
//! ends: the caller's cancel only detaches the caller, a retry meets
//! ABORTED while the task runs, and the finished state afterwards (every
//! operation is idempotent). No `lvcreate` or `mkfs` is ever killed because
//! a caller left.
//!
//! Modules: [`controller`] (create, delete, expand, list, capacity),
//! [`node`] (stage, publish, unpublish, unstage, stats, expand), [`heal`]
//! (NodeHealer and the start-up heal), [`reclaim`] (ReclaimSpace),
//! [`size`] (range to LV size), [`request`] (typed request values).

pub mod autopilot;
pub mod classes;
pub mod controller;
pub mod crypt;
pub mod fill;
pub mod group;
pub mod heal;
pub mod iolimits;
pub mod metadata;
pub mod node;
pub mod reclaim;
pub mod request;
pub mod size;
pub mod snapshot;
pub mod transfer;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::guard::InFlight;
use crate::lvm::report::{Capacity, Lv, Problem, Report};
use crate::lvm::room::Room;
use crate::lvm::Lvm;
use crate::metrics::Metrics;
use crate::naming::VolumeTags;
use crate::node::record::Records;
use crate::node::Tools;
use crate::node::{self as nodefs, mounts, paths, Device};
pub use request::{Capability, NodePath, SizeRange, SnapshotId, VolumeId};

/// What is wrong with every volume of a pool alike: the pool's own
/// problem (full, failed, no metadata room) and the autopilot's refusal to
/// grow it ([`Volumes::pool_wide`]).
pub struct PoolWide {
    pool: Option<String>,
    blocked: Option<String>,
}

/// The volume layer's state: the configuration, the node id, the LVM
/// handle (with its report cache), the node layer's tools, the node
/// records, the in-flight guard, the allocation lock and the reservations
/// of creates in flight. Every operation is a method of it. The state
/// (records, guard, lock, reservations, tools, unenforced limits) is
/// private to this layer; the services read only the class's
/// configuration, node id and VG and pool names, to validate requests.
pub struct Volumes {
    pub cfg: Config,
    pub node_id: String,
    /// The device class this pool is (`None`: the top-level pool, the
    /// class named [`crate::naming::DEFAULT_CLASS`]); its ids carry it.
    pub class: Option<String>,
    pub lvm: std::sync::Arc<Lvm>,
    tools: Tools,
    /// The node records under `state_dir` (`node::record`).
    records: Records,
    inflight: InFlight,
    /// Serialises "check capacity, then allocate", so two concurrent
    /// creates cannot both pass the overprovision check.
    alloc: tokio::sync::Mutex<()>,
    /// Virtual sizes of new volumes whose `lvcreate` runs (checked under
    /// `alloc`, then made outside it, so creates overlap): counted by
    /// `Volumes::capacity` until the report shows the LV.
    reserved: Reservations,
    /// Whether thin-provisioning-tools run here (set at start-up): the
    /// SnapshotMetadata service is advertised and served only then.
    pub thin_tools: std::sync::atomic::AtomicBool,
    /// Per-RPC counts and latencies, reclaimed bytes (`crate::metrics`).
    pub metrics: std::sync::Arc<Metrics>,
    /// What the thin-pool autopilot did (`autopilot.rs`).
    pub autopilot: autopilot::AutopilotState,
    /// Volumes whose I/O limits could not be set, and why (`iolimits.rs`).
    io_unenforced: iolimits::Unenforced,
    /// The copies from other nodes filling now (`fill.rs`).
    pub(crate) copies: fill::Copies,
}

impl Volumes {
    /// The volumes of a config's top-level pool (the default class).
    pub fn new(cfg: Config, node_id: String) -> Volumes {
        Volumes::in_class(cfg, node_id, None, Default::default(), Default::default())
    }

    /// The volumes of device class `class` (`None`: the default class),
    /// served with `cfg` ([`Config::classes`]), counting into `metrics`
    /// and its changes into the node's `changes`.
    pub fn in_class(
        cfg: Config,
        node_id: String,
        class: Option<String>,
        metrics: Arc<Metrics>,
        changes: crate::lvm::Changes,
    ) -> Volumes {
        Volumes {
            lvm: std::sync::Arc::new(Lvm::counting(&cfg, changes.clone())),
            tools: Tools::new(&cfg),
            records: Records::new(&cfg.state_dir),
            cfg,
            node_id,
            class,
            inflight: InFlight::default(),
            alloc: tokio::sync::Mutex::new(()),
            reserved: Reservations {
                held: Default::default(),
                changes,
            },
            thin_tools: std::sync::atomic::AtomicBool::new(false),
            metrics,
            autopilot: Default::default(),
            io_unenforced: Default::default(),
            copies: Default::default(),
        }
    }

    /// This class's name ([`naming::DEFAULT_CLASS`] for the top-level pool).
    pub fn class_name(&self) -> &str {
        self.class
            .as_deref()
            .unwrap_or(crate::naming::DEFAULT_CLASS)
    }

    /// `name` (an LV name [`crate::naming`] made) as an id of this class.
    pub fn in_class_id(&self, name: String) -> String {
        crate::naming::in_class(self.class.as_deref(), name)
    }

    /// Whether `id` names this class ([`crate::naming::split_class`]).
    pub fn holds(&self, id: &str) -> bool {
        crate::naming::split_class(id).0 == self.class.as_deref()
    }

    /// INVALID_ARGUMENT when `id` belongs to another device class: a
    /// volume is never copied, restored or group-snapshotted across
    /// classes (each is a pool of its own).
    pub fn refuse_other_class(&self, id: &str, what: &str) -> Result<()> {
        if self.holds(id) {
            return Ok(());
        }
        let theirs = crate::naming::split_class(id)
            .0
            .unwrap_or(crate::naming::DEFAULT_CLASS);
        Err(Error::InvalidArgument(format!(
            "cannot {what} {id} of device class {theirs:?} in device class {:?}: classes are separate pools",
            self.class_name()
        ))
        .advise("keep the source and the new volume or snapshot in one device class (the StorageClass's deviceClass parameter)"))
    }

    /// Whether the SnapshotMetadata service can work on this node.
    pub fn serves_metadata(&self) -> bool {
        self.thin_tools.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn topology_key(&self) -> String {
        self.cfg.topology_key()
    }
}

/// A thin volume of our pool that carries our owner tag.
pub struct Owned<'a> {
    pub lv: &'a Lv,
    pub tags: VolumeTags,
}

/// Virtual sizes promised to creates whose `lvcreate` still runs, by LV
/// name. A reservation counts only while the report does not show its LV,
/// so a create is never counted twice, whichever of the report and the
/// reservation changes first.
/// The sizes of creates in flight, by LV name; each change counts in
/// the node's `changes` (GetCapacity counts them).
pub struct Reservations {
    held: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    changes: crate::lvm::Changes,
}

impl Reservations {
    /// Reserves `size` for LV `name` until the returned guard is dropped.
    pub fn hold(&self, name: &str, size: u64) -> Reserved<'_> {
        self.held.lock().unwrap().insert(name.to_string(), size);
        self.changes.bump();
        Reserved(self, name.to_string())
    }

    /// What the reservations add to `report`: the LVs it does not show
    /// yet, and their virtual sizes.
    pub fn pending(&self, report: &Report) -> Pending {
        self.held
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| report.find(name).is_none())
            .fold(Pending::default(), |p, (_, size)| Pending {
                lvs: p.lvs + 1,
                bytes: p.bytes + size,
            })
    }
}

/// What [`Reservations::pending`] adds to a report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pending {
    pub lvs: u64,
    pub bytes: u64,
}

/// One reservation; dropping it releases it.
pub struct Reserved<'a>(&'a Reservations, String);

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.0.held.lock().unwrap().remove(&self.1);
        self.0.changes.bump();
    }
}

/// Set when the caller of a detached operation went away. Long scans
/// (reclaim) stop at the next step; everything else runs to its end.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    fn set(&self) {
        self.0.store(true, Ordering::Relaxed)
    }
    /// The flag itself, for blocking loops in the node layer.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// Sets the [`Cancel`] of a detached operation when the caller's future is
/// dropped before the operation ended.
struct CancelOnDrop(Option<Cancel>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.set();
        }
    }
}

impl Volumes {
    /// Runs a mutation of volume `id` as a task that holds the volume's
    /// guard until it ends; see the module documentation. A second call
    /// for the same volume meanwhile gets ABORTED.
    pub async fn detached<T, F, Fut>(
        self: &Arc<Self>,
        id: &str,
        what: &'static str,
        op: F,
    ) -> Result<T>
    where
        F: FnOnce(Arc<Volumes>, Cancel) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        // The guard lives as long as the task and as long as any blocking
        // step the task started and stopped waiting for (`blocking::keeping`).
        let held: crate::blocking::Token = Arc::new(self.inflight.try_hold(id, what)?);
        let cancel = Cancel::default();
        let work = op(self.clone(), cancel.clone());
        let key = id.to_string();
        let task = tokio::spawn(async move {
            let res = crate::blocking::keeping(held, work).await;
            if let Err(e) = &res {
                tracing::debug!(id = key, what, error = %e, "operation failed");
            }
            res
        });
        let mut on_drop = CancelOnDrop(Some(cancel));
        let res = task
            .await
            .map_err(|e| Error::Internal(format!("{what} task failed: {e}")));
        on_drop.0 = None;
        res?
    }

    /// Waits, at most `bound`, until no operation holds a volume; logs
    /// what it waited for and what it left running.
    pub async fn drain(&self, bound: std::time::Duration) {
        let start = std::time::Instant::now();
        let mut logged = false;
        loop {
            let busy = self.inflight.busy();
            if busy.is_empty() {
                if logged {
                    tracing::info!(waited = ?start.elapsed(), "shutdown: running operations finished");
                }
                return;
            }
            if start.elapsed() >= bound {
                tracing::warn!(
                    ?busy,
                    ?bound,
                    "shutdown: operations still running; stopping anyway"
                );
                return;
            }
            if !logged {
                tracing::info!(?busy, "shutdown: waiting for running operations to finish");
                logged = true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Looks `id` up in `report` and proves it is ours: a thin LV of our
    /// pool with our owner tag. A foreign LV is FAILED_PRECONDITION and is
    /// never touched.
    pub fn owned<'a>(&self, report: &'a Report, id: &str) -> Result<Option<Owned<'a>>> {
        let Some(lv) = report.find(id) else {
            return Ok(None);
        };
        match self.owned_lv(lv) {
            Some(o) => Ok(Some(o)),
            None if self.filling_here(lv).is_some() => Err(Error::NotFound(format!(
                "volume {id} is being copied from another node: it is not served until the copy is whole"
            ))
            .advise("wait for the CreateVolume that makes it to answer, or delete the volume to stop the copy")),
            None => Err(self.foreign(id, "thin volume")),
        }
    }

    /// The offset `lv`'s filling tag records, when it is a copy this
    /// driver fills in its pool and class (`volume/fill.rs`).
    pub(crate) fn filling_here(&self, lv: &Lv) -> Option<u64> {
        let (at, driver) = crate::naming::filling(&lv.tags)?;
        (driver == self.cfg.driver_name
            && lv.is_thin_volume()
            && lv.pool == self.lvm.pool
            && self.holds(&lv.name))
        .then_some(at)
    }

    /// `lv` with its decoded tags, when it is a volume of ours.
    pub(crate) fn owned_lv<'a>(&self, lv: &'a Lv) -> Option<Owned<'a>> {
        VolumeTags::decode(&lv.name, lv.tags.iter().map(String::as_str))
            .filter(|tags| self.ours(lv, &tags.owner))
            .map(|tags| Owned { lv, tags })
    }

    /// The tag every LV of this driver carries.
    pub(crate) fn owner_tag(&self) -> String {
        format!("{}{}", crate::naming::TAG_OWNER, self.cfg.driver_name)
    }

    /// A thin LV of our pool with our owner.
    pub(crate) fn ours(&self, lv: &Lv, owner: &str) -> bool {
        owner == self.cfg.driver_name
            && lv.is_thin_volume()
            && lv.pool == self.lvm.pool
            && self.holds(&lv.name)
    }

    /// An LV named like one of ours that is not: never touched.
    pub(crate) fn foreign(&self, id: &str, what: &str) -> Error {
        Error::FailedPrecondition(format!(
            "LV {} exists but is not a {what} owned by {} in pool {}; it is left alone",
            self.lvm.lv_path(id),
            self.cfg.driver_name,
            self.lvm.pool
        ))
        .advise("check the id: this driver acts only on thin LVs of its pool that carry its owner tag; rename or remove that LV by hand if it is in the way")
    }

    /// Like [`Volumes::owned`], but a missing volume is NOT_FOUND.
    pub fn must_own<'a>(&self, report: &'a Report, id: &str) -> Result<Owned<'a>> {
        self.owned(report, id)?
            .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist")))
    }

    /// The pool's LV, or UNAVAILABLE when it is missing.
    pub fn pool<'a>(&self, report: &'a Report) -> Result<&'a Lv> {
        report
            .find(&self.lvm.pool)
            .filter(|lv| lv.is_thin_pool())
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "thin pool {} not found",
                    self.lvm.lv_path(&self.lvm.pool)
                ))
            })
    }

    /// Capacity left in the pool, and the extent size. Creates still
    /// running count with their reserved size until `report` shows them.
    pub fn capacity(&self, report: &Report) -> Result<(Capacity, u64)> {
        let pool = self.pool(report)?;
        let virtual_sum: u64 = report
            .thin_volumes(&self.lvm.pool)
            .map(|lv| lv.size)
            .sum::<u64>()
            + self.reserved.pending(report).bytes;
        let mut cap = Capacity::compute(
            pool.size,
            pool.data_percent.unwrap_or(0.0),
            self.cfg.overprovision_ratio,
            virtual_sum,
        );
        // What the autopilot may still add counts as the pool's: the
        // headroom is that of the pool as large as it may grow.
        let room = self.autopilot_room(pool);
        if room > 0 {
            cap.physical_free += room;
            cap.virtual_headroom = Capacity::compute(
                pool.size + room,
                0.0,
                self.cfg.overprovision_ratio,
                virtual_sum,
            )
            .virtual_headroom;
        }
        Ok((cap, pool.vg_extent_size))
    }

    /// What is wrong with the volume, its pool (also: the autopilot cannot
    /// grow it) or its I/O limits (not enforced), joined; `None` when
    /// healthy.
    pub fn problem(&self, report: &Report, lv: &Lv) -> Option<String> {
        self.problem_with(lv, &self.pool_wide(report))
    }

    /// What is wrong with every volume of the pool alike, looked up once
    /// for a page of volumes.
    pub fn pool_wide(&self, report: &Report) -> PoolWide {
        PoolWide {
            pool: self
                .pool_problem(report)
                .ok()
                .flatten()
                .map(|p| p.to_string()),
            blocked: self.autopilot.blocked(),
        }
    }

    /// [`Volumes::problem`], given what is wrong pool-wide.
    pub fn problem_with(&self, lv: &Lv, wide: &PoolWide) -> Option<String> {
        let storage = lv.problem().map(|p| p.to_string());
        let all: Vec<String> = storage
            .or_else(|| wide.pool.clone())
            .into_iter()
            .chain(wide.blocked.clone())
            .chain(self.io_unenforced.get(&lv.name))
            .collect();
        (!all.is_empty()).then(|| all.join("; "))
    }

    /// Refuses allocation in a pool that cannot take it: one that is
    /// full, failed or read-only, or whose metadata (or the VG's) has no
    /// room for another LV.
    pub(crate) fn check_pool_usable(&self, report: &Report) -> Result<()> {
        match self.pool_problem(report)? {
            Some(p) => Err(p.error(None)),
            None => Ok(()),
        }
    }

    /// Refuses `new` LVs more than the pool's or the VG's metadata holds
    /// with `metadata_reserve_lvs` to spare.
    pub(crate) fn check_room(&self, report: &Report, new: u64) -> Result<()> {
        match self.room_problem(report, new) {
            Some(p) => Err(p.error(None)),
            None => Ok(()),
        }
    }

    /// What stops a new LV in the pool, `None` when nothing does.
    pub fn pool_problem(&self, report: &Report) -> Result<Option<Problem>> {
        Ok(self
            .pool(report)?
            .problem()
            .or_else(|| self.room_problem(report, 1)))
    }

    /// What a metrics scrape shows of this class, from `report`.
    pub fn scrape<'a>(&self, report: &'a Report) -> crate::metrics::Scrape<'a> {
        let pool = match (self.pool(report), self.capacity(report)) {
            (Ok(lv), Ok((cap, _))) => Some(crate::metrics::PoolFigures {
                lv,
                physical_free: cap.physical_free,
                virtual_headroom: cap.virtual_headroom,
                usable: self.check_pool_usable(report).is_ok(),
                room: self.room(report),
            }),
            _ => None,
        };
        crate::metrics::Scrape {
            pool,
            volumes: self.owned_volumes(report).len(),
            snapshots: self.owned_snapshots(report).len(),
            autopilot: self.autopilot_figures(),
        }
    }

    /// Room in the pool's metadata and the VG's metadata area, counting
    /// LVs made or reserved since `report` was read; `None` while the
    /// pool shows no Metadata% (inactive).
    pub fn room(&self, report: &Report) -> Option<Room> {
        let pool = self.pool(report).ok()?;
        let made_since = report.added_since_read() + self.reserved.pending(report).lvs;
        Some(Room::estimate(
            pool.metadata_size,
            pool.metadata_percent?,
            pool.vg_mda_size,
            pool.vg_mda_free,
            report.mean_thin_text(&self.lvm.pool),
            made_since,
        ))
    }

    fn room_problem(&self, report: &Report, new: u64) -> Option<Problem> {
        let room = self.room(report)?;
        let reserve = self.cfg.metadata_reserve_lvs;
        room.short_of(new, reserve)
            .map(|s| room.problem(s, &self.lvm.vg, &self.lvm.pool, reserve))
    }

    /// The report to allocate on, once the pool is shown to take new
    /// allocations. A cached report that says it cannot is checked again on
    /// a fresh one: the pool may have been extended or space reclaimed
    /// since.
    pub(crate) async fn usable_report(&self) -> Result<Arc<Report>> {
        let report = self.lvm.known().await?;
        if self.check_pool_usable(&report).is_ok() {
            return Ok(report);
        }
        let fresh = self.lvm.fresh_report().await?;
        self.check_pool_usable(&fresh)?;
        Ok(fresh)
    }

    /// Probe's work: bring back a pool left half active (by an LVM command
    /// stopped mid-way), within a bound. What the pool cannot do is not
    /// Probe's answer (see `grpc::identity`): readiness and the failing
    /// calls report it, so it is only logged at DEBUG here.
    pub async fn probe(&self) -> Result<()> {
        let res = self.bring_pool_up().await;
        if let Err(e) = &res {
            tracing::debug!(class = self.class_name(), error = %e.message(), "Probe: the pool is not usable");
        }
        res
    }

    async fn bring_pool_up(&self) -> Result<()> {
        let report = self.lvm.report().await?;
        if self.pool(&report)?.is_active() {
            return Ok(());
        }
        // Never beside a create (which activates the pool itself): looked
        // at again once no create runs. Probe answers within its bound
        // whatever runs meanwhile.
        let Ok(_alloc) =
            tokio::time::timeout(std::time::Duration::from_secs(2), self.alloc.lock()).await
        else {
            return Ok(());
        };
        let fresh = self.lvm.fresh_report().await?;
        if !self.pool(&fresh)?.is_active() {
            crate::pool::repair_half_active(&self.lvm).await?;
        }
        Ok(())
    }

    /// The real location of a checked path; `None` when its parent is
    /// missing.
    pub async fn resolve(&self, path: &Path) -> Result<Option<PathBuf>> {
        let (p, roots) = (path.to_path_buf(), self.cfg.allowed_roots.clone());
        self.tools
            .blocking("resolve a path", move || {
                Ok(match paths::resolve(&p, &roots)? {
                    paths::Resolved::At(p) => Some(p),
                    paths::Resolved::ParentMissing => None,
                })
            })
            .await
    }

    /// [`Volumes::resolve`] of a path the request may leave out.
    pub async fn resolve_optional(&self, path: Option<&NodePath>) -> Result<Option<PathBuf>> {
        match path {
            Some(p) => self.resolve(p).await,
            None => Ok(None),
        }
    }

    /// The volume's device when its LV is active (no /dev changes).
    pub fn current_device(&self, lv: &Lv) -> Option<Device> {
        let (major, minor) = lv.kernel.filter(|_| lv.is_active())?;
        Some(Device {
            volume_id: lv.name.clone(),
            path: PathBuf::from(self.lvm.dev_path(&lv.name)),
            major,
            minor,
        })
    }

    /// The volume's device when its LV is active, as device-mapper says
    /// (one ioctl, no LVM command, whatever the cached report says).
    pub async fn live_device(&self, id: &str) -> Result<Option<Device>> {
        Ok(self
            .lvm
            .live_device(id)
            .await?
            .map(|(major, minor)| Device {
                volume_id: id.to_string(),
                path: PathBuf::from(self.lvm.dev_path(id)),
                major,
                minor,
            }))
    }

    /// Activates the LV when needed and returns its device, with the /dev
    /// node in place. The bool says whether this call activated it.
    pub async fn activate(&self, lv: &Lv) -> Result<(Device, bool)> {
        let id = lv.name.as_str();
        // The kernel, not the cached report, says whether it is active.
        let (kernel, activated) = match self.lvm.live_device(id).await? {
            Some(k) => (k, false),
            None => {
                let k = self.lvm.activate(id).await?;
                tracing::info!(id, major = k.0, minor = k.1, "activated LV");
                (k, true)
            }
        };
        let dev_path = PathBuf::from(self.lvm.dev_path(id));
        let id_owned = id.to_string();
        let dev = self
            .tools
            .blocking("create the LV's /dev node", move || {
                nodefs::ensure_dev_node(&id_owned, &dev_path, kernel)
            })
            .await?;
        Ok((dev, activated))
    }

    /// Deactivates the LV when nothing uses it any more; a failure is
    /// logged, not returned (the LV merely stays active).
    pub async fn deactivate_if_unused(&self, dev: &Device) {
        let d = dev.clone();
        match self
            .tools
            .blocking("check whether the LV is in use", move || {
                nodefs::device_unused(&d)
            })
            .await
        {
            Ok(true) => match self.lvm.deactivate(&dev.volume_id).await {
                Ok(()) => tracing::info!(id = dev.volume_id, "deactivated LV"),
                Err(e) => {
                    tracing::warn!(id = dev.volume_id, error = %e, "could not deactivate LV; it stays active")
                }
            },
            Ok(false) => tracing::info!(
                id = dev.volume_id,
                "LV still in use on this node; it stays active"
            ),
            Err(e) => {
                tracing::warn!(id = dev.volume_id, error = %e, "cannot tell whether the LV is in use; it stays active")
            }
        }
    }

    /// What staging needs to know of the pool in `report`, and whether
    /// the volume was made from a source.
    pub fn stage_facts(&self, report: &Report, vol: &Owned) -> mounts::StageFacts {
        let pool = self.pool(report).ok();
        mounts::StageFacts {
            // A crypt mapping over zeroed chunks reads their decryption,
            // not zeros: mkfs must write its tables.
            zeroes_new_chunks: !vol.tags.encrypted && pool.is_some_and(Lv::zeroes_new_chunks),
            problem: pool.and_then(Lv::problem),
            made_from_source: vol.tags.from.is_some(),
            // Set by a filesystem stage, from the volume's tags.
            mkfs: Default::default(),
            // Set by the stage of an encrypted volume.
            under: None,
            luks_written: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::time::Duration;

    /// A reservation counts until its LV shows in the report, never twice,
    /// and goes with its guard.
    #[test]
    fn reservations_count_until_the_report_shows_the_volume() {
        let pool = r#"{"lv_name":"pool","vg_name":"vg","lv_attr":"twi-aotz--","lv_size":"1073741824","pool_lv":"","segtype":"thin-pool","data_percent":"0","metadata_percent":"0","lv_tags":"","lv_health_status":"","lv_kernel_major":"253","lv_kernel_minor":"1","vg_extent_size":"4194304","vg_size":"2147483648","vg_free":"0","chunk_size":"65536"}"#;
        let mut report = Report::parse(&format!(r#"{{"report":[{{"lv":[{pool}]}}]}}"#)).unwrap();
        let d = Volumes::new(
            Config {
                volume_group: "vg".into(),
                thin_pool: "pool".into(),
                overprovision_ratio: 1.0,
                ..Config::default()
            },
            "n".into(),
        );
        let headroom = |r: &Report| d.capacity(r).unwrap().0.virtual_headroom;
        assert_eq!(headroom(&report), 1 << 30);
        let a = d.reserved.hold("csi-a", 100 << 20);
        let b = d.reserved.hold("csi-b", 200 << 20);
        assert_eq!(headroom(&report), (1 << 30) - (300 << 20));
        // csi-a is made: the report counts it, its reservation no more.
        report.apply(&crate::lvm::report::Write::CreatedThin {
            name: "csi-a".into(),
            pool: "pool".into(),
            size: 100 << 20,
            tags: vec![],
            read_ahead: None,
        });
        assert_eq!(headroom(&report), (1 << 30) - (300 << 20));
        drop(a);
        assert_eq!(headroom(&report), (1 << 30) - (300 << 20));
        // csi-b failed: its reservation goes and nothing is counted.
        drop(b);
        assert_eq!(headroom(&report), (1 << 30) - (100 << 20));
    }

    /// The caller's cancel detaches the caller only: the operation runs to
    /// its end holding the guard (a retry meanwhile is ABORTED), and sees
    /// that its caller left.
    #[tokio::test]
    async fn detached_operations_outlive_their_caller() {
        let d = Arc::new(Volumes::new(Config::default(), "n1".into()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = d.detached("vol", "Test", |_, cancel| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = tx.send(cancel.is_cancelled());
            Ok(())
        });
        assert!(tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err());
        let retry = d.detached("vol", "Retry", |_, _| async { Ok(()) }).await;
        assert!(matches!(retry, Err(Error::Aborted(_))), "{retry:?}");
        assert!(rx.await.unwrap(), "the operation saw its caller leave");
        // The guard is released when the operation ends, not before.
        d.detached("vol", "Retry", |_, _| async { Ok(()) })
            .await
            .unwrap();
    }

    /// Shutdown waits for an operation whose caller left, and gives up at
    /// its bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drain_waits_for_abandoned_operations_within_its_bound() {
        let d = Arc::new(Volumes::new(Config::default(), "n1".into()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let call = d.detached("vol", "Test", |_, _| async move {
            let _ = rx.await;
            Ok(())
        });
        assert!(tokio::time::timeout(Duration::from_millis(20), call)
            .await
            .is_err());
        // Still running: the drain gives up at its bound.
        d.drain(Duration::from_millis(100)).await;
        assert_eq!(d.inflight.busy(), ["vol"]);
        tx.send(()).unwrap();
        d.drain(Duration::from_secs(30)).await;
        assert!(d.inflight.busy().is_empty());
    }

    /// A blocking step that outlived its bound keeps the volume busy until
    /// it returns: no retry runs beside a stuck unmount.
    #[tokio::test]
    async fn a_stalled_step_keeps_the_volume_busy() {
        let d = Arc::new(Volumes::new(Config::default(), "n1".into()));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let res = d
            .detached("vol", "Test", |_, _| async move {
                crate::blocking::run("stuck", Duration::from_millis(50), move || {
                    let _ = rx.recv();
                    Ok(())
                })
                .await
            })
            .await;
        assert!(matches!(res, Err(Error::Stalled { .. })), "{res:?}");
        let retry = d.detached("vol", "Retry", |_, _| async { Ok(()) }).await;
        assert!(matches!(retry, Err(Error::Aborted(_))), "{retry:?}");
        tx.send(()).unwrap();
        let mut tries = 0;
        while d
            .detached("vol", "Retry", |_, _| async { Ok(()) })
            .await
            .is_err()
        {
            tries += 1;
            assert!(tries < 1000, "the guard was never released");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_caller_that_waits_is_not_cancelled() {
        let d = Arc::new(Volumes::new(Config::default(), "n1".into()));
        let cancelled = d
            .detached("vol", "Test", |_, c| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(c.is_cancelled())
            })
            .await
            .unwrap();
        assert!(!cancelled);
    }
}
