//! One controller for the cluster (docs/cluster.md), on real LVM: three
//! node plugins, each in its own network namespace (a veth link to the
//! root namespace) with its own loop-backed VG and node id, and the
//! controller in the root namespace reaching them over TCP through the
//! real channel (mutual TLS). The calls are the central sidecars'.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use thinpool_csi::cluster::config::DEFAULT_NODE_SERVER_NAME;
use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use thinpool_csi::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use crate::common::{ca, leaf, write};
use crate::fixtures::{allocated_batches, create_req, del, mount_cap, snap_req};
use crate::harness::{lvs, sh, TestDriver, DRIVER_NAME, MIB};

const NODES: usize = 3;
/// The port every node plugin's channel listens on, at its own address.
const PORT: u16 = 9443;

/// Network namespaces `tpc<i>` and veth links `tpc<i>` (root side,
/// 10.77.<i>.1) / `tpc<i>p` (the namespace's, 10.77.<i>.2); gone on drop.
struct Net;

impl Net {
    fn up() -> Net {
        for i in 1..=NODES {
            let (ns, link, peer) = names(i);
            // Left by a run that was killed.
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            let _ = Command::new("ip").args(["link", "del", &link]).output();
            sh("ip", &["netns", "add", &ns]);
            sh(
                "ip",
                &["link", "add", &link, "type", "veth", "peer", "name", &peer],
            );
            sh("ip", &["link", "set", &peer, "netns", &ns]);
            sh(
                "ip",
                &["addr", "add", &format!("10.77.{i}.1/30"), "dev", &link],
            );
            sh("ip", &["link", "set", &link, "up"]);
            sh(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("10.77.{i}.2/30"),
                    "dev",
                    &peer,
                ],
            );
            sh("ip", &["-n", &ns, "link", "set", &peer, "up"]);
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        Net
    }

    /// Takes node `i`'s link down or up.
    fn link(&self, i: usize, up: bool) {
        let (_, link, _) = names(i);
        sh(
            "ip",
            &["link", "set", &link, if up { "up" } else { "down" }],
        );
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 1..=NODES {
            let (ns, link, _) = names(i);
            let _ = Command::new("ip").args(["link", "del", &link]).output();
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

fn names(i: usize) -> (String, String, String) {
    (format!("tpc{i}"), format!("tpc{i}"), format!("tpc{i}p"))
}

fn node_id(i: usize) -> String {
    format!("node-{i}")
}

fn key(i: usize) -> String {
    naming::node_key(&node_id(i))
}

/// The controller process.
struct Controller {
    child: Child,
    socket: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Controller {
    async fn start(dir: &Path, config: &str) -> Controller {
        let path = write(dir, "controller.toml", config);
        let socket = dir.join("controller.sock");
        let log = dir.join("controller.log");
        let child = Command::new(env!("CARGO_BIN_EXE_thinpool-csi"))
            .args(["controller", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info")
            .env_remove("CSI_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "no controller socket; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Controller { child, socket, log }
    }

    fn uri(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::connect(self.uri()).await.unwrap()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "controller log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// CreateVolume as the provisioner sends it with strict topology: the
/// selected node as requisite and preferred.
fn on_node(name: &str, i: usize) -> CreateVolumeRequest {
    let topology = Topology {
        segments: [(format!("topology.{DRIVER_NAME}/node"), node_id(i))].into(),
    };
    CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![topology.clone()],
            preferred: vec![topology],
        }),
        ..create_req(name, 8 * MIB, mount_cap("ext4"))
    }
}

async fn capacity(c: &mut ControllerClient<Channel>, i: usize) -> i64 {
    c.get_capacity(GetCapacityRequest {
        accessible_topology: Some(Topology {
            segments: [(format!("topology.{DRIVER_NAME}/node"), node_id(i))].into(),
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .available_capacity
}

async fn get(c: &mut ControllerClient<Channel>, id: &str) -> Result<Volume, tonic::Status> {
    c.controller_get_volume(ControllerGetVolumeRequest {
        volume_id: id.into(),
    })
    .await
    .map(|r| r.into_inner().volume.unwrap())
}

/// The LV names of the volumes and snapshots in `vg`.
fn lv_names(vg: &str) -> Vec<String> {
    lvs(vg)
        .lvs
        .iter()
        .filter(|lv| lv.name.starts_with("csi-") || lv.name.starts_with("snap-"))
        .map(|lv| lv.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_controller_reaches_the_node_of_every_object() {
    let net = Net::up();
    let dir = tempfile::Builder::new()
        .prefix("tpcsi-cluster-")
        .tempdir()
        .unwrap();
    let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
    let (cert, key_pem) = leaf(&nodes_ca, DEFAULT_NODE_SERVER_NAME, &[ServerAuth]);
    let node_cert = write(dir.path(), "node.crt", &cert);
    let node_key = write(dir.path(), "node.key", &key_pem);
    let controller_ca_file = write(dir.path(), "controller-ca.crt", &controller_ca.pem());
    let mut nodes = Vec::new();
    for i in 1..=NODES {
        let extra = format!(
            "controller_expansion = true\n[cluster]\nlisten = \"10.77.{i}.2:{PORT}\"\n\
             tls_cert = \"{}\"\ntls_key = \"{}\"\nclient_ca = \"{}\"\n",
            node_cert.display(),
            node_key.display(),
            controller_ca_file.display()
        );
        let mut d = TestDriver::prepared(&format!("cl{i}"), 96 * MIB, &extra, "");
        d.prefix = vec!["nsenter".into(), format!("--net=/var/run/netns/tpc{i}")];
        d.node_id = Some(node_id(i));
        d.spawn().await;
        nodes.push(d);
    }
    let (cert, key_pem) = leaf(&controller_ca, "thinpool-csi-controller", &[ClientAuth]);
    let mut config = format!(
        "driver_name = \"{DRIVER_NAME}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nnodes_ca = \"{}\"\n\
         endpoint = \"unix://{dir}/controller.sock\"\n\
         csi_addons_endpoint = \"unix://{dir}/controller-addons.sock\"\nconnect_timeout_secs = 2\n",
        write(dir.path(), "controller.crt", &cert).display(),
        write(dir.path(), "controller.key", &key_pem).display(),
        write(dir.path(), "nodes-ca.crt", &nodes_ca.pem()).display(),
        dir = dir.path().display(),
    );
    for i in 1..=NODES {
        config.push_str(&format!(
            "[[nodes]]\nid = \"{}\"\naddress = \"10.77.{i}.2:{PORT}\"\n",
            node_id(i)
        ));
    }
    let ctl = Controller::start(dir.path(), &config).await;
    let mut c = ctl.controller().await;

    // The provisioner: CreateVolume on the node the scheduler picked, and
    // GetCapacity per node.
    let a = c
        .create_volume(on_node("pvc-a", 2))
        .await
        .unwrap()
        .into_inner();
    let a = a.volume.unwrap();
    let (k, lv_a) = naming::split_node(&a.volume_id);
    assert_eq!(k, Some(key(2).as_str()), "{}", a.volume_id);
    assert_eq!(lv_names(&nodes[1].vg), [lv_a]);
    assert!(lv_names(&nodes[0].vg).is_empty() && lv_names(&nodes[2].vg).is_empty());
    for i in 1..=NODES {
        assert!(capacity(&mut c, i).await > 0, "node {i}");
    }
    // Idempotent through the controller as on the socket: the same name,
    // the same volume.
    let again = c
        .create_volume(on_node("pvc-a", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.volume.unwrap().volume_id, a.volume_id);

    // The resizer: an unstaged volume grows through the controller.
    let grown = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: a.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 16 * MIB as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(grown.capacity_bytes >= 16 * MIB as i64);
    let size = lvs(&nodes[1].vg)
        .lvs
        .iter()
        .find(|l| l.name == lv_a)
        .unwrap()
        .size;
    assert!(size >= 16 * MIB, "{size}");
    // ModifyVolume (the resizer's, from a VolumeAttributesClass).
    c.controller_modify_volume(ControllerModifyVolumeRequest {
        volume_id: a.volume_id.clone(),
        mutable_parameters: [("readAheadSectors".to_string(), "256".to_string())].into(),
        ..Default::default()
    })
    .await
    .unwrap();

    // The snapshotter: a snapshot on the volume's node, restored and
    // cloned there.
    let s = c
        .create_snapshot(snap_req("snap-a", &a.volume_id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(naming::split_node(&s.snapshot_id).0, Some(key(2).as_str()));
    assert_eq!(s.source_volume_id, a.volume_id);
    let mut restore = on_node("pvc-restored", 2);
    restore.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: s.snapshot_id.clone(),
            },
        )),
    });
    let restored = c
        .create_volume(restore)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        naming::split_node(&restored.volume_id).0,
        Some(key(2).as_str())
    );
    // SnapshotMetadata through the controller: the node's own answer.
    let mut through = SnapshotMetadataClient::connect(ctl.uri()).await.unwrap();
    let mut direct = SnapshotMetadataClient::connect(nodes[1].uri())
        .await
        .unwrap();
    let via = allocated_batches(&mut through, &s.snapshot_id, 0, 0).await;
    let own = allocated_batches(&mut direct, &s.snapshot_id, 0, 0).await;
    assert_eq!(
        via.as_ref().map_err(|e| e.code()),
        own.as_ref().map_err(|e| e.code())
    );

    // Group snapshots: members on one node, or refused naming the nodes.
    let b = c
        .create_volume(on_node("pvc-b", 2))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let far = c
        .create_volume(on_node("pvc-far", 3))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(naming::split_node(&far.volume_id).0, Some(key(3).as_str()));
    let mut g = GroupControllerClient::connect(ctl.uri()).await.unwrap();
    let group = g
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "group-ab".into(),
            source_volume_ids: vec![a.volume_id.clone(), b.volume_id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(group.snapshots.len(), 2);
    assert_eq!(
        naming::split_node(&group.group_snapshot_id).0,
        Some(key(2).as_str())
    );
    let e = g
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "group-far".into(),
            source_volume_ids: vec![a.volume_id.clone(), far.volume_id.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());

    // An id minted before the cluster (no key): found by asking the nodes.
    let found = get(&mut c, lv_a).await.unwrap();
    assert_eq!(found.volume_id, a.volume_id);

    // Every volume listed once, across nodes, in pages of 2.
    let mut all = vec![];
    let mut token = String::new();
    loop {
        let p = c
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        all.extend(p.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
        token = p.next_token;
        if token.is_empty() {
            break;
        }
    }
    let mut expected = vec![
        a.volume_id.clone(),
        restored.volume_id.clone(),
        b.volume_id.clone(),
        far.volume_id.clone(),
    ];
    expected.sort();
    assert_eq!(all, expected);

    // A node's link goes down: its calls are UNAVAILABLE, its capacity 0,
    // and the other nodes still answer; back up, it answers again.
    net.link(3, false);
    let e = get(&mut c, &far.volume_id).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    assert_eq!(capacity(&mut c, 3).await, 0);
    assert!(capacity(&mut c, 1).await > 0);
    assert_eq!(
        get(&mut c, &a.volume_id).await.unwrap().volume_id,
        a.volume_id
    );
    net.link(3, true);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&mut c, &far.volume_id).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "node 3 not back after its link came up"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A node plugin killed: UNAVAILABLE until it is back.
    nodes[2].kill9_with_children();
    let e = get(&mut c, &far.volume_id).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
    nodes[2].spawn().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&mut c, &far.volume_id).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "node 3 not back after its restart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Everything goes, through the controller, from its own node.
    g.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: group
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.clone())
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: s.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    for id in [
        &restored.volume_id,
        &b.volume_id,
        &far.volume_id,
        &a.volume_id,
    ] {
        c.delete_volume(del(id)).await.unwrap();
    }
    for n in &nodes {
        assert!(
            lv_names(&n.vg).is_empty(),
            "{}: {:?}",
            n.vg,
            lv_names(&n.vg)
        );
    }
    drop(nodes);
}
