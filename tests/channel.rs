//! The internal channel (src/channel.rs, docs/cluster.md): the node's
//! gRPC services over TCP with mutual TLS. Only a client certificate the
//! configured CA signed gets a call through; every other caller is
//! refused in the handshake, counted, and reaches no service. Natively:
//! no call here touches LVM.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{ca, leaf, write, Ca};
use rcgen::{ExtendedKeyUsagePurpose, KeyPair};
use thinpool_csi::config::Config;
use thinpool_csi::metrics::{render, CHANNEL_REFUSED};
use thinpool_csi::proto::csi::v1::identity_client::IdentityClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::{GetPluginInfoRequest, NodeGetInfoRequest};
use thinpool_csi::proto::thinpool::cluster::v1::transfer_client::TransferClient;
use thinpool_csi::proto::thinpool::cluster::v1::{GrantRequest, ReadRequest};
use thinpool_csi::volume::classes::Classes;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;
use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};

struct Node {
    dir: tempfile::TempDir,
    classes: Arc<Classes>,
    port: u16,
    /// The nodes' CA: it signed this node's certificate.
    ca: Ca,
    /// The controller's CA: the one this node takes clients of.
    controller_ca: Ca,
}

impl Node {
    /// A node's channel on a free port of 127.0.0.1: its certificate for
    /// `localhost` from the nodes' CA, taking clients of the controller's
    /// CA, with a handshake bound of half a second.
    async fn start() -> Node {
        Node::start_with(false).await
    }

    /// With `peers`, the node also takes other node plugins
    /// (`cluster.peer_ca`: the nodes' CA).
    async fn start_with(peers: bool) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let controller_ca = ca("controller's CA");
        let ca = ca("nodes' CA");
        let (cert, key) = leaf(&ca, "localhost", &[ServerAuth]);
        let client_ca = write(dir.path(), "controller-ca.crt", &controller_ca.pem());
        let peer_ca = peers.then(|| write(dir.path(), "nodes-ca.crt", &ca.pem()));
        let tls = thinpool_csi::channel::server_config_with_peers(
            &write(dir.path(), "tls.crt", &cert),
            &write(dir.path(), "tls.key", &key),
            &client_ca,
            peer_ca.as_deref(),
        )
        .unwrap();
        let mut cfg = Config {
            driver_name: "tpcsi.test".into(),
            volume_group: "vg1".into(),
            thin_pool: "pool".into(),
            lvm_binary: "/nonexistent/lvm".into(),
            state_dir: dir.path().join("state"),
            ..Config::default()
        };
        if peers {
            // A report of the pool and snapshot s1, for grants.
            cfg.lvm_binary = common::fake_lvm(dir.path(), &[]).0.lvm_binary;
            let report = dir.path().join("report.json");
            let text = std::fs::read_to_string(&report).unwrap();
            let tags = thinpool_csi::naming::SnapshotTags {
                owner: common::OWNER.into(),
                co_name: "s1".into(),
                source: thinpool_csi::naming::lv_name_for("pvc-1"),
                access: Some(thinpool_csi::naming::Access::Mount {
                    fs_type: "ext4".into(),
                }),
                group: None,
                encrypted: false,
            }
            .encode()
            .join(",");
            let snap = thinpool_csi::naming::snapshot_lv_name_for("s1");
            let row = common::row(&snap, "Vri---tz-k", "pool", "thin", &tags);
            std::fs::write(&report, text.replace("]}]}", &format!(",{row}]}}]}}"))).unwrap();
        }
        cfg.cluster.client_ca = client_ca;
        cfg.cluster.peer_ca = peer_ca.unwrap_or_default();
        let classes = Arc::new(Classes::new(&cfg, "node-1"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = thinpool_csi::channel::incoming(
            listener,
            tls,
            classes.metrics().clone(),
            Duration::from_millis(500),
        );
        tokio::spawn(thinpool_csi::grpc::serve_channel(
            classes.clone(),
            incoming,
            std::future::pending(),
        ));
        Node {
            dir,
            classes,
            port,
            ca,
            controller_ca,
        }
    }

    fn refused(&self) -> u64 {
        let text = render(&[], self.classes.metrics());
        let line = text
            .lines()
            .find(|l| l.starts_with(CHANNEL_REFUSED))
            .unwrap_or_else(|| panic!("no {CHANNEL_REFUSED} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// Waits (the refusal is counted by the handshake's own task) until
    /// more connections than `before` were refused (a client may try more
    /// than one connection per call); fails after 10 s. The new count.
    async fn await_refused_after(&self, before: u64) -> u64 {
        let t = Instant::now();
        while self.refused() <= before {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no refusal counted after {before}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Let the client's other attempts land before the next count.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.refused()
    }

    /// A TLS channel that trusts the node's CA, with `identity` (if any).
    async fn connect(&self, identity: Option<(String, String)>) -> Result<Channel, String> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca.pem()))
            .domain_name("localhost");
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Channel::from_shared(format!("https://127.0.0.1:{}", self.port))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))
    }
}

/// GetPluginInfo on the channel, meant for node-1 as the controller
/// sends every call (`channel::NODE_HEADER`).
async fn plugin_info(ch: Channel) -> Result<String, tonic::Status> {
    plugin_info_for(ch, Some("node-1")).await
}

async fn plugin_info_for(ch: Channel, node: Option<&str>) -> Result<String, tonic::Status> {
    let mut r = tonic::Request::new(GetPluginInfoRequest {});
    if let Some(node) = node {
        r.metadata_mut()
            .insert(thinpool_csi::channel::NODE_HEADER, node.parse().unwrap());
    }
    IdentityClient::new(ch)
        .get_plugin_info(r)
        .await
        .map(|r| r.into_inner().name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_certificate_gets_through_and_nothing_else_does() {
    let node = Node::start().await;
    let controller = leaf(&node.controller_ca, "controller", &[ClientAuth]);
    let ch = node.connect(Some(controller.clone())).await.unwrap();
    assert_eq!(plugin_info(ch.clone()).await.unwrap(), "tpcsi.test");
    // A call that names another node, or none, is refused before any
    // service sees it.
    for other in [Some("node-2"), None] {
        let e = plugin_info_for(ch.clone(), other).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(thinpool_csi::channel::answered_by_another(&e), "{e:?}");
    }
    // The channel carries no Node service: that is the kubelet's, on the
    // node's socket.
    let mut r = tonic::Request::new(NodeGetInfoRequest {});
    r.metadata_mut().insert(
        thinpool_csi::channel::NODE_HEADER,
        "node-1".parse().unwrap(),
    );
    let e = NodeClient::new(ch).node_get_info(r).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    let n = node.refused();
    assert_eq!(n, 0);

    // No client certificate: the handshake fails (TLS 1.3 may let the
    // client finish first; its first call fails then).
    match node.connect(None).await {
        Err(_) => {}
        Ok(ch) => {
            plugin_info(ch).await.unwrap_err();
        }
    }
    let n = node.await_refused_after(n).await;

    // A certificate another CA signed.
    let rogue = leaf(&ca("rogue CA"), "controller", &[ClientAuth]);
    match node.connect(Some(rogue)).await {
        Err(_) => {}
        Ok(ch) => {
            plugin_info(ch).await.unwrap_err();
        }
    }
    let mut n = node.await_refused_after(n).await;

    // Another node's certificate, from the nodes' CA, is no controller:
    // made for server authentication only, for both uses, or for any use.
    for usage in [&[ServerAuth][..], &[ServerAuth, ClientAuth], &[]] {
        let other_node = leaf(&node.ca, "node-2", usage);
        match node.connect(Some(other_node)).await {
            Err(_) => {}
            Ok(ch) => {
                plugin_info(ch).await.unwrap_err();
            }
        }
        n = node.await_refused_after(n).await;
    }

    // A connection that never starts its handshake is cut at the bound.
    let idle = tokio::net::TcpStream::connect(("127.0.0.1", node.port))
        .await
        .unwrap();
    let n = node.await_refused_after(n).await;
    drop(idle);

    // Plain text HTTP/2.
    let plain = Channel::from_shared(format!("http://127.0.0.1:{}", node.port))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        plugin_info(ch).await.unwrap_err();
    }
    let n = node.await_refused_after(n).await;

    // The good client still gets through, on a fresh connection too.
    let ch = node.connect(Some(controller)).await.unwrap();
    assert_eq!(plugin_info(ch).await.unwrap(), "tpcsi.test");
    assert_eq!(node.refused(), n, "the good client was not refused");
    drop(node.dir);
}

/// A `Transfer` call meant for node-1, with a grant's token if given.
fn transfer_request<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        thinpool_csi::channel::NODE_HEADER,
        "node-1".parse().unwrap(),
    );
    if let Some(t) = token {
        r.metadata_mut()
            .insert(thinpool_csi::channel::GRANT_HEADER, t.parse().unwrap());
    }
    r
}

async fn read(ch: Channel, snapshot: &str, token: Option<&str>) -> Code {
    let r = transfer_request(
        ReadRequest {
            snapshot_id: snapshot.into(),
            start: 0,
            ..Default::default()
        },
        token,
    );
    match TransferClient::new(ch).read(r).await {
        Ok(mut s) => match s.get_mut().message().await {
            Ok(_) => Code::Ok,
            Err(e) => e.code(),
        },
        Err(e) => e.code(),
    }
}

/// A peer's `Transfer.Hash` (a copy's whole check) of `snapshot`, or of
/// volume `volume`.
async fn hash(ch: Channel, (snapshot, volume): (&str, &str), token: Option<&str>) -> Code {
    let r = transfer_request(
        thinpool_csi::proto::thinpool::cluster::v1::HashRequest {
            snapshot_id: snapshot.into(),
            volume_id: volume.into(),
            segments: true,
            ..Default::default()
        },
        token,
    );
    match TransferClient::new(ch).hash(r).await {
        Ok(_) => Code::Ok,
        Err(e) => e.code(),
    }
}

/// With `cluster.peer_ca`, another node plugin's certificate gets through
/// the handshake, and reaches `Transfer.Read` and `Transfer.Hash` alone, for a snapshot the
/// controller had the node grant; everything else is PERMISSION_DENIED
/// before any service sees it, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_reads_only_a_granted_snapshot() {
    let node = Node::start_with(true).await;
    let controller = leaf(&node.controller_ca, "controller", &[ClientAuth]);
    let peer = leaf(&node.ca, "node-2", &[ServerAuth, ClientAuth]);
    let ctl = node.connect(Some(controller)).await.unwrap();
    let p = node.connect(Some(peer)).await.unwrap();
    let snap = thinpool_csi::naming::snapshot_lv_name_for("s1");
    let other = thinpool_csi::naming::snapshot_lv_name_for("s2");

    // The controller is the controller still.
    assert_eq!(plugin_info(ctl.clone()).await.unwrap(), "tpcsi.test");
    assert_eq!(node.refused(), 0);

    // A peer reaches no other service, and cannot grant itself a read.
    let e = plugin_info(p.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let grant = |ch: Channel, id: &str| {
        let r = transfer_request(
            GrantRequest {
                snapshot_id: id.into(),
                ttl_secs: 0,
                ..Default::default()
            },
            None,
        );
        async move { TransferClient::new(ch).grant(r).await }
    };
    let e = grant(p.clone(), &snap).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // Nor take or remove a snapshot for a clone.
    let vol = thinpool_csi::naming::lv_name_for("pvc-1");
    let r = transfer_request(
        thinpool_csi::proto::thinpool::cluster::v1::ReleaseRequest {
            volume_id: vol.clone(),
            clone_name: "c1".into(),
        },
        None,
    );
    let e = TransferClient::new(p.clone()).release(r).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let r = transfer_request(
        GrantRequest {
            volume_id: vol,
            clone_name: "c1".into(),
            ..Default::default()
        },
        None,
    );
    let e = TransferClient::new(p.clone()).grant(r).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(node.refused(), 4, "each refusal is counted");

    // Its read needs a live grant of that snapshot.
    assert_eq!(read(p.clone(), &snap, None).await, Code::PermissionDenied);
    assert_eq!(
        read(p.clone(), &snap, Some("00")).await,
        Code::PermissionDenied
    );
    // A snapshot the node lacks gets no grant.
    let e = grant(ctl.clone(), &other).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let token = grant(ctl.clone(), &snap).await.unwrap().into_inner();
    assert_eq!(token.expires_in_secs, 3600);
    assert_eq!(
        (token.size_bytes, token.access.as_str(), token.encrypted),
        (8 << 20, "mount:ext4", false),
        "what a copy must agree with"
    );
    assert_eq!(
        read(p.clone(), &other, Some(&token.token)).await,
        Code::PermissionDenied,
        "a grant is for one snapshot"
    );
    // With it, the read gets past the gate to the node's own checks
    // (this node has no LVM: the snapshot cannot be found or listed).
    let got = read(p.clone(), &snap, Some(&token.token)).await;
    assert!(
        ![Code::PermissionDenied, Code::Ok].contains(&got),
        "a granted read reaches the node's work: {got:?}"
    );
    // Its hash of a snapshot (a copy's whole check) needs the grant too,
    // and a volume it cannot hash at all.
    assert_eq!(
        hash(p.clone(), (&snap, ""), None).await,
        Code::PermissionDenied
    );
    assert_eq!(
        hash(p.clone(), (&other, ""), Some(&token.token)).await,
        Code::PermissionDenied,
        "a grant is for one snapshot"
    );
    assert_eq!(
        hash(p.clone(), ("", &snap), Some(&token.token)).await,
        Code::PermissionDenied,
        "a peer hashes no volume"
    );
    let got = hash(p.clone(), (&snap, ""), Some(&token.token)).await;
    assert!(
        ![Code::PermissionDenied, Code::Ok].contains(&got),
        "a granted hash reaches the node's work: {got:?}"
    );
    // The controller reads without a grant.
    let got = read(ctl, &snap, None).await;
    assert_ne!(got, Code::PermissionDenied);
    drop(node.dir);
}

#[test]
fn unreadable_tls_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("cluster CA");
    let (cert, key) = leaf(&ca, "localhost", &[ServerAuth]);
    let (c, k, a) = (
        write(dir.path(), "tls.crt", &cert),
        write(dir.path(), "tls.key", &key),
        write(dir.path(), "ca.crt", &ca.pem()),
    );
    assert!(thinpool_csi::channel::server_config(&c, &k, &a).is_ok());
    let missing = dir.path().join("missing.crt");
    let empty = write(dir.path(), "empty.crt", "");
    for (cert, key, ca, named) in [
        (&missing, &k, &a, &missing),
        (&c, &missing, &a, &missing),
        (&c, &k, &empty, &empty),
        (&c, &k, &missing, &missing),
        // A key that is not the certificate's.
        (
            &c,
            &write(
                dir.path(),
                "other.key",
                &KeyPair::generate().unwrap().serialize_pem(),
            ),
            &a,
            &c,
        ),
    ] {
        let e = thinpool_csi::channel::server_config(cert, key, ca).unwrap_err();
        let m = e.message();
        assert!(
            m.contains(&named.display().to_string()),
            "{m} names {}",
            named.display()
        );
        assert_eq!(tonic::Status::from(e).code(), Code::FailedPrecondition);
    }
}

/// The cipher a client with rustls's own order (AES-GCM first, as
/// tonic's) gets from a node on a CPU with or without AES instructions.
async fn negotiated(aes_in_hardware: bool) -> tokio_rustls::rustls::CipherSuite {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
    let dir = tempfile::tempdir().unwrap();
    let nodes = ca("nodes' CA");
    let controller = ca("controller's CA");
    let (cert, key) = leaf(&nodes, "localhost", &[ServerAuth]);
    let server = thinpool_csi::channel::server_config_for_cpu(
        &write(dir.path(), "tls.crt", &cert),
        &write(dir.path(), "tls.key", &key),
        &write(dir.path(), "controller-ca.crt", &controller.pem()),
        None,
        aes_in_hardware,
    )
    .unwrap();
    let (ccert, ckey) = leaf(&controller, "controller", &[ClientAuth]);
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(nodes.pem().as_bytes()).unwrap())
        .unwrap();
    let client =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(ccert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(ckey.as_bytes()).unwrap(),
            )
            .unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let accept = tokio_rustls::TlsAcceptor::from(server).accept(a);
    let connect = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), b);
    let (s, c) = tokio::join!(accept, connect);
    let (s, c) = (s.unwrap(), c.unwrap());
    let suite = s.get_ref().1.negotiated_cipher_suite().unwrap().suite();
    assert_eq!(
        c.get_ref().1.negotiated_cipher_suite().unwrap().suite(),
        suite
    );
    suite
}

#[tokio::test]
async fn a_node_without_aes_instructions_picks_chacha20_whatever_the_client_asks_first() {
    use tokio_rustls::rustls::CipherSuite;
    assert_eq!(
        negotiated(false).await,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        "software AES-GCM is about 10 times slower: the node's order wins"
    );
    assert_eq!(
        negotiated(true).await,
        CipherSuite::TLS13_AES_256_GCM_SHA384
    );
}
