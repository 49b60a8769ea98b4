//! Node commands: stage, unstage, publish, unpublish, stats, and the
//! capability to stage or publish with.

use thinpool_csi::proto::csi::v1 as csi;

use crate::args::{self, AccessArgs};
use crate::capability::capability;
use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::{Done, StatsOut};
use crate::volume::get_volume;

pub async fn stage(c: &mut Ctx, a: args::StageArgs) -> Result<()> {
    let cap = node_capability(c, &a.volume_id, &a.node).await?;
    let mut req = csi::NodeStageVolumeRequest {
        volume_id: a.volume_id.clone(),
        staging_target_path: a.staging_path.clone(),
        volume_capability: Some(cap),
        ..Default::default()
    };
    if let Some(file) = &a.passphrase_file {
        req.secrets
            .insert("passphrase".into(), crate::addons::passphrase(file)?);
    }
    let mut node = c.node().await?;
    c.done(
        &format!("staging {}", a.volume_id),
        node.node_stage_volume(req),
        Done::new(
            "staged",
            &[
                ("volume_id", &a.volume_id),
                ("staging_target_path", &a.staging_path),
            ],
        ),
    )
    .await
}

pub async fn unstage(c: &mut Ctx, volume_id: String, staging_path: String) -> Result<()> {
    let req = csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.clone(),
        staging_target_path: staging_path.clone(),
    };
    let mut node = c.node().await?;
    c.done(
        &format!("unstaging {volume_id}"),
        node.node_unstage_volume(req),
        Done::new(
            "unstaged",
            &[
                ("volume_id", &volume_id),
                ("staging_target_path", &staging_path),
            ],
        ),
    )
    .await
}

pub async fn publish(c: &mut Ctx, a: args::PublishArgs) -> Result<()> {
    let cap = node_capability(c, &a.volume_id, &a.node).await?;
    let req = csi::NodePublishVolumeRequest {
        volume_id: a.volume_id.clone(),
        staging_target_path: a.staging.clone(),
        target_path: a.target_path.clone(),
        volume_capability: Some(cap),
        readonly: a.readonly,
        ..Default::default()
    };
    let mut node = c.node().await?;
    c.done(
        &format!("publishing {}", a.volume_id),
        node.node_publish_volume(req),
        Done::new(
            "published",
            &[("volume_id", &a.volume_id), ("target_path", &a.target_path)],
        ),
    )
    .await
}

pub async fn unpublish(c: &mut Ctx, volume_id: String, target_path: String) -> Result<()> {
    let req = csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.clone(),
        target_path: target_path.clone(),
    };
    let mut node = c.node().await?;
    c.done(
        &format!("unpublishing {volume_id}"),
        node.node_unpublish_volume(req),
        Done::new(
            "unpublished",
            &[("volume_id", &volume_id), ("target_path", &target_path)],
        ),
    )
    .await
}

pub async fn stats(
    c: &mut Ctx,
    volume_id: String,
    volume_path: String,
    staging: Option<String>,
) -> Result<()> {
    let req = csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.clone(),
        volume_path: volume_path.clone(),
        staging_target_path: staging.unwrap_or_default(),
    };
    let r = c
        .node()
        .await?
        .node_get_volume_stats(req)
        .await?
        .into_inner();
    c.show(&StatsOut::new(&volume_id, &volume_path, &r));
    Ok(())
}

/// The capability to stage or publish with: as given, or else the
/// volume's own (its context's `fsType`; none means block).
async fn node_capability(
    c: &mut Ctx,
    id: &str,
    a: &args::NodeAccessArgs,
) -> Result<csi::VolumeCapability> {
    if a.access.fs.is_some() || a.access.block {
        return Ok(capability(&a.access, &a.mount_flags));
    }
    let (v, _) = get_volume(c, id).await?;
    let access = access_of(&v, &a.access);
    Ok(capability(&access, &a.mount_flags))
}

/// `--fs`/`--block` as the volume's context says.
pub(crate) fn access_of(v: &csi::Volume, given: &AccessArgs) -> AccessArgs {
    let fs = v.volume_context.get("fsType").cloned();
    AccessArgs {
        block: fs.is_none(),
        fs,
        mode: given.mode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_follows_the_volume_context() {
        let mut v = csi::Volume::default();
        let a = access_of(&v, &AccessArgs::default());
        assert!(a.block && a.fs.is_none());
        v.volume_context.insert("fsType".into(), "xfs".into());
        let a = access_of(&v, &AccessArgs::default());
        assert!(!a.block);
        assert_eq!(a.fs.as_deref(), Some("xfs"));
    }
}
