//! The node's side of the cluster's own services
//! (`proto/thinpool/cluster/v1/cluster.proto`), served on the internal
//! channel only: `Capacity.Watch`, the node's capacity for the
//! controller to keep (docs/cluster.md, "GetCapacity"), and
//! `Transfer.Read`, a snapshot's mapped data for a copy on another node
//! (docs/moving.md).

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::controller::{capacity_response, class_shapes};
use crate::error::Error;
use crate::proto::thinpool::cluster::v1::capacity_server::Capacity;
use crate::proto::thinpool::cluster::v1::transfer_server::Transfer;
use crate::proto::thinpool::cluster::v1::{
    read_item, CapacityState, ClassCapacity, DataRange, GrantRequest, GrantResponse, HashRequest,
    HashResponse, ReadHeader, ReadItem, ReadRequest, ReadSummary, ReleaseRequest, ReleaseResponse,
    WatchCapacityRequest,
};
use crate::volume::classes::Classes;
use crate::volume::controller::CachedCapacity;
use crate::volume::transfer::{HashOf, Piece};
use tokio_stream::StreamExt;

pub struct CapacityService {
    pub classes: Arc<Classes>,
    /// Turns true when the channel's server stops: every stream ends.
    pub stopping: tokio::sync::watch::Receiver<bool>,
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
        let mut stopping = self.stopping.clone();
        let mut changes = classes.changes().subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                // Read before the figures: they hold at least every change
                // counted up to it. A report a caller still holds, with
                // writes not yet in it, is not copied for this: asked
                // again shortly (the caller lets it go as its call ends),
                // else sent as unknown.
                let mut state = capacity_state(&classes, classes.changes().now());
                for _ in 0..HELD_RETRIES {
                    if !state.1 {
                        break;
                    }
                    tokio::time::sleep(HELD_WAIT).await;
                    state = capacity_state(&classes, classes.changes().now());
                }
                let state = state.0;
                if tx.send(Ok(state)).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = changes.changed() => if r.is_err() { return },
                    _ = tx.closed() => return,
                    _ = stopping.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// How often, and how long apart, a state with a held report is taken
/// again before it is sent with that class unknown.
const HELD_RETRIES: usize = 40;
const HELD_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// What GetCapacity would answer for each class from the cached reports,
/// at change counter `generation`; and whether a class's report was held
/// with writes not in it (that class is unknown).
fn capacity_state(classes: &Classes, generation: u64) -> (CapacityState, bool) {
    let mut held = false;
    let base = classes.base();
    let shapes = class_shapes(classes);
    let state = CapacityState {
        generation,
        driver_version: env!("CARGO_PKG_VERSION").to_string(),
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
                match d.cached_capacity() {
                    CachedCapacity::Known(cap, extent, fresh_for) => {
                        let r = capacity_response(&cap, extent);
                        c.known = true;
                        c.fresh_for_ms = fresh_for.as_millis() as u64;
                        c.available_capacity = r.available_capacity;
                        c.maximum_volume_size = r.maximum_volume_size.unwrap_or(0);
                        c.minimum_volume_size = r.minimum_volume_size.unwrap_or(0);
                    }
                    CachedCapacity::Held => held = true,
                    CachedCapacity::Unknown => {}
                }
                c
            })
            .collect(),
    };
    (state, held)
}

/// `Transfer.Read`: a snapshot's mapped data for a copy on another node
/// (`volume::transfer`).
pub struct TransferService {
    pub classes: Arc<Classes>,
    /// Turns true when the channel's server stops: every read ends.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

/// A peer's grant header (empty when it sent none); `None` for the
/// controller's calls.
fn grant_of<T>(r: &Request<T>) -> Option<String> {
    r.extensions().get::<crate::channel::Peer>().map(|_| {
        r.metadata()
            .get(crate::channel::GRANT_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    })
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<ReadItem, Status>> + Send>>;

impl TransferService {
    /// The snapshot a transfer call names (NOT_FOUND for an id no node
    /// issues, or one of another node).
    fn snapshot(&self, id: &str) -> crate::error::Result<crate::volume::SnapshotId> {
        super::validate::snapshot_id("snapshot_id", id, self.classes.ids())?
            .ok_or_else(|| crate::error::Error::NotFound(format!("snapshot {id:?} does not exist")))
    }

    /// The snapshot a `Transfer.Read` or `Transfer.Hash` names. A peer
    /// (`token`: its grant header, `channel::PeerGate`) learns nothing of
    /// a snapshot without a live grant of it (and of `base`, the one a
    /// delta read is against): an id this node does not hold is refused
    /// as any ungranted one.
    fn granted(
        &self,
        id: &str,
        base: Option<&str>,
        token: Option<&str>,
    ) -> crate::error::Result<crate::volume::SnapshotId> {
        let Some(t) = token else {
            return self.snapshot(id);
        };
        let base = base.map(|b| self.snapshot(b)).transpose();
        match (self.snapshot(id), base) {
            (Ok(s), Ok(b))
                if self
                    .classes
                    .transfers()
                    .granted(t, s.as_str(), b.as_deref()) =>
            {
                Ok(s)
            }
            _ => {
                tracing::warn!(
                    snapshot = id,
                    "transfer: refused a peer's call without a live grant"
                );
                Err(Error::PermissionDenied(format!(
                    "no live grant of snapshot {id:?} for this peer: {} is missing, expired or for another snapshot",
                    crate::channel::GRANT_HEADER
                )))
            }
        }
    }

    /// The volume a transfer call names (NOT_FOUND as for a snapshot).
    fn volume(&self, id: &str) -> crate::error::Result<crate::volume::VolumeId> {
        super::validate::volume_id(id, self.classes.ids())?
            .ok_or_else(|| crate::error::Error::NotFound(format!("volume {id:?} does not exist")))
    }
}

#[tonic::async_trait]
impl Transfer for TransferService {
    type ReadStream = ReadStream;

    async fn grant(&self, r: Request<GrantRequest>) -> Result<Response<GrantResponse>, Status> {
        let req = r.into_inner();
        let ttl = std::time::Duration::from_secs(req.ttl_secs);
        let run = async {
            if req.volume_id.is_empty() {
                let id = self.snapshot(&req.snapshot_id)?;
                let base = match req.base_snapshot_id.as_str() {
                    "" => None,
                    b => Some(self.snapshot(b)?),
                };
                let (token, ttl, facts) = self.classes.grant(id.clone(), base, ttl).await?;
                return Ok((id, token, ttl, facts));
            }
            if !req.snapshot_id.is_empty() {
                return Err(Error::InvalidArgument(
                    "a grant names a snapshot or a volume to clone, not both".into(),
                ));
            }
            let name = super::validate::required_string("clone_name", &req.clone_name)?;
            let id = self.volume(&req.volume_id)?;
            self.classes.grant_clone(id, name.to_string(), ttl).await
        };
        let (id, token, ttl, facts) = run.await.map_err(Status::from)?;
        Ok(Response::new(GrantResponse {
            token,
            expires_in_secs: ttl.as_secs(),
            size_bytes: facts.size,
            access: facts.access.map(|a| a.as_text()).unwrap_or_default(),
            encrypted: facts.encrypted,
            snapshot_id: self.classes.ids().public(id.to_string()),
        }))
    }

    async fn hash(&self, r: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        let token = grant_of(&r);
        let req = r.into_inner();
        let what = |snapshot| HashOf {
            snapshot,
            length: req.length_bytes,
            segmented: req.segments,
            paced: token.is_some(),
        };
        let run = async {
            match (req.snapshot_id.as_str(), req.volume_id.as_str(), &token) {
                (s, "", t) if !s.is_empty() => {
                    let id = self.granted(s, None, t.as_deref())?;
                    self.classes.hash_whole(&id, what(true)).await
                }
                ("", v, None) if !v.is_empty() => {
                    let id = self.volume(v)?;
                    self.classes.hash_whole(&id, what(false)).await
                }
                (_, _, Some(_)) => Err(Error::PermissionDenied(
                    "a peer may hash a snapshot granted to it, nothing else".into(),
                )),
                _ => Err(Error::InvalidArgument(
                    "a hash names a snapshot or a volume, one of the two".into(),
                )),
            }
        };
        let (size, mut hashes) = run.await.map_err(Status::from)?;
        let (blake3, segments) = match req.segments {
            true => (vec![], hashes.into_iter().map(|h| h.to_vec()).collect()),
            false => (hashes.pop().unwrap_or_default().to_vec(), vec![]),
        };
        Ok(Response::new(HashResponse {
            size_bytes: size,
            blake3,
            segments,
        }))
    }

    async fn release(
        &self,
        r: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let req = r.into_inner();
        let run = async {
            let name = super::validate::required_string("clone_name", &req.clone_name)?;
            let id = self.volume(&req.volume_id)?;
            self.classes.release_clone(id, name.to_string()).await
        };
        let removed = run.await.map_err(Status::from)?;
        Ok(Response::new(ReleaseResponse {
            removed: removed as u32,
        }))
    }

    async fn read(&self, r: Request<ReadRequest>) -> Result<Response<ReadStream>, Status> {
        let token = grant_of(&r);
        let req = r.into_inner();
        let run = async {
            let base = match req.base_snapshot_id.as_str() {
                "" => None,
                b => Some(b),
            };
            let id = self.granted(&req.snapshot_id, base, token.as_deref())?;
            let base = base.map(|b| self.snapshot(b)).transpose()?;
            self.classes
                .read_snapshot(id, req.start, base, self.stopping.clone())
                .await
        };
        let pieces = run.await.map_err(Status::from)?;
        let items = UntilSummary {
            rx: pieces,
            over: false,
        }
        .map(|p| {
            p.map(|p| ReadItem {
                item: Some(match p {
                    Piece::Header { capacity, chunk } => read_item::Item::Header(ReadHeader {
                        capacity_bytes: capacity,
                        chunk_bytes: chunk,
                    }),
                    Piece::Range { offset, data, hash } => read_item::Item::Range(DataRange {
                        offset,
                        data,
                        blake3: hash.to_vec(),
                    }),
                    Piece::Summary {
                        ranges,
                        bytes,
                        digest,
                    } => read_item::Item::Summary(ReadSummary {
                        ranges,
                        bytes,
                        digest: digest.to_vec(),
                    }),
                }),
            })
            .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(items)))
    }
}

/// A read's pieces, ending with an error unless its summary came: a
/// reader that stopped without one (a panic) never looks whole.
struct UntilSummary {
    rx: tokio::sync::mpsc::Receiver<crate::error::Result<Piece>>,
    over: bool,
}

impl Stream for UntilSummary {
    type Item = crate::error::Result<Piece>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if self.over {
            return Poll::Ready(None);
        }
        let item = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(p))) => {
                self.over = matches!(p, Piece::Summary { .. });
                return Poll::Ready(Some(Ok(p)));
            }
            Poll::Ready(Some(Err(e))) => Err(e),
            Poll::Ready(None) => Err(crate::error::Error::Internal(
                "the snapshot read stopped before its summary; what was sent is not the whole copy"
                    .into(),
            )),
        };
        self.over = true;
        Poll::Ready(Some(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read whose reader stopped without its summary (a panic drops the
    /// sender) ends with INTERNAL after what came, never as whole; one
    /// that sent its summary ends there.
    #[tokio::test]
    async fn a_read_without_its_summary_ends_with_an_error() {
        let header = Piece::Header {
            capacity: 8,
            chunk: 4,
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(Ok(header.clone())).await.unwrap();
        drop(tx);
        let mut got: Vec<_> = UntilSummary { rx, over: false }.collect().await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].is_ok());
        let e = Status::from(got.pop().unwrap().unwrap_err());
        assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");

        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(Ok(header)).await.unwrap();
        let summary = Piece::Summary {
            ranges: 0,
            bytes: 0,
            digest: [0; 32],
        };
        tx.send(Ok(summary.clone())).await.unwrap();
        // Anything after the summary is not read.
        tx.send(Ok(summary)).await.unwrap();
        let got: Vec<_> = UntilSummary { rx, over: false }.collect().await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|g| g.is_ok()));
    }
}
