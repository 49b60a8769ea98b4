//! Node service over the socket, against real LVM, mkfs and mounts.
//!
//! Every test gets a "kubelet" directory of its own and starts its driver
//! with `allowed_roots` set to it.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use thinpool_csi::mountinfo::MountInfo;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::AccessMode;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::fixtures::{
    block_cap, create, heal, mkfs_runs, mount_cap, mount_flags, mounts_under, pool_data_percent,
    publish_req, read_at, s, stage_req, unpublish_req, unstage_req, write_at, Kubelet,
};
use crate::harness::{lvm, lvs, sh, TestDriver, MIB, NODE_ID};

fn with_mode(mut cap: VolumeCapability, mode: Mode) -> VolumeCapability {
    cap.access_mode = Some(AccessMode { mode: mode as i32 });
    cap
}

fn stats_req(id: &str, path: &Path) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: s(path),
        staging_target_path: String::new(),
    }
}

fn expand_req(id: &str, path: &Path, staging: &Path, bytes: u64) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: s(path),
        staging_target_path: s(staging),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

/// The gRPC code of a reply, with its message on failure for the report.
fn code<T>(r: Result<Response<T>, Status>) -> (Code, String) {
    match r {
        Ok(_) => (Code::Ok, String::new()),
        Err(s) => (s.code(), s.message().to_string()),
    }
}

#[track_caller]
fn expect<T>(r: Result<Response<T>, Status>, want: Code) -> String {
    let (got, msg) = code(r);
    assert_eq!(got, want, "expected {want:?}, got {got:?}: {msg}");
    msg
}

async fn controller_expand(d: &TestDriver, id: &str, bytes: u64) -> bool {
    d.controller()
        .await
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .node_expansion_required
}

async fn stage(n: &mut NodeClient<Channel>, id: &str, staging: &Path, cap: VolumeCapability) {
    n.node_stage_volume(stage_req(id, staging, cap))
        .await
        .unwrap_or_else(|e| panic!("stage {id}: {e}"));
}

async fn unstage(n: &mut NodeClient<Channel>, id: &str, staging: &Path) {
    n.node_unstage_volume(unstage_req(id, staging))
        .await
        .unwrap_or_else(|e| panic!("unstage {id}: {e}"));
}

async fn publish(
    n: &mut NodeClient<Channel>,
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
    ro: bool,
) {
    n.node_publish_volume(publish_req(id, staging, target, cap, ro))
        .await
        .unwrap_or_else(|e| panic!("publish {id} at {}: {e}", target.display()));
}

async fn unpublish(n: &mut NodeClient<Channel>, id: &str, target: &Path) {
    n.node_unpublish_volume(unpublish_req(id, target))
        .await
        .unwrap_or_else(|e| panic!("unpublish {id} at {}: {e}", target.display()));
}

async fn stats(n: &mut NodeClient<Channel>, id: &str, path: &Path) -> NodeGetVolumeStatsResponse {
    n.node_get_volume_stats(stats_req(id, path))
        .await
        .unwrap_or_else(|e| panic!("stats {id} at {}: {e}", path.display()))
        .into_inner()
}

fn condition(r: &NodeGetVolumeStatsResponse) -> (bool, String) {
    let c = r.volume_condition.clone().expect("volume_condition is set");
    (c.abnormal, c.message)
}

fn dev(d: &TestDriver, id: &str) -> String {
    format!("/dev/{}/{id}", d.vg)
}

fn is_active(d: &TestDriver, id: &str) -> bool {
    lvs(&d.vg).find(id).expect("LV exists").is_active()
}

fn mounted(p: &Path) -> Option<(u32, u32, String)> {
    MountInfo::read()
        .unwrap()
        .top_mount_at(p)
        .map(|m| (m.major, m.minor, m.fs_type.clone()))
}

fn blkid_uuid(dev: &str) -> String {
    sh("blkid", &["-p", "-o", "value", "-s", "UUID", dev])
        .trim()
        .to_string()
}

/// blkid's exit code on a device (2 = no signature).
fn blkid_code(dev: &str) -> i32 {
    Command::new("blkid")
        .args(["-p", dev])
        .output()
        .unwrap()
        .status
        .code()
        .unwrap_or(-1)
}

fn block_size(path: &Path) -> u64 {
    thinpool_csi::sys::block_size_bytes(path).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn statvfs_total(p: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(p).unwrap();
    st.blocks() as u64 * st.fragment_size() as u64
}

/// A driver on a kubelet directory of its own, with an ext4 volume that
/// no call manages to stage: the ground of the refusal tests.
async fn refusing(name: &str) -> (Kubelet, TestDriver, NodeClient<Channel>, String) {
    let k = Kubelet::new(name);
    let d = TestDriver::start(&format!("n{name}"), 256 * MIB, &k.extra()).await;
    let n = d.node().await;
    let id = create(&d, name, 32 * MIB, mount_cap("ext4")).await;
    (k, d, n, id)
}

/// A refused call left nothing behind: nothing mounted under the kubelet
/// directory (or `outside`), the LV inactive, no filesystem made.
#[track_caller]
fn nothing_done(d: &TestDriver, k: &Kubelet, id: &str, outside: Option<&Path>) {
    assert!(mounts_under(k.root.path()).is_empty());
    if let Some(o) = outside {
        assert!(mounts_under(o).is_empty());
        assert_eq!(std::fs::read_dir(o).unwrap().count(), 0);
    }
    assert!(!is_active(d, id), "the LV stays inactive");
    assert_eq!(mkfs_runs(d), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn node_info_and_capabilities_name_this_node() {
    let d = TestDriver::start("ninfo", 64 * MIB, "").await;
    let mut n = d.node().await;
    let info = n
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE_ID);
    assert_eq!(info.max_volumes_per_node, 0);
    let topo = info.accessible_topology.unwrap().segments;
    assert_eq!(
        topo.get("topology.thinpool.csi.test/node")
            .map(String::as_str),
        Some(NODE_ID)
    );
    let caps = n
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 5, "{caps:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_outside_the_allowed_roots_are_refused() {
    let (k, d, mut n, id) = refusing("badpath").await;
    let staging = k.staging("bad");
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), k.path("escape")).unwrap();

    // Paths: relative, `..`, outside the roots, through a symlink out.
    let rel = "staging/bad".to_string();
    let dotdot = format!("{}/staging/../../etc", k.root.path().display());
    let elsewhere = s(&outside.path().join("st"));
    let via_link = s(&k.path("escape/st"));
    for p in [&rel, &dotdot, &elsewhere, &via_link, &String::new()] {
        let mut r = stage_req(&id, &staging, mount_cap("ext4"));
        r.staging_target_path = p.clone();
        let msg = expect(n.node_stage_volume(r).await, Code::InvalidArgument);
        assert!(!msg.is_empty());
        let mut r = publish_req(&id, &staging, &k.target("bad"), mount_cap("ext4"), false);
        r.target_path = p.clone();
        expect(n.node_publish_volume(r).await, Code::InvalidArgument);
        expect(
            n.node_unpublish_volume(unpublish_req(&id, Path::new(p)))
                .await,
            Code::InvalidArgument,
        );
        expect(
            n.node_unstage_volume(unstage_req(&id, Path::new(p))).await,
            Code::InvalidArgument,
        );
    }
    nothing_done(&d, &k, &id, Some(outside.path()));
}

#[tokio::test(flavor = "multi_thread")]
async fn capabilities_that_smuggle_options_or_do_not_fit_are_refused() {
    let (k, d, mut n, id) = refusing("badcap").await;
    let staging = k.staging("bad");
    // Mount flags that smuggle options, unknown fs types, no capability.
    for flags in [&["ro,exec"][..], &["uid=0"], &["a\nb"], &["x y"], &["bind"]] {
        expect(
            n.node_stage_volume(stage_req(&id, &staging, mount_flags("ext4", flags)))
                .await,
            Code::InvalidArgument,
        );
    }
    expect(
        n.node_stage_volume(stage_req(&id, &staging, mount_cap("btrfs")))
            .await,
        Code::InvalidArgument,
    );
    let mut r = stage_req(&id, &staging, mount_cap("ext4"));
    r.volume_capability = None;
    expect(n.node_stage_volume(r).await, Code::InvalidArgument);
    // A capability that does not fit the volume.
    expect(
        n.node_stage_volume(stage_req(&id, &staging, mount_cap("xfs")))
            .await,
        Code::FailedPrecondition,
    );
    expect(
        n.node_stage_volume(stage_req(&id, &staging, block_cap()))
            .await,
        Code::FailedPrecondition,
    );
    nothing_done(&d, &k, &id, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn volume_ids_that_are_not_ours_are_not_found() {
    let (k, d, mut n, id) = refusing("badid").await;
    let staging = k.staging("bad");
    for foreign in ["vg0/root", "pool", "../x", "csi-nope-0123456789abcdef"] {
        expect(
            n.node_stage_volume(stage_req(foreign, &staging, mount_cap("ext4")))
                .await,
            Code::NotFound,
        );
        expect(
            n.node_unpublish_volume(unpublish_req(foreign, &k.target("x")))
                .await,
            Code::NotFound,
        );
        expect(
            n.node_unstage_volume(unstage_req(foreign, &staging)).await,
            Code::NotFound,
        );
        expect(
            n.node_get_volume_stats(stats_req(foreign, &staging)).await,
            Code::NotFound,
        );
    }
    nothing_done(&d, &k, &id, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_before_stage_and_stats_of_no_volume_are_refused() {
    let (k, _d, mut n, id) = refusing("badorder").await;
    let staging = k.staging("bad");
    // Publish before stage; stats of a path that does not exist.
    expect(
        n.node_publish_volume(publish_req(
            &id,
            &staging,
            &k.target("early"),
            mount_cap("ext4"),
            false,
        ))
        .await,
        Code::FailedPrecondition,
    );
    expect(
        n.node_get_volume_stats(stats_req(&id, &k.path("nowhere")))
            .await,
        Code::NotFound,
    );
    // A relative path names no place a volume is (the spec's NOT_FOUND).
    expect(
        n.node_get_volume_stats(stats_req(&id, Path::new("some/path")))
            .await,
        Code::NotFound,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_whole_request_is_checked_before_a_look_up() {
    let (k, _d, mut n, _id) = refusing("badfield").await;
    let staging = k.staging("bad");
    // An unknown id with a missing field is INVALID_ARGUMENT, not
    // NOT_FOUND.
    let fake = "fake-vol-id";
    let mut r = stage_req(fake, &staging, mount_cap("ext4"));
    r.staging_target_path.clear();
    expect(n.node_stage_volume(r).await, Code::InvalidArgument);
    let mut r = publish_req(fake, &staging, &k.target("bad"), mount_cap("ext4"), false);
    r.volume_capability = None;
    expect(n.node_publish_volume(r).await, Code::InvalidArgument);
    expect(
        n.node_get_volume_stats(stats_req(fake, Path::new("")))
            .await,
        Code::InvalidArgument,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unpublish_and_unstage_of_paths_not_there_succeed() {
    let (k, _d, mut n, id) = refusing("absent").await;
    unpublish(&mut n, &id, &k.target("never")).await;
    unpublish(&mut n, &id, &k.path("no/such/parent/vol")).await;
    unstage(&mut n, &id, &k.path("staging/never")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_holding_what_is_not_ours_are_left_alone() {
    let (k, d, mut n, id) = refusing("foreign").await;
    let foreign_mount = k.staging("tmpfs");
    sh(
        "mount",
        &["-t", "tmpfs", "-o", "size=1m", "tmpfs", &s(&foreign_mount)],
    );
    std::fs::write(foreign_mount.join("keep"), b"k").unwrap();
    expect(
        n.node_unpublish_volume(unpublish_req(&id, &foreign_mount))
            .await,
        Code::FailedPrecondition,
    );
    expect(
        n.node_unstage_volume(unstage_req(&id, &foreign_mount))
            .await,
        Code::FailedPrecondition,
    );
    expect(
        n.node_stage_volume(stage_req(&id, &foreign_mount, mount_cap("ext4")))
            .await,
        Code::FailedPrecondition,
    );
    assert_eq!(mounted(&foreign_mount).map(|m| m.2), Some("tmpfs".into()));
    assert_eq!(std::fs::read(foreign_mount.join("keep")).unwrap(), b"k");
    let file = k.target("file");
    std::fs::write(&file, b"f").unwrap();
    expect(
        n.node_unpublish_volume(unpublish_req(&id, &file)).await,
        Code::FailedPrecondition,
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"f");
    let full_dir = k.target("full");
    std::fs::create_dir(&full_dir).unwrap();
    std::fs::write(full_dir.join("x"), b"x").unwrap();
    expect(
        n.node_unpublish_volume(unpublish_req(&id, &full_dir)).await,
        Code::FailedPrecondition,
    );
    assert!(full_dir.join("x").exists());
    // A device node of another, live device (the VG's loop device).
    let loop_dev = thinpool_csi::pool::loopdev::find_loop_for_file(&d.backing_file())
        .unwrap()
        .unwrap();
    let (ma, mi) = thinpool_csi::sys::device_numbers(&loop_dev)
        .unwrap()
        .unwrap();
    let node = k.target("node");
    thinpool_csi::sys::make_block_node(&node, ma, mi, 0o600).unwrap();
    expect(
        n.node_unpublish_volume(unpublish_req(&id, &node)).await,
        Code::FailedPrecondition,
    );
    assert!(std::fs::metadata(&node)
        .unwrap()
        .file_type()
        .is_block_device());
    // The stage into the foreign mount neither activated nor formatted.
    assert!(!is_active(&d, &id));
    assert_eq!(mkfs_runs(&d), 0);
    sh("umount", &[&s(&foreign_mount)]);
}

/// Create, stage, publish (rw and ro), write, expand online, unpublish,
/// unstage, stage again: for one filesystem type.
async fn fs_lifecycle(name: &str, fs: &str, size: u64, grown: u64) {
    let k = Kubelet::new(name);
    let d = TestDriver::start(name, 256 * MIB, &k.extra()).await;
    let mut n = d.node().await;
    let cap = mount_flags(fs, &["noatime"]);
    let id = create(&d, name, size, cap.clone()).await;
    let staging = k.staging(name);
    let (t1, t2) = (k.target("rw"), k.target("ro"));

    stage(&mut n, &id, &staging, cap.clone()).await;
    stage(&mut n, &id, &staging, cap.clone()).await;
    let (ma, mi, mounted_fs) = mounted(&staging).expect("staged");
    assert_eq!(mounted_fs, fs);
    let lv = lvs(&d.vg);
    assert_eq!(lv.find(&id).unwrap().kernel, Some((ma, mi)));
    assert_eq!(mkfs_runs(&d), 1);
    let uuid = blkid_uuid(&dev(&d, &id));
    assert!(!uuid.is_empty());

    for _ in 0..2 {
        publish(&mut n, &id, &staging, &t1, cap.clone(), false).await;
    }
    std::fs::write(t1.join("data"), b"survives").unwrap();
    File::open(t1.join("data")).unwrap().sync_all().unwrap();
    publish(&mut n, &id, &staging, &t2, cap.clone(), true).await;
    publish(&mut n, &id, &staging, &t2, cap.clone(), true).await;
    let err = std::fs::write(t2.join("nope"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(std::fs::read(t2.join("data")).unwrap(), b"survives");
    // Same target, other arguments.
    expect(
        n.node_publish_volume(publish_req(&id, &staging, &t1, cap.clone(), true))
            .await,
        Code::AlreadyExists,
    );
    // SINGLE_NODE_SINGLE_WRITER with other publishes present.
    expect(
        n.node_publish_volume(publish_req(
            &id,
            &staging,
            &k.target("single"),
            with_mode(cap.clone(), Mode::SingleNodeSingleWriter),
            false,
        ))
        .await,
        Code::FailedPrecondition,
    );

    let st = stats(&mut n, &id, &t1).await;
    assert!(!condition(&st).0, "{}", condition(&st).1);
    assert_eq!(st.usage.len(), 2, "bytes and inodes: {st:?}");
    assert!(st.usage[0].total > 0 && st.usage[1].total > 0);

    // Online expansion.
    let before = statvfs_total(&t1);
    assert!(controller_expand(&d, &id, grown).await);
    if fs == "xfs" {
        // xfs grows through the mount point (ext4 through the device): a
        // filesystem mounted over every path of the volume after the
        // driver's look is refused, and nothing is grown.
        for p in [&staging, &t1] {
            sh("mount", &["-t", "tmpfs", "none", &s(p)]);
        }
        let msg = expect(
            n.node_expand_volume(expand_req(&id, &t1, &staging, grown))
                .await,
            Code::FailedPrecondition,
        );
        assert!(
            msg.contains("unmount what was mounted or linked over the path"),
            "{msg}"
        );
        for p in [&t1, &staging] {
            sh("umount", &[&s(p)]);
        }
        assert_eq!(statvfs_total(&t1), before, "nothing grown");
    }
    // Through the read-only publish first: the grow takes a writable
    // mount of the volume. Then again: a no-op.
    for path in [&t2, &t1] {
        let r = n
            .node_expand_volume(expand_req(&id, path, &staging, grown))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, grown as i64);
    }
    let after = statvfs_total(&t1);
    eprintln!("{fs}: filesystem size {before} -> {after} bytes after growing the LV to {grown}");
    if fs == "xfs" {
        // Grown by the ioctls on the checked mount root, then left alone.
        let log = d.log();
        let grew: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("grew xfs filesystem"))
            .collect();
        assert_eq!(grew.len(), 1, "{log}");
        eprintln!("{}", grew[0]);
        assert!(
            log.contains("xfs filesystem already spans its device"),
            "{log}"
        );
    }
    assert!(after > before + (grown - size) / 2, "{before} -> {after}");
    assert_eq!(statvfs_total(&t2), after, "the read-only bind sees it too");

    // Unstaging while published is refused, and so is deleting the volume
    // (nothing removed); then tear down, twice each.
    expect(
        n.node_unstage_volume(unstage_req(&id, &staging)).await,
        Code::FailedPrecondition,
    );
    let mut c = d.controller().await;
    let msg = expect(
        c.delete_volume(crate::fixtures::del(&id)).await,
        Code::FailedPrecondition,
    );
    assert!(msg.contains("is staged on this node"), "{msg}");
    assert!(
        lvs(&d.vg).find(&id).is_some(),
        "a refused delete removed the LV"
    );
    for t in [&t1, &t2, &t1, &t2] {
        unpublish(&mut n, &id, t).await;
    }
    assert!(!t1.exists() && !t2.exists(), "target directories removed");
    unstage(&mut n, &id, &staging).await;
    unstage(&mut n, &id, &staging).await;
    assert_eq!(mounted(&staging), None);
    assert!(staging.is_dir(), "the CO's staging directory stays");
    assert!(!is_active(&d, &id), "deactivated after unstage");

    // Stage again: same filesystem, data intact, no mkfs.
    stage(&mut n, &id, &staging, cap.clone()).await;
    assert_eq!(blkid_uuid(&dev(&d, &id)), uuid);
    assert_eq!(mkfs_runs(&d), 1, "no second mkfs");
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"survives");
    assert!(statvfs_total(&staging) >= after);
    unstage(&mut n, &id, &staging).await;
    assert!(mounts_under(k.root.path()).is_empty());
    c.delete_volume(crate::fixtures::del(&id)).await.unwrap();
    assert!(lvs(&d.vg).find(&id).is_none(), "deleted once unstaged");
}

#[tokio::test(flavor = "multi_thread")]
async fn ext4_lifecycle_readonly_and_online_expand() {
    fs_lifecycle("next4", "ext4", 64 * MIB, 128 * MIB).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn xfs_lifecycle_readonly_and_online_expand() {
    // mkfs.xfs refuses filesystems under 300 MiB.
    fs_lifecycle("nxfs", "xfs", 320 * MIB, 480 * MIB).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn block_lifecycle_readonly_single_writer_and_expand() {
    let k = Kubelet::new("blk");
    let d = TestDriver::start("nblk", 256 * MIB, &k.extra()).await;
    let mut n = d.node().await;
    let cap = block_cap();
    let id = create(&d, "blk", 32 * MIB, cap.clone()).await;
    let staging = k.staging("blk");
    let (t1, t2) = (k.target("rw"), k.target("ro"));

    stage(&mut n, &id, &staging, cap.clone()).await;
    stage(&mut n, &id, &staging, cap.clone()).await;
    assert_eq!(mounted(&staging), None, "block staging mounts nothing");
    expect(
        n.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
            .await,
        Code::FailedPrecondition,
    );
    let lv_numbers = lvs(&d.vg).find(&id).unwrap().kernel.unwrap();

    for _ in 0..2 {
        publish(&mut n, &id, &staging, &t1, cap.clone(), false).await;
    }
    let meta = std::fs::metadata(&t1).unwrap();
    assert!(meta.file_type().is_block_device());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        thinpool_csi::sys::device_numbers(&t1).unwrap(),
        Some(lv_numbers)
    );
    let data = pattern(64 * 1024, 7);
    write_at(&t1, MIB, &data).unwrap();

    for _ in 0..2 {
        publish(&mut n, &id, &staging, &t2, cap.clone(), true).await;
    }
    assert_ne!(
        thinpool_csi::sys::device_numbers(&t2).unwrap(),
        Some(lv_numbers),
        "read-only publish goes through an overlay"
    );
    let err = write_at(&t2, MIB, b"overwrite").unwrap_err();
    eprintln!("write to the read-only block publish: {err}");
    assert_eq!(read_at(&t2, MIB, data.len()), data);
    assert_eq!(read_at(&t1, MIB, data.len()), data, "nothing was written");

    expect(
        n.node_publish_volume(publish_req(&id, &staging, &t1, cap.clone(), true))
            .await,
        Code::AlreadyExists,
    );
    expect(
        n.node_publish_volume(publish_req(
            &id,
            &staging,
            &k.target("single"),
            with_mode(cap.clone(), Mode::SingleNodeSingleWriter),
            false,
        ))
        .await,
        Code::FailedPrecondition,
    );
    assert!(!k.target("single").exists());

    for p in [&t1, &staging] {
        let st = stats(&mut n, &id, p).await;
        assert!(!condition(&st).0, "{}", condition(&st).1);
        assert_eq!(st.usage.len(), 1);
        assert_eq!(st.usage[0].total, 32 * MIB as i64);
    }

    // Growth: no fs step, but the node step is required (read-only
    // publishes are overlays it resizes), and every publish sees the size.
    assert!(controller_expand(&d, &id, 64 * MIB).await);
    let r = n
        .node_expand_volume(expand_req(&id, &t1, &staging, 64 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 64 * MIB as i64);
    assert_eq!(block_size(&t1), 64 * MIB);
    assert_eq!(block_size(&t2), 64 * MIB, "the read-only overlay grew too");

    expect(
        n.node_unstage_volume(unstage_req(&id, &staging)).await,
        Code::FailedPrecondition,
    );
    for t in [&t2, &t1, &t2, &t1] {
        unpublish(&mut n, &id, t).await;
    }
    assert!(!t1.exists() && !t2.exists());
    let overlays = sh("dmsetup", &["ls"]);
    assert!(!overlays.contains("tpcsi-ro-"), "overlay left: {overlays}");
    unstage(&mut n, &id, &staging).await;
    unstage(&mut n, &id, &staging).await;
    assert!(!is_active(&d, &id));
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);

    stage(&mut n, &id, &staging, cap.clone()).await;
    publish(&mut n, &id, &staging, &t1, cap.clone(), false).await;
    assert_eq!(read_at(&t1, MIB, data.len()), data, "data survived restage");
    unpublish(&mut n, &id, &t1).await;
    // Someone still has the device open: unstage succeeds, the LV stays.
    let holder = File::open(dev(&d, &id)).unwrap();
    unstage(&mut n, &id, &staging).await;
    assert!(is_active(&d, &id), "an LV in use is not deactivated");
    drop(holder);
    unstage(&mut n, &id, &staging).await;
    assert!(!is_active(&d, &id));
}

#[tokio::test(flavor = "multi_thread")]
async fn format_guard_leaves_unknown_data_and_other_filesystems_alone() {
    let k = Kubelet::new("guard");
    let d = TestDriver::start("nguard", 256 * MIB, &k.extra()).await;
    let mut n = d.node().await;

    // Data without any signature blkid knows.
    let raw = create(&d, "raw", 32 * MIB, mount_cap("ext4")).await;
    let raw_dev = dev(&d, &raw);
    let data = pattern(256 * 1024, 99);
    lvm(&["lvchange", "-ay", &format!("{}/{raw}", d.vg)]);
    write_at(Path::new(&raw_dev), 4 * MIB, &data).unwrap();
    assert_eq!(blkid_code(&raw_dev), 2, "blkid sees nothing");
    lvm(&["lvchange", "-an", &format!("{}/{raw}", d.vg)]);
    let st = k.staging("raw");
    let msg = expect(
        n.node_stage_volume(stage_req(&raw, &st, mount_cap("ext4")))
            .await,
        Code::FailedPrecondition,
    );
    eprintln!("raw data: {msg}");
    assert!(msg.contains("refusing to format"), "{msg}");
    assert_eq!(mounted(&st), None);
    assert!(
        !is_active(&d, &raw),
        "the failed stage deactivated it again"
    );
    lvm(&["lvchange", "-ay", &format!("{}/{raw}", d.vg)]);
    assert_eq!(blkid_code(&raw_dev), 2);
    assert_eq!(read_at(Path::new(&raw_dev), 4 * MIB, data.len()), data);
    lvm(&["lvchange", "-an", &format!("{}/{raw}", d.vg)]);

    // ext4 on a volume staged as xfs.
    let other = create(&d, "other", 320 * MIB, mount_cap("xfs")).await;
    let other_dev = dev(&d, &other);
    lvm(&["lvchange", "-ay", &format!("{}/{other}", d.vg)]);
    sh("mkfs.ext4", &["-q", &other_dev]);
    let uuid = blkid_uuid(&other_dev);
    lvm(&["lvchange", "-an", &format!("{}/{other}", d.vg)]);
    let st = k.staging("other");
    let msg = expect(
        n.node_stage_volume(stage_req(&other, &st, mount_cap("xfs")))
            .await,
        Code::FailedPrecondition,
    );
    eprintln!("ext4 staged as xfs: {msg}");
    assert!(msg.contains("ext4") && msg.contains("xfs"), "{msg}");
    assert_eq!(mounted(&st), None);
    lvm(&["lvchange", "-ay", &format!("{}/{other}", d.vg)]);
    assert_eq!(blkid_uuid(&other_dev), uuid, "still the same ext4");
    lvm(&["lvchange", "-an", &format!("{}/{other}", d.vg)]);
    assert_eq!(mkfs_runs(&d), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn volume_condition_turns_abnormal() {
    let k = Kubelet::new("cond");
    // A tiny pool (about 40 MiB of data) that a block volume can fill.
    let d = TestDriver::start("ncond", 64 * MIB, &k.extra()).await;
    let mut n = d.node().await;

    let id = create(&d, "fsvol", 16 * MIB, mount_cap("ext4")).await;
    let staging = k.staging("fsvol");
    stage(&mut n, &id, &staging, mount_cap("ext4")).await;
    let st = stats(&mut n, &id, &staging).await;
    assert!(!condition(&st).0, "{}", condition(&st).1);
    // The staging mount disappears behind the driver's back.
    sh("umount", &[&s(&staging)]);
    let st = stats(&mut n, &id, &staging).await;
    let (abnormal, msg) = condition(&st);
    eprintln!("after a foreign umount: {msg}");
    assert!(abnormal && msg.contains("not mounted"), "{msg}");
    unstage(&mut n, &id, &staging).await;
    // Unstaged, the volume is no longer at that path (spec: NOT_FOUND,
    // "does not exist on specified volume_path").
    let msg = expect(
        n.node_get_volume_stats(stats_req(&id, &staging)).await,
        Code::NotFound,
    );
    eprintln!("after unstage: {msg}");

    // Fill the pool through a block volume bigger than it.
    lvm(&[
        "lvchange",
        "--errorwhenfull",
        "y",
        &format!("{}/pool", d.vg),
    ]);
    let late = create(&d, "late", 16 * MIB, mount_cap("ext4")).await;
    let fill = create(&d, "fill", 64 * MIB, block_cap()).await;
    let fst = k.staging("fill");
    let target = k.target("fill");
    stage(&mut n, &fill, &fst, block_cap()).await;
    publish(&mut n, &fill, &fst, &target, block_cap(), false).await;
    let before = stats(&mut n, &fill, &target).await;
    assert!(!condition(&before).0, "{}", condition(&before).1);
    let out = fill_through(&target);
    eprintln!(
        "dd into the pool: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    assert!(!out.status.success(), "the pool must run out of space");
    let pct = pool_data_percent(&d.vg);
    let st = stats(&mut n, &fill, &target).await;
    let (abnormal, msg) = condition(&st);
    eprintln!("pool at {pct}%: {msg}");
    assert!(abnormal && msg.contains("full"), "{msg}");
    // A full pool gets no mkfs (it would hang or fail half-way).
    let mkfs_before = mkfs_runs(&d);
    let msg = expect(
        n.node_stage_volume(stage_req(&late, &k.staging("late"), mount_cap("ext4")))
            .await,
        Code::ResourceExhausted,
    );
    eprintln!("stage into a full pool: {msg}");
    assert_eq!(mkfs_runs(&d), mkfs_before);
    assert!(!is_active(&d, &late));
    unpublish(&mut n, &fill, &target).await;
    unstage(&mut n, &fill, &fst).await;
}

/// The figures the issue asks for: NodeStage against bare mkfs + mount,
/// and what staging an empty large volume costs the pool.
#[tokio::test(flavor = "multi_thread")]
async fn measure_stage_cost_and_pool_use() {
    let k = Kubelet::new("meas");
    let d = TestDriver::start(
        "nmeas",
        256 * MIB,
        &format!("{}overprovision_ratio = 200.0\n", k.extra()),
    )
    .await;
    let mut n = d.node().await;
    let gib = 1024 * MIB;
    let pool_bytes = lvs(&d.vg).find("pool").unwrap().size as f64;
    let mib = |pct: f64| pct / 100.0 * pool_bytes / MIB as f64;

    for fs in ["ext4", "xfs"] {
        let id = create(&d, &format!("big-{fs}"), 10 * gib, mount_cap(fs)).await;
        let staging = k.staging(&format!("big-{fs}"));
        let p0 = pool_data_percent(&d.vg);
        let log_before = d.log().len();
        let t = Instant::now();
        stage(&mut n, &id, &staging, mount_cap(fs)).await;
        let staged = t.elapsed();
        // Where the time went, from the driver's own log.
        for line in d.log()[log_before..].lines() {
            eprintln!("  stage {fs}: {line}");
        }
        let p1 = pool_data_percent(&d.vg);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let p2 = pool_data_percent(&d.vg);
        unstage(&mut n, &id, &staging).await;

        // The same by hand, with the tools' defaults.
        let bare = format!("bare-{fs}");
        lvm(&[
            "lvcreate",
            "--type",
            "thin",
            "--virtualsize",
            "10g",
            "--thinpool",
            &format!("{}/pool", d.vg),
            "--name",
            &bare,
            "--yes",
            &d.vg,
        ]);
        let bare_dev = format!("/dev/{}/{bare}", d.vg);
        let mnt = k.staging(&bare);
        let b0 = pool_data_percent(&d.vg);
        let t = Instant::now();
        sh(&format!("mkfs.{fs}"), &["-q", &bare_dev]);
        if fs == "xfs" {
            sh("mount", &["-o", "nouuid", &bare_dev, &s(&mnt)]);
        } else {
            sh("mount", &[&bare_dev, &s(&mnt)]);
        }
        let by_hand = t.elapsed();
        let b1 = pool_data_percent(&d.vg);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let b2 = pool_data_percent(&d.vg);
        sh("umount", &[&s(&mnt)]);
        lvm(&["lvremove", "--yes", &format!("{}/{bare}", d.vg)]);

        eprintln!(
            "MEASURE {fs} 10 GiB volume, pool {:.0} MiB: NodeStageVolume {:.2} s, pool +{:.1} MiB \
             (+{:.1} MiB 5 s later); bare mkfs.{fs} + mount {:.2} s, pool +{:.1} MiB (+{:.1} MiB 5 s later)",
            pool_bytes / MIB as f64,
            staged.as_secs_f64(),
            mib(p1 - p0),
            mib(p2 - p0),
            by_hand.as_secs_f64(),
            mib(b1 - b0),
            mib(b2 - b0),
        );
        assert!(
            mib(p2 - p0) < 100.0,
            "staging an empty 10 GiB {fs} volume must not take a large part of the pool"
        );
    }
}

/// Writes random data through a block device until it fails (the pool
/// runs out of space); returns dd's result.
fn fill_through(dev: &Path) -> std::process::Output {
    Command::new("dd")
        .args([
            "if=/dev/urandom",
            &format!("of={}", dev.display()),
            "bs=1M",
            "oflag=direct",
        ])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn healer_heals_mounts_activation_and_dev_node_and_restart_restages() {
    let k = Kubelet::new("heal");
    let mut d = TestDriver::start("nheal", 128 * MIB, &k.extra()).await;
    let mut n = d.node().await;
    let id = create(&d, "healme", 16 * MIB, mount_cap("ext4")).await;
    let staging = k.staging("healme");
    let target = k.target("healme");
    stage(&mut n, &id, &staging, mount_cap("ext4")).await;
    publish(&mut n, &id, &staging, &target, mount_cap("ext4"), false).await;
    std::fs::write(target.join("data"), b"kept through healing").unwrap();
    let read = || std::fs::read(target.join("data")).unwrap_or_default();
    let cap = Some(mount_cap("ext4"));
    assert!(!heal(&d, &id, &target, &staging, cap.clone()).await.0);

    // Both mounts vanish behind the driver's back.
    sh("umount", &[&s(&target)]);
    sh("umount", &[&s(&staging)]);
    let (abnormal, msg) = heal(&d, &id, &target, &staging, cap.clone()).await;
    assert!(
        abnormal && msg.contains("re-mounted") && msg.contains("re-bound"),
        "{msg}"
    );
    assert!(msg.starts_with("device class default: "), "{msg}");
    assert_eq!(read(), b"kept through healing");
    assert!(
        !heal(&d, &id, &target, &staging, cap.clone()).await.0,
        "healed for good"
    );

    // The LV is deactivated behind the driver's back.
    sh("umount", &[&s(&target)]);
    sh("umount", &[&s(&staging)]);
    lvm(&["lvchange", "-an", &format!("{}/{id}", d.vg)]);
    let (abnormal, msg) = heal(&d, &id, &target, &staging, cap.clone()).await;
    assert!(abnormal && msg.contains("re-activated"), "{msg}");
    assert_eq!(read(), b"kept through healing");

    // The device node is deleted behind the driver's back.
    std::fs::remove_file(dev(&d, &id)).unwrap();
    let (abnormal, msg) = heal(&d, &id, &target, &staging, cap.clone()).await;
    assert!(abnormal && msg.contains("device node"), "{msg}");
    let meta = std::fs::metadata(dev(&d, &id)).unwrap();
    assert!(meta.file_type().is_block_device());
    assert!(!heal(&d, &id, &target, &staging, cap.clone()).await.0);

    // A "reboot": the driver stops, the mounts and the activation are gone;
    // at start-up the driver re-stages what was staged.
    d.stop();
    sh("umount", &[&s(&target)]);
    sh("umount", &[&s(&staging)]);
    lvm(&["lvchange", "-an", &format!("{}/{id}", d.vg)]);
    d.spawn_and_heal().await;
    assert!(
        mounted(&staging).is_some(),
        "not re-staged; log:\n{}",
        d.log()
    );
    // The CO re-publishes; the data is there.
    let mut n = d.node().await;
    publish(&mut n, &id, &staging, &target, mount_cap("ext4"), false).await;
    assert_eq!(read(), b"kept through healing");

    // Bad input is refused before anything is touched.
    use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
    use thinpool_csi::proto::healer::NodeHealerRequest;
    let mut h = HealerNodeClient::connect(d.addons_uri()).await.unwrap();
    for (req, want) in [
        (
            NodeHealerRequest {
                volume_id: id.clone(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeHealerRequest {
                volume_id: "vg0/root".into(),
                volume_path: s(&target),
                ..Default::default()
            },
            Code::NotFound,
        ),
        (
            NodeHealerRequest {
                volume_id: id.clone(),
                volume_path: "/etc".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            NodeHealerRequest {
                volume_id: id.clone(),
                volume_path: format!("{}/../../etc", s(&target)),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
    ] {
        let e = h.node_healer(req).await.unwrap_err();
        assert_eq!(e.code(), want, "{e:?}");
    }
    unpublish(&mut n, &id, &target).await;
    unstage(&mut n, &id, &staging).await;
    let record = d.state_dir().join("volumes").join(format!("{id}.json"));
    assert!(!record.exists(), "unstage drops the node record");
}

#[tokio::test(flavor = "multi_thread")]
async fn healer_restores_block_node_and_leaves_a_full_pool_alone() {
    let k = Kubelet::new("hfull");
    let d = TestDriver::start("nhfull", 64 * MIB, &k.extra()).await;
    let mut n = d.node().await;
    lvm(&[
        "lvchange",
        "--errorwhenfull",
        "y",
        &format!("{}/pool", d.vg),
    ]);
    let fill = create(&d, "hfill", 64 * MIB, block_cap()).await;
    let staging = k.staging("hfill");
    let target = k.target("hfill");
    stage(&mut n, &fill, &staging, block_cap()).await;
    publish(&mut n, &fill, &staging, &target, block_cap(), false).await;
    // A deleted block device node is re-created.
    std::fs::remove_file(&target).unwrap();
    let (abnormal, msg) = heal(&d, &fill, &target, &staging, Some(block_cap())).await;
    assert!(abnormal && msg.contains("re-created"), "{msg}");
    assert!(std::fs::metadata(&target)
        .unwrap()
        .file_type()
        .is_block_device());
    // Fill the pool to 100 %: reported, and not "healed".
    let out = fill_through(&target);
    assert!(!out.status.success(), "the pool must run out of space");
    std::fs::remove_file(&target).unwrap();
    let (abnormal, msg) = heal(&d, &fill, &target, &staging, Some(block_cap())).await;
    assert!(
        abnormal && msg.contains("full") && msg.contains("nothing was changed"),
        "{msg}"
    );
    assert!(
        !target.exists(),
        "nothing is touched while the pool is full"
    );
    // A full pool invites no claim: GetCapacity's maximum_volume_size,
    // which Kubernetes' scheduler reads first, is 0 too (the heal above
    // read a fresh report).
    let cap = d.capacity().await;
    assert_eq!(
        (cap.available_capacity, cap.maximum_volume_size),
        (0, Some(0)),
        "{cap:?}"
    );
    unstage(&mut n, &fill, &staging).await;
}

/// `controller_expansion = false` (a CO without a controller-side resizer):
/// controller EXPAND_VOLUME is not advertised and ControllerExpandVolume
/// is UNIMPLEMENTED; NodeExpandVolume grows the LV, then the filesystem
/// or the block device, online; what it refuses leaves the LV as it was.
#[tokio::test(flavor = "multi_thread")]
async fn node_expand_grows_the_lv_when_controller_expansion_is_off() {
    let k = Kubelet::new("nogrow");
    let extra = format!("{}controller_expansion = false\n", k.extra());
    let d = TestDriver::start("nogrow", 256 * MIB, &extra).await;
    let mut c = d.controller().await;
    let mut n = d.node().await;
    let caps = c
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let expand = controller_service_capability::rpc::Type::ExpandVolume as i32;
    assert!(
        !caps.iter().any(|cap| matches!(&cap.r#type,
            Some(controller_service_capability::Type::Rpc(r)) if r.r#type == expand)),
        "EXPAND_VOLUME advertised: {caps:?}"
    );
    let fs = create(&d, "nogrow-fs", 32 * MIB, mount_cap("ext4")).await;
    let e = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: fs.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: (64 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{}", e.message());
    let size_of = |id: &str| lvs(&d.vg).find(id).map(|lv| lv.size).unwrap();
    assert_eq!(size_of(&fs), 32 * MIB, "a refused call grows nothing");

    let node_expand = |id: &str, path: &Path, bytes: u64| NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.to_str().unwrap().into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    // A filesystem volume, published: the LV, then the filesystem, grow.
    let (st, tg) = (k.staging("fs"), k.target("fs"));
    stage(&mut n, &fs, &st, mount_cap("ext4")).await;
    publish(&mut n, &fs, &st, &tg, mount_cap("ext4"), false).await;
    let before = statvfs_total(&tg);
    for _ in 0..2 {
        let got = n
            .node_expand_volume(node_expand(&fs, &tg, 64 * MIB))
            .await
            .unwrap_or_else(|e| panic!("NodeExpandVolume: {e}"))
            .into_inner();
        assert_eq!(got.capacity_bytes, (64 * MIB) as i64, "idempotent too");
    }
    assert_eq!(size_of(&fs), 64 * MIB);
    assert!(
        statvfs_total(&tg) > before + 24 * MIB,
        "the filesystem grew: {before} -> {}",
        statvfs_total(&tg)
    );
    // More than the pool may hand out: refused, and nothing grows.
    let e = n
        .node_expand_volume(node_expand(&fs, &tg, 64 * 1024 * MIB))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert_eq!(size_of(&fs), 64 * MIB);
    // Not at that path: NOT_FOUND, and nothing grows.
    let e = n
        .node_expand_volume(node_expand(&fs, &k.path("nowhere/vol"), 96 * MIB))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    assert_eq!(size_of(&fs), 64 * MIB);
    unpublish(&mut n, &fs, &tg).await;
    unstage(&mut n, &fs, &st).await;

    // A raw block volume: the LV and its published device grow.
    let blk = create(&d, "nogrow-blk", 8 * MIB, block_cap()).await;
    let (st, tg) = (k.staging("blk"), k.target("blk"));
    stage(&mut n, &blk, &st, block_cap()).await;
    publish(&mut n, &blk, &st, &tg, block_cap(), false).await;
    let got = n
        .node_expand_volume(node_expand(&blk, &tg, 16 * MIB))
        .await
        .unwrap_or_else(|e| panic!("NodeExpandVolume (block): {e}"))
        .into_inner();
    assert_eq!(got.capacity_bytes, (16 * MIB) as i64);
    assert_eq!(size_of(&blk), 16 * MIB);
    let dev_size = sh("blockdev", &["--getsize64", tg.to_str().unwrap()]);
    assert_eq!(dev_size.trim(), (16 * MIB).to_string());
    unpublish(&mut n, &blk, &tg).await;
    unstage(&mut n, &blk, &st).await;
}
