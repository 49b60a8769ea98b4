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
use tonic::Status;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes that may run at once; more connections wait to be accepted.
const HANDSHAKES: usize = 64;

/// A client's TLS settings for a node's channel: the CA to check the
/// node's certificate against, the client's own certificate and key, and
/// the name the node's certificate carries. A file that cannot be read is
/// named in the error.
pub fn client_tls(
    ca: &Path,
    cert: &Path,
    key: &Path,
    server_name: &str,
) -> std::result::Result<tonic::transport::ClientTlsConfig, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("TLS file {}: {e}", p.display()));
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)?))
        .identity(Identity::from_pem(read(cert)?, read(key)?))
        .domain_name(server_name.to_string()))
}

/// The node's TLS settings: its certificate and key, and the CA whose
/// client certificates it takes. Read at start-up; a file that cannot be
/// read or parsed stops the start with the file named.
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> Result<Arc<ServerConfig>> {
    server_config_with_peers(cert, key, client_ca, None)
}

/// [`server_config`], also taking the client certificates `peer_ca`
/// signed (`cluster.peer_ca`, the nodes' CA): other node plugins, which
/// [`PeerGate`] lets reach `Transfer.Read` and `Transfer.Hash` alone.
pub fn server_config_with_peers(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
    peer_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>> {
    server_config_for_cpu(cert, key, client_ca, peer_ca, aes_in_hardware())
}

/// [`server_config_with_peers`] for a CPU with or without AES
/// instructions ([`provider`]).
pub fn server_config_for_cpu(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
    peer_ca: Option<&Path>,
    aes_in_hardware: bool,
) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(provider(aes_in_hardware));
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| unusable(key, e))?;
    let mut roots = RootCertStore::empty();
    for ca in std::iter::once(client_ca).chain(peer_ca) {
        for c in certificates(ca)? {
            roots.add(c).map_err(|e| unusable(ca, e))?;
        }
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
    // The node picks the cipher by its own CPU ([`provider`]); a client
    // (tonic's, with rustls's order) would always ask for AES-GCM first.
    cfg.ignore_client_order = true;
    Ok(Arc::new(cfg))
}

/// The channel's crypto: *ring*'s, with the ciphers in the order this
/// CPU runs fastest. Without AES and carry-less multiply instructions
/// (an older or smaller CPU, or an emulated one), AES-GCM falls back to
/// constant-time software that is about 10 times slower than
/// ChaCha20-Poly1305 (measured in the VM rig: 6 against 68 MiB/s), and a
/// copy to another node (docs/moving.md) runs at that speed; so
/// ChaCha20-Poly1305 goes first there, as Go's TLS and BoringSSL choose.
/// With them, AES-GCM stays first (it is the faster one).
pub fn provider(aes_in_hardware: bool) -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    if !aes_in_hardware {
        // A stable sort: each family keeps its order (TLS 1.3 first).
        p.cipher_suites.sort_by_key(|s| {
            !matches!(
                s.suite(),
                rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
            )
        });
    }
    p
}

/// Whether this CPU has the instructions AES-GCM runs fast with.
pub fn aes_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
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

/// Tells the controller from a peer on a channel that takes both
/// (`cluster.peer_ca` set): a client certificate `client_ca` signed is
/// the controller's; any other the handshake let through is a peer's.
#[derive(Clone)]
pub struct Callers(Arc<dyn rustls::server::danger::ClientCertVerifier>);

impl Callers {
    pub fn new(client_ca: &Path) -> Result<Callers> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in certificates(client_ca)? {
            roots.add(c).map_err(|e| unusable(client_ca, e))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| unusable(client_ca, e))?;
        Ok(Callers(verifier))
    }

    /// Whether the chain a connection presented is the controller's.
    fn is_controller(&self, chain: &[CertificateDer<'static>]) -> bool {
        let Some((leaf, rest)) = chain.split_first() else {
            return false;
        };
        self.0
            .verify_client_cert(leaf, rest, rustls::pki_types::UnixTime::now())
            .is_ok()
    }
}

/// The methods a peer may call: each asks for a grant of the snapshot.
pub const PEER_METHODS: [&str; 2] = [
    "/thinpool.cluster.v1.Transfer/Read",
    "/thinpool.cluster.v1.Transfer/Hash",
];

/// The request header with a peer's transfer grant (`Transfer.Grant`).
pub const GRANT_HEADER: &str = "x-thinpool-transfer-token";

/// Marks a request a peer made (in its extensions), and whether it is
/// one of the methods a peer may call ([`PEER_METHODS`]), which then ask
/// for a grant of the snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub allowed: bool,
}

/// Marks a request the controller made on the channel (in its
/// extensions): what only the controller may ask for (a copy pulled from
/// another node, [`COPY_HEADER`]) is read from such requests alone,
/// never from a CO's socket.
#[derive(Debug, Clone, Copy)]
pub struct FromController;

/// The binary request header (`CopyFrom`, proto/thinpool/cluster/v1) on
/// a CreateVolume the controller forwards to the node that is to pull a
/// copy of another node's snapshot.
pub const COPY_HEADER: &str = "x-thinpool-copy-from-bin";

/// The binary response header (`CopyRound`) on a node's answer to such a
/// CreateVolume: what the copy's last read carried.
pub const ROUND_HEADER: &str = "x-thinpool-round-bin";

/// The node's side, with `cluster.peer_ca` set: marks each call a peer
/// makes ([`Peer`]) for [`PeerOnly`] to refuse. Without `Callers` (no
/// `peer_ca`) every caller is the controller.
#[derive(Clone)]
pub struct PeerGate(pub Option<Callers>);

impl<S> tower_layer::Layer<S> for PeerGate {
    type Service = Gated<S>;
    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            callers: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gated<S> {
    inner: S,
    callers: Option<Callers>,
}

type Tls = tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>;

impl<S, B> tower_service::Service<http::Request<B>> for Gated<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> S::Future {
        let peer = self.callers.as_ref().is_some_and(|callers| {
            let chain = req.extensions().get::<Tls>().and_then(|t| t.peer_certs());
            !chain.as_deref().is_some_and(|c| callers.is_controller(c))
        });
        if peer {
            let allowed = PEER_METHODS.contains(&req.uri().path());
            req.extensions_mut().insert(Peer { allowed });
        } else {
            req.extensions_mut().insert(FromController);
        }
        self.inner.call(req)
    }
}

/// The node's side: a peer's call to anything but [`PEER_METHODS`] is
/// PERMISSION_DENIED, logged and counted, before any service sees it.
#[derive(Clone)]
pub struct PeerOnly(pub Arc<Metrics>);

impl tonic::service::Interceptor for PeerOnly {
    fn call(&mut self, r: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, Status> {
        match r.extensions().get::<Peer>() {
            Some(Peer { allowed: false }) => {
                tracing::warn!(peer = ?r.remote_addr(),
                    "channel: refused a peer's call: a peer may only read or hash a snapshot granted to it");
                self.0.channel_refused();
                Err(Status::permission_denied(format!(
                    "this method is not open to another node plugin: a peer may call {} only",
                    PEER_METHODS.join(" and ")
                )))
            }
            _ => Ok(r),
        }
    }
}

/// The request header that names the node a forwarded call is meant for.
/// Every node's certificate carries one name (the nodes' CA signs node
/// plugins only), so TLS alone does not say which node answered; the
/// controller names the node it means in every call, and a node refuses a
/// call meant for another before it touches anything. A node plugin pod
/// replaced at an address the controller still has for another node (an
/// IP reused before the controller's next list) thus never acts on it.
pub const NODE_HEADER: &str = "x-thinpool-node";

/// The controller's side: `NODE_HEADER` set to the node it means.
#[derive(Clone)]
pub struct MeantFor(pub tonic::metadata::AsciiMetadataValue);

impl tonic::service::Interceptor for MeantFor {
    fn call(
        &mut self,
        mut r: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, Status> {
        r.metadata_mut().insert(NODE_HEADER, self.0.clone());
        Ok(r)
    }
}

/// The node's side: a call that names another node, or none, is refused
/// with UNAVAILABLE (the controller's list is stale: it lists again, and
/// the sidecar's retry reaches the right node), logged, and touches
/// nothing.
#[derive(Clone)]
pub struct OnlyFor(pub Arc<str>);

impl tonic::service::Interceptor for OnlyFor {
    fn call(&mut self, r: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, Status> {
        let meant = r.metadata().get(NODE_HEADER).and_then(|v| v.to_str().ok());
        if meant == Some(&*self.0) {
            return Ok(r);
        }
        tracing::warn!(node = %self.0, meant_for = ?meant, peer = ?r.remote_addr(),
            "refused a forwarded call meant for another node");
        let mut s = Status::unavailable(format!(
            "this is node {:?}, and the call is meant for {}: the controller's address for that node is stale",
            self.0,
            meant.map_or_else(|| "no node".to_string(), |m| format!("{m:?}"))
        ));
        // The answering node's id, in the status: how the controller tells
        // this refusal from any other UNAVAILABLE ([`answered_by_another`]).
        if let Ok(v) = self.0.parse() {
            s.metadata_mut().insert(NODE_HEADER, v);
        }
        Err(s)
    }
}

/// Whether a forwarded call was refused by a node it was not meant for
/// ([`OnlyFor`]): the controller's address for that node is stale.
pub fn answered_by_another(s: &Status) -> bool {
    s.metadata().contains_key(NODE_HEADER)
}

/// The response header with the node's change counter (`lvm::Changes`)
/// as the answer left: the controller never answers GetCapacity from a
/// capacity state older than a change it has seen (docs/cluster.md).
pub const GENERATION_HEADER: &str = "x-thinpool-generation";

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A service that hands the headers of every response of `inner` to `on`
/// as it passes (for a unary call, after its work): the one tower wrapper
/// both ends of the change counter use.
#[derive(Clone)]
pub struct OnResponse<S> {
    inner: S,
    on: OnHeaders,
}

/// What either end of the change counter does with an answer's headers.
pub type OnHeaders = Arc<dyn Fn(&mut http::HeaderMap) + Send + Sync>;

impl<S, B, R> tower_service::Service<http::Request<B>> for OnResponse<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<std::result::Result<http::Response<R>, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let on = self.on.clone();
        Box::pin(async move {
            let mut resp = fut.await?;
            on(resp.headers_mut());
            Ok(resp)
        })
    }
}

/// The node's side: [`GENERATION_HEADER`] on every answer.
#[derive(Clone)]
pub struct GenerationLayer(pub crate::lvm::Changes);

impl<S> tower_layer::Layer<S> for GenerationLayer {
    type Service = OnResponse<S>;
    fn layer(&self, inner: S) -> Self::Service {
        let changes = self.0.clone();
        OnResponse {
            inner,
            on: Arc::new(move |headers: &mut http::HeaderMap| {
                headers.insert(GENERATION_HEADER, http::HeaderValue::from(changes.now()));
            }),
        }
    }
}

/// The controller's side: a node's channel that keeps in `seen` the
/// highest [`GENERATION_HEADER`] any answer of that node carried. A
/// refusal by another node (`OnlyFor`'s mark) carries that node's counter,
/// not this one's, and is left out.
pub fn seen<S>(inner: S, seen: Arc<std::sync::atomic::AtomicU64>) -> Seen<S> {
    OnResponse {
        inner,
        on: Arc::new(move |headers: &mut http::HeaderMap| {
            let generation = headers
                .get(GENERATION_HEADER)
                .filter(|_| !headers.contains_key(NODE_HEADER))
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if let Some(g) = generation {
                seen.fetch_max(g, std::sync::atomic::Ordering::SeqCst);
            }
        }),
    }
}

/// What [`seen`] makes.
pub type Seen<S> = OnResponse<S>;
