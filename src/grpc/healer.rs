//! CSI-Addons NodeHealer: checks a staged or published volume and heals
//! what is safe to heal: an inactive LV, a missing /dev node, a missing
//! staging mount, a missing publish mount or block device node. What
//! cannot be healed (a failed or full pool, filesystem errors, a mount
//! gone read-only) is reported and left alone. The same check runs at
//! start-up for every volume staged on this node.

use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use super::node::{effective_readonly, mode, mount_flags, pool_state, NodeService};
use super::{reply, validate};
use crate::error::{Error, Result};
use crate::naming::{self, Access};
use crate::node::{self, block, fs};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::csi::v1::VolumeCapability;
use crate::proto::healer::healer_node_server::HealerNode;
use crate::proto::healer::{NodeHealerRequest, NodeHealerResponse};
use crate::sys;

/// The outcome of one check: `abnormal` when anything was wrong, whether
/// or not it could be healed, with a message saying what and what was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub abnormal: bool,
    pub message: String,
}

impl NodeService {
    /// Checks volume `id`, and heals what it safely can. `target` is the
    /// publish path, `staging` the staging path; either may be unknown.
    pub async fn heal(
        &self,
        id: &str,
        target: Option<&Path>,
        staging: Option<&Path>,
        cap: Option<&VolumeCapability>,
    ) -> Result<Verdict> {
        let d = &self.driver;
        let wanted = cap
            .map(|c| validate::capability(c, &d.cfg.default_fs_type))
            .transpose()?;
        let _held = d.inflight.try_hold(id, "NodeHealer")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        if let Some(w) = &wanted {
            naming::fits(id, vol.tags.access.as_ref(), w).map_err(Error::InvalidArgument)?;
        }
        let access = vol.tags.access.clone().or(wanted).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "volume {id} records no access type: pass volume_capability"
            ))
        })?;
        // A broken pool or LV is reported and nothing is touched.
        if let Some(p) = d.pool(&report)?.problem().or_else(|| vol.lv.problem()) {
            return Ok(Verdict {
                abnormal: true,
                message: format!("{p}; nothing was changed"),
            });
        }
        let mut found = Vec::new();
        let dev_path = PathBuf::from(d.lvm.dev_path(id));
        let node_missing = vol.lv.is_active() && std::fs::symlink_metadata(&dev_path).is_err();
        let (dev, activated) = self.activate(vol.lv, id).await?;
        if activated {
            found.push(format!(
                "LV {} was inactive: re-activated it",
                d.lvm.lv_path(id)
            ));
        } else if node_missing {
            found.push(format!(
                "device node {} was missing: re-created it",
                dev_path.display()
            ));
        }
        let staging = match staging {
            Some(s) => self.resolve(s)?,
            None => None,
        };
        let target = match target {
            Some(t) => self.resolve(t)?,
            None => None,
        };
        let mode = cap.map_or(Mode::SingleNodeWriter, mode);
        let readonly = effective_readonly(mode, false);
        let need_staging = |what: &Path| {
            staging.clone().ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "{} is missing and no staging_target_path was given to restore it from",
                    what.display()
                ))
            })
        };
        match &access {
            Access::Mount { fs_type } => {
                let table = node::mount_table()?;
                let ours = |p: &Path| {
                    table
                        .top_mount_at(p)
                        .is_some_and(|m| m.device() == dev.numbers())
                };
                if let Some(st) = staging.as_deref().filter(|st| !ours(st)) {
                    let opts = fs::MountOptions::parse(fs_type, cap.map_or(&[], mount_flags))?;
                    let pool = pool_state(d, &report);
                    fs::stage(&self.tools, &dev, st, fs_type, &opts, &pool).await?;
                    found.push(format!(
                        "staging mount at {} was missing: re-mounted it from {}",
                        st.display(),
                        dev.path.display()
                    ));
                }
                if let Some(t) = target.as_deref().filter(|t| !ours(t)) {
                    let st = need_staging(t)?;
                    fs::publish(&dev, &st, t, readonly, false)?;
                    found.push(format!(
                        "publish mount at {} was missing: re-bound it from {}",
                        t.display(),
                        st.display()
                    ));
                }
            }
            Access::Block => {
                if let Some(st) = &staging {
                    block::stage(&dev, st)?;
                }
                let published = |t: &Path| {
                    sys::device_numbers(t).ok().flatten().is_some_and(|n| {
                        matches!(
                            block::classify(n, Some(dev.numbers())),
                            block::NodeKind::Lv | block::NodeKind::Overlay(_)
                        )
                    })
                };
                if let Some(t) = target.as_deref().filter(|t| !published(t)) {
                    let st = need_staging(t)?;
                    block::publish(&self.tools, &dev, &st, t, mode, readonly).await?;
                    found.push(format!(
                        "device node at {} was missing: re-created it",
                        t.display()
                    ));
                }
            }
        }
        // What healing cannot fix: filesystem errors, error-remounts.
        for p in [&target, &staging].into_iter().flatten() {
            for problem in node::stats(&dev, p)?.problems {
                if !found.contains(&problem) {
                    found.push(problem);
                }
            }
        }
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
            "NodeHealer"
        );
        Ok(verdict)
    }

    /// Runs the check once for every volume staged on this node (from the
    /// staging tags), so a node that rebooted gets its staging mounts back.
    pub async fn heal_staged(&self) {
        let d = &self.driver;
        let report = match d.lvm.fresh_report().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "start-up heal: no LVM report");
                return;
            }
        };
        for lv in report.thin_volumes(&d.lvm.pool) {
            let Some((_, staging)) = naming::staged_path(&lv.tags) else {
                continue;
            };
            if !matches!(d.owned(&report, &lv.name), Ok(Some(_))) {
                continue;
            }
            let checked = staging
                .to_str()
                .ok_or_else(|| Error::InvalidArgument("staging path is not UTF-8".into()))
                .and_then(|s| self.path("staging_target_path", s));
            let res = match checked {
                Ok(st) => self.heal(&lv.name, None, Some(&st), None).await,
                Err(e) => Err(e),
            };
            match res {
                Ok(v) => {
                    tracing::info!(id = lv.name, staging = %staging.display(), abnormal = v.abnormal, message = v.message, "start-up heal")
                }
                Err(e) => {
                    tracing::warn!(id = lv.name, staging = %staging.display(), error = %e, "start-up heal failed")
                }
            }
        }
    }

    async fn node_healer_call(&self, req: NodeHealerRequest) -> Result<NodeHealerResponse> {
        let id = validate::existing_volume_id(&req.volume_id)?;
        let path_of = |field: &str, v: &str| -> Result<PathBuf> {
            validate::addons_path_len(field, v)?;
            self.path(field, v)
        };
        if req.volume_path.is_empty() {
            return Err(Error::InvalidArgument("volume_path is required".into()));
        }
        let target = path_of("volume_path", &req.volume_path)?;
        let staging = match req.staging_target_path.as_str() {
            "" => None,
            s => Some(path_of("staging_target_path", s)?),
        };
        let v = self
            .heal(
                id,
                Some(&target),
                staging.as_deref(),
                req.volume_capability.as_ref(),
            )
            .await?;
        Ok(NodeHealerResponse {
            abnormal: v.abnormal,
            message: v.message,
        })
    }
}

#[tonic::async_trait]
impl HealerNode for NodeService {
    async fn node_healer(
        &self,
        r: Request<NodeHealerRequest>,
    ) -> Result<Response<NodeHealerResponse>, Status> {
        reply(self.node_healer_call(r.into_inner()).await)
    }
}
