//! `info`: the plugin's identity and the capabilities of every service,
//! CSI-Addons' too.

use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::identity as addons;

use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::{AddonsInfo, InfoOut, NodeInfoOut};
use csi::identity_client::IdentityClient;

/// An enum value's name as the proto spells it, `#n` for one this client
/// does not know.
fn name_of<T: TryFrom<i32>>(value: i32, name: fn(&T) -> &str) -> String {
    T::try_from(value)
        .map(|t| name(&t).to_string())
        .unwrap_or_else(|_| format!("#{value}"))
}

pub async fn info(c: &mut Ctx) -> Result<()> {
    use csi::controller_service_capability::{rpc, Type as CtlType};
    use csi::plugin_capability::{service, volume_expansion, Type as PlugType};
    let mut id = IdentityClient::new(c.csi().await?);
    let plugin = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await?
        .into_inner();
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await?
        .into_inner();
    let plugin_capabilities = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|cap| match cap {
            PlugType::Service(s) => name_of(s.r#type, service::Type::as_str_name),
            PlugType::VolumeExpansion(e) => format!(
                "VOLUME_EXPANSION_{}",
                name_of(e.r#type, volume_expansion::Type::as_str_name)
            ),
        })
        .collect();
    let ctl = c
        .controller()
        .await?
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await?
        .into_inner();
    let controller_capabilities = ctl
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|CtlType::Rpc(r)| name_of(r.r#type, rpc::Type::as_str_name))
        .collect();
    // The cluster's controller serves no Node service.
    let node = match plugin.manifest.get("mode").map(String::as_str) {
        Some("controller") => None,
        _ => Some(node_info(c).await?),
    };
    let addons = match c.ends.addons {
        Some(_) => Some(addons_info(c).await?),
        None => None,
    };
    c.show(&InfoOut {
        name: plugin.name,
        vendor_version: plugin.vendor_version,
        manifest: plugin.manifest.into_iter().collect(),
        plugin_capabilities,
        controller_capabilities,
        node,
        addons,
    });
    Ok(())
}

/// NodeGetInfo and NodeGetCapabilities.
async fn node_info(c: &mut Ctx) -> Result<NodeInfoOut> {
    use csi::node_service_capability::{rpc as node_rpc, Type as NodeType};
    let mut node = c.node().await?;
    let ninfo = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await?
        .into_inner();
    let ncaps = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await?
        .into_inner();
    let node_capabilities = ncaps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|NodeType::Rpc(r)| name_of(r.r#type, node_rpc::Type::as_str_name))
        .collect();
    Ok(NodeInfoOut {
        node_id: ninfo.node_id,
        max_volumes_per_node: ninfo.max_volumes_per_node,
        accessible_topology: ninfo
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default(),
        node_capabilities,
    })
}

async fn addons_info(c: &mut Ctx) -> Result<AddonsInfo> {
    use addons::capability::{reclaim_space, service, Type};
    let mut id = addons::identity_client::IdentityClient::new(c.addons().await?);
    let ident = id
        .get_identity(addons::GetIdentityRequest {})
        .await?
        .into_inner();
    let caps = id
        .get_capabilities(addons::GetCapabilitiesRequest {})
        .await?
        .into_inner();
    let capabilities = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|cap| match cap {
            Type::Service(s) => name_of(s.r#type, service::Type::as_str_name),
            Type::ReclaimSpace(r) => format!(
                "RECLAIM_SPACE_{}",
                name_of(r.r#type, reclaim_space::Type::as_str_name)
            ),
            // Families this driver never advertises: by name only.
            Type::NetworkFence(_) => "NETWORK_FENCE".into(),
            Type::VolumeReplication(_) => "VOLUME_REPLICATION".into(),
            Type::VolumeGroup(_) => "VOLUME_GROUP".into(),
            Type::EncryptionKeyRotation(_) => "ENCRYPTION_KEY_ROTATION".into(),
        })
        .collect();
    Ok(AddonsInfo {
        name: ident.name,
        vendor_version: ident.vendor_version,
        capabilities,
    })
}
