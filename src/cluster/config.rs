//! The controller's configuration (`thinpool-csi controller --config
//! FILE`): a TOML file of its own, since the controller has no VG, pool or
//! state directory.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::LogFormat;
use crate::naming;

/// The name the nodes' server certificates carry (a SAN) unless
/// `node_server_name` says another: one name for every node, since the
/// nodes' CA signs node plugins only (docs/cluster.md, "The channel").
pub const DEFAULT_NODE_SERVER_NAME: &str = "thinpool-csi-node";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// The CSI driver name, the same as the node plugins'.
    pub driver_name: String,
    /// The socket the central sidecars call (`CSI_ENDPOINT` wins).
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The CSI-Addons socket the central csi-addons sidecar calls; empty:
    /// none (`CSI_ADDONS_ENDPOINT` wins).
    #[serde(default)]
    pub csi_addons_endpoint: String,
    #[serde(default)]
    pub log_format: LogFormat,
    /// Whether ControllerExpandVolume is advertised: the node plugins'
    /// `controller_expansion` must say the same.
    #[serde(default = "yes")]
    pub controller_expansion: bool,
    /// Whether SnapshotMetadata is advertised: set false when the node
    /// plugins cannot serve it (no thin-provisioning-tools).
    #[serde(default = "yes")]
    pub snapshot_metadata: bool,
    /// The controller's client certificate (PEM), signed by the CA the
    /// nodes take clients of (their `cluster.client_ca`), and its key.
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// The CA (PEM) that signed the nodes' server certificates.
    pub nodes_ca: PathBuf,
    #[serde(default = "default_server_name")]
    pub node_server_name: String,
    /// Seconds to wait for a node's connection before its call is
    /// UNAVAILABLE.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// The node plugins, when they are listed here rather than found in
    /// the cluster.
    #[serde(default)]
    pub nodes: Vec<StaticNode>,
    /// Where the node plugins are found in the cluster; with `nodes`, one
    /// or the other.
    #[serde(default)]
    pub discovery: Option<super::discovery::Discovery>,
}

/// A node plugin: its node id and the `IP:port` of its channel.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StaticNode {
    pub id: String,
    pub address: String,
}

fn default_endpoint() -> String {
    "unix:///csi/csi.sock".into()
}
fn default_server_name() -> String {
    DEFAULT_NODE_SERVER_NAME.into()
}
fn default_connect_timeout() -> u64 {
    5
}
fn yes() -> bool {
    true
}

impl ControllerConfig {
    pub fn parse(text: &str) -> Result<ControllerConfig, String> {
        let cfg: ControllerConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<ControllerConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        ControllerConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn validate(&self) -> Result<(), String> {
        naming::validate_driver_name(&self.driver_name).map_err(|e| format!("driver_name: {e}"))?;
        for (key, path) in [
            ("tls_cert", &self.tls_cert),
            ("tls_key", &self.tls_key),
            ("nodes_ca", &self.nodes_ca),
        ] {
            if !path.is_absolute() {
                return Err(format!(
                    "{key}: must be an absolute path: the controller reaches nodes only with mutual TLS"
                ));
            }
        }
        if self.connect_timeout_secs == 0 {
            return Err("connect_timeout_secs: must be at least 1".into());
        }
        if let Some(d) = &self.discovery {
            if !self.nodes.is_empty() {
                return Err("nodes and discovery: give one or the other".into());
            }
            if d.label_selector.trim().is_empty() {
                return Err("discovery.label_selector: must pick the node plugin pods".into());
            }
            if d.port == 0 || d.interval_secs == 0 {
                return Err(
                    "discovery.port and discovery.interval_secs: must be at least 1".into(),
                );
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            naming::validate_node_id(&n.id).map_err(|e| format!("nodes: {e}"))?;
            if !seen.insert(&n.id) {
                return Err(format!("nodes: node {:?} is listed twice", n.id));
            }
            n.address
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("nodes: node {:?}: address {:?}: {e}", n.id, n.address))?;
        }
        Ok(())
    }

    /// The topology key of the node plugins.
    pub fn topology_key(&self) -> String {
        crate::config::topology_key(&self.driver_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
driver_name = "thinpool.csi.example.org"
tls_cert = "/tls/tls.crt"
tls_key = "/tls/tls.key"
nodes_ca = "/tls/nodes-ca.crt"
[[nodes]]
id = "worker-1"
address = "10.0.0.1:9443"
"#;

    #[test]
    fn a_controller_config_reads_and_refuses_what_it_cannot_use() {
        let c = ControllerConfig::parse(GOOD).unwrap();
        assert_eq!(c.node_server_name, DEFAULT_NODE_SERVER_NAME);
        assert!(c.controller_expansion);
        assert_eq!(c.topology_key(), "topology.thinpool.csi.example.org/node");
        for (bad, named) in [
            (GOOD.replace("/tls/tls.key", "tls.key"), "tls_key"),
            (GOOD.replace("10.0.0.1:9443", "worker-1"), "address"),
            (GOOD.replace("\"worker-1\"", "\"a b\""), "node id"),
            (format!("{GOOD}\nvolume_group = \"vg\""), "volume_group"),
            (
                GOOD.replace("thinpool.csi.example.org", "Bad_Name"),
                "driver_name",
            ),
        ] {
            let e = ControllerConfig::parse(&bad).unwrap_err();
            assert!(e.contains(named), "{named}: {e}");
        }
    }
}
