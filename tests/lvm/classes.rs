//! Device classes (issue 23): two loop-backed pools on one node, the
//! top-level one (`default`) and `fast`, each serving its own volumes,
//! and one class lost without the other.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::NodeReclaimSpaceRequest;
use tonic::Code;

use crate::fixtures::{
    create, create_req, create_volume, del, mount_cap, publish_req, snapshot_of, stage_req, tpcsi,
    unpublish_req, unstage_req, Kubelet,
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

/// One of the two classes under test: its name as a StorageClass gives
/// it (`None`: the default class), its VG, its default filesystem and its
/// overprovision ratio.
struct Class {
    name: Option<&'static str>,
    vg: String,
    fs: &'static str,
    ratio: f64,
}

impl Class {
    fn label(&self) -> &'static str {
        self.name.unwrap_or("default")
    }
    /// `req` sent to this class.
    fn req(&self, req: CreateVolumeRequest) -> CreateVolumeRequest {
        match self.name {
            Some(c) => in_class(c, req),
            None => req,
        }
    }
    /// The prefix of this class's volume and snapshot ids.
    fn prefix(&self) -> String {
        self.name.map(|c| format!("{c}.")).unwrap_or_default()
    }
}

/// Two loop-backed classes on one node: the top-level pool (`default`,
/// ext4) and `fast` (xfs by default, a larger pool).
struct TwoClasses {
    k: Kubelet,
    d: TestDriver,
    default: Class,
    fast: Class,
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
        default: Class {
            name: None,
            vg: d.vg.clone(),
            fs: "ext4",
            ratio: 4.0,
        },
        d,
        fast: Class {
            name: Some("fast"),
            vg: fast_vg,
            fs: "xfs",
            ratio: 10.0,
        },
        _fast: fast,
    }
}

/// What one class holds once its lifecycle ran: the volume, its
/// snapshot, the restore and the clone.
struct Held {
    volume: String,
    snapshot: String,
    copies: [String; 2],
}

#[tokio::test(flavor = "multi_thread")]
async fn two_classes_serve_their_own_volumes_and_survive_each_other() {
    let mut t = two_classes().await;
    let (fast_id, plain_id) = creates_go_to_the_class_named(&t).await;
    capacity_conditions_and_tpcsi_per_class(&t, &fast_id).await;
    let mut held = Vec::new();
    for (class, other, id) in [
        (&t.default, &t.fast, &plain_id),
        (&t.fast, &t.default, &fast_id),
    ] {
        let (snapshot, size) = a_volume_lives_in_its_class(&t, class, id).await;
        let copies = copies_stay_in_their_class(&t, class, other, id, &snapshot, size).await;
        held.push(Held {
            volume: id.clone(),
            snapshot,
            copies,
        });
    }
    listed_across_a_restart(&mut t, &held).await;
    deleted_in_their_class(&t, &held[1], &t.fast).await;
    deleted_in_their_class(&t, &held[0], &t.default).await;
    a_lost_class_leaves_the_other_serving(&t).await;
}

/// CreateVolume picks the class by deviceClass; an unknown one is refused.
async fn creates_go_to_the_class_named(t: &TwoClasses) -> (String, String) {
    let (d, fast_vg) = (&t.d, &t.fast.vg);
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
    let d = &t.d;
    let mut c = d.controller().await;
    // GetCapacity per class, each exactly as that class's `lvs` shows it
    // at its own overprovision ratio.
    let mut fast_cap = None;
    for class in [&t.default, &t.fast] {
        let cap = c
            .get_capacity(capacity_req(class.name))
            .await
            .unwrap()
            .into_inner();
        let (available, max) = crate::harness::capacity_from_lvs(&class.vg, class.ratio);
        assert_eq!(
            (cap.available_capacity as u64, cap.maximum_volume_size),
            (available, Some(max as i64)),
            "class {}: {cap:?}",
            class.label()
        );
        fast_cap = Some(cap);
    }
    let fast_cap = fast_cap.unwrap();

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
    // A class the driver does not serve is bad input naming the ones it
    // does, not an empty list: for volumes and snapshots alike.
    for args in [
        &["list", "--class", "slow"][..],
        &["snapshot", "list", "--class", "slow"],
    ] {
        let out = tpcsi(d, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        assert!(
            err.contains("\"slow\" is not served") && err.contains("default, fast"),
            "{args:?}: {err}"
        );
    }
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

/// Stage (the class's filesystem), expand, reclaim and snapshot volume
/// `id` of `class`; the snapshot's id and the grown size.
async fn a_volume_lives_in_its_class(t: &TwoClasses, class: &Class, id: &str) -> (String, u64) {
    let (d, k) = (&t.d, &t.k);
    let mut c = d.controller().await;
    // Stage takes the class's default filesystem; data written there
    // survives expand, snapshot and restore in the class.
    let (staging, target) = stage_publish(d, k, id, class.label()).await;
    assert_eq!(fs_of(&target), class.fs);
    std::fs::write(target.join("data"), class.label()).unwrap();
    let grown = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.to_string(),
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
        lvs(&class.vg).find(id).unwrap().size,
        grown.capacity_bytes as u64
    );
    let mut r = ReclaimSpaceNodeClient::connect(d.addons_uri())
        .await
        .unwrap();
    r.node_reclaim_space(NodeReclaimSpaceRequest {
        volume_id: id.to_string(),
        volume_path: target.display().to_string(),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("NodeReclaimSpace in class {}: {e:?}", class.label()));
    nix::unistd::sync();
    let snap = snapshot_of(&mut c, &format!("snap-{}", class.label()), id).await;
    assert!(
        snap.snapshot_id
            .starts_with(&format!("{}snap-", class.prefix())),
        "{snap:?}"
    );
    assert!(lvs(&class.vg).find(&snap.snapshot_id).is_some());
    snapshot_listed_in_its_class(t, class, &snap.snapshot_id);
    unpublish_unstage(d, id, &staging, &target).await;

    (snap.snapshot_id, grown.capacity_bytes as u64)
}

/// tpcsi's snapshot list shows the snapshot's class, and `--class` keeps
/// it or leaves it out.
fn snapshot_listed_in_its_class(t: &TwoClasses, class: &Class, snap_id: &str) {
    let d = &t.d;
    let out = tpcsi(d, &["snapshot", "list", "--class", class.label()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(snap_id) && l.contains(&format!(" {} ", class.label()))),
        "{table}"
    );
    let other = if class.name.is_some() {
        "default"
    } else {
        "fast"
    };
    let out = tpcsi(d, &["--json", "snapshot", "list", "--class", other]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        list["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["device_class"] == other && s["snapshot_id"] != snap_id),
        "{list}"
    );
}

/// A request for a volume of `size` in `class` with `source` as content.
fn copy_req(
    class: &Class,
    name: &str,
    size: u64,
    source: volume_content_source::Type,
) -> CreateVolumeRequest {
    let mut req = class.req(create_req(name, size, mount_cap("")));
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(source),
    });
    req
}

/// A restore of `snap_id` and a clone of `id` stay in `class`; into
/// `other` they are refused. The restore's and the clone's ids.
async fn copies_stay_in_their_class(
    t: &TwoClasses,
    class: &Class,
    other: &Class,
    id: &str,
    snap_id: &str,
    size: u64,
) -> [String; 2] {
    let (d, k) = (&t.d, &t.k);
    let mut c = d.controller().await;
    let sources = [
        (
            "restored",
            volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                snapshot_id: snap_id.to_string(),
            }),
        ),
        (
            "clone",
            volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                volume_id: id.to_string(),
            }),
        ),
    ];
    let mut made = Vec::new();
    for (what, source) in sources {
        let name = format!("pvc-{what}-{}", class.label());
        let e = c
            .create_volume(copy_req(other, &format!("{name}-x"), size, source.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains("device class"), "{e:?}");
        let copy = create_volume(&mut c, copy_req(class, &name, size, source))
            .await
            .volume_id;
        assert!(
            copy.starts_with(&format!("{}csi-", class.prefix())),
            "{copy}"
        );
        assert!(lvs(&class.vg).find(&copy).is_some(), "{copy}");
        let (st, tg) = stage_publish(d, k, &copy, &name).await;
        assert_eq!(
            std::fs::read(tg.join("data")).unwrap(),
            class.label().as_bytes()
        );
        unpublish_unstage(d, &copy, &st, &tg).await;
        made.push(copy);
    }
    made.try_into().unwrap()
}

/// ListVolumes pages through both classes, each volume once, and so after
/// a restart.
async fn listed_across_a_restart(t: &mut TwoClasses, held: &[Held]) {
    let d = &mut t.d;
    let want: BTreeSet<String> = held
        .iter()
        .flat_map(|h| std::iter::once(&h.volume).chain(&h.copies))
        .cloned()
        .collect();
    let listed = list_all(d).await;
    assert_eq!(listed.len(), want.len(), "{listed:?}");
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), want);
    d.restart().await;
    let listed = list_all(d).await;
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), want);
}

/// Deletes go to the class: the copies, the snapshot and (for `fast`) the
/// volume leave its VG; an id of a class unknown here is refused, not
/// "gone". The default class keeps its volume for the lost-class check.
async fn deleted_in_their_class(t: &TwoClasses, held: &Held, class: &Class) {
    let mut c = t.d.controller().await;
    let e = c
        .delete_volume(del(&format!(
            "gone.{}",
            naming::split_class(&held.volume).1
        )))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: held.snapshot.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(lvs(&class.vg).find(&held.snapshot).is_none());
    let mut ids: Vec<&String> = held.copies.iter().collect();
    if class.name.is_some() {
        ids.push(&held.volume);
    }
    for id in ids {
        c.delete_volume(del(id)).await.unwrap();
        assert!(lvs(&class.vg).find(id).is_none(), "{id}");
    }
}

/// The fast class's VG vanishes: UNAVAILABLE there, the default serves.
async fn a_lost_class_leaves_the_other_serving(t: &TwoClasses) {
    let (d, fast_vg) = (&t.d, &t.fast.vg);
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
    // And they delete, leaving the default class's VG without a volume.
    for id in &listed {
        c.delete_volume(del(id)).await.unwrap();
    }
    assert_eq!(lvs(&d.vg).thin_volumes("pool").count(), 0);
}
