//! CSI Identity service.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::proto::csi::v1::identity_server::Identity;
use crate::proto::csi::v1::plugin_capability::{self, service, volume_expansion};
use crate::proto::csi::v1::*;
use crate::volume::classes::Classes;

/// What the plugin serves, on a node's socket and from the cluster's
/// controller alike; SNAPSHOT_METADATA_SERVICE only when `metadata`.
pub fn plugin_capabilities(metadata: bool) -> Vec<PluginCapability> {
    let service = |t: service::Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    };
    let mut capabilities = vec![
        service(service::Type::ControllerService),
        service(service::Type::VolumeAccessibilityConstraints),
        service(service::Type::GroupControllerService),
        PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                },
            )),
        },
    ];
    if metadata {
        capabilities.push(service(service::Type::SnapshotMetadataService));
    }
    capabilities
}

pub struct IdentityService {
    pub classes: Arc<Classes>,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _r: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.classes.base().cfg.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: [
                (
                    "volume_group".to_string(),
                    self.classes.base().lvm.vg.clone(),
                ),
                (
                    "thin_pool".to_string(),
                    self.classes.base().lvm.pool.clone(),
                ),
                ("device_classes".to_string(), self.classes.names().join(",")),
                (
                    "default_device_class".to_string(),
                    self.classes
                        .named(None)
                        .map(|v| v.class_name().to_string())
                        .unwrap_or_default(),
                ),
            ]
            .into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let capabilities = plugin_capabilities(self.classes.base().serves_metadata());
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// Ready whenever the driver serves, whatever its pool can do. Read at
    /// the pinned versions: livenessprobe v2.19.0 (`checkProbe`) answers
    /// 500 to any error and to `ready: false`, and the kubelet then
    /// restarts this container; the provisioner, attacher, resizer and
    /// snapshotter (csi-lib-utils `rpc.ProbeForever`) and the csi-addons
    /// sidecar (`client.Probe`) wait on `ready: false` and exit on any
    /// error. A restart cannot bring back a missing or failed pool, and
    /// every restart drops NodeUnpublish and NodeUnstage of the volumes
    /// still staged here, so a broken pool answers ready: the pod's
    /// readiness (`tpcsi probe`, which also asks GetCapacity) and
    /// CreateVolume's error report it.
    async fn probe(&self, _r: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.classes.probe().await;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
