//! The device classes of this node: one [`Volumes`] per thin pool, the
//! top-level pool keys being the class named `default`
//! ([`naming::DEFAULT_CLASS`]) and each of `device_classes` one more. A
//! request finds its class by the `deviceClass` parameter (CreateVolume,
//! GetCapacity) or by its volume or snapshot id, which carries the class
//! ([`naming::split_class`]); a class this node does not serve is refused
//! before any LVM command. Calls that span classes (ListVolumes,
//! ListSnapshots, the metrics) ask each class and merge.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::controller::VolumeInfo;
use super::snapshot::SnapshotInfo;
use super::Volumes;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::naming;

/// One page of a listing and the token of the next ("" after the last).
type Page<T> = (Vec<T>, String);

/// A device class `name` that is not among a node's `names`:
/// INVALID_ARGUMENT naming those it has.
pub fn unknown_class(name: &str, names: &[&str]) -> Error {
    Error::InvalidArgument(format!(
        "device class {name:?} is not one of this node's: {names:?}"
    ))
    .advise("set the StorageClass parameter deviceClass to one of the classes listed, or add the class to the driver's config (device_classes)")
}

pub struct Classes {
    /// The default class's `Volumes` first, then the others by name.
    all: Vec<Arc<Volumes>>,
    /// Index in `all` of `default_device_class`.
    default: usize,
    /// The classes the last Probe found down, so a change is logged once.
    down: Mutex<BTreeSet<String>>,
    /// This node's key in ids, minted while `[cluster]` is on.
    ids: naming::NodeIds,
    /// What the node's snapshot reads for copies share (the cap).
    transfers: Arc<super::transfer::Transfers>,
}

impl Classes {
    pub fn new(cfg: &Config, node_id: &str) -> Classes {
        let metrics: Arc<Metrics> = Default::default();
        let changes = crate::lvm::Changes::default();
        let all: Vec<Arc<Volumes>> = cfg
            .classes()
            .into_iter()
            .map(|(class, c)| {
                Arc::new(Volumes::in_class(
                    c,
                    node_id.to_string(),
                    class,
                    metrics.clone(),
                    changes.clone(),
                ))
            })
            .collect();
        let default = all
            .iter()
            .position(|v| v.class_name() == cfg.default_device_class)
            .expect("default_device_class is validated with the config");
        Classes {
            all,
            default,
            down: Mutex::default(),
            ids: naming::NodeIds::new(node_id, cfg.cluster_listen_addr().ok().flatten().is_some()),
            transfers: Arc::new(super::transfer::Transfers::new(
                cfg.cluster.transfer_mib_per_sec,
            )),
        }
    }

    /// `Transfer.Read` of snapshot `id` from byte `start`, in its class,
    /// under the node's cap (`Volumes::read_snapshot`).
    pub async fn read_snapshot(
        &self,
        id: super::SnapshotId,
        start: u64,
        base: Option<super::SnapshotId>,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<super::transfer::Piece>>> {
        self.of(&id)?
            .read_snapshot(id, start, base, self.transfers.clone(), stopping)
            .await
    }

    /// What every snapshot read of the node shares, its grants to peers
    /// included.
    pub fn transfers(&self) -> &super::transfer::Transfers {
        &self.transfers
    }

    /// `Transfer.Grant` of snapshot `id`'s reads to a peer for `ttl`: the
    /// token, its life, and what a copy must agree with (NOT_FOUND for a
    /// snapshot that is not here).
    pub async fn grant(
        &self,
        id: super::SnapshotId,
        base: Option<super::SnapshotId>,
        ttl: std::time::Duration,
    ) -> Result<(String, std::time::Duration, super::fill::SourceFacts)> {
        let facts = self.of(&id)?.snapshot_facts(&id).await?;
        let (token, ttl) = self.transfers.grant(id.as_str(), base.as_deref(), ttl)?;
        Ok((token, ttl, facts))
    }

    /// `Transfer.Grant` for a clone named `clone_name` of volume `id` on
    /// another node: the read-only snapshot taken for it
    /// ([`Volumes::clone_source`]), and its grant as [`Classes::grant`]'s.
    pub async fn grant_clone(
        &self,
        id: super::VolumeId,
        clone_name: String,
        ttl: std::time::Duration,
    ) -> Result<(
        super::SnapshotId,
        String,
        std::time::Duration,
        super::fill::SourceFacts,
    )> {
        let snap = self.of(&id)?.clone_source(id, clone_name).await?;
        let snap = super::SnapshotId::new_unchecked(snap);
        let (token, ttl, facts) = self.grant(snap.clone(), None, ttl).await?;
        Ok((snap, token, ttl, facts))
    }

    /// `Transfer.Hash`: [`Volumes::hash_whole`] of snapshot or volume `id`.
    pub async fn hash_whole(
        &self,
        id: &str,
        what: super::transfer::HashOf,
    ) -> Result<(u64, Vec<[u8; 32]>)> {
        self.of(id)?
            .hash_whole(id, what, self.transfers.clone())
            .await
    }

    /// `Transfer.Release`: [`Volumes::release_clone_sources`].
    pub async fn release_clone(&self, id: super::VolumeId, clone_name: String) -> Result<usize> {
        self.of(&id)?.release_clone_sources(id, clone_name).await
    }

    /// The index in [`Classes::all`] of `default_device_class`.
    pub fn default_index(&self) -> usize {
        self.default
    }

    /// The node's change counter, which every class counts into.
    pub fn changes(&self) -> &crate::lvm::Changes {
        &self.base().lvm.changes
    }

    /// How this node reads and writes node keys in ids.
    pub fn ids(&self) -> &naming::NodeIds {
        &self.ids
    }

    /// Every class, the top-level one first.
    pub fn all(&self) -> &[Arc<Volumes>] {
        &self.all
    }

    /// The class made of the top-level keys: what every class shares
    /// (driver name, node id, sockets, state_dir, counters) is read here.
    pub fn base(&self) -> &Arc<Volumes> {
        &self.all[0]
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.base().metrics
    }

    pub fn names(&self) -> Vec<&str> {
        self.all.iter().map(|v| v.class_name()).collect()
    }

    /// The class a StorageClass names (`None`: `default_device_class`);
    /// a class this node does not have is INVALID_ARGUMENT naming those it
    /// has.
    pub fn named(&self, name: Option<&str>) -> Result<&Arc<Volumes>> {
        let Some(name) = name else {
            return Ok(&self.all[self.default]);
        };
        self.all
            .iter()
            .find(|v| v.class_name() == name)
            .ok_or_else(|| unknown_class(name, &self.names()))
    }

    /// The class that holds volume or snapshot `id`, if this node serves
    /// it.
    fn find(&self, id: &str) -> Option<&Arc<Volumes>> {
        self.all.iter().find(|v| v.holds(id))
    }

    /// Why `id`'s class is not served here.
    fn unserved(&self, id: &str) -> String {
        let name = naming::split_class(id).0.unwrap_or(naming::DEFAULT_CLASS);
        format!(
            "{id} does not exist here: its device class {name:?} is not one this node serves ({:?})",
            self.names()
        )
    }

    /// The class that holds volume or snapshot `id` (of a shape this
    /// driver issues); one this node does not serve is NOT_FOUND.
    pub fn of(&self, id: &str) -> Result<&Arc<Volumes>> {
        self.find(id).ok_or_else(|| {
            Error::NotFound(self.unserved(id))
                .advise("check the id, or add the device class back to the driver's config (device_classes) if its volumes are still on this node")
        })
    }

    /// [`Classes::of`] for a delete: a class this node no longer serves
    /// may still have the LVs here, so it is FAILED_PRECONDITION (the CO
    /// keeps its record and retries), not the "already gone" a delete of
    /// an unknown id gets.
    pub fn of_to_delete(&self, id: &str) -> Result<&Arc<Volumes>> {
        self.find(id).ok_or_else(|| {
            Error::FailedPrecondition(self.unserved(id))
                .advise("add the device class back to the driver's config (device_classes), or remove its LVs by hand and then the CO's objects")
        })
    }

    /// The default filesystem for a request about `id`: its class's, or
    /// the top-level pool's while the id is unknown or its class is not
    /// served (a request is checked whole before its id is looked up).
    pub fn default_fs(&self, id: Option<&str>) -> &str {
        let class = id.and_then(|id| self.find(id)).unwrap_or(self.base());
        &class.cfg.default_fs_type
    }

    /// Probe's work for every class; a class whose pool is not usable is
    /// logged by name when that changes (Probe's answer stays ready: see
    /// `grpc::identity`).
    pub async fn probe(&self) {
        let mut down = BTreeSet::new();
        for v in &self.all {
            if let Err(e) = v.probe().await {
                down.insert(format!("{}: {}", v.class_name(), e.message()));
            }
        }
        let mut last = self.down.lock().unwrap();
        if *last != down {
            if down.is_empty() {
                tracing::info!("Probe: every device class's pool is usable again");
            } else {
                tracing::warn!(down = ?down, "Probe: device classes whose pool is not usable; the others serve");
            }
            *last = down;
        }
    }

    /// The Prometheus exposition: every class's pool from its cached
    /// report (no LVM command while it is current), then the counters.
    pub async fn exposition(&self) -> String {
        let mut reports = Vec::new();
        for v in &self.all {
            let r = v.lvm.report().await;
            if let Err(e) = &r {
                tracing::warn!(class = v.class_name(), error = %e, "metrics: no LVM report; pool figures left out");
            }
            reports.push(r.ok());
        }
        let scrapes: Vec<_> = self
            .all
            .iter()
            .zip(&reports)
            .map(|(v, r)| (v.class_name(), r.as_deref().map(|r| v.scrape(r))))
            .collect();
        crate::metrics::render(&scrapes, self.metrics())
    }

    /// ListVolumes across the classes: each class's first `max` after
    /// `token`, merged in id order. A class whose pool is unavailable is
    /// left out (logged), so the others still list.
    pub async fn list_volumes(&self, token: &str, max: usize) -> Result<(Vec<VolumeInfo>, String)> {
        let mut pages = Vec::new();
        for v in &self.all {
            pages.push((v.class_name(), v.list_volumes(token, max).await));
        }
        self.merge(pages, max, |i| &i.id)
    }

    /// ListSnapshots across the classes (only the class of `snapshot` or
    /// `source` when one is given), as [`Classes::list_volumes`] does.
    pub async fn list_snapshots(
        &self,
        snapshot: Option<&str>,
        source: Option<&str>,
        token: &str,
        max: usize,
    ) -> Result<(Vec<SnapshotInfo>, String)> {
        let mut pages = Vec::new();
        for v in &self.all {
            if snapshot.or(source).is_some_and(|id| !v.holds(id)) {
                continue;
            }
            pages.push((
                v.class_name(),
                v.list_snapshots(snapshot, source, token, max).await,
            ));
        }
        self.merge(pages, max, |s| &s.id)
    }

    /// One page of at most `max` (0: all) from the classes' pages, in id
    /// order; the token is the page's last id, so it stays valid across
    /// creates and deletes in any class.
    fn merge<T>(
        &self,
        pages: Vec<(&str, Result<Page<T>>)>,
        max: usize,
        id: impl Fn(&T) -> &String,
    ) -> Result<Page<T>> {
        let mut all = Vec::new();
        let mut more = false;
        for (class, page) in pages {
            match page {
                Ok((items, next)) => {
                    more |= !next.is_empty();
                    all.extend(items);
                }
                Err(e) if e.code() == tonic::Code::Unavailable && self.all.len() > 1 => {
                    tracing::warn!(class, error = %e, "listing leaves out a device class whose pool is unavailable");
                }
                Err(e) => return Err(e),
            }
        }
        all.sort_by(|a, b| id(a).cmp(id(b)));
        if max > 0 && all.len() > max {
            all.truncate(max);
            more = true;
        }
        let next = if more {
            all.last().map(|t| id(t).clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok((all, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn classes() -> Classes {
        let cfg = Config::parse(
            r#"
lvm_binary = "/nonexistent/lvm"
default_device_class = "fast"
[[device_classes]]
name = "fast"
volume_group = "nvme"
[[device_classes]]
name = "slow"
volume_group = "hdd"
"#,
        )
        .unwrap();
        Classes::new(&cfg, "n1")
    }

    #[test]
    fn requests_find_their_class_and_nothing_else() {
        let c = classes();
        assert_eq!(c.names(), ["default", "fast", "slow"]);
        assert_eq!(c.named(None).unwrap().class_name(), "fast");
        assert_eq!(c.named(Some("slow")).unwrap().lvm.vg, "hdd");
        let e = c.named(Some("ssd")).err().unwrap();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains("\"ssd\"") && e.to_string().contains("slow"),
            "{e}"
        );
        let id = crate::naming::lv_name_for("pvc-1");
        assert_eq!(c.of(&id).unwrap().class_name(), "default");
        assert_eq!(c.of(&format!("slow.{id}")).unwrap().lvm.vg, "hdd");
        let e = c.of(&format!("gone.{id}")).err().unwrap();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
        // Each class makes ids of its own, and holds only those.
        let fast = c.named(Some("fast")).unwrap();
        let made = fast.in_class_id(id.clone());
        assert_eq!(made, format!("fast.{id}"));
        assert!(fast.holds(&made) && !fast.holds(&id));
        assert!(fast.refuse_other_class(&made, "copy").is_ok());
        let e = fast.refuse_other_class(&id, "copy").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    }

    #[test]
    fn pages_merge_across_classes_in_id_order() {
        let c = classes();
        let page = |ids: &[&str], next: &str| {
            Ok((
                ids.iter().map(|s| s.to_string()).collect(),
                next.to_string(),
            ))
        };
        // Each class's first two after the token; the merge keeps two.
        let (items, next) = c
            .merge(
                vec![
                    ("default", page(&["csi-b", "csi-d"], "csi-d")),
                    ("fast", page(&["fast.csi-a"], "")),
                    ("slow", page(&["slow.csi-c", "slow.csi-e"], "")),
                ],
                2,
                |s| s,
            )
            .unwrap();
        assert_eq!(items, ["csi-b", "csi-d"]);
        assert_eq!(next, "csi-d");
        // All fit: no token.
        let (items, next) = c
            .merge(
                vec![
                    ("default", page(&["csi-b"], "")),
                    ("fast", page(&["fast.csi-a"], "")),
                ],
                0,
                |s| s,
            )
            .unwrap();
        assert_eq!((items.len(), next.as_str()), (2, ""));
        // A class whose pool is unavailable is left out; any other error is
        // the answer.
        let (items, _) = c
            .merge(
                vec![
                    ("default", page(&["csi-b"], "")),
                    (
                        "fast",
                        Err(Error::Unavailable("vg gone".into()).advise("create it")),
                    ),
                ],
                0,
                |s| s,
            )
            .unwrap();
        assert_eq!(items, ["csi-b"]);
        assert!(c
            .merge(
                vec![("fast", Err::<Page<String>, _>(Error::Internal("x".into())))],
                0,
                |s| s
            )
            .is_err());
    }
}
