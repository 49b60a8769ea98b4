//! CSI GroupController service (alpha): group snapshots of several
//! volumes, crash-consistent across them (see `crate::volume::group`).

use std::collections::BTreeSet;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{reply, validate};
use crate::error::{Error, Result};
use crate::naming::{self, NodeIds};
use crate::proto::csi::v1::group_controller_server::GroupController;
use crate::proto::csi::v1::group_controller_service_capability::rpc::Type as RpcType;
use crate::proto::csi::v1::group_controller_service_capability::{Rpc, Type as CapType};
use crate::proto::csi::v1::*;
use crate::volume::classes::Classes;
use crate::volume::group::GroupInfo;

pub struct GroupService {
    pub classes: Arc<Classes>,
}

fn group(g: &GroupInfo, ids: &NodeIds) -> VolumeGroupSnapshot {
    VolumeGroupSnapshot {
        group_snapshot_id: ids.public(g.id.clone()),
        snapshots: g
            .snapshots
            .iter()
            .map(|s| super::controller::snapshot(s, ids))
            .collect(),
        creation_time: g
            .created
            .map(|seconds| prost_types::Timestamp { seconds, nanos: 0 }),
        ready_to_use: true,
    }
}

/// A group id in a request: `Ok(None)` when well formed for CSI but not
/// an id this driver issues.
fn group_id(id: &str, ids: &NodeIds) -> Result<Option<String>> {
    validate::required_string("group_snapshot_id", id)?;
    Ok(ids
        .local(id)
        .filter(|id| naming::is_group_id(id))
        .map(str::to_string))
}

/// The member ids a request names, without this node's key; one with
/// another node's key stays as it is, and matches no member here.
fn local_ids(named: &[String], ids: &NodeIds) -> Vec<String> {
    named
        .iter()
        .map(|s| ids.local(s).unwrap_or(s).to_string())
        .collect()
}

impl GroupService {
    async fn create(
        &self,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> Result<CreateVolumeGroupSnapshotResponse> {
        let name = validate::required_string("name", &req.name)?;
        if req.source_volume_ids.is_empty() {
            return Err(Error::InvalidArgument(
                "source_volume_ids is required".into(),
            ));
        }
        // One volume named with and without this node's key is named twice.
        let unique: BTreeSet<String> = local_ids(&req.source_volume_ids, self.classes.ids())
            .into_iter()
            .collect();
        if unique.len() != req.source_volume_ids.len() {
            return Err(Error::InvalidArgument(
                "source_volume_ids names a volume twice".into(),
            ));
        }
        validate::snapshot_parameters(
            validate::Carrier::CreateVolumeGroupSnapshot,
            &req.parameters,
        )?;
        let sources = req
            .source_volume_ids
            .iter()
            .map(|id| validate::existing_volume_id(id, self.classes.ids()))
            .collect::<Result<Vec<_>>>()?;
        // The first volume's class takes the group; a member of another
        // class is refused there (`Volumes::refuse_other_class`).
        let g = self
            .classes
            .of(&sources[0])?
            .create_group(name.to_string(), sources)
            .await?;
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group(&g, self.classes.ids())),
        })
    }

    async fn delete(
        &self,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> Result<DeleteVolumeGroupSnapshotResponse> {
        let Some(id) = group_id(&req.group_snapshot_id, self.classes.ids())? else {
            validate::not_elsewhere(
                "group_snapshot_id",
                &req.group_snapshot_id,
                self.classes.ids(),
            )?;
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        };
        self.classes
            .of_to_delete(&id)?
            .delete_group(id, local_ids(&req.snapshot_ids, self.classes.ids()))
            .await?;
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    async fn get(
        &self,
        req: GetVolumeGroupSnapshotRequest,
    ) -> Result<GetVolumeGroupSnapshotResponse> {
        let id = group_id(&req.group_snapshot_id, self.classes.ids())?.ok_or_else(|| {
            Error::NotFound(format!(
                "group snapshot {:?} does not exist",
                req.group_snapshot_id
            ))
        })?;
        let g = self
            .classes
            .of(&id)?
            .get_group(&id, &local_ids(&req.snapshot_ids, self.classes.ids()))
            .await?;
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group(&g, self.classes.ids())),
        })
    }
}

/// What the GroupController serves (here, and forwarded by the cluster's
/// controller).
pub fn capabilities() -> Vec<GroupControllerServiceCapability> {
    vec![GroupControllerServiceCapability {
        r#type: Some(CapType::Rpc(Rpc {
            r#type: RpcType::CreateDeleteGetVolumeGroupSnapshot as i32,
        })),
    }]
}

#[tonic::async_trait]
impl GroupController for GroupService {
    async fn group_controller_get_capabilities(
        &self,
        _r: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> std::result::Result<Response<GroupControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: capabilities(),
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        r: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> std::result::Result<Response<CreateVolumeGroupSnapshotResponse>, Status> {
        reply(self.create(r.into_inner()).await)
    }

    async fn delete_volume_group_snapshot(
        &self,
        r: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> std::result::Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        reply(self.delete(r.into_inner()).await)
    }

    async fn get_volume_group_snapshot(
        &self,
        r: Request<GetVolumeGroupSnapshotRequest>,
    ) -> std::result::Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        reply(self.get(r.into_inner()).await)
    }
}
