//! The cluster controller's CSI services (`thinpool-csi controller`,
//! docs/cluster.md): Identity answers for the controller itself; each
//! Controller call the nodes serve is forwarded by `crate::cluster::Cluster`
//! to the node that holds its object, and the node's answer passes
//! through. ControllerPublishVolume and ControllerUnpublishVolume, which no
//! node implements, are answered UNIMPLEMENTED here.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::controller::{capabilities_response, publish_unimplemented};
use crate::cluster::forward::Relay;
use crate::cluster::Cluster;
use crate::proto::csi::v1::controller_server::Controller;
use crate::proto::csi::v1::group_controller_server::GroupController;
use crate::proto::csi::v1::identity_server::Identity;
use crate::proto::csi::v1::snapshot_metadata_server::SnapshotMetadata;
use crate::proto::csi::v1::*;
use crate::proto::identity::identity_server::Identity as AddonsIdentity;
use crate::proto::identity::{
    GetCapabilitiesRequest, GetCapabilitiesResponse, GetIdentityRequest, GetIdentityResponse,
};
use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceController;
use crate::proto::reclaimspace::{ControllerReclaimSpaceRequest, ControllerReclaimSpaceResponse};

pub struct ForwardService {
    pub cluster: Arc<Cluster>,
}

type Reply<T> = Result<Response<T>, Status>;

/// Node ids for a manifest value: comma-separated.
fn ids(ids: impl IntoIterator<Item = String>) -> String {
    ids.into_iter().collect::<Vec<_>>().join(",")
}

fn reply<T>(r: Result<T, Status>) -> Reply<T> {
    r.map(Response::new)
}

#[tonic::async_trait]
impl Identity for ForwardService {
    async fn get_plugin_info(
        &self,
        _r: Request<GetPluginInfoRequest>,
    ) -> Reply<GetPluginInfoResponse> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.cluster.cfg.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: [
                ("mode".to_string(), "controller".to_string()),
                (
                    "nodes".to_string(),
                    ids(self.cluster.nodes.all().iter().map(|n| n.id.clone())),
                ),
                (
                    "missing_nodes".to_string(),
                    ids(self.cluster.nodes.missing()),
                ),
            ]
            .into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<GetPluginCapabilitiesRequest>,
    ) -> Reply<GetPluginCapabilitiesResponse> {
        let capabilities = super::identity::plugin_capabilities(self.cluster.cfg.snapshot_metadata);
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// Ready whenever it serves: the controller holds nothing to wait for,
    /// and a node that cannot be reached fails only its own calls
    /// (UNAVAILABLE, retried), not every call of the cluster.
    async fn probe(&self, _r: Request<ProbeRequest>) -> Reply<ProbeResponse> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for ForwardService {
    async fn create_volume(&self, r: Request<CreateVolumeRequest>) -> Reply<CreateVolumeResponse> {
        reply(self.cluster.create_volume(r.into_inner()).await)
    }
    async fn delete_volume(&self, r: Request<DeleteVolumeRequest>) -> Reply<DeleteVolumeResponse> {
        reply(self.cluster.delete_volume(r.into_inner()).await)
    }
    async fn controller_publish_volume(
        &self,
        _r: Request<ControllerPublishVolumeRequest>,
    ) -> Reply<ControllerPublishVolumeResponse> {
        Err(publish_unimplemented("ControllerPublishVolume"))
    }
    async fn controller_unpublish_volume(
        &self,
        _r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Reply<ControllerUnpublishVolumeResponse> {
        Err(publish_unimplemented("ControllerUnpublishVolume"))
    }
    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<ValidateVolumeCapabilitiesResponse> {
        reply(self.cluster.validate_capabilities(r.into_inner()).await)
    }
    async fn list_volumes(&self, r: Request<ListVolumesRequest>) -> Reply<ListVolumesResponse> {
        reply(self.cluster.list_volumes(r.into_inner()).await)
    }
    async fn get_capacity(&self, r: Request<GetCapacityRequest>) -> Reply<GetCapacityResponse> {
        reply(self.cluster.capacity(r.into_inner()).await)
    }
    async fn controller_get_capabilities(
        &self,
        _r: Request<ControllerGetCapabilitiesRequest>,
    ) -> Reply<ControllerGetCapabilitiesResponse> {
        // What the nodes serve, each call forwarded.
        Ok(Response::new(capabilities_response(
            self.cluster.cfg.controller_expansion,
        )))
    }
    async fn create_snapshot(
        &self,
        r: Request<CreateSnapshotRequest>,
    ) -> Reply<CreateSnapshotResponse> {
        reply(self.cluster.create_snapshot(r.into_inner()).await)
    }
    async fn delete_snapshot(
        &self,
        r: Request<DeleteSnapshotRequest>,
    ) -> Reply<DeleteSnapshotResponse> {
        reply(self.cluster.delete_snapshot(r.into_inner()).await)
    }
    async fn list_snapshots(
        &self,
        r: Request<ListSnapshotsRequest>,
    ) -> Reply<ListSnapshotsResponse> {
        reply(self.cluster.list_snapshots(r.into_inner()).await)
    }
    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Reply<ControllerExpandVolumeResponse> {
        reply(self.cluster.expand(r.into_inner()).await)
    }
    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Reply<ControllerGetVolumeResponse> {
        reply(self.cluster.get_volume(r.into_inner()).await)
    }
    async fn controller_modify_volume(
        &self,
        r: Request<ControllerModifyVolumeRequest>,
    ) -> Reply<ControllerModifyVolumeResponse> {
        reply(self.cluster.modify(r.into_inner()).await)
    }
}

#[tonic::async_trait]
impl GroupController for ForwardService {
    async fn group_controller_get_capabilities(
        &self,
        _r: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Reply<GroupControllerGetCapabilitiesResponse> {
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: super::group::capabilities(),
        }))
    }
    async fn create_volume_group_snapshot(
        &self,
        r: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Reply<CreateVolumeGroupSnapshotResponse> {
        reply(self.cluster.create_group(r.into_inner()).await)
    }
    async fn delete_volume_group_snapshot(
        &self,
        r: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Reply<DeleteVolumeGroupSnapshotResponse> {
        reply(self.cluster.delete_group(r.into_inner()).await)
    }
    async fn get_volume_group_snapshot(
        &self,
        r: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Reply<GetVolumeGroupSnapshotResponse> {
        reply(self.cluster.get_group(r.into_inner()).await)
    }
}

/// `tpcsi move`'s rounds (docs/moving.md), on the controller's socket.
#[tonic::async_trait]
impl crate::proto::thinpool::cluster::v1::move_server::Move for ForwardService {
    async fn round(
        &self,
        r: Request<crate::proto::thinpool::cluster::v1::RoundRequest>,
    ) -> Reply<crate::proto::thinpool::cluster::v1::RoundResponse> {
        reply(self.cluster.move_round(r.into_inner()).await)
    }
    async fn verify(
        &self,
        r: Request<crate::proto::thinpool::cluster::v1::VerifyRequest>,
    ) -> Reply<crate::proto::thinpool::cluster::v1::VerifyResponse> {
        reply(self.cluster.move_verify(r.into_inner()).await)
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for ForwardService {
    type GetMetadataAllocatedStream = Relay<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Relay<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        r: Request<GetMetadataAllocatedRequest>,
    ) -> Reply<Self::GetMetadataAllocatedStream> {
        reply(self.cluster.metadata_allocated(r.into_inner()).await)
    }
    async fn get_metadata_delta(
        &self,
        r: Request<GetMetadataDeltaRequest>,
    ) -> Reply<Self::GetMetadataDeltaStream> {
        reply(self.cluster.metadata_delta(r.into_inner()).await)
    }
}

/// The cluster controller's CSI-Addons services: its Identity
/// (CONTROLLER_SERVICE, so the csi-addons lease holder is the controller)
/// and ControllerReclaimSpace, forwarded to the node of the volume.
pub struct ForwardAddons {
    pub cluster: Arc<Cluster>,
}

#[tonic::async_trait]
impl AddonsIdentity for ForwardAddons {
    async fn get_identity(&self, _r: Request<GetIdentityRequest>) -> Reply<GetIdentityResponse> {
        Ok(Response::new(GetIdentityResponse {
            name: self.cluster.cfg.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }
    async fn get_capabilities(
        &self,
        _r: Request<GetCapabilitiesRequest>,
    ) -> Reply<GetCapabilitiesResponse> {
        Ok(Response::new(GetCapabilitiesResponse {
            capabilities: super::addons::capabilities(super::addons::Sides::Controller),
        }))
    }
    /// As the CSI Probe: ready whenever it serves.
    async fn probe(
        &self,
        _r: Request<crate::proto::identity::ProbeRequest>,
    ) -> Reply<crate::proto::identity::ProbeResponse> {
        Ok(Response::new(crate::proto::identity::ProbeResponse {
            ready: Some(true),
        }))
    }
}

#[tonic::async_trait]
impl ReclaimSpaceController for ForwardAddons {
    async fn controller_reclaim_space(
        &self,
        r: Request<ControllerReclaimSpaceRequest>,
    ) -> Reply<ControllerReclaimSpaceResponse> {
        reply(self.cluster.controller_reclaim(r.into_inner()).await)
    }
}
