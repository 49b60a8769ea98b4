//! CSI Controller service: volumes are thin LVs of one pool on this node.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::validate::{CapacityAsk, Carrier};
use super::{reply, validate};
use crate::error::{Error, Result};
use crate::naming::{self, Access, ContentSource, NodeIds};
use crate::proto::csi::v1::controller_server::Controller;
use crate::proto::csi::v1::controller_service_capability::rpc::Type as RpcType;
use crate::proto::csi::v1::controller_service_capability::{Rpc, Type as CapType};
use crate::proto::csi::v1::*;
use crate::proto::thinpool::cluster::v1::{CopyFrom, CopyRound};
use crate::volume::classes::Classes;
use crate::volume::controller::{CreateSpec, VolumeInfo};
use crate::volume::snapshot::SnapshotInfo;

pub struct ControllerService {
    pub classes: Arc<Classes>,
}

/// The RPCs this controller implements, and nothing else. What it
/// advertises is [`capabilities`]: EXPAND_VOLUME only with
/// `controller_expansion`.
///
/// No PUBLISH_UNPUBLISH_VOLUME (both calls answer UNIMPLEMENTED,
/// [`publish_unimplemented`]). ControllerPublishVolume kept no state: it
/// only checked that the LV exists and that the node id is this node's,
/// and NodeStageVolume on another node answers NOT_FOUND anyway. Without
/// the capability, the one central external-attacher (v4.12.0, in front
/// of the forwarding controller) takes its trivial handler
/// (`cmd/csi-attacher/main.go`, `pkg/controller/trivial_handler.go`): it
/// marks each VolumeAttachment attached itself, with no CSI call and no
/// finalizer, so no node that is gone can hold a detach up. CSIDriver's
/// attachRequired stays true: the CSI-Addons controller finds a volume's
/// node through its VolumeAttachment. external-provisioner (v6.3.0)
/// watches VolumeAttachments only for drivers with the capability, so it
/// drops that watch and its RBAC too.
pub const CAPABILITIES: &[RpcType] = &[
    RpcType::CreateDeleteVolume,
    RpcType::ListVolumes,
    RpcType::GetCapacity,
    RpcType::ExpandVolume,
    RpcType::GetVolume,
    RpcType::VolumeCondition,
    RpcType::SingleNodeMultiWriter,
    RpcType::CreateDeleteSnapshot,
    RpcType::ListSnapshots,
    RpcType::CloneVolume,
    RpcType::ModifyVolume,
];

/// The RPCs advertised: [`CAPABILITIES`], without EXPAND_VOLUME when
/// `controller_expansion` is off (NodeExpandVolume then grows the LV).
pub fn capabilities(controller_expansion: bool) -> Vec<RpcType> {
    CAPABILITIES
        .iter()
        .copied()
        .filter(|t| controller_expansion || *t != RpcType::ExpandVolume)
        .collect()
}

/// ControllerPublishVolume's and ControllerUnpublishVolume's answer, a
/// node's and the cluster controller's: not implemented, and not
/// advertised ([`CAPABILITIES`] says why).
pub fn publish_unimplemented(rpc: &str) -> Status {
    Error::Unimplemented(format!(
        "{rpc} is not implemented: this driver does not advertise PUBLISH_UNPUBLISH_VOLUME; a volume is used on the node that holds it, which NodeStageVolume checks"
    ))
    .advise("do not call it: attach needs no CSI call (Kubernetes' external-attacher marks the VolumeAttachment attached by itself)")
    .into()
}

/// ControllerGetCapabilities' answer: a node's, and the cluster
/// controller's, which forwards each of these calls.
pub fn capabilities_response(controller_expansion: bool) -> ControllerGetCapabilitiesResponse {
    ControllerGetCapabilitiesResponse {
        capabilities: capabilities(controller_expansion)
            .into_iter()
            .map(|t| ControllerServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect(),
    }
}

/// The copy the controller asks this node to pull
/// (`channel::COPY_HEADER`), read from a request the controller made on
/// the channel only (`channel::FromController`): on a CO's socket the
/// header means nothing.
fn copy_from<T>(r: &Request<T>) -> Result<Option<CopyFrom>> {
    if r.extensions()
        .get::<crate::channel::FromController>()
        .is_none()
    {
        return Ok(None);
    }
    let Some(v) = r.metadata().get_bin(crate::channel::COPY_HEADER) else {
        return Ok(None);
    };
    let bytes = v.to_bytes().map_err(|_| {
        Error::InvalidArgument(format!("{} is not base64", crate::channel::COPY_HEADER))
    })?;
    prost::Message::decode(bytes)
        .map(Some)
        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", crate::channel::COPY_HEADER)))
}

impl ControllerService {
    fn topology(&self) -> Vec<Topology> {
        let d = self.classes.base();
        vec![Topology {
            segments: [(d.topology_key(), d.node_id.clone())].into(),
        }]
    }

    fn volume(&self, v: VolumeInfo) -> Volume {
        Volume {
            accessible_topology: self.topology(),
            ..volume_without_topology(v, self.classes.ids())
        }
    }

    async fn create(
        &self,
        req: CreateVolumeRequest,
        copy: Option<CopyFrom>,
    ) -> Result<(CreateVolumeResponse, Option<CopyRound>)> {
        let name = validate::required_string("name", &req.name)?;
        let d = self
            .classes
            .named(validate::device_class(&req.parameters)?)?;
        let access = validate::capabilities(&req.volume_capabilities, &d.cfg.default_fs_type)?;
        let params = validate::parameters(
            &req.parameters,
            d.class_name(),
            &d.lvm.vg,
            &d.lvm.pool,
            &access,
        )?;
        let range = validate::size_range(req.capacity_range.as_ref())?;
        let mut mutable =
            validate::mutable_parameters(Carrier::CreateVolumeMutable, &req.mutable_parameters)?;
        for (k, v) in validate::io_limits(&req.parameters)? {
            mutable.entry(k).or_insert(v);
        }
        // A copy of another node's snapshot or volume, pulled from that
        // node (docs/moving.md): the source is not this node's, and the
        // new volume records none.
        let pulled = match &copy {
            Some(c) => Some(validate::pulled_source(
                req.volume_content_source.as_ref(),
                self.classes.ids(),
                &c.node_id,
                &c.snapshot_id,
                c.source_code == 0,
            )?),
            None => None,
        };
        let from = match pulled {
            Some(_) => None,
            None => {
                validate::content_source(req.volume_content_source.as_ref(), self.classes.ids())?
            }
        };
        if !validate::topology_allows(
            req.accessibility_requirements.as_ref(),
            &d.topology_key(),
            &d.node_id,
        ) {
            return Err(Error::ResourceExhausted(format!(
                "accessibility_requirements exclude node {:?}, the only node this pool serves",
                d.node_id
            ))
            .advise(format!(
                "let accessibility_requirements include node {:?}, or create the volume through the driver of the node you asked for",
                d.node_id
            )));
        }
        let spec = CreateSpec {
            co_name: name.to_string(),
            access,
            params,
            range,
            from,
            mutable,
            encrypted: validate::encrypted(&req.parameters)?,
        };
        let (p, copy) = match (pulled, copy) {
            (Some(p), Some(copy)) => (p, copy),
            _ => {
                let v = d.create_volume(spec).await?;
                let volume = Some(self.volume(v));
                return Ok((CreateVolumeResponse { volume }, None));
            }
        };
        validate::pulled_base(&copy.base_snapshot_id, self.classes.ids(), &copy.node_id)?;
        let pull = super::peer::pull(&d.cfg, copy, p)?;
        let made = d.create_pulled(spec, pull).await?;
        let round = CopyRound {
            ranges: made.round.ranges,
            bytes: made.round.bytes,
            base_snapshot_id: made.round.base.clone().unwrap_or_default(),
            held: made.volume.is_none(),
        };
        let volume = match made.volume {
            Some(v) => self.volume(v),
            // Held back by a move: only the controller sees this answer.
            None => Volume {
                volume_id: self.classes.ids().public(made.lv),
                capacity_bytes: made.size as i64,
                ..Default::default()
            },
        };
        Ok((
            CreateVolumeResponse {
                volume: Some(volume),
            },
            Some(round),
        ))
    }

    async fn delete(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse> {
        let Some(id) = validate::volume_id(&req.volume_id, self.classes.ids())? else {
            validate::not_elsewhere("volume_id", &req.volume_id, self.classes.ids())?;
            tracing::info!(
                id = req.volume_id,
                "DeleteVolume: not an id this driver issues; nothing to delete"
            );
            return Ok(DeleteVolumeResponse {});
        };
        self.classes.of_to_delete(&id)?.delete_volume(id).await?;
        Ok(DeleteVolumeResponse {})
    }

    async fn validate_caps(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::InvalidArgument(
                "volume_capabilities is required".into(),
            ));
        }
        let id = validate::known_volume(id, &req.volume_id)?;
        let d = self.classes.of(&id)?;
        let wanted = validate::capabilities(&req.volume_capabilities, &d.cfg.default_fs_type)
            .and_then(|a| {
                validate::parameters(&req.parameters, d.class_name(), &d.lvm.vg, &d.lvm.pool, &a)
                    .map(|_| a)
            })
            .and_then(|a| {
                validate::mutable_parameters(Carrier::CreateVolumeMutable, &req.mutable_parameters)
                    .map(|_| a)
            });
        Ok(match d.fits(&id, wanted).await? {
            Ok(()) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(e) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.to_string(),
            },
        })
    }

    async fn list(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse> {
        let ids = self.classes.ids();
        let (max, token) = validate::page(
            req.max_entries,
            &req.starting_token,
            naming::is_volume_id,
            ids,
        )?;
        let (page, next_token) = self.classes.list_volumes(token, max).await?;
        // Entries leave out accessible_topology (OPTIONAL in Volume). The
        // spec lets a CO read its absence as "reachable from every node";
        // no Kubernetes component reads it from ListVolumes (the
        // provisioner never calls it; external-health-monitor, not
        // deployed here, reads the id and the condition), and
        // CreateVolume and ControllerGetVolume still name this node. On
        // 500 volumes it was a third of the answer and put ListVolumes
        // past its P3 limit (docs/behaviour.md).
        let entries = page
            .into_iter()
            .map(|v| list_volumes_response::Entry {
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: vec![],
                    volume_condition: Some(condition(&v)),
                }),
                volume: Some(volume_without_topology(v, ids)),
            })
            .collect();
        Ok(ListVolumesResponse {
            entries,
            next_token: public_token(next_token, ids),
        })
    }

    async fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse> {
        let base = self.classes.base();
        let ask = validate::capacity_ask(
            &req,
            &class_shapes(&self.classes),
            self.classes.default_index(),
            &base.topology_key(),
            &base.node_id,
        )?;
        Ok(match ask {
            CapacityAsk::Elsewhere => capacity_elsewhere(),
            CapacityAsk::Class(i) => {
                let (cap, extent) = self.classes.all()[i].capacity_now().await?;
                capacity_response(&cap, extent)
            }
        })
    }

    async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse> {
        if !self.classes.base().cfg.controller_expansion {
            // Not advertised, so not served: NodeExpandVolume grows the LV.
            return Err(Error::Unimplemented(
                "ControllerExpandVolume is off on this driver (controller_expansion = false)".into(),
            )
            .advise("expand through NodeExpandVolume on the node that has the volume staged (Kubernetes: the kubelet does it), or set controller_expansion = true"));
        }
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        let range = validate::size_range(req.capacity_range.as_ref())?
            .ok_or_else(|| Error::InvalidArgument("capacity_range is required".into()))?;
        let requested = req
            .volume_capability
            .as_ref()
            .map(|c| validate::capability(c, self.classes.default_fs(id.as_deref())))
            .transpose()?;
        let id = validate::known_volume(id, &req.volume_id)?;
        let d = self.classes.of(&id)?;
        let (size, node_expansion_required) = d.expand_volume(id, range, requested).await?;
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size as i64,
            node_expansion_required,
        })
    }

    async fn get_volume(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse> {
        let id = validate::existing_volume_id(&req.volume_id, self.classes.ids())?;
        let v = self.classes.of(&id)?.get_volume(&id).await?;
        Ok(ControllerGetVolumeResponse {
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: vec![],
                volume_condition: Some(condition(&v)),
            }),
            volume: Some(self.volume(v)),
        })
    }
}

/// CSI's form of what a volume was made from.
fn content_source(from: &ContentSource, ids: &NodeIds) -> VolumeContentSource {
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    VolumeContentSource {
        r#type: Some(match from {
            ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
                snapshot_id: ids.public(id.clone()),
            }),
            ContentSource::Volume(id) => Type::Volume(VolumeSource {
                volume_id: ids.public(id.clone()),
            }),
        }),
    }
}

/// The snapshot as CSI shows it, its ids as this node hands them out.
pub(crate) fn snapshot(s: &SnapshotInfo, ids: &NodeIds) -> Snapshot {
    Snapshot {
        size_bytes: s.size as i64,
        snapshot_id: ids.public(s.id.clone()),
        source_volume_id: ids.public(s.source.clone()),
        creation_time: s
            .created
            .map(|seconds| prost_types::Timestamp { seconds, nanos: 0 }),
        ready_to_use: true,
        group_snapshot_id: s.group.clone().map(|g| ids.public(g)).unwrap_or_default(),
    }
}

impl ControllerService {
    async fn create_snap(&self, req: CreateSnapshotRequest) -> Result<CreateSnapshotResponse> {
        let name = validate::required_string("name", &req.name)?;
        validate::required_string("source_volume_id", &req.source_volume_id)?;
        validate::snapshot_parameters(Carrier::CreateSnapshot, &req.parameters)?;
        let source = validate::existing_volume_id(&req.source_volume_id, self.classes.ids())?;
        let s = self
            .classes
            .of(&source)?
            .create_snapshot(name.to_string(), source)
            .await?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(snapshot(&s, self.classes.ids())),
        })
    }

    async fn delete_snap(&self, req: DeleteSnapshotRequest) -> Result<DeleteSnapshotResponse> {
        let Some(id) = validate::snapshot_id("snapshot_id", &req.snapshot_id, self.classes.ids())?
        else {
            validate::not_elsewhere("snapshot_id", &req.snapshot_id, self.classes.ids())?;
            tracing::info!(
                id = req.snapshot_id,
                "DeleteSnapshot: not an id this driver issues; nothing to delete"
            );
            return Ok(DeleteSnapshotResponse {});
        };
        self.classes.of(&id)?.delete_snapshot(id).await?;
        Ok(DeleteSnapshotResponse {})
    }

    async fn list_snaps(&self, req: ListSnapshotsRequest) -> Result<ListSnapshotsResponse> {
        let ids = self.classes.ids();
        let (max, token) = validate::page(
            req.max_entries,
            &req.starting_token,
            naming::is_snapshot_id,
            ids,
        )?;
        let empty = || ListSnapshotsResponse {
            entries: vec![],
            next_token: String::new(),
        };
        // A filter naming an id this driver never issues matches nothing.
        // So does one with another node's key.
        let (Some(by_id), Some(by_source)) = (
            filter_id(&req.snapshot_id, naming::is_snapshot_id, ids),
            filter_id(&req.source_volume_id, naming::is_volume_id, ids),
        ) else {
            return Ok(empty());
        };
        let (page, next_token) = self
            .classes
            .list_snapshots(by_id, by_source, token, max)
            .await?;
        Ok(ListSnapshotsResponse {
            entries: page
                .iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(snapshot(s, ids)),
                })
                .collect(),
            next_token: public_token(next_token, ids),
        })
    }
}

impl ControllerService {
    async fn modify(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse> {
        let id = validate::volume_id(&req.volume_id, self.classes.ids())?;
        // An empty map is "nothing to change", not a missing field: a
        // VolumeAttributesClass may carry no parameters, and csi-sanity at
        // its defaults sends none, expecting OK for a volume that exists
        // and NOT_FOUND for one that does not. modify_volume still looks
        // the volume up, so both answers hold.
        let mutable =
            validate::mutable_parameters(Carrier::ControllerModifyVolume, &req.mutable_parameters)?;
        let id = validate::known_volume(id, &req.volume_id)?;
        self.classes.of(&id)?.modify_volume(id, mutable).await?;
        Ok(ControllerModifyVolumeResponse {})
    }
}

/// The next token of a listing: the last id of the page as this node
/// hands it out ("" after the last page).
fn public_token(token: String, ids: &NodeIds) -> String {
    match token.as_str() {
        "" => token,
        _ => ids.public(token),
    }
}

/// A listing's filter by id: `Some(None)` when empty (no filter),
/// `Some(Some(id))` for an id this node issued, without its key, and
/// `None` for any other, which matches nothing here.
fn filter_id<'a>(id: &'a str, issued: fn(&str) -> bool, ids: &NodeIds) -> Option<Option<&'a str>> {
    match id {
        "" => Some(None),
        id => ids.local(id).filter(|id| issued(id)).map(Some),
    }
}

/// The volume as CSI shows it, its `accessible_topology` left out; takes
/// the info apart (ListVolumes builds one per entry).
fn volume_without_topology(v: VolumeInfo, ids: &NodeIds) -> Volume {
    let mut ctx = HashMap::with_capacity(1 + v.mutable.len());
    if let Some(Access::Mount { fs_type }) = v.access {
        ctx.insert("fsType".to_string(), fs_type);
    }
    // Mutable parameters as last set, reported back.
    ctx.extend(v.mutable);
    Volume {
        capacity_bytes: v.size as i64,
        volume_id: ids.public(v.id),
        volume_context: ctx,
        content_source: v.from.as_ref().map(|f| content_source(f, ids)),
        accessible_topology: vec![],
    }
}

/// What GetCapacity's validation reads of each of `classes`, in their
/// order.
pub fn class_shapes(classes: &Classes) -> Vec<validate::ClassShape<'_>> {
    classes
        .all()
        .iter()
        .map(|d| validate::ClassShape {
            name: d.class_name(),
            vg: &d.lvm.vg,
            pool: &d.lvm.pool,
            default_fs_type: &d.cfg.default_fs_type,
        })
        .collect()
}

/// GetCapacity's answer for a topology of another node: nothing fits.
pub fn capacity_elsewhere() -> GetCapacityResponse {
    GetCapacityResponse {
        available_capacity: 0,
        maximum_volume_size: Some(0),
        minimum_volume_size: None,
    }
}

/// GetCapacity's answer for `cap` in a pool of `extent`-byte extents:
/// whole extents only (a volume is made of them).
pub fn capacity_response(cap: &crate::lvm::report::Capacity, extent: u64) -> GetCapacityResponse {
    let floor = |b: u64| (b / extent.max(1) * extent.max(1)) as i64;
    GetCapacityResponse {
        available_capacity: floor(cap.available()),
        maximum_volume_size: Some(floor(cap.virtual_headroom)),
        minimum_volume_size: Some(extent as i64),
    }
}

/// The condition of a volume and its pool, as CSI reports it, naming the
/// device class (the pool) it is in.
fn condition(v: &VolumeInfo) -> VolumeCondition {
    let class = naming::class_of(&v.id);
    VolumeCondition {
        abnormal: v.problem.is_some(),
        message: match &v.problem {
            Some(p) => format!("device class {class}: {p}"),
            None => format!("device class {class}: healthy"),
        },
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        r: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let made = match copy_from(&r) {
            Ok(copy) => self.create(r.into_inner(), copy).await,
            Err(e) => Err(e),
        };
        let (answer, round) = made.map_err(Status::from)?;
        let mut answer = Response::new(answer);
        if let Some(round) = round {
            answer.metadata_mut().insert_bin(
                crate::channel::ROUND_HEADER,
                tonic::metadata::MetadataValue::from_bytes(&prost::Message::encode_to_vec(&round)),
            );
        }
        Ok(answer)
    }
    async fn delete_volume(
        &self,
        r: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        reply(self.delete(r.into_inner()).await)
    }
    async fn controller_publish_volume(
        &self,
        _r: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(publish_unimplemented("ControllerPublishVolume"))
    }
    async fn controller_unpublish_volume(
        &self,
        _r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(publish_unimplemented("ControllerUnpublishVolume"))
    }
    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        reply(self.validate_caps(r.into_inner()).await)
    }
    async fn list_volumes(
        &self,
        r: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        reply(self.list(r.into_inner()).await)
    }
    async fn get_capacity(
        &self,
        r: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        reply(ControllerService::get_capacity(self, r.into_inner()).await)
    }
    async fn controller_get_capabilities(
        &self,
        _r: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(capabilities_response(
            self.classes.base().cfg.controller_expansion,
        )))
    }
    async fn create_snapshot(
        &self,
        r: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        reply(self.create_snap(r.into_inner()).await)
    }
    async fn delete_snapshot(
        &self,
        r: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        reply(self.delete_snap(r.into_inner()).await)
    }
    async fn list_snapshots(
        &self,
        r: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        reply(self.list_snaps(r.into_inner()).await)
    }
    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        reply(self.expand(r.into_inner()).await)
    }
    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        reply(self.get_volume(r.into_inner()).await)
    }
    async fn controller_modify_volume(
        &self,
        r: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        reply(self.modify(r.into_inner()).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_advertised_have_handlers() {
        // Publishing and published-node listing are neither advertised
        // nor served; snapshots, clones and modify are.
        for t in [
            RpcType::PublishUnpublishVolume,
            RpcType::ListVolumesPublishedNodes,
        ] {
            assert!(!CAPABILITIES.contains(&t), "{t:?}");
        }
        let s = publish_unimplemented("ControllerPublishVolume");
        assert_eq!(s.code(), tonic::Code::Unimplemented);
        assert!(s
            .message()
            .starts_with("ControllerPublishVolume is not implemented"));
        for t in [
            RpcType::CreateDeleteSnapshot,
            RpcType::ListSnapshots,
            RpcType::CloneVolume,
            RpcType::ModifyVolume,
        ] {
            assert!(CAPABILITIES.contains(&t), "{t:?}");
        }
        // Controller expansion is advertised only when it is served.
        assert!(capabilities(true).contains(&RpcType::ExpandVolume));
        let off = capabilities(false);
        assert!(!off.contains(&RpcType::ExpandVolume));
        assert_eq!(off.len(), CAPABILITIES.len() - 1);
    }

    #[test]
    fn content_sources_round_trip_through_csi() {
        let id = naming::snapshot_lv_name_for("snap-1");
        let from = ContentSource::Snapshot(id.clone());
        let ids = NodeIds::new("node-1", false);
        let csi = content_source(&from, &ids);
        assert_eq!(
            validate::content_source(Some(&csi), &ids).unwrap(),
            Some(from)
        );
        let vol = ContentSource::Volume(naming::lv_name_for("pvc-1"));
        assert_eq!(
            validate::content_source(Some(&content_source(&vol, &ids)), &ids).unwrap(),
            Some(vol)
        );
        // Ids this driver never issues name nothing that exists.
        let foreign = VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: "other-snap".into(),
                },
            )),
        };
        let e = validate::content_source(Some(&foreign), &ids).unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let empty = VolumeContentSource { r#type: None };
        let e = validate::content_source(Some(&empty), &ids).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
