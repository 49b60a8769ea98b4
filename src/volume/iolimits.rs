//! Per-volume I/O limits on the node: set in the cgroup of each pod that
//! has the volume published (`node::cgroup`), at publish, at start-up heal
//! and when ControllerModifyVolume changes them; taken away at unpublish.
//! The limits live in the volume's LV tags (mutable parameters) and, for a
//! staged volume, in its node record, so a publish runs no LVM command.
//! Where a limit cannot be set (no cgroup v2, no io controller, no pod
//! cgroup) the volume is still served: its condition says the limit is
//! not enforced, and a metric counts it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::node::cgroup::{self, IoLimits, NotEnforced};
use crate::volume::Volumes;

/// (Volume id, target) -> why its limits are not enforced there.
#[derive(Default)]
pub struct Unenforced(std::sync::Mutex<BTreeMap<(String, PathBuf), String>>);

impl Unenforced {
    /// Why the volume's limits are not enforced, at each target where
    /// they are not.
    pub fn get(&self, id: &str) -> Option<String> {
        let m = self.0.lock().unwrap();
        let why: Vec<&str> = m
            .iter()
            .filter(|((v, _), _)| v == id)
            .map(|(_, w)| w.as_str())
            .collect();
        (!why.is_empty()).then(|| why.join("; "))
    }

    fn at(&self, id: &str, target: &Path) -> bool {
        self.0
            .lock()
            .unwrap()
            .contains_key(&(id.to_string(), target.to_path_buf()))
    }

    fn set(&self, id: &str, target: &Path, why: Option<String>) {
        let key = (id.to_string(), target.to_path_buf());
        let mut m = self.0.lock().unwrap();
        match why {
            Some(w) => m.insert(key, w),
            None => m.remove(&key),
        };
    }
}

impl Volumes {
    /// Sets `limits` for the volume's device `dev` in the cgroup of the
    /// pod publishing it at `target`. `was_limited`: limits were set
    /// before, so unlimited ones are written too (`max`), taking them away.
    pub(super) async fn enforce_io(
        &self,
        id: &str,
        limits: IoLimits,
        target: &Path,
        dev: (u32, u32),
        was_limited: bool,
    ) {
        if limits.is_unlimited() && !was_limited {
            self.io_unenforced.set(id, target, None);
            return;
        }
        let (root, target_path) = (self.cfg.cgroup_root.clone(), target.to_path_buf());
        let done = self
            .tools
            .blocking("set the volume's I/O limits", move || {
                Ok(set_limits(&root, &target_path, dev, &limits))
            })
            .await;
        let why = match done {
            Ok(Ok(())) => None,
            Ok(Err(NotEnforced(why))) => Some(why),
            Err(e) => Some(e.message()),
        };
        match why {
            Some(why) if !limits.is_unlimited() => {
                tracing::warn!(id, target = %target.display(), why, "I/O limits are not enforced");
                self.metrics.io_limits_unenforced();
                self.io_unenforced.set(
                    id,
                    target,
                    Some(format!(
                        "I/O limits are not enforced at {}: {why}",
                        target.display()
                    )),
                );
            }
            _ => self.io_unenforced.set(id, target, None),
        }
    }

    /// After ControllerModifyVolume set `mutable`: a volume staged here
    /// records its new limits and has them set for every publish.
    pub(super) async fn modify_io_limits(
        &self,
        id: &str,
        mutable: &BTreeMap<String, String>,
    ) -> Result<()> {
        let Some(mut record) = self.load_record(id).await? else {
            return Ok(());
        };
        let limits = IoLimits::from_params(mutable);
        let was_limited = !record.io_limits.is_unlimited();
        if record.io_limits != limits {
            record.io_limits = limits;
            self.save_record(&record).await?;
        }
        // Set again even when unchanged: a pod cgroup may exist now that
        // did not at publish.
        let Some(dev) = self.data_device(id, record.encrypted).await? else {
            return Ok(());
        };
        for p in record.publishes.iter().filter(|p| !p.removing) {
            self.enforce_io(id, limits, &p.target, dev.numbers(), was_limited)
                .await;
        }
        Ok(())
    }
}

impl Volumes {
    /// Tries again to set the limits of volume `id` at `target` where they
    /// could not be set before (kubelet may publish before it makes the
    /// pod's cgroup): NodeGetVolumeStats, which kubelet calls every
    /// minute or so, comes here first. Nothing to do, no I/O, otherwise.
    pub(super) async fn retry_io(&self, id: &str, target: &Path) -> Result<()> {
        if !self.io_unenforced.at(id, target) {
            return Ok(());
        }
        let Some(record) = self.load_record(id).await? else {
            return Ok(());
        };
        let Some(dev) = self.data_device(id, record.encrypted).await? else {
            return Ok(());
        };
        if record.publish(target).is_some_and(|p| !p.removing) {
            self.enforce_io(id, record.io_limits, target, dev.numbers(), false)
                .await;
        }
        Ok(())
    }
}

/// The pod's cgroup for `target`, and the limits written to it.
fn set_limits(
    root: &Path,
    target: &Path,
    dev: (u32, u32),
    limits: &IoLimits,
) -> std::result::Result<(), NotEnforced> {
    let uid = cgroup::pod_uid(target).ok_or_else(|| {
        NotEnforced(format!(
            "{} names no pod (kubelet's .../pods/<uid>/... or .../volumeDevices/publish/<pv>/<uid>)",
            target.display()
        ))
    })?;
    let cg = cgroup::pod_cgroup(root, &uid)?;
    cgroup::apply(&cg, dev, limits)
}
