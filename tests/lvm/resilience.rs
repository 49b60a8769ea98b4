//! Resilience: calls their caller abandons, a driver killed mid-call (kill -9
//! storms), a node that reboots, and healing that must not weaken what the
//! CO asked for.
//!
//! Every test plays the CO over the socket: a call that answers ABORTED (an
//! operation on the same volume still runs to its end in the background) or
//! UNAVAILABLE is sent again after 100 ms, as kubelet and the sidecars do.
//! Figures are printed on lines starting with `MEASURE`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thinpool_csi::mountinfo::{Mount, MountInfo};
use thinpool_csi::node::crypt::mapping_name;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::ControllerReclaimSpaceRequest;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::fixtures::{
    block_cap, create_req, crypt_mapping, del, encrypted_req, encryption_table, heal, keyed_stage,
    mkfs_runs, mount_cap, mount_flags, mounts_under, publish_req, read_at, stage_req,
    unpublish_req, unstage_req, write_at, Kubelet, KEY,
};
use crate::harness::{
    abandon_after, dm_devices, dm_of_vg, dm_table_of, dmsetup, drop_caches, lvm, lvs, overlays_of,
    pool_dm_names, rdev_of, retry, retry_n, try_lvm, umount_all_under, Abandoned, TestDriver, MIB,
};

// ---------------------------------------------------------------------------
// A CO with retries, for one driver that stays up
// ---------------------------------------------------------------------------

/// The CO side of the tests that do not kill the driver: every call is
/// retried while it answers ABORTED or UNAVAILABLE ([`retry`]).
struct Co {
    c: ControllerClient<Channel>,
    n: NodeClient<Channel>,
    addons: String,
}

impl Co {
    async fn new(d: &TestDriver) -> Co {
        Co {
            c: d.controller().await,
            n: d.node().await,
            addons: d.addons_uri(),
        }
    }

    async fn create(&self, name: &str, bytes: u64, cap: VolumeCapability) -> String {
        let req = create_req(name, bytes, cap);
        retry(&format!("CreateVolume {name}"), || {
            let (mut c, r) = (self.c.clone(), req.clone());
            async move { c.create_volume(r).await }
        })
        .await
        .volume
        .expect("CreateVolume returns a volume")
        .volume_id
    }

    async fn delete(&self, id: &str) {
        retry(&format!("DeleteVolume {id}"), || {
            let mut c = self.c.clone();
            async move { c.delete_volume(del(id)).await }
        })
        .await;
    }

    /// Returns the number of retries.
    async fn stage(&self, id: &str, staging: &Path, cap: VolumeCapability) -> u32 {
        let req = stage_req(id, staging, cap);
        retry_n(&format!("NodeStageVolume {id}"), || {
            let (mut n, r) = (self.n.clone(), req.clone());
            async move { n.node_stage_volume(r).await }
        })
        .await
        .1
    }

    async fn unstage(&self, id: &str, staging: &Path) {
        retry(&format!("NodeUnstageVolume {id}"), || {
            let mut n = self.n.clone();
            async move { n.node_unstage_volume(unstage_req(id, staging)).await }
        })
        .await;
    }

    async fn publish(
        &self,
        id: &str,
        staging: &Path,
        target: &Path,
        cap: VolumeCapability,
        ro: bool,
    ) -> u32 {
        let req = publish_req(id, staging, target, cap, ro);
        retry_n(&format!("NodePublishVolume {id}"), || {
            let (mut n, r) = (self.n.clone(), req.clone());
            async move { n.node_publish_volume(r).await }
        })
        .await
        .1
    }

    async fn unpublish(&self, id: &str, target: &Path) {
        retry(&format!("NodeUnpublishVolume {id}"), || {
            let mut n = self.n.clone();
            async move { n.node_unpublish_volume(unpublish_req(id, target)).await }
        })
        .await;
    }

    async fn reclaim_client(&self) -> ReclaimSpaceControllerClient<Channel> {
        ReclaimSpaceControllerClient::connect(self.addons.clone())
            .await
            .expect("connect CSI-Addons")
    }
}

fn reclaim_req(id: &str) -> ControllerReclaimSpaceRequest {
    ControllerReclaimSpaceRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// Small helpers: mounts, data, a seeded generator
// ---------------------------------------------------------------------------

/// The mount visible at `p`, if any.
fn mount_at(p: &Path) -> Option<Mount> {
    MountInfo::read().unwrap().top_mount_at(p).cloned()
}

/// The mount at `p`, or a panic naming `what`.
#[track_caller]
fn must_mount(p: &Path, what: &str) -> Mount {
    mount_at(p).unwrap_or_else(|| panic!("{what}: nothing mounted at {}", p.display()))
}

fn has_option(m: &Mount, opt: &str) -> bool {
    m.mount_options.iter().any(|o| o == opt)
}

/// Writes `data` to a new file and fsyncs it.
fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

fn is_block_node(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

/// The device numbers of LV `id` as the kernel has it now.
#[track_caller]
fn lv_numbers(vg: &str, id: &str) -> (u32, u32) {
    lvs(vg)
        .find(id)
        .unwrap_or_else(|| panic!("LV {id} is gone"))
        .kernel
        .unwrap_or_else(|| panic!("LV {id} is not active"))
}

/// SplitMix64: a small seeded generator (the suite has no `rand`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

fn mix(x: u64) -> u64 {
    Rng(x).next()
}

/// Fills `buf`, which sits at byte `offset` (a multiple of 8) of a device,
/// with a pattern of `seed` that depends on the absolute position and has
/// no run of zeroes a reclaim could take for unused space.
fn pattern_at(buf: &mut [u8], offset: u64, seed: u64) {
    for (j, w) in buf.chunks_mut(8).enumerate() {
        let v = mix(seed ^ (offset / 8 + j as u64)) | 1;
        w.copy_from_slice(&v.to_le_bytes()[..w.len()]);
    }
}

const CHUNK: usize = MIB as usize;

/// Writes `len` bytes through a block device node, 1 MiB at a time, each
/// chunk from `fill(offset, chunk)`, then fsyncs.
fn write_device(dev: &Path, len: u64, fill: impl Fn(u64, &mut [u8])) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {} for writing: {e}", dev.display()));
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        fill(off, &mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        off += n as u64;
    }
    f.sync_all().unwrap();
}

/// Reads `len` bytes of a device and compares them with `pattern_at(seed)`;
/// returns the number of 1 MiB chunks that differ and the first differing
/// byte offset.
fn compare_device(dev: &Path, len: u64, seed: u64) -> (usize, Option<u64>) {
    let mut f = std::fs::File::open(dev).unwrap();
    let (mut got, mut want) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let (mut bad, mut first) = (0, None);
    let mut off = 0;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        f.read_exact(&mut got[..n]).unwrap();
        pattern_at(&mut want[..n], off, seed);
        if got[..n] != want[..n] {
            bad += 1;
            if first.is_none() {
                let i = (0..n).find(|&i| got[i] != want[i]).unwrap();
                first = Some(off + i as u64);
            }
        }
        off += n as u64;
    }
    (bad, first)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------------------
// 1. Abandoned CreateVolume
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_create_volume_leaves_one_lv_per_name() {
    let d = TestDriver::start("zcreate", 256 * MIB, "").await;
    let co = Co::new(&d).await;
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    for ms in [50u64, 100, 200, 300, 500, 800, 1200] {
        let name = format!("pvc-zcreate-{ms}");
        let req = create_req(&name, 8 * MIB, block_cap());
        let t = Instant::now();
        let mut c = co.c.clone();
        let first = abandon_after(
            Duration::from_millis(ms),
            req.clone(),
            move |r| async move { c.create_volume(r).await },
        )
        .await;
        let (v, retries) = retry_n(&format!("CreateVolume {name}"), || {
            let (mut c, r) = (co.c.clone(), req.clone());
            async move { c.create_volume(r).await }
        })
        .await;
        let id = v.volume.expect("a volume").volume_id;
        eprintln!(
            "MEASURE abandoned CreateVolume deadline={ms}ms first={first} aborted_retries={retries} \
             settled_after={:.2}s",
            secs(t.elapsed())
        );
        // The same request once more: the same volume.
        let again = co.create(&name, 8 * MIB, block_cap()).await;
        assert_eq!(again, id, "CreateVolume {name} is idempotent");
        assert!(ids.insert(name, id).is_none());
    }

    let want: BTreeSet<String> = ids.values().cloned().collect();
    assert_eq!(
        want.len(),
        ids.len(),
        "one distinct volume per name: {ids:?}"
    );
    let report = lvs(&d.vg);
    let thin: BTreeSet<String> = report
        .thin_volumes("pool")
        .map(|lv| lv.name.clone())
        .collect();
    assert_eq!(thin, want, "exactly one thin LV per name");
    for lv in &report.lvs {
        assert!(
            lv.name == "pool" || (want.contains(&lv.name) && lv.name.starts_with("csi-")),
            "unexpected LV {} ({})",
            lv.name,
            lv.attr
        );
    }
    let pool = report.find("pool").expect("the pool");
    eprintln!(
        "MEASURE abandoned CreateVolume pool attr={} health={:?} data={:?}% meta={:?}%",
        pool.attr, pool.health, pool.data_percent, pool.metadata_percent
    );
    assert!(pool.is_thin_pool(), "pool attr {}", pool.attr);
    assert!(pool.is_active(), "the pool is active: attr {}", pool.attr);
    assert_eq!(pool.problem(), None);
    // No volume was left active by an interrupted create.
    let allowed = pool_dm_names(&d.vg, "pool");
    for n in dm_of_vg(&d.vg) {
        assert!(allowed.contains(&n), "device-mapper device {n} left active");
    }

    // The pool still serves a fresh create and delete, at the first try.
    let mut c = co.c.clone();
    let fresh = c
        .create_volume(create_req("pvc-zcreate-fresh", 8 * MIB, block_cap()))
        .await
        .unwrap_or_else(|e| panic!("fresh CreateVolume: {e}; log:\n{}", d.log_tail(50)))
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    c.delete_volume(del(&fresh))
        .await
        .unwrap_or_else(|e| panic!("fresh DeleteVolume: {e}"));

    for id in ids.values() {
        co.delete(id).await;
    }
    let left: Vec<String> = lvs(&d.vg)
        .thin_volumes("pool")
        .map(|lv| lv.name.clone())
        .collect();
    assert!(left.is_empty(), "thin LVs left: {left:?}");
}

// ---------------------------------------------------------------------------
// 2. Abandoned first NodeStageVolume
// ---------------------------------------------------------------------------

async fn abandoned_first_stage(fs: &str) {
    let tag = format!("zst{fs}");
    let k = Kubelet::new(&tag);
    let d = TestDriver::start(&tag, 256 * MIB, &k.extra()).await;
    let co = Co::new(&d).await;
    // mkfs.xfs refuses filesystems under 300 MiB; thin volumes cost only
    // what is written.
    let size = if fs == "xfs" { 320 * MIB } else { 32 * MIB };
    let mut volumes = 0;
    for ms in [100u64, 300, 700, 1500] {
        let name = format!("{tag}-{ms}");
        let id = co.create(&name, size, mount_cap(fs)).await;
        volumes += 1;
        let staging = k.staging(&name);
        let req = stage_req(&id, &staging, mount_cap(fs));
        let t = Instant::now();
        let mut n = co.n.clone();
        let first = abandon_after(Duration::from_millis(ms), req, move |r| async move {
            n.node_stage_volume(r).await
        })
        .await;
        let retries = co.stage(&id, &staging, mount_cap(fs)).await;
        let settled = t.elapsed();

        let m = must_mount(&staging, "staged volume");
        assert_eq!(m.fs_type, fs, "staged as {fs}");
        assert_eq!(
            m.device(),
            lv_numbers(&d.vg, &id),
            "the staging mount is the volume's"
        );
        assert!(!m.is_read_only(), "staged writable: {:?}", m.mount_options);
        let data = format!("staged {fs} after a stage abandoned at {ms} ms\n").repeat(64);
        write_file(&staging.join("data"), data.as_bytes())
            .unwrap_or_else(|e| panic!("write into the staged {fs}: {e}"));
        assert_eq!(
            std::fs::read(staging.join("data")).unwrap(),
            data.as_bytes()
        );
        eprintln!(
            "MEASURE abandoned NodeStageVolume fs={fs} deadline={ms}ms first={first} \
             aborted_retries={retries} settled_after={:.2}s mkfs_runs={} volumes={volumes}",
            secs(settled),
            mkfs_runs(&d)
        );
        co.unstage(&id, &staging).await;
        assert!(mount_at(&staging).is_none(), "unstaged");
        co.delete(&id).await;
    }
    assert!(mounts_under(k.root.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_first_stage_still_formats_ext4() {
    abandoned_first_stage("ext4").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_first_stage_still_formats_xfs() {
    abandoned_first_stage("xfs").await;
}

// ---------------------------------------------------------------------------
// 3. Abandoned ControllerReclaimSpace
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_reclaim_keeps_data() {
    const SIZE: u64 = 64 * MIB;
    const SEED: u64 = 0x7e57_da7a;
    let k = Kubelet::new("zreclaim");
    let d = TestDriver::start("zreclaim", 256 * MIB, &k.extra()).await;
    let co = Co::new(&d).await;
    let id = co.create("zreclaim-vol", SIZE, block_cap()).await;
    let (staging, target) = (k.staging("zreclaim"), k.target("zreclaim"));

    // Allocate the whole volume with zeroes, then leave it unused.
    co.stage(&id, &staging, block_cap()).await;
    co.publish(&id, &staging, &target, block_cap(), false).await;
    write_device(&target, SIZE, |_, b| b.fill(0));
    let zeroed = lvs(&d.vg).find(&id).unwrap().allocated_bytes().unwrap();
    assert!(
        zeroed >= SIZE - MIB,
        "written zeroes are allocated: {zeroed}"
    );
    co.unpublish(&id, &target).await;
    co.unstage(&id, &staging).await;

    // A reclaim its caller gives up on after 0.5 s; the volume is used
    // again at once.
    let t = Instant::now();
    let mut rc = co.reclaim_client().await;
    let first = abandon_after(
        Duration::from_millis(500),
        reclaim_req(&id),
        move |r| async move { rc.controller_reclaim_space(r).await },
    )
    .await;
    let stage_retries = co.stage(&id, &staging, block_cap()).await;
    let publish_retries = co.publish(&id, &staging, &target, block_cap(), false).await;
    let reopened = t.elapsed();
    let after_reclaim = lvs(&d.vg).find(&id).unwrap().allocated_bytes().unwrap();

    // The pod fills the volume; 20 s pass; it reads from the device.
    write_device(&target, SIZE, |off, b| pattern_at(b, off, SEED));
    let written = lvs(&d.vg).find(&id).unwrap().allocated_bytes().unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    drop_caches();
    let (bad, first_bad) = compare_device(&target, SIZE, SEED);
    let later = lvs(&d.vg).find(&id).unwrap().allocated_bytes().unwrap();
    eprintln!(
        "MEASURE abandoned reclaim: first={first} zeroed_alloc={zeroed} alloc_after_reopen={after_reclaim} \
         stage_retries={stage_retries} publish_retries={publish_retries} reopened_after={:.2}s \
         alloc_after_write={written} alloc_20s_later={later} bad_mib={bad} first_bad={first_bad:?}",
        secs(reopened)
    );
    // The caller really left mid-scan, and the scan stopped there: the
    // volume could be staged again only after the task let go.
    assert!(
        !matches!(first, Abandoned::Ok),
        "the reclaim finished within 0.5 s: the abandoned case was not tested"
    );
    assert_eq!(
        bad,
        0,
        "the pattern did not read back whole (first bad byte {first_bad:?}); log:\n{}",
        d.log_tail(40)
    );
    assert!(
        later >= SIZE - MIB,
        "nothing of the written pattern was discarded: {later} of {SIZE} allocated"
    );

    co.unpublish(&id, &target).await;
    co.unstage(&id, &staging).await;
    co.delete(&id).await;
    assert!(lvs(&d.vg).find(&id).is_none());
}

// ---------------------------------------------------------------------------
// 4. NodeHealer keeps a read-only publish read-only
// ---------------------------------------------------------------------------

/// The state the healer must restore: staging rw with `noexec`, the publish
/// read-only, the data readable through it.
#[track_caller]
fn check_ro_publish(staging: &Path, target: &Path, data: &[u8], when: &str) {
    let st = must_mount(staging, when);
    let tg = must_mount(target, when);
    eprintln!(
        "MEASURE healer {when}: staging options {:?}, target options {:?}",
        st.mount_options, tg.mount_options
    );
    assert!(
        has_option(&st, "noexec"),
        "{when}: staging lost noexec: {:?}",
        st.mount_options
    );
    assert_eq!(st.fs_type, "ext4");
    assert!(
        tg.is_read_only(),
        "{when}: the publish is not read-only: {:?}",
        tg.mount_options
    );
    assert_eq!(tg.device(), st.device(), "{when}: same filesystem");
    let err =
        std::fs::write(target.join("nope"), b"x").expect_err("a write to a read-only publish");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{when}: {err}");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), data, "{when}");
}

#[tokio::test(flavor = "multi_thread")]
async fn healer_keeps_read_only_publish() {
    let k = Kubelet::new("zheal");
    let d = TestDriver::start("zheal", 128 * MIB, &k.extra()).await;
    let co = Co::new(&d).await;
    let cap = mount_flags("ext4", &["noexec"]);
    let id = co.create("zheal-vol", 32 * MIB, cap.clone()).await;
    let (staging, target) = (k.staging("zheal"), k.target("zheal"));
    co.stage(&id, &staging, cap.clone()).await;
    let data = b"written before the read-only publish".to_vec();
    write_file(&staging.join("data"), &data).unwrap();
    co.publish(&id, &staging, &target, cap.clone(), true).await;
    check_ro_publish(&staging, &target, &data, "published");

    // The publish bind mount vanishes behind the driver's back.
    nix::mount::umount2(&target, nix::mount::MntFlags::empty()).unwrap();
    assert!(mount_at(&target).is_none());
    let (abnormal, msg) = heal(&d, &id, &target, &staging, Some(cap.clone())).await;
    eprintln!("MEASURE healer publish removed: abnormal={abnormal} {msg}");
    assert!(abnormal, "the missing publish is reported: {msg}");
    check_ro_publish(&staging, &target, &data, "healed publish");
    let (abnormal, msg) = heal(&d, &id, &target, &staging, Some(cap.clone())).await;
    assert!(!abnormal, "healed for good: {msg}");

    // Both mounts are weakened behind the driver's back: the publish made
    // writable, the staging mount without its noexec.
    let weaken = |p: &Path| {
        nix::mount::mount(
            None::<&str>,
            p,
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT | nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap()
    };
    weaken(&target);
    weaken(&staging);
    assert!(!must_mount(&target, "weakened").is_read_only());
    assert!(!has_option(&must_mount(&staging, "weakened"), "noexec"));
    let (abnormal, msg) = heal(&d, &id, &target, &staging, Some(cap.clone())).await;
    eprintln!("MEASURE healer flags weakened: abnormal={abnormal} {msg}");
    assert!(abnormal, "the weakened mounts are reported: {msg}");
    check_ro_publish(&staging, &target, &data, "healed flags");
    let (abnormal, msg) = heal(&d, &id, &target, &staging, Some(cap.clone())).await;
    assert!(!abnormal, "healed for good: {msg}");

    // Both mounts vanish.
    nix::mount::umount2(&target, nix::mount::MntFlags::empty()).unwrap();
    nix::mount::umount2(&staging, nix::mount::MntFlags::empty()).unwrap();
    assert!(mount_at(&staging).is_none() && mount_at(&target).is_none());
    let (abnormal, msg) = heal(&d, &id, &target, &staging, Some(cap.clone())).await;
    eprintln!("MEASURE healer staging and publish removed: abnormal={abnormal} {msg}");
    assert!(abnormal, "the missing mounts are reported: {msg}");
    check_ro_publish(&staging, &target, &data, "healed staging and publish");
    let (abnormal, msg) = heal(&d, &id, &target, &staging, Some(cap.clone())).await;
    assert!(!abnormal, "healed for good: {msg}");

    co.unpublish(&id, &target).await;
    co.unstage(&id, &staging).await;
    co.delete(&id).await;
    assert!(mounts_under(k.root.path()).is_empty());
}

/// What an earlier version left (staging kept in an LV tag, block publishes
/// in a file in the staging directory) becomes node records at start-up:
/// the read-only overlay is kept, the CO's retries succeed, and the first
/// NodeStageVolume supplies the mount flags. A table-less overlay (a
/// `dmsetup create` killed between create and load) never blocks a
/// read-only publish.
#[tokio::test(flavor = "multi_thread")]
async fn earlier_versions_and_killed_dmsetup_leave_nothing_stuck() {
    let k = Kubelet::new("zlegacy");
    let mut d = TestDriver::start("zlegacy", 128 * MIB, &k.extra()).await;
    let vg = d.vg.clone();
    let co = Co::new(&d).await;
    let (fcap, bcap) = (mount_flags("ext4", &["noexec"]), block_cap());
    let f = co.create("zlegacy-fs", 16 * MIB, fcap.clone()).await;
    let b = co.create("zlegacy-blk", 16 * MIB, bcap.clone()).await;
    let (fs_st, fs_t) = (k.staging("f"), k.target("f"));
    let (b_st, b_t, b_t2) = (k.staging("b"), k.target("b"), k.target("b2"));
    co.stage(&f, &fs_st, fcap.clone()).await;
    co.publish(&f, &fs_st, &fs_t, fcap.clone(), false).await;
    co.stage(&b, &b_st, bcap.clone()).await;
    co.publish(&b, &b_st, &b_t, bcap.clone(), true).await;
    d.stop();

    // Turn the node state into what an earlier version kept.
    let hex = |p: &Path| thinpool_csi::naming::hex(p.as_os_str().as_encoded_bytes());
    for (id, st) in [(&f, &fs_st), (&b, &b_st)] {
        std::fs::remove_file(d.state_dir().join("volumes").join(format!("{id}.json"))).unwrap();
        let tag = format!("tpcsi.staged={}", hex(st));
        crate::harness::lvm(&["lvchange", "--addtag", &tag, &format!("{vg}/{id}")]);
    }
    std::fs::write(
        b_st.join("thinpool-csi-block.json"),
        format!(
            r#"{{"volume_id":"{b}","publishes":[{{"target":"{}","mode":"SINGLE_NODE_WRITER","readonly":true}}]}}"#,
            b_t.display()
        ),
    )
    .unwrap();
    let overlay_before = overlays_of(&b);
    assert_eq!(overlay_before.len(), 1, "{overlay_before:?}");

    d.spawn().await;
    let co = Co::new(&d).await;
    for id in [&f, &b] {
        let rec = d.state_dir().join("volumes").join(format!("{id}.json"));
        assert!(
            rec.exists(),
            "no record adopted for {id}: {}",
            d.log_tail(30)
        );
        let tags = lvs(&vg).find(id).unwrap().tags.clone();
        assert!(
            !tags.iter().any(|t| t.starts_with("tpcsi.staged=")),
            "the legacy tag stays: {tags:?}"
        );
    }
    assert!(!b_st.join("thinpool-csi-block.json").exists());
    assert_eq!(
        overlays_of(&b),
        overlay_before,
        "the read-only overlay was kept"
    );
    // The CO's retries after the upgrade.
    co.stage(&f, &fs_st, fcap.clone()).await;
    co.publish(&f, &fs_st, &fs_t, fcap.clone(), false).await;
    co.stage(&b, &b_st, bcap.clone()).await;
    co.publish(&b, &b_st, &b_t, bcap.clone(), true).await;
    let rec =
        std::fs::read_to_string(d.state_dir().join("volumes").join(format!("{f}.json"))).unwrap();
    assert!(
        rec.contains("noexec"),
        "the stage supplied the flags: {rec}"
    );
    // Another stage with other flags is now a conflict, as the spec says.
    let other = stage_req(&f, &fs_st, mount_flags("ext4", &[]));
    let err = d.node().await.node_stage_volume(other).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // A create of the second target's overlay killed before its table.
    let name = thinpool_csi::node::dm::overlay_name(&b, &b_t2);
    dmsetup(&["create", &name, "--notable"]).unwrap();
    co.publish(&b, &b_st, &b_t2, bcap.clone(), true).await;
    let n = rdev_of(&b_t2).expect("a device node");
    let table = dm_table_of(n).expect("an overlay");
    assert!(table.contains("linear"), "{table}");
    let ro = std::fs::read_to_string(format!("/sys/dev/block/{}:{}/ro", n.0, n.1)).unwrap();
    assert_eq!(ro.trim(), "1", "the overlay is read-only");

    co.unpublish(&b, &b_t2).await;
    co.unpublish(&b, &b_t).await;
    co.unstage(&b, &b_st).await;
    co.unpublish(&f, &fs_t).await;
    co.unstage(&f, &fs_st).await;
    co.delete(&f).await;
    co.delete(&b).await;
    assert!(overlays_of(&b).is_empty(), "{:?}", overlays_of(&b));
    assert!(mounts_under(k.root.path()).is_empty());
}

// ---------------------------------------------------------------------------
// 5. Reboot
// ---------------------------------------------------------------------------

/// Device-mapper devices made to take the low minors after a simulated
/// reboot; removed on drop, also when the test panics.
struct Fillers(Vec<String>);

impl Fillers {
    fn create(n: usize) -> Fillers {
        let mut f = Fillers(Vec::new());
        for i in 0..n {
            let name = format!("tpt-filler-{i}");
            let _ = dmsetup(&["remove", &name]);
            dmsetup(&["create", &name, "--table", "0 2048 zero"])
                .unwrap_or_else(|e| panic!("dmsetup create {name}: {e}"));
            f.0.push(name);
        }
        f
    }
}

impl Drop for Fillers {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = dmsetup(&["remove", "--retry", name]);
        }
    }
}

/// A pod's hold on a published volume: a process with the device node
/// (raw block) or a file of the filesystem open, as a container's process
/// keeps it (read-write, or read-only for a read-only publish). Killed on
/// drop, as a reboot or a pod's teardown ends it.
struct Pod(std::process::Child);

impl Pod {
    fn open(path: &Path, write: bool) -> Pod {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .unwrap_or_else(|e| panic!("a pod opens {} (write={write}): {e}", path.display()));
        let child = std::process::Command::new("sleep")
            .arg("100000")
            .stdin(f)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Pod(child)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every descriptor the process `pid` and its descendants hold on one of
/// `devs`: a block device with those numbers, or a file on a filesystem of
/// that device ("pid (comm) fd N -> what").
fn descriptors_on(pid: u32, devs: &[(u32, u32)]) -> Vec<String> {
    use nix::sys::stat::{major, minor};
    let mut found = Vec::new();
    let pids = std::iter::once(pid as i32).chain(crate::harness::descendants(pid as i32));
    for p in pids {
        let dir = PathBuf::from(format!("/proc/{p}"));
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        for fd in std::fs::read_dir(dir.join("fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(m) = std::fs::metadata(fd.path()) else {
                continue;
            };
            let on = |d: u64| devs.contains(&(major(d) as u32, minor(d) as u32));
            if (m.file_type().is_block_device() && on(m.rdev())) || on(m.dev()) {
                let link = std::fs::read_link(fd.path()).unwrap_or_default();
                found.push(format!(
                    "pid {p} ({}) fd {} -> {}",
                    comm.trim(),
                    fd.file_name().to_string_lossy(),
                    link.display()
                ));
            }
        }
    }
    found
}

/// The open count of the device-mapper device `dev` once it settles at
/// `want` (LVM commands of tests running beside this one open every block
/// device for a moment), or the last one read after 10 s.
fn settled_open_count(dev: (u32, u32), want: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = thinpool_csi::sys::dm_open_count(dev.0, dev.1).unwrap();
        if n == want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pods for every volume: each opens its published device node or a file
/// of its publish, read-write or read-only as published. Checks that the
/// driver and its children hold none of the volumes' devices, and that
/// each block publish is open exactly once (by its pod).
fn start_pods(d: &TestDriver, vols: &[BootVol], vg: &str, when: &str) -> Vec<Pod> {
    let pods: Vec<Pod> = vols
        .iter()
        .map(|v| {
            let path = if v.block {
                v.target.clone()
            } else {
                v.target.join("data")
            };
            Pod::open(&path, !v.ro)
        })
        .collect();
    let mut devs: Vec<(u32, u32)> = vols.iter().map(|v| lv_numbers(vg, &v.id)).collect();
    devs.extend(vols.iter().filter_map(|v| rdev_of(&v.target)));
    let held = descriptors_on(d.pid(), &devs);
    eprintln!("MEASURE reboot {when}: driver and children hold {held:?}");
    assert!(
        held.is_empty(),
        "{when}: the driver or a child of it holds a volume's device open: {held:?}"
    );
    for v in vols.iter().filter(|v| v.block) {
        let node = rdev_of(&v.target).unwrap();
        let n = settled_open_count(node, 1);
        eprintln!(
            "MEASURE reboot {when}: {} node {node:?} open {n} time(s): {}",
            v.name,
            crate::harness::openers(node)
        );
        assert_eq!(n, 1, "{when}: {} is open by its pod only", v.name);
    }
    pods
}

struct BootVol {
    name: &'static str,
    id: String,
    cap: VolumeCapability,
    block: bool,
    ro: bool,
    staging: PathBuf,
    target: PathBuf,
    data: Vec<u8>,
}

/// The read-only block volume of the reboot test whose pod outlives the
/// simulated reboot.
const HELD: &str = "zboot-blk-held";

/// The simulated reboot (the comment below says what goes): returns the
/// devices that took the low minors, the pod that outlives it, and the
/// index of its volume ([`HELD`]).
fn simulate_reboot(
    d: &mut TestDriver,
    k: &Kubelet,
    vols: &[BootVol],
    pods: Vec<Pod>,
) -> (Fillers, Pod, usize) {
    // The "reboot": the driver dies, mounts and device-mapper devices go,
    // the VG is inactive, the loop device is gone, and other devices take
    // the low minors. The overlays go as `dmsetup remove --force` takes
    // them while a pod still holds one open: its table is replaced by an
    // `error` one (wipe_table), the remove fails, and the device stays
    // under our name once the pods are gone.
    d.kill9();
    let mut leftovers = Vec::new();
    for v in vols {
        for o in overlays_of(&v.id) {
            dmsetup(&["wipe_table", &o]).unwrap_or_else(|e| panic!("dmsetup wipe_table {o}: {e}"));
            if dmsetup(&["remove", &o]).is_err() {
                leftovers.push(o);
            }
        }
    }
    // Every pod ends but one, which a reboot done by hand can miss: it
    // keeps its leftover open through the driver's restart.
    let held = vols.iter().position(|v| v.name == HELD).unwrap();
    let mut pods = pods;
    let holder = pods.remove(held);
    drop(pods);
    assert_eq!(
        leftovers.len(),
        2,
        "the read-only overlays their pods held stay: {leftovers:?}"
    );
    // --retry: LVM commands of tests running beside this one scan every
    // block device and hold ours open for a moment.
    let unmounted = umount_all_under(k.root.path());
    crate::harness::lvm(&["vgchange", "-an", &d.vg]);
    for n in dm_of_vg(&d.vg) {
        dmsetup(&["remove", "--retry", &n]).unwrap_or_else(|e| panic!("dmsetup remove {n}: {e}"));
    }
    assert!(dm_of_vg(&d.vg).is_empty());
    let lo = thinpool_csi::pool::loopdev::find_loop_for_file(&d.backing_file())
        .unwrap()
        .expect("the VG's loop device");
    let mut tries = 0;
    while let Err(e) = thinpool_csi::pool::loopdev::detach_loop(&lo) {
        tries += 1;
        assert!(tries < 50, "detach {}: {e}", lo.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let fillers = Fillers::create(6);
    let filler_numbers: Vec<_> = crate::harness::dm_devices()
        .into_iter()
        .filter(|(n, _)| fillers.0.contains(n))
        .map(|(_, nums)| nums)
        .collect();
    eprintln!(
        "MEASURE reboot simulated: {unmounted} mounts removed, {} detached, fillers at {filler_numbers:?}, \
         leftover overlays (error table) {leftovers:?}",
        lo.display()
    );
    (fillers, holder, held)
}

/// The reboot test's volumes, each created, staged, written and
/// published as its spec says: ext4 read-write and read-only (noexec),
/// block read-write and read-only, and [`HELD`].
async fn publish_boot_volumes(co: &Co, k: &Kubelet) -> Vec<BootVol> {
    let specs = [
        ("zboot-ext4-rw", mount_cap("ext4"), false, false),
        (
            "zboot-ext4-ro",
            mount_flags("ext4", &["noexec"]),
            false,
            true,
        ),
        ("zboot-blk-rw", block_cap(), true, false),
        ("zboot-blk-ro", block_cap(), true, true),
        // Its pod outlives the simulated reboot, holding the old overlay.
        (HELD, block_cap(), true, true),
    ];
    let mut vols = Vec::new();
    for (i, (name, cap, block, ro)) in specs.into_iter().enumerate() {
        let id = co.create(name, 32 * MIB, cap.clone()).await;
        let (staging, target) = (k.staging(name), k.target(name));
        let data = if block {
            let mut b = vec![0u8; 256 * 1024];
            pattern_at(&mut b, 0, 0xb007 + i as u64);
            b
        } else {
            format!("{name}: written before the reboot\n")
                .repeat(32)
                .into_bytes()
        };
        co.stage(&id, &staging, cap.clone()).await;
        match (block, ro) {
            (false, false) => {
                co.publish(&id, &staging, &target, cap.clone(), false).await;
                write_file(&target.join("data"), &data).unwrap();
            }
            (false, true) => {
                write_file(&staging.join("data"), &data).unwrap();
                co.publish(&id, &staging, &target, cap.clone(), true).await;
            }
            (true, false) => {
                co.publish(&id, &staging, &target, cap.clone(), false).await;
                write_at(&target, 0, &data).unwrap();
            }
            (true, true) => {
                // A writer pod first, then the read-only one.
                let setup = k.target(&format!("{name}-setup"));
                co.publish(&id, &staging, &setup, cap.clone(), false).await;
                write_at(&setup, 0, &data).unwrap();
                co.unpublish(&id, &setup).await;
                co.publish(&id, &staging, &target, cap.clone(), true).await;
            }
        }
        vols.push(BootVol {
            name,
            id,
            cap,
            block,
            ro,
            staging,
            target,
            data,
        });
    }
    vols
}

/// After the reboot: `v` is published again as it was, on its LV's
/// current device, with its data, read-only where it was.
#[track_caller]
fn assert_restored(vg: &str, v: &BootVol) {
    let lv = lv_numbers(vg, &v.id);
    if v.block {
        let node =
            rdev_of(&v.target).unwrap_or_else(|| panic!("{}: no block node at the target", v.name));
        if v.ro {
            assert_ne!(node, lv, "{}: read-only goes through an overlay", v.name);
            let table = dm_table_of(node).unwrap_or_else(|| {
                panic!("{}: the node {node:?} is no device-mapper device", v.name)
            });
            eprintln!(
                "MEASURE reboot {} overlay {node:?}: {}",
                v.name,
                table.trim()
            );
            assert!(
                table.contains(&format!(" {}:{} ", lv.0, lv.1)),
                "{}: the overlay {node:?} maps {table:?}, not the LV {lv:?}",
                v.name
            );
            assert!(
                write_at(&v.target, 0, b"overwrite").is_err(),
                "{}: a write to the read-only block publish succeeded",
                v.name
            );
        } else {
            assert_eq!(
                node, lv,
                "{}: the node opens the volume's current device",
                v.name
            );
        }
        assert_eq!(
            read_at(&v.target, 0, v.data.len()),
            v.data,
            "{}: the node reads the volume's data",
            v.name
        );
    } else {
        let st = must_mount(&v.staging, v.name);
        let tg = must_mount(&v.target, v.name);
        assert_eq!(st.device(), lv, "{}: staging is the volume's", v.name);
        assert_eq!(tg.device(), lv, "{}: the publish is the volume's", v.name);
        assert_eq!(
            std::fs::read(v.target.join("data")).unwrap(),
            v.data,
            "{}",
            v.name
        );
        if v.ro {
            assert!(
                has_option(&st, "noexec"),
                "{}: staging lost noexec: {:?}",
                v.name,
                st.mount_options
            );
            assert!(tg.is_read_only(), "{}: {:?}", v.name, tg.mount_options);
            let err = std::fs::write(v.target.join("nope"), b"x").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{}: {err}", v.name);
        } else {
            assert!(!tg.is_read_only(), "{}: {:?}", v.name, tg.mount_options);
            write_file(&v.target.join("after"), b"written after the reboot").unwrap();
        }
    }
}

/// The CO unpublishes, unstages and deletes every volume; nothing of them
/// is left: no dm device beyond the pool's, no overlay, no mount, no
/// target.
async fn tear_down(co: &Co, d: &TestDriver, k: &Kubelet, vols: &[BootVol]) {
    for v in vols {
        co.unpublish(&v.id, &v.target).await;
    }
    for v in vols {
        co.unstage(&v.id, &v.staging).await;
        co.delete(&v.id).await;
    }
    let pool = pool_dm_names(&d.vg, "pool");
    let left: Vec<String> = dm_of_vg(&d.vg)
        .into_iter()
        .filter(|n| !pool.contains(n))
        .collect();
    let overlays: Vec<String> = vols.iter().flat_map(|v| overlays_of(&v.id)).collect();
    eprintln!("MEASURE reboot teardown: dm devices left {left:?}, overlays left {overlays:?}");
    assert!(
        left.is_empty(),
        "device-mapper devices of the VG left: {left:?}"
    );
    assert!(overlays.is_empty(), "read-only overlays left: {overlays:?}");
    assert!(mounts_under(k.root.path()).is_empty());
    for v in vols {
        assert!(!v.target.exists(), "{}: target left", v.name);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reboot_restores_exactly_what_was_published() {
    let k = Kubelet::new("zboot");
    let mut d = TestDriver::start("zboot", 256 * MIB, &k.extra()).await;
    let co = Co::new(&d).await;
    let vols = publish_boot_volumes(&co, &k).await;
    let before: Vec<_> = vols
        .iter()
        .map(|v| (v.name, lv_numbers(&d.vg, &v.id), rdev_of(&v.target)))
        .collect();
    eprintln!("MEASURE reboot before: (volume, LV numbers, node at target) {before:?}");
    let pods = start_pods(&d, &vols, &d.vg, "before");

    let (fillers, holder, held) = simulate_reboot(&mut d, &k, &vols, pods);

    // The node is back: the driver starts, kubelet stages and publishes
    // everything again at the same paths.
    let t = Instant::now();
    d.spawn().await;
    let started = t.elapsed();
    let co = Co::new(&d).await;
    let mut retries = 0;
    for v in &vols {
        retries += co.stage(&v.id, &v.staging, v.cap.clone()).await;
    }
    for v in vols.iter().filter(|v| v.name != HELD) {
        retries += co
            .publish(&v.id, &v.staging, &v.target, v.cap.clone(), v.ro)
            .await;
    }
    // The leftover the surviving pod holds cannot be replaced: the publish
    // says so and what to do; the unpublish of that failed publish (the
    // pod torn down) succeeds, and the leftover goes once its opener does.
    let v = &vols[held];
    let err = loop {
        let req = publish_req(&v.id, &v.staging, &v.target, v.cap.clone(), true);
        match d.node().await.node_publish_volume(req).await {
            Err(e) if matches!(e.code(), Code::Aborted | Code::Unavailable) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => break e,
            Ok(_) => panic!("{HELD}: published over a leftover its pod holds open"),
        }
    };
    eprintln!(
        "MEASURE reboot publish over a held leftover: {:?} {}",
        err.code(),
        err.message()
    );
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("held open 1 time(s)"), "{err:?}");
    co.unpublish(&v.id, &v.target).await;
    assert_eq!(
        overlays_of(&v.id).len(),
        1,
        "{HELD}: the leftover stays while its opener holds it"
    );
    drop(holder);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !overlays_of(&v.id).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{HELD}: the leftover outlives its last opener: {:?}",
            overlays_of(&v.id)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("MEASURE reboot {HELD}: the leftover went with its last opener");
    retries += co
        .publish(&v.id, &v.staging, &v.target, v.cap.clone(), true)
        .await;
    let after: Vec<_> = vols
        .iter()
        .map(|v| (v.name, lv_numbers(&d.vg, &v.id), rdev_of(&v.target)))
        .collect();
    eprintln!(
        "MEASURE reboot after: driver ready in {:.2}s, restaged and republished with {retries} retries; \
         (volume, LV numbers, node at target) {after:?}",
        secs(started)
    );

    for v in &vols {
        assert_restored(&d.vg, v);
    }

    let repaired: Vec<String> = d
        .log_tail(2000)
        .lines()
        .filter(|l| l.contains("leftover device of this driver's overlay name"))
        .map(String::from)
        .collect();
    eprintln!("MEASURE reboot leftover overlays repaired: {repaired:?}");
    assert!(
        repaired
            .iter()
            .any(|l| l.contains("removed a leftover device")),
        "the driver logs the leftover overlay it replaced"
    );
    // The pods run again, and are torn down before their volumes are.
    let pods = start_pods(&d, &vols, &d.vg, "after");
    drop(pods);
    for v in vols.iter().filter(|v| v.block) {
        let node = rdev_of(&v.target).unwrap();
        eprintln!(
            "MEASURE reboot {} node {node:?} before unpublish: {}",
            v.name,
            crate::harness::openers(node)
        );
    }
    tear_down(&co, &d, &k, &vols).await;
    drop(fillers);
}

// ---------------------------------------------------------------------------
// 6. kill -9 storm
// ---------------------------------------------------------------------------

/// Per-call deadline of the storm's CO (external-provisioner's default is
/// 10 s; a TCG VM is slower).
const STORM_DEADLINE: Duration = Duration::from_secs(30);
/// How long the storm's CO keeps retrying one call.
const STORM_RETRY_FOR: Duration = Duration::from_secs(300);
const STORM_WORKERS: usize = 3;
const STORM_MIN_VOLUMES: usize = 12;
/// Every this many storm volumes one is encrypted ([`Kind::Encrypted`]):
/// two at least, few enough that cryptsetup under TCG leaves the storm's
/// time about what it was.
const STORM_ENCRYPTED_EVERY: usize = 6;
const BLOCK_DATA: usize = 64 * 1024;

/// An answer the CO retries: the driver was away or busy, or the call's
/// fate is unknown because the connection broke (a transport error
/// carries its source; a status from the driver does not). UNKNOWN is
/// not among the codes: tonic gives a broken connection that code with a
/// source, and an UNKNOWN the driver answered itself is a failure the
/// driver must never give (the conformance suite's "never UNKNOWN").
fn retryable(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Cancelled | Code::Aborted | Code::DeadlineExceeded
    ) || std::error::Error::source(s).is_some()
        || s.message().contains("h2 protocol error")
        || s.message().contains("transport error")
}

/// An UNKNOWN the driver answered fails the storm; one that a broken
/// connection gave (tonic sets its source) is retried.
#[test]
fn the_storm_retries_a_broken_connection_not_an_unknown_answer() {
    assert!(!retryable(&Status::unknown("the driver answered this")));
    let broken = Status::from_error(Box::new(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "connection reset by peer",
    )));
    assert_eq!(broken.code(), Code::Unknown);
    assert!(retryable(&broken), "{broken:?}");
    assert!(retryable(&Status::unavailable("driver restarting")));
}

#[derive(Default)]
struct Stats {
    calls: AtomicU64,
    retried: AtomicU64,
    reclaims: AtomicU64,
}

/// The storm's CO: connects afresh for every attempt (the driver may have
/// been restarted), gives every call a deadline, retries what [`retryable`]
/// accepts, and panics on anything else.
#[derive(Clone)]
struct StormCo {
    uri: String,
    addons: String,
    stats: Arc<Stats>,
}

fn with_deadline<R>(r: R, deadline: Duration) -> tonic::Request<R> {
    let mut q = tonic::Request::new(r);
    q.set_timeout(deadline);
    q
}

fn connect_error(e: tonic::transport::Error) -> Status {
    Status::unavailable(format!("connect: {e}"))
}

impl StormCo {
    async fn call<T, F, Fut>(&self, what: &str, mut f: F) -> T
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let start = Instant::now();
        loop {
            self.stats.calls.fetch_add(1, Ordering::Relaxed);
            let r = match tokio::time::timeout(
                STORM_DEADLINE + Duration::from_secs(1),
                f(STORM_DEADLINE),
            )
            .await
            {
                Err(_) => Err(Status::deadline_exceeded("the CO gave up waiting")),
                Ok(r) => r,
            };
            match r {
                Ok(r) => return r.into_inner(),
                Err(s) if retryable(&s) => {
                    assert!(
                        start.elapsed() < STORM_RETRY_FOR,
                        "{what}: still failing after {:?}: {:?} {}",
                        start.elapsed(),
                        s.code(),
                        s.message()
                    );
                    self.stats.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(s) => panic!("{what}: {:?}: {}", s.code(), s.message()),
            }
        }
    }

    async fn controller(&self) -> Result<ControllerClient<Channel>, Status> {
        ControllerClient::connect(self.uri.clone())
            .await
            .map_err(connect_error)
    }

    async fn node(&self) -> Result<NodeClient<Channel>, Status> {
        NodeClient::connect(self.uri.clone())
            .await
            .map_err(connect_error)
    }

    async fn create(&self, req: CreateVolumeRequest) -> String {
        self.call(&format!("CreateVolume {}", req.name), |dl| {
            let r = req.clone();
            async move {
                self.controller()
                    .await?
                    .create_volume(with_deadline(r, dl))
                    .await
            }
        })
        .await
        .volume
        .expect("a volume")
        .volume_id
    }

    async fn delete(&self, id: &str) {
        self.call(&format!("DeleteVolume {id}"), |dl| async move {
            self.controller()
                .await?
                .delete_volume(with_deadline(del(id), dl))
                .await
        })
        .await;
    }

    async fn snapshot(&self, name: &str, source: &str) -> String {
        let req = CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: source.into(),
            ..Default::default()
        };
        self.call(&format!("CreateSnapshot {name}"), |dl| {
            let r = req.clone();
            async move {
                self.controller()
                    .await?
                    .create_snapshot(with_deadline(r, dl))
                    .await
            }
        })
        .await
        .snapshot
        .expect("a snapshot")
        .snapshot_id
    }

    async fn delete_snapshot(&self, id: &str) {
        self.call(&format!("DeleteSnapshot {id}"), |dl| async move {
            let req = DeleteSnapshotRequest {
                snapshot_id: id.into(),
                ..Default::default()
            };
            self.controller()
                .await?
                .delete_snapshot(with_deadline(req, dl))
                .await
        })
        .await;
    }

    async fn list_snapshots(&self) -> BTreeSet<String> {
        let r = self
            .call("ListSnapshots", |dl| async move {
                self.controller()
                    .await?
                    .list_snapshots(with_deadline(ListSnapshotsRequest::default(), dl))
                    .await
            })
            .await;
        assert!(r.next_token.is_empty(), "one page holds every snapshot");
        r.entries
            .into_iter()
            .map(|e| e.snapshot.expect("a snapshot").snapshot_id)
            .collect()
    }

    async fn list(&self) -> BTreeSet<String> {
        let r = self
            .call("ListVolumes", |dl| async move {
                self.controller()
                    .await?
                    .list_volumes(with_deadline(ListVolumesRequest::default(), dl))
                    .await
            })
            .await;
        assert!(r.next_token.is_empty(), "one page holds every volume");
        r.entries
            .into_iter()
            .map(|e| e.volume.expect("a volume").volume_id)
            .collect()
    }

    async fn stage(&self, id: &str, staging: &Path, kind: Kind) {
        let req = kind.stage_req(id, staging);
        self.call(&format!("NodeStageVolume {id}"), |dl| {
            let r = req.clone();
            async move {
                self.node()
                    .await?
                    .node_stage_volume(with_deadline(r, dl))
                    .await
            }
        })
        .await;
    }

    async fn unstage(&self, id: &str, staging: &Path) {
        self.call(&format!("NodeUnstageVolume {id}"), |dl| async move {
            self.node()
                .await?
                .node_unstage_volume(with_deadline(unstage_req(id, staging), dl))
                .await
        })
        .await;
    }

    async fn publish(&self, id: &str, staging: &Path, target: &Path, cap: &VolumeCapability) {
        let req = publish_req(id, staging, target, cap.clone(), false);
        self.call(&format!("NodePublishVolume {id}"), |dl| {
            let r = req.clone();
            async move {
                self.node()
                    .await?
                    .node_publish_volume(with_deadline(r, dl))
                    .await
            }
        })
        .await;
    }

    async fn unpublish(&self, id: &str, target: &Path) {
        self.call(&format!("NodeUnpublishVolume {id}"), |dl| async move {
            self.node()
                .await?
                .node_unpublish_volume(with_deadline(unpublish_req(id, target), dl))
                .await
        })
        .await;
    }

    async fn reclaim(&self, id: &str) {
        self.call(&format!("ControllerReclaimSpace {id}"), |dl| async move {
            ReclaimSpaceControllerClient::connect(self.addons.clone())
                .await
                .map_err(connect_error)?
                .controller_reclaim_space(with_deadline(reclaim_req(id), dl))
                .await
        })
        .await;
        self.stats.reclaims.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Ext4,
    Block,
    /// ext4 on LUKS2: StorageClass parameter `encrypted: "true"`, staged
    /// with the node-stage Secret of [`KEY`].
    Encrypted,
}

impl Kind {
    fn cap(self) -> VolumeCapability {
        match self {
            Kind::Ext4 | Kind::Encrypted => mount_cap("ext4"),
            Kind::Block => block_cap(),
        }
    }

    fn create_req(self, name: &str) -> CreateVolumeRequest {
        match self {
            Kind::Ext4 => create_req(name, 32 * MIB, self.cap()),
            Kind::Block => create_req(name, 16 * MIB, self.cap()),
            // 16 MiB of it is the LUKS2 header.
            Kind::Encrypted => encrypted_req(name, 32 * MIB, self.cap()),
        }
    }

    fn stage_req(self, id: &str, staging: &Path) -> NodeStageVolumeRequest {
        match self {
            Kind::Encrypted => keyed_stage(id, staging, self.cap(), KEY),
            Kind::Ext4 | Kind::Block => stage_req(id, staging, self.cap()),
        }
    }
}

/// What the CO knows of one volume: updated only after a call answered OK.
#[derive(Debug, Clone)]
struct Vol {
    name: String,
    kind: Kind,
    id: Option<String>,
    staging: PathBuf,
    target: PathBuf,
    staged: bool,
    published: bool,
    deleted: bool,
    /// What the last stage cycle wrote (file content, or the block
    /// pattern at offset 0).
    data: Option<Vec<u8>>,
}

impl Vol {
    fn held(&self) -> Option<&str> {
        match (&self.id, self.deleted) {
            (Some(id), false) => Some(id),
            _ => None,
        }
    }
}

type Model = Arc<Mutex<BTreeMap<usize, Vol>>>;
/// The snapshots the CO holds: id, and whether it deleted it.
type Snaps = Arc<Mutex<BTreeMap<String, bool>>>;
type Problems = Arc<Mutex<Vec<String>>>;

fn update(model: &Model, i: usize, f: impl FnOnce(&mut Vol)) {
    f(model
        .lock()
        .unwrap()
        .get_mut(&i)
        .expect("volume in the model"));
}

fn write_data(v: &Vol, data: &[u8]) -> std::io::Result<()> {
    match v.kind {
        Kind::Ext4 | Kind::Encrypted => write_file(&v.target.join("data"), data),
        Kind::Block => write_at(&v.target, 0, data),
    }
}

/// Reads the volume's data through its publish target; an error text on
/// mismatch.
fn check_data(v: &Vol, want: &[u8]) -> Result<(), String> {
    let got = match v.kind {
        Kind::Ext4 | Kind::Encrypted => {
            std::fs::read(v.target.join("data")).map_err(|e| e.to_string())
        }
        Kind::Block => {
            let read = || -> std::io::Result<Vec<u8>> {
                let mut f = std::fs::File::open(&v.target)?;
                let mut b = vec![0u8; want.len()];
                f.read_exact(&mut b)?;
                Ok(b)
            };
            read().map_err(|e| e.to_string())
        }
    };
    match got {
        Ok(g) if g == want => Ok(()),
        Ok(g) => Err(format!(
            "{} ({:?}): data differs ({} bytes read, {} expected)",
            v.name,
            v.id,
            g.len(),
            want.len()
        )),
        Err(e) => Err(format!(
            "{} ({:?}): cannot read its data: {e}",
            v.name, v.id
        )),
    }
}

fn storm_data(kind: Kind, name: &str, seed: u64, cycle: u64) -> Vec<u8> {
    match kind {
        Kind::Ext4 | Kind::Encrypted => format!("{name} cycle {cycle} seed {seed}\n")
            .repeat(128)
            .into_bytes(),
        Kind::Block => {
            let mut b = vec![0u8; BLOCK_DATA];
            pattern_at(&mut b, 0, mix(seed ^ cycle));
            b
        }
    }
}

/// One volume's life, as the CO drives it: create, one or two cycles of
/// stage, publish, check, write, unpublish, unstage (and maybe reclaim),
/// then delete it, or leave it staged and published, or leave it unstaged.
/// Every [`STORM_ENCRYPTED_EVERY`]th volume is encrypted, and is never
/// deleted in the storm, so that the read-back checks its data.
async fn storm_volume(
    co: &StormCo,
    k: &Kubelet,
    model: &Model,
    snaps: &Snaps,
    problems: &Problems,
    i: usize,
    rng: &mut Rng,
) {
    let kind = if i % STORM_ENCRYPTED_EVERY == 1 {
        Kind::Encrypted
    } else if rng.chance(1, 2) {
        Kind::Ext4
    } else {
        Kind::Block
    };
    let name = format!("zstorm-{i}");
    let cap = kind.cap();
    let vol = Vol {
        name: name.clone(),
        kind,
        id: None,
        staging: k.staging(&name),
        target: k.target(&name),
        staged: false,
        published: false,
        deleted: false,
        data: None,
    };
    let (staging, target) = (vol.staging.clone(), vol.target.clone());
    model.lock().unwrap().insert(i, vol);
    let problem = |p: String| {
        eprintln!("STORM problem: {p}");
        problems.lock().unwrap().push(p);
    };

    let id = co.create(kind.create_req(&name)).await;
    update(model, i, |v| v.id = Some(id.clone()));
    let data_seed = rng.next();
    let cycles = 1 + rng.below(2);
    for cycle in 0..cycles {
        co.stage(&id, &staging, kind).await;
        update(model, i, |v| v.staged = true);
        co.publish(&id, &staging, &target, &cap).await;
        update(model, i, |v| v.published = true);
        let v = model.lock().unwrap()[&i].clone();
        if let Some(want) = &v.data {
            if let Err(e) = check_data(&v, want) {
                problem(format!("after restage: {e}"));
            }
        }
        let data = storm_data(kind, &name, data_seed, cycle);
        match write_data(&v, &data) {
            Ok(()) => update(model, i, |v| v.data = Some(data)),
            Err(e) => problem(format!("{name} ({id}): write through the publish: {e}")),
        }
        co.unpublish(&id, &target).await;
        update(model, i, |v| v.published = false);
        co.unstage(&id, &staging).await;
        update(model, i, |v| v.staged = false);
        if rng.chance(1, 3) {
            co.reclaim(&id).await;
        }
    }
    // A snapshot, sometimes deleted again; it outlives its volume.
    if rng.chance(1, 2) {
        let snap = co.snapshot(&format!("{name}-snap"), &id).await;
        snaps.lock().unwrap().insert(snap.clone(), false);
        if rng.chance(1, 2) {
            co.delete_snapshot(&snap).await;
            snaps.lock().unwrap().insert(snap, true);
        }
    }
    match rng.below(4) {
        0 | 1 if kind != Kind::Encrypted => {
            co.delete(&id).await;
            update(model, i, |v| v.deleted = true);
        }
        0 | 2 => {
            co.stage(&id, &staging, kind).await;
            update(model, i, |v| v.staged = true);
            co.publish(&id, &staging, &target, &cap).await;
            update(model, i, |v| v.published = true);
        }
        _ => {}
    }
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v:?} is not a number"))
    })
}

/// Loop devices whose backing file lies under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        if let Ok(f) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
            if Path::new(f.trim()).starts_with(dir) {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// The storm's CO side: its driver client, the kubelet directory, and the
/// model of what it holds.
struct Storm {
    co: StormCo,
    k: Arc<Kubelet>,
    model: Model,
    snaps: Snaps,
    problems: Problems,
}

impl Storm {
    /// Workers drive volumes through their lives while the killer
    /// SIGKILLs the driver at random moments and starts it again, until
    /// it has killed `want_kills` times (or the workers ran out of
    /// volumes). The number of kills and each restart's time.
    async fn run(
        &self,
        d: &mut TestDriver,
        seed: u64,
        want_kills: usize,
        kill_tree: bool,
        max_volumes: usize,
    ) -> (usize, Vec<Duration>) {
        let next = Arc::new(AtomicUsize::new(0));
        let killer_done = Arc::new(AtomicBool::new(false));

        let mut workers = Vec::new();
        for w in 0..STORM_WORKERS {
            let (co, k, model, problems) = (
                self.co.clone(),
                self.k.clone(),
                self.model.clone(),
                self.problems.clone(),
            );
            let snaps = self.snaps.clone();
            let (next, killer_done) = (next.clone(), killer_done.clone());
            let mut rng = Rng(mix(seed ^ (w as u64 + 1)));
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let enough = i >= STORM_MIN_VOLUMES && killer_done.load(Ordering::SeqCst);
                    if enough || i >= max_volumes {
                        break;
                    }
                    let mut vrng = Rng(mix(rng.next() ^ i as u64));
                    storm_volume(&co, &k, &model, &snaps, &problems, i, &mut vrng).await;
                }
            }));
        }

        // The killer: SIGKILL at a random moment, start again, repeat.
        let mut krng = Rng(mix(seed ^ 0x6b696c6c));
        let mut kills = 0;
        let mut restarts = Vec::new();
        while kills < want_kills && !workers.iter().all(|h| h.is_finished()) {
            tokio::time::sleep(Duration::from_millis(200 + krng.below(2800))).await;
            if workers.iter().all(|h| h.is_finished()) {
                break;
            }
            if kill_tree {
                d.kill9_with_children();
            } else {
                d.kill9();
            }
            kills += 1;
            let t = Instant::now();
            d.spawn().await;
            restarts.push(t.elapsed());
        }
        killer_done.store(true, Ordering::SeqCst);
        for h in workers {
            if let Err(e) = h.await {
                eprintln!("driver log (tail):\n{}", d.log_tail(200));
                std::panic::resume_unwind(e.into_panic());
            }
        }
        (kills, restarts)
    }
}

/// The LVs of the pool whose names start with `prefix`.
fn lvs_named(vg: &str, prefix: &str) -> BTreeSet<String> {
    lvs(vg)
        .thin_volumes("pool")
        .map(|lv| lv.name.clone())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// What the CO holds and the driver does not list or LVM does not have
/// (lost), and what the driver lists or LVM has that the CO does not hold
/// (leaked).
fn lost_and_leaked(
    held: &BTreeSet<String>,
    listed: &BTreeSet<String>,
    on_lvm: &BTreeSet<String>,
) -> (Vec<String>, BTreeSet<String>) {
    let lost = held
        .iter()
        .filter(|id| !listed.contains(*id) || !on_lvm.contains(*id))
        .cloned()
        .collect();
    let leaked = on_lvm
        .iter()
        .chain(listed.iter())
        .filter(|id| !held.contains(*id))
        .cloned()
        .collect();
    (lost, leaked)
}

/// Where the mounts, nodes and crypt mappings differ from what the CO did
/// last (an encrypted volume's mapping is open while it is staged, and
/// only then).
fn mount_mismatches(vols: &[Vol]) -> Vec<String> {
    let mut mount_mismatch = Vec::new();
    for v in vols {
        if let (Kind::Encrypted, Some(id)) = (v.kind, v.held()) {
            let open = crypt_mapping(id).is_some();
            if open != v.staged {
                mount_mismatch.push(format!(
                    "{}: staged={}, but its crypt mapping open={open}",
                    v.name, v.staged
                ));
            }
        }
        if !v.staged && mount_at(&v.staging).is_some() {
            mount_mismatch.push(format!(
                "{}: mounted at its staging path after unstage",
                v.name
            ));
        }
        if !v.published && (mount_at(&v.target).is_some() || is_block_node(&v.target)) {
            mount_mismatch.push(format!("{}: present at its target after unpublish", v.name));
        }
        if v.published {
            let there = match v.kind {
                Kind::Ext4 | Kind::Encrypted => mount_at(&v.target).is_some(),
                Kind::Block => is_block_node(&v.target),
            };
            if !there {
                mount_mismatch.push(format!("{}: published, but nothing at its target", v.name));
            }
        }
    }
    mount_mismatch
}

/// Reads back the data of every volume the CO holds (staging and
/// publishing the unstaged ones again, an encrypted one with its key):
/// the mismatches, how many volumes were checked, and how many of them
/// were encrypted. No encrypted volume to check is a mismatch too.
async fn read_back(co: &StormCo, vols: &[Vol]) -> (Vec<String>, usize, usize) {
    let mut bad_data = Vec::new();
    let (mut checked, mut encrypted) = (0, 0);
    for v in vols.iter().filter(|v| v.held().is_some()) {
        let id = v.id.as_deref().unwrap();
        let Some(want) = &v.data else { continue };
        if !v.published {
            co.stage(id, &v.staging, v.kind).await;
            co.publish(id, &v.staging, &v.target, &v.kind.cap()).await;
        }
        checked += 1;
        if v.kind == Kind::Encrypted {
            encrypted += 1;
        }
        if let Err(e) = check_data(v, want) {
            bad_data.push(e);
        }
    }
    if encrypted == 0 {
        bad_data.push("no encrypted volume's data was read back".into());
    }
    (bad_data, checked, encrypted)
}

/// The CO deletes every snapshot and volume it holds.
async fn delete_everything(co: &StormCo, vols: &[Vol], snaps_held: &BTreeSet<String>) {
    for id in snaps_held {
        co.delete_snapshot(id).await;
    }
    for v in vols.iter().filter(|v| v.held().is_some()) {
        let id = v.id.as_deref().unwrap();
        co.unpublish(id, &v.target).await;
        co.unstage(id, &v.staging).await;
        co.delete(id).await;
    }
}

/// What is left of the storm's volumes on the node after the CO deleted
/// everything: mounts, dm devices, overlays, crypt mappings, block nodes,
/// LVs, loop devices beyond the VG's own.
fn leftovers(d: &TestDriver, k: &Kubelet, vols: &[Vol]) -> Vec<String> {
    let all_ids: Vec<&str> = vols.iter().filter_map(|v| v.id.as_deref()).collect();
    let mut leftovers = Vec::new();
    // Crypt mappings of the driver's naming (`tpcsi-crypt-<id>`) for any
    // of the storm's volumes; other tests' may run beside this one.
    let crypt: BTreeSet<String> = all_ids.iter().map(|id| mapping_name(id)).collect();
    for (n, _) in dm_devices() {
        if crypt.contains(&n) {
            leftovers.push(format!("crypt mapping {n}"));
        }
    }
    for m in mounts_under(k.root.path()) {
        leftovers.push(format!("mount {}", m.display()));
    }
    for m in mounts_under(&d.state_dir()) {
        leftovers.push(format!("mount {}", m.display()));
    }
    let pool = pool_dm_names(&d.vg, "pool");
    for n in dm_of_vg(&d.vg) {
        if !pool.contains(&n) {
            leftovers.push(format!("dm device {n}"));
        }
    }
    for id in &all_ids {
        for o in overlays_of(id) {
            leftovers.push(format!("overlay {o}"));
        }
    }
    for v in vols {
        if is_block_node(&v.target) {
            leftovers.push(format!("block node {}", v.target.display()));
        }
    }
    for lv in lvs(&d.vg).thin_volumes("pool") {
        leftovers.push(format!("LV {}", lv.name));
    }
    let loops = loops_under(d.dir.path());
    if loops.len() != 1 {
        leftovers.push(format!("loop devices on the test's files: {loops:?}"));
    }
    leftovers
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_storm() {
    let seed = env_u64("TPCSI_STORM_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let want_kills = env_u64("TPCSI_STORM_KILLS").unwrap_or(10) as usize;
    let kill_tree = std::env::var("TPCSI_STORM_KILL_TREE").is_ok_and(|v| v == "1");
    eprintln!(
        "MEASURE storm seed={seed} kills_wanted={want_kills} kill_tree={kill_tree} \
         (rerun with TPCSI_STORM_SEED={seed})"
    );
    let max_volumes = STORM_MIN_VOLUMES + 2 * want_kills;

    let k = Arc::new(Kubelet::new("zstorm"));
    let mut d = TestDriver::start(
        "zstorm",
        512 * MIB,
        &format!(
            "{}overprovision_ratio = 50.0\n{}",
            k.extra(),
            encryption_table(false)
        ),
    )
    .await;
    let co = StormCo {
        uri: d.uri(),
        addons: d.addons_uri(),
        stats: Arc::new(Stats::default()),
    };
    let model: Model = Arc::default();
    let snaps: Snaps = Arc::default();
    let problems: Problems = Arc::default();
    let started = Instant::now();
    let storm = Storm {
        co: co.clone(),
        k: k.clone(),
        model: model.clone(),
        snaps: snaps.clone(),
        problems: problems.clone(),
    };
    let (kills, mut restarts) = storm
        .run(&mut d, seed, want_kills, kill_tree, max_volumes)
        .await;
    let storm_time = started.elapsed();
    assert!(d.is_running(), "the driver is up after the storm");

    // What the CO holds against what the driver and LVM have.
    let vols: Vec<Vol> = model.lock().unwrap().values().cloned().collect();
    let held: BTreeSet<String> = vols
        .iter()
        .filter_map(|v| v.held().map(str::to_string))
        .collect();
    let listed = co.list().await;
    let (lost, leaked) = lost_and_leaked(&held, &listed, &lvs_named(&d.vg, "csi-"));
    // The same for snapshots.
    let snaps_held: BTreeSet<String> = snaps
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, deleted)| !**deleted)
        .map(|(id, _)| id.clone())
        .collect();
    let snaps_listed = co.list_snapshots().await;
    let (lost_snaps, leaked_snaps) =
        lost_and_leaked(&snaps_held, &snaps_listed, &lvs_named(&d.vg, "snap-"));

    // Nothing is mounted or published that the CO took down.
    let mount_mismatch = mount_mismatches(&vols);

    // The data of every volume still held reads back (unstaged ones are
    // staged and published again to read it).
    let (bad_data, checked, encrypted_checked) = read_back(&co, &vols).await;

    // The CO deletes everything; nothing of the volumes is left.
    delete_everything(&co, &vols, &snaps_held).await;
    let leftovers = leftovers(&d, &k, &vols);

    let stats = &co.stats;
    restarts.sort();
    eprintln!(
        "MEASURE storm kills={kills} calls={} retried={} lost={} leaked={} seed={seed} volumes={} \
         held_at_end={} snapshots={} snapshots_lost={} snapshots_leaked={} reclaims={} mount_mismatch={} \
         bad_data={} data_checked={checked} encrypted={} encrypted_checked={encrypted_checked} \
         leftovers={} storm_time={:.1}s restart_median={:.2}s restart_max={:.2}s",
        stats.calls.load(Ordering::Relaxed),
        stats.retried.load(Ordering::Relaxed),
        lost.len(),
        leaked.len(),
        vols.len(),
        held.len(),
        snaps.lock().unwrap().len(),
        lost_snaps.len(),
        leaked_snaps.len(),
        stats.reclaims.load(Ordering::Relaxed),
        mount_mismatch.len(),
        bad_data.len(),
        vols.iter().filter(|v| v.kind == Kind::Encrypted).count(),
        leftovers.len(),
        secs(storm_time),
        restarts.get(restarts.len() / 2).map_or(0.0, |x| secs(*x)),
        restarts.last().map_or(0.0, |x| secs(*x)),
    );
    let problems = problems.lock().unwrap().clone();
    let all: Vec<String> = problems
        .iter()
        .cloned()
        .chain(lost.iter().map(|id| format!("lost {id}")))
        .chain(leaked.iter().map(|id| format!("leaked {id}")))
        .chain(lost_snaps.iter().map(|id| format!("lost snapshot {id}")))
        .chain(
            leaked_snaps
                .iter()
                .map(|id| format!("leaked snapshot {id}")),
        )
        .chain(mount_mismatch)
        .chain(bad_data)
        .chain(leftovers)
        .chain(
            d.log()
                .contains(KEY)
                .then(|| "the passphrase in the driver's log".to_string()),
        )
        .collect();
    assert!(
        all.is_empty(),
        "storm seed {seed}: {} problems:\n{}\ndriver log (tail):\n{}",
        all.len(),
        all.join("\n"),
        d.log_tail(200)
    );
    assert_eq!(
        kills, want_kills,
        "the storm ended before it killed the driver as often as asked"
    );
}

// ---------------------------------------------------------------------------
// 7. One driver per state_dir
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn second_instance_is_refused_and_leaves_the_socket() {
    let d = TestDriver::start("zlock", 64 * MIB, "").await;
    let addons_socket = d.dir.path().join("addons.sock");
    let inode = std::fs::metadata(&d.socket).unwrap().ino();
    let addons_inode = std::fs::metadata(&addons_socket).unwrap().ino();
    let uri = d.uri();
    let (status, err, took) = d.run_to_exit(&["--endpoint", &uri]).await;
    eprintln!(
        "MEASURE second instance exited after {:.2}s with {status}: {}",
        secs(took),
        err.trim()
    );
    assert!(!status.success(), "a second instance must fail");
    let lower = err.to_lowercase();
    assert!(
        lower.contains("lock")
            || lower.contains("already")
            || err.contains(&d.state_dir().display().to_string()),
        "the error names the lock or the state_dir: {err}"
    );
    assert_eq!(
        std::fs::metadata(&d.socket).unwrap().ino(),
        inode,
        "the first driver's socket is untouched"
    );
    assert_eq!(
        std::fs::metadata(&addons_socket).unwrap().ino(),
        addons_inode,
        "the first driver's CSI-Addons socket is untouched"
    );
    let mut id = d.identity().await;
    let ready = id
        .probe(ProbeRequest {})
        .await
        .expect("the first driver still answers")
        .into_inner()
        .ready;
    assert_eq!(ready, Some(true));
}

/// A pool left half active (its `_tmeta` and `_tdata` up, the pool down),
/// as an `lvcreate` stopped mid-way leaves it, refuses every activation of
/// the pool. Probe brings it back, and creates work again.
#[tokio::test(flavor = "multi_thread")]
async fn probe_repairs_a_half_active_pool() {
    let d = TestDriver::start("zhalf", 128 * MIB, "").await;
    let co = Co::new(&d).await;
    let first = co.create("zhalf-a", 8 * MIB, mount_cap("ext4")).await;
    lvm(&["vgchange", "--activate", "n", &d.vg]);
    for part in ["pool_tmeta", "pool_tdata"] {
        // Component activation (read-only): LVM asks first.
        lvm(&[
            "lvchange",
            "--yes",
            "--activate",
            "y",
            &format!("{}/{part}", d.vg),
        ]);
    }
    let pool = format!("{}/pool", d.vg);
    let broken = try_lvm(&["lvchange", "--activate", "y", &pool]);
    eprintln!("MEASURE half-active pool, activating it by hand: {broken:?}");
    assert!(broken.is_err(), "the pool is really left half active");

    // Probe repairs it once its (cached) report shows the pool down.
    let mut id = d.identity().await;
    let t = Instant::now();
    while !lvs(&d.vg).find("pool").unwrap().is_active() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "Probe never repaired the pool; log:\n{}",
            d.log_tail(30)
        );
        let _ = id.probe(ProbeRequest {}).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ready = id.probe(ProbeRequest {}).await.unwrap().into_inner().ready;
    assert_eq!(ready, Some(true));
    assert!(
        d.log().contains("is active while the pool is not"),
        "the repair is logged; log:\n{}",
        d.log_tail(30)
    );
    let second = co.create("zhalf-b", 8 * MIB, mount_cap("ext4")).await;
    for v in [&first, &second] {
        co.c.clone().delete_volume(del(v)).await.unwrap();
    }
    assert!(lvs(&d.vg).find(&second).is_none());
}

/// A format this driver began and did not finish (its marker left, the
/// device written) is redone; without the marker the same device is
/// refused, as data the driver did not write must be.
#[tokio::test(flavor = "multi_thread")]
async fn an_unfinished_format_is_redone_and_only_then() {
    let k = Kubelet::new("zmark");
    let d = TestDriver::start("zmark", 128 * MIB, &k.extra()).await;
    let co = Co::new(&d).await;
    let id = co.create("zmark-vol", 32 * MIB, mount_cap("ext4")).await;
    let staging = k.staging("zmark");
    lvm(&["lvchange", "--activate", "y", &format!("{}/{id}", d.vg)]);
    let dev = PathBuf::from(format!("/dev/{}/{id}", d.vg));
    // What a killed mkfs leaves: written blocks and no whole filesystem.
    write_device(&dev, MIB, |off, b| pattern_at(b, off, 0x6d6b6673));

    let mut n = co.n.clone();
    let e = n
        .node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(mount_at(&staging).is_none());

    let marker = d.state_dir().join("formatting").join(&id);
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, id.as_bytes()).unwrap();
    co.stage(&id, &staging, mount_cap("ext4")).await;
    let m = must_mount(&staging, "the redone format is mounted");
    assert_eq!(m.fs_type, "ext4");
    write_file(&staging.join("after"), b"writable").unwrap();
    assert!(!marker.exists(), "the marker goes once the format is done");

    co.unstage(&id, &staging).await;
    co.c.clone().delete_volume(del(&id)).await.unwrap();
}
