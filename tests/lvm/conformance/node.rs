//! Node RPCs: required fields, idempotency, NOT_FOUND and ALREADY_EXISTS,
//! the SINGLE_NODE_* publish table, paths longer than 128 bytes.

use std::path::{Path, PathBuf};

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::AccessMode;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use super::{required, Rules, PATH_MIN, SIZE};
use crate::fixtures::{
    block_cap, create, mount_cap, mount_flags, publish_req, s, stage_req, unpublish_req,
    unstage_req, Kubelet,
};
use crate::harness::{TestDriver, MIB};

fn with_mode(mut cap: VolumeCapability, mode: Mode) -> VolumeCapability {
    cap.access_mode = Some(AccessMode { mode: mode as i32 });
    cap
}

fn stats_req(id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

fn expand_req(id: &str, path: &str) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

/// A directory under the kubelet root whose path is longer than 128 bytes.
fn long_dir(k: &Kubelet, kind: &str, name: &str) -> PathBuf {
    let p = k
        .path(kind)
        .join(format!("{name}-{}", "l".repeat(100)))
        .join("m".repeat(40));
    std::fs::create_dir_all(&p).unwrap();
    assert!(p.as_os_str().len() > 128, "{}", p.display());
    p
}

/// The publish table of the spec for one access type: `staged` is the
/// staging path of a staged volume `id`, `cap` its capability.
async fn publish_table(
    r: &mut Rules,
    n: &mut NodeClient<Channel>,
    k: &Kubelet,
    id: &str,
    staged: &Path,
    cap: &VolumeCapability,
    kind: &str,
) {
    let table = "the SINGLE_NODE_MULTI_WRITER table of NodePublishVolume";
    let snsw = with_mode(cap.clone(), Mode::SingleNodeSingleWriter);
    let snmw = with_mode(cap.clone(), Mode::SingleNodeMultiWriter);
    let snw = with_mode(cap.clone(), Mode::SingleNodeWriter);
    let t1 = long_dir(k, "pods", &format!("{kind}-t1")).join("vol");
    let t2 = long_dir(k, "pods", &format!("{kind}-t2")).join("vol");
    let t3 = long_dir(k, "pods", &format!("{kind}-t3")).join("vol");
    let publish =
        |t: &Path, cap: &VolumeCapability, ro: bool| publish_req(id, staged, t, cap.clone(), ro);

    // SINGLE_NODE_SINGLE_WRITER.
    r.ok(
        &format!("NodePublishVolume ({kind}, SINGLE_NODE_SINGLE_WRITER) at a {}-byte target succeeds [{PATH_MIN}]", t1.as_os_str().len()),
        n.node_publish_volume(publish(&t1, &snsw, false)).await,
    );
    r.ok(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_SINGLE_WRITER, T1=T2, P1=P2 → OK (idempotent) [{table}]"),
        n.node_publish_volume(publish(&t1, &snsw, false)).await,
    );
    r.code(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_SINGLE_WRITER, T1=T2, P1!=P2 (readonly) → ALREADY_EXISTS [{table}]"),
        n.node_publish_volume(publish(&t1, &snsw, true)).await,
        Code::AlreadyExists,
    );
    r.code(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_SINGLE_WRITER, T1!=T2, P1=P2 → FAILED_PRECONDITION [{table}]"),
        n.node_publish_volume(publish(&t2, &snsw, false)).await,
        Code::FailedPrecondition,
    );
    r.code(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_SINGLE_WRITER, T1!=T2, P1!=P2 (readonly) → FAILED_PRECONDITION [{table}]"),
        n.node_publish_volume(publish(&t2, &snsw, true)).await,
        Code::FailedPrecondition,
    );
    r.code(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_SINGLE_WRITER, T1!=T2, P1!=P2 (second asks SINGLE_NODE_MULTI_WRITER) → FAILED_PRECONDITION [{table}]"),
        n.node_publish_volume(publish(&t2, &snmw, false)).await,
        Code::FailedPrecondition,
    );
    for t in [&t1, &t2] {
        r.ok(
            &format!("NodeUnpublishVolume ({kind}) succeeds"),
            n.node_unpublish_volume(unpublish_req(id, t)).await,
        );
    }

    // SINGLE_NODE_MULTI_WRITER.
    r.ok(
        &format!("NodePublishVolume ({kind}, SINGLE_NODE_MULTI_WRITER) succeeds"),
        n.node_publish_volume(publish(&t1, &snmw, false)).await,
    );
    r.ok(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_MULTI_WRITER, T1=T2, P1=P2 → OK (idempotent) [{table}]"),
        n.node_publish_volume(publish(&t1, &snmw, false)).await,
    );
    r.code(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_MULTI_WRITER, T1=T2, P1!=P2 (readonly) → ALREADY_EXISTS [{table}]"),
        n.node_publish_volume(publish(&t1, &snmw, true)).await,
        Code::AlreadyExists,
    );
    r.ok(
        &format!(
            "NodePublishVolume ({kind}): SINGLE_NODE_MULTI_WRITER, T1!=T2, P1=P2 → OK [{table}]"
        ),
        n.node_publish_volume(publish(&t2, &snmw, false)).await,
    );
    r.ok(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_MULTI_WRITER, T1!=T2, P1!=P2 (readonly) → OK [{table}]"),
        n.node_publish_volume(publish(&t3, &snmw, true)).await,
    );
    for t in [&t1, &t2, &t3] {
        for _ in 0..2 {
            r.ok(
                &format!("NodeUnpublishVolume ({kind}): \"This operation MUST be idempotent\" → OK, twice"),
                n.node_unpublish_volume(unpublish_req(id, t)).await,
            );
        }
    }

    // SINGLE_NODE_WRITER, which a plugin that supports the new modes
    // "MUST accept and allow".
    r.ok(
        &format!("NodePublishVolume ({kind}, SINGLE_NODE_WRITER) is accepted [\"Plugins MUST accept and allow use of the SINGLE_NODE_WRITER access mode\"]"),
        n.node_publish_volume(publish(&t1, &snw, false)).await,
    );
    r.ok(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_WRITER, T1=T2, P1=P2 → OK (idempotent)"),
        n.node_publish_volume(publish(&t1, &snw, false)).await,
    );
    r.code(
        &format!("NodePublishVolume ({kind}): SINGLE_NODE_WRITER, T1=T2, P1!=P2 (readonly) → ALREADY_EXISTS [\"Volume published but is incompatible: 6 ALREADY_EXISTS\"]"),
        n.node_publish_volume(publish(&t1, &snw, true)).await,
        Code::AlreadyExists,
    );
    r.ok(
        &format!("NodeUnpublishVolume ({kind}) succeeds"),
        n.node_unpublish_volume(unpublish_req(id, &t1)).await,
    );
}

/// What the node rules start from (a test binds `k` and `d` even when it
/// does not use them: a field left to `..` is dropped at once, and with it
/// the kubelet directory or the driver): a driver on a kubelet directory of its
/// own, their Rules, a 16 MiB ext4 and an 8 MiB block volume (unstaged),
/// staging paths longer than 128 bytes for each, a target, and two ids
/// that name nothing.
struct NodeGround {
    k: Kubelet,
    d: TestDriver,
    r: Rules,
    n: NodeClient<Channel>,
    c: ControllerClient<Channel>,
    fs_id: String,
    blk_id: String,
    staging: PathBuf,
    blk_staging: PathBuf,
    target: PathBuf,
    unknown: [String; 2],
}

async fn node_ground(name: &str, what: &'static str) -> NodeGround {
    let k = Kubelet::new(name);
    let d = TestDriver::start(name, 128 * MIB, &k.extra()).await;
    let r = Rules::new(what);
    let n = d.node().await;
    let c = d.controller().await;
    let fs_id = create(&d, "cf-node-fs", 16 * MIB, mount_cap("ext4")).await;
    let blk_id = create(&d, "cf-node-blk", 8 * MIB, block_cap()).await;
    let staging = long_dir(&k, "staging", "fs");
    let blk_staging = long_dir(&k, "staging", "blk");
    let target = k.target("req");
    let unknown = [
        naming::lv_name_for("never-created"),
        "fake-vol-id-01".to_string(),
    ];
    NodeGround {
        k,
        d,
        r,
        n,
        c,
        fs_id,
        blk_id,
        staging,
        blk_staging,
        target,
        unknown,
    }
}

/// [`node_ground`] with the ext4 volume staged at its long staging path.
async fn staged_node_ground(name: &str, what: &'static str) -> NodeGround {
    let mut g = node_ground(name, what).await;
    g.n.node_stage_volume(stage_req(&g.fs_id, &g.staging, mount_cap("ext4")))
        .await
        .expect("NodeStageVolume of the ext4 volume");
    g
}

/// NodeGetInfo and NodeGetCapabilities.
#[tokio::test(flavor = "multi_thread")]
async fn node_info_and_capabilities_rules() {
    let d = TestDriver::start("cfnodei", 64 * MIB, "").await;
    let mut r = Rules::new("Node info");
    let mut n = d.node().await;
    // -- NodeGetInfo, NodeGetCapabilities ---------------------------------
    let info = r.ok(
        "NodeGetInfo succeeds",
        n.node_get_info(NodeGetInfoRequest {}).await,
    );
    r.check(
        &format!("NodeGetInfo: node_id is REQUIRED and at most 128 bytes [{SIZE}]"),
        info.as_ref()
            .is_some_and(|i| !i.node_id.is_empty() && i.node_id.len() <= 128),
        format!("{info:?}"),
    );
    r.ok(
        "NodeGetCapabilities succeeds",
        n.node_get_capabilities(NodeGetCapabilitiesRequest {}).await,
    );
    r.finish();
}

/// Required fields, with ids that name nothing.
#[tokio::test(flavor = "multi_thread")]
async fn node_required_field_rules() {
    let NodeGround {
        k: _k,
        d: _d,
        mut r,
        mut n,
        staging,
        target,
        ..
    } = node_ground("cfnoder", "Node required fields").await;
    // -- Required fields, with ids that name nothing ------------------------
    r.code(
        &required("NodeStageVolume", "volume_id"),
        n.node_stage_volume(stage_req("", &staging, mount_cap("ext4")))
            .await,
        Code::InvalidArgument,
    );
    r.code(
        &required("NodeUnstageVolume", "volume_id"),
        n.node_unstage_volume(unstage_req("", &staging)).await,
        Code::InvalidArgument,
    );
    r.code(
        &required("NodePublishVolume", "volume_id"),
        n.node_publish_volume(publish_req("", &staging, &target, mount_cap("ext4"), false))
            .await,
        Code::InvalidArgument,
    );
    r.code(
        &required("NodeUnpublishVolume", "volume_id"),
        n.node_unpublish_volume(unpublish_req("", &target)).await,
        Code::InvalidArgument,
    );
    r.code(
        &required("NodeGetVolumeStats", "volume_id"),
        n.node_get_volume_stats(stats_req("", &s(&staging))).await,
        Code::InvalidArgument,
    );
    r.code(
        &required("NodeExpandVolume", "volume_id"),
        n.node_expand_volume(expand_req("", &s(&staging))).await,
        Code::InvalidArgument,
    );
    r.finish();
}

/// Ids that name no volume, and volumes not staged or published where asked.
#[tokio::test(flavor = "multi_thread")]
async fn node_unknown_volume_rules() {
    let NodeGround {
        k: _k,
        d: _d,
        mut r,
        mut n,
        fs_id,
        staging,
        target,
        unknown,
        ..
    } = node_ground("cfnodeu", "Node unknown volumes").await;
    let empty = PathBuf::new();
    for u in unknown.iter() {
        let also = format!("(volume {u} unknown)");
        r.code(
            &format!(
                "{} {also}",
                required("NodeStageVolume", "staging_target_path")
            ),
            n.node_stage_volume(stage_req(u, &empty, mount_cap("ext4")))
                .await,
            Code::InvalidArgument,
        );
        let mut q = stage_req(u, &staging, mount_cap("ext4"));
        q.volume_capability = None;
        r.code(
            &format!(
                "{} {also}",
                required("NodeStageVolume", "volume_capability")
            ),
            n.node_stage_volume(q).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!(
                "{} {also}",
                required("NodeUnstageVolume", "staging_target_path")
            ),
            n.node_unstage_volume(unstage_req(u, &empty)).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("{} {also}", required("NodePublishVolume", "target_path")),
            n.node_publish_volume(publish_req(u, &staging, &empty, mount_cap("ext4"), false))
                .await,
            Code::InvalidArgument,
        );
        let mut q = publish_req(u, &staging, &target, mount_cap("ext4"), false);
        q.volume_capability = None;
        r.code(
            &format!(
                "{} {also}",
                required("NodePublishVolume", "volume_capability")
            ),
            n.node_publish_volume(q).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("{} {also}", required("NodeUnpublishVolume", "target_path")),
            n.node_unpublish_volume(unpublish_req(u, &empty)).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("{} {also}", required("NodeGetVolumeStats", "volume_path")),
            n.node_get_volume_stats(stats_req(u, "")).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("{} {also}", required("NodeExpandVolume", "volume_path")),
            n.node_expand_volume(expand_req(u, "")).await,
            Code::InvalidArgument,
        );
        // Complete requests for a volume that does not exist.
        let nf = |rpc: &str| {
            format!("{rpc}: volume {u} does not exist → NOT_FOUND [\"Volume does not exist: 5 NOT_FOUND\"]")
        };
        r.code(
            &nf("NodeStageVolume"),
            n.node_stage_volume(stage_req(u, &staging, mount_cap("ext4")))
                .await,
            Code::NotFound,
        );
        r.code(
            &nf("NodeUnstageVolume"),
            n.node_unstage_volume(unstage_req(u, &staging)).await,
            Code::NotFound,
        );
        r.code(
            &nf("NodePublishVolume"),
            n.node_publish_volume(publish_req(u, &staging, &target, mount_cap("ext4"), false))
                .await,
            Code::NotFound,
        );
        r.code(
            &nf("NodeUnpublishVolume"),
            n.node_unpublish_volume(unpublish_req(u, &target)).await,
            Code::NotFound,
        );
        r.code(
            &nf("NodeGetVolumeStats"),
            n.node_get_volume_stats(stats_req(u, &s(&staging))).await,
            Code::NotFound,
        );
        r.code(
            &nf("NodeExpandVolume"),
            n.node_expand_volume(expand_req(u, &s(&staging))).await,
            Code::NotFound,
        );
    }
    r.code(
        &format!("NodeStageVolume: a 129-byte volume_id → INVALID_ARGUMENT [{SIZE}]"),
        n.node_stage_volume(stage_req(&"v".repeat(129), &staging, mount_cap("ext4")))
            .await,
        Code::InvalidArgument,
    );
    r.code(
        "NodePublishVolume: staging_target_path not set → FAILED_PRECONDITION [\"Staging target path not set: 9 FAILED_PRECONDITION\"]",
        n.node_publish_volume(publish_req(&fs_id, &empty, &target, mount_cap("ext4"), false)).await,
        Code::FailedPrecondition,
    );
    r.ok(
        "NodeUnstageVolume: a volume not staged at the path → OK [\"If the volume corresponding to the volume_id is not staged to the staging_target_path, the Plugin MUST reply 0 OK\"]",
        n.node_unstage_volume(unstage_req(&fs_id, &staging)).await,
    );
    r.finish();
}

/// NodeStageVolume and NodeGetVolumeStats at a staging path longer than 128 bytes.
#[tokio::test(flavor = "multi_thread")]
async fn node_stage_rules() {
    let NodeGround {
        k: _k,
        d: _d,
        mut r,
        mut n,
        fs_id,
        staging,
        blk_staging,
        ..
    } = node_ground("cfnodes", "Node stage").await;
    // -- Stage, with a staging path longer than 128 bytes ---------------------
    let len = staging.as_os_str().len();
    r.ok(
        &format!("NodeStageVolume at a {len}-byte staging_target_path succeeds [{PATH_MIN}]"),
        n.node_stage_volume(stage_req(&fs_id, &staging, mount_cap("ext4")))
            .await,
    );
    r.ok(
        "NodeStageVolume: \"This operation MUST be idempotent\": the same call again → OK",
        n.node_stage_volume(stage_req(&fs_id, &staging, mount_cap("ext4")))
            .await,
    );
    r.code(
        "NodeStageVolume: staged at the same path with other mount flags → ALREADY_EXISTS [\"Volume published but is incompatible: 6 ALREADY_EXISTS\"]",
        n.node_stage_volume(stage_req(&fs_id, &staging, mount_flags("ext4", &["noatime"]))).await,
        Code::AlreadyExists,
    );
    r.code(
        "NodeStageVolume: a capability the volume does not support (block for a filesystem volume) → FAILED_PRECONDITION [\"Exceeds capabilities: 9 FAILED_PRECONDITION\"]",
        n.node_stage_volume(stage_req(&fs_id, &blk_staging, block_cap())).await,
        Code::FailedPrecondition,
    );
    let st = r.ok(
        &format!("NodeGetVolumeStats at the {len}-byte staging path succeeds [{PATH_MIN}]"),
        n.node_get_volume_stats(stats_req(&fs_id, &s(&staging)))
            .await,
    );
    r.check(
        "NodeGetVolumeStats: VOLUME_CONDITION advertised → volume_condition is set, and normal on a healthy volume",
        st.as_ref().is_some_and(|s| s.volume_condition.as_ref().is_some_and(|c| !c.abnormal)),
        format!("{st:?}"),
    );
    r.code(
        "NodeGetVolumeStats: the volume is not at volume_path → NOT_FOUND [\"Volume does not exist: 5 NOT_FOUND: ... does not exist on specified volume_path\"]",
        n.node_get_volume_stats(stats_req(&fs_id, &s(&blk_staging))).await,
        Code::NotFound,
    );
    r.code(
        "NodeGetVolumeStats: a relative volume_path names no place the volume is → NOT_FOUND",
        n.node_get_volume_stats(stats_req(&fs_id, "some/path"))
            .await,
        Code::NotFound,
    );
    r.finish();
}

/// NodeExpandVolume of a staged volume, twice.
#[tokio::test(flavor = "multi_thread")]
async fn node_expand_rules() {
    let NodeGround {
        k: _k,
        d: _d,
        mut r,
        mut n,
        mut c,
        fs_id,
        staging,
        ..
    } = staged_node_ground("cfnodex", "Node expand").await;
    // -- NodeExpandVolume, twice ----------------------------------------------
    c.controller_expand_volume(ControllerExpandVolumeRequest {
        volume_id: fs_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: (24 * MIB) as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut e = Vec::new();
    for _ in 0..2 {
        let mut q = expand_req(&fs_id, &s(&staging));
        q.staging_target_path = s(&staging);
        q.capacity_range = Some(CapacityRange {
            required_bytes: (24 * MIB) as i64,
            limit_bytes: 0,
        });
        e.push(r.ok(
            "NodeExpandVolume: \"This operation MUST be idempotent\" → OK, twice",
            n.node_expand_volume(q).await,
        ));
    }
    r.check(
        "NodeExpandVolume: the repeated call reports the same capacity",
        e[0].as_ref().map(|x| x.capacity_bytes) == e[1].as_ref().map(|x| x.capacity_bytes),
        format!("{e:?}"),
    );
    r.finish();
}

/// The publish table, for a filesystem and for a block volume; unstage, twice; nothing left mounted.
#[tokio::test(flavor = "multi_thread")]
async fn node_publish_and_unstage_rules() {
    let NodeGround {
        d: _d,
        k,
        mut r,
        mut n,
        fs_id,
        blk_id,
        staging,
        blk_staging,
        ..
    } = staged_node_ground("cfnodep", "Node publish").await;
    // -- The publish table, for a filesystem and for a block volume ------------
    publish_table(
        &mut r,
        &mut n,
        &k,
        &fs_id,
        &staging,
        &mount_cap("ext4"),
        "mount",
    )
    .await;
    r.ok(
        "NodeStageVolume (block) succeeds",
        n.node_stage_volume(stage_req(&blk_id, &blk_staging, block_cap()))
            .await,
    );
    publish_table(
        &mut r,
        &mut n,
        &k,
        &blk_id,
        &blk_staging,
        &block_cap(),
        "block",
    )
    .await;

    // -- Unstage, twice -----------------------------------------------------------
    for (id, st) in [(&fs_id, &staging), (&blk_id, &blk_staging)] {
        for _ in 0..2 {
            r.ok(
                "NodeUnstageVolume: \"This operation MUST be idempotent\" → OK, twice",
                n.node_unstage_volume(unstage_req(id, st)).await,
            );
        }
    }
    let left = crate::fixtures::mounts_under(k.root.path());
    r.check(
        "Nothing stays mounted under the kubelet root",
        left.is_empty(),
        format!("{left:?}"),
    );
    r.finish();
}
