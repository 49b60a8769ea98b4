//! Group snapshots: one read-only thin snapshot of each member volume,
//! taken while the others stand still, so the set is crash-consistent.
//! Each member snapshot carries the group's id and size in a tag
//! (`tpcsi.group=<id>:<n>`), so Get and Delete work after a restart and a
//! group is known complete only when all `n` members exist.
//!
//! **Write-order consistency** (the spec's MUST, "or fail"). Members are
//! snapshotted one `lvcreate` at a time, so every member but one must stand
//! still from the first snapshot to the last; the one left then takes its
//! snapshot at an instant when all the others held what theirs hold.
//! - An inactive member cannot change.
//! - A member mounted on this node is frozen (FIFREEZE) for the whole group,
//!   but only where LVM's own freeze of the origin (device-mapper's lockfs,
//!   taken by its suspend) nests inside ours: Linux 6.8 and later. Before
//!   6.8 that suspend fails with EBUSY on a frozen filesystem, and a thaw
//!   around each `lvcreate` would let an earlier member change between its
//!   snapshot and the next one's.
//! - Suspending the origins ourselves is no way round it: LVM then skips
//!   its own suspend and, with it, the pool message that makes the
//!   snapshot (measured: "unexpected transaction id").
//! - Any other active member cannot be held still.
//!
//! More than one member that cannot be held still is FAILED_PRECONDITION,
//! with the members named. The freeze is bounded by [`FREEZE_BOUND`]: past
//! it every member is thawed and the group is refused, never left frozen.
//! Every error path thaws every member and removes the group's snapshots.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::snapshot::{OwnedSnapshot, SnapshotInfo};
use super::VolumeId;
use crate::error::{Error, Result};
use crate::lvm::report::Report;
use crate::naming::{self, GroupTag, SnapshotTags};
use crate::node::{freeze, Tools};
use crate::volume::Volumes;

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

/// Who thaws: the freeze step runs on a blocking thread that may outlive
/// its bound, so "thaw now" and "the freeze finished" are decided under
/// one lock. Whoever comes second thaws: a late freeze is never left
/// standing, and nobody thaws a filesystem while it is being frozen.
#[derive(Default)]
struct Turn {
    /// The freeze step returned.
    done: bool,
    /// A thaw was asked for (an error, the watchdog, or the end).
    thaw: bool,
}

/// The frozen filesystems of a group, thawed on every path: by
/// [`Frozen::thaw_all`], by the watchdog at [`FREEZE_BOUND`], or, when the
/// driver was killed meanwhile, at its next start (the freeze record).
pub(super) struct Frozen {
    tools: Tools,
    record: PathBuf,
    points: Vec<freeze::MountOf>,
    turn: Arc<std::sync::Mutex<Turn>>,
    expired: Arc<AtomicBool>,
    watchdog: tokio::task::JoinHandle<()>,
}

impl Frozen {
    /// Records, then freezes, each mount point. On failure it thaws what
    /// it froze itself, and only that: a filesystem someone else froze
    /// (EBUSY) is left to them.
    pub(super) async fn freeze_all(
        tools: &Tools,
        record: PathBuf,
        points: Vec<freeze::MountOf>,
    ) -> Result<Frozen> {
        let expired = Arc::new(AtomicBool::new(false));
        let turn = Arc::new(std::sync::Mutex::new(Turn::default()));
        let watchdog = {
            let (tools, record, points, expired, turn) = (
                tools.clone(),
                record.clone(),
                points.clone(),
                expired.clone(),
                turn.clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep(FREEZE_BOUND).await;
                expired.store(true, Ordering::SeqCst);
                tracing::error!(bound = ?FREEZE_BOUND, "group snapshot: freeze lasted too long; thawing every member");
                thaw_when_done(&tools, &turn, record, points).await;
            })
        };
        if !points.is_empty() {
            let (r, p, t) = (record.clone(), points.clone(), turn.clone());
            let frozen = tools
                .blocking("freeze the group's filesystems", move || {
                    let res = freeze::freeze_recorded(&r, &p);
                    let mut turn = t.lock().unwrap();
                    turn.done = true;
                    if turn.thaw && res.is_ok() {
                        // Asked to thaw while still freezing: ours to do.
                        freeze::thaw_recorded(&r, &p);
                    }
                    res
                })
                .await;
            if let Err(e) = frozen {
                watchdog.abort();
                // Failed: it thawed its own. Stalled: it thaws when done.
                turn.lock().unwrap().thaw = true;
                return Err(e);
            }
        } else {
            turn.lock().unwrap().done = true;
        }
        Ok(Frozen {
            tools: tools.clone(),
            record,
            points,
            turn,
            expired,
            watchdog,
        })
    }

    /// Whether the bound passed (every member was thawed then).
    pub(super) fn expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }

    pub(super) async fn thaw_all(self) {
        self.watchdog.abort();
        thaw_when_done(&self.tools, &self.turn, self.record, self.points).await;
    }
}

/// Asks for the thaw; does it when the freeze step is done (otherwise
/// that step does it as it ends).
async fn thaw_when_done(
    tools: &Tools,
    turn: &std::sync::Mutex<Turn>,
    record: PathBuf,
    points: Vec<freeze::MountOf>,
) {
    let done = {
        let mut t = turn.lock().unwrap();
        t.thaw = true;
        t.done
    };
    if done {
        thaw_each(tools, record, points).await;
    }
}

async fn thaw_each(tools: &Tools, record: PathBuf, points: Vec<freeze::MountOf>) {
    if points.is_empty() {
        return;
    }
    let res = tools
        .blocking("thaw the group's filesystems", move || {
            freeze::thaw_recorded(&record, &points);
            Ok(())
        })
        .await;
    if let Err(e) = res {
        tracing::error!(error = %e, "could not thaw the group's filesystems");
    }
}

/// Whether every member a group's tags announce exists.
fn complete(members: &[OwnedSnapshot]) -> bool {
    members.iter().all(|m| {
        m.tags
            .group
            .as_ref()
            .is_some_and(|g| g.members == members.len())
    })
}

/// A member volume as the consistency rule sees it.
#[derive(Debug, Clone)]
struct Member {
    id: String,
    active: bool,
    mounted: bool,
    /// Its filesystem is on a crypt mapping above the LV: LVM's suspend
    /// of the LV freezes nothing there, so our freeze never nests.
    encrypted: bool,
}

impl Member {
    /// A mounted filesystem we can freeze for the whole group: with
    /// freezes that nest (`nests`), or above the LV LVM suspends.
    fn freezable(&self, nests: bool) -> bool {
        self.mounted && (nests || self.encrypted)
    }
}

/// The members that could change while the group's snapshots are taken:
/// active, and not a filesystem we can freeze ([`Member::freezable`]). At
/// most one may remain.
fn cannot_hold_still(members: &[Member], nests: bool) -> Vec<String> {
    members
        .iter()
        .filter(|m| m.active && !m.freezable(nests))
        .map(|m| m.id.clone())
        .collect()
}

impl Volumes {
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
        let id = self.in_class_id(naming::group_id_for(&co_name));
        self.detached(
            &id.clone(),
            "CreateVolumeGroupSnapshot",
            move |d, _| async move { d.group_held(&id, &co_name, &sources).await },
        )
        .await
    }

    async fn group_held(&self, id: &str, co_name: &str, sources: &[VolumeId]) -> Result<GroupInfo> {
        for s in sources {
            self.refuse_other_class(s.as_str(), "snapshot together with")?;
        }
        let wanted: BTreeSet<&str> = sources.iter().map(|s| s.as_str()).collect();
        let report = self.lvm.fresh_report().await?;
        let members = self.group_members(&report, id);
        if !members.is_empty() {
            let have: BTreeSet<&str> = members.iter().map(|m| m.tags.source.as_str()).collect();
            let complete = complete(&members);
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
        self.check_room(&report, vols.len() as u64)?;
        let (cap, _) = self.capacity(&report)?;
        let total: u64 = vols.iter().map(|v| v.lv.size).sum();
        self.check_headroom("a group snapshot", total, &cap)?;
        // Where each member is mounted on this node, if it is.
        // (An encrypted member's filesystem is on its crypt mapping.)
        let mut numbers: Vec<Option<(u32, u32)>> = Vec::new();
        for v in &vols {
            numbers.push(match v.tags.encrypted {
                true => self
                    .data_device(&v.lv.name, true)
                    .await?
                    .map(|d| d.numbers()),
                false => self.current_device(v.lv).map(|d| d.numbers()),
            });
        }
        let points: Vec<Option<freeze::MountOf>> = self
            .tools
            .blocking("find the members' mounts", move || {
                numbers
                    .into_iter()
                    .map(|n| n.map(freeze::mounted_at).transpose().map(Option::flatten))
                    .collect()
            })
            .await?;
        let nests = freeze::freezes_nest();
        let members: Vec<Member> = vols
            .iter()
            .zip(&points)
            .map(|(v, p)| Member {
                id: v.lv.name.clone(),
                active: v.lv.is_active(),
                mounted: p.is_some(),
                encrypted: v.tags.encrypted,
            })
            .collect();
        let unheld = cannot_hold_still(&members, nests);
        if unheld.len() > 1 {
            return Err(Error::FailedPrecondition(format!(
                "group snapshot {co_name:?}: volumes {unheld:?} are in use and cannot be held still together{}, \
                 so their snapshots could not be write-order consistent",
                if nests {
                    " (only mounted filesystems can be frozen)"
                } else {
                    " on this kernel (before Linux 6.8, LVM cannot snapshot a filesystem frozen by anyone else)"
                }
            ))
            .advise("stop (unstage) all but one of them, or snapshot them one by one"));
        }
        let to_freeze: Vec<freeze::MountOf> = members
            .iter()
            .zip(&points)
            .filter(|(m, _)| m.freezable(nests))
            .filter_map(|(_, p)| p.clone())
            .collect();
        let record = self.cfg.state_dir.join("frozen").join(id);
        let frozen = Frozen::freeze_all(&self.tools, record, to_freeze).await?;
        let mut made = Vec::new();
        let mut res = Ok(());
        for vol in &vols {
            let name = self.in_class_id(naming::group_member_name(co_name, &vol.lv.name));
            let tags = SnapshotTags {
                owner: self.cfg.driver_name.clone(),
                co_name: naming::member_co_name(co_name, &vol.lv.name),
                source: vol.lv.name.clone(),
                access: vol.tags.access.clone(),
                group: Some(GroupTag {
                    id: id.to_string(),
                    members: vols.len(),
                }),
                encrypted: vol.tags.encrypted,
            };
            // An lvcreate that failed may still have made the LV: the
            // clean-up below removes every member the group has.
            made.push(name.clone());
            if let Err(e) = self
                .lvm
                .create_snapshot(&name, &vol.lv.name, &tags.encode(), false, None)
                .await
            {
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
                 thawed, and the snapshots made were removed"
            )));
        }
        if let Err(e) = res {
            tracing::warn!(id, error = %e, ?made, "CreateVolumeGroupSnapshot failed; removing the snapshots it made");
            if let Err(undo) = self.remove_members(id).await {
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

    /// Removes every member snapshot group `id` has, as a fresh report
    /// shows them.
    async fn remove_members(&self, id: &str) -> Result<()> {
        let report = self.lvm.fresh_report().await?;
        let names: Vec<String> = self
            .group_members(&report, id)
            .iter()
            .map(|m| m.lv.name.clone())
            .collect();
        self.remove_all(&names).await
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
        // The list is REQUIRED, but csi-sanity (and so some COs) send
        // none: then there is nothing to check against.
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
        if !complete(&members) {
            return Err(Error::NotFound(format!(
                "group snapshot {id} is incomplete (its creation was interrupted)"
            ))
            .advise(
                "call CreateVolumeGroupSnapshot again with the same name: that makes it whole",
            ));
        }
        Ok(GroupInfo::of(id, &members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, active: bool, mounted: bool) -> Member {
        Member {
            id: id.into(),
            active,
            mounted,
            encrypted: false,
        }
    }

    #[test]
    fn only_one_member_may_be_left_free_to_change() {
        let idle = [m("a", false, false), m("b", false, false)];
        assert!(cannot_hold_still(&idle, false).is_empty());
        let one_in_use = [
            m("a", true, true),
            m("b", false, false),
            m("c", false, false),
        ];
        assert_eq!(cannot_hold_still(&one_in_use, false), ["a"]);
        let mounted = [m("a", true, true), m("b", true, true), m("c", false, false)];
        // Before 6.8 neither mount can be frozen across the other's lvcreate.
        assert_eq!(cannot_hold_still(&mounted, false), ["a", "b"]);
        // With nesting freezes both are held still.
        assert!(cannot_hold_still(&mounted, true).is_empty());
        // An active raw block member can never be frozen.
        let block = [m("a", true, true), m("b", true, false), m("c", true, false)];
        assert_eq!(cannot_hold_still(&block, true), ["b", "c"]);
        // Encrypted filesystems are frozen above the LV: no nesting needed.
        let crypt = |id| Member {
            encrypted: true,
            ..m(id, true, true)
        };
        assert!(cannot_hold_still(&[crypt("a"), crypt("b")], false).is_empty());
        assert_eq!(
            cannot_hold_still(&[crypt("a"), m("b", true, true)], false),
            ["b"]
        );
    }
}
