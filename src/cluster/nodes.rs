//! The node plugins the controller knows: by node key, each with one
//! lazily connected channel (mutual TLS), rebuilt when its address
//! changes.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Status;

use super::config::ControllerConfig;
use crate::naming;

/// A node's channel: every call on it names the node it is meant for
/// (`channel::NODE_HEADER`), which the node checks, and every answer's
/// change counter is kept (`channel::Seen`).
pub type NodeChannel = crate::channel::Seen<InterceptedService<Channel, crate::channel::MeantFor>>;

/// One node plugin.
pub struct Node {
    pub id: String,
    pub key: String,
    pub address: String,
    pub channel: NodeChannel,
    /// The highest change counter an answer of this node carried
    /// (`channel::GENERATION_HEADER`).
    pub seen: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("key", &self.key)
            .field("address", &self.address)
            .finish()
    }
}

impl Node {
    /// UNAVAILABLE for a call this node could not be reached for: every
    /// sidecar retries it. A node's own answer passes unchanged; only a
    /// failure of the transport (its source is tonic's transport error:
    /// connect, TLS, a broken connection) is said again with the node
    /// named.
    pub fn failed(&self, s: Status) -> Status {
        if unreached(&s) {
            return Status::unavailable(format!(
                "node {:?} ({}) cannot be reached: {}",
                self.id,
                self.address,
                s.message()
            ));
        }
        s
    }
}

/// Whether a call failed in the transport (connect, TLS, a broken
/// connection: tonic's transport error is the status's source), not by
/// the node's answer.
pub fn unreached(s: &Status) -> bool {
    std::error::Error::source(s)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// Whether `s` is a passing failure, which a retry of the same call may
/// get past: a node not reached, away, busy or slow, or the call cut.
pub fn passing(s: &Status) -> bool {
    use tonic::Code;
    unreached(s)
        || matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Cancelled
                | Code::Unknown
        )
}

/// The nodes, and what connecting to one takes.
pub struct Nodes {
    tls: ClientTlsConfig,
    connect_timeout: Duration,
    by_key: RwLock<BTreeMap<String, Arc<Node>>>,
    /// Node ids left out for sharing a key: they may hold anything.
    refused: RwLock<Vec<String>>,
    /// Nodes listed before and not now (by key: node id), until their Node
    /// is known to be gone ([`Nodes::forget`]): a pod being replaced, or a
    /// node drained, still holds its volumes, and a lookup or a listing
    /// without it must not pass for whole.
    missing: RwLock<BTreeMap<String, String>>,
}

impl Nodes {
    /// Reads the TLS files; one that cannot be read is named.
    pub fn new(cfg: &ControllerConfig) -> Result<Nodes, String> {
        let tls = crate::channel::client_tls(
            &cfg.nodes_ca,
            &cfg.tls_cert,
            &cfg.tls_key,
            &cfg.node_server_name,
        )?;
        let nodes = Nodes {
            tls,
            connect_timeout: Duration::from_secs(cfg.connect_timeout_secs),
            by_key: RwLock::default(),
            refused: RwLock::default(),
            missing: RwLock::default(),
        };
        nodes.set(cfg.nodes.iter().map(|n| (n.id.clone(), n.address.clone())))?;
        Ok(nodes)
    }

    /// Replaces the node list with `(node id, IP:port)` pairs. Two node ids
    /// with one key would send one node's calls to the other, which would
    /// answer NOT_FOUND for volumes that exist: both are left out (their
    /// calls are UNAVAILABLE) and the collision is logged.
    pub fn set(&self, nodes: impl IntoIterator<Item = (String, String)>) -> Result<(), String> {
        let mut next: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for (id, address) in nodes {
            next.entry(naming::node_key(&id))
                .or_default()
                .push((id, address));
        }
        let mut by_key = self.by_key.write().unwrap();
        let mut kept = BTreeMap::new();
        let mut refused = Vec::new();
        for (key, mut same) in next {
            same.sort();
            same.dedup();
            if same.len() > 1 {
                tracing::error!(key, nodes = ?same, "node ids share a node key (or one id two addresses): their calls are refused until one is renamed");
                refused.extend(same.into_iter().map(|(id, _)| id));
                continue;
            }
            let (id, address) = same.pop().expect("one node");
            let node = match by_key.get(&key) {
                Some(n) if n.id == id && n.address == address => n.clone(),
                _ => Arc::new(self.node(id, key.clone(), address)?),
            };
            kept.insert(key, node);
        }
        let (before, after) = (by_key.len(), kept.len());
        let mut missing = self.missing.write().unwrap();
        for (key, node) in by_key.iter() {
            if !kept.contains_key(key) {
                tracing::warn!(node = node.id, "a node plugin is no longer listed: its objects cannot be looked up until it is back or its Node is gone");
                missing.insert(key.clone(), node.id.clone());
            }
        }
        missing.retain(|key, _| !kept.contains_key(key));
        *by_key = kept;
        *self.refused.write().unwrap() = refused;
        tracing::info!(before, after, missing = missing.len(), "node list set");
        Ok(())
    }

    /// Node ids listed before and not now (see `missing`).
    pub fn missing(&self) -> Vec<String> {
        self.missing.read().unwrap().values().cloned().collect()
    }

    /// Whether node key `key` names a node listed before and not now.
    pub fn is_missing(&self, key: &str) -> bool {
        self.missing.read().unwrap().contains_key(key)
    }

    /// Forgets node `id` that was listed before: its Node is gone from the
    /// cluster, and its objects with it.
    pub fn forget(&self, id: &str) {
        let key = naming::node_key(id);
        if self.missing.write().unwrap().remove(&key).is_some() {
            tracing::warn!(
                node = id,
                "the Node of a missing node plugin is gone: its objects are forgotten"
            );
        }
    }

    fn node(&self, id: String, key: String, address: String) -> Result<Node, String> {
        let channel = Endpoint::from_shared(format!("https://{address}"))
            .and_then(|e| e.tls_config(self.tls.clone()))
            .map_err(|e| format!("node {id:?} at {address:?}: {e}"))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .connect_lazy();
        let meant = id
            .parse()
            .map_err(|e| format!("node id {id:?} cannot be a header value: {e}"))?;
        let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        Ok(Node {
            channel: crate::channel::seen(
                InterceptedService::new(channel, crate::channel::MeantFor(meant)),
                seen.clone(),
            ),
            seen,
            id,
            key,
            address,
        })
    }

    /// The node of node key `key`.
    pub fn by_key(&self, key: &str) -> Option<Arc<Node>> {
        self.by_key.read().unwrap().get(key).cloned()
    }

    /// The node of node id `id`.
    pub fn by_id(&self, id: &str) -> Option<Arc<Node>> {
        self.by_key(&naming::node_key(id)).filter(|n| n.id == id)
    }

    /// The node ids left out for sharing a key: a lookup or a listing
    /// cannot say what they hold.
    pub fn refused(&self) -> Vec<String> {
        self.refused.read().unwrap().clone()
    }

    /// Every node, in node key order (the order of keyed ids).
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.by_key.read().unwrap().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passing_failure_is_one_a_retry_may_get_past() {
        use tonic::Code;
        for c in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::ResourceExhausted,
        ] {
            assert!(passing(&Status::new(c, "x")), "{c:?}");
        }
        for c in [
            Code::InvalidArgument,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::DataLoss,
            Code::NotFound,
        ] {
            assert!(!passing(&Status::new(c, "x")), "{c:?}");
        }
    }
}
