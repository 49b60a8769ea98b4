//! The target's client of a peer: a copy's reads of a snapshot on another
//! node (`Transfer.Read` on that node's channel, docs/moving.md), as the
//! [`Source`] the volume layer fills from. The node's own certificate
//! (`cluster.tls_cert`) is its client certificate, the peer's server
//! certificate is checked against `cluster.peer_ca` and the name the
//! controller gave, and every read (and the whole check's
//! `Transfer.Hash`) carries the grant's token.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::config::Cluster;
use crate::error::{Error, Result};
use crate::naming::Access;
use crate::proto::thinpool::cluster::v1::transfer_client::TransferClient;
use crate::proto::thinpool::cluster::v1::{read_item, CopyFrom, HashRequest, ReadRequest};
use crate::volume::fill::{Pull, Source, SourceFacts};
use crate::volume::transfer::Piece;

/// How long connecting to the source node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP/2 ping interval and the time a ping may take.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// How many pieces wait between the stream and the fill.
const QUEUED: usize = 4;

/// The copy the controller asked for: `pulled` (a snapshot, or a volume
/// and the snapshot its node took for the clone) of the node `copy`
/// names, what its grant said of it (or the source's error when it gave
/// none), and the source to read it from.
pub fn pull(
    cfg: &crate::config::Config,
    copy: CopyFrom,
    pulled: crate::grpc::validate::Pulled,
) -> Result<Pull<PeerSource>> {
    let facts = match copy.source_code {
        0 => Ok(SourceFacts {
            size: copy.snapshot_bytes,
            access: Some(copy.access.as_str())
                .filter(|a| !a.is_empty())
                .map(|a| {
                    Access::from_text(a).ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "the source's access {a:?} is of no known shape"
                        ))
                    })
                })
                .transpose()?,
            encrypted: copy.encrypted,
        }),
        code => Err(error_of(
            &copy.node_id,
            Status::new(Code::from_i32(code), copy.source_error.clone()),
        )),
    };
    let read = pulled.via.clone().unwrap_or_else(|| pulled.id.clone());
    let base = Some(copy.base_snapshot_id.clone()).filter(|b| !b.is_empty());
    Ok(Pull {
        id: pulled.id,
        via: pulled.via,
        base,
        hold: copy.hold,
        facts,
        source: PeerSource::new(&cfg.cluster, cfg.command_timeout(), copy, read)?,
    })
}

/// Snapshot `snapshot_id` (with its node key) on the node `copy` names.
pub struct PeerSource {
    channel: Channel,
    copy: CopyFrom,
    snapshot_id: String,
    /// How long the source may send nothing before the read counts as
    /// cut (`command_timeout_secs`, as the source's own stall bound).
    silence: Duration,
}

impl PeerSource {
    /// A lazily connected channel to the source node: nothing is sent
    /// until the first read. TLS files that cannot be read are
    /// FAILED_PRECONDITION, named.
    pub fn new(
        cluster: &Cluster,
        silence: Duration,
        copy: CopyFrom,
        snapshot_id: String,
    ) -> Result<PeerSource> {
        if cluster.peer_ca.as_os_str().is_empty() {
            return Err(Error::FailedPrecondition(
                "this node plugin has no cluster.peer_ca: it cannot check another node's certificate to copy from it".into(),
            )
            .advise("set cluster.peer_ca (the nodes' CA) on every node plugin, as the deployment does"));
        }
        let tls = crate::channel::client_tls(
            &cluster.peer_ca,
            &cluster.tls_cert,
            &cluster.tls_key,
            &copy.server_name,
        )
        .map_err(|e| {
            Error::FailedPrecondition(e).advise(
                "point cluster.tls_cert, cluster.tls_key and cluster.peer_ca at PEM files the driver can read",
            )
        })?;
        let channel = Endpoint::from_shared(format!("https://{}", copy.address))
            .and_then(|e| e.tls_config(tls))
            .map_err(|e| {
                Error::InvalidArgument(format!("the source node's address {:?}: {e}", copy.address))
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            // A source that went silent (powered off, its link down) is
            // found by the pings, not by a read that waits forever.
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
            .connect_lazy();
        Ok(PeerSource {
            channel,
            copy,
            snapshot_id,
            silence,
        })
    }
}

impl PeerSource {
    /// `msg` as a request to the source node, with the node's name and
    /// the grant's token.
    fn request<T>(&self, msg: T) -> Result<tonic::Request<T>> {
        let mut r = tonic::Request::new(msg);
        let header = |v: &str| {
            v.parse()
                .map_err(|_| Error::InvalidArgument(format!("{v:?} cannot be a request header")))
        };
        r.metadata_mut()
            .insert(crate::channel::NODE_HEADER, header(&self.copy.node_id)?);
        r.metadata_mut()
            .insert(crate::channel::GRANT_HEADER, header(&self.copy.token)?);
        Ok(r)
    }
}

impl Source for PeerSource {
    async fn segments(&self, length: u64) -> Result<Vec<[u8; 32]>> {
        let r = self.request(HashRequest {
            snapshot_id: self.snapshot_id.clone(),
            length_bytes: length,
            segments: true,
            ..Default::default()
        })?;
        let node = &self.copy.node_id;
        let answer = TransferClient::new(self.channel.clone())
            .hash(r)
            .await
            .map_err(|s| error_of(node, s))?
            .into_inner();
        answer
            .segments
            .into_iter()
            .map(|h| {
                h.try_into().map_err(|_| {
                    Error::DataLoss(format!(
                        "source node {node:?} sent a segment hash that is not 32 bytes"
                    ))
                })
            })
            .collect()
    }

    async fn read(&self, start: u64, base: Option<&str>) -> Result<mpsc::Receiver<Result<Piece>>> {
        let r = self.request(ReadRequest {
            snapshot_id: self.snapshot_id.clone(),
            start,
            base_snapshot_id: base.unwrap_or_default().to_string(),
        })?;
        let node = self.copy.node_id.clone();
        let mut stream = TransferClient::new(self.channel.clone())
            .read(r)
            .await
            .map_err(|s| error_of(&node, s))?
            .into_inner();
        let (tx, rx) = mpsc::channel(QUEUED);
        let silence = self.silence;
        tokio::spawn(async move {
            loop {
                // Ends with the fill: its receiver dropped.
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    n = tokio::time::timeout(silence, stream.message()) => n,
                };
                let item = match next {
                    Ok(Ok(Some(m))) => piece_of(m.item),
                    Ok(Ok(None)) => return,
                    Ok(Err(s)) => Err(error_of(&node, s)),
                    Err(_) => Err(Error::Unavailable(format!(
                        "source node {node:?} sent nothing for {silence:?}"
                    ))),
                };
                let end = item.is_err();
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(rx)
    }
}

/// A read's item as a piece; a malformed one is DATA_LOSS.
fn piece_of(item: Option<read_item::Item>) -> Result<Piece> {
    let hash = |b: Vec<u8>, what: &str| -> Result<[u8; 32]> {
        b.try_into()
            .map_err(|_| Error::DataLoss(format!("the source sent a {what} that is not 32 bytes")))
    };
    Ok(match item {
        Some(read_item::Item::Header(h)) => Piece::Header {
            capacity: h.capacity_bytes,
            chunk: h.chunk_bytes,
        },
        Some(read_item::Item::Range(r)) => Piece::Range {
            offset: r.offset,
            data: r.data,
            hash: hash(r.blake3, "range hash")?,
        },
        Some(read_item::Item::Summary(s)) => Piece::Summary {
            ranges: s.ranges,
            bytes: s.bytes,
            digest: hash(s.digest, "digest")?,
        },
        None => return Err(Error::DataLoss("the source sent an empty item".into())),
    })
}

/// The source node's answer as this node's error: its code kept (so a
/// cut, busy or slow source is resumed, `fill::resumable`), its words
/// prefixed with the node; a transport failure is UNAVAILABLE.
pub fn error_of(node: &str, s: Status) -> Error {
    let what = format!("source node {node:?}: {}", s.message());
    // A status with a cause was made here, by the transport (a connection
    // reset or cut mid-stream: h2's error), not sent by the source.
    let local = std::error::Error::source(&s).is_some()
        && matches!(s.code(), Code::Unknown | Code::Internal | Code::Cancelled);
    if crate::cluster::nodes::unreached(&s) || local {
        return Error::Unavailable(what)
            .advise("retry: the copy resumes where it stopped once the source node is reachable");
    }
    match s.code() {
        Code::NotFound => Error::NotFound(what),
        Code::InvalidArgument => Error::InvalidArgument(what),
        Code::FailedPrecondition => Error::FailedPrecondition(what),
        Code::ResourceExhausted => Error::ResourceExhausted(what),
        Code::Aborted => Error::Aborted(what),
        Code::DeadlineExceeded => Error::DeadlineExceeded(what),
        // The source forgot the grant (it restarted: grants live in its
        // memory) or it expired: a retry of the CreateVolume gets a new
        // one from the controller, and the copy goes on where it stopped.
        Code::PermissionDenied => Error::Unavailable(what).advise(
            "retry: the source node no longer knows the grant (it restarted, or the grant expired); the controller asks a new one",
        ),
        Code::DataLoss => Error::DataLoss(what),
        Code::Unavailable | Code::Cancelled => Error::Unavailable(what),
        _ => Error::Internal(what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_s_codes_are_kept_so_a_cut_read_resumes() {
        for (code, want) in [
            (Code::Unavailable, Code::Unavailable),
            (Code::Cancelled, Code::Unavailable),
            (Code::DeadlineExceeded, Code::DeadlineExceeded),
            (Code::ResourceExhausted, Code::ResourceExhausted),
            (Code::NotFound, Code::NotFound),
            (Code::PermissionDenied, Code::Unavailable),
            (Code::DataLoss, Code::DataLoss),
            (Code::Unknown, Code::Internal),
        ] {
            let e = error_of("n2", Status::new(code, "x"));
            assert_eq!(e.code(), want, "{code:?}");
            assert!(e.to_string().contains("source node \"n2\""), "{e}");
        }
        // A connection cut mid-stream: the transport's status, with its
        // cause, is a cut to resume.
        let cut = Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(cut.code(), Code::Unknown);
        assert_eq!(error_of("n2", cut).code(), Code::Unavailable);
    }

    #[test]
    fn a_hash_of_another_length_is_data_loss() {
        use crate::proto::thinpool::cluster::v1::DataRange;
        let bad = piece_of(Some(read_item::Item::Range(DataRange {
            offset: 0,
            data: vec![1],
            blake3: vec![0; 31],
        })));
        assert_eq!(bad.unwrap_err().code(), Code::DataLoss);
        assert_eq!(piece_of(None).unwrap_err().code(), Code::DataLoss);
    }
}
