//! The cluster rig the LVM suite and the benchmark share: three node
//! plugins, each in its own network namespace (a veth link to the root
//! namespace) with its own loop-backed VG and node id, and the cluster's
//! controller in the root namespace reaching them over TCP through the
//! real channel (mutual TLS).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use thinpool_csi::cluster::config::DEFAULT_NODE_SERVER_NAME;
use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;

use crate::common::{ca, leaf, write};
use crate::fixtures::{create_req, mount_cap};
use crate::harness::{sh, TestDriver, DRIVER_NAME, MIB};

pub const NODES: usize = 3;
/// The port every node plugin's channel listens on, at its own address.
pub const PORT: u16 = 9443;

/// Network namespaces `tp<rig>n<i>` and veth links `tp<rig>n<i>` (root
/// side, 10.<77 + rig>.<i>.1) / `tp<rig>n<i>p` (the namespace's,
/// .2); gone on drop. Each rig of one run has its own `rig` number. The
/// nodes reach each other through the root namespace, which routes
/// between the links (as pods of two nodes reach each other), for a copy
/// one node pulls from another.
pub struct Net {
    rig: u8,
}

impl Net {
    pub fn up(rig: u8) -> Net {
        let net = Net { rig };
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("turn on IPv4 forwarding");
        for i in 1..=NODES {
            let (ns, link, peer) = net.names(i);
            let (root_ip, ns_ip) = (net.ip(i, 1), net.ip(i, 2));
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
                &["addr", "add", &format!("{root_ip}/30"), "dev", &link],
            );
            sh("ip", &["link", "set", &link, "up"]);
            sh(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{ns_ip}/30"),
                    "dev",
                    &peer,
                ],
            );
            sh("ip", &["-n", &ns, "link", "set", &peer, "up"]);
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"]);
            let others = format!("10.{}.0.0/16", 77 + rig);
            sh("ip", &["-n", &ns, "route", "add", &others, "via", &root_ip]);
        }
        net
    }

    /// Node `i`'s namespace, its link's root side and the namespace's side.
    fn names(&self, i: usize) -> (String, String, String) {
        let ns = format!("tp{}n{i}", self.rig);
        (ns.clone(), ns.clone(), format!("{ns}p"))
    }

    /// Address `end` (1: the root side, 2: the node's) of node `i`'s link.
    pub fn ip(&self, i: usize, end: u8) -> String {
        format!("10.{}.{i}.{end}", 77 + self.rig)
    }

    /// The path `nsenter --net=` takes for node `i`.
    pub fn netns_path(&self, i: usize) -> String {
        format!("/var/run/netns/{}", self.names(i).0)
    }

    /// `tc netem` on both ends of node `i`'s link (e.g. "delay 50ms 20ms
    /// loss 5%"), replacing what was there; `None` takes it off.
    pub fn impair(&self, i: usize, netem: Option<&str>) {
        let (ns, link, peer) = self.names(i);
        for (prefix, dev) in [(vec![], link), (vec!["-n".to_string(), ns.clone()], peer)] {
            let mut args: Vec<String> = prefix;
            match netem {
                Some(n) => {
                    args.extend(
                        ["qdisc", "replace", "dev", &dev, "root", "netem"].map(String::from),
                    );
                    args.extend(n.split_whitespace().map(String::from));
                }
                None => args.extend(["qdisc", "del", "dev", &dev, "root"].map(String::from)),
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            sh("tc", &args);
        }
    }

    /// Takes node `i`'s link down or up.
    pub fn link(&self, i: usize, up: bool) {
        let (_, link, _) = self.names(i);
        sh(
            "ip",
            &["link", "set", &link, if up { "up" } else { "down" }],
        );
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 1..=NODES {
            let (ns, link, _) = self.names(i);
            let _ = Command::new("ip").args(["link", "del", &link]).output();
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

pub fn node_id(i: usize) -> String {
    format!("node-{i}")
}

pub fn key(i: usize) -> String {
    naming::node_key(&node_id(i))
}

/// The controller process.
pub struct Controller {
    pub child: Child,
    config: std::path::PathBuf,
    socket: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Controller {
    pub async fn start(dir: &Path, config: &str) -> Controller {
        let path = write(dir, "controller.toml", config);
        let socket = dir.join("controller.sock");
        let log = dir.join("controller.log");
        let child = Self::spawn(&path, &log);
        let mut c = Controller {
            child,
            config: path,
            socket,
            log,
        };
        c.wait_ready().await;
        c
    }

    fn spawn(config: &Path, log: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Command::new(env!("CARGO_BIN_EXE_thinpool-csi"))
            .args(["controller", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env_remove("CSI_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// Until the controller answers GetPluginInfo on its socket.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut c) =
                thinpool_csi::proto::csi::v1::identity_client::IdentityClient::connect(self.uri())
                    .await
            {
                if c.get_plugin_info(GetPluginInfoRequest {}).await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the controller does not answer; its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// kill -9 of the controller, then a new one on the same config.
    pub async fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(&self.config, &self.log);
        self.wait_ready().await;
    }

    pub fn uri(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
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
pub fn on_node(name: &str, i: usize) -> CreateVolumeRequest {
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

/// `req` asking for at least `bytes`.
pub fn sized(req: CreateVolumeRequest, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..req
    }
}

/// `req` restoring snapshot `id`.
pub fn restoring(req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    use volume_content_source::{SnapshotSource, Type};
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(Type::Snapshot(SnapshotSource {
                snapshot_id: id.to_string(),
            })),
        }),
        ..req
    }
}

/// `req` cloning volume `id`.
pub fn cloning(req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    use volume_content_source::{Type, VolumeSource};
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(Type::Volume(VolumeSource {
                volume_id: id.to_string(),
            })),
        }),
        ..req
    }
}

/// The controller and its nodes; dropped in this order (the namespaces
/// last).
pub struct Rig {
    pub ctl: Controller,
    pub nodes: Vec<TestDriver>,
    pub _dir: tempfile::TempDir,
    pub net: Net,
}

impl Rig {
    /// Rig number `rig` of this run: three node plugins of `size` bytes
    /// each (with `extra` in their config) and the controller in front of
    /// them.
    pub async fn start(rig: u8, size: u64, extra: &str) -> Rig {
        Rig::start_with(rig, size, extra, "").await
    }

    /// [`Rig::start`], with `cluster_extra` in each node's `[cluster]`.
    pub async fn start_with(rig: u8, size: u64, extra: &str, cluster_extra: &str) -> Rig {
        let net = Net::up(rig);
        let dir = tempfile::Builder::new()
            .prefix("tpcsi-cluster-")
            .tempdir()
            .unwrap();
        let (nodes_ca, controller_ca) = (ca("nodes' CA"), ca("controller's CA"));
        // Client use too: a node pulls a copy from another node with its
        // own certificate (cluster.peer_ca, docs/moving.md).
        let (cert, key_pem) = leaf(
            &nodes_ca,
            DEFAULT_NODE_SERVER_NAME,
            &[ServerAuth, ClientAuth],
        );
        let node_cert = write(dir.path(), "node.crt", &cert);
        let node_key = write(dir.path(), "node.key", &key_pem);
        let controller_ca_file = write(dir.path(), "controller-ca.crt", &controller_ca.pem());
        let nodes_ca_file = write(dir.path(), "nodes-ca.crt", &nodes_ca.pem());
        let mut nodes = Vec::new();
        for i in 1..=NODES {
            let extra = format!(
                "controller_expansion = true\n{extra}\n[cluster]\nlisten = \"{}:{PORT}\"\n\
                 tls_cert = \"{}\"\ntls_key = \"{}\"\nclient_ca = \"{}\"\npeer_ca = \"{}\"\n{cluster_extra}\n",
                net.ip(i, 2),
                node_cert.display(),
                node_key.display(),
                controller_ca_file.display(),
                nodes_ca_file.display()
            );
            let mut d = TestDriver::prepared(&format!("cl{rig}n{i}"), size, &extra, "");
            d.prefix = vec!["nsenter".into(), format!("--net={}", net.netns_path(i))];
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
            nodes_ca_file.display(),
            dir = dir.path().display(),
        );
        for i in 1..=NODES {
            config.push_str(&format!(
                "[[nodes]]\nid = \"{}\"\naddress = \"{}:{PORT}\"\n",
                node_id(i),
                net.ip(i, 2)
            ));
        }
        let ctl = Controller::start(dir.path(), &config).await;
        Rig {
            ctl,
            nodes,
            _dir: dir,
            net,
        }
    }
}
