//! Each controller call, forwarded to the node that holds its object; the
//! node's answer comes back unchanged. Calls that span nodes (the
//! listings, GetCapacity without a node) ask each node in node key order.
//!
//! An object no node holds (every node answered) goes to any one node, so
//! the answer is the node's own: INVALID_ARGUMENT for a bad request before
//! NOT_FOUND, OK for a DeleteVolume of a volume that is gone, as the spec
//! orders them and as on the node's socket.

use std::future::Future;
use std::sync::Arc;

use tonic::transport::Channel;
use tonic::{Response, Status};

use super::config::ControllerConfig;
use super::nodes::{Node, Nodes};
use super::route::{Found, Kind, Owner};
use crate::naming;
use crate::proto::csi::v1::controller_client::ControllerClient;
use crate::proto::csi::v1::*;

pub struct Cluster {
    pub cfg: ControllerConfig,
    pub nodes: Nodes,
    found: Found,
}

type Reply<T> = Result<T, Status>;

impl Cluster {
    pub fn new(cfg: ControllerConfig) -> Result<Cluster, String> {
        Ok(Cluster {
            nodes: Nodes::new(&cfg)?,
            cfg,
            found: Found::default(),
        })
    }

    /// `call` on the Controller service of `node`.
    async fn on<T, F, Fut>(&self, node: &Node, call: F) -> Reply<T>
    where
        F: FnOnce(ControllerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        call(ControllerClient::new(node.channel.clone()))
            .await
            .map(Response::into_inner)
            .map_err(|s| node.failed(s))
    }

    /// The node of `id` (an empty id is INVALID_ARGUMENT, named as
    /// `field`); one no node holds goes to any node, which answers it.
    async fn node_of(&self, field: &str, id: &str, kind: Kind) -> Reply<Arc<Node>> {
        if id.is_empty() {
            return Err(Status::invalid_argument(format!("{field} is required")));
        }
        match self.found.owner(&self.nodes, id, kind).await? {
            Owner::Node(n) => Ok(n),
            Owner::Nowhere => self.any(),
        }
    }

    fn any(&self) -> Reply<Arc<Node>> {
        self.nodes.all().into_iter().next().ok_or_else(|| {
            Status::unavailable("the controller knows no node plugin yet".to_string())
        })
    }

    /// `call` on the node that holds `id`.
    async fn to_owner<T, F, Fut>(&self, field: &str, id: &str, kind: Kind, call: F) -> Reply<T>
    where
        F: FnOnce(ControllerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let node = self.node_of(field, id, kind).await?;
        self.on(&node, call).await
    }

    /// CreateVolume: a copy goes to the node of its source (the only one
    /// that can make it; that node judges the accessibility requirements,
    /// as on its socket); any other to the node the requirements name
    /// first (preferred, then requisite).
    pub async fn create_volume(&self, req: CreateVolumeRequest) -> Reply<CreateVolumeResponse> {
        use volume_content_source::Type;
        let source = match req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(Type::Snapshot(s)) => Some(("snapshot_id", &s.snapshot_id, Kind::Snapshot)),
            Some(Type::Volume(v)) => Some(("volume_id", &v.volume_id, Kind::Volume)),
            None => None,
        };
        let held = match source {
            Some((field, id, _)) if id.is_empty() => {
                return Err(Status::invalid_argument(format!(
                    "volume_content_source: {field} is required"
                )))
            }
            Some((_, id, kind)) => self.found.owner(&self.nodes, id, kind).await?,
            None => Owner::Nowhere,
        };
        // A source no node holds: the named node answers (NOT_FOUND for the
        // source, after it checked the rest of the request).
        let node = match held {
            Owner::Node(n) => n,
            Owner::Nowhere => self.named_node(req.accessibility_requirements.as_ref())?,
        };
        self.on(&node, |mut c| async move { c.create_volume(req).await })
            .await
    }

    /// The node the accessibility requirements name first.
    fn named_node(&self, req: Option<&TopologyRequirement>) -> Reply<Arc<Node>> {
        let key = self.cfg.topology_key();
        let id = req
            .into_iter()
            .flat_map(|r| r.preferred.iter().chain(&r.requisite))
            .find_map(|t| t.segments.get(&key))
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "accessibility_requirements name no node ({key}): a volume is made on one node (run the provisioner with --feature-gates=Topology=true and --strict-topology)"
                ))
            })?;
        self.nodes.by_id(id).ok_or_else(|| {
            Status::unavailable(format!(
                "node {id:?} has no node plugin this controller knows now"
            ))
        })
    }

    pub async fn delete_volume(&self, req: DeleteVolumeRequest) -> Reply<DeleteVolumeResponse> {
        let id = req.volume_id.clone();
        self.to_owner("volume_id", &id, Kind::Volume, |mut c| async move {
            c.delete_volume(req).await
        })
        .await
    }

    pub async fn publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Reply<ControllerPublishVolumeResponse> {
        let id = req.volume_id.clone();
        self.to_owner("volume_id", &id, Kind::Volume, |mut c| async move {
            c.controller_publish_volume(req).await
        })
        .await
    }

    /// ControllerUnpublishVolume is answered here: a node's keeps no state
    /// and answers OK to every well-formed request (`grpc::controller`),
    /// so forwarding it could only turn OK into UNAVAILABLE for a node that
    /// is gone, and leave its VolumeAttachments stuck.
    pub async fn unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Reply<ControllerUnpublishVolumeResponse> {
        crate::grpc::validate::required_string("volume_id", &req.volume_id)
            .and_then(|_| crate::grpc::validate::optional_string("node_id", &req.node_id))
            .map_err(Status::from)?;
        Ok(ControllerUnpublishVolumeResponse {})
    }

    pub async fn validate_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Reply<ValidateVolumeCapabilitiesResponse> {
        let id = req.volume_id.clone();
        self.to_owner("volume_id", &id, Kind::Volume, |mut c| async move {
            c.validate_volume_capabilities(req).await
        })
        .await
    }

    pub async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Reply<ControllerExpandVolumeResponse> {
        let id = req.volume_id.clone();
        self.to_owner("volume_id", &id, Kind::Volume, |mut c| async move {
            c.controller_expand_volume(req).await
        })
        .await
    }

    pub async fn get_volume(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Reply<ControllerGetVolumeResponse> {
        let id = req.volume_id.clone();
        self.to_owner("volume_id", &id, Kind::Volume, |mut c| async move {
            c.controller_get_volume(req).await
        })
        .await
    }

    pub async fn modify(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Reply<ControllerModifyVolumeResponse> {
        let id = req.volume_id.clone();
        self.to_owner("volume_id", &id, Kind::Volume, |mut c| async move {
            c.controller_modify_volume(req).await
        })
        .await
    }

    pub async fn create_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Reply<CreateSnapshotResponse> {
        let id = req.source_volume_id.clone();
        self.to_owner("source_volume_id", &id, Kind::Volume, |mut c| async move {
            c.create_snapshot(req).await
        })
        .await
    }

    pub async fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Reply<DeleteSnapshotResponse> {
        let id = req.snapshot_id.clone();
        self.to_owner("snapshot_id", &id, Kind::Snapshot, |mut c| async move {
            c.delete_snapshot(req).await
        })
        .await
    }

    /// ListVolumes over every node, in node key order: a page takes from
    /// the node its token names on, then the next nodes, until it holds
    /// `max_entries`. A node that does not answer fails the page
    /// (UNAVAILABLE): a listing that left it out would look whole.
    pub async fn list_volumes(&self, req: ListVolumesRequest) -> Reply<ListVolumesResponse> {
        let (entries, next_token) = self
            .pages(
                req.max_entries,
                req.starting_token,
                |node, max, token| async move {
                    let r = self
                        .on(&node, |mut c| async move {
                            c.list_volumes(ListVolumesRequest {
                                max_entries: max,
                                starting_token: token,
                            })
                            .await
                        })
                        .await?;
                    Ok((r.entries, r.next_token))
                },
                |e| {
                    e.volume
                        .as_ref()
                        .map(|v| v.volume_id.clone())
                        .unwrap_or_default()
                },
            )
            .await?;
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    /// ListSnapshots: by snapshot or source id on the node that holds it
    /// (nothing when none does), else over every node as
    /// [`Cluster::list_volumes`] pages.
    pub async fn list_snapshots(&self, req: ListSnapshotsRequest) -> Reply<ListSnapshotsResponse> {
        let by = [
            (&req.snapshot_id, Kind::Snapshot),
            (&req.source_volume_id, Kind::Volume),
        ]
        .into_iter()
        .find(|(id, _)| !id.is_empty());
        if let Some((id, kind)) = by {
            return match self.found.owner(&self.nodes, id, kind).await? {
                Owner::Node(n) => {
                    self.on(&n, |mut c| async move { c.list_snapshots(req).await })
                        .await
                }
                Owner::Nowhere => Ok(ListSnapshotsResponse::default()),
            };
        }
        let (entries, next_token) = self
            .pages(
                req.max_entries,
                req.starting_token,
                |node, max, token| {
                    let secrets = req.secrets.clone();
                    async move {
                        let r = self
                            .on(&node, |mut c| async move {
                                c.list_snapshots(ListSnapshotsRequest {
                                    max_entries: max,
                                    starting_token: token,
                                    secrets,
                                    ..Default::default()
                                })
                                .await
                            })
                            .await?;
                        Ok((r.entries, r.next_token))
                    }
                },
                |e| {
                    e.snapshot
                        .as_ref()
                        .map(|s| s.snapshot_id.clone())
                        .unwrap_or_default()
                },
            )
            .await?;
        Ok(ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    /// One page across the nodes: `page(node, max, token)` asks one node.
    /// A token is a keyed id (nodes on a cluster mint their key), so it
    /// names the node the listing goes on from.
    /// `id` reads an item's id: a page that fills up at the end of a node's
    /// items ends at its last id, which that node takes as a token.
    async fn pages<T, F, Fut>(
        &self,
        max_entries: i32,
        token: String,
        page: F,
        id: fn(&T) -> String,
    ) -> Reply<(Vec<T>, String)>
    where
        F: Fn(Arc<Node>, i32, String) -> Fut,
        Fut: Future<Output = Reply<(Vec<T>, String)>>,
    {
        if max_entries < 0 {
            return Err(Status::invalid_argument("max_entries must not be negative"));
        }
        let refused = self.nodes.refused();
        if !refused.is_empty() {
            return Err(Status::unavailable(format!(
                "nodes {} share a node key and cannot be listed: a listing without them would look whole",
                refused.join(", ")
            )));
        }
        let nodes = self.nodes.all();
        let mut start = 0;
        let mut token = token;
        if !token.is_empty() {
            let key = naming::split_node(&token).0;
            start = key
                .and_then(|k| nodes.iter().position(|n| n.key == k))
                .ok_or_else(|| {
                    Status::aborted(format!(
                        "starting_token {token:?} names no node this controller knows: start the listing again with an empty starting_token"
                    ))
                })?;
        }
        let mut out = Vec::new();
        for node in &nodes[start..] {
            let left = match max_entries {
                0 => 0,
                m => m - out.len() as i32,
            };
            let (items, next) = page(node.clone(), left, std::mem::take(&mut token)).await?;
            out.extend(items);
            if !next.is_empty() {
                return Ok((out, next));
            }
            if max_entries > 0 && out.len() as i32 >= max_entries {
                // Full at this node's end: the next page asks this node
                // after its last id (nothing), then goes on to the next.
                let last = out.last().map(id).unwrap_or_default();
                return Ok((out, last));
            }
        }
        Ok((out, String::new()))
    }

    /// GetCapacity: of the node the topology names, 0 when that node cannot
    /// be reached (never a promise it cannot keep); without a node, the sum
    /// of every node that answers.
    pub async fn capacity(&self, req: GetCapacityRequest) -> Reply<GetCapacityResponse> {
        let key = self.cfg.topology_key();
        let named = req
            .accessible_topology
            .as_ref()
            .and_then(|t| t.segments.get(&key))
            .cloned();
        let nodes = match &named {
            Some(id) => self.nodes.by_id(id).into_iter().collect(),
            None => self.nodes.all(),
        };
        let mut sum = GetCapacityResponse::default();
        for node in nodes {
            let r = req.clone();
            match self
                .on(&node, |mut c| async move { c.get_capacity(r).await })
                .await
            {
                Ok(r) => {
                    sum.available_capacity += r.available_capacity;
                    sum.maximum_volume_size = sum.maximum_volume_size.max(r.maximum_volume_size);
                    sum.minimum_volume_size = sum.minimum_volume_size.or(r.minimum_volume_size);
                }
                // A node's own refusal of the request is the answer.
                Err(e) if !is_unreachable(&e) => return Err(e),
                Err(e) => {
                    tracing::warn!(node = node.id, error = %e.message(), "GetCapacity counts a node that did not answer as 0");
                }
            }
        }
        Ok(sum)
    }
}

/// Whether a node's call failed for want of the node, not by its answer.
fn is_unreachable(s: &Status) -> bool {
    s.code() == tonic::Code::Unavailable
}
