//! The node plugins as the cluster shows them: the pods of the node
//! DaemonSet (a label selector in one namespace), listed through the
//! Kubernetes API with kube-rs. Each running pod with an IP is a node
//! plugin: its node id is `spec.nodeName` (the DaemonSet passes
//! `--node-id $(NODE_NAME)`), its channel `status.podIP:port`.
//!
//! The list is read at start, every `interval_secs`, and when a call
//! names a node key the controller does not know (a node that joined
//! since), at most once per [`MISS_REFRESH_MIN`]. Only the API server is
//! asked: the nodes get no call the sidecars did not make.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::nodes::Nodes;

/// The shortest time between two lists that a call for an unknown node
/// key starts: a storm of calls for a node that is gone asks once.
pub const MISS_REFRESH_MIN: Duration = Duration::from_secs(5);

/// Where the node plugins are found (`[discovery]` in the controller's
/// config).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    /// The namespace of the node plugin pods; empty: the controller's own
    /// (`POD_NAMESPACE`, else the service account's namespace file).
    #[serde(default)]
    pub namespace: String,
    /// A label selector that picks the node plugin pods and nothing else.
    pub label_selector: String,
    /// The port of each node plugin's `cluster.listen`.
    pub port: u16,
    #[serde(default = "default_interval")]
    pub interval_secs: u64,
}

fn default_interval() -> u64 {
    30
}

/// `(node id, IP:port)` of each node plugin pod that can take calls: it
/// runs, has an IP and a node. A pod being replaced beside its successor
/// (both on one node) gives the running one.
pub fn node_plugins(pods: &[Pod], port: u16) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let status = p.status.as_ref()?;
            if status.phase.as_deref() != Some("Running") {
                return None;
            }
            let ip: std::net::IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
            Some((node, std::net::SocketAddr::new(ip, port).to_string()))
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// Lists the node plugin pods into `nodes`.
pub struct Finder {
    api: Api<Pod>,
    cfg: Discovery,
    last: Mutex<Option<Instant>>,
}

impl Finder {
    pub fn new(client: kube::Client, cfg: Discovery, namespace: &str) -> Finder {
        Finder {
            api: Api::namespaced(client, namespace),
            cfg,
            last: Mutex::new(None),
        }
    }

    /// One list into `nodes`. A failed list keeps the nodes as they were:
    /// an API server that is away stops no call to a node already known.
    pub async fn refresh(&self, nodes: &Nodes) -> Result<usize, String> {
        *self.last.lock().await = Some(Instant::now());
        let list = self
            .api
            .list(&ListParams::default().labels(&self.cfg.label_selector))
            .await
            .map_err(|e| {
                format!(
                    "listing the node plugin pods ({}): {e}",
                    self.cfg.label_selector
                )
            })?;
        let found = node_plugins(&list.items, self.cfg.port);
        let n = found.len();
        nodes.set(found)?;
        Ok(n)
    }

    /// A refresh for a call that named an unknown node key, unless one ran
    /// within [`MISS_REFRESH_MIN`].
    pub async fn refresh_for_miss(&self, nodes: &Nodes) {
        {
            let last = self.last.lock().await;
            if last.is_some_and(|t| t.elapsed() < MISS_REFRESH_MIN) {
                return;
            }
        }
        if let Err(e) = self.refresh(nodes).await {
            tracing::warn!(error = %e, "cannot list the node plugins");
        }
    }

    /// Lists every `interval_secs`, for ever (the first list was read at
    /// start, by `Cluster::new`).
    pub async fn run(self: Arc<Self>, cluster: Arc<super::Cluster>) {
        let every = Duration::from_secs(self.cfg.interval_secs);
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = self.refresh(&cluster.nodes).await {
                tracing::warn!(error = %e, "cannot list the node plugins; the last list stays");
            }
        }
    }
}

/// The namespace the controller runs in: `POD_NAMESPACE`, else the
/// service account's namespace file.
pub fn own_namespace() -> Result<String, String> {
    if let Ok(ns) = std::env::var("POD_NAMESPACE") {
        if !ns.is_empty() {
            return Ok(ns);
        }
    }
    const FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
    std::fs::read_to_string(FILE)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("discovery.namespace is empty, POD_NAMESPACE unset and {FILE}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, ip: Option<&str>, phase: &str, deleting: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("thinpool-csi-node-{node}"),
                "deletionTimestamp": deleting.then_some("2026-11-28T00:00:00Z"),
            },
            "spec": { "nodeName": node, "containers": [] },
            "status": { "phase": phase, "podIP": ip },
        }))
        .unwrap()
    }

    #[test]
    fn only_running_pods_with_an_ip_are_node_plugins() {
        let pods = [
            pod("worker-2", Some("10.0.0.2"), "Running", false),
            pod("worker-1", Some("10.0.0.1"), "Running", false),
            pod("worker-3", None, "Pending", false),
            pod("worker-4", Some("10.0.0.4"), "Failed", false),
            pod("worker-5", Some("10.0.0.5"), "Running", true),
            pod("worker-6", Some("fd00::6"), "Running", false),
        ];
        assert_eq!(
            node_plugins(&pods, 9443),
            vec![
                ("worker-1".to_string(), "10.0.0.1:9443".to_string()),
                ("worker-2".to_string(), "10.0.0.2:9443".to_string()),
                ("worker-6".to_string(), "[fd00::6]:9443".to_string()),
            ]
        );
    }
}
