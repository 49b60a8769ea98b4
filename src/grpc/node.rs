//! CSI Node service: parses each request into typed values (an id of our
//! shape, paths under `allowed_roots`, a capability with its mount
//! options), calls the volume layer, and maps the answer. A volume id that
//! is not ours is NOT_FOUND.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{reply, validate};
use crate::error::{Error, Result};
use crate::node;
use crate::proto::csi::v1::node_server::Node;
use crate::proto::csi::v1::node_service_capability::rpc::Type as RpcType;
use crate::proto::csi::v1::node_service_capability::{Rpc, Type as CapType};
use crate::proto::csi::v1::volume_usage::Unit;
use crate::proto::csi::v1::*;
use crate::volume::classes::Classes;
use crate::volume::{Capability, NodePath, VolumeId};

/// The node RPCs this driver implements and advertises.
pub const CAPABILITIES: &[RpcType] = &[
    RpcType::StageUnstageVolume,
    RpcType::GetVolumeStats,
    RpcType::ExpandVolume,
    RpcType::VolumeCondition,
    RpcType::SingleNodeMultiWriter,
];

pub struct NodeService {
    pub classes: Arc<Classes>,
}

impl NodeService {
    pub fn new(classes: Arc<Classes>) -> NodeService {
        NodeService { classes }
    }

    pub(super) fn path(&self, field: &str, value: &str) -> Result<NodePath> {
        validate::node_path(field, value, &self.classes.base().cfg.allowed_roots)
    }

    fn optional_path(&self, field: &str, value: &str) -> Result<Option<NodePath>> {
        match value {
            "" => Ok(None),
            v => self.path(field, v).map(Some),
        }
    }

    /// The capability, with the default filesystem of the class of `id`
    /// (of the top-level pool while the id is unknown: the request is
    /// checked whole before the id is looked up).
    pub(super) fn capability(
        &self,
        id: Option<&VolumeId>,
        cap: Option<&VolumeCapability>,
    ) -> Result<Capability> {
        validate::full_capability(cap, self.classes.default_fs(id.map(|i| i.as_str())))
    }

    async fn stage(&self, req: NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let cap = self.capability(id.as_ref(), req.volume_capability.as_ref())?;
        let keys = validate::passphrases(&req.secrets)?;
        let id = validate::known_volume(id, &req.volume_id)?;
        self.classes.of(&id)?.stage(id, staging, cap, keys).await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<NodeUnstageVolumeResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let id = validate::known_volume(id, &req.volume_id)?;
        self.classes.of(&id)?.unstage(id, staging).await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<NodePublishVolumeResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        let target = self.path("target_path", &req.target_path)?;
        let cap = self.capability(id.as_ref(), req.volume_capability.as_ref())?;
        if req.staging_target_path.is_empty() {
            return Err(Error::FailedPrecondition(
                "staging_target_path is required: this driver stages volumes (STAGE_UNSTAGE_VOLUME)".into(),
            )
            .advise("call NodeStageVolume first and pass its staging_target_path"));
        }
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let id = validate::known_volume(id, &req.volume_id)?;
        self.classes
            .of(&id)?
            .publish(id, staging, target, cap, req.readonly)
            .await?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        let target = self.path("target_path", &req.target_path)?;
        let id = validate::known_volume(id, &req.volume_id)?;
        self.classes.of(&id)?.unpublish(id, target).await?;
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        validate::required_path("volume_path", &req.volume_path)?;
        self.optional_path("staging_target_path", &req.staging_target_path)?;
        let id = validate::known_volume(id, &req.volume_id)?;
        // A relative path names no place a volume can be (the spec's
        // NOT_FOUND), and is resolved against nothing.
        if !req.volume_path.starts_with('/') {
            return Err(Error::NotFound(format!(
                "volume {id} is not at {:?}: not an absolute path",
                req.volume_path
            ))
            .advise(
                "pass the absolute target or staging path the volume was published or staged at",
            ));
        }
        let path = self.path("volume_path", &req.volume_path)?;
        let s = self.classes.of(&id)?.volume_stats(&id, &path).await?;
        Ok(NodeGetVolumeStatsResponse {
            usage: volume_usage(&s.usage),
            volume_condition: Some(VolumeCondition {
                abnormal: !s.problems.is_empty(),
                message: if s.problems.is_empty() {
                    format!(
                        "volume, filesystem and thin pool of device class {} are healthy",
                        crate::naming::class_of(id.as_str())
                    )
                } else {
                    format!(
                        "device class {}: {}",
                        crate::naming::class_of(id.as_str()),
                        s.problems.join("; ")
                    )
                },
            }),
        })
    }

    async fn expand(&self, req: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        validate::required_path("volume_path", &req.volume_path)?;
        // An unknown volume is NOT_FOUND whatever path came with it.
        let id = validate::known_volume(id, &req.volume_id)?;
        let d = self.classes.of(&id)?;
        let path = self.path("volume_path", &req.volume_path)?;
        let staging = self.optional_path("staging_target_path", &req.staging_target_path)?;
        let requested = req
            .volume_capability
            .as_ref()
            .map(|c| validate::capability(c, &d.cfg.default_fs_type))
            .transpose()?;
        let range = validate::size_range(req.capacity_range.as_ref())?.unwrap_or_default();
        let size = d.node_expand(id, path, staging, requested, range).await?;
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        })
    }
}

/// Usage as CSI reports it: bytes and inodes for a filesystem, the total
/// bytes for a block volume, nothing when unknown.
fn volume_usage(u: &node::Usage) -> Vec<VolumeUsage> {
    let n = |v: u64| v.min(i64::MAX as u64) as i64;
    match u {
        node::Usage::Filesystem(f) => vec![
            VolumeUsage {
                available: n(f.bytes_available),
                total: n(f.bytes_total),
                used: n(f.bytes_used),
                unit: Unit::Bytes as i32,
            },
            VolumeUsage {
                available: n(f.inodes_free),
                total: n(f.inodes_total),
                used: n(f.inodes_used),
                unit: Unit::Inodes as i32,
            },
        ],
        node::Usage::Block(size) => vec![VolumeUsage {
            available: 0,
            total: n(*size),
            used: 0,
            unit: Unit::Bytes as i32,
        }],
        node::Usage::Unknown => Vec::new(),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        reply(self.stage(r.into_inner()).await)
    }
    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        reply(self.unstage(r.into_inner()).await)
    }
    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        reply(self.publish(r.into_inner()).await)
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        reply(self.unpublish(r.into_inner()).await)
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        reply(self.stats(r.into_inner()).await)
    }
    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        reply(self.expand(r.into_inner()).await)
    }
    async fn node_get_capabilities(
        &self,
        _r: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|t| NodeServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }
    async fn node_get_info(
        &self,
        _r: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let d = self.classes.base();
        Ok(Response::new(NodeGetInfoResponse {
            node_id: d.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology {
                segments: [(d.topology_key(), d.node_id.clone())].into(),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_the_implemented_ones() {
        assert!(!CAPABILITIES.contains(&RpcType::VolumeMountGroup));
        assert!(!CAPABILITIES.contains(&RpcType::Unknown));
        assert_eq!(CAPABILITIES.len(), 5);
    }

    #[test]
    fn usage_reports_bytes_and_inodes() {
        let u = volume_usage(&node::Usage::Filesystem(node::usage::Usage {
            bytes_total: 100,
            bytes_available: 60,
            bytes_used: 30,
            inodes_total: 10,
            inodes_free: 7,
            inodes_used: 3,
        }));
        assert_eq!(u.len(), 2);
        assert_eq!(
            (u[0].unit, u[0].total, u[0].used),
            (Unit::Bytes as i32, 100, 30)
        );
        assert_eq!((u[1].unit, u[1].available), (Unit::Inodes as i32, 7));
        let b = volume_usage(&node::Usage::Block(u64::MAX));
        assert_eq!((b.len(), b[0].total), (1, i64::MAX));
        assert!(volume_usage(&node::Usage::Unknown).is_empty());
    }
}
