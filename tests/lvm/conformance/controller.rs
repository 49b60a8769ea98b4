//! Controller RPCs: required fields, idempotency, NOT_FOUND and
//! ALREADY_EXISTS, pagination, the 128-byte limits.

use std::collections::{BTreeSet, HashMap};

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::controller_service_capability::rpc::Type as CtlRpc;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::AccessMode;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use super::{required, Rules, NOT_IMPLEMENTED, SIZE};
use crate::fixtures::{block_cap, create_req, del, mount_cap, snap_req};
use crate::harness::{lvs, TestDriver, MIB, NODE_ID};

/// Volume ids no volume has: one of the driver's shape, and csi-sanity's.
fn unknown_ids() -> [String; 2] {
    [
        naming::lv_name_for("never-created"),
        "fake-vol-id-01".to_string(),
    ]
}

/// csi-spec.md's words on ControllerPublishVolume (and, the same,
/// ControllerUnpublishVolume).
const MUST_IF_ADVERTISED: &str = "\"A Controller Plugin MUST implement this RPC call if it has `PUBLISH_UNPUBLISH_VOLUME` controller capability\"";

fn thin_count(vg: &str) -> usize {
    lvs(vg).thin_volumes("pool").count()
}

fn expand_req(id: &str, bytes: u64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

async fn create(r: &mut Rules, c: &mut ControllerClient<Channel>, name: &str) -> String {
    super::created(r, c, create_req(name, MIB, block_cap())).await
}

/// A driver as the volume rules want it (overprovisioned 4×), their
/// Rules, and "cf-vol", a 5 MiB ext4 volume created on it.
async fn volume_ground(
    vg: &str,
    what: &'static str,
) -> (TestDriver, Rules, ControllerClient<Channel>, String) {
    let d = TestDriver::start(vg, 128 * MIB, "overprovision_ratio = 4.0").await;
    let mut r = Rules::new(what);
    let mut c = d.controller().await;
    let id = super::created(
        &mut r,
        &mut c,
        create_req("cf-vol", 5 * MIB, mount_cap("ext4")),
    )
    .await;
    (d, r, c, id)
}

/// CreateVolume: required fields, sizes, idempotency, conflicts, sources.
#[tokio::test(flavor = "multi_thread")]
async fn create_volume_rules() {
    let d = TestDriver::start("cfctl", 128 * MIB, "overprovision_ratio = 4.0").await;
    let mut r = Rules::new("Controller CreateVolume");
    let mut c = d.controller().await;
    let rule = required;
    // -- CreateVolume ------------------------------------------------
    let mut q = create_req("", MIB, block_cap());
    r.code(
        &rule("CreateVolume", "name"),
        c.create_volume(q.clone()).await,
        Code::InvalidArgument,
    );
    q.name = "cf-nocaps".into();
    q.volume_capabilities.clear();
    r.code(
        &rule("CreateVolume", "volume_capabilities"),
        c.create_volume(q.clone()).await,
        Code::InvalidArgument,
    );
    let mut nomode = block_cap();
    nomode.access_mode = None;
    q.volume_capabilities = vec![nomode];
    r.code(
        &rule("CreateVolume", "volume_capabilities[].access_mode"),
        c.create_volume(q.clone()).await,
        Code::InvalidArgument,
    );
    let mut notype = block_cap();
    notype.access_type = None;
    q.volume_capabilities = vec![notype];
    r.code(
        &rule("CreateVolume", "volume_capabilities[].access_type"),
        c.create_volume(q.clone()).await,
        Code::InvalidArgument,
    );
    r.check(
        "CreateVolume: a refused request creates nothing",
        thin_count(&d.vg) == 0,
        format!("{} thin LVs", thin_count(&d.vg)),
    );

    // Names of 128 bytes are accepted, of 129 refused; ids fit the limit.
    let long = "n".repeat(128);
    let v = r
        .ok(
            &format!("CreateVolume: a 128-byte name is accepted [{SIZE}]"),
            c.create_volume(create_req(&long, MIB, block_cap())).await,
        )
        .and_then(|v| v.volume);
    if let Some(v) = &v {
        r.check(
            &format!(
                "CreateVolume: the volume_id of a 128-byte name is at most 128 bytes [{SIZE}]"
            ),
            v.volume_id.len() <= 128,
            format!("{} bytes", v.volume_id.len()),
        );
        r.ok(
            "DeleteVolume of it",
            c.delete_volume(del(&v.volume_id)).await,
        );
    }
    r.code(
        &format!("CreateVolume: a 129-byte name → INVALID_ARGUMENT [{SIZE}]"),
        c.create_volume(create_req(&"n".repeat(129), MIB, block_cap()))
            .await,
        Code::InvalidArgument,
    );

    // Idempotency: the same request twice is the same volume, one LV.
    let req = create_req("cf-vol", 5 * MIB, mount_cap("ext4"));
    let v1 = r.ok("CreateVolume succeeds", c.create_volume(req.clone()).await);
    let v2 = r.ok(
        "CreateVolume: \"This operation MUST be idempotent\": the same request again → OK",
        c.create_volume(req.clone()).await,
    );
    r.check(
        "CreateVolume: the repeated call returns the same volume",
        v1 == v2 && v1.is_some(),
        format!("{v1:?} vs {v2:?}"),
    );
    r.check(
        "CreateVolume: the repeated call creates no second LV",
        thin_count(&d.vg) == 1,
        format!("{} thin LVs", thin_count(&d.vg)),
    );
    let _id = v1
        .and_then(|v| v.volume)
        .map(|v| v.volume_id)
        .expect("cf-vol");

    // ALREADY_EXISTS: same name, incompatible request.
    let mut bigger = req.clone();
    bigger.capacity_range = Some(CapacityRange {
        required_bytes: (64 * MIB) as i64,
        limit_bytes: 0,
    });
    for (what, q) in [
        ("a larger capacity_range", bigger),
        (
            "another fs_type",
            create_req("cf-vol", 5 * MIB, mount_cap("xfs")),
        ),
        (
            "another access type",
            create_req("cf-vol", 5 * MIB, block_cap()),
        ),
    ] {
        r.code(
            &format!("CreateVolume: same name with {what} → ALREADY_EXISTS [\"Volume already exists but is incompatible: 6 ALREADY_EXISTS\"]"),
            c.create_volume(q).await,
            Code::AlreadyExists,
        );
    }
    r.check(
        "CreateVolume: an incompatible request creates nothing",
        thin_count(&d.vg) == 1,
        format!("{} thin LVs", thin_count(&d.vg)),
    );
    // A source that does not exist.
    let mut from = create_req("cf-from", 8 * MIB, block_cap());
    from.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: naming::snapshot_lv_name_for("never"),
            },
        )),
    });
    r.code(
        "CreateVolume: a volume_content_source snapshot that does not exist → NOT_FOUND [\"Source incompatible or not supported ... 5 NOT_FOUND\": \"the specified source does not exist\"]",
        c.create_volume(from).await,
        Code::NotFound,
    );
    r.code(
        "CreateVolume: more than the pool can hold → RESOURCE_EXHAUSTED [\"Unsupported capacity: 11 OUT_OF_RANGE\" is for sizes the plugin never supports; \"Not enough capacity: 8 RESOURCE_EXHAUSTED\"]",
        c.create_volume(create_req("cf-huge", 4096 * MIB, block_cap())).await,
        Code::ResourceExhausted,
    );
    r.finish();
}

/// DeleteVolume: required fields, unknown ids, idempotency.
#[tokio::test(flavor = "multi_thread")]
async fn delete_volume_rules() {
    let (d, mut r, mut c, id) = volume_ground("cfctldel", "Controller DeleteVolume").await;
    let rule = required;
    // -- DeleteVolume --------------------------------------------------
    r.code(
        &rule("DeleteVolume", "volume_id"),
        c.delete_volume(del("")).await,
        Code::InvalidArgument,
    );
    for u in unknown_ids() {
        r.ok(
            &format!("DeleteVolume: a volume that does not exist ({u}) → OK [\"If a volume corresponding to the specified volume_id does not exist or the artifacts associated with the volume do not exist anymore, the Plugin MUST reply 0 OK\"]"),
            c.delete_volume(del(&u)).await,
        );
    }
    r.ok(
        "DeleteVolume: a 128-byte id that names nothing → OK",
        c.delete_volume(del(&"v".repeat(128))).await,
    );
    r.code(
        &format!("DeleteVolume: a 129-byte volume_id → INVALID_ARGUMENT [{SIZE}]"),
        c.delete_volume(del(&"v".repeat(129))).await,
        Code::InvalidArgument,
    );

    // -- DeleteVolume, twice ---------------------------------------------------------
    for _ in 0..2 {
        r.ok(
            "DeleteVolume: \"This operation MUST be idempotent\" → OK, twice",
            c.delete_volume(del(&id)).await,
        );
    }
    r.check(
        "DeleteVolume removes the LV",
        thin_count(&d.vg) == 0,
        format!("{} thin LVs", thin_count(&d.vg)),
    );
    r.finish();
}

/// ControllerPublishVolume and ControllerUnpublishVolume: neither is
/// implemented, and PUBLISH_UNPUBLISH_VOLUME is not advertised
/// (src/grpc/controller.rs, `CAPABILITIES`, says why).
#[tokio::test(flavor = "multi_thread")]
async fn controller_publish_rules() {
    let (_d, mut r, mut c, id) = volume_ground("cfctlpub", "Controller publish").await;
    // -- ControllerPublishVolume / Unpublish ----------------------------
    let caps: Vec<i32> = r
        .ok(
            "ControllerGetCapabilities answers",
            c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await,
        )
        .map(|g| {
            g.capabilities
                .iter()
                .filter_map(|c| {
                    c.r#type
                        .as_ref()
                        .map(|controller_service_capability::Type::Rpc(r)| r.r#type)
                })
                .collect()
        })
        .unwrap_or_default();
    r.check(
        &format!("ControllerGetCapabilities: PUBLISH_UNPUBLISH_VOLUME is not advertised, so neither call is owed [{MUST_IF_ADVERTISED}]"),
        !caps.is_empty() && !caps.contains(&(CtlRpc::PublishUnpublishVolume as i32)),
        format!("{caps:?}"),
    );
    let [unknown, _] = unknown_ids();
    // An empty request, an unknown volume, and the volume on this node
    // with all its fields: UNIMPLEMENTED before any field is looked at.
    for (what, volume_id, node_id, cap) in [
        ("an empty request", "", "", None),
        (
            "a volume that does not exist",
            unknown.as_str(),
            NODE_ID,
            Some(block_cap()),
        ),
        (
            "the volume, this node, its capability",
            id.as_str(),
            NODE_ID,
            Some(mount_cap("ext4")),
        ),
    ] {
        r.code(
            &format!("ControllerPublishVolume: not served → UNIMPLEMENTED, for {what} [{NOT_IMPLEMENTED}]"),
            c.controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: volume_id.into(),
                node_id: node_id.into(),
                volume_capability: cap,
                ..Default::default()
            })
            .await,
            Code::Unimplemented,
        );
        r.code(
            &format!("ControllerUnpublishVolume: not served → UNIMPLEMENTED, for {what} [{NOT_IMPLEMENTED}]"),
            c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: volume_id.into(),
                node_id: node_id.into(),
                secrets: HashMap::new(),
            })
            .await,
            Code::Unimplemented,
        );
    }
    r.finish();
}

/// ValidateVolumeCapabilities.
#[tokio::test(flavor = "multi_thread")]
async fn validate_volume_capabilities_rules() {
    let (_d, mut r, mut c, id) = volume_ground("cfctlval", "Controller validate").await;
    let rule = required;
    // -- ValidateVolumeCapabilities --------------------------------------
    let validate = |id: &str, caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    r.code(
        &rule("ValidateVolumeCapabilities", "volume_id"),
        c.validate_volume_capabilities(validate("", vec![block_cap()]))
            .await,
        Code::InvalidArgument,
    );
    for u in unknown_ids() {
        r.code(
            &format!(
                "{} (volume {u} unknown)",
                rule("ValidateVolumeCapabilities", "volume_capabilities")
            ),
            c.validate_volume_capabilities(validate(&u, vec![])).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("ValidateVolumeCapabilities: volume {u} does not exist → NOT_FOUND [\"Volume does not exist: 5 NOT_FOUND\"]"),
            c.validate_volume_capabilities(validate(&u, vec![block_cap()])).await,
            Code::NotFound,
        );
    }
    let ok = r.ok(
        "ValidateVolumeCapabilities of the volume's own capability succeeds",
        c.validate_volume_capabilities(validate(&id, vec![mount_cap("ext4")]))
            .await,
    );
    r.check(
        "ValidateVolumeCapabilities: a supported capability is confirmed [\"confirmed ... MUST be set if the volume capabilities are supported\"]",
        ok.as_ref().is_some_and(|v| v.confirmed.is_some()),
        format!("{ok:?}"),
    );
    let mut multi = mount_cap("ext4");
    multi.access_mode = Some(AccessMode {
        mode: Mode::MultiNodeMultiWriter as i32,
    });
    let no = c
        .validate_volume_capabilities(validate(&id, vec![multi]))
        .await;
    r.check(
        "ValidateVolumeCapabilities: an unsupported capability is not confirmed, with a message [\"confirmed ... MUST NOT be set\" otherwise]",
        match &no {
            Ok(v) => v.get_ref().confirmed.is_none() && !v.get_ref().message.is_empty(),
            Err(s) => s.code() == Code::InvalidArgument,
        },
        format!("{no:?}"),
    );
    r.finish();
}

/// ControllerExpandVolume.
#[tokio::test(flavor = "multi_thread")]
async fn controller_expand_rules() {
    let (_d, mut r, mut c, id) = volume_ground("cfctlexp", "Controller expand").await;
    let rule = required;
    // -- ControllerExpandVolume ---------------------------------------------
    r.code(
        &rule("ControllerExpandVolume", "volume_id"),
        c.controller_expand_volume(expand_req("", 8 * MIB)).await,
        Code::InvalidArgument,
    );
    for u in unknown_ids() {
        let mut q = expand_req(&u, 8 * MIB);
        q.capacity_range = None;
        r.code(
            &format!(
                "{} (volume {u} unknown)",
                rule("ControllerExpandVolume", "capacity_range")
            ),
            c.controller_expand_volume(q).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("ControllerExpandVolume: volume {u} does not exist → NOT_FOUND [\"Volume does not exist: 5 NOT_FOUND\"]"),
            c.controller_expand_volume(expand_req(&u, 8 * MIB)).await,
            Code::NotFound,
        );
    }
    let e1 = r.ok(
        "ControllerExpandVolume succeeds",
        c.controller_expand_volume(expand_req(&id, 12 * MIB)).await,
    );
    let e2 = r.ok(
        "ControllerExpandVolume: \"This operation MUST be idempotent\": the same call again → OK",
        c.controller_expand_volume(expand_req(&id, 12 * MIB)).await,
    );
    r.check(
        "ControllerExpandVolume: the repeated call reports the same capacity, at least required_bytes",
        e1.as_ref().map(|e| e.capacity_bytes) == e2.as_ref().map(|e| e.capacity_bytes)
            && e1.as_ref().is_some_and(|e| e.capacity_bytes >= (12 * MIB) as i64),
        format!("{e1:?} vs {e2:?}"),
    );
    let mut shrink = expand_req(&id, 4 * MIB);
    shrink.capacity_range = Some(CapacityRange {
        required_bytes: (4 * MIB) as i64,
        limit_bytes: (4 * MIB) as i64,
    });
    r.code(
        "ControllerExpandVolume: limit_bytes below the current size → OUT_OF_RANGE [\"Unsupported capacity: 11 OUT_OF_RANGE\"]",
        c.controller_expand_volume(shrink).await,
        Code::OutOfRange,
    );
    r.finish();
}

/// ControllerGetVolume.
#[tokio::test(flavor = "multi_thread")]
async fn controller_get_volume_rules() {
    let (_d, mut r, mut c, id) = volume_ground("cfctlget", "Controller get").await;
    let rule = required;
    // -- ControllerGetVolume ---------------------------------------------------
    let get = |id: &str| ControllerGetVolumeRequest {
        volume_id: id.into(),
    };
    r.code(
        &rule("ControllerGetVolume", "volume_id"),
        c.controller_get_volume(get("")).await,
        Code::InvalidArgument,
    );
    for u in unknown_ids() {
        r.code(
            &format!("ControllerGetVolume: volume {u} does not exist → NOT_FOUND [\"Volume does not exist: 5 NOT_FOUND\"]"),
            c.controller_get_volume(get(&u)).await,
            Code::NotFound,
        );
    }
    let got = r.ok(
        "ControllerGetVolume succeeds",
        c.controller_get_volume(get(&id)).await,
    );
    r.check(
        "ControllerGetVolume: VOLUME_CONDITION advertised → status.volume_condition is set",
        got.as_ref().is_some_and(|g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.volume_condition.is_some())
        }),
        format!("{got:?}"),
    );
    r.finish();
}

/// ControllerModifyVolume.
#[tokio::test(flavor = "multi_thread")]
async fn controller_modify_volume_rules() {
    let (d, mut r, mut c, id) = volume_ground("cfctlmod", "Controller modify").await;
    let rule = required;
    // -- ControllerModifyVolume --------------------------------------------------
    let modify = |id: &str, params: &[(&str, &str)]| ControllerModifyVolumeRequest {
        volume_id: id.into(),
        secrets: HashMap::new(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    r.code(
        &rule("ControllerModifyVolume", "volume_id"),
        c.controller_modify_volume(modify("", &[("readAheadSectors", "256")]))
            .await,
        Code::InvalidArgument,
    );
    for u in unknown_ids() {
        r.code(
            &format!("ControllerModifyVolume: empty mutable_parameters, volume {u} does not exist → NOT_FOUND (an empty map is \"nothing to change\", and the volume is still looked up) [\"Volume does not exist: 5 NOT_FOUND\"]"),
            c.controller_modify_volume(modify(&u, &[])).await,
            Code::NotFound,
        );
        r.code(
            &format!("ControllerModifyVolume: volume {u} does not exist → NOT_FOUND [\"Volume does not exist: 5 NOT_FOUND\"]"),
            c.controller_modify_volume(modify(&u, &[("readAheadSectors", "256")])).await,
            Code::NotFound,
        );
    }
    r.code(
        "ControllerModifyVolume: an unknown mutable parameter → INVALID_ARGUMENT [\"Parameters not supported: 3 INVALID_ARGUMENT\"]",
        c.controller_modify_volume(modify(&id, &[("iops", "5")])).await,
        Code::InvalidArgument,
    );
    let read_ahead = |vg: &str| {
        lvs(vg)
            .find(&id)
            .map(|lv| lv.read_ahead.clone())
            .unwrap_or_default()
    };
    let before = read_ahead(&d.vg);
    r.ok(
        "ControllerModifyVolume: empty mutable_parameters on a volume that exists → OK (a VolumeAttributesClass may carry no parameters)",
        c.controller_modify_volume(modify(&id, &[])).await,
    );
    r.check(
        "ControllerModifyVolume: empty mutable_parameters change nothing",
        read_ahead(&d.vg) == before,
        format!("read-ahead {before:?} → {:?}", read_ahead(&d.vg)),
    );
    for _ in 0..2 {
        r.ok(
            "ControllerModifyVolume: the same call twice → OK both times (idempotent)",
            c.controller_modify_volume(modify(&id, &[("readAheadSectors", "256")]))
                .await,
        );
    }
    r.finish();
}

/// GetCapacity.
#[tokio::test(flavor = "multi_thread")]
async fn get_capacity_rules() {
    let (_d, mut r, mut c, _id) = volume_ground("cfctlcap", "Controller capacity").await;
    // -- GetCapacity ---------------------------------------------------------------
    let cap = r.ok(
        "GetCapacity succeeds",
        c.get_capacity(GetCapacityRequest::default()).await,
    );
    r.check(
        "GetCapacity: available_capacity and maximum_volume_size are not negative, maximum_volume_size ≥ minimum_volume_size",
        cap.as_ref().is_some_and(|g| {
            g.available_capacity >= 0
                && g.maximum_volume_size.unwrap_or(0) >= 0
                && g.maximum_volume_size.unwrap_or(i64::MAX) >= g.minimum_volume_size.unwrap_or(0)
        }),
        format!("{cap:?}"),
    );
    r.finish();
}

/// All pages of a list call, with the rules on each page.
async fn all_pages<F, Fut>(r: &mut Rules, what: &str, max: i32, mut call: F) -> Vec<String>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<String>, String), tonic::Status>>,
{
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..64 {
        let got = call(token.clone()).await;
        let Some((ids, next)) = r.ok(
            &format!("{what} page succeeds"),
            got.map(tonic::Response::new),
        ) else {
            break;
        };
        r.check(
            &format!("{what}: a page holds at most max_entries ({max}) [\"the Plugin MUST NOT return more entries than this number\"]"),
            max == 0 || ids.len() <= max as usize,
            format!("{} entries", ids.len()),
        );
        seen.extend(ids);
        if next.is_empty() {
            return seen;
        }
        token = next;
    }
    r.check(
        &format!("{what}: the pages end"),
        false,
        "more than 64 pages",
    );
    seen
}

/// A driver with five 1 MiB block volumes (sorted ids) and the snapshots
/// the list rules count: cf-snap-0..2 of the first three and one with a
/// 128-byte name of the fourth (sorted ids); the Rules of `what`.
async fn list_ground(
    vg: &str,
    what: &'static str,
) -> (
    TestDriver,
    Rules,
    ControllerClient<Channel>,
    Vec<String>,
    Vec<String>,
) {
    let d = TestDriver::start(vg, 128 * MIB, "").await;
    let mut r = Rules::new(what);
    let mut c = d.controller().await;
    let mut vols = Vec::new();
    for i in 0..5 {
        vols.push(create(&mut r, &mut c, &format!("cf-list-{i}")).await);
    }
    vols.sort();
    let long = "s".repeat(128);
    let names = ["cf-snap-0", "cf-snap-1", "cf-snap-2", &long];
    let mut snaps = Vec::new();
    for (name, v) in names.iter().zip(&vols) {
        let s = r.ok(
            "CreateSnapshot succeeds",
            c.create_snapshot(snap_req(name, v)).await,
        );
        snaps.extend(s.and_then(|s| s.snapshot).map(|s| s.snapshot_id));
    }
    snaps.sort();
    (d, r, c, vols, snaps)
}

/// CreateSnapshot: required fields, unknown sources, idempotency,
/// conflicts, name sizes.
#[tokio::test(flavor = "multi_thread")]
async fn create_snapshot_rules() {
    let d = TestDriver::start("cfsnap", 128 * MIB, "").await;
    let mut r = Rules::new("Controller CreateSnapshot");
    let mut c = d.controller().await;
    let mut vols = Vec::new();
    for i in 0..5 {
        vols.push(create(&mut r, &mut c, &format!("cf-list-{i}")).await);
    }
    vols.sort();

    // -- CreateSnapshot -----------------------------------------------------
    r.code(
        &required("CreateSnapshot", "name"),
        c.create_snapshot(snap_req("", &vols[0])).await,
        Code::InvalidArgument,
    );
    r.code(
        &required("CreateSnapshot", "source_volume_id"),
        c.create_snapshot(snap_req("cf-snap", "")).await,
        Code::InvalidArgument,
    );
    for u in unknown_ids() {
        r.code(
            &format!("CreateSnapshot: source volume {u} does not exist → NOT_FOUND [\"Source volume does not exist\" is not in the table; the general rule for an id that names nothing]"),
            c.create_snapshot(snap_req("cf-snap-u", &u)).await,
            Code::NotFound,
        );
    }
    let mut snaps = Vec::new();
    for (i, v) in vols.iter().enumerate().take(3) {
        let name = format!("cf-snap-{i}");
        let s1 = r.ok(
            "CreateSnapshot succeeds",
            c.create_snapshot(snap_req(&name, v)).await,
        );
        let s2 = r.ok(
            "CreateSnapshot: \"This operation MUST be idempotent\": the same call again → OK",
            c.create_snapshot(snap_req(&name, v)).await,
        );
        let (id1, id2) = (
            s1.and_then(|s| s.snapshot).map(|s| s.snapshot_id),
            s2.and_then(|s| s.snapshot).map(|s| s.snapshot_id),
        );
        r.check(
            "CreateSnapshot: the repeated call returns the same snapshot",
            id1 == id2,
            format!("{id1:?} vs {id2:?}"),
        );
        snaps.extend(id1);
    }
    r.code(
        "CreateSnapshot: same name, another source → ALREADY_EXISTS [\"Snapshot already exists but is incompatible: 6 ALREADY_EXISTS\"]",
        c.create_snapshot(snap_req("cf-snap-0", &vols[4])).await,
        Code::AlreadyExists,
    );
    let long = r
        .ok(
            &format!("CreateSnapshot: a 128-byte name is accepted [{SIZE}]"),
            c.create_snapshot(snap_req(&"s".repeat(128), &vols[3]))
                .await,
        )
        .and_then(|s| s.snapshot);
    if let Some(s) = &long {
        r.check(
            &format!("CreateSnapshot: the snapshot_id is at most 128 bytes [{SIZE}]"),
            s.snapshot_id.len() <= 128,
            format!("{} bytes", s.snapshot_id.len()),
        );
        snaps.push(s.snapshot_id.clone());
    }
    r.code(
        &format!("CreateSnapshot: a 129-byte name → INVALID_ARGUMENT [{SIZE}]"),
        c.create_snapshot(snap_req(&"s".repeat(129), &vols[3]))
            .await,
        Code::InvalidArgument,
    );
    snaps.sort();
    r.finish();
}

/// ListVolumes: pages, tokens.
#[tokio::test(flavor = "multi_thread")]
async fn list_volumes_rules() {
    let (_d, mut r, mut c, vols, _snaps) = list_ground("cflist", "Controller ListVolumes").await;
    // -- ListVolumes ------------------------------------------------------
    for max in [0, 1, 2, 5, 7] {
        let c2 = c.clone();
        let seen = all_pages(
            &mut r,
            &format!("ListVolumes(max_entries={max})"),
            max,
            |token| {
                let mut c = c2.clone();
                async move {
                    let p = c
                        .list_volumes(ListVolumesRequest {
                            max_entries: max,
                            starting_token: token,
                        })
                        .await?
                        .into_inner();
                    let ids = p
                        .entries
                        .iter()
                        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
                        .collect();
                    Ok((ids, p.next_token))
                }
            },
        )
        .await;
        let uniq: BTreeSet<&String> = seen.iter().collect();
        r.check(
            &format!("ListVolumes(max_entries={max}): the pages list every volume once [\"next_token ... the caller MAY use to continue listing\"]"),
            seen.len() == vols.len() && uniq.len() == vols.len() && vols.iter().all(|v| uniq.contains(v)),
            format!("listed {seen:?}, volumes {vols:?}"),
        );
    }
    r.code(
        "ListVolumes: a starting_token the plugin never issued → ABORTED [\"Invalid starting_token: 10 ABORTED\"]",
        c.list_volumes(ListVolumesRequest {
            max_entries: 2,
            starting_token: "not-a-token".into(),
        })
        .await,
        Code::Aborted,
    );
    r.code(
        "ListVolumes: a negative max_entries → INVALID_ARGUMENT [\"The value of this field MUST NOT be negative\"]",
        c.list_volumes(ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await,
        Code::InvalidArgument,
    );
    r.finish();
}

/// ListSnapshots: pages, tokens, filters.
#[tokio::test(flavor = "multi_thread")]
async fn list_snapshots_rules() {
    let (_d, mut r, mut c, _vols, snaps) = list_ground("cflists", "Controller ListSnapshots").await;
    // -- ListSnapshots -------------------------------------------------------
    for max in [0, 1, 3] {
        let c2 = c.clone();
        let seen = all_pages(
            &mut r,
            &format!("ListSnapshots(max_entries={max})"),
            max,
            |token| {
                let mut c = c2.clone();
                async move {
                    let p = c
                        .list_snapshots(ListSnapshotsRequest {
                            max_entries: max,
                            starting_token: token,
                            ..Default::default()
                        })
                        .await?
                        .into_inner();
                    let ids = p
                        .entries
                        .iter()
                        .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
                        .collect();
                    Ok((ids, p.next_token))
                }
            },
        )
        .await;
        let mut sorted = seen.clone();
        sorted.sort();
        r.check(
            &format!("ListSnapshots(max_entries={max}): the pages list every snapshot once"),
            sorted == snaps,
            format!("listed {seen:?}, snapshots {snaps:?}"),
        );
    }
    r.code(
        "ListSnapshots: a starting_token the plugin never issued → ABORTED [\"Invalid starting_token: 10 ABORTED\"]",
        c.list_snapshots(ListSnapshotsRequest {
            max_entries: 1,
            starting_token: "not-a-token".into(),
            ..Default::default()
        })
        .await,
        Code::Aborted,
    );
    for (what, q) in [
        (
            "a snapshot_id that names nothing",
            ListSnapshotsRequest {
                snapshot_id: naming::snapshot_lv_name_for("never"),
                ..Default::default()
            },
        ),
        (
            "a source_volume_id that names nothing",
            ListSnapshotsRequest {
                source_volume_id: unknown_ids()[0].clone(),
                ..Default::default()
            },
        ),
    ] {
        let got = r.ok(
            &format!("ListSnapshots with {what} → OK"),
            c.list_snapshots(q).await,
        );
        r.check(
            &format!("ListSnapshots with {what} → no entries [\"If no snapshots match the filter, the Plugin MUST return an empty list\"... not NOT_FOUND]"),
            got.as_ref().is_some_and(|g| g.entries.is_empty()),
            format!("{got:?}"),
        );
    }
    let one = r.ok(
        "ListSnapshots by snapshot_id succeeds",
        c.list_snapshots(ListSnapshotsRequest {
            snapshot_id: snaps[0].clone(),
            ..Default::default()
        })
        .await,
    );
    r.check(
        "ListSnapshots by snapshot_id lists that snapshot alone",
        one.as_ref().is_some_and(|g| {
            g.entries.len() == 1
                && g.entries[0].snapshot.as_ref().map(|s| &s.snapshot_id) == Some(&snaps[0])
        }),
        format!("{one:?}"),
    );
    r.finish();
}

/// DeleteSnapshot: required fields, unknown ids, idempotency; and all
/// gone after.
#[tokio::test(flavor = "multi_thread")]
async fn delete_snapshot_rules() {
    let (d, mut r, mut c, vols, snaps) =
        list_ground("cfsnapdel", "Controller DeleteSnapshot").await;
    // -- DeleteSnapshot ----------------------------------------------------------
    let dels = |id: &str| DeleteSnapshotRequest {
        snapshot_id: id.into(),
        secrets: HashMap::new(),
    };
    r.code(
        &required("DeleteSnapshot", "snapshot_id"),
        c.delete_snapshot(dels("")).await,
        Code::InvalidArgument,
    );
    for u in [
        naming::snapshot_lv_name_for("never"),
        "fake-snap-id".to_string(),
    ] {
        r.ok(
            &format!("DeleteSnapshot: snapshot {u} does not exist → OK [\"If a snapshot corresponding to the specified snapshot_id does not exist ... the Plugin MUST reply 0 OK\"]"),
            c.delete_snapshot(dels(&u)).await,
        );
    }
    for s in &snaps {
        for _ in 0..2 {
            r.ok(
                "DeleteSnapshot: \"This operation MUST be idempotent\" → OK, twice",
                c.delete_snapshot(dels(s)).await,
            );
        }
    }
    for v in &vols {
        r.ok("DeleteVolume succeeds", c.delete_volume(del(v)).await);
    }
    r.check(
        "Deleting every snapshot and volume leaves no thin LV",
        thin_count(&d.vg) == 0,
        format!("{} thin LVs", thin_count(&d.vg)),
    );
    r.finish();
}
