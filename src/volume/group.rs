//! Group snapshots: one read-only thin snapshot of each member volume,
//! taken while the others stand still, so the set is crash-consistent.
//! Each member snapshot carries the group's id and size in a tag
//! (`tpcsi.group=<id>:<n>`), so Get and Delete work after a restart and a
//! group is known complete only when all `n` members exist.
//!
//! **Freezing.** Every member mounted on this node is frozen (FIFREEZE)
//! before the first snapshot and thawed after the last. LVM freezes a
//! mounted origin itself while it snapshots it, and on kernels before 6.6
//! that freeze cannot nest inside ours (the suspend fails with EBUSY), so
//! each member is thawed just for its own `lvcreate` and frozen again
//! right after. The others stay frozen meanwhile; the one gap is between
//! LVM's thaw of a member and our freeze of it again. The whole freeze is
//! bounded by [`FREEZE_BOUND`]: past it every member is thawed and the
//! group is refused, never left frozen. Every error path thaws every
//! member and removes the snapshots already made.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::snapshot::{OwnedSnapshot, SnapshotInfo};
use super::VolumeId;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::lvm::report::Report;
use crate::naming::{self, GroupTag, SnapshotTags};
use crate::node::{fs, Tools};

/// The longest the members of a group stay frozen.
pub const FREEZE_BOUND: Duration = Duration::from_secs(60);

/// What the controller reports of a group snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    pub id: String,
    pub snapshots: Vec<SnapshotInfo>,
    pub created: Option<i64>,
}

impl GroupInfo {
    fn of(id: &str, members: &[OwnedSnapshot]) -> GroupInfo {
        GroupInfo {
            id: id.to_string(),
            snapshots: members.iter().map(SnapshotInfo::of).collect(),
            created: members.iter().filter_map(|m| m.lv.created).min(),
        }
    }
}

/// The frozen filesystems of a group, thawed on every path: by
/// [`Frozen::thaw_all`], or by the watchdog at [`FREEZE_BOUND`].
struct Frozen {
    tools: Tools,
    points: Vec<PathBuf>,
    expired: Arc<AtomicBool>,
    watchdog: tokio::task::JoinHandle<()>,
}

impl Frozen {
    /// Freezes each mount point; thaws the ones it froze if one fails.
    async fn freeze_all(tools: &Tools, points: Vec<PathBuf>) -> Result<Frozen> {
        let expired = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let (tools, points, expired) = (tools.clone(), points.clone(), expired.clone());
            tokio::spawn(async move {
                tokio::time::sleep(FREEZE_BOUND).await;
                expired.store(true, Ordering::SeqCst);
                tracing::error!(bound = ?FREEZE_BOUND, "group snapshot: freeze lasted too long; thawing every member");
                thaw_each(&tools, &points).await;
            })
        };
        let frozen = Frozen {
            tools: tools.clone(),
            points: points.clone(),
            expired,
            watchdog,
        };
        for p in &points {
            if let Err(e) = frozen.freeze(p).await {
                frozen.thaw_all().await;
                return Err(e);
            }
        }
        Ok(frozen)
    }

    async fn freeze(&self, p: &Path) -> Result<()> {
        let p = p.to_path_buf();
        self.tools
            .blocking("freeze a filesystem", move || fs::freeze(&p))
            .await
    }

    async fn thaw(&self, p: &Path) -> Result<()> {
        thaw_one(&self.tools, p).await
    }

    /// Whether the bound passed (every member was thawed then).
    fn expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }

    async fn thaw_all(self) {
        self.watchdog.abort();
        thaw_each(&self.tools, &self.points).await;
    }
}

async fn thaw_one(tools: &Tools, p: &Path) -> Result<()> {
    let p = p.to_path_buf();
    tools
        .blocking("thaw a filesystem", move || fs::thaw(&p).map(drop))
        .await
}

async fn thaw_each(tools: &Tools, points: &[PathBuf]) {
    for p in points {
        if let Err(e) = thaw_one(tools, p).await {
            tracing::error!(mountpoint = %p.display(), error = %e, "could not thaw a group member");
        }
    }
}

impl Driver {
    /// The member snapshots of group `id`, sorted by name.
    fn group_members<'a>(&self, report: &'a Report, id: &str) -> Vec<OwnedSnapshot<'a>> {
        self.owned_snapshots(report)
            .into_iter()
            .filter(|s| s.tags.group.as_ref().is_some_and(|g| g.id == id))
            .collect()
    }

    /// CreateVolumeGroupSnapshot; idempotent by name. A group left half
    /// made (the driver was stopped) is removed and made again whole.
    pub async fn create_group(
        self: &Arc<Self>,
        co_name: String,
        sources: Vec<VolumeId>,
    ) -> Result<GroupInfo> {
        let id = naming::group_id_for(&co_name);
        self.detached(
            &id.clone(),
            "CreateVolumeGroupSnapshot",
            move |d, _| async move { d.group_held(&id, &co_name, &sources).await },
        )
        .await
    }

    async fn group_held(&self, id: &str, co_name: &str, sources: &[VolumeId]) -> Result<GroupInfo> {
        let wanted: BTreeSet<&str> = sources.iter().map(|s| s.as_str()).collect();
        let report = self.lvm.fresh_report().await?;
        let members = self.group_members(&report, id);
        if !members.is_empty() {
            let have: BTreeSet<&str> = members.iter().map(|m| m.tags.source.as_str()).collect();
            let complete = members.iter().all(|m| {
                m.tags
                    .group
                    .as_ref()
                    .is_some_and(|g| g.members == members.len())
            });
            if complete && have == wanted {
                tracing::info!(
                    id,
                    "CreateVolumeGroupSnapshot: already exists, returning it"
                );
                return Ok(GroupInfo::of(id, &members));
            }
            if complete {
                return Err(Error::AlreadyExists(format!(
                    "group snapshot {co_name:?} exists as {id} of volumes {have:?}, not {wanted:?}"
                )));
            }
            let names: Vec<String> = members.iter().map(|m| m.lv.name.clone()).collect();
            tracing::warn!(
                id,
                ?names,
                "CreateVolumeGroupSnapshot: a half-made group; removing it to make it again whole"
            );
            self.remove_all(&names).await?;
        }
        // Every member stays as it is (not staged, deleted or grown).
        let _held = sources
            .iter()
            .map(|s| self.inflight.try_hold(s, "CreateVolumeGroupSnapshot of it"))
            .collect::<Result<Vec<_>>>()?;
        let _alloc = self.alloc.lock().await;
        let report = self.lvm.fresh_report().await?;
        let vols = sources
            .iter()
            .map(|s| self.must_own(&report, s))
            .collect::<Result<Vec<_>>>()?;
        self.check_pool_usable(&report)?;
        let (cap, _) = self.capacity(&report)?;
        let total: u64 = vols.iter().map(|v| v.lv.size).sum();
        if total > cap.virtual_headroom {
            return Err(Error::ResourceExhausted(format!(
                "a group snapshot adds {total} bytes of virtual size, but thin pool {} can hand out only {} more",
                self.lvm.lv_path(&self.lvm.pool),
                cap.virtual_headroom
            )));
        }
        // Where each member is mounted on this node, if it is.
        let numbers: Vec<Option<(u32, u32)>> = vols
            .iter()
            .map(|v| self.current_device(v.lv).map(|d| d.numbers()))
            .collect();
        let points: Vec<Option<PathBuf>> = self
            .tools
            .blocking("find the members' mounts", move || {
                numbers
                    .into_iter()
                    .map(|n| n.map(fs::mounted_at).transpose().map(Option::flatten))
                    .collect()
            })
            .await?;
        let frozen =
            Frozen::freeze_all(&self.tools, points.iter().flatten().cloned().collect()).await?;
        let mut made = Vec::new();
        let mut res = Ok(());
        for (vol, point) in vols.iter().zip(&points) {
            let name = naming::group_member_name(co_name, &vol.lv.name);
            let tags = SnapshotTags {
                owner: self.cfg.driver_name.clone(),
                co_name: naming::member_co_name(co_name, &vol.lv.name),
                source: vol.lv.name.clone(),
                access: vol.tags.access.clone(),
                group: Some(GroupTag {
                    id: id.to_string(),
                    members: vols.len(),
                }),
            };
            // LVM freezes a mounted origin itself: ours is lifted for it.
            let step = async {
                if let Some(p) = point {
                    frozen.thaw(p).await?;
                }
                let created = self
                    .lvm
                    .create_snapshot(&name, &vol.lv.name, &tags.encode(), false, None)
                    .await;
                if created.is_ok() {
                    made.push(name.clone());
                }
                let refrozen = match point {
                    Some(p) => frozen.freeze(p).await,
                    None => Ok(()),
                };
                created.and(refrozen)
            };
            if let Err(e) = step.await {
                res = Err(e);
                break;
            }
            if frozen.expired() {
                break;
            }
        }
        let expired = frozen.expired();
        frozen.thaw_all().await;
        if res.is_ok() && expired {
            res = Err(Error::DeadlineExceeded(format!(
                "the members of group snapshot {co_name:?} stayed frozen longer than {FREEZE_BOUND:?}: \
                 thawed, and the snapshots made were removed; retry"
            )));
        }
        if let Err(e) = res {
            tracing::warn!(id, error = %e, ?made, "CreateVolumeGroupSnapshot failed; removing the snapshots it made");
            if let Err(undo) = self.remove_all(&made).await {
                tracing::error!(id, error = %undo, "could not remove every snapshot of a failed group; a retry removes them");
            }
            return Err(e);
        }
        tracing::info!(
            id,
            members = made.len(),
            "CreateVolumeGroupSnapshot: created"
        );
        let report = self.lvm.fresh_report().await?;
        Ok(GroupInfo::of(id, &self.group_members(&report, id)))
    }

    async fn remove_all(&self, names: &[String]) -> Result<()> {
        for n in names {
            self.lvm.remove(n).await?;
        }
        Ok(())
    }

    /// The members of group `id`, checked against the ids the CO names
    /// (INVALID_ARGUMENT when they differ).
    fn members_named<'a>(
        &self,
        report: &'a Report,
        id: &str,
        named: &[String],
    ) -> Result<Vec<OwnedSnapshot<'a>>> {
        let members = self.group_members(report, id);
        let have: BTreeSet<&str> = members.iter().map(|m| m.lv.name.as_str()).collect();
        let said: BTreeSet<&str> = named.iter().map(String::as_str).collect();
        if !said.is_empty() && !members.is_empty() && have != said {
            return Err(Error::InvalidArgument(format!(
                "group snapshot {id} holds snapshots {have:?}, not {said:?}"
            )));
        }
        Ok(members)
    }

    /// DeleteVolumeGroupSnapshot: every member goes; gone is success.
    pub async fn delete_group(self: &Arc<Self>, id: String, named: Vec<String>) -> Result<()> {
        self.detached(
            &id.clone(),
            "DeleteVolumeGroupSnapshot",
            move |d, _| async move {
                let report = d.lvm.fresh_report().await?;
                let names: Vec<String> = d
                    .members_named(&report, &id, &named)?
                    .iter()
                    .map(|m| m.lv.name.clone())
                    .collect();
                d.remove_all(&names).await?;
                tracing::info!(id, removed = names.len(), "DeleteVolumeGroupSnapshot: done");
                Ok(())
            },
        )
        .await
    }

    /// GetVolumeGroupSnapshot.
    pub async fn get_group(&self, id: &str, named: &[String]) -> Result<GroupInfo> {
        let report = self.lvm.report().await?;
        let members = self.members_named(&report, id, named)?;
        if members.is_empty() {
            return Err(Error::NotFound(format!(
                "group snapshot {id} does not exist"
            )));
        }
        Ok(GroupInfo::of(id, &members))
    }
}
