//! CSI-Addons commands: reclaim (ReclaimSpace, controller or node side)
//! and heal (NodeHealer).

use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
use thinpool_csi::proto::healer::NodeHealerRequest;
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::{ControllerReclaimSpaceRequest, NodeReclaimSpaceRequest};

use crate::args;
use crate::capability::given_capability;
use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::{HealOut, ReclaimOut};

pub async fn reclaim(c: &mut Ctx, a: args::ReclaimArgs) -> Result<()> {
    let ch = c.addons().await?;
    let label = format!("reclaiming space of {}", a.volume_id);
    let (side, pre, post) = if a.node {
        let req = NodeReclaimSpaceRequest {
            volume_id: a.volume_id.clone(),
            volume_path: a.path.unwrap_or_default(),
            staging_target_path: a.staging.unwrap_or_default(),
            ..Default::default()
        };
        let mut n = ReclaimSpaceNodeClient::new(ch);
        let r = c
            .progress
            .run(&label, n.node_reclaim_space(req))
            .await?
            .into_inner();
        ("node", r.pre_usage, r.post_usage)
    } else {
        let req = ControllerReclaimSpaceRequest {
            volume_id: a.volume_id.clone(),
            ..Default::default()
        };
        let mut n = ReclaimSpaceControllerClient::new(ch);
        let r = c
            .progress
            .run(&label, n.controller_reclaim_space(req))
            .await?
            .into_inner();
        ("controller", r.pre_usage, r.post_usage)
    };
    c.show(&ReclaimOut::new(
        &a.volume_id,
        side,
        pre.map(|u| u.usage_bytes),
        post.map(|u| u.usage_bytes),
    ));
    Ok(())
}

pub async fn heal(c: &mut Ctx, a: args::HealArgs) -> Result<()> {
    let req = NodeHealerRequest {
        volume_id: a.volume_id.clone(),
        volume_path: a.path,
        staging_target_path: a.staging.unwrap_or_default(),
        volume_capability: given_capability(&a.access),
        ..Default::default()
    };
    let mut healer = HealerNodeClient::new(c.addons().await?);
    let r = c
        .progress
        .run(&format!("healing {}", a.volume_id), healer.node_healer(req))
        .await?
        .into_inner();
    c.show(&HealOut {
        volume_id: a.volume_id,
        abnormal: r.abnormal,
        message: r.message,
    });
    Ok(())
}
