//! Snapshots, restores and clones, through the socket: thin snapshots of
//! a mounted volume under a writer, restores larger than their source,
//! snapshots that outlive their source, clones that leave their source
//! alone, xfs copies mounted next to their origin; and ControllerModifyVolume.

use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use crate::fixtures::{
    create_req, create_volume, del, mount_cap, mounts_under, snap_req, snapshot_of, stage_req,
    unstage_req, Kubelet,
};
use crate::harness::{lvm, lvs, TestDriver, MIB};

fn from_snapshot(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    });
    req
}

fn from_volume(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: id.into(),
            },
        )),
    });
    req
}

async fn list(
    c: &mut ControllerClient<Channel>,
    snapshot_id: &str,
    source: &str,
    max: i32,
    token: &str,
) -> (Vec<String>, String) {
    let r = c
        .list_snapshots(ListSnapshotsRequest {
            max_entries: max,
            starting_token: token.into(),
            source_volume_id: source.into(),
            snapshot_id: snapshot_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (
        r.entries
            .into_iter()
            .map(|e| e.snapshot.unwrap().snapshot_id)
            .collect(),
        r.next_token,
    )
}

async fn stage(n: &mut NodeClient<Channel>, id: &str, staging: &Path, fs: &str) {
    n.node_stage_volume(stage_req(id, staging, mount_cap(fs)))
        .await
        .unwrap_or_else(|e| panic!("stage {id}: {e:?}"));
}

async fn unstage(n: &mut NodeClient<Channel>, id: &str, staging: &Path) {
    n.node_unstage_volume(unstage_req(id, staging))
        .await
        .unwrap_or_else(|e| panic!("unstage {id}: {e:?}"));
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn write_synced(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn fs_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    st.blocks() as u64 * st.fragment_size() as u64
}

/// A driver on `k` with two ext4 volumes, a 64 MiB source staged (with
/// `synced` written and fsynced in it) and a 16 MiB other one; the
/// source's staging path.
async fn source_and_other(
    name: &str,
    k: &Kubelet,
    synced: &[u8],
) -> (
    TestDriver,
    ControllerClient<Channel>,
    NodeClient<Channel>,
    String,
    String,
    PathBuf,
) {
    let d = TestDriver::start(name, 256 * MIB, &k.extra()).await;
    let (mut c, mut n) = (d.controller().await, d.node().await);
    let src = create_volume(&mut c, create_req("zsnap-src", 64 * MIB, mount_cap("ext4")))
        .await
        .volume_id;
    let other = create_volume(
        &mut c,
        create_req("zsnap-other", 16 * MIB, mount_cap("ext4")),
    )
    .await
    .volume_id;
    let st = k.staging("src");
    stage(&mut n, &src, &st, "ext4").await;
    write_synced(&st.join("synced"), synced);
    (d, c, n, src, other, st)
}

/// Snapshot a mounted ext4 volume while a writer runs; restore it larger;
/// delete the source and restore again; every call repeated.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_under_a_writer_restores_what_was_synced() {
    let k = Kubelet::new("zsnap");
    let synced = pattern(3 * MIB as usize, 7);
    let (d, mut c, mut n, src, other, st) = source_and_other("zsnap", &k, &synced).await;

    // A writer keeps writing while the snapshot is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), st.join("busy"));
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(path).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Round and round over 8 MiB: busy, never full.
                if n % 2048 == 0 {
                    f.seek(std::io::SeekFrom::Start(0)).unwrap();
                }
                f.write_all(&[n as u8; 4096]).unwrap();
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s1 = snapshot_of(&mut c, "zsnap-1", &src).await;
    stop.store(true, Ordering::Relaxed);
    let blocks = writer.join().unwrap();
    eprintln!("MEASURE snapshot taken under a writer that wrote {blocks} blocks");
    assert!(s1.ready_to_use);
    assert_eq!(s1.source_volume_id, src);
    assert_eq!(s1.size_bytes, 64 * MIB as i64);
    let created = s1.creation_time.expect("creation_time").seconds;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - created).abs() < 600,
        "creation_time {created}, now {now}"
    );
    // A restore larger than the source; its filesystem grows at stage.
    let req = from_snapshot(
        create_req("zsnap-r1", 96 * MIB, mount_cap("ext4")),
        &s1.snapshot_id,
    );
    let r1 = create_volume(&mut c, req.clone()).await;
    assert_eq!(r1.capacity_bytes, 96 * MIB as i64);
    let st_r1 = k.staging("r1");
    stage(&mut n, &r1.volume_id, &st_r1, "ext4").await;
    stage(&mut n, &r1.volume_id, &st_r1, "ext4").await;
    assert_eq!(std::fs::read(st_r1.join("synced")).unwrap(), synced);
    let (grown, orig) = (fs_bytes(&st_r1), fs_bytes(&st));
    eprintln!("MEASURE restore: source fs {orig} bytes, restored fs {grown} bytes");
    assert!(
        grown > orig + 24 * MIB,
        "the restored filesystem grew: {orig} -> {grown}"
    );
    unstage(&mut n, &r1.volume_id, &st_r1).await;

    // The source goes; the snapshot stays and restores again.
    unstage(&mut n, &src, &st).await;
    c.delete_volume(del(&src)).await.unwrap();
    assert_eq!(list(&mut c, &s1.snapshot_id, "", 0, "").await.0.len(), 1);
    let r2 = create_volume(
        &mut c,
        from_snapshot(
            create_req("zsnap-r2", 64 * MIB, mount_cap("ext4")),
            &s1.snapshot_id,
        ),
    )
    .await;
    // The snapshot was cut under a writer; LVM's suspend froze the
    // filesystem for it, so the copy is clean as it stands: no journal to
    // replay, nothing for a forced, read-only fsck to find.
    let lv = format!("{}/{}", d.vg, r2.volume_id);
    lvm(&["lvchange", "--activate", "y", "--ignoreactivationskip", &lv]);
    let fsck = std::process::Command::new("e2fsck")
        .args(["-fn", &format!("/dev/{lv}")])
        .output()
        .unwrap();
    eprintln!(
        "MEASURE fsck of a snapshot cut under a writer: {} {}",
        fsck.status,
        String::from_utf8_lossy(&fsck.stdout)
            .lines()
            .last()
            .unwrap_or("")
    );
    assert!(fsck.status.success(), "{fsck:?}");
    lvm(&["lvchange", "--activate", "n", &lv]);
    let st_r2 = k.staging("r2");
    stage(&mut n, &r2.volume_id, &st_r2, "ext4").await;
    assert_eq!(std::fs::read(st_r2.join("synced")).unwrap(), synced);
    unstage(&mut n, &r2.volume_id, &st_r2).await;

    for id in [&r1.volume_id, &r2.volume_id, &other] {
        c.delete_volume(del(id)).await.unwrap();
    }
    for s in [&s1] {
        for _ in 0..2 {
            c.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: s.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
    }
    assert!(list(&mut c, "", "", 0, "").await.0.is_empty());
    let left: Vec<String> = lvs(&d.vg)
        .lvs
        .iter()
        .map(|lv| lv.name.clone())
        .filter(|n| n.starts_with("csi-") || n.starts_with("snap-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(mounts_under(k.root.path()).is_empty());
}

/// CreateSnapshot again is the same snapshot; the same name of another
/// source is a conflict, a missing source not found; the snapshot LV is a
/// read-only thin volume; ListSnapshots finds it by id, by source and in
/// pages.
#[tokio::test(flavor = "multi_thread")]
async fn create_snapshot_is_idempotent_conflicts_and_lists() {
    let k = Kubelet::new("zsnapl");
    let (d, mut c, _n, src, other, _st) = source_and_other("zsnapl", &k, b"s").await;
    let s1 = snapshot_of(&mut c, "zsnap-1", &src).await;
    // Idempotent; the same name from another volume is a conflict.
    assert_eq!(snapshot_of(&mut c, "zsnap-1", &src).await, s1);
    let e = c
        .create_snapshot(snap_req("zsnap-1", &other))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let e = c
        .create_snapshot(snap_req("zsnap-x", "csi-gone-0123456789abcdef"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let snap_lv = lvs(&d.vg).find(&s1.snapshot_id).unwrap().clone();
    assert!(snap_lv.attr.starts_with('V'), "{}", snap_lv.attr);
    assert_eq!(&snap_lv.attr[1..2], "r", "read-only: {}", snap_lv.attr);

    // Listing: by id, by source, and in pages.
    let s2 = snapshot_of(&mut c, "zsnap-2", &other).await;
    assert_eq!(
        list(&mut c, &s1.snapshot_id, "", 0, "").await.0,
        vec![s1.snapshot_id.clone()]
    );
    assert_eq!(
        list(&mut c, "", &other, 0, "").await.0,
        vec![s2.snapshot_id.clone()]
    );
    assert!(list(&mut c, "snap-nope-0123456789abcdef", "", 0, "")
        .await
        .0
        .is_empty());
    let (p1, t1) = list(&mut c, "", "", 1, "").await;
    let (p2, t2) = list(&mut c, "", "", 1, &t1).await;
    assert_eq!(p1.len() + p2.len(), 2, "{p1:?} {p2:?}");
    assert!(t2.is_empty() && !t1.is_empty());
}

/// A volume from a snapshot: CreateVolume again returns it, it names its
/// source; a limit under the snapshot's size is out of range, a missing
/// snapshot not found.
#[tokio::test(flavor = "multi_thread")]
async fn create_from_snapshot_is_idempotent_and_checks_size_and_source() {
    let k = Kubelet::new("zsnapr");
    let (_d, mut c, _n, src, _other, _st) = source_and_other("zsnapr", &k, b"s").await;
    let s1 = snapshot_of(&mut c, "zsnap-1", &src).await;
    let req = from_snapshot(
        create_req("zsnap-r1", 96 * MIB, mount_cap("ext4")),
        &s1.snapshot_id,
    );
    let r1 = create_volume(&mut c, req.clone()).await;
    assert_eq!(r1.capacity_bytes, 96 * MIB as i64);
    assert_eq!(
        create_volume(&mut c, req).await,
        r1,
        "CreateVolume from a snapshot is idempotent"
    );
    assert!(matches!(
        r1.content_source.as_ref().and_then(|s| s.r#type.as_ref()),
        Some(volume_content_source::Type::Snapshot(s)) if s.snapshot_id == s1.snapshot_id
    ));
    let small = from_snapshot(
        create_req("zsnap-small", 16 * MIB, mount_cap("ext4")),
        &s1.snapshot_id,
    );
    let mut small = small;
    small.capacity_range.as_mut().unwrap().limit_bytes = 32 * MIB as i64;
    let e = c.create_volume(small).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let missing = from_snapshot(
        create_req("zsnap-m", 64 * MIB, mount_cap("ext4")),
        "snap-gone-0123456789abcdef",
    );
    let e = c.create_volume(missing).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

/// A clone of a mounted xfs volume mounts next to its origin (same UUID)
/// and takes writes that leave the origin as it was.
#[tokio::test(flavor = "multi_thread")]
async fn xfs_clone_mounts_beside_its_origin_and_leaves_it_alone() {
    let k = Kubelet::new("zclone");
    let d = TestDriver::start("zclone", 256 * MIB, &k.extra()).await;
    let (mut c, mut n) = (d.controller().await, d.node().await);
    let src = create_volume(
        &mut c,
        create_req("zclone-src", 300 * MIB, mount_cap("xfs")),
    )
    .await
    .volume_id;
    let st = k.staging("src");
    stage(&mut n, &src, &st, "xfs").await;
    let data = pattern(MIB as usize, 3);
    write_synced(&st.join("data"), &data);

    let req = from_volume(create_req("zclone-c", 300 * MIB, mount_cap("xfs")), &src);
    let clone = create_volume(&mut c, req.clone()).await;
    assert_eq!(
        create_volume(&mut c, req).await,
        clone,
        "a clone is idempotent"
    );
    let e = c
        .create_volume(from_volume(
            create_req("zclone-blk", 300 * MIB, crate::fixtures::block_cap()),
            &src,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::InvalidArgument,
        "an xfs volume cannot be cloned as block: {e:?}"
    );
    let st_c = k.staging("clone");
    stage(&mut n, &clone.volume_id, &st_c, "xfs").await;
    assert_eq!(std::fs::read(st_c.join("data")).unwrap(), data);
    write_synced(&st_c.join("data"), &pattern(MIB as usize, 99));
    write_synced(&st_c.join("new"), b"only in the clone");
    assert_eq!(
        std::fs::read(st.join("data")).unwrap(),
        data,
        "the source is unchanged"
    );
    assert!(!st.join("new").exists());

    unstage(&mut n, &clone.volume_id, &st_c).await;
    unstage(&mut n, &src, &st).await;
    c.delete_volume(del(&clone.volume_id)).await.unwrap();
    c.delete_volume(del(&src)).await.unwrap();
    assert!(mounts_under(k.root.path()).is_empty());
}

/// ControllerModifyVolume sets the LV's read-ahead (and keeps it in a tag
/// that ControllerGetVolume reports), is idempotent, and refuses unknown
/// and immutable keys; CreateVolume takes the same parameter.
#[tokio::test(flavor = "multi_thread")]
async fn modify_volume_sets_read_ahead() {
    let d = TestDriver::start("zmodify", 128 * MIB, "").await;
    let mut c = d.controller().await;
    let mut req = create_req("zmodify-v", 16 * MIB, mount_cap("ext4"));
    req.mutable_parameters = [("readAheadSectors".to_string(), "256".to_string())].into();
    let id = create_volume(&mut c, req.clone()).await.volume_id;
    assert_eq!(
        create_volume(&mut c, req).await.volume_id,
        id,
        "idempotent with mutable parameters"
    );
    let read_ahead = |vg: &str| lvs(vg).find(&id).unwrap().read_ahead.clone();
    // The harness's lvs prints units with a suffix-free byte count.
    assert_eq!(read_ahead(&d.vg), "131072", "256 sectors at creation");
    let modify = |k: &str, v: &str| ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: [(k.to_string(), v.to_string())].into(),
        ..Default::default()
    };
    for _ in 0..2 {
        c.controller_modify_volume(modify("readAheadSectors", "512"))
            .await
            .unwrap();
        assert_eq!(read_ahead(&d.vg), "262144");
    }
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        got.volume_context
            .get("readAheadSectors")
            .map(String::as_str),
        Some("512")
    );
    let tags = lvs(&d.vg).find(&id).unwrap().tags.clone();
    assert_eq!(
        tags.iter().filter(|t| t.starts_with("tpcsi.m.")).count(),
        1,
        "one tag per parameter: {tags:?}"
    );
    for (k, v) in [
        ("iops", "100"),
        ("volumeGroup", "x"),
        ("readAheadSectors", "7"),
    ] {
        let e = c.controller_modify_volume(modify(k, v)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{k}={v}: {e:?}");
    }
    assert_eq!(
        read_ahead(&d.vg),
        "262144",
        "a refused modify changes nothing"
    );
    let mut gone = modify("readAheadSectors", "512");
    gone.volume_id = "csi-gone-0123456789abcdef".into();
    let e = c.controller_modify_volume(gone).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    c.controller_modify_volume(modify("readAheadSectors", "auto"))
        .await
        .unwrap();
    assert_eq!(read_ahead(&d.vg), "auto");
    c.delete_volume(del(&id)).await.unwrap();
}
