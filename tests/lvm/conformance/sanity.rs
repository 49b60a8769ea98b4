//! What kubernetes-csi's csi-sanity checks (csi-test `pkg/sanity`,
//! v5.6.0), in our own code, with its own inputs where they matter (the
//! ids and paths it makes up, an empty `mutable_parameters` map as it
//! sends at its defaults, its repeat count of 10), for the specs no other
//! module checks the same way. The table in `mod.rs` maps every csi-sanity
//! spec to its rule here or elsewhere.

use std::collections::{BTreeSet, HashMap};

use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::controller_service_capability::rpc::Type as CtlRpc;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::node_service_capability::rpc::Type as NodeRpc;
use thinpool_csi::proto::csi::v1::plugin_capability::service::Type as Service;
use thinpool_csi::proto::csi::v1::plugin_capability::volume_expansion::Type as Expansion;
use thinpool_csi::proto::csi::v1::plugin_capability::Type as PluginCap;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::AccessMode;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use super::{created, raw_call, Rules};
use crate::fixtures::{
    block_cap, create_req, del, mount_cap, publish_req, snap_req, stage_req, unpublish_req,
    unstage_req, Kubelet,
};
use crate::harness::{TestDriver, MIB};

/// csi-sanity's `IdempotentCount`: how often it repeats an identical call.
const REPEAT: usize = 10;
/// Sizes of the volumes here (csi-sanity's are flags; these keep the VM quick).
const SIZE: u64 = 16 * MIB;
const EXPANDED: u64 = 32 * MIB;

fn del_snap(id: &str) -> DeleteSnapshotRequest {
    DeleteSnapshotRequest {
        snapshot_id: id.into(),
        secrets: HashMap::new(),
    }
}

fn modify(id: &str, params: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: id.into(),
        secrets: HashMap::new(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn expand(id: &str, bytes: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("ext4")),
        ..Default::default()
    }
}

async fn volume_count(c: &mut ControllerClient<Channel>) -> usize {
    c.list_volumes(ListVolumesRequest::default())
        .await
        .map(|l| l.into_inner().entries.len())
        .unwrap_or(usize::MAX)
}

async fn snapshot_ids(c: &mut ControllerClient<Channel>, q: ListSnapshotsRequest) -> Vec<String> {
    c.list_snapshots(q)
        .await
        .map(|l| {
            l.into_inner()
                .entries
                .iter()
                .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A driver for the controller specs, their Rules, clients, and the
/// node's id as NodeGetInfo gives it.
async fn sanity_ground(
    vg: &str,
    what: &'static str,
) -> (
    TestDriver,
    Rules,
    ControllerClient<Channel>,
    NodeClient<Channel>,
    String,
) {
    let d = TestDriver::start(vg, 256 * MIB, "").await;
    let r = Rules::new(what);
    let c = d.controller().await;
    let mut n = d.node().await;
    let node_id = n
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner()
        .node_id;
    (d, r, c, n, node_id)
}

/// Five volumes, "sanity-lsv-N", each with one snapshot, "sanity-lss-N":
/// (volume id, snapshot id) pairs.
async fn snapshot_pairs(r: &mut Rules, c: &mut ControllerClient<Channel>) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for i in 0..5 {
        let v = created(
            r,
            c,
            create_req(&format!("sanity-lsv-{i}"), SIZE, block_cap()),
        )
        .await;
        let s = r
            .ok(
                "CreateSnapshot succeeds",
                c.create_snapshot(snap_req(&format!("sanity-lss-{i}"), &v))
                    .await,
            )
            .and_then(|s| s.snapshot)
            .map(|s| s.snapshot_id)
            .unwrap_or_default();
        pairs.push((v, s));
    }
    pairs
}

/// Controller Service [Controller Server] ControllerGetCapabilities, GetSnapshot.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_controller_get_capabilities() {
    let (d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsancap", "csi-sanity controller get capabilities").await;
    // -- ControllerGetCapabilities ----------------------------------------------
    let raw: Vec<i32> = r
        .ok(
            "ControllerGetCapabilities answers",
            c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await,
        )
        .map(|g| {
            g.capabilities
                .iter()
                .filter_map(|c| {
                    c.r#type.as_ref().map(|t| match t {
                        controller_service_capability::Type::Rpc(r) => r.r#type,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    r.check(
        "ControllerGetCapabilities: every advertised RPC is a type of the spec (CREATE_DELETE_VOLUME .. GET_SNAPSHOT), none UNKNOWN",
        !raw.is_empty() && raw.iter().all(|t| (1..=15).contains(t)),
        format!("{raw:?}"),
    );
    // GET_SNAPSHOT is 15 and PUBLISH_READONLY 8 in csi.proto's RPC enum.
    r.check(
        "ControllerGetCapabilities: GET_SNAPSHOT is not advertised (GetSnapshot is not served)",
        !raw.contains(&15),
        format!("{raw:?}"),
    );
    r.code(
        "GetSnapshot: not served → UNIMPLEMENTED, whatever the request (empty, an id that exists, one that does not)",
        raw_call(&d.uri(), "/csi.v1.Controller/GetSnapshot").await,
        Code::Unimplemented,
    );
    r.check(
        "ControllerGetCapabilities: PUBLISH_READONLY is not advertised (a read-only publish is the node's readonly flag)",
        !raw.contains(&(CtlRpc::PublishReadonly as i32)),
        format!("{raw:?}"),
    );
    r.finish();
}

/// Controller Service [Controller Server] ListVolumes.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_list_volumes() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsanlv", "csi-sanity list volumes").await;
    // -- ListVolumes ------------------------------------------------------------
    let listed = r.ok(
        "ListVolumes: an empty request → OK",
        c.list_volumes(ListVolumesRequest::default()).await,
    );
    r.check(
        "ListVolumes: every entry carries a volume with a volume_id",
        listed.as_ref().is_some_and(|l| {
            l.entries
                .iter()
                .all(|e| e.volume.as_ref().is_some_and(|v| !v.volume_id.is_empty()))
        }),
        format!("{listed:?}"),
    );
    r.code(
        "ListVolumes: starting_token \"invalid-token\" → ABORTED",
        c.list_volumes(ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        })
        .await,
        Code::Aborted,
    );
    let before = volume_count(&mut c).await;
    let v = created(
        &mut r,
        &mut c,
        create_req("sanity", SIZE, mount_cap("ext4")),
    )
    .await;
    r.check(
        "ListVolumes: a new volume is listed (count + 1)",
        volume_count(&mut c).await == before + 1,
        format!("{before} before"),
    );
    r.ok("DeleteVolume of it", c.delete_volume(del(&v)).await);
    r.check(
        "ListVolumes: a deleted volume is not listed (count back)",
        volume_count(&mut c).await == before,
        format!("{before} before"),
    );
    r.finish();
}

/// Controller Service [Controller Server] CreateVolume.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_create_volume() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsancv", "csi-sanity create volume").await;
    // -- CreateVolume -----------------------------------------------------------
    r.code(
        "CreateVolume: no name and no volume_capabilities → INVALID_ARGUMENT",
        c.create_volume(CreateVolumeRequest::default()).await,
        Code::InvalidArgument,
    );
    let got = r.ok(
        "CreateVolume: SINGLE_NODE_WRITER with a capacity → OK",
        c.create_volume(create_req("sanity-cap", SIZE, mount_cap("ext4")))
            .await,
    );
    let vol = got.and_then(|g| g.volume).unwrap_or_default();
    r.check(
        "CreateVolume: volume_id set, capacity_bytes ≥ required_bytes (or 0: unknown)",
        !vol.volume_id.is_empty() && (vol.capacity_bytes == 0 || vol.capacity_bytes >= SIZE as i64),
        format!("{vol:?}"),
    );
    // required = limit = size: exactly that size; twice that → ALREADY_EXISTS.
    let mut exact = create_req("sanity-exact", SIZE, block_cap());
    exact.capacity_range = Some(CapacityRange {
        required_bytes: SIZE as i64,
        limit_bytes: SIZE as i64,
    });
    let got = r.ok(
        "CreateVolume: required_bytes = limit_bytes → OK",
        c.create_volume(exact.clone()).await,
    );
    r.check(
        "CreateVolume: required_bytes = limit_bytes → capacity_bytes is exactly that",
        got.as_ref()
            .and_then(|g| g.volume.as_ref())
            .is_some_and(|v| v.capacity_bytes == SIZE as i64),
        format!("{got:?}"),
    );
    exact.capacity_range = Some(CapacityRange {
        required_bytes: 2 * SIZE as i64,
        limit_bytes: 2 * SIZE as i64,
    });
    r.code(
        "CreateVolume: an existing name with twice the required and limit bytes → ALREADY_EXISTS",
        c.create_volume(exact).await,
        Code::AlreadyExists,
    );
    r.ok(
        "CreateVolume: an empty mutable_parameters map (a VolumeAttributesClass with no parameters) → OK",
        c.create_volume(CreateVolumeRequest {
            mutable_parameters: HashMap::new(),
            ..create_req("sanity-vac", SIZE, block_cap())
        })
        .await,
    );
    r.code(
        "CreateVolume: mutable_parameters {XXX_FakeKey: XXX_FakeValue} → INVALID_ARGUMENT",
        c.create_volume(CreateVolumeRequest {
            mutable_parameters: [("XXX_FakeKey".to_string(), "XXX_FakeValue".to_string())].into(),
            ..create_req("sanity-badvac", SIZE, block_cap())
        })
        .await,
        Code::InvalidArgument,
    );

    // From a snapshot, and from a volume.
    let src = created(&mut r, &mut c, create_req("sanity-src", SIZE, block_cap())).await;
    let snap = r
        .ok(
            "CreateSnapshot of a volume → OK",
            c.create_snapshot(snap_req("sanity-src-snap", &src)).await,
        )
        .and_then(|s| s.snapshot)
        .unwrap_or_default();
    r.check(
        "CreateSnapshot: ready_to_use, with snapshot_id, source_volume_id and creation_time",
        snap.ready_to_use
            && !snap.snapshot_id.is_empty()
            && snap.source_volume_id == src
            && snap.creation_time.is_some(),
        format!("{snap:?}"),
    );
    let from_snap = |name: &str, id: &str| CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: id.into(),
                },
            )),
        }),
        ..create_req(name, SIZE, block_cap())
    };
    let from_vol = |name: &str, id: &str| CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: id.into(),
                },
            )),
        }),
        ..create_req(name, SIZE, block_cap())
    };
    let restored = r.ok(
        "CreateVolume from an existing snapshot → OK",
        c.create_volume(from_snap("sanity-restored", &snap.snapshot_id))
            .await,
    );
    r.check(
        "CreateVolume from a snapshot: the reply's content_source is set",
        restored
            .as_ref()
            .and_then(|g| g.volume.as_ref())
            .is_some_and(|v| v.content_source.is_some()),
        format!("{restored:?}"),
    );
    r.code(
        "CreateVolume from snapshot \"non-existing-snapshot-id\" → NOT_FOUND",
        c.create_volume(from_snap("sanity-nosnap", "non-existing-snapshot-id"))
            .await,
        Code::NotFound,
    );
    r.ok(
        "CreateVolume from an existing volume (a clone) → OK",
        c.create_volume(from_vol("sanity-clone", &src)).await,
    );
    r.code(
        "CreateVolume from a volume that does not exist → NOT_FOUND",
        c.create_volume(from_vol("sanity-novol", "non-existing-volume-id"))
            .await,
        Code::NotFound,
    );
    r.finish();
}

/// Controller Service [Controller Server] DeleteVolume.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_delete_volume() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsandv", "csi-sanity delete volume").await;
    // -- DeleteVolume -----------------------------------------------------------
    r.code(
        "DeleteVolume: no volume_id → INVALID_ARGUMENT",
        c.delete_volume(del("")).await,
        Code::InvalidArgument,
    );
    r.ok(
        "DeleteVolume: \"fake-vol-id\" → OK (nothing to delete)",
        c.delete_volume(del("fake-vol-id")).await,
    );
    let gone = created(&mut r, &mut c, create_req("sanity-del", SIZE, block_cap())).await;
    r.ok(
        "DeleteVolume of a volume → OK",
        c.delete_volume(del(&gone)).await,
    );
    r.finish();
}

/// Controller Service [Controller Server] ValidateVolumeCapabilities.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_validate_volume_capabilities() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsanval", "csi-sanity validate volume capabilities").await;
    let src = created(&mut r, &mut c, create_req("sanity-src", SIZE, block_cap())).await;
    // -- ValidateVolumeCapabilities --------------------------------------------------
    r.code(
        "ValidateVolumeCapabilities: an empty request → INVALID_ARGUMENT",
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest::default())
            .await,
        Code::InvalidArgument,
    );
    r.code(
        "ValidateVolumeCapabilities: a volume and no volume_capabilities → INVALID_ARGUMENT",
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: src.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    let valid = r.ok(
        "ValidateVolumeCapabilities: SINGLE_NODE_WRITER → OK",
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: src.clone(),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        })
        .await,
    );
    r.check(
        "ValidateVolumeCapabilities: a set confirmed lists its capabilities",
        valid.as_ref().is_some_and(|v| {
            v.confirmed
                .as_ref()
                .is_none_or(|c| !c.volume_capabilities.is_empty())
        }),
        format!("{valid:?}"),
    );
    r.code(
        "ValidateVolumeCapabilities: a volume that does not exist → NOT_FOUND",
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: "sanity-none".into(),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        })
        .await,
        Code::NotFound,
    );
    r.finish();
}

/// ListSnapshots [Controller Server].
#[tokio::test(flavor = "multi_thread")]
async fn sanity_list_snapshots() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsanls", "csi-sanity list snapshots").await;
    // -- ListSnapshots ------------------------------------------------------------
    let pairs = snapshot_pairs(&mut r, &mut c).await;
    let all = r.ok(
        "ListSnapshots: an empty request → OK",
        c.list_snapshots(ListSnapshotsRequest::default()).await,
    );
    r.check(
        "ListSnapshots: every entry has snapshot_id, source_volume_id and creation_time",
        all.as_ref().is_some_and(|l| {
            l.entries.iter().all(|e| {
                e.snapshot.as_ref().is_some_and(|s| {
                    !s.snapshot_id.is_empty()
                        && !s.source_volume_id.is_empty()
                        && s.creation_time.is_some()
                })
            })
        }),
        format!("{all:?}"),
    );
    let (mid_vol, mid_snap) = pairs[1].clone();
    let by_id = snapshot_ids(
        &mut c,
        ListSnapshotsRequest {
            snapshot_id: mid_snap.clone(),
            ..Default::default()
        },
    )
    .await;
    r.check(
        "ListSnapshots by snapshot_id → exactly that snapshot",
        by_id == vec![mid_snap.clone()],
        format!("{by_id:?}"),
    );
    let by_source = snapshot_ids(
        &mut c,
        ListSnapshotsRequest {
            source_volume_id: mid_vol.clone(),
            ..Default::default()
        },
    )
    .await;
    r.check(
        "ListSnapshots by source_volume_id → exactly its snapshot",
        by_source == vec![mid_snap.clone()],
        format!("{by_source:?}"),
    );
    for (what, q) in [
        (
            "snapshot_id \"none-exist-id\"",
            ListSnapshotsRequest {
                snapshot_id: "none-exist-id".into(),
                ..Default::default()
            },
        ),
        (
            "a source_volume_id that does not exist",
            ListSnapshotsRequest {
                source_volume_id: "sanity-none".into(),
                ..Default::default()
            },
        ),
    ] {
        let got = r.ok(
            &format!("ListSnapshots with {what} → OK"),
            c.list_snapshots(q).await,
        );
        r.check(
            &format!("ListSnapshots with {what} → an empty list"),
            got.as_ref().is_some_and(|l| l.entries.is_empty()),
            format!("{got:?}"),
        );
    }
    let total = snapshot_ids(&mut c, ListSnapshotsRequest::default())
        .await
        .len();
    let page = r.ok(
        "ListSnapshots: max_entries 2 → OK",
        c.list_snapshots(ListSnapshotsRequest {
            max_entries: 2,
            ..Default::default()
        })
        .await,
    );
    let (first, token) = page
        .map(|p| (p.entries.len(), p.next_token))
        .unwrap_or_default();
    let rest = snapshot_ids(
        &mut c,
        ListSnapshotsRequest {
            starting_token: token.clone(),
            ..Default::default()
        },
    )
    .await;
    r.check(
        "ListSnapshots: max_entries 2 → exactly 2 entries and a next_token that lists the rest",
        first == 2 && !token.is_empty() && rest.len() == total - 2,
        format!(
            "{first} on the page, token {token:?}, {} after it, {total} in all",
            rest.len()
        ),
    );
    let before = total;
    let extra = r
        .ok(
            "CreateSnapshot succeeds",
            c.create_snapshot(snap_req("sanity-count", &mid_vol)).await,
        )
        .and_then(|s| s.snapshot)
        .map(|s| s.snapshot_id)
        .unwrap_or_default();
    let after = snapshot_ids(&mut c, ListSnapshotsRequest::default())
        .await
        .len();
    r.check(
        "ListSnapshots: a new snapshot is listed (count + 1)",
        after == before + 1,
        format!("{before} → {after}"),
    );
    r.ok(
        "DeleteSnapshot of it → OK",
        c.delete_snapshot(del_snap(&extra)).await,
    );
    let back = snapshot_ids(&mut c, ListSnapshotsRequest::default())
        .await
        .len();
    r.check(
        "ListSnapshots: a deleted snapshot is not listed (count back)",
        back == before,
        format!("{before} → {back}"),
    );
    r.finish();
}

/// DeleteSnapshot and CreateSnapshot [Controller Server].
#[tokio::test(flavor = "multi_thread")]
async fn sanity_delete_and_create_snapshot() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsands", "csi-sanity delete and create snapshot").await;
    let pairs = snapshot_pairs(&mut r, &mut c).await;
    let mid_vol = pairs[1].0.clone();
    // -- DeleteSnapshot, CreateSnapshot ---------------------------------------------
    r.code(
        "DeleteSnapshot: no snapshot_id → INVALID_ARGUMENT",
        c.delete_snapshot(del_snap("")).await,
        Code::InvalidArgument,
    );
    r.ok(
        "DeleteSnapshot: \"reallyfakesnapshotid\" → OK (nothing to delete)",
        c.delete_snapshot(del_snap("reallyfakesnapshotid")).await,
    );
    r.code(
        "CreateSnapshot: no name, source \"testId\" → INVALID_ARGUMENT (the name is checked before the source is looked up)",
        c.create_snapshot(snap_req("", "testId")).await,
        Code::InvalidArgument,
    );
    r.code(
        "CreateSnapshot: no source_volume_id → INVALID_ARGUMENT",
        c.create_snapshot(snap_req("sanity-nosrc", "")).await,
        Code::InvalidArgument,
    );
    for _ in 0..2 {
        r.ok(
            "CreateSnapshot: the same name and source twice → OK both times",
            c.create_snapshot(snap_req("sanity-twice", &mid_vol)).await,
        );
    }
    r.code(
        "CreateSnapshot: the same name, another source volume → ALREADY_EXISTS",
        c.create_snapshot(snap_req("sanity-twice", &pairs[2].0))
            .await,
        Code::AlreadyExists,
    );
    for _ in 0..2 {
        r.ok(
            "CreateSnapshot: a 128-character name → OK, twice",
            c.create_snapshot(snap_req(&"s".repeat(128), &mid_vol))
                .await,
        );
    }
    r.finish();
}

/// ExpandVolume [Controller Server].
#[tokio::test(flavor = "multi_thread")]
async fn sanity_expand_volume() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsanexp", "csi-sanity expand volume").await;
    // -- ExpandVolume -------------------------------------------------------------
    r.code(
        "ControllerExpandVolume: no volume_id (capacity given) → INVALID_ARGUMENT",
        c.controller_expand_volume(expand("", EXPANDED)).await,
        Code::InvalidArgument,
    );
    r.code(
        "ControllerExpandVolume: no volume_id and no capacity_range → INVALID_ARGUMENT",
        c.controller_expand_volume(ControllerExpandVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    let grow = created(
        &mut r,
        &mut c,
        create_req("sanity-grow", SIZE, mount_cap("ext4")),
    )
    .await;
    let grown = r.ok(
        "ControllerExpandVolume → OK",
        c.controller_expand_volume(expand(&grow, EXPANDED)).await,
    );
    r.check(
        "ControllerExpandVolume: capacity_bytes is exactly the size asked for",
        grown
            .as_ref()
            .is_some_and(|g| g.capacity_bytes == EXPANDED as i64),
        format!("{grown:?}"),
    );
    r.finish();
}

/// ModifyVolume [Controller Server].
#[tokio::test(flavor = "multi_thread")]
async fn sanity_modify_volume() {
    let (_d, mut r, mut c, _n, _node_id) =
        sanity_ground("cfsanmod", "csi-sanity modify volume").await;
    // -- ModifyVolume at csi-sanity's defaults: an empty map ---------------------------
    r.code(
        "ControllerModifyVolume: no volume_id, empty mutable_parameters → INVALID_ARGUMENT",
        c.controller_modify_volume(modify("", &[])).await,
        Code::InvalidArgument,
    );
    r.code(
        "ControllerModifyVolume: \"non-existing-volume-id\", empty mutable_parameters → NOT_FOUND",
        c.controller_modify_volume(modify("non-existing-volume-id", &[]))
            .await,
        Code::NotFound,
    );
    let plain = created(&mut r, &mut c, create_req("sanity-mod", SIZE, block_cap())).await;
    r.code(
        "ControllerModifyVolume: {XXX_FakeKey: XXX_FakeValue} → INVALID_ARGUMENT",
        c.controller_modify_volume(modify(&plain, &[("XXX_FakeKey", "XXX_FakeValue")]))
            .await,
        Code::InvalidArgument,
    );
    r.ok(
        "ControllerModifyVolume: a volume created without mutable parameters, empty mutable_parameters → OK",
        c.controller_modify_volume(modify(&plain, &[])).await,
    );
    let with = created(
        &mut r,
        &mut c,
        CreateVolumeRequest {
            mutable_parameters: HashMap::new(),
            ..create_req("sanity-mod-vac", SIZE, block_cap())
        },
    )
    .await;
    r.ok(
        "ControllerModifyVolume: a volume created with (empty) mutable parameters, the same again → OK",
        c.controller_modify_volume(modify(&with, &[])).await,
    );
    r.code(
        "ControllerModifyVolume: a volume created with mutable parameters, then {XXX_FakeKey: XXX_FakeValue} → INVALID_ARGUMENT",
        c.controller_modify_volume(modify(&with, &[("XXX_FakeKey", "XXX_FakeValue")]))
            .await,
        Code::InvalidArgument,
    );
    r.finish();
}

/// NodeGetVolumeStats of `id` at `path`.
fn vstats(id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

/// NodeExpandVolume of `id` at `path`, nothing else set.
fn nexpand(id: &str, path: &str) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

/// A driver on a kubelet directory of its own for the node specs, their
/// Rules and clients.
async fn node_ground(
    name: &str,
    what: &'static str,
) -> (
    Kubelet,
    TestDriver,
    Rules,
    ControllerClient<Channel>,
    NodeClient<Channel>,
) {
    let k = Kubelet::new(name);
    let d = TestDriver::start(name, 256 * MIB, &k.extra()).await;
    let r = Rules::new(what);
    let (c, n) = (d.controller().await, d.node().await);
    (k, d, r, c, n)
}

/// Identity Service specs: GetPluginCapabilities, Probe, GetPluginInfo.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_identity_specs() {
    let d = TestDriver::start("cfsanid", 64 * MIB, "").await;
    let mut r = Rules::new("csi-sanity identity specs");
    let mut id = d.identity().await;
    // -- Identity ---------------------------------------------------------------------
    let caps = r
        .ok(
            "GetPluginCapabilities → OK",
            id.get_plugin_capabilities(GetPluginCapabilitiesRequest {})
                .await,
        )
        .map(|g| g.capabilities)
        .unwrap_or_default();
    let mut services = BTreeSet::new();
    let mut unknown = Vec::new();
    for cap in &caps {
        match &cap.r#type {
            Some(PluginCap::Service(s)) => match Service::try_from(s.r#type) {
                Ok(t) if t != Service::Unknown => {
                    services.insert(s.r#type);
                }
                _ => unknown.push(format!("service {}", s.r#type)),
            },
            Some(PluginCap::VolumeExpansion(e)) => {
                if !matches!(
                    Expansion::try_from(e.r#type),
                    Ok(Expansion::Online | Expansion::Offline)
                ) {
                    unknown.push(format!("expansion {}", e.r#type));
                }
            }
            None => unknown.push("a capability of no type".into()),
        }
    }
    r.check(
        "GetPluginCapabilities: every service is a type of the spec, every expansion ONLINE or OFFLINE",
        unknown.is_empty() && !services.is_empty(),
        format!("unknown: {unknown:?}"),
    );
    let probe = r.ok("Probe → OK", id.probe(ProbeRequest {}).await);
    r.check(
        "Probe: ready is true or unset on a started driver",
        probe.is_some_and(|p| p.ready != Some(false)),
        "ready = false",
    );
    let info = r
        .ok(
            "GetPluginInfo → OK",
            id.get_plugin_info(GetPluginInfoRequest {}).await,
        )
        .unwrap_or_default();
    let name = info.name.as_str();
    r.check(
        "GetPluginInfo: name at most 63 characters, starting and ending with a letter, only letters, digits, '-', '.' and '_' between",
        !name.is_empty()
            && name.len() <= 63
            && name.starts_with(|ch: char| ch.is_ascii_alphabetic())
            && name.ends_with(|ch: char| ch.is_ascii_alphabetic())
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-._".contains(ch)),
        format!("{name:?}"),
    );
    r.finish();
}

/// Node Service NodeGetCapabilities and NodeGetInfo specs.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_node_capabilities_and_info() {
    let (_k, d, mut r, _c, mut n) = node_ground("cfsannc", "csi-sanity node capabilities").await;
    let services: BTreeSet<i32> = d
        .identity()
        .await
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect("GetPluginCapabilities")
        .into_inner()
        .capabilities
        .iter()
        .filter_map(|cap| match &cap.r#type {
            Some(PluginCap::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    // -- NodeGetCapabilities, NodeGetInfo ------------------------------------------------
    let node_caps: Vec<i32> = r
        .ok(
            "NodeGetCapabilities → OK",
            n.node_get_capabilities(NodeGetCapabilitiesRequest {}).await,
        )
        .map(|g| {
            g.capabilities
                .iter()
                .filter_map(|c| {
                    c.r#type.as_ref().map(|t| match t {
                        node_service_capability::Type::Rpc(r) => r.r#type,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    r.check(
        "NodeGetCapabilities: every advertised RPC is a type of the spec this driver serves (STAGE_UNSTAGE_VOLUME .. VOLUME_MOUNT_GROUP); GET_VOLUME_HEALTH and GET_STORAGE_HEALTH are not advertised",
        !node_caps.is_empty()
            && node_caps
                .iter()
                .all(|t| matches!(NodeRpc::try_from(*t), Ok(t) if t != NodeRpc::Unknown)),
        format!("{node_caps:?}"),
    );
    for path in [
        "/csi.v1.Node/NodeGetVolumeHealth",
        "/csi.v1.Node/NodeGetStorageHealth",
    ] {
        r.code(
            &format!("{path}: not served → UNIMPLEMENTED (volume health is VOLUME_CONDITION in NodeGetVolumeStats)"),
            raw_call(&d.uri(), path).await,
            Code::Unimplemented,
        );
    }
    let info = r
        .ok(
            "NodeGetInfo → OK",
            n.node_get_info(NodeGetInfoRequest {}).await,
        )
        .unwrap_or_default();
    r.check(
        "NodeGetInfo: node_id set, max_volumes_per_node ≥ 0, accessible_topology set (VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised)",
        !info.node_id.is_empty()
            && info.max_volumes_per_node >= 0
            && (!services.contains(&(Service::VolumeAccessibilityConstraints as i32))
                || info.accessible_topology.is_some()),
        format!("{info:?}"),
    );
    r.finish();
}

/// Node Service specs on required fields, as csi-sanity sends them.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_node_required_fields() {
    let (k, _d, mut r, mut c, mut n) =
        node_ground("cfsannr", "csi-sanity node required fields").await;
    // -- Required fields, as csi-sanity sends them ------------------------------------------
    let some = "some/path";
    r.code(
        "NodePublishVolume: an empty request → INVALID_ARGUMENT",
        n.node_publish_volume(NodePublishVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodePublishVolume: a volume_id only → INVALID_ARGUMENT",
        n.node_publish_volume(NodePublishVolumeRequest {
            volume_id: "sanity-id".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    let target = k.target("sanity-req");
    r.code(
        "NodePublishVolume: a volume_id and target_path, no volume_capability → INVALID_ARGUMENT",
        n.node_publish_volume(NodePublishVolumeRequest {
            volume_id: "sanity-id".into(),
            target_path: target.to_str().unwrap().into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeUnpublishVolume: an empty request → INVALID_ARGUMENT",
        n.node_unpublish_volume(NodeUnpublishVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeUnpublishVolume: a volume_id and no target_path → INVALID_ARGUMENT",
        n.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "sanity-id".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeStageVolume: an empty request → INVALID_ARGUMENT",
        n.node_stage_volume(NodeStageVolumeRequest::default()).await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeStageVolume: a volume_id and no staging_target_path → INVALID_ARGUMENT",
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: "sanity-id".into(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    let real = created(
        &mut r,
        &mut c,
        create_req("sanity-nodereq", SIZE, block_cap()),
    )
    .await;
    let staging = k.staging("sanity-req");
    r.code(
        "NodeStageVolume: a volume that exists, no volume_capability → INVALID_ARGUMENT",
        n.node_stage_volume(NodeStageVolumeRequest {
            volume_id: real.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeUnstageVolume: an empty request → INVALID_ARGUMENT",
        n.node_unstage_volume(NodeUnstageVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeUnstageVolume: a volume_id and no staging_target_path → INVALID_ARGUMENT",
        n.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "sanity-id".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeGetVolumeStats: \"some/path\" and no volume_id → INVALID_ARGUMENT",
        n.node_get_volume_stats(vstats("", some)).await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeGetVolumeStats: a volume_id and no volume_path → INVALID_ARGUMENT",
        n.node_get_volume_stats(vstats(&real, "")).await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeGetVolumeStats: a volume that does not exist at \"some/path\" → NOT_FOUND",
        n.node_get_volume_stats(vstats("sanity-none", some)).await,
        Code::NotFound,
    );
    r.code(
        "NodeExpandVolume: an empty request → INVALID_ARGUMENT",
        n.node_expand_volume(NodeExpandVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeExpandVolume: a volume that exists and no volume_path → INVALID_ARGUMENT",
        n.node_expand_volume(nexpand(&real, "")).await,
        Code::InvalidArgument,
    );
    r.code(
        "NodeExpandVolume: a volume that does not exist at \"some/path\" → NOT_FOUND",
        n.node_expand_volume(nexpand("sanity-none", some)).await,
        Code::NotFound,
    );
    r.finish();
}

/// Node Service "should work" and "should be idempotent", and
/// NodeExpandVolume after publish, for mount and for block volumes as
/// csi-sanity runs them (`-csi.testvolumeaccesstype`).
#[tokio::test(flavor = "multi_thread")]
async fn sanity_node_lifecycle() {
    let (k, _d, mut r, mut c, mut n) = node_ground("cfsannl", "csi-sanity node lifecycle").await;
    let some = "some/path";
    let info = n
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner();
    // -- The node lifecycle, per access type --------------------------------------------------
    let topology = info.accessible_topology.clone();
    for (kind, cap) in [("mount", mount_cap("ext4")), ("block", block_cap())] {
        let mut q = create_req(&format!("sanity-life-{kind}"), SIZE, cap.clone());
        q.accessibility_requirements = Some(TopologyRequirement {
            requisite: topology.clone().into_iter().collect(),
            preferred: topology.clone().into_iter().collect(),
        });
        // No ControllerPublishVolume, nor ControllerUnpublishVolume below:
        // csi-sanity calls them only where PUBLISH_UNPUBLISH_VOLUME is
        // advertised.
        let vol = created(&mut r, &mut c, q).await;
        let staging = k.staging(&format!("sanity-{kind}"));
        let target = k.target(&format!("sanity-{kind}"));
        for i in 0..REPEAT {
            r.ok(
                &format!("should be idempotent ({kind}): NodeStageVolume {REPEAT} times → OK each time (call {i})"),
                n.node_stage_volume(stage_req(&vol, &staging, cap.clone()))
                    .await,
            );
        }
        for i in 0..REPEAT {
            r.ok(
                &format!("should be idempotent ({kind}): NodePublishVolume {REPEAT} times → OK each time (call {i})"),
                n.node_publish_volume(publish_req(&vol, &staging, &target, cap.clone(), false))
                    .await,
            );
        }
        r.check(
            &format!("NodePublishVolume ({kind}): the target path exists"),
            target.exists(),
            target.display(),
        );
        let st = r.ok(
            &format!("should work ({kind}): NodeGetVolumeStats at the target → OK"),
            n.node_get_volume_stats(vstats(&vol, target.to_str().unwrap()))
                .await,
        );
        r.check(
            &format!("should work ({kind}): NodeGetVolumeStats reports usage"),
            st.as_ref().is_some_and(|s| !s.usage.is_empty()),
            format!("{st:?}"),
        );
        r.code(
            &format!("NodeGetVolumeStats ({kind}): a published volume asked at \"some/path\" → NOT_FOUND"),
            n.node_get_volume_stats(vstats(&vol, some)).await,
            Code::NotFound,
        );
        let grown = r.ok(
            &format!("NodeExpandVolume after publish ({kind}): ControllerExpandVolume first → OK"),
            c.controller_expand_volume(ControllerExpandVolumeRequest {
                volume_capability: Some(cap.clone()),
                ..expand(&vol, EXPANDED)
            })
            .await,
        );
        r.check(
            &format!("NodeExpandVolume after publish ({kind}): the controller's capacity_bytes is exactly the size asked for"),
            grown
                .as_ref()
                .is_some_and(|g| g.capacity_bytes == EXPANDED as i64),
            format!("{grown:?}"),
        );
        r.ok(
            &format!(
                "NodeExpandVolume after publish ({kind}): NodeExpandVolume at the target → OK"
            ),
            n.node_expand_volume(NodeExpandVolumeRequest {
                capacity_range: Some(CapacityRange {
                    required_bytes: EXPANDED as i64,
                    limit_bytes: 0,
                }),
                volume_capability: Some(cap.clone()),
                ..nexpand(&vol, target.to_str().unwrap())
            })
            .await,
        );
        r.ok(
            &format!("should work ({kind}): NodeUnpublishVolume → OK"),
            n.node_unpublish_volume(unpublish_req(&vol, &target)).await,
        );
        r.check(
            &format!("NodeUnpublishVolume ({kind}) removes the target path"),
            !target.exists(),
            target.display(),
        );
        r.ok(
            &format!("should work ({kind}): NodeUnstageVolume → OK"),
            n.node_unstage_volume(unstage_req(&vol, &staging)).await,
        );
        for _ in 0..2 {
            r.ok(
                &format!("should work ({kind}): DeleteVolume, and again on the deleted id → OK"),
                c.delete_volume(del(&vol)).await,
            );
        }
    }
    r.finish();
}

/// SINGLE_NODE_SINGLE_WRITER: one target only.
#[tokio::test(flavor = "multi_thread")]
async fn sanity_single_node_single_writer() {
    let (k, _d, mut r, mut c, mut n) = node_ground("cfsannw", "csi-sanity single writer").await;
    // SINGLE_NODE_SINGLE_WRITER published at one target: another target is
    // FAILED_PRECONDITION.
    let snsw = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeSingleWriter as i32,
        }),
        ..mount_cap("ext4")
    };
    let vol = created(
        &mut r,
        &mut c,
        create_req("sanity-snsw", SIZE, snsw.clone()),
    )
    .await;
    let staging = k.staging("sanity-snsw");
    let (t1, t2) = (k.target("sanity-snsw-1"), k.target("sanity-snsw-2"));
    r.ok(
        "SINGLE_NODE_SINGLE_WRITER: NodeStageVolume → OK",
        n.node_stage_volume(stage_req(&vol, &staging, snsw.clone()))
            .await,
    );
    r.ok(
        "SINGLE_NODE_SINGLE_WRITER: NodePublishVolume at a target → OK",
        n.node_publish_volume(publish_req(&vol, &staging, &t1, snsw.clone(), false))
            .await,
    );
    r.code(
        "SINGLE_NODE_SINGLE_WRITER: NodePublishVolume at another target → FAILED_PRECONDITION",
        n.node_publish_volume(publish_req(&vol, &staging, &t2, snsw.clone(), false))
            .await,
        Code::FailedPrecondition,
    );
    r.ok(
        "SINGLE_NODE_SINGLE_WRITER: NodeUnpublishVolume → OK",
        n.node_unpublish_volume(unpublish_req(&vol, &t1)).await,
    );
    r.ok(
        "SINGLE_NODE_SINGLE_WRITER: NodeUnstageVolume → OK",
        n.node_unstage_volume(unstage_req(&vol, &staging)).await,
    );
    r.finish();
}
