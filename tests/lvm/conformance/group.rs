//! GroupController: CreateVolumeGroupSnapshot, GetVolumeGroupSnapshot,
//! DeleteVolumeGroupSnapshot.

use std::collections::HashMap;

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::Code;

use super::{required, Rules, SIZE};
use crate::fixtures::{block_cap, create};
use crate::harness::{lvs, TestDriver, MIB};

fn group_req(name: &str, ids: &[String]) -> CreateVolumeGroupSnapshotRequest {
    CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: ids.to_vec(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn group_controller_rules() {
    let d = TestDriver::start("cfgrp", 128 * MIB, "").await;
    let mut r = Rules::new("GroupController");
    let mut g = GroupControllerClient::connect(d.uri()).await.unwrap();
    let mut vols = Vec::new();
    for i in 0..3 {
        vols.push(create(&d, &format!("cf-grp-{i}"), MIB, block_cap()).await);
    }
    let unknown = [
        naming::lv_name_for("never-created"),
        "fake-vol-id-01".to_string(),
    ];

    r.code(
        &required("CreateVolumeGroupSnapshot", "name"),
        g.create_volume_group_snapshot(group_req("", &vols[..2]))
            .await,
        Code::InvalidArgument,
    );
    r.code(
        &required("CreateVolumeGroupSnapshot", "source_volume_ids"),
        g.create_volume_group_snapshot(group_req("cf-g", &[])).await,
        Code::InvalidArgument,
    );
    for u in &unknown {
        r.code(
            &format!("CreateVolumeGroupSnapshot: source volume {u} does not exist → NOT_FOUND"),
            g.create_volume_group_snapshot(group_req("cf-g-u", &[vols[0].clone(), u.clone()]))
                .await,
            Code::NotFound,
        );
    }
    let g1 = r.ok(
        "CreateVolumeGroupSnapshot succeeds",
        g.create_volume_group_snapshot(group_req("cf-g", &vols[..2]))
            .await,
    );
    let g2 = r.ok(
        "CreateVolumeGroupSnapshot: \"This operation MUST be idempotent\": the same call again → OK",
        g.create_volume_group_snapshot(group_req("cf-g", &vols[..2])).await,
    );
    let id1 = g1
        .and_then(|x| x.group_snapshot)
        .map(|x| x.group_snapshot_id);
    let id2 = g2
        .and_then(|x| x.group_snapshot)
        .map(|x| x.group_snapshot_id);
    r.check(
        "CreateVolumeGroupSnapshot: the repeated call returns the same group",
        id1 == id2 && id1.is_some(),
        format!("{id1:?} vs {id2:?}"),
    );
    let count = lvs(&d.vg).thin_volumes("pool").count();
    r.check(
        "CreateVolumeGroupSnapshot: the repeated call makes no second set of snapshots",
        count == vols.len() + 2,
        format!(
            "{count} thin LVs for {} volumes and one group of 2",
            vols.len()
        ),
    );
    r.code(
        "CreateVolumeGroupSnapshot: same name, other source volumes → ALREADY_EXISTS [\"Group snapshot already exists but is incompatible: 6 ALREADY_EXISTS\"]",
        g.create_volume_group_snapshot(group_req("cf-g", &vols[1..])).await,
        Code::AlreadyExists,
    );
    let long = r
        .ok(
            &format!("CreateVolumeGroupSnapshot: a 128-byte name is accepted [{SIZE}]"),
            g.create_volume_group_snapshot(group_req(&"g".repeat(128), &vols[2..]))
                .await,
        )
        .and_then(|x| x.group_snapshot);
    if let Some(l) = &long {
        r.check(
            &format!("CreateVolumeGroupSnapshot: the group and member ids are at most 128 bytes [{SIZE}]"),
            l.group_snapshot_id.len() <= 128 && l.snapshots.iter().all(|s| s.snapshot_id.len() <= 128),
            format!("{l:?}"),
        );
    }

    let get = |id: &str| GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        ..Default::default()
    };
    let delete = |id: &str| DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: vec![],
        secrets: HashMap::new(),
    };
    r.code(
        &required("GetVolumeGroupSnapshot", "group_snapshot_id"),
        g.get_volume_group_snapshot(get("")).await,
        Code::InvalidArgument,
    );
    r.code(
        &required("DeleteVolumeGroupSnapshot", "group_snapshot_id"),
        g.delete_volume_group_snapshot(delete("")).await,
        Code::InvalidArgument,
    );
    for u in [naming::group_id_for("never"), "fake-group-id".to_string()] {
        r.code(
            &format!("GetVolumeGroupSnapshot: group {u} does not exist → NOT_FOUND [\"Volume group snapshot does not exist: 5 NOT_FOUND\"]"),
            g.get_volume_group_snapshot(get(&u)).await,
            Code::NotFound,
        );
        r.ok(
            &format!("DeleteVolumeGroupSnapshot: group {u} does not exist → OK [\"If a group snapshot corresponding to the specified group_snapshot_id does not exist ... the Plugin MUST reply 0 OK\"]"),
            g.delete_volume_group_snapshot(delete(&u)).await,
        );
    }
    for id in id1.iter().chain(long.iter().map(|l| &l.group_snapshot_id)) {
        r.ok(
            "GetVolumeGroupSnapshot of a group succeeds",
            g.get_volume_group_snapshot(get(id)).await,
        );
        for _ in 0..2 {
            r.ok(
                "DeleteVolumeGroupSnapshot: \"This operation MUST be idempotent\" → OK, twice",
                g.delete_volume_group_snapshot(delete(id)).await,
            );
        }
    }
    let count = lvs(&d.vg).thin_volumes("pool").count();
    r.check(
        "DeleteVolumeGroupSnapshot removes the group's snapshots",
        count == vols.len(),
        format!("{count} thin LVs for {} volumes", vols.len()),
    );
    r.finish();
}
