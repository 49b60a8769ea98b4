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
    /// The controller's socket, as a URI.
    uri: String,
    cluster: Arc<Cluster>,
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
    node_at(dir, id, names, nodes_ca, controller_ca, "127.0.0.1", 0).await
}

/// [`node`] on `ip:port` (0: a free port).
async fn node_at(
    dir: &std::path::Path,
    id: &str,
    names: &[String],
    nodes_ca: &Ca,
    controller_ca: &Ca,
    ip: &str,
    port: u16,
) -> (String, Vec<String>) {
    let tls = node_tls(&dir.join(id), nodes_ca, controller_ca);
    let (address, lvs, _) = node_with(dir, id, names, &tls, &format!("{ip}:{port}")).await;
    (address, lvs)
}

/// A node plugin's channel files in `files`: its certificate from
/// `nodes_ca`, its key, and `controller_ca`, the CA it takes clients of.
fn node_tls(files: &std::path::Path, nodes_ca: &Ca, controller_ca: &Ca) -> [std::path::PathBuf; 3] {
    std::fs::create_dir_all(files).unwrap();
    let (cert, key) = leaf(nodes_ca, DEFAULT_NODE_SERVER_NAME, &[ServerAuth]);
    [
        write(files, "tls.crt", &cert),
        write(files, "tls.key", &key),
        write(files, "controller-ca.crt", &controller_ca.pem()),
    ]
}

/// Waits (5 s at most) until `cluster` keeps a state of node `id` that
/// knows every class and holds every change seen.
async fn until_kept(cluster: &Cluster, id: &str) {
    let key = naming::node_key(id);
    for _ in 0..500 {
        if cluster.kept().holds(&key) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no state of {id} kept in 5 s");
}

/// A node plugin `id` with `names` volumes, serving its channel on
/// `address` with `tls`: its certificate, its key and the CA it takes
/// clients of. Its address, LV names and driver state (its metrics).
async fn node_with(
    dir: &std::path::Path,
    id: &str,
    names: &[String],
    tls: &[std::path::PathBuf; 3],
    address: &str,
) -> (String, Vec<String>, Arc<Classes>) {
    let dir = dir.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut cfg, lvs) = common::fake_lvm(&dir, names);
    cfg.cluster.listen = "127.0.0.1:0".into();
    let tls = thinpool_csi::channel::server_config(&tls[0], &tls[1], &tls[2]).unwrap();
    let classes = Arc::new(Classes::new(&cfg, id));
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let incoming = thinpool_csi::channel::incoming(
        listener,
        tls,
        classes.metrics().clone(),
        Duration::from_secs(2),
    );
    tokio::spawn(thinpool_csi::grpc::serve_channel(
        classes.clone(),
        incoming,
        std::future::pending(),
    ));
    (address, lvs, classes)
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
    let cfg = controller_config(
        controller_files(dir.path(), &controller_ca, &nodes_ca),
        listed,
    );
    let cluster = Arc::new(Cluster::new(cfg, None).await.unwrap());
    let uri = serve(&cluster, dir.path());
    let controller = ControllerClient::connect(uri.clone()).await.unwrap();
    Rig {
        _dir: dir,
        controller,
        uri,
        cluster,
        nodes,
    }
}

/// A controller client certificate from `controller_ca`, its key and the
/// nodes' CA, written in `dir`.
fn controller_files(
    dir: &std::path::Path,
    controller_ca: &Ca,
    nodes_ca: &Ca,
) -> [std::path::PathBuf; 3] {
    let (cert, key) = leaf(controller_ca, "thinpool-csi-controller", &[ClientAuth]);
    [
        write(dir, "controller.crt", &cert),
        write(dir, "controller.key", &key),
        write(dir, "nodes-ca.crt", &nodes_ca.pem()),
    ]
}

/// The controller's configuration: `tls` is its certificate, its key and
/// the nodes' CA; `nodes` the node plugins it knows.
fn controller_config(tls: [std::path::PathBuf; 3], nodes: Vec<StaticNode>) -> ControllerConfig {
    let [tls_cert, tls_key, nodes_ca] = tls;
    ControllerConfig {
        driver_name: common::OWNER.into(),
        endpoint: String::new(),
        csi_addons_endpoint: String::new(),
        log_format: Default::default(),
        controller_expansion: true,
        snapshot_metadata: true,
        tls_cert,
        tls_key,
        nodes_ca,
        node_server_name: DEFAULT_NODE_SERVER_NAME.into(),
        connect_timeout_secs: 2,
        nodes,
        discovery: None,
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

/// Serves `cluster` on `controller.sock` in `dir`; its URI.
fn serve(cluster: &Arc<Cluster>, dir: &std::path::Path) -> String {
    let socket = dir.join("controller.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(thinpool_csi::grpc::serve_controller(
        cluster.clone(),
        Arc::default(),
        listener,
        std::future::pending(),
    ));
    format!("unix://{}", socket.display())
}

/// `tpcsi --endpoint ARGS...`, which must succeed; its JSON output.
async fn tpcsi_json(args: &[&str]) -> serde_json::Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tpcsi"))
        .arg("--endpoint")
        .args(args)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap()
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
        let (ids, _) = common::list_ids(&mut r.controller, max).await;
        assert_eq!(ids, all, "pages of {max}");
    }
    // `tpcsi list` pointed at the controller lists every node's volumes.
    let listed = tpcsi_json(&[r.uri.as_str(), "--json", "list"]).await;
    let ids: Vec<String> = listed["volumes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v["volume_id"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids, all, "{listed}");
    // The class each id carries is read past its node key.
    assert!(
        listed["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["device_class"] == "default"),
        "{listed}"
    );
    // ... each with the node that holds it, from its key.
    for v in listed["volumes"].as_array().unwrap() {
        let id = v["volume_id"].as_str().unwrap();
        let holder = r
            .nodes
            .iter()
            .find(|(n, _)| naming::split_node(id).0 == Some(naming::node_key(n).as_str()))
            .map(|(n, _)| n.as_str());
        assert_eq!(v["node"].as_str(), holder, "{v}");
        assert!(holder.is_some(), "{v}");
    }
    // A class the controller cannot check (each node has its own) is not
    // refused there: it filters.
    let fast = tpcsi_json(&[r.uri.as_str(), "--json", "list", "--class", "fast"]).await;
    assert_eq!(fast["volumes"].as_array().map(Vec::len), Some(0), "{fast}");
    // The table names the node first.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tpcsi"))
        .args(["--endpoint", r.uri.as_str(), "list"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("NODE "), "{text}");
    assert_eq!(text.matches("worker-1 ").count(), 3, "{text}");
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
    // `tpcsi capacity` pointed at the controller: each node's, as the
    // provisioner asks it.
    let got = tpcsi_json(&[r.uri.as_str(), "--json", "capacity"]).await;
    let rows: Vec<(String, u64)> = got["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{got}"))
        .iter()
        .map(|n| {
            assert!(n["error"].is_null(), "{n}");
            (
                n["node"].as_str().unwrap().to_string(),
                n["available_capacity"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("worker-1".to_string(), one as u64),
            ("worker-2".to_string(), two as u64),
            ("worker-3".to_string(), 0),
        ],
        "{got}"
    );
}

/// Every forwarded call names the node it is meant for, and a node
/// refuses one meant for another: a controller whose address for
/// worker-2 is worker-1's (a pod IP reused before the next list) gets
/// UNAVAILABLE for worker-2's calls, never worker-1's answers, and
/// worker-1 touches nothing.
#[tokio::test]
async fn a_call_reaching_another_node_is_refused_there() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let (address, lvs) = node(
        dir.path(),
        "worker-1",
        &["pvc-a".to_string()],
        &nodes_ca,
        &controller_ca,
    )
    .await;
    let listed = ["worker-1", "worker-2"]
        .map(|id| StaticNode {
            id: id.into(),
            address: address.clone(),
        })
        .to_vec();
    let cfg = controller_config(
        controller_files(dir.path(), &controller_ca, &nodes_ca),
        listed,
    );
    let cluster = Arc::new(Cluster::new(cfg, None).await.unwrap());
    let mut c = ControllerClient::connect(serve(&cluster, dir.path()))
        .await
        .unwrap();
    // worker-1's own calls pass.
    let mine = naming::with_node(&naming::node_key("worker-1"), &lvs[0]);
    assert_eq!(get(&mut c, &mine).await.unwrap(), mine);
    assert!(capacity(&mut c, Some("worker-1")).await > 0);
    // worker-2's reach worker-1, which refuses them before any service:
    // a lookup that worker-1 itself would answer NOT_FOUND (another
    // node's key) is UNAVAILABLE with the refusal's mark, so the sidecar
    // retries once the controller has listed the nodes again; capacity
    // is 0, and a delete is not done.
    let theirs = naming::with_node(&naming::node_key("worker-2"), &lvs[0]);
    let e = get(&mut c, &theirs).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(thinpool_csi::channel::answered_by_another(&e), "{e:?}");
    assert_eq!(capacity(&mut c, Some("worker-2")).await, 0);
    let e = c
        .delete_volume(DeleteVolumeRequest {
            volume_id: theirs,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(thinpool_csi::channel::answered_by_another(&e), "{e:?}");
    assert!(
        e.message().contains("meant for \"worker-2\""),
        "{}",
        e.message()
    );
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
    let addons = dir.path().join("addons.sock");
    let config = format!(
        "driver_name = \"{}\"\nendpoint = \"unix://{}\"\ncsi_addons_endpoint = \"unix://{}\"\n\
         tls_cert = \"{}\"\ntls_key = \"{}\"\nnodes_ca = \"{}\"\n[[nodes]]\nid = \"worker-1\"\naddress = \"127.0.0.1:1\"\n",
        common::OWNER,
        socket.display(),
        addons.display(),
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
    // `tpcsi info` pointed at the controller: its manifest names its nodes,
    // and it has no Node service to ask.
    let info = tpcsi_json(&[
        &format!("unix://{}", socket.display()),
        "--addons-endpoint",
        &format!("unix://{}", addons.display()),
        "--json",
        "info",
    ])
    .await;
    assert_eq!(info["manifest"]["mode"], "controller", "{info}");
    assert_eq!(info["manifest"]["nodes"], "worker-1", "{info}");
    assert!(info.get("node_id").is_none(), "{info}");
    // Its CSI-Addons identity is the controller's: the lease is its.
    let addons_caps = info["addons"]["capabilities"].to_string();
    assert!(
        addons_caps.contains("CONTROLLER_SERVICE") && !addons_caps.contains("NODE_SERVICE"),
        "{info}"
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
    // The controller has no ControllerPublish/Unpublish, as its nodes:
    // UNIMPLEMENTED, and nothing is asked of any node (the attacher's
    // trivial handler never calls them).
    let e = c
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: gone,
            node_id: "worker-9".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{}", e.message());
    let e = c
        .controller_publish_volume(ControllerPublishVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{}", e.message());
    // A snapshot listing across the nodes: neither holds one.
    let s = c
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(s.entries.is_empty() && s.next_token.is_empty());
}

/// A fake Kubernetes API server: answers every `GET` of the pods of
/// namespace `csi` with the pods in `pods` (node name, pod IP, phase), and
/// keeps each request's path and query.
struct FakeApi {
    url: String,
    pods: Arc<std::sync::Mutex<Vec<(String, String, String)>>>,
    /// The Nodes of the cluster, by name (a `GET` of another is 404).
    nodes: Arc<std::sync::Mutex<Vec<String>>>,
    asked: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeApi {
    async fn start() -> FakeApi {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let pods: Arc<std::sync::Mutex<Vec<(String, String, String)>>> = Arc::default();
        let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let nodes: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (p, a, ns) = (pods.clone(), asked.clone(), nodes.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let (p, a, ns) = (p.clone(), a.clone(), ns.clone());
                tokio::spawn(async move {
                    // One request per connection (Connection: close).
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = s.read(&mut chunk).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    a.lock().unwrap().push(target.clone());
                    let (status, body) = if target.starts_with("/api/v1/namespaces/csi/pods") {
                        let items: Vec<serde_json::Value> = p
                            .lock()
                            .unwrap()
                            .iter()
                            .map(|(node, ip, phase)| {
                                serde_json::json!({
                                    "metadata": {"name": format!("node-{node}"), "namespace": "csi"},
                                    "spec": {"nodeName": node, "containers": []},
                                    "status": {"phase": phase, "podIP": ip},
                                })
                            })
                            .collect();
                        let list = serde_json::json!({
                            "apiVersion": "v1", "kind": "PodList",
                            "metadata": {"resourceVersion": "1"}, "items": items,
                        });
                        ("200 OK", list.to_string())
                    } else if let Some(name) = target
                        .strip_prefix("/api/v1/nodes/")
                        .filter(|n| ns.lock().unwrap().iter().any(|k| k == n))
                    {
                        let node = serde_json::json!({
                            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                        });
                        ("200 OK", node.to_string())
                    } else {
                        (
                            "404 Not Found",
                            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"not found","reason":"NotFound","code":404}"#
                                .to_string(),
                        )
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        FakeApi {
            url,
            pods,
            nodes,
            asked,
        }
    }

    fn client(&self) -> kube::Client {
        let cfg = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(cfg).unwrap()
    }
}

/// The node plugins found through the Kubernetes API: the pods the
/// selector picks in the namespace, at their IPs and the configured port;
/// a node that joins later is found when a call names it.
#[tokio::test]
async fn node_plugins_are_found_through_the_kubernetes_api() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    // Two node plugins on one port, at two loopback addresses, as two pods
    // at their pod IPs.
    let mut port = 0;
    let mut lvs = Vec::new();
    for (i, id) in ["worker-1", "worker-2"].into_iter().enumerate() {
        let ip = format!("127.0.0.{}", i + 1);
        let names = vec![format!("{id}-pvc-0")];
        let (address, l) =
            node_at(dir.path(), id, &names, &nodes_ca, &controller_ca, &ip, port).await;
        port = address.rsplit(':').next().unwrap().parse().unwrap();
        lvs.push((id, ip, l));
    }
    let api = FakeApi::start().await;
    *api.pods.lock().unwrap() = vec![
        ("worker-1".into(), lvs[0].1.clone(), "Running".into()),
        ("worker-9".into(), "127.0.0.9".into(), "Pending".into()),
    ];
    let (cert, key) = leaf(&controller_ca, "thinpool-csi-controller", &[ClientAuth]);
    let cfg = ControllerConfig::parse(&format!(
        "driver_name = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nnodes_ca = \"{}\"\n\
         [discovery]\nnamespace = \"csi\"\nlabel_selector = \"app=thinpool-csi-node\"\nport = {port}\n",
        common::OWNER,
        write(dir.path(), "c.crt", &cert).display(),
        write(dir.path(), "c.key", &key).display(),
        write(dir.path(), "ca.crt", &nodes_ca.pem()).display(),
    ))
    .unwrap();
    let cluster = Cluster::new(cfg, Some(api.client())).await.unwrap();
    // The first list was read at start, with the selector.
    let asked = api.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0].contains("labelSelector=app%3Dthinpool-csi-node"),
        "{asked:?}"
    );
    let ids: Vec<String> = cluster.nodes.all().iter().map(|n| n.id.clone()).collect();
    assert_eq!(ids, ["worker-1"], "the pending pod is no node plugin yet");
    let cluster = Arc::new(cluster);
    let mut c = ControllerClient::connect(serve(&cluster, dir.path()))
        .await
        .unwrap();
    let keyed = |id: &str, lv: &str| naming::with_node(&naming::node_key(id), lv);
    let one = keyed("worker-1", &lvs[0].2[0]);
    assert_eq!(get(&mut c, &one).await.unwrap(), one);
    // worker-2's pod comes up. A call for it soon after the last list
    // does not list again (a storm for a gone node asks once per 5 s) ...
    api.pods
        .lock()
        .unwrap()
        .push(("worker-2".into(), lvs[1].1.clone(), "Running".into()));
    let two = keyed("worker-2", &lvs[1].2[0]);
    assert_eq!(
        get(&mut c, &two).await.unwrap_err().code(),
        Code::Unavailable
    );
    assert_eq!(api.asked.lock().unwrap().len(), 1);
    // ... and once that time has passed, it does, and reaches the node.
    tokio::time::sleep(thinpool_csi::cluster::discovery::MISS_REFRESH_MIN).await;
    assert_eq!(get(&mut c, &two).await.unwrap(), two);
    assert_eq!(api.asked.lock().unwrap().len(), 2);
    // A node that is known asks the API nothing.
    assert_eq!(get(&mut c, &one).await.unwrap(), one);
    assert_eq!(api.asked.lock().unwrap().len(), 2);

    // worker-1's pod goes (a rollout, a drain) while its Node stays: it
    // may come back with its volumes, so nothing of it is "gone" and no
    // listing passes for whole without it.
    *api.nodes.lock().unwrap() = vec!["worker-1".into(), "worker-2".into()];
    api.pods
        .lock()
        .unwrap()
        .retain(|(node, _, _)| node != "worker-1");
    let finder = cluster.finder().expect("discovery");
    finder.refresh(&cluster.nodes).await.unwrap();
    assert_eq!(cluster.nodes.missing(), ["worker-1"]);
    assert_eq!(
        get(&mut c, &one).await.unwrap_err().code(),
        Code::Unavailable
    );
    // Its volume by the id without a key: not "nowhere", UNAVAILABLE.
    let e = get(&mut c, &lvs[0].2[0]).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    let e = c
        .delete_volume(DeleteVolumeRequest {
            volume_id: lvs[0].2[0].clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    let e = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    // Its Node is deleted: the node is forgotten, and the listing is whole
    // again without it.
    api.nodes.lock().unwrap().retain(|n| n != "worker-1");
    finder.refresh(&cluster.nodes).await.unwrap();
    assert!(cluster.nodes.missing().is_empty());
    let listed: Vec<String> = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect();
    assert_eq!(listed, [two]);
}

#[tokio::test]
async fn group_snapshots_are_taken_on_one_node_and_found_by_key() {
    let r = rig(true).await;
    let (w1, w2) = (&r.nodes[0], &r.nodes[1]);
    let key = |id: &str| naming::node_key(id);
    let mut g =
        thinpool_csi::proto::csi::v1::group_controller_client::GroupControllerClient::connect(
            r.uri.clone(),
        )
        .await
        .unwrap();
    // Members on two nodes: refused before any node is asked to freeze
    // anything, both nodes named.
    let e = g
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "group-1".into(),
            source_volume_ids: vec![
                naming::with_node(&key(&w1.0), &w1.1[0]),
                naming::with_node(&key(&w2.0), &w2.1[0]),
            ],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(
        e.message().contains("worker-1") && e.message().contains("worker-2"),
        "{}",
        e.message()
    );
    // A group id with a node's key goes to that node, which answers for
    // it (no such group there); one of a node that is down: UNAVAILABLE.
    let group = naming::group_id_for("group-1");
    let e = g
        .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: naming::with_node(&key(&w1.0), &group),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    let e = g
        .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: naming::with_node(&key("worker-3"), &group),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
}

/// A node whose SnapshotMetadata stream sends two ranges and then dies
/// (its stream panics: the connection is cut with no status).
struct DyingNode;

#[tonic::async_trait]
impl thinpool_csi::proto::csi::v1::snapshot_metadata_server::SnapshotMetadata for DyingNode {
    type GetMetadataAllocatedStream = std::pin::Pin<
        Box<
            dyn futures_util::Stream<Item = Result<GetMetadataAllocatedResponse, tonic::Status>>
                + Send,
        >,
    >;
    type GetMetadataDeltaStream = std::pin::Pin<
        Box<
            dyn futures_util::Stream<Item = Result<GetMetadataDeltaResponse, tonic::Status>> + Send,
        >,
    >;

    async fn get_metadata_allocated(
        &self,
        _r: tonic::Request<GetMetadataAllocatedRequest>,
    ) -> Result<tonic::Response<Self::GetMetadataAllocatedStream>, tonic::Status> {
        fn item(offset: i64) -> Result<GetMetadataAllocatedResponse, tonic::Status> {
            Ok(GetMetadataAllocatedResponse {
                block_metadata_type: 1,
                volume_capacity_bytes: 1 << 20,
                block_metadata: vec![BlockMetadata {
                    byte_offset: offset,
                    size_bytes: 4096,
                }],
            })
        }
        let items = futures_util::stream::iter([item(0), item(4096)]);
        let dies = futures_util::stream::once(async {
            // The two ranges reach the controller; then the node's
            // process is killed mid-stream.
            tokio::time::sleep(Duration::from_millis(300)).await;
            panic!("the node dies mid-stream");
            #[allow(unreachable_code)]
            item(8192)
        });
        Ok(tonic::Response::new(Box::pin(
            futures_util::StreamExt::chain(items, dies),
        )))
    }

    async fn get_metadata_delta(
        &self,
        _r: tonic::Request<GetMetadataDeltaRequest>,
    ) -> Result<tonic::Response<Self::GetMetadataDeltaStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

/// A SnapshotMetadata stream cut short on the node ends with an error at
/// the controller, after the ranges that came: never OK, or a backup tool
/// would take a partial change list as whole.
#[tokio::test]
async fn a_metadata_stream_cut_short_on_the_node_ends_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let (cert, key) = leaf(&nodes_ca, DEFAULT_NODE_SERVER_NAME, &[ServerAuth]);
    let tls = thinpool_csi::channel::server_config(
        &write(dir.path(), "n.crt", &cert),
        &write(dir.path(), "n.key", &key),
        &write(dir.path(), "cca.crt", &controller_ca.pem()),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let incoming =
        thinpool_csi::channel::incoming(listener, tls, Arc::default(), Duration::from_secs(2));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                thinpool_csi::proto::csi::v1::snapshot_metadata_server::SnapshotMetadataServer::new(
                    DyingNode,
                ),
            )
            .serve_with_incoming(incoming),
    );
    let (cert, key) = leaf(&controller_ca, "thinpool-csi-controller", &[ClientAuth]);
    let cfg = ControllerConfig::parse(&format!(
        "driver_name = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nnodes_ca = \"{}\"\n\
         [[nodes]]\nid = \"worker-1\"\naddress = \"{address}\"\n",
        common::OWNER,
        write(dir.path(), "c.crt", &cert).display(),
        write(dir.path(), "c.key", &key).display(),
        write(dir.path(), "ca.crt", &nodes_ca.pem()).display(),
    ))
    .unwrap();
    let cluster = Arc::new(Cluster::new(cfg, None).await.unwrap());
    let snap = naming::with_node(
        &naming::node_key("worker-1"),
        &naming::snapshot_lv_name_for("snap-1"),
    );
    let mut s = cluster
        .metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: snap,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut got = vec![];
    let end = loop {
        match futures_util::StreamExt::next(&mut s).await {
            Some(Ok(r)) => got.extend(r.block_metadata.iter().map(|b| b.byte_offset)),
            Some(Err(e)) => break Some(e),
            None => break None,
        }
    };
    assert_eq!(got, [0, 4096], "the ranges sent before the cut pass");
    let e = end.expect("a stream cut short must not end OK");
    assert_ne!(e.code(), Code::Ok);
}

/// ControllerReclaimSpace (CSI-Addons) goes to the node of the volume.
#[tokio::test]
async fn reclaim_space_goes_to_the_node_of_the_volume() {
    use thinpool_csi::proto::reclaimspace::ControllerReclaimSpaceRequest;
    let r = rig(true).await;
    let reclaim = |id: String| {
        let cluster = r.cluster.clone();
        async move {
            cluster
                .controller_reclaim(ControllerReclaimSpaceRequest {
                    volume_id: id,
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .map_err(|e| e.code())
        }
    };
    let lv = naming::lv_name_for("pvc-gone");
    // worker-1 holds no such volume: its own NOT_FOUND.
    let on_one = naming::with_node(&naming::node_key("worker-1"), &lv);
    assert_eq!(reclaim(on_one).await, Err(Code::NotFound));
    // worker-3 is down.
    let on_three = naming::with_node(&naming::node_key("worker-3"), &lv);
    assert_eq!(reclaim(on_three).await, Err(Code::Unavailable));
    assert_eq!(reclaim(String::new()).await, Err(Code::InvalidArgument));
}

/// The certificates scripts/cluster-tls.sh makes for the deployment
/// (deploy/kubernetes/README.md, "Certificates") open the channel: the
/// controller's reaches a node, and a node's own, presented as a client,
/// is refused in the handshake.
#[tokio::test]
async fn the_deployments_certificates_open_the_channel_to_the_controller_only() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster-tls.sh");
    let out = tokio::process::Command::new(&script)
        .arg(&tls)
        .args(["--days", "2"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = |name: &str| tls.join(name);
    // The Secrets carry what the pods mount (node.yaml, controller.yaml).
    let secrets = std::fs::read_to_string(f("secrets.yaml")).unwrap();
    for needle in [
        "name: thinpool-csi-node-tls",
        "name: thinpool-csi-controller-tls",
        "type: kubernetes.io/tls",
        "namespace: thinpool-csi",
    ] {
        assert!(secrets.contains(needle), "{needle} not in {secrets}");
    }
    assert_eq!(secrets.matches("ca.crt: ").count(), 2, "{secrets}");
    let (address, lvs, node1) = node_with(
        dir.path(),
        "worker-1",
        &["pvc-a".to_string()],
        &[f("node.crt"), f("node.key"), f("controller-ca.crt")],
        "127.0.0.1:0",
    )
    .await;
    let listed = || {
        vec![StaticNode {
            id: "worker-1".into(),
            address: address.clone(),
        }]
    };
    let id = naming::with_node(&naming::node_key("worker-1"), &lvs[0]);
    let mut c = controller_in(
        &dir.path().join("good"),
        [f("controller.crt"), f("controller.key"), f("nodes-ca.crt")],
        listed(),
    )
    .await;
    assert_eq!(get(&mut c, &id).await.unwrap(), id);
    // A node's certificate is no key to another node.
    let mut c = controller_in(
        &dir.path().join("bad"),
        [f("node.crt"), f("node.key"), f("nodes-ca.crt")],
        listed(),
    )
    .await;
    let before = refused(&node1);
    let e = get(&mut c, &id).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    // ... refused by worker-1 in the handshake (counted there).
    let t = std::time::Instant::now();
    while refused(&node1) == before {
        assert!(t.elapsed() < Duration::from_secs(10), "no refusal counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Run again: the CAs are kept, so the first controller's certificate
    // opens a node that has the renewed ones.
    for f in ["controller.crt", "controller.key"] {
        std::fs::copy(tls.join(f), dir.path().join(format!("old-{f}"))).unwrap();
    }
    let out = tokio::process::Command::new(&script)
        .arg(&tls)
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("keeping"));
    let (address, lvs, _) = node_with(
        dir.path(),
        "worker-2",
        &["pvc-b".to_string()],
        &[f("node.crt"), f("node.key"), f("controller-ca.crt")],
        "127.0.0.1:0",
    )
    .await;
    let mut c = controller_in(
        &dir.path().join("old"),
        [
            dir.path().join("old-controller.crt"),
            dir.path().join("old-controller.key"),
            f("nodes-ca.crt"),
        ],
        vec![StaticNode {
            id: "worker-2".into(),
            address,
        }],
    )
    .await;
    let id = naming::with_node(&naming::node_key("worker-2"), &lvs[0]);
    assert_eq!(get(&mut c, &id).await.unwrap(), id);
}

/// A controller with `tls` (certificate, key, nodes' CA) in front of
/// `nodes`, served in `dir`; a client of it.
async fn controller_in(
    dir: &std::path::Path,
    tls: [std::path::PathBuf; 3],
    nodes: Vec<StaticNode>,
) -> ControllerClient<Channel> {
    std::fs::create_dir_all(dir).unwrap();
    let cluster = Arc::new(
        Cluster::new(controller_config(tls, nodes), None)
            .await
            .unwrap(),
    );
    ControllerClient::connect(serve(&cluster, dir))
        .await
        .unwrap()
}

/// thinpool_csi_channel_refused_total of a node.
fn refused(classes: &Classes) -> u64 {
    let text = thinpool_csi::metrics::render(&[], classes.metrics());
    text.lines()
        .find(|l| l.starts_with(thinpool_csi::metrics::CHANNEL_REFUSED))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no refusal count in\n{text}"))
}

/// How many `method` calls of the Controller service `classes` served.
async fn served(classes: &Classes, method: &str) -> u64 {
    let line = format!(
        "thinpool_csi_rpc_requests_total{{service=\"csi.v1.Controller\",method=\"{method}\"}} "
    );
    classes
        .exposition()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&line).map(|n| n.parse().unwrap()))
        .unwrap_or(0)
}

/// GetCapacity through the controller is answered from the capacity the
/// node's `Capacity.Watch` stream keeps (docs/cluster.md): after the first
/// call the node serves no more of them, the controller refuses what the
/// node would refuse, never answers from a state older than a change it
/// saw (it asks the node then), and after a delete through it answers
/// the node's new figure.
#[tokio::test]
async fn capacity_is_kept_from_the_nodes_stream_as_the_node_would_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let tls = node_tls(&dir.path().join("worker-1-tls"), &nodes_ca, &controller_ca);
    let names: Vec<String> = (0..3).map(|i| format!("pvc-{i}")).collect();
    let (address, lvs, node) = node_with(dir.path(), "worker-1", &names, &tls, "127.0.0.1:0").await;
    let cfg = controller_config(
        controller_files(dir.path(), &controller_ca, &nodes_ca),
        vec![StaticNode {
            id: "worker-1".into(),
            address,
        }],
    );
    let cluster = Arc::new(Cluster::new(cfg, None).await.unwrap());
    let mut c = ControllerClient::connect(serve(&cluster, dir.path()))
        .await
        .unwrap();
    let here = Some("worker-1");

    // The first call goes to the node, which is watched from then on.
    let first = capacity(&mut c, here).await;
    assert_eq!(served(&node, "GetCapacity").await, 1);
    let key = naming::node_key("worker-1");
    until_kept(&cluster, "worker-1").await;
    for _ in 0..5 {
        assert_eq!(capacity(&mut c, here).await, first);
        assert_eq!(capacity(&mut c, None).await, first);
    }
    assert_eq!(
        served(&node, "GetCapacity").await,
        1,
        "answered by the node"
    );

    // What the node refuses, the kept state refuses, in the node's words.
    let ask = |params: &[(&str, &str)]| GetCapacityRequest {
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let e = c
        .get_capacity(ask(&[("deviceClass", "nvme")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .contains("device class \"nvme\" is not one of this node's: [\"default\"]"),
        "{e:?}"
    );
    let e = c
        .get_capacity(ask(&[("no-such-key", "1")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("no-such-key"), "{e:?}");
    assert_eq!(served(&node, "GetCapacity").await, 1);

    // A state older than a change the controller saw is not answered
    // from: the node is asked.
    let worker = cluster.nodes.by_id("worker-1").unwrap();
    let seen = worker.seen.load(std::sync::atomic::Ordering::SeqCst);
    assert!(seen > 0, "the node's answers carry its change counter");
    worker
        .seen
        .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(capacity(&mut c, here).await, first);
    assert_eq!(served(&node, "GetCapacity").await, 2, "asked the node");
    worker.seen.store(seen, std::sync::atomic::Ordering::SeqCst);

    // A delete through the controller: the next answer is the node's new
    // figure (the fake lvm's lvremove succeeds; the report drops the LV).
    let before = node.all()[0].capacity_now().await.unwrap();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: naming::with_node(&key, &lvs[0]),
        ..Default::default()
    })
    .await
    .unwrap();
    let after = node.all()[0].capacity_now().await.unwrap();
    let want = thinpool_csi::grpc::controller::capacity_response(&after.0, after.1);
    assert_ne!(
        thinpool_csi::grpc::controller::capacity_response(&before.0, before.1),
        want,
        "a delete that changes nothing proves nothing"
    );
    let got = c
        .get_capacity(GetCapacityRequest {
            accessible_topology: Some(Topology {
                segments: [(
                    format!("topology.{}/node", common::OWNER),
                    "worker-1".into(),
                )]
                .into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, want);
}

/// A node plugin whose capacity the controller watches still stops at
/// once: its server waits for every connection to close, and the watch
/// stream ends when the server stops (it used to hold the stop until the
/// kubelet's grace period ran out).
#[tokio::test]
async fn a_watched_node_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let tls = node_tls(&dir.path().join("tls"), &nodes_ca, &controller_ca);
    let (cfg, _) = common::fake_lvm(dir.path(), &["pvc-0".to_string()]);
    let classes = Arc::new(Classes::new(&cfg, "worker-1"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let incoming = thinpool_csi::channel::incoming(
        listener,
        thinpool_csi::channel::server_config(&tls[0], &tls[1], &tls[2]).unwrap(),
        classes.metrics().clone(),
        Duration::from_secs(2),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(thinpool_csi::grpc::serve_channel(
        classes.clone(),
        incoming,
        async move {
            let _ = stopped.await;
        },
    ));
    let cfg = controller_config(
        controller_files(dir.path(), &controller_ca, &nodes_ca),
        vec![StaticNode {
            id: "worker-1".into(),
            address,
        }],
    );
    let cluster = Arc::new(Cluster::new(cfg, None).await.unwrap());
    let mut c = ControllerClient::connect(serve(&cluster, dir.path()))
        .await
        .unwrap();
    assert!(capacity(&mut c, Some("worker-1")).await > 0);
    until_kept(&cluster, "worker-1").await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the node's channel server did not stop within 5 s while watched")
        .unwrap()
        .unwrap();
}
