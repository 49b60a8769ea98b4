//! The metrics endpoint against real LVM: the pool figures and the
//! volume and snapshot counts a scrape shows are what `lvs` says, RPC
//! counters move with the calls made (errors by code), a scrape of an
//! unchanged pool runs no LVM command, and each call has its log line.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use thinpool_csi::lvm::report::Capacity;
use thinpool_csi::proto::csi::v1::*;
use tonic::Code;

use crate::fixtures::{block_cap, create_req, metrics_address, mount_cap, sample, scrape};
use crate::harness::{counting_lvm, file_lines, lvm, lvs, sh, TestDriver, MIB};

fn rpc(kind: &str, method: &str) -> String {
    format!("thinpool_csi_rpc_{kind}{{service=\"csi.v1.Controller\",method=\"{method}\"}}")
}

/// The LVM commands in the wrapper's log, less the start-up check of each
/// LVM shell (`version`, which reads no device): whether the driver starts
/// a new shell or reuses one must not change the count.
fn lvm_calls(log: &Path) -> usize {
    file_lines(log).iter().filter(|l| *l != "version").count()
}

/// An ext4 volume, a block one with 4 MiB written to it behind the
/// driver's back (so the pool's Data% is not 0), and a snapshot of the
/// first: two CreateVolume and one CreateSnapshot.
async fn volumes_and_a_snapshot(
    d: &TestDriver,
    c: &mut thinpool_csi::proto::csi::v1::controller_client::ControllerClient<
        tonic::transport::Channel,
    >,
) {
    let a = c
        .create_volume(create_req("m-a", 16 * MIB, mount_cap("ext4")))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let b = c
        .create_volume(create_req("m-b", 8 * MIB, block_cap()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // Data in the pool, so that Data% is not 0: 4 MiB written to the raw
    // volume, activated behind the driver's back.
    lvm(&["lvchange", "-ay", &format!("{}/{}", d.vg, b.volume_id)]);
    sh(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of=/dev/{}/{}", d.vg, b.volume_id),
            "bs=1M",
            "count=4",
            "oflag=direct",
            "status=none",
        ],
    );
    c.create_snapshot(CreateSnapshotRequest {
        name: "m-snap".into(),
        source_volume_id: a.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// The pool and volume gauges of scrape `m` against what `lvs` (run here,
/// not by the driver) reports for `vg`; the pool's report.
#[track_caller]
fn assert_pool_metrics(m: &BTreeMap<String, f64>, vg: &str) -> thinpool_csi::lvm::report::Lv {
    let report = lvs(vg);
    let pool = report.find("pool").expect("the thin pool");
    assert_eq!(sample(m, "thinpool_csi_pool_up{class=\"default\"}"), 1.0);
    assert_eq!(
        sample(m, "thinpool_csi_pool_usable{class=\"default\"}"),
        1.0
    );
    assert_eq!(
        sample(m, "thinpool_csi_pool_size_bytes{class=\"default\"}"),
        pool.size as f64
    );
    let data = pool.data_percent.expect("Data% of an active pool");
    assert!(data > 0.0, "4 MiB were written to the pool");
    assert_eq!(
        sample(m, "thinpool_csi_pool_data_percent{class=\"default\"}"),
        data
    );
    assert_eq!(
        sample(m, "thinpool_csi_pool_metadata_percent{class=\"default\"}"),
        pool.metadata_percent.expect("Metadata% of an active pool")
    );
    // Both metadata stores, and how many LVs each still takes.
    assert!(pool.metadata_size > 0 && pool.vg_mda_size > 0, "{pool:?}");
    assert_eq!(
        sample(
            m,
            "thinpool_csi_pool_metadata_size_bytes{class=\"default\"}"
        ),
        pool.metadata_size as f64
    );
    assert_eq!(
        sample(
            m,
            "thinpool_csi_vg_metadata_area_size_bytes{class=\"default\"}"
        ),
        pool.vg_mda_size as f64
    );
    let mda_free = sample(
        m,
        "thinpool_csi_vg_metadata_area_free_bytes{class=\"default\"}",
    );
    assert!(mda_free > 0.0 && mda_free < pool.vg_mda_size as f64 / 2.0);
    for store in ["pool", "vg"] {
        let left = sample(
            m,
            &format!("thinpool_csi_metadata_lvs_left{{class=\"default\",store=\"{store}\"}}"),
        );
        assert!(left > 100.0, "{store}: {left} LVs left");
    }
    let volumes = report.lvs.iter().filter(|lv| lv.name.starts_with("csi-"));
    let snapshots = report.lvs.iter().filter(|lv| lv.name.starts_with("snap-"));
    assert_eq!(
        sample(m, "thinpool_csi_volumes{class=\"default\"}"),
        volumes.clone().count() as f64
    );
    assert_eq!(sample(m, "thinpool_csi_volumes{class=\"default\"}"), 2.0);
    assert_eq!(
        sample(m, "thinpool_csi_snapshots{class=\"default\"}"),
        snapshots.clone().count() as f64
    );
    assert_eq!(sample(m, "thinpool_csi_snapshots{class=\"default\"}"), 1.0);
    let virtual_sum = volumes.chain(snapshots).map(|lv| lv.size).sum();
    let cap = Capacity::compute(pool.size, pool.data_percent.unwrap(), 4.0, virtual_sum);
    assert_eq!(
        sample(
            m,
            "thinpool_csi_pool_overprovisioned_free_bytes{class=\"default\"}"
        ),
        cap.virtual_headroom as f64
    );
    assert_eq!(
        sample(
            m,
            "thinpool_csi_pool_physical_free_bytes{class=\"default\"}"
        ),
        cap.physical_free as f64
    );
    pool.clone()
}

/// One log line per call, with its method, id and code: the one
/// ControllerGetVolume of `missing`, and the two CreateVolume.
#[track_caller]
fn assert_one_log_line_per_call(d: &TestDriver, missing: &str) {
    let log = d.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("thinpool_csi::rpc") && l.contains("method=\"ControllerGetVolume\""))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    for part in [
        format!("volume_id=\"{missing}\""),
        "code=\"NOT_FOUND\"".to_string(),
        "duration_ms=".to_string(),
    ] {
        assert!(lines[0].contains(&part), "{part} missing in {}", lines[0]);
    }
    let creates = log
        .lines()
        .filter(|l| {
            l.contains("thinpool_csi::rpc")
                && l.contains("method=\"CreateVolume\"")
                && l.contains("code=\"OK\"")
        })
        .count();
    assert_eq!(creates, 2);
}

/// `tpcsi capacity` shows both metadata stores of `pool` from the metrics
/// endpoint at `addr`.
#[track_caller]
fn assert_tpcsi_capacity_shows_metadata(
    d: &TestDriver,
    addr: &str,
    pool: &thinpool_csi::lvm::report::Lv,
) {
    let out = crate::fixtures::tpcsi(d, &["--json", "--metrics-address", addr, "capacity"]);
    assert!(out.status.success(), "tpcsi capacity: {out:?}");
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every class the driver serves; this one has only the default.
    let cap = &all["device_classes"][0];
    assert_eq!(cap["device_class"], "default", "{all}");
    let md = &cap["metadata"];
    assert_eq!(md["pool_metadata_size"], pool.metadata_size, "{cap}");
    assert_eq!(md["vg_metadata_area_size"], pool.vg_mda_size, "{cap}");
    assert!(
        md["pool_lvs_left"].as_u64().is_some_and(|n| n > 100),
        "{cap}"
    );
    assert!(md["vg_lvs_left"].as_u64().is_some_and(|n| n > 100), "{cap}");
}

#[tokio::test]
async fn metrics_match_lvs_and_an_unchanged_pool_costs_no_lvm_command() {
    // Every LVM command the driver runs goes through this wrapper, which
    // writes a line per call.
    let tools = tempfile::tempdir().unwrap();
    let (wrapper, calls) = counting_lvm(tools.path());
    let addr = metrics_address();
    // A short cache lifetime: the scrapes below come after it passed, so
    // the first reads LVM afresh and the second must not.
    let max_age = 3;
    let d = TestDriver::start(
        "metrics",
        128 * MIB,
        &format!(
            "metrics_address = \"{addr}\"\nlvm_binary = \"{}\"\nreport_max_age_secs = {max_age}",
            wrapper.display()
        ),
    )
    .await;
    assert!(lvm_calls(&calls) > 0, "the driver does not use the wrapper");
    let mut c = d.controller().await;

    volumes_and_a_snapshot(&d, &mut c).await;
    let before = scrape(&addr).await;
    assert_eq!(sample(&before, &rpc("requests_total", "CreateVolume")), 2.0);
    assert_eq!(
        sample(&before, &rpc("requests_total", "CreateSnapshot")),
        1.0
    );
    assert!(!before
        .keys()
        .any(|k| k.starts_with("thinpool_csi_rpc_errors_total")));

    // One NOT_FOUND.
    let missing = thinpool_csi::naming::lv_name_for("m-missing");
    let e = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: missing.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Nothing changes from here on. Let the cached report age out, then
    // scrape twice in a row.
    tokio::time::sleep(Duration::from_secs(max_age + 1)).await;
    let n0 = lvm_calls(&calls);
    let first = scrape(&addr).await;
    // The aged report is served at once, and one `lvs` catches up in the
    // background: it reaches the wrapper's log when the driver sends it
    // (after a shell's start-up check if a new shell runs it), which can
    // be after the scrape answered. Wait for it (up to 10 s; none at all
    // passes too).
    for _ in 0..100 {
        if lvm_calls(&calls) > n0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let n1 = lvm_calls(&calls);
    // Whether that `lvs` still runs or has ended, the second scrape
    // starts none: one runs already, or the report is fresh.
    let second = scrape(&addr).await;
    let n2 = lvm_calls(&calls);
    assert!(
        n1 - n0 <= 1,
        "a scrape of an aged cache runs one lvs at most, ran {}",
        n1 - n0
    );
    assert_eq!(
        n2,
        n1,
        "a second scrape of an unchanged pool ran LVM: {:?}",
        file_lines(&calls)
            .iter()
            .filter(|l| *l != "version")
            .skip(n1)
            .collect::<Vec<_>>()
    );
    assert_eq!(first, second, "two scrapes with nothing in between differ");

    // The counters moved by exactly the calls made.
    let m = second;
    let not_found = "thinpool_csi_rpc_errors_total{service=\"csi.v1.Controller\",\
                     method=\"ControllerGetVolume\",code=\"NOT_FOUND\"}";
    assert_eq!(sample(&m, not_found), 1.0);
    assert_eq!(
        sample(&m, &rpc("requests_total", "ControllerGetVolume")),
        1.0
    );
    assert_eq!(sample(&m, &rpc("requests_total", "CreateVolume")), 2.0);
    assert_eq!(
        sample(&m, &rpc("duration_seconds_count", "CreateVolume")),
        2.0
    );
    let errors: Vec<&String> = m
        .keys()
        .filter(|k| k.starts_with("thinpool_csi_rpc_errors_total"))
        .collect();
    assert_eq!(errors, vec![not_found], "no other call failed");
    let probe = "thinpool_csi_rpc_requests_total{service=\"csi.v1.Identity\",method=\"Probe\"}";
    assert!(sample(&m, probe) >= 1.0, "the harness's Probe is counted");

    // The pool and its contents, as `lvs` (run here, not by the driver)
    // reports them.
    let pool = assert_pool_metrics(&m, &d.vg);

    // One log line per call, with its method, id and code.
    assert_one_log_line_per_call(&d, &missing);
    // `tpcsi capacity` shows both metadata stores from this endpoint.
    assert_tpcsi_capacity_shows_metadata(&d, &addr, &pool);
    eprintln!(
        "metrics: pool {} bytes, Data% {}, Metadata% {}, 2 volumes, 1 snapshot; \
         LVM calls by the two scrapes: {} and {}",
        pool.size,
        pool.data_percent.unwrap(),
        pool.metadata_percent.unwrap(),
        n1 - n0,
        n2 - n1
    );
}
