//! `tpcsi` pointed at the cluster's controller (`thinpool-csi
//! controller`): its GetPluginInfo manifest says `mode = controller` and
//! names the node plugins it knows (`nodes`, and `missing_nodes` while a
//! node's pod is gone). Ids minted on a cluster carry their node's key
//! (`naming::node_key`), so a listing names the node of each entry without
//! another call; capacity is asked per node, through the controller, with
//! that node's topology, as the provisioner asks it.

use std::collections::BTreeMap;

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::csi::v1::identity_client::IdentityClient;

use crate::connect::Ctx;
use crate::failure::Result;

/// The node plugins behind a cluster's controller.
pub struct Nodes {
    /// The driver's name (for the topology key).
    pub driver: String,
    /// Every node id the controller names (listed or missing), by its key.
    pub by_key: BTreeMap<String, String>,
    /// The node ids the controller names as missing (their pods gone).
    pub missing: Vec<String>,
}

impl Nodes {
    /// The node of an id: its node's id, `?<key>` for a key of a node the
    /// controller does not name, `-` for an id minted before the cluster
    /// (no key: `tpcsi get` asks the controller, which finds it).
    pub fn node_of(&self, id: &str) -> String {
        match naming::split_node(id).0 {
            Some(key) => self
                .by_key
                .get(key)
                .cloned()
                .unwrap_or_else(|| format!("?{key}")),
            None => "-".to_string(),
        }
    }

    /// Every node id, in order.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.by_key.values().cloned().collect();
        ids.sort();
        ids
    }
}

/// The endpoint's GetPluginInfo answer.
pub async fn plugin_info(c: &mut Ctx) -> Result<csi::GetPluginInfoResponse> {
    Ok(IdentityClient::new(c.csi().await?)
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await?
        .into_inner())
}

/// The controller's nodes, or `None` when `info` is a node plugin's.
pub fn nodes(info: &csi::GetPluginInfoResponse) -> Option<Nodes> {
    if info.manifest.get("mode").map(String::as_str) != Some("controller") {
        return None;
    }
    let by_key = ["nodes", "missing_nodes"]
        .iter()
        .filter_map(|k| info.manifest.get(*k))
        .flat_map(|v| v.split(','))
        .filter(|id| !id.is_empty())
        .map(|id| (naming::node_key(id), id.to_string()))
        .collect();
    let missing = info
        .manifest
        .get("missing_nodes")
        .map(|v| {
            v.split(',')
                .filter(|id| !id.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    Some(Nodes {
        driver: info.name.clone(),
        by_key,
        missing,
    })
}

/// `capacity` through the controller: GetCapacity of `req` for each node,
/// with that node's topology (what the provisioner's capacity tracking
/// asks). A node the controller cannot reach answers 0; one it names as
/// missing is marked so.
pub async fn capacity(
    c: &mut Ctx,
    nodes: &Nodes,
    req: csi::GetCapacityRequest,
) -> Result<crate::output::NodeCapacities> {
    let key = thinpool_csi::config::topology_key(&nodes.driver);
    let class = req
        .parameters
        .get("deviceClass")
        .cloned()
        .unwrap_or_else(|| "(the node's default)".to_string());
    let mut out = Vec::new();
    for node in nodes.ids() {
        let mut one = req.clone();
        one.accessible_topology = Some(csi::Topology {
            segments: [(key.clone(), node.clone())].into(),
        });
        let answer = c.controller().await?.get_capacity(one).await;
        out.push(crate::output::NodeCapacity {
            missing: nodes.missing.contains(&node),
            node,
            device_class: class.clone(),
            available_capacity: answer
                .as_ref()
                .ok()
                .map(|r| r.get_ref().available_capacity.max(0) as u64),
            maximum_volume_size: answer
                .as_ref()
                .ok()
                .and_then(|r| r.get_ref().maximum_volume_size)
                .map(|b| b.max(0) as u64),
            error: answer
                .err()
                .map(|s| format!("{:?}: {}", s.code(), s.message())),
        });
    }
    Ok(crate::output::NodeCapacities { nodes: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_of_an_id_comes_from_its_key() {
        let nodes = Nodes {
            driver: "d".into(),
            by_key: [("worker-1", "worker-1"), ("worker-2", "worker-2")]
                .map(|(k, v)| (naming::node_key(k), v.to_string()))
                .into(),
            missing: vec![],
        };
        let id = naming::with_node(&naming::node_key("worker-2"), "csi-x");
        assert_eq!(nodes.node_of(&id), "worker-2");
        let other = naming::with_node(&naming::node_key("worker-9"), "csi-x");
        assert_eq!(
            nodes.node_of(&other),
            format!("?{}", naming::node_key("worker-9"))
        );
        assert_eq!(nodes.node_of("csi-x"), "-");
        assert_eq!(nodes.ids(), ["worker-1", "worker-2"]);
    }
}
