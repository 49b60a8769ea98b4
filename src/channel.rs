//! The internal channel (docs/cluster.md, "The channel"): the TCP port on
//! which a node plugin serves the calls the cluster's controller forwards
//! to it, with mutual TLS. The node presents `cluster.tls_cert`; a client
//! gets through only with a certificate that `cluster.client_ca` signed
//! (for client authentication, or for any use when it names none). So
//! `client_ca` is the controller's CA alone, not the one that signs the
//! nodes' certificates (docs/cluster.md): a node's certificate is then no
//! key to another node. A connection refused in the handshake (no
//! certificate, another CA's, plain text, a handshake that stalls) is
//! logged and counted here and never reaches a service.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes that may run at once; more connections wait to be accepted.
const HANDSHAKES: usize = 64;

/// The node's TLS settings: its certificate and key, and the CA whose
/// client certificates it takes. Read at start-up; a file that cannot be
/// read or parsed stops the start with the file named.
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| unusable(key, e))?;
    let mut roots = RootCertStore::empty();
    for c in certificates(client_ca)? {
        roots.add(c).map_err(|e| unusable(client_ca, e))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| unusable(client_ca, e))?;
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("TLS protocol versions: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| unusable(cert, e))?;
    // gRPC clients ask for HTTP/2 by ALPN.
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// Every certificate in a PEM file; none is an error.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let all = CertificateDer::pem_file_iter(path)
        .map_err(|e| unusable(path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| unusable(path, e))?;
    if all.is_empty() {
        return Err(unusable(path, "no PEM certificate in it"));
    }
    Ok(all)
}

fn unusable(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::FailedPrecondition(format!("TLS file {}: {e}", path.display()))
        .advise("point cluster.tls_cert, cluster.tls_key and cluster.client_ca at PEM files the driver can read")
}

/// The connections on `listener` that finished a mutual TLS handshake
/// within `handshake` ([`HANDSHAKE_TIMEOUT`] in the driver), as a stream
/// for the gRPC server. Each handshake runs as a task of its own (a slow
/// client holds up no other); refused ones are logged (WARN, with the
/// peer's address) and counted in `metrics`. Accepting stops when the
/// stream is dropped.
pub fn incoming(
    listener: TcpListener,
    cfg: Arc<ServerConfig>,
    metrics: Arc<Metrics>,
    handshake: Duration,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(HANDSHAKES);
    let acceptor = TlsAcceptor::from(cfg);
    let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it
                    // was taken: the listener itself is fine.
                    tracing::warn!(error = %e, "channel: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Small requests and answers go out at once (no Nagle delay
            // on a forwarded call).
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "channel: TCP_NODELAY not set");
            }
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (acceptor, tx, metrics) = (acceptor.clone(), tx.clone(), metrics.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let why = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        tracing::debug!(%peer, "channel: client authenticated");
                        let _ = tx.send(Ok(tls)).await;
                        return;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no handshake within {handshake:?}"),
                };
                metrics.channel_refused();
                tracing::warn!(%peer, reason = why, "channel: refused a connection (mutual TLS)");
            });
        }
    });
    ReceiverStream::new(rx)
}
