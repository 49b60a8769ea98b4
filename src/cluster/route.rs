//! The node of an id (docs/cluster.md, "The node of an object"): the node
//! its key names; for an id without a key (minted before the cluster),
//! the node that answers for it, asked of every node at most
//! [`LOOKUPS_AT_ONCE`] at a time and kept in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::stream::{self, StreamExt};
use tonic::{Code, Status};

use super::nodes::{Node, Nodes};
use crate::naming;
use crate::proto::csi::v1::controller_client::ControllerClient;
use crate::proto::csi::v1::group_controller_client::GroupControllerClient;
use crate::proto::csi::v1::{
    ControllerGetVolumeRequest, GetVolumeGroupSnapshotRequest, ListSnapshotsRequest,
};

/// Nodes asked at once about an id without a key.
pub const LOOKUPS_AT_ONCE: usize = 8;

/// What an id names: where an id without a key is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Volume,
    Snapshot,
    Group,
}

/// Where a call goes.
pub enum Owner {
    /// The node that holds the object.
    Node(Arc<Node>),
    /// Every node answered, and none holds it.
    Nowhere,
}

#[derive(Default)]
pub struct Found(Mutex<HashMap<String, String>>);

impl Found {
    /// The node of `id`. A key that names no node the controller knows is
    /// UNAVAILABLE (the node may be gone, or not yet listed); so is an id
    /// without a key that some node did not answer for, since it may be
    /// there.
    pub async fn owner(&self, nodes: &Nodes, id: &str, kind: Kind) -> Result<Owner, Status> {
        if let (Some(key), _) = naming::split_node(id) {
            return nodes.by_key(key).map(Owner::Node).ok_or_else(|| {
                Status::unavailable(format!(
                    "{id:?} is on a node (key {key}) this controller does not know now: the node is gone or not yet listed"
                ))
            });
        }
        // An id of no shape the nodes issue is on no node: any node says
        // so (no round of questions).
        let issued = match kind {
            Kind::Volume => naming::is_volume_id(id),
            Kind::Snapshot => naming::is_snapshot_id(id),
            Kind::Group => naming::is_group_id(id),
        };
        if !issued {
            return Ok(Owner::Nowhere);
        }
        let known = self.0.lock().unwrap().get(id).cloned();
        if let Some(key) = known {
            match nodes.by_key(&key) {
                Some(node) => return Ok(Owner::Node(node)),
                None if nodes.is_missing(&key) => {
                    return Err(Status::unavailable(format!(
                        "{id:?} is on a node plugin that is not listed now: the node is being replaced or drained"
                    )))
                }
                None => {}
            }
        }
        let all = nodes.all();
        let answers: Vec<(Arc<Node>, Result<bool, Status>)> = stream::iter(all)
            .map(|n| async move {
                let held = holds(&n, id, kind).await;
                (n, held)
            })
            .buffer_unordered(LOOKUPS_AT_ONCE)
            .collect()
            .await;
        // Nodes left out for sharing a key cannot be asked.
        // Nor can nodes listed before and not now: they may hold it.
        let mut silent: Vec<String> = nodes
            .refused()
            .into_iter()
            .map(|id| format!("{id} (shares its node key)"))
            .chain(
                nodes
                    .missing()
                    .into_iter()
                    .map(|id| format!("{id} (not listed now)")),
            )
            .collect();
        let mut holders = Vec::new();
        for (node, held) in answers {
            match held {
                Ok(true) => holders.push(node),
                Ok(false) => {}
                Err(e) => silent.push(format!("{} ({})", node.id, e.message())),
            }
        }
        match holders.len() {
            0 if silent.is_empty() => return Ok(Owner::Nowhere),
            0 => {}
            1 => {
                let node = holders.pop().expect("one holder");
                tracing::info!(
                    id,
                    node = node.id,
                    "found the node of an id without a node key"
                );
                self.0
                    .lock()
                    .unwrap()
                    .insert(id.to_string(), node.key.clone());
                return Ok(Owner::Node(node));
            }
            // The same name made on two nodes (a CreateVolume that moved
            // to another node before this cluster): acting on either could
            // be acting on the wrong one.
            _ => {
                let on: Vec<&str> = holders.iter().map(|n| n.id.as_str()).collect();
                return Err(Status::failed_precondition(format!(
                    "{id:?} is on more than one node ({}): remove the copy no PV uses (lvremove on its node), then retry",
                    on.join(", ")
                )));
            }
        }
        Err(Status::unavailable(format!(
            "no node that answered holds {id:?}, and these did not answer: {}",
            silent.join(", ")
        )))
    }
}

/// Whether `node` holds `id`: `Err` when it did not say.
async fn holds(node: &Node, id: &str, kind: Kind) -> Result<bool, Status> {
    let mut c = ControllerClient::new(node.channel.clone());
    let held = match kind {
        Kind::Group => GroupControllerClient::new(node.channel.clone())
            .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
                group_snapshot_id: id.to_string(),
                ..Default::default()
            })
            .await
            .map(|_| true),
        Kind::Volume => c
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: id.to_string(),
            })
            .await
            .map(|_| true),
        Kind::Snapshot => c
            .list_snapshots(ListSnapshotsRequest {
                snapshot_id: id.to_string(),
                ..Default::default()
            })
            .await
            .map(|r| !r.into_inner().entries.is_empty()),
    };
    match held {
        Err(s) if s.code() == Code::NotFound => Ok(false),
        other => other.map_err(|s| node.failed(s)),
    }
}
