//! CSI-Addons over their own socket: Identity and ReclaimSpace with pre/post
//! usage checked against `lvs`.

use std::path::{Path, PathBuf};

use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::identity::identity_client::IdentityClient as AddonsIdentityClient;
use thinpool_csi::proto::identity::{
    capability, GetCapabilitiesRequest, GetIdentityRequest, ProbeRequest,
};
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::{ControllerReclaimSpaceRequest, NodeReclaimSpaceRequest};
use tonic::transport::Channel;
use tonic::Code;

use crate::fixtures::{block_cap, create_req, create_volume, mount_cap, node_reclaim};
use crate::harness::{lvm, lvs, sh, TestDriver, DRIVER_NAME, MIB};

async fn create(
    c: &mut ControllerClient<Channel>,
    name: &str,
    cap: thinpool_csi::proto::csi::v1::VolumeCapability,
) -> String {
    // XFS refuses filesystems under 300 MiB; thin volumes cost only what
    // is written, so every test volume can be that large.
    create_volume(c, create_req(name, 320 * MIB, cap))
        .await
        .volume_id
}

fn allocated(vg: &str, id: &str) -> u64 {
    lvs(vg)
        .find(id)
        .unwrap()
        .allocated_bytes()
        .expect("active LV has Data%")
}

/// Formats the LV (as a node would: no discard pass) and mounts it at a
/// fresh directory, standing in for a staged volume.
fn format_and_mount(d: &TestDriver, id: &str, fs: &str) -> (String, PathBuf) {
    let dev = format!("/dev/{}/{id}", d.vg);
    lvm(&["lvchange", "-ay", &format!("{}/{id}", d.vg)]);
    match fs {
        "ext4" => sh(
            "mkfs.ext4",
            &[
                "-q",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                &dev,
            ],
        ),
        _ => sh("mkfs.xfs", &["-q", "-K", &dev]),
    };
    let mnt = d.dir.path().join(format!("staged-{id}"));
    std::fs::create_dir_all(&mnt).unwrap();
    sh("mount", &[&dev, mnt.to_str().unwrap()]);
    (dev, mnt)
}

fn write_random(path: &Path, mib: u64) {
    sh(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", path.display()),
            "bs=1M",
            &format!("count={mib}"),
            "conv=fsync",
            "status=none",
        ],
    );
}

async fn reclaim_mounted(fs: &str) {
    let d = TestDriver::start(&format!("rs{fs}"), 256 * MIB, "").await;
    let mut c = d.controller().await;
    let id = create(&mut c, &format!("pvc-reclaim-{fs}"), mount_cap(fs)).await;
    let (_dev, mnt) = format_and_mount(&d, &id, fs);
    const DELETED: u64 = 24;
    write_random(&mnt.join("keep"), 4);
    write_random(&mnt.join("gone"), DELETED);
    let keep_sum = sh("sha256sum", &[mnt.join("keep").to_str().unwrap()]);
    std::fs::remove_file(mnt.join("gone")).unwrap();
    sh("sync", &[]);
    let before = allocated(&d.vg, &id);
    let (pre, post) = node_reclaim(&d, &id, &mnt).await;
    let lvs_after = allocated(&d.vg, &id);
    let (pre2, post2) = node_reclaim(&d, &id, &mnt).await;
    eprintln!(
        "RECLAIM {fs}: wrote {} MiB, deleted {DELETED} MiB; lvs before {before} B; pre {pre} B, post {post} B \
         (freed {} B = {:.1}% of deleted); lvs right after {lvs_after} B; second reclaim pre {pre2} post {post2}",
        DELETED + 4,
        pre - post,
        (pre - post) as f64 * 100.0 / (DELETED * MIB) as f64
    );
    assert!(
        pre >= before.saturating_sub(MIB) && pre <= before + MIB,
        "pre {pre} vs lvs {before}"
    );
    assert!(
        pre - post >= DELETED * MIB * 9 / 10,
        "freed only {} of {} bytes",
        pre - post,
        DELETED * MIB
    );
    assert_eq!(post, lvs_after, "post_usage must be what lvs reports");
    assert!(
        pre2.abs_diff(post2) <= MIB,
        "second reclaim {pre2} -> {post2}"
    );
    assert_eq!(
        sh("sha256sum", &[mnt.join("keep").to_str().unwrap()]),
        keep_sum
    );
    sh("umount", &[mnt.to_str().unwrap()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn node_reclaim_ext4() {
    reclaim_mounted("ext4").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn node_reclaim_xfs() {
    reclaim_mounted("xfs").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_reclaim_unstaged_ext4_keeps_data() {
    let d = TestDriver::start("rsctl", 256 * MIB, "").await;
    let mut c = d.controller().await;
    let id = create(&mut c, "pvc-reclaim-ctl", mount_cap("ext4")).await;
    let (_dev, mnt) = format_and_mount(&d, &id, "ext4");
    write_random(&mnt.join("keep"), 4);
    write_random(&mnt.join("gone"), 24);
    let keep_sum = sh("sha256sum", &[mnt.join("keep").to_str().unwrap()]);
    std::fs::remove_file(mnt.join("gone")).unwrap();
    // Mounted: in use, so the node's to trim. The csi-addons controller
    // makes this call after every NodeReclaimSpace and fails the job on an
    // error: answered OK, nothing done, the usage as it stands twice.
    let before = lvs(&d.vg).find(&id).unwrap().allocated_bytes().unwrap();
    let (pre, post) = crate::fixtures::controller_reclaim(&d, &id).await;
    assert_eq!((pre, post), (before, before), "in use: nothing reclaimed");
    assert_eq!(
        lvs(&d.vg).find(&id).unwrap().allocated_bytes(),
        Some(before),
        "in use: nothing discarded"
    );
    assert!(d
        .log()
        .contains("ControllerReclaimSpace: in use, nothing done"));
    sh("umount", &[mnt.to_str().unwrap()]);
    lvm(&["lvchange", "-an", &format!("{}/{id}", d.vg)]);

    let (pre, post) = crate::fixtures::controller_reclaim(&d, &id).await;
    eprintln!(
        "RECLAIM controller ext4: deleted 24 MiB; pre {pre} B, post {post} B, freed {} B",
        pre - post
    );
    assert!(pre - post >= 24 * MIB * 9 / 10, "freed only {}", pre - post);
    let lv = lvs(&d.vg);
    assert!(
        !lv.find(&id).unwrap().is_active(),
        "activation state restored"
    );
    // The kept file reads back intact.
    lvm(&["lvchange", "-ay", &format!("{}/{id}", d.vg)]);
    sh(
        "mount",
        &[
            "-o",
            "ro",
            &format!("/dev/{}/{id}", d.vg),
            mnt.to_str().unwrap(),
        ],
    );
    assert_eq!(
        sh("sha256sum", &[mnt.join("keep").to_str().unwrap()]),
        keep_sum
    );
    assert!(!mnt.join("gone").exists());
    sh("umount", &[mnt.to_str().unwrap()]);
}

/// A raw block volume staged and published through the driver need not be
/// open, so only the node's record says it is in use: ControllerReclaimSpace
/// answers OK with its usage twice and discards nothing, not even zeroes a
/// pod wrote, since the pod may read them back.
#[tokio::test(flavor = "multi_thread")]
async fn controller_reclaim_of_a_published_block_volume_changes_nothing() {
    let k = crate::fixtures::Kubelet::new("rspub");
    let d = TestDriver::start("rspub", 256 * MIB, &k.extra()).await;
    let mut c = d.controller().await;
    let id = create(&mut c, "pvc-reclaim-pub", block_cap()).await;
    let target = crate::fixtures::publish_block(&d, &k, &id).await;
    // Zeroes a whole-device scan would discard, written through the
    // published device node.
    sh(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", target.display()),
            "bs=1M",
            "count=16",
            "oflag=direct",
            "status=none",
        ],
    );
    let before = allocated(&d.vg, &id);
    assert!(before >= 16 * MIB, "the zeroes were allocated: {before}");
    // Nothing holds the device open: only the record says it is in use.
    assert!(
        !lvs(&d.vg).find(&id).unwrap().is_open(),
        "the published block volume's LV is not open"
    );
    let (pre, post) = crate::fixtures::controller_reclaim(&d, &id).await;
    assert_eq!(
        (pre, post),
        (before, before),
        "published: nothing reclaimed"
    );
    assert_eq!(
        allocated(&d.vg, &id),
        before,
        "published: nothing discarded"
    );
    assert!(
        d.log().lines().any(
            |l| l.contains("ControllerReclaimSpace: in use, nothing done")
                && l.contains("it is staged on this node")
        ),
        "{}",
        d.log_tail(20)
    );
    crate::fixtures::unpublish_block(&d, &k, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_reclaim_block_discards_only_zero_runs() {
    let d = TestDriver::start("rsblk", 256 * MIB, "").await;
    let mut c = d.controller().await;
    let id = create(&mut c, "pvc-reclaim-blk", block_cap()).await;
    let lv = format!("{}/{id}", d.vg);
    let dev = format!("/dev/{lv}");
    lvm(&["lvchange", "-ay", &lv]);
    // 4 MiB pattern, 8 MiB written zeroes, 4 MiB pattern, 8 MiB zeroes.
    let mut pattern = Vec::new();
    for i in 0..4 * MIB as usize {
        pattern.push((i * 7 % 253) as u8 + 1);
    }
    let zeros = vec![0u8; 8 * MIB as usize];
    let image: Vec<u8> = [&pattern[..], &zeros, &pattern, &zeros].concat();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
        f.write_all(&image).unwrap();
        f.sync_all().unwrap();
    }
    let before = allocated(&d.vg, &id);
    assert!(before >= 24 * MIB, "written zeroes are allocated: {before}");
    let mut ctl = ReclaimSpaceControllerClient::connect(d.addons_uri())
        .await
        .unwrap();
    let r = ctl
        .controller_reclaim_space(ControllerReclaimSpaceRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (pre, post) = (
        r.pre_usage.unwrap().usage_bytes as u64,
        r.post_usage.unwrap().usage_bytes as u64,
    );
    eprintln!(
        "RECLAIM controller block: pre {pre} B, post {post} B, freed {} B of 16 MiB zeroed",
        pre - post
    );
    assert!(pre - post >= 16 * MIB - MIB, "freed only {}", pre - post);
    assert!(post >= 8 * MIB, "the pattern stays allocated");
    let mut back = vec![0u8; image.len()];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(&dev).unwrap();
        f.read_exact(&mut back).unwrap();
    }
    assert!(back == image, "data changed by reclaim");
    // A block volume in use on the node cannot be reclaimed online.
    let mut n = ReclaimSpaceNodeClient::connect(d.addons_uri())
        .await
        .unwrap();
    let e = n
        .node_reclaim_space(NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            volume_path: "/var/lib/kubelet/plugins/x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    // Foreign ids and missing fields.
    let e = ctl
        .controller_reclaim_space(ControllerReclaimSpaceRequest {
            volume_id: "pool".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = n
        .node_reclaim_space(NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread")]
async fn addons_identity_matches_what_is_served() {
    let d = TestDriver::start("addid", 64 * MIB, "").await;
    let mut id = AddonsIdentityClient::connect(d.addons_uri()).await.unwrap();
    let who = id
        .get_identity(GetIdentityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(who.name, DRIVER_NAME);
    let caps = id
        .get_capabilities(GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut services = vec![];
    let mut reclaim = vec![];
    let mut rotation = vec![];
    for c in caps.capabilities {
        match c.r#type.unwrap() {
            capability::Type::Service(s) => services.push(s.r#type),
            capability::Type::ReclaimSpace(r) => reclaim.push(r.r#type),
            capability::Type::EncryptionKeyRotation(r) => rotation.push(r.r#type),
            other => panic!("advertised something not served: {other:?}"),
        }
    }
    services.sort();
    reclaim.sort();
    assert_eq!(services, vec![1, 2], "CONTROLLER_SERVICE and NODE_SERVICE");
    assert_eq!(reclaim, vec![1, 2], "OFFLINE and ONLINE");
    assert_eq!(rotation, vec![1], "ENCRYPTIONKEYROTATION");
    assert_eq!(
        id.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
    // Both ReclaimSpace services answer on this socket (a foreign id is
    // NOT_FOUND, not UNIMPLEMENTED).
    let mut n = ReclaimSpaceNodeClient::connect(d.addons_uri())
        .await
        .unwrap();
    let e = n
        .node_reclaim_space(NodeReclaimSpaceRequest {
            volume_id: "vg0/root".into(),
            volume_path: "/x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}
