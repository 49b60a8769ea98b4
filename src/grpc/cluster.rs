//! The node's side of the cluster's own services
//! (`proto/thinpool/cluster/v1/cluster.proto`), served on the internal
//! channel only: `Capacity.Watch`, the node's capacity for the
//! controller to keep (docs/cluster.md, "GetCapacity").

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::controller::{capacity_response, class_shapes};
use crate::proto::thinpool::cluster::v1::capacity_server::Capacity;
use crate::proto::thinpool::cluster::v1::{CapacityState, ClassCapacity, WatchCapacityRequest};
use crate::volume::classes::Classes;

pub struct CapacityService {
    pub classes: Arc<Classes>,
}

type StateStream = Pin<Box<dyn Stream<Item = Result<CapacityState, Status>> + Send>>;

#[tonic::async_trait]
impl Capacity for CapacityService {
    type WatchStream = StateStream;

    /// The state now, then one after every change (`lvm::Changes`; changes
    /// that come quicker than the caller reads fold into one), until the
    /// caller goes away. Nothing is sent while nothing changes, and no
    /// LVM command runs for it: the figures come from the cached report.
    async fn watch(
        &self,
        _r: Request<WatchCapacityRequest>,
    ) -> Result<Response<StateStream>, Status> {
        let classes = self.classes.clone();
        let mut changes = classes.changes().subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                // Read before the figures: they hold at least every change
                // counted up to it.
                let state = capacity_state(&classes, classes.changes().now());
                if tx.send(Ok(state)).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = changes.changed() => if r.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// What GetCapacity would answer for each class from the cached reports,
/// at change counter `generation`.
fn capacity_state(classes: &Classes, generation: u64) -> CapacityState {
    let base = classes.base();
    let shapes = class_shapes(classes);
    CapacityState {
        generation,
        node_id: base.node_id.clone(),
        topology_key: base.topology_key(),
        default_class: classes.default_index() as u32,
        classes: classes
            .all()
            .iter()
            .zip(shapes)
            .map(|(d, shape)| {
                let mut c = ClassCapacity {
                    name: shape.name.to_string(),
                    volume_group: shape.vg.to_string(),
                    thin_pool: shape.pool.to_string(),
                    default_fs_type: shape.default_fs_type.to_string(),
                    ..Default::default()
                };
                if let Some((cap, extent, fresh_for)) = d.cached_capacity() {
                    let r = capacity_response(&cap, extent);
                    c.known = true;
                    c.fresh_for_ms = fresh_for.as_millis() as u64;
                    c.available_capacity = r.available_capacity;
                    c.maximum_volume_size = r.maximum_volume_size.unwrap_or(0);
                    c.minimum_volume_size = r.minimum_volume_size.unwrap_or(0);
                }
                c
            })
            .collect(),
    }
}
