//! Each controller call, forwarded to the node that holds its object; the
//! node's answer comes back unchanged. Calls that span nodes (the
//! listings, GetCapacity without a node) ask each node in node key order.
//!
//! An object no node holds (every node answered) goes to any one node, so
//! the answer is the node's own: INVALID_ARGUMENT for a bad request before
//! NOT_FOUND, OK for a DeleteVolume of a volume that is gone, as the spec
//! orders them and as on the node's socket.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::nodes::NodeChannel;
use futures_util::Stream;
use tonic::{Response, Status, Streaming};

use super::capacity::Kept;
use super::config::ControllerConfig;
use super::discovery::Finder;
use super::nodes::{Node, Nodes};
use super::route::{Found, Kind, Owner};
use crate::naming;
use crate::proto::csi::v1::controller_client::ControllerClient;
use crate::proto::csi::v1::group_controller_client::GroupControllerClient;
use crate::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use crate::proto::csi::v1::*;
use crate::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use crate::proto::reclaimspace::{ControllerReclaimSpaceRequest, ControllerReclaimSpaceResponse};
use crate::proto::thinpool::cluster::v1::transfer_client::TransferClient;
use crate::proto::thinpool::cluster::v1::{
    CopyFrom, CopyRound, GrantRequest, HashRequest, ReleaseRequest, RoundRequest, RoundResponse,
    VerifyRequest, VerifyResponse,
};

pub struct Cluster {
    pub cfg: ControllerConfig,
    pub nodes: Nodes,
    found: Found,
    /// Lists the node plugins from the cluster (`[discovery]`).
    finder: Option<Arc<Finder>>,
    /// The nodes' capacity, kept from their streams.
    kept: Arc<Kept>,
}

type Reply<T> = Result<T, Status>;

impl Cluster {
    /// The controller with the nodes its config lists, or with `client`
    /// (the Kubernetes API) when it has `[discovery]`: then the first list
    /// is read here, and [`Finder::run`] keeps it current.
    pub async fn new(
        cfg: ControllerConfig,
        client: Option<kube::Client>,
    ) -> Result<Cluster, String> {
        let finder = match (&cfg.discovery, client) {
            (Some(d), Some(client)) => {
                let ns = match d.namespace.as_str() {
                    "" => super::discovery::own_namespace()?,
                    ns => ns.to_string(),
                };
                Some(Arc::new(Finder::new(client, d.clone(), &ns)))
            }
            (Some(_), None) => return Err("discovery needs a Kubernetes client".into()),
            (None, _) => None,
        };
        let cluster = Cluster {
            nodes: Nodes::new(&cfg)?,
            cfg,
            found: Found::default(),
            finder,
            kept: Arc::default(),
        };
        if let Some(f) = &cluster.finder {
            // A controller that cannot list the nodes at start says so;
            // the loop keeps trying.
            match f.refresh(&cluster.nodes).await {
                Ok(n) => tracing::info!(nodes = n, "node plugins listed"),
                Err(e) => tracing::warn!(error = %e, "cannot list the node plugins yet"),
            }
        }
        Ok(cluster)
    }

    /// The nodes' capacity states the controller keeps.
    pub fn kept(&self) -> &Kept {
        &self.kept
    }

    /// The loop that keeps the node list current, when the nodes are
    /// found in the cluster.
    pub fn finder(&self) -> Option<Arc<Finder>> {
        self.finder.clone()
    }

    /// Lists the nodes again (rate-limited) when `known` is false: a call
    /// named a node this controller does not know yet.
    async fn look_again(&self, known: bool) {
        if let (false, Some(f)) = (known, &self.finder) {
            f.refresh_for_miss(&self.nodes).await;
        }
    }

    /// [`Found::owner`], with the node list read again first when `id`
    /// carries a key of no node known.
    async fn owner(&self, id: &str, kind: Kind) -> Reply<Owner> {
        if let (Some(key), _) = naming::split_node(id) {
            self.look_again(self.nodes.by_key(key).is_some()).await;
        }
        let found = self.found.owner(&self.nodes, id, kind).await;
        // A lookup some node did not answer (not reached, or reached at an
        // address another node now holds): list the nodes again, so the
        // sidecar's retry asks the right ones.
        if found
            .as_ref()
            .is_err_and(|s| s.code() == tonic::Code::Unavailable)
        {
            self.look_again(false).await;
        }
        found
    }

    /// The node of node id `id`, the node list read again first when it
    /// is not known.
    async fn by_id(&self, id: &str) -> Option<Arc<Node>> {
        self.look_again(self.nodes.by_id(id).is_some()).await;
        self.nodes.by_id(id)
    }

    /// `node`'s answer to one call, of any of its services: passed on as
    /// it is, but for a failure of the transport, which is said again with
    /// the node named (`Node::failed`) and has the node list read again
    /// (rate-limited): a node plugin whose pod came back at another IP is
    /// found by the CO's retry.
    async fn answer<T>(&self, node: &Node, r: Result<Response<T>, Status>) -> Reply<T> {
        match r {
            Ok(r) => Ok(r.into_inner()),
            Err(s) => {
                // Not reached, or reached at an address another node now
                // holds: list the nodes again.
                let stale = super::nodes::unreached(&s) || crate::channel::answered_by_another(&s);
                if stale {
                    self.kept.forget(node);
                }
                self.look_again(!stale).await;
                Err(node.failed(s))
            }
        }
    }

    /// `call` on the Controller service of `node`.
    async fn on<T, F, Fut>(&self, node: &Node, call: F) -> Reply<T>
    where
        F: FnOnce(ControllerClient<NodeChannel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let r = call(ControllerClient::new(node.channel.clone())).await;
        self.answer(node, r).await
    }

    /// The node of `id` (an empty id is INVALID_ARGUMENT, named as
    /// `field`); one no node holds goes to any node, which answers it.
    async fn node_of(&self, field: &str, id: &str, kind: Kind) -> Reply<Arc<Node>> {
        if id.is_empty() {
            return Err(Status::invalid_argument(format!("{field} is required")));
        }
        match self.owner(id, kind).await? {
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
        F: FnOnce(ControllerClient<NodeChannel>) -> Fut,
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
            Some((_, id, kind)) => self.owner(id, kind).await?,
            None => Owner::Nowhere,
        };
        // A source no node holds: the named node answers (NOT_FOUND for the
        // source, after it checked the rest of the request).
        let node = match held {
            Owner::Node(n) => n,
            Owner::Nowhere => {
                self.named_node(req.accessibility_requirements.as_ref())
                    .await?
            }
        };
        // A snapshot restored on a node the requirements name instead of
        // its own: that node pulls it from the source node.
        let elsewhere = !crate::grpc::validate::topology_allows(
            req.accessibility_requirements.as_ref(),
            &self.cfg.topology_key(),
            &node.id,
        );
        if let (true, Some((_, id, kind))) = (elsewhere, source) {
            let id = id.clone();
            return Ok(self.pulled(&node, &id, kind, req, None).await?.0);
        }
        self.on(&node, |mut c| async move { c.create_volume(req).await })
            .await
    }

    /// CreateVolume of a copy of snapshot `id` of node `source` (or, for
    /// a clone, of volume `id`) on the node the requirements name
    /// (docs/moving.md): a grant of its reads to a peer (`Transfer.Grant`
    /// on its node, which also says the snapshot's size, access and
    /// encryption; for a clone the source node first takes a read-only
    /// snapshot of the volume, or reuses the one it took for this clone),
    /// and the CreateVolume forwarded to the target with it
    /// (`channel::COPY_HEADER`); the target pulls the data from the source
    /// node directly. A source that gives no grant (away, or the snapshot
    /// gone) does not keep a retry from finding a copy the target already
    /// made whole: its error goes to the target, which answers with that
    /// copy, else with the error. Once a clone is whole, the snapshot
    /// taken for it is released (`Transfer.Release`); one left behind (the
    /// release failed, or the clone was abandoned) expires on the source
    /// node.
    ///
    /// `round`, for a move's round (`Move.Round`): the base snapshot the
    /// copy may hold, and whether to hold the copy back once whole. The
    /// target's account of the round comes with its answer.
    async fn pulled(
        &self,
        source: &Arc<Node>,
        id: &str,
        kind: Kind,
        req: CreateVolumeRequest,
        round: Option<(&str, bool)>,
    ) -> Reply<(CreateVolumeResponse, Option<CopyRound>)> {
        let target = self
            .named_node(req.accessibility_requirements.as_ref())
            .await?;
        let clone = matches!(kind, Kind::Volume);
        let ask = match clone {
            false => GrantRequest {
                snapshot_id: id.to_string(),
                base_snapshot_id: round.map(|r| r.0.to_string()).unwrap_or_default(),
                ..Default::default()
            },
            true => GrantRequest {
                volume_id: id.to_string(),
                clone_name: req.name.clone(),
                ..Default::default()
            },
        };
        let grant = TransferClient::new(source.channel.clone()).grant(ask).await;
        let mut copy = CopyFrom {
            node_id: source.id.clone(),
            address: source.address.clone(),
            server_name: self.cfg.node_server_name.clone(),
            ..Default::default()
        };
        match self.answer(source, grant).await {
            Ok(g) => {
                copy.token = g.token;
                copy.snapshot_bytes = g.size_bytes;
                copy.access = g.access;
                copy.encrypted = g.encrypted;
                if clone {
                    copy.snapshot_id = g.snapshot_id;
                }
            }
            Err(s) => {
                copy.source_code = s.code() as i32;
                copy.source_error = s.message().to_string();
            }
        }
        tracing::info!(
            of = id,
            via = copy.snapshot_id,
            clone,
            source = source.id,
            target = target.id,
            size = copy.snapshot_bytes,
            granted = copy.source_code == 0,
            "CreateVolume: a copy of another node's snapshot or volume, pulled by the target node"
        );
        let copy_granted = copy.source_code == 0;
        if let Some((base, hold)) = round {
            copy.base_snapshot_id = base.to_string();
            copy.hold = hold;
        }
        let name = req.name.clone();
        let mut r = tonic::Request::new(req);
        r.metadata_mut().insert_bin(
            crate::channel::COPY_HEADER,
            tonic::metadata::MetadataValue::from_bytes(&prost::Message::encode_to_vec(&copy)),
        );
        let answered = ControllerClient::new(target.channel.clone())
            .create_volume(r)
            .await;
        let told = answered.as_ref().ok().and_then(|a| {
            let v = a.metadata().get_bin(crate::channel::ROUND_HEADER)?;
            prost::Message::decode(v.to_bytes().ok()?).ok()
        });
        let made = self.answer(&target, answered).await.map(|m| (m, told));
        // Released once the clone is whole, or can no longer be made from
        // it (a retry that is not a passing failure's grants anew); kept
        // for a retry of a passing failure, which reads the same snapshot.
        let settled = made
            .as_ref()
            .map_or_else(|s| !crate::cluster::nodes::passing(s), |_| true);
        if clone && settled && copy_granted {
            let release = TransferClient::new(source.channel.clone())
                .release(ReleaseRequest {
                    volume_id: id.to_string(),
                    clone_name: name.clone(),
                })
                .await;
            match self.answer(source, release).await {
                Ok(r) => tracing::info!(
                    volume = id,
                    clone = name,
                    removed = r.removed,
                    "CreateVolume: the clone is whole; released the snapshot taken for it"
                ),
                Err(e) => tracing::warn!(volume = id, clone = name, error = %e.message(),
                    "CreateVolume: could not release the snapshot taken for a clone; it expires on its node"),
            }
        }
        made
    }

    /// `Move.Round` (`tpcsi move`, docs/moving.md): the CreateVolume of
    /// the round, whose content source is a snapshot on another node than
    /// the one its requirements name, pulled by that node with the
    /// round's base and hold ([`Cluster::pulled`]).
    pub async fn move_round(&self, req: RoundRequest) -> Reply<RoundResponse> {
        use volume_content_source::Type;
        let create = req
            .create
            .ok_or_else(|| Status::invalid_argument("create is required"))?;
        let Some(Type::Snapshot(s)) = create
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        else {
            return Err(Status::invalid_argument(
                "a move's round copies a snapshot: create.volume_content_source must name one",
            ));
        };
        let id = s.snapshot_id.clone();
        let Owner::Node(source) = self.owner(&id, Kind::Snapshot).await? else {
            return Err(Status::not_found(format!(
                "snapshot {id:?} is on no node this controller knows"
            )));
        };
        if crate::grpc::validate::topology_allows(
            create.accessibility_requirements.as_ref(),
            &self.cfg.topology_key(),
            &source.id,
        ) {
            return Err(Status::invalid_argument(format!(
                "a move goes to another node: the requirements allow {:?}, the snapshot's own node",
                source.id
            )));
        }
        let (made, round) = self
            .pulled(
                &source,
                &id,
                Kind::Snapshot,
                create,
                Some((&req.base_snapshot_id, req.hold)),
            )
            .await?;
        Ok(RoundResponse {
            volume: made.volume,
            round,
        })
    }

    /// `Move.Verify` (`tpcsi move --final`): the BLAKE3 of each 64 MiB of
    /// the snapshot's whole device on its node and of as much of the new
    /// volume's on its node, read at once on both; equal (answered with
    /// the BLAKE3 of those hashes), or DATA_LOSS naming the bytes that
    /// differ.
    pub async fn move_verify(&self, req: VerifyRequest) -> Reply<VerifyResponse> {
        let volume = self
            .node_of("volume_id", &req.volume_id, Kind::Volume)
            .await?;
        let snapshot = self
            .node_of("snapshot_id", &req.snapshot_id, Kind::Snapshot)
            .await?;
        // The snapshot's size: the new volume may be larger (rounded up to
        // its node's extents), and only that much of it is the copy.
        let listed = ControllerClient::new(snapshot.channel.clone())
            .list_snapshots(ListSnapshotsRequest {
                snapshot_id: req.snapshot_id.clone(),
                ..Default::default()
            })
            .await;
        let length = self
            .answer(&snapshot, listed)
            .await?
            .entries
            .first()
            .and_then(|e| e.snapshot.as_ref())
            .map(|s| s.size_bytes as u64)
            .ok_or_else(|| {
                Status::not_found(format!("snapshot {:?} does not exist", req.snapshot_id))
            })?;
        let ask = |node: &Arc<Node>, r: HashRequest| {
            let c = TransferClient::new(node.channel.clone());
            async move { c.clone().hash(r).await }
        };
        let (v, s) = tokio::join!(
            ask(
                &volume,
                HashRequest {
                    volume_id: req.volume_id.clone(),
                    length_bytes: length,
                    segments: true,
                    ..Default::default()
                }
            ),
            ask(
                &snapshot,
                HashRequest {
                    snapshot_id: req.snapshot_id.clone(),
                    segments: true,
                    ..Default::default()
                }
            )
        );
        let v = self.answer(&volume, v).await?;
        let s = self.answer(&snapshot, s).await?;
        let segments = (length, crate::volume::transfer::SEGMENT_BYTES);
        // A node that answers no segments (an earlier version) compared
        // nothing: never a pass.
        let expected = length.div_ceil(segments.1) as usize;
        for (node, id, got) in [
            (&volume, &req.volume_id, &v),
            (&snapshot, &req.snapshot_id, &s),
        ] {
            if got.segments.len() != expected {
                return Err(Status::failed_precondition(format!(
                    "node {:?} answered {} segment hashes of {id:?} for {length} bytes, not {expected}: it does not hash by segments. What to do: run this version of the node plugin there, then verify again",
                    node.id,
                    got.segments.len()
                )));
            }
        }
        let differ = match v.size_bytes == s.size_bytes {
            true => {
                crate::volume::transfer::segments_that_differ(&v.segments, &s.segments, segments)
            }
            false => Some(format!("0+{}", s.size_bytes.max(v.size_bytes))),
        };
        if let Some(differ) = differ {
            tracing::error!(
                volume = req.volume_id,
                snapshot = req.snapshot_id,
                differ,
                "Move.Verify: the new volume does not hold the snapshot's bytes"
            );
            return Err(Status::data_loss(format!(
                "volume {:?} does not hold snapshot {:?} ({} bytes against {}): bytes {differ} differ. What to do: delete the new volume and move again; the old one is as it was",
                req.volume_id, req.snapshot_id, v.size_bytes, s.size_bytes
            )));
        }
        tracing::info!(
            volume = req.volume_id,
            snapshot = req.snapshot_id,
            size = v.size_bytes,
            "Move.Verify: the new volume holds the snapshot's bytes"
        );
        let mut whole = blake3::Hasher::new();
        for h in &v.segments {
            whole.update(h);
        }
        Ok(VerifyResponse {
            size_bytes: v.size_bytes,
            blake3: whole.finalize().as_bytes().to_vec(),
        })
    }

    /// The node the accessibility requirements name first.
    async fn named_node(&self, req: Option<&TopologyRequirement>) -> Reply<Arc<Node>> {
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
        self.by_id(id).await.ok_or_else(|| {
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
            return match self.owner(id, kind).await? {
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
        let missing = self.nodes.missing();
        if !missing.is_empty() {
            return Err(Status::unavailable(format!(
                "node plugins {} are not listed now: a listing without them would look whole",
                missing.join(", ")
            )));
        }
        let nodes = self.nodes.all();
        if nodes.is_empty() {
            return Err(Status::unavailable(
                "the controller knows no node plugin yet: a listing of none would look whole",
            ));
        }
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
            Some(id) => self.by_id(id).await.into_iter().collect(),
            None => self.nodes.all(),
        };
        let mut sum = GetCapacityResponse::default();
        for node in nodes {
            // The node's kept state answers as the node would; what it
            // cannot answer goes to the node, which is watched from then
            // on.
            let answer = match self.kept.answer(&node, &req).await {
                Some(r) => r,
                None => {
                    self.kept.watch(&node);
                    let r = req.clone();
                    self.on(&node, |mut c| async move { c.get_capacity(r).await })
                        .await
                }
            };
            match answer {
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

impl Cluster {
    /// `call` on the GroupController service of the node that holds `id`.
    async fn to_group_owner<T, F, Fut>(
        &self,
        field: &str,
        id: &str,
        kind: Kind,
        call: F,
    ) -> Reply<T>
    where
        F: FnOnce(GroupControllerClient<NodeChannel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let node = self.node_of(field, id, kind).await?;
        let r = call(GroupControllerClient::new(node.channel.clone())).await;
        self.answer(&node, r).await
    }

    /// CreateVolumeGroupSnapshot on the node that holds every member. A
    /// group is taken on one node (its members held still together there,
    /// docs/behaviour.md): members on two nodes are INVALID_ARGUMENT,
    /// naming them. Members no node holds leave the call to a node that
    /// holds the others (or any), which answers NOT_FOUND for them.
    pub async fn create_group(
        &self,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> Reply<CreateVolumeGroupSnapshotResponse> {
        let mut on: BTreeMap<String, (Arc<Node>, Vec<&str>)> = BTreeMap::new();
        for id in req.source_volume_ids.iter().filter(|id| !id.is_empty()) {
            if let Owner::Node(n) = self.owner(id, Kind::Volume).await? {
                on.entry(n.key.clone())
                    .or_insert_with(|| (n.clone(), vec![]))
                    .1
                    .push(id);
            }
        }
        let node = match on.len() {
            0 => self.any()?,
            1 => on.into_values().next().expect("one node").0,
            _ => {
                let spread: Vec<String> = on
                    .values()
                    .map(|(n, ids)| format!("{} on node {}", ids.join(", "), n.id))
                    .collect();
                return Err(Status::invalid_argument(format!(
                    "source_volume_ids are on more than one node ({}): a group snapshot is taken on one node",
                    spread.join("; ")
                )));
            }
        };
        let r = GroupControllerClient::new(node.channel.clone())
            .create_volume_group_snapshot(req)
            .await;
        self.answer(&node, r).await
    }

    pub async fn delete_group(
        &self,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> Reply<DeleteVolumeGroupSnapshotResponse> {
        let id = req.group_snapshot_id.clone();
        self.to_group_owner("group_snapshot_id", &id, Kind::Group, |mut c| async move {
            c.delete_volume_group_snapshot(req).await
        })
        .await
    }

    pub async fn get_group(
        &self,
        req: GetVolumeGroupSnapshotRequest,
    ) -> Reply<GetVolumeGroupSnapshotResponse> {
        let id = req.group_snapshot_id.clone();
        self.to_group_owner("group_snapshot_id", &id, Kind::Group, |mut c| async move {
            c.get_volume_group_snapshot(req).await
        })
        .await
    }

    /// GetMetadataAllocated, streamed from the node of the snapshot.
    pub async fn metadata_allocated(
        &self,
        req: GetMetadataAllocatedRequest,
    ) -> Reply<Relay<GetMetadataAllocatedResponse>> {
        let node = self
            .node_of("snapshot_id", &req.snapshot_id, Kind::Snapshot)
            .await?;
        let r = SnapshotMetadataClient::new(node.channel.clone())
            .get_metadata_allocated(req)
            .await
            // The whole response goes on: the relay reads its headers.
            .map(Response::new);
        let s = self.answer(&node, r).await?;
        Ok(relay(node, s))
    }

    /// GetMetadataDelta, streamed from the node of the target snapshot
    /// (the base is on the same node, or that node answers NOT_FOUND).
    pub async fn metadata_delta(
        &self,
        req: GetMetadataDeltaRequest,
    ) -> Reply<Relay<GetMetadataDeltaResponse>> {
        let node = self
            .node_of(
                "target_snapshot_id",
                &req.target_snapshot_id,
                Kind::Snapshot,
            )
            .await?;
        let r = SnapshotMetadataClient::new(node.channel.clone())
            .get_metadata_delta(req)
            .await
            // The whole response goes on: the relay reads its headers.
            .map(Response::new);
        let s = self.answer(&node, r).await?;
        Ok(relay(node, s))
    }
}

impl Cluster {
    /// CSI-Addons ControllerReclaimSpace, on the node of the volume.
    pub async fn controller_reclaim(
        &self,
        req: ControllerReclaimSpaceRequest,
    ) -> Reply<ControllerReclaimSpaceResponse> {
        let node = self
            .node_of("volume_id", &req.volume_id, Kind::Volume)
            .await?;
        let r = ReclaimSpaceControllerClient::new(node.channel.clone())
            .controller_reclaim_space(req)
            .await;
        self.answer(&node, r).await
    }
}

/// A node's stream as the controller passes it on.
pub type Relay<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The node's stream, item for item. It ends OK only where the node's
/// ended OK with its status: a stream cut short (the node killed, the
/// link down) or one that ends without a status ends with an error, never
/// OK after partial ranges (a backup tool would take them as whole).
pub fn relay<T: Send + 'static>(node: Arc<Node>, r: Response<Streaming<T>>) -> Relay<T> {
    // An OK status already in the response's headers (a trailers-only
    // answer: an empty stream) is the node's OK.
    let ok_in_headers = r
        .metadata()
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"0");
    let s = r.into_inner();
    Box::pin(futures_util::stream::unfold(Some(s), move |state| {
        let node = node.clone();
        async move {
            let mut s = state?;
            match s.message().await {
                Ok(Some(m)) => Some((Ok(m), Some(s))),
                Ok(None) => match s.trailers().await {
                    Ok(Some(_)) => None,
                    Ok(None) if ok_in_headers => None,
                    Ok(None) => Some((
                        Err(Status::unavailable(format!(
                            "node {:?} ended the stream without its status: it may be cut short",
                            node.id
                        ))),
                        None,
                    )),
                    Err(e) => Some((Err(node.failed(e)), None)),
                },
                Err(e) => Some((Err(node.failed(e)), None)),
            }
        }
    }))
}

/// Whether a node's call failed for want of the node, not by its answer.
fn is_unreachable(s: &Status) -> bool {
    s.code() == tonic::Code::Unavailable
}
