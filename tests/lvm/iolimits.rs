//! Per-volume I/O limits (issue 24, part 2): set with cgroup v2's
//! `io.max` in the cgroup of the pod that has the volume published, from
//! the StorageClass's parameters, changed live by ControllerModifyVolume,
//! set again after a restart, taken away at unpublish; not enforced (and
//! said so, and counted in the metrics) where the pod has no cgroup.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thinpool_csi::metrics::IO_UNENFORCED;
use thinpool_csi::proto::csi::v1::*;

use crate::fixtures::{
    block_cap, create_req, create_volume, metrics_address, publish_req, s, sample, scrape,
    stage_req, unpublish_req, Kubelet,
};
use crate::harness::{rdev_of, TestDriver, MIB};

const CGROUP: &str = "/sys/fs/cgroup";

/// A pod's cgroup as kubelet's cgroup driver lays it out.
enum Layout {
    /// systemd, a Burstable pod.
    Systemd,
    /// cgroupfs, a BestEffort pod.
    Cgroupfs,
}

/// A cgroup shaped like a pod's, with the io controller enabled down to
/// it; removed when dropped.
struct PodCgroup {
    dirs: Vec<PathBuf>,
}

impl PodCgroup {
    fn new(uid: &str, layout: Layout) -> PodCgroup {
        let root = Path::new(CGROUP);
        if !root.join("cgroup.controllers").exists() {
            std::fs::create_dir_all(root).unwrap();
            let out = std::process::Command::new("mount")
                .args(["-t", "cgroup2", "none", CGROUP])
                .output()
                .unwrap();
            assert!(out.status.success(), "mount cgroup2: {out:?}");
        }
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap();
        assert!(
            controllers.split_whitespace().any(|c| c == "io"),
            "this kernel's cgroup v2 has no io controller: {controllers}"
        );
        let mut dirs = Vec::new();
        let mut at = root.to_path_buf();
        let parts = match layout {
            Layout::Systemd => [
                "kubepods.slice".to_string(),
                "kubepods-burstable.slice".to_string(),
                format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
            ],
            Layout::Cgroupfs => [
                "kubepods".to_string(),
                "besteffort".to_string(),
                format!("pod{uid}"),
            ],
        };
        for part in parts {
            std::fs::write(at.join("cgroup.subtree_control"), "+io").unwrap();
            at = at.join(part);
            if !at.exists() {
                std::fs::create_dir(&at).unwrap();
                dirs.push(at.clone());
            }
        }
        PodCgroup { dirs }
    }

    fn path(&self) -> &Path {
        self.dirs.last().unwrap()
    }

    fn io_max(&self) -> String {
        std::fs::read_to_string(self.path().join("io.max")).unwrap()
    }

    /// Seconds `dd` takes to write `mib` MiB to `dev` (a device or a file)
    /// with direct I/O from inside this cgroup.
    fn write_secs(&self, dev: &Path, mib: u64) -> f64 {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={} bs=256k count={} oflag=direct conv=notrunc",
            self.path().display(),
            dev.display(),
            mib * 4
        );
        let t = Instant::now();
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        t.elapsed().as_secs_f64()
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The same `mib` MiB written to `dev` as the `limited` runs (each a
/// limit in bytes/s and the seconds it took), from the cgroup of another
/// pod `uid` of the same `layout`, whose io.max holds no limit. Prints
/// them together; the unlimited run must take at most half the slowest
/// limited one's time, so the limit is what slows those.
fn compare_unlimited(
    what: &str,
    layout: Layout,
    uid: &str,
    dev: &Path,
    mib: u64,
    limited: &[(u64, f64)],
) {
    let free = PodCgroup::new(uid, layout);
    assert_eq!(
        free.io_max().trim(),
        "",
        "no limit in the unlimited pod's cgroup"
    );
    let unlimited = free.write_secs(dev, mib);
    drop(free);
    let rate = mib as f64 / unlimited;
    let runs: Vec<String> = limited
        .iter()
        .map(|&(limit, secs)| {
            let limit_mib = limit as f64 / MIB as f64;
            format!(
                "limit {limit_mib} MiB/s {secs:.2} s ({:.1}x the unlimited time, unlimited rate {:.1}x the limit)",
                secs / unlimited,
                rate / limit_mib
            )
        })
        .collect();
    eprintln!(
        "MEASURE io.max ({what}): {mib} MiB unlimited {unlimited:.2} s ({rate:.1} MiB/s); {}",
        runs.join("; ")
    );
    let slowest = limited.iter().map(|l| l.1).fold(0.0, f64::max);
    assert!(
        unlimited * 2.0 <= slowest,
        "unlimited {unlimited:.2} s is not clearly faster than limited {slowest:.2} s"
    );
}

fn within(secs: f64, want: f64) -> bool {
    (secs - want).abs() <= want * 0.2
}

fn numbers(dev: &Path) -> String {
    let (major, minor) = rdev_of(dev).expect("a block device node");
    format!("{major}:{minor}")
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_are_set_in_the_pods_cgroup_changed_live_and_taken_away() {
    let k = Kubelet::new("iolim");
    let uid = "7a1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    let pod = PodCgroup::new(uid, Layout::Systemd);
    let extra = format!("{}cgroup_root = \"{CGROUP}\"\n", k.extra());
    let mut d = TestDriver::start("iolim", 96 * MIB, &extra).await;
    let mut req = create_req("pvc-limited", 32 * MIB, block_cap());
    // Limits well under what the VM's loop device writes even when every
    // test runs at once, so the time is the limit's.
    req.parameters
        .insert("writeBytesPerSecond".into(), (2 * MIB).to_string());
    let mut c = d.controller().await;
    let id = create_volume(&mut c, req).await.volume_id;
    let (staging, target) = (k.staging("pvc-limited"), k.target(uid));
    let mut n = d.node().await;
    n.node_stage_volume(stage_req(&id, &staging, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &staging, &target, block_cap(), false))
        .await
        .unwrap();
    let dev_nr = numbers(&target);
    let line = pod.io_max();
    assert!(
        line.contains(&format!("{dev_nr} rbps=max wbps={}", 2 * MIB)),
        "{line:?}"
    );

    // 8 MiB at 2 MiB/s: about 4 s, within 20 %.
    let limited = pod.write_secs(&target, 8);
    eprintln!("MEASURE io.max: 8 MiB at 2 MiB/s took {limited:.2} s");
    assert!(within(limited, 4.0), "{limited} s");

    // ModifyVolume changes it live: 4 MiB/s, about 2 s.
    c.controller_modify_volume(ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: [("writeBytesPerSecond".to_string(), (4 * MIB).to_string())].into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(
        pod.io_max().contains(&format!("wbps={}", 4 * MIB)),
        "{}",
        pod.io_max()
    );
    let faster = pod.write_secs(&target, 8);
    eprintln!("MEASURE io.max: 8 MiB at 4 MiB/s took {faster:.2} s");
    assert!(within(faster, 2.0), "{faster} s");
    compare_unlimited(
        "block, systemd",
        Layout::Systemd,
        "7a1e2d3c-4b5a-6978-8796-a5b4c3d2e1f1",
        &target,
        8,
        &[(2 * MIB, limited), (4 * MIB, faster)],
    );

    // A restart sets them again (here: after someone cleared them).
    std::fs::write(pod.path().join("io.max"), format!("{dev_nr} wbps=max")).unwrap();
    assert!(!pod.io_max().contains(&dev_nr));
    d.stop();
    d.spawn_and_heal().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pod.io_max().contains(&format!("wbps={}", 4 * MIB)) {
        assert!(Instant::now() < deadline, "{}", d.log_tail(20));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Unpublish takes them away.
    let mut n = d.node().await;
    n.node_unpublish_volume(unpublish_req(&id, &target))
        .await
        .unwrap();
    assert!(!pod.io_max().contains(&dev_nr), "{}", pod.io_max());
    drop(pod);
}

/// A filesystem volume in a pod of kubelet's cgroupfs layout: the limit
/// is on the LV's device, which the filesystem's writes reach.
#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_volume_is_limited_in_a_cgroupfs_pod() {
    let k = Kubelet::new("iolimfs");
    let uid = "5c1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    let pod = PodCgroup::new(uid, Layout::Cgroupfs);
    let extra = format!("{}cgroup_root = \"{CGROUP}\"\n", k.extra());
    let d = TestDriver::start("iolimfs", 128 * MIB, &extra).await;
    let mut req = create_req(
        "pvc-fs-limited",
        48 * MIB,
        crate::fixtures::mount_cap("ext4"),
    );
    req.parameters
        .insert("writeBytesPerSecond".into(), (2 * MIB).to_string());
    let id = create_volume(&mut d.controller().await, req)
        .await
        .volume_id;
    let (staging, target) = (k.staging("pvc-fs-limited"), k.target(uid));
    let cap = crate::fixtures::mount_cap("ext4");
    let mut n = d.node().await;
    n.node_stage_volume(stage_req(&id, &staging, cap.clone()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &staging, &target, cap, false))
        .await
        .unwrap();
    assert!(
        pod.io_max().contains(&format!("wbps={}", 2 * MIB)),
        "{}",
        pod.io_max()
    );
    let file = target.join("f");
    let secs = pod.write_secs(&file, 8);
    eprintln!("MEASURE io.max (ext4, cgroupfs): 8 MiB at 2 MiB/s took {secs:.2} s");
    assert!(within(secs, 4.0), "{secs} s");
    compare_unlimited(
        "ext4, cgroupfs",
        Layout::Cgroupfs,
        "5c1e2d3c-4b5a-6978-8796-a5b4c3d2e1f1",
        &file,
        8,
        &[(2 * MIB, secs)],
    );
    n.node_unpublish_volume(unpublish_req(&id, &target))
        .await
        .unwrap();
    assert!(!pod.io_max().contains("wbps="), "{}", pod.io_max());
}

/// The unenforced-limits counter of the driver's metrics at `addr`.
async fn unenforced(addr: &str) -> f64 {
    sample(&scrape(addr).await, IO_UNENFORCED)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_that_cannot_be_set_is_said_and_the_volume_still_served() {
    let k = Kubelet::new("iolimnone");
    // No cgroup of this pod anywhere.
    let uid = "9b1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    let addr = metrics_address();
    let extra = format!(
        "{}cgroup_root = \"{CGROUP}\"\nmetrics_address = \"{addr}\"\n",
        k.extra()
    );
    let d = TestDriver::start("iolimnone", 96 * MIB, &extra).await;
    assert_eq!(unenforced(&addr).await, 0.0);
    let mut req = create_req("pvc-unenforced", 16 * MIB, block_cap());
    req.parameters.insert("readIOPS".into(), "100".into());
    let id = create_volume(&mut d.controller().await, req)
        .await
        .volume_id;
    let (staging, target) = (k.staging("pvc-unenforced"), k.target(uid));
    let mut n = d.node().await;
    n.node_stage_volume(stage_req(&id, &staging, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &staging, &target, block_cap(), false))
        .await
        .expect("published although the limit cannot be set");
    assert_eq!(unenforced(&addr).await, 1.0, "the publish counts");
    let stats = n
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: s(&target),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let cond = stats.volume_condition.unwrap();
    assert!(
        cond.abnormal && cond.message.contains("I/O limits are not enforced"),
        "{cond:?}"
    );
    assert!(cond.message.contains("no cgroup of pod"), "{cond:?}");
    // NodeGetVolumeStats tried to set them again, and failed again.
    assert_eq!(
        unenforced(&addr).await,
        2.0,
        "the stats call's retry counts"
    );
    // A bad limit is refused by name.
    let mut bad = create_req("pvc-bad-limit", 16 * MIB, block_cap());
    bad.parameters.insert("writeIOPS".into(), "-5".into());
    let e = d.controller().await.create_volume(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("writeIOPS"), "{}", e.message());
    n.node_unpublish_volume(unpublish_req(&id, &target))
        .await
        .unwrap();
    // Taking away limits that were never set is no failure to set them.
    assert_eq!(unenforced(&addr).await, 2.0, "the unpublish does not count");
}
