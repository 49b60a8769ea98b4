//! CSI-Addons services on their own socket: Identity and ReclaimSpace
//! (node and controller sides).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{reply, validate};
use crate::error::{Error, Result};
use crate::proto::identity::capability::{self, encryption_key_rotation, reclaim_space, service};
use crate::proto::identity::identity_server::Identity;
use crate::proto::identity::*;
use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceController;
use crate::proto::reclaimspace::reclaim_space_node_server::ReclaimSpaceNode;
use crate::proto::reclaimspace::*;
use crate::volume::classes::Classes;

pub struct AddonsService {
    pub classes: Arc<Classes>,
}

fn consumption(bytes: u64) -> Option<StorageConsumption> {
    Some(StorageConsumption {
        usage_bytes: bytes as i64,
    })
}

impl AddonsService {
    async fn node_reclaim(&self, req: NodeReclaimSpaceRequest) -> Result<NodeReclaimSpaceResponse> {
        let id = validate::existing_volume_id(&req.volume_id, self.classes.ids())?;
        if req.volume_path.is_empty() && req.staging_target_path.is_empty() {
            return Err(Error::InvalidArgument(
                "volume_path or staging_target_path is required".into(),
            ));
        }
        validate::addons_path_len("volume_path", &req.volume_path)?;
        validate::addons_path_len("staging_target_path", &req.staging_target_path)?;
        // The paths are checked but not used: the volume layer finds the
        // mount from the mount table by the LV's device numbers.
        let r = self.classes.of(&id)?.node_reclaim(id).await?;
        Ok(NodeReclaimSpaceResponse {
            pre_usage: consumption(r.pre),
            post_usage: consumption(r.post),
        })
    }

    async fn controller_reclaim(
        &self,
        req: ControllerReclaimSpaceRequest,
    ) -> Result<ControllerReclaimSpaceResponse> {
        let id = validate::existing_volume_id(&req.volume_id, self.classes.ids())?;
        validate::opaque_parameters(&req.parameters)?;
        let r = self.classes.of(&id)?.controller_reclaim(id).await?;
        Ok(ControllerReclaimSpaceResponse {
            pre_usage: consumption(r.pre),
            post_usage: consumption(r.post),
        })
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
    let rotation = Capability {
        r#type: Some(capability::Type::EncryptionKeyRotation(
            capability::EncryptionKeyRotation {
                r#type: encryption_key_rotation::Type::Encryptionkeyrotation as i32,
            },
        )),
    };
    vec![
        svc(service::Type::ControllerService),
        svc(service::Type::NodeService),
        reclaim(reclaim_space::Type::Offline),
        reclaim(reclaim_space::Type::Online),
        rotation,
    ]
}

#[tonic::async_trait]
impl Identity for AddonsService {
    async fn get_identity(
        &self,
        _r: Request<GetIdentityRequest>,
    ) -> Result<Response<GetIdentityResponse>, Status> {
        Ok(Response::new(GetIdentityResponse {
            name: self.classes.base().cfg.driver_name.clone(),
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
        // As the CSI Probe (`grpc::identity`).
        self.classes.probe().await;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
