//! The cluster's controller (src/cluster/, docs/cluster.md), natively:
//! two node plugins whose LVM report comes from a fake `lvm`, each on its
//! internal channel with mutual TLS, and the controller in front of them
//! on a unix socket, as the central sidecars call it. A third node is
//! listed but never started: its calls must be UNAVAILABLE and its
//! capacity 0.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ca, leaf, write, Ca};
use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use thinpool_csi::cluster::config::{StaticNode, DEFAULT_NODE_SERVER_NAME};
use thinpool_csi::cluster::{Cluster, ControllerConfig};
use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::volume::classes::Classes;
use tonic::transport::Channel;
use tonic::Code;

struct Rig {
    _dir: tempfile::TempDir,
    controller: ControllerClient<Channel>,
    /// Each started node's id and LV names.
    nodes: Vec<(String, Vec<String>)>,
}

/// A node plugin `id` with `names` volumes on a free port, its server
/// certificate from `nodes_ca`, taking clients of `controller_ca`.
async fn node(
    dir: &std::path::Path,
    id: &str,
    names: &[String],
    nodes_ca: &Ca,
    controller_ca: &Ca,
) -> (String, Vec<String>) {
    let dir = dir.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut cfg, lvs) = common::fake_lvm(&dir, names);
    cfg.cluster.listen = "127.0.0.1:0".into();
    let (cert, key) = leaf(nodes_ca, DEFAULT_NODE_SERVER_NAME, &[ServerAuth]);
    let tls = thinpool_csi::channel::server_config(
        &write(&dir, "tls.crt", &cert),
        &write(&dir, "tls.key", &key),
        &write(&dir, "controller-ca.crt", &controller_ca.pem()),
    )
    .unwrap();
    let classes = Arc::new(Classes::new(&cfg, id));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let incoming = thinpool_csi::channel::incoming(
        listener,
        tls,
        classes.metrics().clone(),
        Duration::from_secs(2),
    );
    tokio::spawn(thinpool_csi::grpc::serve_channel(
        classes,
        incoming,
        std::future::pending(),
    ));
    (address, lvs)
}

/// worker-1 and worker-2, and when `down`, worker-3 listed but never
/// started.
async fn rig(down: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let mut nodes = Vec::new();
    let mut listed = Vec::new();
    for (id, n) in [("worker-1", 3), ("worker-2", 2)] {
        let names: Vec<String> = (0..n).map(|i| format!("{id}-pvc-{i}")).collect();
        let (address, lvs) = node(dir.path(), id, &names, &nodes_ca, &controller_ca).await;
        listed.push(StaticNode {
            id: id.into(),
            address,
        });
        nodes.push((id.to_string(), lvs));
    }
    if down {
        // Listed, never started: nothing listens on its port.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listed.push(StaticNode {
            id: "worker-3".into(),
            address: closed.local_addr().unwrap().to_string(),
        });
    }
    let (cert, key) = leaf(&controller_ca, "thinpool-csi-controller", &[ClientAuth]);
    let cfg = ControllerConfig {
        driver_name: common::OWNER.into(),
        endpoint: String::new(),
        log_format: Default::default(),
        controller_expansion: true,
        tls_cert: write(dir.path(), "controller.crt", &cert),
        tls_key: write(dir.path(), "controller.key", &key),
        nodes_ca: write(dir.path(), "nodes-ca.crt", &nodes_ca.pem()),
        node_server_name: DEFAULT_NODE_SERVER_NAME.into(),
        connect_timeout_secs: 2,
        nodes: listed,
    };
    let cluster = Arc::new(Cluster::new(cfg).unwrap());
    let socket = dir.path().join("controller.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(thinpool_csi::grpc::serve_controller(
        cluster,
        Arc::default(),
        listener,
        std::future::pending(),
    ));
    let controller = ControllerClient::connect(format!("unix://{}", socket.display()))
        .await
        .unwrap();
    Rig {
        _dir: dir,
        controller,
        nodes,
    }
}

/// Every keyed id the started nodes hold, in node key order (the order
/// of a listing across nodes).
fn keyed(r: &Rig) -> Vec<String> {
    let mut by_key: Vec<(String, &Vec<String>)> = r
        .nodes
        .iter()
        .map(|(id, lvs)| (naming::node_key(id), lvs))
        .collect();
    by_key.sort();
    by_key
        .into_iter()
        .flat_map(|(k, lvs)| lvs.iter().map(move |lv| naming::with_node(&k, lv)))
        .collect()
}

async fn get(c: &mut ControllerClient<Channel>, id: &str) -> Result<String, tonic::Status> {
    c.controller_get_volume(ControllerGetVolumeRequest {
        volume_id: id.into(),
    })
    .await
    .map(|r| r.into_inner().volume.unwrap().volume_id)
}

async fn capacity(c: &mut ControllerClient<Channel>, node: Option<&str>) -> i64 {
    let key = format!("topology.{}/node", common::OWNER);
    c.get_capacity(GetCapacityRequest {
        accessible_topology: node.map(|n| Topology {
            segments: [(key, n.to_string())].into(),
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .available_capacity
}

#[tokio::test]
async fn each_call_reaches_the_node_that_holds_its_volume() {
    let mut r = rig(true).await;
    let c = &mut r.controller;
    let (w1, w2) = (&r.nodes[0], &r.nodes[1]);
    // By key: the owner answers, with the id as it minted it.
    let id = naming::with_node(&naming::node_key(&w2.0), &w2.1[1]);
    assert_eq!(get(c, &id).await.unwrap(), id);
    // Without a key (minted before the cluster): looked up, then served.
    for (node, lv) in [(w1, &w1.1[2]), (w2, &w2.1[0])] {
        let expected = naming::with_node(&naming::node_key(&node.0), lv);
        let e = get(c, lv).await;
        // worker-3 never answers: a lookup that misses it cannot say
        // the volume is nowhere, but one that finds it can.
        assert_eq!(e.unwrap(), expected, "{lv} on {}", node.0);
    }
    // A key of a node the controller does not know: UNAVAILABLE.
    let stray = naming::with_node(&naming::node_key("worker-9"), &w1.1[0]);
    assert_eq!(get(c, &stray).await.unwrap_err().code(), Code::Unavailable);
    // The key of a listed node that is down: UNAVAILABLE, the node named.
    let down = naming::with_node(&naming::node_key("worker-3"), &w1.1[0]);
    let e = get(c, &down).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("worker-3"), "{}", e.message());
    // An id without a key that no answering node holds, while worker-3
    // is down: it may be there, so UNAVAILABLE, and worker-3 is named.
    let e = get(c, &naming::lv_name_for("pvc-nowhere"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert!(e.message().contains("worker-3"), "{}", e.message());
    // An empty id is the caller's mistake, wherever the volume is.
    assert_eq!(get(c, "").await.unwrap_err().code(), Code::InvalidArgument);
    // CreateVolume names its node by topology; none is INVALID_ARGUMENT.
    let e = c
        .create_volume(CreateVolumeRequest {
            name: "pvc-new".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
}

#[tokio::test]
async fn a_listing_spans_the_nodes_and_pages_across_them() {
    let mut r = rig(false).await;
    let all = keyed(&r);
    assert_eq!(all.len(), 5);
    // Pages of every size, the ones that fill up at a node's end included
    // (worker-1 holds 3, worker-2 2): each volume once, in id order.
    for max in [0, 1, 2, 3, 4, 5, 6] {
        let (mut ids, mut token) = (vec![], String::new());
        for _ in 0..20 {
            let p = r
                .controller
                .list_volumes(ListVolumesRequest {
                    max_entries: max,
                    starting_token: token,
                })
                .await
                .unwrap()
                .into_inner();
            assert!(max == 0 || p.entries.len() <= max as usize);
            ids.extend(p.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
            token = p.next_token;
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(ids, all, "pages of {max}");
    }
    // A token no node issued: ABORTED, as on a node's socket.
    let e = r
        .controller
        .list_volumes(ListVolumesRequest {
            max_entries: 1,
            starting_token: "nonsense".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    // A listing without a node that is down would look whole.
    let mut r = rig(true).await;
    let e = r
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
}

#[tokio::test]
async fn capacity_is_the_named_nodes_and_0_for_a_node_that_cannot_answer() {
    let mut r = rig(true).await;
    let c = &mut r.controller;
    let one = capacity(c, Some("worker-1")).await;
    let two = capacity(c, Some("worker-2")).await;
    assert!(one > 0 && two > 0, "{one} {two}");
    assert_eq!(capacity(c, Some("worker-3")).await, 0, "listed, down");
    assert_eq!(capacity(c, Some("worker-9")).await, 0, "not listed");
    // Without a node: every node that answers.
    assert_eq!(capacity(c, None).await, one + two);
}

/// `thinpool-csi controller --config FILE`: the binary serves the
/// controller on its socket, and a config it cannot use stops it with
/// exit status 2, naming the key.
#[tokio::test]
async fn the_binary_runs_as_the_controller() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let (cert, key) = leaf(&controller_ca, "thinpool-csi-controller", &[ClientAuth]);
    let socket = dir.path().join("csi.sock");
    let config = format!(
        "driver_name = \"{}\"\nendpoint = \"unix://{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nnodes_ca = \"{}\"\n[[nodes]]\nid = \"worker-1\"\naddress = \"127.0.0.1:1\"\n",
        common::OWNER,
        socket.display(),
        write(dir.path(), "c.crt", &cert).display(),
        write(dir.path(), "c.key", &key).display(),
        write(dir.path(), "ca.crt", &nodes_ca.pem()).display(),
    );
    let path = write(dir.path(), "controller.toml", &config);
    let bin = env!("CARGO_BIN_EXE_thinpool-csi");
    let mut child = tokio::process::Command::new(bin)
        .args(["controller", "--config"])
        .arg(&path)
        .env_remove("CSI_ENDPOINT")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut waited = 0;
    while !socket.exists() {
        assert!(waited < 200, "the controller's socket never appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    let uri = format!("unix://{}", socket.display());
    let info = thinpool_csi::proto::csi::v1::identity_client::IdentityClient::connect(uri.clone())
        .await
        .unwrap()
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, common::OWNER);
    assert_eq!(
        info.manifest.get("mode").map(String::as_str),
        Some("controller")
    );
    // Its one node is down: a call for it is UNAVAILABLE, and the
    // controller still serves.
    let mut c = ControllerClient::connect(uri).await.unwrap();
    let id = naming::with_node(&naming::node_key("worker-1"), &naming::lv_name_for("pvc-1"));
    assert_eq!(
        get(&mut c, &id).await.unwrap_err().code(),
        Code::Unavailable
    );
    child.kill().await.unwrap();
    // A relative TLS path: refused before anything is served.
    let bad = write(
        dir.path(),
        "bad.toml",
        &config.replace(&format!("{}", dir.path().join("c.key").display()), "c.key"),
    );
    let out = tokio::process::Command::new(bin)
        .args(["controller", "--config"])
        .arg(&bad)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls_key"), "{err}");
}

#[tokio::test]
async fn what_no_node_holds_is_answered_by_a_node_as_on_its_socket() {
    let mut r = rig(false).await;
    let c = &mut r.controller;
    // Every node answered and none holds it: a node's own NOT_FOUND, and
    // OK for a removal (the spec's idempotent delete).
    let nowhere = naming::lv_name_for("pvc-nowhere");
    assert_eq!(get(c, &nowhere).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(get(c, "fake-id").await.unwrap_err().code(), Code::NotFound);
    c.delete_volume(DeleteVolumeRequest {
        volume_id: nowhere,
        ..Default::default()
    })
    .await
    .unwrap();
    // A listing token of a node the controller does not know: ABORTED.
    let gone = naming::with_node(&naming::node_key("worker-9"), &r.nodes[0].1[0]);
    let e = c
        .list_volumes(ListVolumesRequest {
            max_entries: 1,
            starting_token: gone.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted, "{}", e.message());
    // ControllerUnpublish is answered by the controller: OK even for a
    // node it does not know, so a VolumeAttachment never sticks.
    c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: gone,
        node_id: "worker-9".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let e = c
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // A snapshot listing across the nodes: neither holds one.
    let s = c
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(s.entries.is_empty() && s.next_token.is_empty());
}
