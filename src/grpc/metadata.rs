//! CSI SnapshotMetadata service (alpha): GetMetadataAllocated and
//! GetMetadataDelta, server-streaming. Validates, asks the volume layer
//! for a stream of ranges, and batches them into responses as they come
//! (`max_results` per message, or [`DEFAULT_BATCH`]).

use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::validate;
use crate::error::{Error, Result};
use crate::naming::NodeIds;
use crate::proto::csi::v1::snapshot_metadata_server::SnapshotMetadata;
use crate::proto::csi::v1::*;
use crate::volume::classes::Classes;
use crate::volume::metadata::{Ask, Item, Ranges};
use crate::volume::SnapshotId;

/// Ranges per message when the request leaves `max_results` at 0.
pub const DEFAULT_BATCH: usize = 1024;

pub struct MetadataService {
    pub classes: Arc<Classes>,
}

/// A snapshot id the request must name: empty is INVALID_ARGUMENT, an id
/// this driver never issued NOT_FOUND.
fn snapshot(field: &str, id: &str, ids: &NodeIds) -> Result<SnapshotId> {
    validate::snapshot_id(field, id, ids)?
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

/// What the task that batches ranges passes on to the response stream.
enum Frame<R> {
    Data(R),
    Failed(Status),
    /// The reader sent every range.
    End,
}

/// A SnapshotMetadata response stream: it ends OK only after the reader
/// said it sent every range. Closed before that (the reader or the
/// batching task panicked, or was dropped) it ends with INTERNAL: a
/// backup tool must never take part of a change list for all of it.
pub struct Whole<R> {
    rx: mpsc::Receiver<Frame<R>>,
    over: bool,
}

/// The status of a stream cut short.
fn cut_short() -> Status {
    Status::from(
        Error::Internal(
            "the stream of ranges stopped before its end (its reader failed); the ranges sent are not the whole answer".into(),
        )
        .advise("call again from starting_offset after the last range received"),
    )
}

impl<R> tokio_stream::Stream for Whole<R> {
    type Item = std::result::Result<R, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if self.over {
            return Poll::Ready(None);
        }
        let item = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Frame::Data(r))) => return Poll::Ready(Some(Ok(r))),
            Poll::Ready(Some(Frame::End)) => None,
            Poll::Ready(Some(Frame::Failed(s))) => Some(Err(s)),
            Poll::Ready(None) => Some(Err(cut_short())),
        };
        self.over = true;
        Poll::Ready(item)
    }
}

/// Streams `ranges` as responses of at most `batch` ranges each, made by
/// `make(capacity, ranges)`; an error ends the stream with its status, and
/// so does a reader that stops without its end ([`Whole`]).
fn respond<R, F>(mut r: Ranges, batch: usize, make: F) -> Whole<R>
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
            let mut last = None;
            for item in got.drain(..) {
                match item {
                    Ok(Item::Range(offset, length)) => block_metadata.push(BlockMetadata {
                        byte_offset: offset as i64,
                        size_bytes: length as i64,
                    }),
                    Ok(Item::End) => last = Some(Frame::End),
                    Err(e) => last = Some(Frame::Failed(Status::from(e))),
                }
            }
            if !block_metadata.is_empty()
                && tx
                    .send(Frame::Data(make(capacity, block_metadata)))
                    .await
                    .is_err()
            {
                return; // the client went away; dropping `r` stops the reader
            }
            if let Some(f) = last {
                let _ = tx.send(f).await;
                return;
            }
        }
        // The reader's channel closed with neither its end nor an error:
        // nothing is sent, and `Whole` ends the stream with INTERNAL.
    });
    Whole { rx, over: false }
}

#[tonic::async_trait]
impl SnapshotMetadata for MetadataService {
    type GetMetadataAllocatedStream = Whole<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Whole<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        r: Request<GetMetadataAllocatedRequest>,
    ) -> std::result::Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let req = r.into_inner();
        let ask = snapshot("snapshot_id", &req.snapshot_id, self.classes.ids()).map(Ask::Allocated);
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
        let ids = self.classes.ids();
        let ask = validate::snapshot_id("base_snapshot_id", &req.base_snapshot_id, ids)
            .and_then(|_| validate::snapshot_id("target_snapshot_id", &req.target_snapshot_id, ids))
            .and_then(|_| {
                let base = snapshot("base_snapshot_id", &req.base_snapshot_id, ids)?;
                let target = snapshot("target_snapshot_id", &req.target_snapshot_id, ids)?;
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
    ) -> std::result::Result<Response<Whole<R>>, Status>
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
            snapshot("snapshot_id", "", &NodeIds::new("node-1", false))
                .unwrap_err()
                .code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            snapshot("snapshot_id", "other", &NodeIds::new("node-1", false))
                .unwrap_err()
                .code(),
            tonic::Code::NotFound
        );
    }

    #[tokio::test]
    async fn responses_carry_at_most_the_batch_and_end_with_an_error() {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(16);
        for i in 0..5u64 {
            tx.send(Ok(Item::Range(i * 100, 10))).await.unwrap();
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
        tx.send(Ok(Item::Range(0, 10))).await.unwrap();
        tx.send(Ok(Item::End)).await.unwrap();
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

    /// Ranges, then a channel closed with neither the end nor an error
    /// (the reader panicked): the ranges arrive and the stream ends with
    /// INTERNAL, never OK.
    #[tokio::test]
    async fn a_reader_that_stops_without_its_end_fails_the_stream() {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            for i in 0..3u64 {
                tx.send(Ok(Item::Range(i * 100, 10))).await.unwrap();
            }
            panic!("the reader dies mid-stream");
        });
        assert!(reader.await.unwrap_err().is_panic());
        let got: Vec<_> = respond(
            Ranges {
                capacity: 1000,
                ranges: rx,
            },
            2,
            |_, b| b.len(),
        )
        .collect()
        .await;
        let sent: usize = got.iter().filter_map(|r| r.as_ref().ok()).sum();
        assert_eq!(sent, 3, "{got:?}");
        let last = got.last().unwrap().as_ref().unwrap_err();
        assert_eq!(last.code(), tonic::Code::Internal, "{last:?}");
        assert!(last.message().contains("not the whole answer"), "{last:?}");
    }

    /// The batching task itself panics (here in `make`): the stream ends
    /// with INTERNAL, not OK.
    #[tokio::test]
    async fn a_batching_task_that_panics_fails_the_stream() {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(16);
        tx.send(Ok(Item::Range(0, 10))).await.unwrap();
        tx.send(Ok(Item::End)).await.unwrap();
        drop(tx);
        let got: Vec<std::result::Result<usize, Status>> = respond(
            Ranges {
                capacity: 1000,
                ranges: rx,
            },
            2,
            |_, _| -> usize { panic!("a response cannot be made") },
        )
        .collect()
        .await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap_err().code(), tonic::Code::Internal);
    }

    /// The end after every range: the stream ends OK, with nothing after.
    #[tokio::test]
    async fn a_whole_answer_ends_ok() {
        use tokio_stream::StreamExt;
        let (tx, rx) = mpsc::channel(16);
        for i in 0..4u64 {
            tx.send(Ok(Item::Range(i * 100, 10))).await.unwrap();
        }
        tx.send(Ok(Item::End)).await.unwrap();
        // The reader's sender lives on: the end alone ends the stream.
        let got: Vec<usize> = respond(
            Ranges {
                capacity: 1000,
                ranges: rx,
            },
            3,
            |_, b| b.len(),
        )
        .map(|r| r.unwrap())
        .collect()
        .await;
        assert_eq!(got.iter().sum::<usize>(), 4, "{got:?}");
        drop(tx);
    }
}
