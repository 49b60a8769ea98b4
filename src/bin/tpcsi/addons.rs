//! CSI-Addons commands: reclaim (ReclaimSpace, controller or node side),
//! heal (NodeHealer) and rotate-key (EncryptionKeyRotate).

use thinpool_csi::proto::encryptionkeyrotation::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient;
use thinpool_csi::proto::encryptionkeyrotation::EncryptionKeyRotateRequest;
use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
use thinpool_csi::proto::healer::NodeHealerRequest;
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::{ControllerReclaimSpaceRequest, NodeReclaimSpaceRequest};

use crate::args;
use crate::capability::given_capability;
use crate::connect::Ctx;
use crate::failure::{Failure, Result};
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

/// A passphrase from `file` ("-": standard input): its bytes exactly, as
/// `kubectl create secret --from-file` and cryptsetup's `--key-file` take
/// them (write it with `printf`, not `echo`, which adds a newline).
pub fn passphrase(file: &str) -> Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = match file {
        "-" => std::io::stdin().read_to_end(&mut bytes).map(|_| ()),
        f => std::fs::read(f).map(|b| bytes = b),
    };
    read.map_err(|e| Failure::Local(format!("cannot read the passphrase from {file}: {e}")))?;
    String::from_utf8(bytes)
        .map_err(|_| Failure::Local(format!("the passphrase in {file} is not UTF-8")))
}

pub async fn rotate_key(c: &mut Ctx, a: args::RotateKeyArgs) -> Result<()> {
    if a.passphrase_file == "-" && a.new_passphrase_file == "-" {
        return Err(Failure::Local(
            "only one of --passphrase-file and --new-passphrase-file can be standard input".into(),
        ));
    }
    let req = EncryptionKeyRotateRequest {
        volume_id: a.volume_id.clone(),
        encryption_key: passphrase(&a.new_passphrase_file)?,
        secrets: [("passphrase".to_string(), passphrase(&a.passphrase_file)?)].into(),
        ..Default::default()
    };
    let mut r = EncryptionKeyRotationControllerClient::new(c.addons().await?);
    c.done(
        &format!("rotating the key of {}", a.volume_id),
        r.encryption_key_rotate(req),
        crate::output::Done::new("rotated the key of", &[("volume_id", &a.volume_id)]),
    )
    .await
}
