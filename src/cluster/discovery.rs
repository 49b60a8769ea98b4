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

use k8s_openapi::api::core::v1::{Node, Pod};
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
/// runs, has an IP and a node, and is not being deleted. Of two such pods
/// on one node (a rollout), the ready one, then the newer one.
pub fn node_plugins(pods: &[Pod], port: u16) -> Vec<(String, String)> {
    let mut found: Vec<(String, bool, String, String)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let status = p.status.as_ref()?;
            if status.phase.as_deref() != Some("Running") {
                return None;
            }
            let ip: std::net::IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            // RFC 3339 in UTC: text order is time order.
            let created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            let address = std::net::SocketAddr::new(ip, port).to_string();
            Some((node, ready, created, address))
        })
        .collect();
    // Per node, the ready one first, then the newest.
    found.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
    found.dedup_by(|a, b| a.0 == b.0);
    found
        .into_iter()
        .map(|(node, _, _, address)| (node, address))
        .collect()
}

/// The bound on one request to the API server: a hung one must not hold
/// the controller's start or its list loop.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists the node plugin pods into `nodes`.
pub struct Finder {
    pods: Api<Pod>,
    /// The cluster's Nodes: a node plugin no longer listed is forgotten
    /// only once its Node is gone.
    cluster_nodes: Api<Node>,
    cfg: Discovery,
    /// When the last list started; held through a list, so calls that
    /// miss at once wait for one list rather than each start their own.
    last: Mutex<Option<Instant>>,
}

impl Finder {
    pub fn new(client: kube::Client, cfg: Discovery, namespace: &str) -> Finder {
        Finder {
            pods: Api::namespaced(client.clone(), namespace),
            cluster_nodes: Api::all(client),
            cfg,
            last: Mutex::new(None),
        }
    }

    /// One list into `nodes`. A failed list keeps the nodes as they were:
    /// an API server that is away stops no call to a node already known.
    pub async fn refresh(&self, nodes: &Nodes) -> Result<usize, String> {
        let mut last = self.last.lock().await;
        self.refresh_locked(nodes, &mut last).await
    }

    async fn refresh_locked(
        &self,
        nodes: &Nodes,
        last: &mut Option<Instant>,
    ) -> Result<usize, String> {
        *last = Some(Instant::now());
        let what = format!("listing the node plugin pods ({})", self.cfg.label_selector);
        let params = ListParams::default().labels(&self.cfg.label_selector);
        let list = tokio::time::timeout(API_TIMEOUT, self.pods.list(&params))
            .await
            .map_err(|_| format!("{what}: no answer within {API_TIMEOUT:?}"))?
            .map_err(|e| format!("{what}: {e}"))?;
        let found = node_plugins(&list.items, self.cfg.port);
        let n = found.len();
        nodes.set(found)?;
        // A node plugin no longer listed is forgotten once its Node is
        // gone (its disks with it); while the Node exists, or cannot be
        // read, it may come back with its volumes.
        for id in nodes.missing() {
            match tokio::time::timeout(API_TIMEOUT, self.cluster_nodes.get_opt(&id)).await {
                Ok(Ok(None)) => nodes.forget(&id),
                Ok(Ok(Some(_))) => {}
                Ok(Err(e)) => {
                    tracing::warn!(node = id, error = %e, "cannot read the Node of a node plugin no longer listed")
                }
                Err(_) => {
                    tracing::warn!(
                        node = id,
                        "no answer for the Node of a node plugin no longer listed"
                    )
                }
            }
        }
        Ok(n)
    }

    /// A refresh for a call that named an unknown node key, unless one
    /// started within [`MISS_REFRESH_MIN`] (calls that miss meanwhile wait
    /// for the one running, and take its list).
    pub async fn refresh_for_miss(&self, nodes: &Nodes) {
        let mut last = self.last.lock().await;
        if last.is_some_and(|t| t.elapsed() < MISS_REFRESH_MIN) {
            return;
        }
        if let Err(e) = self.refresh_locked(nodes, &mut last).await {
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
        pod_at(node, ip, phase, deleting, true, "2026-11-28T00:00:00Z")
    }

    fn pod_at(
        node: &str,
        ip: Option<&str>,
        phase: &str,
        deleting: bool,
        ready: bool,
        created: &str,
    ) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("thinpool-csi-node-{node}"),
                "creationTimestamp": created,
                "deletionTimestamp": deleting.then_some("2026-11-28T00:00:00Z"),
            },
            "spec": { "nodeName": node, "containers": [] },
            "status": {
                "phase": phase,
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn of_two_pods_on_a_node_the_ready_then_the_newest_is_taken() {
        let at = |ip: &str, ready: bool, created: &str| {
            pod_at("w", Some(ip), "Running", false, ready, created)
        };
        let old_ready = at("10.0.0.1", true, "2026-11-28T00:00:00Z");
        let new_ready = at("10.0.0.2", true, "2026-11-28T01:00:00Z");
        let new_unready = at("10.0.0.3", false, "2026-11-28T02:00:00Z");
        let picked = |pods: &[Pod]| node_plugins(pods, 1);
        let one = |a: &str| vec![("w".to_string(), format!("{a}:1"))];
        assert_eq!(
            picked(&[old_ready.clone(), new_ready.clone()]),
            one("10.0.0.2")
        );
        assert_eq!(
            picked(&[new_ready.clone(), old_ready.clone()]),
            one("10.0.0.2")
        );
        assert_eq!(
            picked(&[new_unready.clone(), old_ready.clone()]),
            one("10.0.0.1")
        );
        assert_eq!(
            picked(&[new_unready, old_ready, new_ready]),
            one("10.0.0.2")
        );
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
