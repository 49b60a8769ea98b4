//! Device classes (issue 23): two loop-backed pools on one node, the
//! top-level one (`default`) and `fast`, each serving its own volumes,
//! and one class lost without the other.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::NodeReclaimSpaceRequest;
use tonic::Code;

use crate::fixtures::{
    create, create_req, create_volume, mount_cap, publish_req, stage_req, tpcsi, unpublish_req,
    unstage_req, Kubelet,
};
use crate::harness::{lvs, try_lvm, SecondPool, TestDriver, MIB};

fn in_class(class: &str, mut req: CreateVolumeRequest) -> CreateVolumeRequest {
    req.parameters
        .insert("deviceClass".to_string(), class.to_string());
    req
}

fn capacity_req(class: Option<&str>) -> GetCapacityRequest {
    GetCapacityRequest {
        parameters: class
            .map(|c| HashMap::from([("deviceClass".to_string(), c.to_string())]))
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// Every volume id ListVolumes pages through, one volume a page.
async fn list_all(d: &TestDriver) -> Vec<String> {
    let mut c = d.controller().await;
    let (mut ids, mut token) = (Vec::new(), String::new());
    loop {
        let r = c
            .list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        ids.extend(
            r.entries
                .iter()
                .map(|e| e.volume.clone().unwrap().volume_id),
        );
        token = r.next_token;
        if token.is_empty() {
            return ids;
        }
    }
}

async fn stage_publish(d: &TestDriver, k: &Kubelet, id: &str, name: &str) -> (PathBuf, PathBuf) {
    let (staging, target) = (k.staging(name), k.target(name));
    let mut n = d.node().await;
    n.node_stage_volume(stage_req(id, &staging, mount_cap("")))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(id, &staging, &target, mount_cap(""), false))
        .await
        .unwrap();
    (staging, target)
}

async fn unpublish_unstage(d: &TestDriver, id: &str, staging: &Path, target: &Path) {
    let mut n = d.node().await;
    n.node_unpublish_volume(unpublish_req(id, target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(id, staging))
        .await
        .unwrap();
}

fn fs_of(target: &Path) -> String {
    let mi = thinpool_csi::mountinfo::MountInfo::read().unwrap();
    mi.top_mount_at(target)
        .map(|m| m.fs_type.clone())
        .unwrap_or_default()
}

/// Two loop-backed classes on one node: the top-level pool (`default`)
/// and `fast` (xfs by default, a larger pool).
struct TwoClasses {
    k: Kubelet,
    d: TestDriver,
    fast_vg: String,
    _fast: SecondPool,
}

async fn two_classes() -> TwoClasses {
    let k = Kubelet::new("cls");
    let fast = SecondPool::new("clsfast");
    let (fast_vg, fast_file) = (fast.vg.clone(), fast.file.clone());
    let extra = format!(
        "{}device_classes = [{{ name = \"fast\", volume_group = \"{fast_vg}\", default_fs_type = \"xfs\", overprovision_ratio = 10, \
         loop_pool = {{ backing_file = \"{}\", size = {} }} }}]\n",
        k.extra(),
        fast_file.display(),
        160 * MIB
    );
    let d = TestDriver::start("cls", 96 * MIB, &extra).await;
    TwoClasses {
        k,
        d,
        fast_vg,
        _fast: fast,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_classes_serve_their_own_volumes_and_survive_each_other() {
    let mut t = two_classes().await;
    let (fast_id, plain_id) = creates_go_to_the_class_named(&t).await;
    capacity_conditions_and_tpcsi_per_class(&t, &fast_id).await;
    let (snap_id, size) = a_volume_lives_in_its_class(&t, &fast_id).await;
    let (restored, clone) = copies_stay_in_their_class(&t, &fast_id, &snap_id, size).await;
    listed_across_a_restart_and_deleted_in_their_class(
        &mut t,
        &[&fast_id, &plain_id, &restored, &clone],
        &plain_id,
        &[&restored, &clone],
    )
    .await;
    a_lost_class_leaves_the_other_serving(&t).await;
}

/// CreateVolume picks the class by deviceClass; an unknown one is refused.
async fn creates_go_to_the_class_named(t: &TwoClasses) -> (String, String) {
    let (d, fast_vg) = (&t.d, &t.fast_vg);
    let mut c = d.controller().await;
    // CreateVolume picks the class by deviceClass; its id says so, and its
    // LV is in that class's pool under the same name.
    let fast_id = create_volume(
        &mut c,
        in_class("fast", create_req("pvc-fast", 32 * MIB, mount_cap(""))),
    )
    .await
    .volume_id;
    assert!(fast_id.starts_with("fast.csi-"), "{fast_id}");
    let plain_id = create(d, "pvc-plain", 16 * MIB, mount_cap("")).await;
    assert!(plain_id.starts_with("csi-"), "{plain_id}");
    assert!(lvs(fast_vg)
        .find(&fast_id)
        .is_some_and(|lv| lv.pool == "pool"));
    assert!(lvs(&d.vg).find(&fast_id).is_none());
    assert!(lvs(&d.vg).find(&plain_id).is_some());

    // An unknown class is refused, naming the classes this node has.
    let e = c
        .create_volume(in_class("ssd", create_req("pvc-x", MIB, mount_cap(""))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("\"ssd\"") && e.message().contains("fast"),
        "{e:?}"
    );
    let e = c.get_capacity(capacity_req(Some("ssd"))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    (fast_id, plain_id)
}

/// GetCapacity per class, the volume's condition and tpcsi name the class.
async fn capacity_conditions_and_tpcsi_per_class(t: &TwoClasses, fast_id: &str) {
    let (d, fast_vg) = (&t.d, &t.fast_vg);
    let mut c = d.controller().await;
    // GetCapacity per class, each as that class's `lvs` shows it: the
    // larger loop file gives the fast class the larger pool.
    let fast_cap = c
        .get_capacity(capacity_req(Some("fast")))
        .await
        .unwrap()
        .into_inner();
    let plain_cap = c
        .get_capacity(capacity_req(None))
        .await
        .unwrap()
        .into_inner();
    let fast_pool = lvs(fast_vg).find("pool").unwrap().size;
    let plain_pool = lvs(&d.vg).find("pool").unwrap().size;
    assert!(fast_pool > plain_pool, "{fast_pool} vs {plain_pool}");
    assert!(
        fast_cap.available_capacity as u64 <= fast_pool
            && fast_cap.available_capacity > plain_cap.available_capacity,
        "fast {fast_cap:?}, default {plain_cap:?}, pools {fast_pool} / {plain_pool}"
    );

    // tpcsi shows the class: capacity of the one asked about, and a
    // class column in the list.
    let out = tpcsi(d, &["--json", "capacity", "--param", "deviceClass=fast"]);
    assert!(out.status.success(), "{out:?}");
    let cap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cap["device_class"], "fast", "{cap}");
    assert_eq!(
        cap["available_capacity"].as_i64(),
        Some(fast_cap.available_capacity),
        "{cap}"
    );
    // Conditions name the class.
    let cond = d.condition(fast_id).await;
    assert!(
        !cond.abnormal && cond.message.contains("device class fast"),
        "{cond:?}"
    );
    let out = tpcsi(d, &["list"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(fast_id) && l.contains(" fast ")),
        "{table}"
    );
    // `--class` keeps one class's volumes: the id's prefix, none for
    // `default`.
    let listed = |class: &str| -> Vec<String> {
        let out = tpcsi(d, &["--json", "list", "--class", class]);
        assert!(out.status.success(), "{out:?}");
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        list["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["volume_id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed("fast"), vec![fast_id.to_string()]);
    let plain = listed("default");
    assert!(
        !plain.is_empty() && plain.iter().all(|id| id.starts_with("csi-")),
        "{plain:?}"
    );
    let out = tpcsi(d, &["list", "--class", "slow"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no volumes in device class slow\n"
    );
    // Both classes up: probe is ready, and names each class's pool.
    let out = tpcsi(d, &["probe"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        table.contains("pool of class default (default): takes new volumes")
            && table.contains("pool of class fast: takes new volumes"),
        "{table}"
    );
}

/// Stage, expand, reclaim and snapshot in the fast class; the snapshot's
/// id and the grown size.
async fn a_volume_lives_in_its_class(t: &TwoClasses, fast_id: &str) -> (String, u64) {
    let (d, k, fast_vg) = (&t.d, &t.k, &t.fast_vg);
    let mut c = d.controller().await;
    // Stage takes the class's default filesystem (xfs for fast); data
    // written there survives expand, snapshot and restore in the class.
    let (staging, target) = stage_publish(d, k, fast_id, "fast").await;
    assert_eq!(fs_of(&target), "xfs");
    std::fs::write(target.join("data"), b"in the fast class").unwrap();
    let grown = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: fast_id.to_string(),
            capacity_range: Some(CapacityRange {
                required_bytes: (48 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(grown.capacity_bytes as u64 >= 48 * MIB);
    assert_eq!(
        lvs(fast_vg).find(fast_id).unwrap().size,
        grown.capacity_bytes as u64
    );
    let mut r = ReclaimSpaceNodeClient::connect(d.addons_uri())
        .await
        .unwrap();
    r.node_reclaim_space(NodeReclaimSpaceRequest {
        volume_id: fast_id.to_string(),
        volume_path: target.display().to_string(),
        ..Default::default()
    })
    .await
    .expect("NodeReclaimSpace in the fast class");
    nix::unistd::sync();
    let snap = c
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: fast_id.to_string(),
            name: "snap-fast".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.snapshot_id.starts_with("fast.snap-"), "{snap:?}");
    assert!(lvs(fast_vg).find(&snap.snapshot_id).is_some());
    // tpcsi's snapshot list shows its class, and `--class` keeps it or
    // leaves it out.
    let out = tpcsi(d, &["snapshot", "list", "--class", "fast"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&snap.snapshot_id) && l.contains(" fast ")),
        "{table}"
    );
    let out = tpcsi(d, &["--json", "snapshot", "list", "--class", "default"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        list["snapshots"].as_array().unwrap().iter().all(
            |s| s["device_class"] == "default" && s["snapshot_id"] != snap.snapshot_id.as_str()
        ),
        "{list}"
    );
    unpublish_unstage(d, fast_id, &staging, &target).await;

    (snap.snapshot_id, grown.capacity_bytes as u64)
}

/// A restore and a clone stay in their class; across classes they are
/// refused.
async fn copies_stay_in_their_class(
    t: &TwoClasses,
    fast_id: &str,
    snap_id: &str,
    size: u64,
) -> (String, String) {
    let (d, k) = (&t.d, &t.k);
    let mut c = d.controller().await;
    // A copy stays in its class: into another one it is refused.
    let from_snap = |class: Option<&str>, name: &str| {
        let mut req = create_req(name, size, mount_cap(""));
        if let Some(cl) = class {
            req = in_class(cl, req);
        }
        req.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: snap_id.to_string(),
                },
            )),
        });
        req
    };
    let e = c
        .create_volume(from_snap(None, "pvc-cross"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("device class"), "{e:?}");
    let restored = create_volume(&mut c, from_snap(Some("fast"), "pvc-restored"))
        .await
        .volume_id;
    assert!(restored.starts_with("fast.csi-"), "{restored}");
    let (st2, t2) = stage_publish(d, k, &restored, "restored").await;
    assert_eq!(
        std::fs::read(t2.join("data")).unwrap(),
        b"in the fast class"
    );
    unpublish_unstage(d, &restored, &st2, &t2).await;

    // A clone of a volume stays in its class too.
    let clone_of = |class: Option<&str>, name: &str| {
        let mut req = create_req(name, size, mount_cap(""));
        if let Some(cl) = class {
            req = in_class(cl, req);
        }
        req.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: fast_id.to_string(),
                },
            )),
        });
        req
    };
    let e = c
        .create_volume(clone_of(None, "pvc-cross-clone"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let clone = create_volume(&mut c, clone_of(Some("fast"), "pvc-clone"))
        .await
        .volume_id;
    assert!(clone.starts_with("fast.csi-"), "{clone}");
    let (st3, t3) = stage_publish(d, k, &clone, "clone").await;
    assert_eq!(
        std::fs::read(t3.join("data")).unwrap(),
        b"in the fast class"
    );
    unpublish_unstage(d, &clone, &st3, &t3).await;

    (restored, clone)
}

/// ListVolumes pages through both classes, each volume once, and so after
/// a restart; deletes go to the class, an unknown class is refused.
async fn listed_across_a_restart_and_deleted_in_their_class(
    t: &mut TwoClasses,
    all: &[&String],
    plain_id: &str,
    fast_copies: &[&String],
) {
    // ListVolumes pages through both classes, each volume once, and so
    // after a restart.
    let fast_vg = t.fast_vg.clone();
    let d = &mut t.d;
    let want: BTreeSet<String> = all.iter().map(|s| s.to_string()).collect();
    let listed = list_all(d).await;
    assert_eq!(listed.len(), all.len(), "{listed:?}");
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), want);
    d.restart().await;
    let listed = list_all(d).await;
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), want);
    let mut c = d.controller().await;

    // Delete in the class; a class unknown here is refused, not "gone".
    let e = c
        .delete_volume(DeleteVolumeRequest {
            volume_id: format!("gone.{plain_id}"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    for id in fast_copies {
        c.delete_volume(DeleteVolumeRequest {
            volume_id: id.to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
        assert!(lvs(&fast_vg).find(id).is_none());
    }
}

/// The fast class's VG vanishes: UNAVAILABLE there, the default serves.
async fn a_lost_class_leaves_the_other_serving(t: &TwoClasses) {
    let (d, fast_vg) = (&t.d, &t.fast_vg);
    let mut c = d.controller().await;
    // The fast class's VG vanishes behind the driver's back: its calls
    // answer UNAVAILABLE, the default class serves on, and Probe's log
    // names the broken class.
    try_lvm(&["vgchange", "--activate", "n", fast_vg]).unwrap();
    try_lvm(&["vgremove", "--yes", "--force", fast_vg]).unwrap();
    let e = c
        .get_capacity(capacity_req(Some("fast")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let e = c
        .create_volume(in_class("fast", create_req("pvc-late", MIB, mount_cap(""))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    c.create_volume(create_req("pvc-after", 8 * MIB, mount_cap("")))
        .await
        .expect("the default class still serves");
    assert!(
        c.get_capacity(capacity_req(None))
            .await
            .unwrap()
            .into_inner()
            .available_capacity
            > 0
    );
    d.identity()
        .await
        .probe(ProbeRequest {})
        .await
        .expect("Probe answers while one class is down");
    let log = d.log();
    assert!(
        log.lines()
            .any(|l| l.contains("device classes whose pool is not usable") && l.contains("fast")),
        "{}",
        d.log_tail(20)
    );
    // Probe's answer has only `ready`: `tpcsi probe` says which class is
    // down, with its error, and exits 5; the pod's readiness
    // (`--tolerate-other-classes`) stays, the default class serving.
    let out = tpcsi(d, &["probe"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "tpcsi probe: {stderr}");
    assert!(
        stderr.contains("device class fast takes no new volume")
            && stderr.contains(fast_vg.as_str()),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("pool of class fast: takes no new volume"),
        "{out:?}"
    );
    let out = tpcsi(d, &["--json", "probe", "--tolerate-other-classes"]);
    assert!(out.status.success(), "{out:?}");
    let probe: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(probe["pool"]["takes_new_volumes"], true, "{probe}");
    let fast = probe["device_classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["device_class"] == "fast")
        .cloned()
        .unwrap_or_else(|| panic!("no class fast in {probe}"));
    assert_eq!(fast["takes_new_volumes"], false, "{probe}");
    // tpcsi's capacity of every class shows the broken one's error and
    // the other's figures.
    let out = tpcsi(d, &["--json", "capacity"]);
    assert!(out.status.success(), "{out:?}");
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_class = |name: &str| {
        all["device_classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["device_class"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no class {name} in {all}"))
    };
    assert!(
        by_class("fast")["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Unavailable")),
        "{all}"
    );
    assert!(
        by_class("default")["available_capacity"].as_u64() > Some(0),
        "{all}"
    );
    let listed = list_all(d).await;
    assert_eq!(
        listed.len(),
        2,
        "the default class's volumes still list: {listed:?}"
    );
}
