//! CSI-Addons services on their own socket: Identity and ReclaimSpace
//! (node and controller sides).

use std::path::PathBuf;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{reply, validate};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::lvm::report::round_up;
use crate::naming::Access;
use crate::node::reclaim;
use crate::proto::identity::capability::{self, reclaim_space, service};
use crate::proto::identity::identity_server::Identity;
use crate::proto::identity::*;
use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceController;
use crate::proto::reclaimspace::reclaim_space_node_server::ReclaimSpaceNode;
use crate::proto::reclaimspace::*;

pub struct AddonsService {
    pub driver: Arc<Driver>,
}

impl Driver {
    /// Bytes the volume has allocated in the pool (size × Data%), from a
    /// fresh `lvs` report.
    pub async fn usage(&self, id: &str) -> Result<u64> {
        let report = self.lvm.fresh_report().await?;
        let vol = self.must_own(&report, id)?;
        vol.lv.allocated_bytes().ok_or_else(|| {
            Error::Internal(format!("lvs reports no Data% for {}", self.lvm.lv_path(id)))
        })
    }
}

fn consumption(bytes: u64) -> Option<StorageConsumption> {
    Some(StorageConsumption {
        usage_bytes: bytes as i64,
    })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("reclaim task failed: {e}")))?
}

impl AddonsService {
    async fn node_reclaim(&self, req: NodeReclaimSpaceRequest) -> Result<NodeReclaimSpaceResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        if req.volume_path.is_empty() && req.staging_target_path.is_empty() {
            return Err(Error::InvalidArgument(
                "volume_path or staging_target_path is required".into(),
            ));
        }
        validate::addons_path_len("volume_path", &req.volume_path)?;
        validate::addons_path_len("staging_target_path", &req.staging_target_path)?;
        let _held = d.inflight.try_hold(id, "NodeReclaimSpace")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        let Some((major, minor)) = vol.lv.kernel else {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is not active on this node, so nothing is staged to trim; use ControllerReclaimSpace"
            )));
        };
        // The paths in the request are not trusted: the mount is found from
        // the mount table by the LV's own device numbers.
        let Some((mountpoint, fs)) = reclaim::fs_mount_of(major, minor)? else {
            return Err(match vol.tags.access {
                Some(Access::Block) => Error::Unimplemented(format!(
                    "volume {id} is a raw block volume in use: a whole-device discard would destroy live data; \
                     reclaim it with ControllerReclaimSpace while nothing uses it"
                )),
                _ => Error::FailedPrecondition(format!(
                    "volume {id} is active but its filesystem is not mounted on this node"
                )),
            });
        };
        let pre = vol.lv.allocated_bytes().unwrap_or(0);
        let trimmed = blocking(move || reclaim::trim_filesystem(&mountpoint, &fs)).await?;
        let post = d.usage(id).await?;
        tracing::info!(id, pre, post, trimmed, "NodeReclaimSpace: trimmed");
        Ok(NodeReclaimSpaceResponse {
            pre_usage: consumption(pre),
            post_usage: consumption(post),
        })
    }

    async fn controller_reclaim(
        &self,
        req: ControllerReclaimSpaceRequest,
    ) -> Result<ControllerReclaimSpaceResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?.to_string();
        validate::parameters(&req.parameters, &d.lvm.vg, &d.lvm.pool)?;
        let _held = d.inflight.try_hold(&id, "ControllerReclaimSpace")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, &id)?;
        if vol.lv.is_open() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is in use on this node (its device is open); \
                 reclaim it with NodeReclaimSpace, or when nothing uses it"
            )));
        }
        let access = vol.tags.access.clone();
        let pool_chunk = d.pool(&report)?.chunk_size.max(512);
        let was_active = vol.lv.is_active();
        if !was_active {
            d.lvm.activate(&id).await?;
        }
        // An LV that was active already has its usage in this report.
        let known_pre = vol.lv.allocated_bytes().filter(|_| was_active);
        let res = self
            .reclaim_unused(&id, access, pool_chunk, known_pre)
            .await;
        if !was_active {
            if let Err(e) = d.lvm.deactivate(&id).await {
                tracing::warn!(id, error = %e, "ControllerReclaimSpace: could not deactivate again");
            }
        }
        let (pre, post) = res?;
        Ok(ControllerReclaimSpaceResponse {
            pre_usage: consumption(pre),
            post_usage: consumption(post),
        })
    }

    /// The reclaim itself, on an active LV nothing else uses.
    async fn reclaim_unused(
        &self,
        id: &str,
        access: Option<Access>,
        chunk: u64,
        known_pre: Option<u64>,
    ) -> Result<(u64, u64)> {
        let d = &self.driver;
        let dev = PathBuf::from(d.lvm.dev_path(id));
        let pre = match known_pre {
            Some(p) => p,
            None => d.usage(id).await?,
        };
        match access {
            Some(Access::Mount { fs_type }) => {
                let dir = d.cfg.state_dir.join("reclaim").join(id);
                let trimmed = blocking(move || {
                    reclaim::trim_unmounted(&dev, &fs_type, &dir).map_err(|e| match e {
                        Error::Sys(s) if s.op() == "mount" => Error::FailedPrecondition(format!(
                            "cannot mount the volume's {fs_type} filesystem to trim it (was it ever staged?): {s}"
                        )),
                        other => other,
                    })
                })
                .await?;
                tracing::info!(
                    id,
                    trimmed,
                    "ControllerReclaimSpace: trimmed unmounted filesystem"
                );
            }
            Some(Access::Block) => {
                let run = round_up(d.cfg.reclaim_zero_run.max(chunk), chunk).unwrap_or(chunk);
                let discarded = blocking(move || reclaim::discard_zero_runs(&dev, run)).await?;
                tracing::info!(
                    id,
                    run,
                    discarded,
                    "ControllerReclaimSpace: discarded zero runs"
                );
            }
            None => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} carries no access type tag; refusing to guess how to reclaim it"
                )))
            }
        }
        let post = d.usage(id).await?;
        Ok((pre, post))
    }
}

#[tonic::async_trait]
impl ReclaimSpaceNode for AddonsService {
    async fn node_reclaim_space(
        &self,
        r: Request<NodeReclaimSpaceRequest>,
    ) -> Result<Response<NodeReclaimSpaceResponse>, Status> {
        reply(self.node_reclaim(r.into_inner()).await)
    }
}

#[tonic::async_trait]
impl ReclaimSpaceController for AddonsService {
    async fn controller_reclaim_space(
        &self,
        r: Request<ControllerReclaimSpaceRequest>,
    ) -> Result<Response<ControllerReclaimSpaceResponse>, Status> {
        reply(self.controller_reclaim(r.into_inner()).await)
    }
}

/// What this process serves: it is both the controller and the node
/// plugin of its node, so both sides of ReclaimSpace.
pub fn capabilities() -> Vec<Capability> {
    let svc = |t: service::Type| Capability {
        r#type: Some(capability::Type::Service(capability::Service {
            r#type: t as i32,
        })),
    };
    let reclaim = |t: reclaim_space::Type| Capability {
        r#type: Some(capability::Type::ReclaimSpace(capability::ReclaimSpace {
            r#type: t as i32,
        })),
    };
    vec![
        svc(service::Type::ControllerService),
        svc(service::Type::NodeService),
        reclaim(reclaim_space::Type::Offline),
        reclaim(reclaim_space::Type::Online),
    ]
}

#[tonic::async_trait]
impl Identity for AddonsService {
    async fn get_identity(
        &self,
        _r: Request<GetIdentityRequest>,
    ) -> Result<Response<GetIdentityResponse>, Status> {
        Ok(Response::new(GetIdentityResponse {
            name: self.driver.cfg.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_capabilities(
        &self,
        _r: Request<GetCapabilitiesRequest>,
    ) -> Result<Response<GetCapabilitiesResponse>, Status> {
        Ok(Response::new(GetCapabilitiesResponse {
            capabilities: capabilities(),
        }))
    }

    async fn probe(&self, _r: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.driver
            .probe()
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
