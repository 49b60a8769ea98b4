//! Volume commands on the controller: create, list, get, expand, delete.

use std::collections::HashMap;

use thinpool_csi::proto::csi::v1 as csi;
use tonic::Status;

use crate::args;
use crate::capability::capability;
use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::{Done, ExpandOut, VolumeList, VolumeOut};
use crate::pages::all_pages;

fn capacity_range(size: Option<u64>, limit: Option<u64>) -> Option<csi::CapacityRange> {
    (size.is_some() || limit.is_some()).then(|| csi::CapacityRange {
        required_bytes: size.unwrap_or(0) as i64,
        limit_bytes: limit.unwrap_or(0) as i64,
    })
}

pub async fn create(c: &mut Ctx, a: args::CreateArgs) -> Result<()> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let source = match (a.from_snapshot, a.from_volume) {
        (Some(snapshot_id), _) => Some(Type::Snapshot(SnapshotSource { snapshot_id })),
        (None, Some(volume_id)) => Some(Type::Volume(VolumeSource { volume_id })),
        (None, None) => None,
    };
    // A node named: its topology alone, as the provisioner's strict
    // topology sends the pod's node.
    let accessibility_requirements = match &a.on_node {
        Some(node) => {
            let driver = crate::cluster::plugin_info(c).await?.name;
            let t = csi::Topology {
                segments: [(thinpool_csi::config::topology_key(&driver), node.clone())].into(),
            };
            Some(csi::TopologyRequirement {
                requisite: vec![t.clone()],
                preferred: vec![t],
            })
        }
        None => None,
    };
    let req = csi::CreateVolumeRequest {
        name: a.name.clone(),
        accessibility_requirements,
        capacity_range: capacity_range(a.size, a.limit),
        volume_capabilities: vec![capability(&a.access, &[])],
        parameters: a.params.into_iter().collect(),
        volume_content_source: source.map(|t| csi::VolumeContentSource { r#type: Some(t) }),
        mutable_parameters: a.mutable.into_iter().collect(),
        ..Default::default()
    };
    let mut ctl = c.controller().await?;
    let r = c
        .progress
        .run(&format!("creating {}", a.name), ctl.create_volume(req))
        .await?
        .into_inner();
    let v = r
        .volume
        .ok_or_else(|| Status::internal("CreateVolume answered no volume"))?;
    c.show(&VolumeOut::new(&v, None));
    Ok(())
}

/// Every volume, or those of device class `class` (ListVolumes takes
/// no class: the id says it).
pub async fn list_volumes(c: &mut Ctx, class: Option<String>) -> Result<()> {
    let nodes = crate::capacity::before_listing(c, class.as_deref()).await?;
    let ctl = c.controller().await?;
    let volumes = all_pages(|starting_token| {
        let mut ctl = ctl.clone();
        async move {
            let r = ctl
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token,
                })
                .await?
                .into_inner();
            let page = r
                .entries
                .iter()
                .filter_map(|e| {
                    let cond = e.status.as_ref().and_then(|s| s.volume_condition.as_ref());
                    e.volume.as_ref().map(|v| VolumeOut::new(v, cond))
                })
                .collect();
            Ok((page, r.next_token))
        }
    })
    .await?;
    c.show(&VolumeList::new(volumes, class, nodes.as_ref()));
    Ok(())
}

pub async fn get(c: &mut Ctx, volume_id: String) -> Result<()> {
    let (v, cond) = get_volume(c, &volume_id).await?;
    c.show(&VolumeOut::new(&v, cond.as_ref()));
    Ok(())
}

pub async fn get_volume(
    c: &mut Ctx,
    id: &str,
) -> Result<(csi::Volume, Option<csi::VolumeCondition>)> {
    let r = c
        .controller()
        .await?
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.to_string(),
        })
        .await?
        .into_inner();
    let v = r
        .volume
        .ok_or_else(|| Status::internal(format!("ControllerGetVolume of {id}: no volume")))?;
    Ok((v, r.status.and_then(|s| s.volume_condition)))
}

pub async fn expand(c: &mut Ctx, a: args::ExpandArgs) -> Result<()> {
    let range = capacity_range(Some(a.size), a.limit);
    let req = csi::ControllerExpandVolumeRequest {
        volume_id: a.volume_id.clone(),
        capacity_range: range,
        ..Default::default()
    };
    let mut ctl = c.controller().await?;
    let r = c
        .progress
        .run(
            &format!("expanding {}", a.volume_id),
            ctl.controller_expand_volume(req),
        )
        .await?
        .into_inner();
    let mut out = ExpandOut {
        volume_id: a.volume_id.clone(),
        capacity_bytes: r.capacity_bytes.max(0) as u64,
        node_expansion_required: r.node_expansion_required,
        node_capacity_bytes: None,
    };
    if let (Some(path), true) = (a.path, r.node_expansion_required) {
        let req = csi::NodeExpandVolumeRequest {
            volume_id: a.volume_id.clone(),
            volume_path: path,
            capacity_range: range,
            staging_target_path: a.staging.unwrap_or_default(),
            ..Default::default()
        };
        let mut node = c.node().await?;
        let n = c
            .progress
            .run(
                &format!("growing the filesystem of {}", a.volume_id),
                node.node_expand_volume(req),
            )
            .await?
            .into_inner();
        out.node_capacity_bytes = Some(n.capacity_bytes.max(0) as u64);
    }
    c.show(&out);
    Ok(())
}

pub async fn delete(c: &mut Ctx, volume_id: String) -> Result<()> {
    let req = csi::DeleteVolumeRequest {
        volume_id: volume_id.clone(),
        secrets: HashMap::new(),
    };
    let mut ctl = c.controller().await?;
    c.done(
        &format!("deleting {volume_id}"),
        ctl.delete_volume(req),
        Done::new("deleted", &[("volume_id", &volume_id)]),
    )
    .await
}
