//! CSI SnapshotMetadata service (alpha): GetMetadataAllocated and
//! GetMetadataDelta, server-streaming. Validates, asks the volume layer
//! for a stream of ranges, and batches them into responses as they come
//! (`max_results` per message, or [`DEFAULT_BATCH`]).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::validate;
use crate::error::{Error, Result};
use crate::proto::csi::v1::snapshot_metadata_server::SnapshotMetadata;
use crate::proto::csi::v1::*;
use crate::volume::classes::Classes;
use crate::volume::metadata::{Ask, Ranges};
use crate::volume::SnapshotId;

/// Ranges per message when the request leaves `max_results` at 0.
pub const DEFAULT_BATCH: usize = 1024;

pub struct MetadataService {
    pub classes: Arc<Classes>,
}

/// A snapshot id the request must name: empty is INVALID_ARGUMENT, an id
/// this driver never issued NOT_FOUND.
fn snapshot(field: &str, id: &str) -> Result<SnapshotId> {
    validate::snapshot_id(field, id)?
        .ok_or_else(|| Error::NotFound(format!("snapshot {id:?} does not exist")))
}

/// The start offset and batch size of a request.
fn window(starting_offset: i64, max_results: i32) -> Result<(u64, usize)> {
    if starting_offset < 0 {
        return Err(Error::OutOfRange(format!(
            "starting_offset {starting_offset} is negative"
        )));
    }
    if max_results < 0 {
        return Err(Error::InvalidArgument(format!(
            "max_results {max_results} is negative"
        )));
    }
    let batch = match max_results {
        0 => DEFAULT_BATCH,
        n => n as usize,
    };
    Ok((starting_offset as u64, batch))
}

/// Streams `ranges` as responses of at most `batch` ranges each, made by
/// `make(capacity, ranges)`; an error ends the stream with its status.
fn respond<R, F>(
    mut r: Ranges,
    batch: usize,
    make: F,
) -> ReceiverStream<std::result::Result<R, Status>>
where
    R: Send + 'static,
    F: Fn(i64, Vec<BlockMetadata>) -> R + Send + 'static,
{
    let (tx, rx) = mpsc::channel(2);
    let capacity = r.capacity as i64;
    tokio::spawn(async move {
        // A client's max_results sizes no allocation: the buffer grows
        // with what arrives (a request for 2^31 ranges once aborted the
        // driver on a failed allocation).
        let mut got = Vec::with_capacity(batch.min(DEFAULT_BATCH));
        while r.ranges.recv_many(&mut got, batch).await > 0 {
            let mut block_metadata = Vec::with_capacity(got.len());
            let mut failed = None;
            for item in got.drain(..) {
                match item {
                    Ok((offset, length)) => block_metadata.push(BlockMetadata {
                        byte_offset: offset as i64,
                        size_bytes: length as i64,
                    }),
                    Err(e) => failed = Some(e),
                }
            }
            if !block_metadata.is_empty()
                && tx.send(Ok(make(capacity, block_metadata))).await.is_err()
            {
                return; // the client went away; dropping `r` stops the reader
            }
            if let Some(e) = failed {
                let _ = tx.send(Err(Status::from(e))).await;
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

#[tonic::async_trait]
impl SnapshotMetadata for MetadataService {
    type GetMetadataAllocatedStream =
        ReceiverStream<std::result::Result<GetMetadataAllocatedResponse, Status>>;
    type GetMetadataDeltaStream =
        ReceiverStream<std::result::Result<GetMetadataDeltaResponse, Status>>;

    async fn get_metadata_allocated(
        &self,
        r: Request<GetMetadataAllocatedRequest>,
    ) -> std::result::Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let req = r.into_inner();
        let ask = snapshot("snapshot_id", &req.snapshot_id).map(Ask::Allocated);
        self.stream(
            ask,
            req.starting_offset,
            req.max_results,
            |kind, capacity, blocks| GetMetadataAllocatedResponse {
                block_metadata_type: kind,
                volume_capacity_bytes: capacity,
                block_metadata: blocks,
            },
        )
        .await
    }

    async fn get_metadata_delta(
        &self,
        r: Request<GetMetadataDeltaRequest>,
    ) -> std::result::Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let req = r.into_inner();
        // Both ids are checked as given before either is looked up.
        let ask = validate::snapshot_id("base_snapshot_id", &req.base_snapshot_id)
            .and_then(|_| validate::snapshot_id("target_snapshot_id", &req.target_snapshot_id))
            .and_then(|_| {
                let base = snapshot("base_snapshot_id", &req.base_snapshot_id)?;
                let target = snapshot("target_snapshot_id", &req.target_snapshot_id)?;
                Ok(Ask::Delta { base, target })
            });
        self.stream(
            ask,
            req.starting_offset,
            req.max_results,
            |kind, capacity, blocks| GetMetadataDeltaResponse {
                block_metadata_type: kind,
                volume_capacity_bytes: capacity,
                block_metadata: blocks,
            },
        )
        .await
    }
}

impl MetadataService {
    /// Validates the window, asks the volume layer, and streams the
    /// answer as responses `make(type, capacity, ranges)`.
    async fn stream<R, F>(
        &self,
        ask: Result<Ask>,
        starting_offset: i64,
        max_results: i32,
        make: F,
    ) -> std::result::Result<Response<ReceiverStream<std::result::Result<R, Status>>>, Status>
    where
        R: Send + 'static,
        F: Fn(i32, i64, Vec<BlockMetadata>) -> R + Send + 'static,
    {
        let run = async {
            if !self.classes.base().serves_metadata() {
                return Err(Error::Unimplemented(
                    "SnapshotMetadata needs thin-provisioning-tools (thin_dump, thin_delta), which do not run on this node".into(),
                )
                .advise("install thin-provisioning-tools in the driver's image and restart the driver, or do not call SnapshotMetadata on this node"));
            }
            let ask = ask?;
            let (start, batch) = window(starting_offset, max_results)?;
            let target = match &ask {
                Ask::Allocated(id) | Ask::Delta { target: id, .. } => id,
            };
            let ranges = self
                .classes
                .of(target)?
                .snapshot_metadata(ask, start)
                .await?;
            Ok(respond(ranges, batch, move |capacity, blocks| {
                make(BlockMetadataType::VariableLength as i32, capacity, blocks)
            }))
        };
        super::reply(run.await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_checked() {
        assert_eq!(window(0, 0).unwrap(), (0, DEFAULT_BATCH));
        assert_eq!(window(4096, 7).unwrap(), (4096, 7));
        assert_eq!(window(-1, 0).unwrap_err().code(), tonic::Code::OutOfRange);
        assert_eq!(
            window(0, -1).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            snapshot("snapshot_id", "").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            snapshot("snapshot_id", "other").unwrap_err().code(),
            tonic::Code::NotFound
        );
    }

    #[tokio::test]
    async fn responses_carry_at_most_the_batch_and_end_with_an_error() {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(16);
        for i in 0..5u64 {
            tx.send(Ok((i * 100, 10))).await.unwrap();
        }
        tx.send(Err(Error::Internal("thin_delta died".into())))
            .await
            .unwrap();
        drop(tx);
        let mut s = respond(
            Ranges {
                capacity: 1000,
                ranges: rx,
            },
            2,
            |c, b| (c, b),
        );
        let mut sizes = Vec::new();
        let mut err = None;
        while let Some(item) = s.next().await {
            match item {
                Ok((cap, b)) => {
                    assert_eq!(cap, 1000);
                    sizes.push(b.len());
                }
                Err(e) => err = Some(e),
            }
        }
        assert!(
            sizes.iter().all(|n| *n <= 2) && sizes.iter().sum::<usize>() == 5,
            "{sizes:?}"
        );
        assert_eq!(err.unwrap().code(), tonic::Code::Internal);
    }

    #[tokio::test]
    async fn a_huge_max_results_allocates_nothing_up_front() {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok((0, 10))).await.unwrap();
        drop(tx);
        let (_, batch) = window(0, i32::MAX).unwrap();
        let s = respond(
            Ranges {
                capacity: 100,
                ranges: rx,
            },
            batch,
            |_, b| b.len(),
        );
        let got: Vec<usize> = s.map(|r| r.unwrap()).collect().await;
        assert_eq!(got, vec![1]);
    }
}
