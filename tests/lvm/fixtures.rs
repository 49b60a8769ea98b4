//! The fixtures the LVM suite's modules share: a kubelet-like directory,
//! request and capability builders, the calls several modules make the
//! same way, and the SnapshotMetadata stream readers. `harness.rs` keeps
//! the driver process and the VM-level tools (`TestDriver`, `lvs`, `lvm`,
//! dm); it is also compiled into the benches, this file is not. A helper
//! only one module uses stays in that module.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use thinpool_csi::mountinfo::MountInfo;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Status;

use crate::harness::{dm_devices, lvs, TestDriver};

// ---------------------------------------------------------------------------
// The kubelet's directory
// ---------------------------------------------------------------------------

/// A directory standing in for /var/lib/kubelet.
pub(crate) struct Kubelet {
    pub(crate) root: tempfile::TempDir,
}

impl Kubelet {
    pub(crate) fn new(name: &str) -> Kubelet {
        Kubelet {
            root: tempfile::Builder::new()
                .prefix(&format!("tpcsi-kubelet-{name}-"))
                .tempdir()
                .unwrap(),
        }
    }
    /// Config text for the driver.
    pub(crate) fn extra(&self) -> String {
        format!("allowed_roots = [\"{}\"]\n", self.root.path().display())
    }
    /// A staging directory, created as the CO would.
    pub(crate) fn staging(&self, name: &str) -> PathBuf {
        let p = self.root.path().join("staging").join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
    /// A target path whose parent exists (the CO's part); the target itself
    /// is the driver's to create.
    pub(crate) fn target(&self, name: &str) -> PathBuf {
        let parent = self.root.path().join("pods").join(name);
        std::fs::create_dir_all(&parent).unwrap();
        parent.join("vol")
    }
    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }
}

impl Drop for Kubelet {
    /// What a test left staged or published is unmounted (lazily) before
    /// the directory goes, so no mount outlives its test.
    fn drop(&mut self) {
        let mut points = mounts_under(self.root.path());
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A path as a request field.
pub(crate) fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

// ---------------------------------------------------------------------------
// Encryption
// ---------------------------------------------------------------------------

/// The passphrase of the suite's encrypted volumes.
pub(crate) const KEY: &str = "correct horse battery staple 7f3a";

/// The driver's `[encryption]` table for the suite (after every top-level
/// key of a config): key slots cheap to derive (pbkdf2 at its minimum
/// cost: TCG makes argon2 and timed iterations slow, and the cost of the
/// derivation is not what is tested).
pub(crate) fn encryption_table(discards: bool) -> String {
    format!(
        "[encryption]\npbkdf = \"pbkdf2\"\npbkdf_iterations = 1000\nallow_discards = {discards}\n"
    )
}

/// CreateVolume of a volume with StorageClass parameter `encrypted: "true"`.
pub(crate) fn encrypted_req(name: &str, bytes: u64, cap: VolumeCapability) -> CreateVolumeRequest {
    let mut r = create_req(name, bytes, cap);
    r.parameters.insert("encrypted".into(), "true".into());
    r
}

/// A node-stage Secret holding `pass`.
pub(crate) fn secrets(pass: &str) -> HashMap<String, String> {
    [("passphrase".to_string(), pass.to_string())].into()
}

/// NodeStageVolume with the node-stage Secret of `pass`.
pub(crate) fn keyed_stage(
    id: &str,
    staging: &Path,
    cap: VolumeCapability,
    pass: &str,
) -> NodeStageVolumeRequest {
    let mut r = stage_req(id, staging, cap);
    r.secrets = secrets(pass);
    r
}

/// The numbers of the volume's open crypt mapping, if there is one.
pub(crate) fn crypt_mapping(id: &str) -> Option<(u32, u32)> {
    let name = thinpool_csi::node::crypt::mapping_name(id);
    dm_devices()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, nr)| nr)
}

// ---------------------------------------------------------------------------
// Capabilities
// ---------------------------------------------------------------------------

pub(crate) fn mount_cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

pub(crate) fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub(crate) fn mount_flags(fs: &str, flags: &[&str]) -> VolumeCapability {
    let mut cap = mount_cap(fs);
    cap.access_type = Some(AccessType::Mount(MountVolume {
        fs_type: fs.into(),
        mount_flags: flags.iter().map(|f| f.to_string()).collect(),
        ..Default::default()
    }));
    cap
}

// ---------------------------------------------------------------------------
// Controller requests and calls
// ---------------------------------------------------------------------------

pub(crate) fn create_req(name: &str, bytes: u64, cap: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

pub(crate) fn del(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: Default::default(),
    }
}

pub(crate) fn snap_req(name: &str, source: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        ..Default::default()
    }
}

/// CreateVolume as `req` asks, which must succeed; the volume.
pub(crate) async fn create_volume(
    c: &mut ControllerClient<Channel>,
    req: CreateVolumeRequest,
) -> Volume {
    c.create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// Creates a volume, which must succeed; its id.
pub(crate) async fn create(
    d: &TestDriver,
    name: &str,
    bytes: u64,
    cap: VolumeCapability,
) -> String {
    let mut c = d.controller().await;
    create_volume(&mut c, create_req(name, bytes, cap))
        .await
        .volume_id
}

/// Snapshots `source`, which must succeed; the snapshot.
pub(crate) async fn snapshot_of(
    c: &mut ControllerClient<Channel>,
    name: &str,
    source: &str,
) -> Snapshot {
    c.create_snapshot(snap_req(name, source))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

/// Snapshots `source`, which must succeed; the snapshot's id.
pub(crate) async fn snapshot(
    c: &mut ControllerClient<Channel>,
    name: &str,
    source: &str,
) -> String {
    snapshot_of(c, name, source).await.snapshot_id
}

// ---------------------------------------------------------------------------
// Node requests
// ---------------------------------------------------------------------------

pub(crate) fn stage_req(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: s(staging),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub(crate) fn unstage_req(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: s(staging),
    }
}

pub(crate) fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: s(staging),
        target_path: s(target),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

pub(crate) fn unpublish_req(id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: s(target),
    }
}

// ---------------------------------------------------------------------------
// What the node sees: mounts, devices, the pool
// ---------------------------------------------------------------------------

pub(crate) fn mounts_under(root: &Path) -> Vec<PathBuf> {
    MountInfo::read()
        .unwrap()
        .mounts()
        .iter()
        .filter(|m| m.mount_point.starts_with(root))
        .map(|m| m.mount_point.clone())
        .collect()
}

pub(crate) fn write_at(path: &Path, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    f.write_all(data)?;
    f.sync_all()
}

pub(crate) fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// How many filesystems the driver has made (its log's count).
pub(crate) fn mkfs_runs(d: &TestDriver) -> usize {
    d.log().matches("made filesystem").count()
}

pub(crate) fn pool_data_percent(vg: &str) -> f64 {
    lvs(vg).find("pool").unwrap().data_percent.unwrap_or(0.0)
}

// ---------------------------------------------------------------------------
// CSI-Addons calls
// ---------------------------------------------------------------------------

/// NodeReclaimSpace of a staged volume, which must succeed: its pre and
/// post usage.
pub(crate) async fn node_reclaim(d: &TestDriver, id: &str, staging: &Path) -> (u64, u64) {
    use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
    use thinpool_csi::proto::reclaimspace::NodeReclaimSpaceRequest;
    let mut n = ReclaimSpaceNodeClient::connect(d.addons_uri())
        .await
        .unwrap();
    let r = n
        .node_reclaim_space(NodeReclaimSpaceRequest {
            volume_id: id.into(),
            volume_path: String::new(),
            staging_target_path: staging.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (
        r.pre_usage.unwrap().usage_bytes as u64,
        r.post_usage.unwrap().usage_bytes as u64,
    )
}

/// ControllerReclaimSpace of a volume nothing uses, which must succeed:
/// its pre and post usage.
pub(crate) async fn controller_reclaim(d: &TestDriver, id: &str) -> (u64, u64) {
    use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
    use thinpool_csi::proto::reclaimspace::ControllerReclaimSpaceRequest;
    let mut c = ReclaimSpaceControllerClient::connect(d.addons_uri())
        .await
        .unwrap();
    let r = c
        .controller_reclaim_space(ControllerReclaimSpaceRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("ControllerReclaimSpace of {id}: {e:?}"))
        .into_inner();
    (
        r.pre_usage.unwrap().usage_bytes as u64,
        r.post_usage.unwrap().usage_bytes as u64,
    )
}

/// NodeHealer, which must answer: whether it found the volume abnormal,
/// and its message.
pub(crate) async fn heal(
    d: &TestDriver,
    id: &str,
    target: &Path,
    staging: &Path,
    cap: Option<VolumeCapability>,
) -> (bool, String) {
    use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
    use thinpool_csi::proto::healer::NodeHealerRequest;
    let mut h = HealerNodeClient::connect(d.addons_uri()).await.unwrap();
    let r = h
        .node_healer(NodeHealerRequest {
            volume_id: id.into(),
            volume_path: s(target),
            staging_target_path: s(staging),
            volume_capability: cap,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("NodeHealer {id}: {e}"))
        .into_inner();
    eprintln!("HEAL {id}: abnormal={} {}", r.abnormal, r.message);
    (r.abnormal, r.message)
}

// ---------------------------------------------------------------------------
// The metrics endpoint
// ---------------------------------------------------------------------------

/// A `metrics_address` for a driver's config: a free port on the loopback
/// interface, which is brought up first ([`loopback_up`]).
pub(crate) fn metrics_address() -> String {
    loopback_up();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// The VM's init leaves the loopback interface down: bring it up, as
/// `ip link set lo up` does (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP),
/// without needing iproute2 on the machine.
fn loopback_up() {
    // SAFETY: a zeroed ifreq with a NUL-terminated name, passed to the two
    // interface-flag ioctls on a socket this function owns and closes.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let get = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        let err = std::io::Error::last_os_error();
        assert_eq!(get, 0, "SIOCGIFFLAGS lo: {err}");
        if req.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            let set = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
            let err = std::io::Error::last_os_error();
            assert_eq!(set, 0, "SIOCSIFFLAGS lo up: {err}");
        }
        libc::close(fd);
    }
}

/// GET /metrics: the samples by series (`name{labels}`); an answer other
/// than 200 OK fails the test.
pub(crate) async fn scrape(addr: &str) -> BTreeMap<String, f64> {
    thinpool_csi::metrics::http::scrape(addr.parse().unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The value of `series` in scrape `m`, which must hold it.
pub(crate) fn sample(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("no {series} in the scrape: {m:#?}"))
}

// ---------------------------------------------------------------------------
// The tpcsi client
// ---------------------------------------------------------------------------

/// Runs `tpcsi` on this driver's sockets.
pub(crate) fn tpcsi(d: &TestDriver, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tpcsi"))
        .arg("--endpoint")
        .arg(d.uri())
        .arg("--addons-endpoint")
        .arg(d.addons_uri())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tpcsi");
    eprintln!(
        "$ tpcsi {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

// ---------------------------------------------------------------------------
// SnapshotMetadata streams
// ---------------------------------------------------------------------------

/// One message of a SnapshotMetadata stream: its block_metadata_type and
/// its ranges.
pub(crate) type Batch = (i32, Vec<BlockMetadata>);

/// Every message of a GetMetadataAllocated stream, or the status that
/// ended it (at the call or in the stream).
pub(crate) async fn allocated_batches(
    m: &mut SnapshotMetadataClient<Channel>,
    id: &str,
    start: i64,
    max: i32,
) -> Result<Vec<Batch>, Status> {
    let req = GetMetadataAllocatedRequest {
        snapshot_id: id.into(),
        starting_offset: start,
        max_results: max,
        ..Default::default()
    };
    let s = m.get_metadata_allocated(req).await?.into_inner();
    drain(s, |r| (r.block_metadata_type, r.block_metadata)).await
}

/// Every message of a GetMetadataDelta stream, or the status that ended
/// it (at the call or in the stream).
pub(crate) async fn delta_batches(
    m: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
    start: i64,
    max: i32,
) -> Result<Vec<Batch>, Status> {
    let req = GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        starting_offset: start,
        max_results: max,
        ..Default::default()
    };
    let s = m.get_metadata_delta(req).await?.into_inner();
    drain(s, |r| (r.block_metadata_type, r.block_metadata)).await
}

/// A stream's messages, each made a [`Batch`] by `batch`.
async fn drain<T>(
    mut s: tonic::Streaming<T>,
    batch: impl Fn(T) -> Batch,
) -> Result<Vec<Batch>, Status> {
    let mut out = Vec::new();
    while let Some(r) = s.message().await? {
        out.push(batch(r));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// The autopilot under a paced writer (tests/lvm/autopilot.rs, benches/perf.rs)
// ---------------------------------------------------------------------------

/// Stages and publishes block volume `id`; the published device node.
pub(crate) async fn publish_block(d: &TestDriver, k: &Kubelet, id: &str) -> std::path::PathBuf {
    let (staging, target) = (k.staging(id), k.target(id));
    let mut n = d.node().await;
    n.node_stage_volume(stage_req(id, &staging, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(id, &staging, &target, block_cap(), false))
        .await
        .unwrap();
    target
}

pub(crate) async fn unpublish_block(d: &TestDriver, k: &Kubelet, id: &str) {
    let mut n = d.node().await;
    n.node_unpublish_volume(unpublish_req(id, &k.target(id)))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(id, &k.staging(id)))
        .await
        .unwrap();
}

/// What one writer at a steady rate met on a fresh pool ([`autopilot_run`]).
#[derive(Debug)]
pub(crate) struct AutopilotRun {
    pub(crate) paced: crate::harness::Paced,
    /// dm-thin's lines saying the pool switched to out-of-data-space mode
    /// while the writer ran: each time writes queued (or failed).
    pub(crate) switches: Vec<String>,
    pub(crate) start_pool: u64,
    pub(crate) end_pool: u64,
    /// The driver's "grew the thin pool" log lines.
    pub(crate) growths: Vec<String>,
}

impl AutopilotRun {
    /// Whether the writer went through without a queued or failed write.
    pub(crate) fn clean(&self) -> bool {
        self.switches.is_empty() && self.paced.error.is_none()
    }
}

/// The autopilot's settings for [`autopilot_run`]: `data_threshold_percent`
/// and `step_percent`.
pub(crate) struct Steps {
    pub(crate) threshold: u8,
    pub(crate) step: u8,
}

/// A fresh driver on its own VG (a 160 MiB loop file, 40 % of it for the
/// pool's data: 60 MiB; its status read every second, the file free to
/// grow to 1 GiB; `steps` and `error_when_full` as given), one 1 GiB raw
/// block volume published, and `total` bytes written to it with direct I/O at `rate`
/// bytes a second in 1 MiB chunks; what the writer and the kernel saw.
pub(crate) async fn autopilot_run(
    name: &str,
    rate: u64,
    total: u64,
    error_when_full: bool,
    steps: Steps,
) -> AutopilotRun {
    use crate::harness::{out_of_space_switches, paced_write, pool_kernel_name, KernelLog, MIB};
    let k = Kubelet::new(name);
    let extra = format!(
        "{}overprovision_ratio = 20\nerror_when_full = {error_when_full}\n\
         autopilot = {{ enabled = true, data_threshold_percent = {}, step_percent = {}, \
         backing_file_limit = \"1GiB\", host_reserve = 0, poll_secs = 1 }}\n",
        k.extra(),
        steps.threshold,
        steps.step
    );
    let d =
        TestDriver::start_with_loop_keys(name, 160 * MIB, &extra, "pool_percent = 40\n", &[]).await;
    let pool_size = || lvs(&d.vg).find("pool").unwrap().size;
    let start_pool = pool_size();
    assert!(
        (56 * MIB..=64 * MIB).contains(&start_pool),
        "the pool starts at {start_pool} bytes, not about 60 MiB"
    );
    let id = create(&d, &format!("pvc-{name}"), 1024 * MIB, block_cap()).await;
    let dev = publish_block(&d, &k, &id).await;
    let kname = pool_kernel_name(&d.vg, "pool").expect("the thin-pool device is active");
    let mut klog = KernelLog::new();
    let dev2 = dev.clone();
    let paced = tokio::task::spawn_blocking(move || paced_write(&dev2, rate, total, MIB as usize))
        .await
        .unwrap();
    let switches = out_of_space_switches(&klog.read(), &kname);
    let end_pool = pool_size();
    let growths = d
        .log()
        .lines()
        .filter(|l| l.contains("autopilot: grew"))
        .map(String::from)
        .collect();
    unpublish_block(&d, &k, &id).await;
    AutopilotRun {
        paced,
        switches,
        start_pool,
        end_pool,
        growths,
    }
}
