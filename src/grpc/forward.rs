//! The cluster controller's CSI services (`thinpool-csi controller`,
//! docs/cluster.md): Identity answers for the controller itself; every
//! Controller call is forwarded by `crate::cluster::Cluster` to the node
//! that holds its object, and the node's answer passes through.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::controller::capabilities;
use crate::cluster::Cluster;
use crate::proto::csi::v1::controller_server::Controller;
use crate::proto::csi::v1::controller_service_capability::{Rpc, Type as CapType};
use crate::proto::csi::v1::identity_server::Identity;
use crate::proto::csi::v1::plugin_capability::{self, service, volume_expansion};
use crate::proto::csi::v1::*;

pub struct ForwardService {
    pub cluster: Arc<Cluster>,
}

type Reply<T> = Result<Response<T>, Status>;

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
            manifest: [("mode".to_string(), "controller".to_string())].into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<GetPluginCapabilitiesRequest>,
    ) -> Reply<GetPluginCapabilitiesResponse> {
        let service = |t: service::Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(service::Type::ControllerService),
                service(service::Type::VolumeAccessibilityConstraints),
                PluginCapability {
                    r#type: Some(plugin_capability::Type::VolumeExpansion(
                        plugin_capability::VolumeExpansion {
                            r#type: volume_expansion::Type::Online as i32,
                        },
                    )),
                },
            ],
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
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Reply<ControllerPublishVolumeResponse> {
        reply(self.cluster.publish(r.into_inner()).await)
    }
    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Reply<ControllerUnpublishVolumeResponse> {
        reply(self.cluster.unpublish(r.into_inner()).await)
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
        let capabilities = capabilities(self.cluster.cfg.controller_expansion)
            .into_iter()
            .map(|t| ControllerServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
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
