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

/// Which sides of CSI-Addons a process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sides {
    /// A node plugin alone: it is the controller of its node too.
    Both,
    /// A node plugin of a cluster whose controller serves the other side:
    /// so the csi-addons lease holder is the controller.
    Node,
    /// The cluster's controller (`thinpool-csi controller`).
    Controller,
}

/// What a process serving `sides` advertises: CONTROLLER_SERVICE with
/// ReclaimSpace OFFLINE (ControllerReclaimSpace), NODE_SERVICE with
/// ReclaimSpace ONLINE (NodeReclaimSpace) and key rotation.
pub fn capabilities(sides: Sides) -> Vec<Capability> {
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
    let controller = [
        svc(service::Type::ControllerService),
        reclaim(reclaim_space::Type::Offline),
    ];
    let node = [
        svc(service::Type::NodeService),
        reclaim(reclaim_space::Type::Online),
        rotation,
    ];
    match sides {
        Sides::Both => controller.into_iter().chain(node).collect(),
        Sides::Node => node.into(),
        Sides::Controller => controller.into(),
    }
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
            capabilities: capabilities(if self.classes.ids().mints() {
                Sides::Node
            } else {
                Sides::Both
            }),
        }))
    }

    async fn probe(&self, _r: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // As the CSI Probe (`grpc::identity`).
        self.classes.probe().await;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn services(sides: Sides) -> Vec<i32> {
        capabilities(sides)
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(capability::Type::Service(s)) => Some(s.r#type),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn on_a_cluster_the_controller_alone_takes_the_csi_addons_lease() {
        let (c, n) = (
            service::Type::ControllerService as i32,
            service::Type::NodeService as i32,
        );
        assert_eq!(services(Sides::Both), [c, n]);
        assert_eq!(services(Sides::Node), [n]);
        assert_eq!(services(Sides::Controller), [c]);
    }
}
