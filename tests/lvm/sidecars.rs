//! The calls the Kubernetes sidecars make, exactly as they make them, with
//! every parameter key each may send. The keys are written out here as
//! the sidecars' sources at the pinned versions spell them, not taken
//! from the driver's own list, so a key the driver forgets fails here.
//!
//! - external-provisioner v6.3.0: the capacity controller (`syncCapacity`)
//!   sends GetCapacity the StorageClass's parameters unchanged and no
//!   volume capability; `prepareProvision` strips the
//!   `csi.storage.k8s.io/` keys it reads (`removePrefixedParameters`),
//!   passes the deprecated un-prefixed ones on, and with
//!   `--extra-create-metadata` adds the PVC's and PV's names.
//! - csi-snapshotter v8.6.0 with `--extra-create-metadata`: the
//!   VolumeSnapshot's (or VolumeGroupSnapshot's) name and namespace and its
//!   content's name.
//! - external-resizer v2.2 with `--extra-modify-metadata`: the PVC's and
//!   PV's names in ControllerModifyVolume's mutable parameters.
//! - external-attacher v4.12.0: no call. The driver does not advertise
//!   PUBLISH_UNPUBLISH_VOLUME, so the attacher's trivial handler marks
//!   each VolumeAttachment attached by itself
//!   (`conformance::controller::controller_publish_rules`).
//! - kubelet: NodeGetVolumeStats of a raw block volume at
//!   `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>`, its bind
//!   mount of the device node NodePublishVolume placed at
//!   `volumeDevices/publish/<pv>/<pod uid>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use thinpool_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use crate::fixtures::{
    block_cap, create_volume, publish_req, stage_req, unpublish_req, unstage_req, Kubelet,
};
use crate::harness::{lvm, TestDriver, DRIVER_NAME, MIB, NODE_ID};

/// `deploy/kubernetes/base/storageclass.yaml`'s parameters.
const SHIPPED_CLASS: &[(&str, &str)] = &[("csi.storage.k8s.io/fstype", "ext4")];

/// The `csi.storage.k8s.io/` keys external-provisioner v6.3.0 reads from a
/// StorageClass (`removePrefixedParameters`' list).
const PROVISIONER_PREFIXED: &[&str] = &[
    "csi.storage.k8s.io/fstype",
    "csi.storage.k8s.io/secret-name",
    "csi.storage.k8s.io/secret-namespace",
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/controller-publish-secret-name",
    "csi.storage.k8s.io/controller-publish-secret-namespace",
    "csi.storage.k8s.io/node-stage-secret-name",
    "csi.storage.k8s.io/node-stage-secret-namespace",
    "csi.storage.k8s.io/node-publish-secret-name",
    "csi.storage.k8s.io/node-publish-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-name",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
    "csi.storage.k8s.io/node-expand-secret-name",
    "csi.storage.k8s.io/node-expand-secret-namespace",
];

/// The deprecated spellings external-provisioner v6.3.0 reads and does
/// not strip (`fstype` compared lower-cased).
const PROVISIONER_DEPRECATED: &[&str] = &[
    "fsType",
    "csiProvisionerSecretName",
    "csiProvisionerSecretNamespace",
    "csiControllerPublishSecretName",
    "csiControllerPublishSecretNamespace",
    "csiNodeStageSecretName",
    "csiNodeStageSecretNamespace",
    "csiNodePublishSecretName",
    "csiNodePublishSecretNamespace",
];

fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A value of the kind a StorageClass holds for `key`.
fn value_for(key: &str) -> &'static str {
    let k = key.to_lowercase();
    if k.ends_with("fstype") {
        "ext4"
    } else if k.ends_with("namespace") {
        "${pvc.namespace}"
    } else {
        "${pvc.name}-secret"
    }
}

/// The PVC and PV names `--extra-create-metadata` adds to CreateVolume.
fn provisioner_metadata(pvc: &str, pv: &str) -> HashMap<String, String> {
    map(&[
        ("csi.storage.k8s.io/pvc/name", pvc),
        ("csi.storage.k8s.io/pvc/namespace", "default"),
        ("csi.storage.k8s.io/pv/name", pv),
    ])
}

fn this_node() -> Topology {
    Topology {
        segments: [(format!("topology.{DRIVER_NAME}/node"), NODE_ID.to_string())].into(),
    }
}

/// The capability the provisioner builds for a filesystem claim
/// (ReadWriteOnce, the class's fs type, its mount options).
fn ext4_rwo() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    }
}

/// CreateVolume as external-provisioner v6.3.0 sends it for a
/// WaitForFirstConsumer claim on this node.
fn provisioned(pv: &str, parameters: HashMap<String, String>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: pv.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: (16 * MIB) as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![ext4_rwo()],
        parameters,
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![this_node()],
            preferred: vec![this_node()],
        }),
        ..Default::default()
    }
}

#[track_caller]
fn assert_invalid_naming<T: std::fmt::Debug>(r: Result<T, tonic::Status>, key: &str) {
    let e = r.expect_err(key);
    assert_eq!(e.code(), Code::InvalidArgument, "{key}: {}", e.message());
    assert!(
        e.message().contains(&format!("{key:?}")),
        "the message names {key:?}: {}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn get_capacity_as_the_capacity_controller_sends_it() {
    let d = TestDriver::start("scap", 256 * MIB, "").await;
    let mut c = d.controller().await;
    let ask = |parameters: HashMap<String, String>| GetCapacityRequest {
        volume_capabilities: vec![],
        parameters,
        accessible_topology: Some(this_node()),
    };
    let plain = c
        .get_capacity(ask(HashMap::new()))
        .await
        .unwrap()
        .into_inner();
    assert!(plain.available_capacity > 0, "{plain:?}");

    // The shipped class, then a class with every key the provisioner
    // reads (prefixed and deprecated, so both fs type spellings).
    let mut every = map(SHIPPED_CLASS);
    for k in PROVISIONER_PREFIXED.iter().chain(PROVISIONER_DEPRECATED) {
        every.insert(k.to_string(), value_for(k).to_string());
    }
    every.insert("thinPool".into(), "pool".into());
    for class in [map(SHIPPED_CLASS), every.clone()] {
        let got = c
            .get_capacity(ask(class.clone()))
            .await
            .unwrap_or_else(|e| panic!("GetCapacity with {class:?}: {}", e.message()))
            .into_inner();
        assert_eq!(got.available_capacity, plain.available_capacity);
        assert_eq!(got.maximum_volume_size, plain.maximum_volume_size);
        assert_eq!(got.minimum_volume_size, plain.minimum_volume_size);
    }

    // The immediate-binding path's GetCapacity: stripped, plus metadata.
    let got = c
        .get_capacity(ask(provisioner_metadata("data", "pvc-1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.available_capacity, plain.available_capacity);

    // A key no sidecar reserves is still refused, named.
    for bogus in ["csi.storage.k8s.io/bogus", "iops"] {
        let mut class = every.clone();
        class.insert(bogus.into(), "1".into());
        assert_invalid_naming(c.get_capacity(ask(class)).await, bogus);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn create_volume_as_the_provisioner_sends_it() {
    let d = TestDriver::start("screate", 256 * MIB, "").await;
    let mut c = d.controller().await;

    // The shipped class, stripped (nothing left), plus the metadata.
    let pv = "pvc-6c1f1d5e-0000-4000-8000-000000000001";
    let req = provisioned(pv, provisioner_metadata("data", pv));
    let first = c.create_volume(req.clone()).await.unwrap().into_inner();
    let again = c.create_volume(req).await.unwrap().into_inner();
    assert_eq!(first.volume, again.volume, "a retry is the same volume");
    let vol = first.volume.unwrap();
    assert_eq!(vol.capacity_bytes, (16 * MIB) as i64);
    assert_eq!(
        vol.volume_context.get("fsType").map(String::as_str),
        Some("ext4")
    );

    // A class with the deprecated spellings: passed on unchanged.
    let pv = "pvc-6c1f1d5e-0000-4000-8000-000000000002";
    let mut params = provisioner_metadata("legacy", pv);
    for k in PROVISIONER_DEPRECATED {
        params.insert(k.to_string(), value_for(k).to_string());
    }
    params.insert("thinPool".into(), "pool".into());
    let req = provisioned(pv, params);
    let first = c.create_volume(req.clone()).await.unwrap().into_inner();
    let again = c.create_volume(req).await.unwrap().into_inner();
    assert_eq!(first.volume, again.volume);

    // What the provisioner strips never reaches CreateVolume from it; a
    // caller that sends it is told the driver does not read it there.
    for key in PROVISIONER_PREFIXED {
        let pv = "pvc-6c1f1d5e-0000-4000-8000-000000000003";
        let mut params = provisioner_metadata("data", pv);
        params.insert(key.to_string(), value_for(key).to_string());
        assert_invalid_naming(c.create_volume(provisioned(pv, params)).await, key);
    }
    let pv = "pvc-6c1f1d5e-0000-4000-8000-000000000004";
    let mut params = provisioner_metadata("data", pv);
    params.insert("fs-type".into(), "ext4".into());
    assert_invalid_naming(c.create_volume(provisioned(pv, params)).await, "fs-type");
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_and_modify_as_the_snapshotter_and_resizer_send_them() {
    let d = TestDriver::start("ssnap", 256 * MIB, "").await;
    let mut c = d.controller().await;
    let mut ids = Vec::new();
    for i in 1..=2 {
        let pv = format!("pvc-6c1f1d5e-0000-4000-8000-00000000001{i}");
        let v = c
            .create_volume(provisioned(&pv, provisioner_metadata("data", &pv)))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v.volume_id);
    }

    // csi-snapshotter v8.6.0, --extra-create-metadata.
    let content = "snapcontent-6c1f1d5e-0000-4000-8000-000000000021";
    let snap = CreateSnapshotRequest {
        source_volume_id: ids[0].clone(),
        name: "snapshot-6c1f1d5e-0000-4000-8000-000000000021".into(),
        secrets: HashMap::new(),
        parameters: map(&[
            ("csi.storage.k8s.io/volumesnapshot/name", "data-snap"),
            ("csi.storage.k8s.io/volumesnapshot/namespace", "default"),
            ("csi.storage.k8s.io/volumesnapshotcontent/name", content),
        ]),
    };
    let s = c.create_snapshot(snap.clone()).await.unwrap().into_inner();
    assert!(s.snapshot.unwrap().ready_to_use);
    c.create_snapshot(snap.clone()).await.unwrap();
    let mut group_keys = snap.clone();
    group_keys.name = "snapshot-other".into();
    group_keys.parameters = map(&[("csi.storage.k8s.io/volumegroupsnapshot/name", "g")]);
    assert_invalid_naming(
        c.create_snapshot(group_keys).await,
        "csi.storage.k8s.io/volumegroupsnapshot/name",
    );

    // The same, for a group (its members unstaged, so held still).
    let mut g = GroupControllerClient::connect(d.uri()).await.unwrap();
    let group = CreateVolumeGroupSnapshotRequest {
        name: "groupsnapshot-6c1f1d5e-0000-4000-8000-000000000031".into(),
        source_volume_ids: ids.clone(),
        secrets: HashMap::new(),
        parameters: map(&[
            ("csi.storage.k8s.io/volumegroupsnapshot/name", "data-group"),
            (
                "csi.storage.k8s.io/volumegroupsnapshot/namespace",
                "default",
            ),
            (
                "csi.storage.k8s.io/volumegroupsnapshotcontent/name",
                "groupsnapcontent-6c1f1d5e-0000-4000-8000-000000000031",
            ),
        ]),
    };
    let got = g
        .create_volume_group_snapshot(group.clone())
        .await
        .unwrap_or_else(|e| panic!("CreateVolumeGroupSnapshot: {}", e.message()))
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got.snapshots.len(), 2);
    g.create_volume_group_snapshot(group).await.unwrap();

    // external-resizer v2.2, --extra-modify-metadata: a
    // VolumeAttributesClass's parameters plus the PVC's and PV's names.
    let modify = |mutable: &[(&str, &str)]| ControllerModifyVolumeRequest {
        volume_id: ids[1].clone(),
        secrets: HashMap::new(),
        mutable_parameters: map(mutable),
    };
    let metadata: Vec<(&str, &str)> = vec![
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "default"),
        (
            "csi.storage.k8s.io/pv/name",
            "pvc-6c1f1d5e-0000-4000-8000-000000000012",
        ),
    ];
    let mut vac = metadata.clone();
    vac.push(("readAheadSectors", "256"));
    c.controller_modify_volume(modify(&vac)).await.unwrap();
    // A class with no parameters of its own: the metadata alone.
    c.controller_modify_volume(modify(&metadata)).await.unwrap();
    let v = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: ids[1].clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        v.volume_context.get("readAheadSectors").map(String::as_str),
        Some("256")
    );
    assert!(
        v.volume_context
            .keys()
            .all(|k| !k.starts_with("csi.storage.k8s.io/")),
        "metadata is not kept as a mutable parameter: {:?}",
        v.volume_context
    );
    let mut bogus = metadata.clone();
    bogus.push(("iops", "100"));
    assert_invalid_naming(c.controller_modify_volume(modify(&bogus)).await, "iops");
}

/// kubelet's directories for a raw block volume `pv`
/// (`plugins/kubernetes.io/csi/volumeDevices/...`).
struct BlockPaths {
    csi: PathBuf,
    pv: String,
}

impl BlockPaths {
    fn new(k: &Kubelet, pv: &str) -> BlockPaths {
        BlockPaths {
            csi: k.path("plugins/kubernetes.io/csi/volumeDevices"),
            pv: pv.into(),
        }
    }
    /// NodeStageVolume's staging path (a directory kubelet makes).
    fn staging(&self) -> PathBuf {
        let p = self.csi.join("staging").join(&self.pv);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
    /// NodePublishVolume's target (its parent made by kubelet).
    fn publish(&self, pod: &str) -> PathBuf {
        let dir = self.csi.join("publish").join(&self.pv);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(pod)
    }
    /// What kubelet does after NodePublishVolume: an empty file at
    /// `<pv>/dev/<pod uid>` and a bind mount of the published node on it.
    /// Returns that path, where it asks NodeGetVolumeStats.
    fn map_device(&self, published: &Path, pod: &str) -> PathBuf {
        let dir = self.csi.join(&self.pv).join("dev");
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join(pod);
        std::fs::File::create(&at).unwrap();
        nix::mount::mount(
            Some(published),
            &at,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("bind {} on {}: {e}", published.display(), at.display()));
        at
    }
}

fn unmap(at: &Path) {
    nix::mount::umount2(at, nix::mount::MntFlags::empty())
        .unwrap_or_else(|e| panic!("umount {}: {e}", at.display()));
    std::fs::remove_file(at).unwrap();
}

fn stats_at(id: &str, path: &Path) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.to_str().unwrap().into(),
        staging_target_path: String::new(),
    }
}

/// The rule for kubelet's paths that are not the volume's: a path that
/// holds another device's node is not the volume (`(id1, k1)` and
/// `(id2, k2)` are two volumes and the paths kubelet mapped them at); nor
/// is an empty file, a directory or nothing at all at such a path under
/// volume 1's `pv_dir`.
async fn not_the_volume_at_other_paths(
    n: &mut NodeClient<Channel>,
    (id1, ka): (&str, &Path),
    (id2, kc): (&str, &Path),
    pv_dir: &Path,
) {
    let e = n
        .node_get_volume_stats(stats_at(id1, kc))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    assert!(e.message().contains("device node of"), "{}", e.message());
    let e = n
        .node_get_volume_stats(stats_at(id2, ka))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    let other = pv_dir.join("dev").join("not-mapped");
    std::fs::File::create(&other).unwrap();
    for at in [other.clone(), pv_dir.join("dev"), pv_dir.join("dev/gone")] {
        let e = n
            .node_get_volume_stats(stats_at(id1, &at))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::NotFound,
            "{}: {}",
            at.display(),
            e.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn block_stats_at_kubelets_volume_devices_path() {
    let k = Kubelet::new("sblk");
    let d = TestDriver::start("sblk", 256 * MIB, &k.extra()).await;
    let (mut c, mut n) = (d.controller().await, d.node().await);
    let block = |pv: &'static str, bytes: u64| {
        let mut req = provisioned(pv, provisioner_metadata("raw", pv));
        req.volume_capabilities = vec![block_cap()];
        req.capacity_range.as_mut().unwrap().required_bytes = bytes as i64;
        req
    };
    let (pv1, pv2) = (
        "pvc-6c1f1d5e-0000-4000-8000-000000000041",
        "pvc-6c1f1d5e-0000-4000-8000-000000000042",
    );
    let (req1, req2) = (block(pv1, 32 * MIB), block(pv2, 16 * MIB));
    let id1 = create_volume(&mut c, req1).await.volume_id;
    let id2 = create_volume(&mut c, req2).await.volume_id;
    let (p1, p2) = (BlockPaths::new(&k, pv1), BlockPaths::new(&k, pv2));
    let (pod_a, pod_b, pod_c) = (
        "0b6ee4b2-1111-4a2f-9c1e-00000000000a",
        "0b6ee4b2-1111-4a2f-9c1e-00000000000b",
        "0b6ee4b2-1111-4a2f-9c1e-00000000000c",
    );

    // Pod A uses volume 1 read-write, pod B read-only (an overlay), pod C
    // volume 2.
    let (s1, s2) = (p1.staging(), p2.staging());
    n.node_stage_volume(stage_req(&id1, &s1, block_cap()))
        .await
        .unwrap();
    n.node_stage_volume(stage_req(&id2, &s2, block_cap()))
        .await
        .unwrap();
    let (ta, tb, tc) = (p1.publish(pod_a), p1.publish(pod_b), p2.publish(pod_c));
    for (id, staging, target, ro) in [
        (&id1, &s1, &ta, false),
        (&id1, &s1, &tb, true),
        (&id2, &s2, &tc, false),
    ] {
        n.node_publish_volume(publish_req(id, staging, target, block_cap(), ro))
            .await
            .unwrap_or_else(|e| panic!("publish at {}: {}", target.display(), e.message()));
    }
    let (ka, kb, kc) = (
        p1.map_device(&ta, pod_a),
        p1.map_device(&tb, pod_b),
        p2.map_device(&tc, pod_c),
    );

    // At kubelet's paths: the size, and a healthy condition.
    for (id, at, size) in [
        (&id1, &ka, 32 * MIB),
        (&id1, &kb, 32 * MIB),
        (&id2, &kc, 16 * MIB),
    ] {
        let st = n
            .node_get_volume_stats(stats_at(id, at))
            .await
            .unwrap_or_else(|e| panic!("stats at {}: {}", at.display(), e.message()))
            .into_inner();
        assert_eq!(st.usage.len(), 1, "{st:?}");
        assert_eq!(st.usage[0].total, size as i64);
        let cond = st.volume_condition.unwrap();
        assert!(!cond.abnormal, "{}", cond.message);
    }

    not_the_volume_at_other_paths(&mut n, (&id1, &ka), (&id2, &kc), &p1.csi.join(pv1)).await;

    // The read-only pod goes (its overlay with it); then the LV is
    // deactivated behind the driver's back: kubelet's path still answers,
    // with the condition that says so.
    unmap(&kb);
    n.node_unpublish_volume(unpublish_req(&id1, &tb))
        .await
        .unwrap();
    lvm(&["lvchange", "-an", &format!("{}/{id1}", d.vg)]);
    let st = n
        .node_get_volume_stats(stats_at(&id1, &ka))
        .await
        .unwrap_or_else(|e| panic!("stats of an inactive LV: {}", e.message()))
        .into_inner();
    let cond = st.volume_condition.unwrap();
    assert!(
        cond.abnormal && cond.message.contains("not active"),
        "{}",
        cond.message
    );
    assert!(st.usage.is_empty(), "{:?}", st.usage);
    // Another volume's node still is not this one.
    let e = n
        .node_get_volume_stats(stats_at(&id1, &kc))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());

    for at in [&ka, &kc] {
        unmap(at);
    }
    for (id, staging, target) in [(&id1, &s1, &ta), (&id2, &s2, &tc)] {
        n.node_unpublish_volume(unpublish_req(id, target))
            .await
            .unwrap();
        n.node_unstage_volume(unstage_req(id, staging))
            .await
            .unwrap();
    }
}
