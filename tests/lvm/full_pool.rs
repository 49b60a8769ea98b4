//! A full pool, filled through a staged ext4 volume larger than the pool:
//! writes fail, the driver keeps answering, refuses claims and says why;
//! after the pool is extended, and after space is reclaimed, everything
//! works again and the filesystem is clean.
//!
//! The driver runs with a report cache (`report_max_age_secs = 60`), so
//! its view is stale right after the pool is extended by hand: CreateVolume
//! must look again before it refuses.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thinpool_csi::proto::csi::v1::*;
use tonic::Code;

use crate::fixtures::{
    create, create_req, del, mount_cap, node_reclaim, pool_data_percent, stage_req, unstage_req,
    Kubelet,
};
use crate::harness::{lvm, lvs, TestDriver, MIB};

/// Writes files of random data under `dir` with O_DIRECT until a write
/// fails; returns dd's stderr of the failing write.
fn fill(dir: &Path, prefix: &str) -> String {
    for i in 0..64 {
        let out = Command::new("dd")
            .args([
                "if=/dev/urandom",
                &format!("of={}/{prefix}-{i}", dir.display()),
                "bs=1M",
                "count=16",
                "oflag=direct",
                "conv=fsync",
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            return String::from_utf8_lossy(&out.stderr).into_owned();
        }
    }
    panic!("1 GiB written and the pool is not full");
}

/// A small write with fsync; its error, if any.
fn write_synced(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(&vec![0x5a; 256 * 1024])?;
    f.sync_all()
}

/// Unstages the volume, runs `fsck.ext4 -fn` on it, and stages it again;
/// returns fsck's exit status and output.
async fn fsck_between_stages(d: &TestDriver, id: &str, staging: &Path) -> (i32, String) {
    let mut n = d.node().await;
    n.node_unstage_volume(unstage_req(id, staging))
        .await
        .unwrap();
    let lv = format!("{}/{id}", d.vg);
    lvm(&["lvchange", "-ay", &lv]);
    let out = Command::new("fsck.ext4")
        .args(["-fn", &format!("/dev/{lv}")])
        .output()
        .unwrap();
    lvm(&["lvchange", "-an", &lv]);
    n.node_stage_volume(stage_req(id, staging, mount_cap("ext4")))
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

async fn create_code(d: &TestDriver, name: &str) -> (Code, String, Option<String>) {
    match d
        .controller()
        .await
        .create_volume(create_req(name, 4 * MIB, mount_cap("ext4")))
        .await
    {
        Ok(v) => (
            Code::Ok,
            String::new(),
            v.into_inner().volume.map(|v| v.volume_id),
        ),
        Err(s) => (s.code(), s.message().to_string(), None),
    }
}

/// Asserts what a full pool looks like through every RPC that reports it.
async fn assert_full(d: &TestDriver, id: &str, staging: &Path) {
    let (code, msg, _) = create_code(d, "full-claim").await;
    eprintln!("CreateVolume on a full pool: {code:?}: {msg}");
    assert_eq!(
        code,
        Code::ResourceExhausted,
        "CreateVolume on a full pool: {msg}"
    );
    assert!(
        msg.contains("full"),
        "the refusal names the full pool: {msg}"
    );
    let cap = d.capacity().await;
    assert_eq!(
        (cap.available_capacity, cap.maximum_volume_size),
        (0, Some(0)),
        "GetCapacity on a full pool: {cap:?}"
    );
    // The pod's readiness fails: 10 + RESOURCE_EXHAUSTED (8).
    let out = crate::fixtures::tpcsi(d, &["probe"]);
    assert_eq!(
        out.status.code(),
        Some(18),
        "tpcsi probe on a full pool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = d
        .node()
        .await
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: staging.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume_condition
        .unwrap();
    eprintln!("NodeGetVolumeStats condition: {st:?}");
    assert!(st.abnormal && st.message.contains("full"), "{st:?}");
    let cond = d.condition(id).await;
    eprintln!("ControllerGetVolume condition: {cond:?}");
    assert!(cond.abnormal && cond.message.contains("full"), "{cond:?}");
}

/// Asserts that the pool works again: a claim is accepted (and deleted),
/// a write succeeds, and fsck finds the volume clean.
async fn assert_works(d: &TestDriver, id: &str, staging: &Path, what: &str) {
    let (code, msg, made) = create_code(d, &format!("claim-after-{what}")).await;
    assert_eq!(code, Code::Ok, "CreateVolume after {what}: {msg}");
    d.controller()
        .await
        .delete_volume(del(&made.unwrap()))
        .await
        .unwrap();
    write_synced(&staging.join(format!("after-{what}")))
        .unwrap_or_else(|e| panic!("a write after {what}: {e}"));
    let (status, out) = fsck_between_stages(d, id, staging).await;
    eprintln!("fsck -fn after {what}: exit {status}");
    assert_eq!(status, 0, "fsck -fn after {what}:\n{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn full_pool_refuses_claims_then_recovers_after_extend_and_after_reclaim() {
    let k = Kubelet::new("full");
    let mut d = TestDriver::start(
        "full",
        96 * MIB,
        &format!("{}report_max_age_secs = 60\n", k.extra()),
    )
    .await;
    let vg = d.vg.clone();
    lvm(&["lvchange", "--errorwhenfull", "y", &format!("{vg}/pool")]);
    let pool_size = lvs(&vg).find("pool").unwrap().size;
    let id = create(&d, "big", 2 * pool_size, mount_cap("ext4")).await;
    let staging: PathBuf = k.staging("big");
    d.node()
        .await
        .node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
        .await
        .unwrap();

    // Fill it while a prober checks that the driver keeps answering.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (stop, uri) = (stop.clone(), d.uri());
        tokio::spawn(async move {
            let mut c = thinpool_csi::proto::csi::v1::identity_client::IdentityClient::connect(uri)
                .await
                .unwrap();
            let (mut worst, mut n) = (Duration::ZERO, 0);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                c.probe(ProbeRequest {})
                    .await
                    .expect("Probe while the pool fills");
                worst = worst.max(t.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (worst, n)
        })
    };
    let dir = staging.clone();
    let err = tokio::task::spawn_blocking(move || fill(&dir, "fill"))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let (worst, probes) = prober.await.unwrap();
    let pct = pool_data_percent(&vg);
    eprintln!(
        "the pool filled to {pct}%: {}; {probes} probes, slowest {worst:?}",
        err.trim()
    );
    assert!(
        err.contains("Input/output error") || err.contains("No space left"),
        "writes fail with EIO or ENOSPC: {err}"
    );
    assert!(pct >= 99.0, "the pool is full: {pct}%");
    assert!(
        worst < Duration::from_secs(1),
        "Probe answered within 1 s (slowest {worst:?})"
    );

    // The driver was told nothing: a restart gives it a fresh view, which
    // it then caches for 60 s.
    d.restart().await;
    let t = Instant::now();
    d.identity().await.probe(ProbeRequest {}).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "Probe on a full pool took {:?}",
        t.elapsed()
    );
    assert_full(&d, &id, &staging).await;

    // Extend the pool by hand; the cached report still says full.
    lvm(&["lvextend", "--yes", "-L", "+8m", &format!("{vg}/pool")]);
    eprintln!("pool extended: {}% used", pool_data_percent(&vg));
    assert_works(&d, &id, &staging, "lvextend").await;
    assert!(
        crate::fixtures::tpcsi(&d, &["probe"]).status.success(),
        "ready again once the pool was extended"
    );

    // Fill it again, then delete the files and reclaim.
    let dir = staging.clone();
    let err = tokio::task::spawn_blocking(move || fill(&dir, "refill"))
        .await
        .unwrap();
    eprintln!(
        "filled again to {}%: {}",
        pool_data_percent(&vg),
        err.trim()
    );
    d.restart().await;
    assert_full(&d, &id, &staging).await;
    for e in std::fs::read_dir(&staging).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("fill-") || name.starts_with("refill-") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    nix::unistd::sync();
    let (pre, post) = node_reclaim(&d, &id, &staging).await;
    eprintln!(
        "ReclaimSpace: {} MiB → {} MiB used; pool {}%",
        pre / MIB,
        post / MIB,
        pool_data_percent(&vg)
    );
    assert!(post < pre, "ReclaimSpace gave space back: {pre} → {post}");
    assert_works(&d, &id, &staging, "reclaim").await;

    d.node()
        .await
        .node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    d.controller().await.delete_volume(del(&id)).await.unwrap();
}
