//! The `tpcsi` client against the real driver: one volume's whole life
//! driven through the CLI binary (with `--json` answers parsed and checked
//! against LVM and the mount table), and errors carrying their gRPC code
//! and exit status.

use std::path::Path;

use serde_json::Value;
use thinpool_csi::mountinfo::MountInfo;

use crate::fixtures::{create, mount_cap, s, tpcsi, Kubelet};
use crate::harness::{lvs, sh, TestDriver, DRIVER_NAME, MIB, NODE_ID};

/// `tpcsi --json ARGS`, which must succeed; its answer parsed.
fn json(d: &TestDriver, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = tpcsi(d, &all);
    assert!(
        out.status.success(),
        "tpcsi {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "tpcsi {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `tpcsi ARGS` (a table), which must succeed; its stdout.
fn table(d: &TestDriver, args: &[&str]) -> String {
    let out = tpcsi(d, args);
    assert!(out.status.success(), "tpcsi {args:?}: {}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn mounted(p: &Path) -> bool {
    MountInfo::read()
        .unwrap()
        .mounts()
        .iter()
        .any(|m| m.mount_point == p)
}

fn bytes_usage(stats: &Value) -> &Value {
    stats["usage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["unit"] == "bytes")
        .unwrap_or_else(|| panic!("no bytes usage in {stats}"))
}

/// `tpcsi probe`, `info` and `capacity` answer for both sockets, the
/// plugin and the pool.
#[tokio::test(flavor = "multi_thread")]
async fn cli_probe_info_and_capacity() {
    let d = TestDriver::start("clinfo", 256 * MIB, "").await;
    // Probe and plugin info, on both sockets.
    let probe = json(&d, &["probe"]);
    let services = probe["services"].as_array().unwrap();
    assert_eq!(services.len(), 2, "{probe}");
    assert_eq!(services[0]["service"], "csi");
    assert_eq!(services[0]["endpoint"], d.uri().as_str());
    assert_eq!(services[1]["service"], "csi-addons");
    assert!(services.iter().all(|s| s["ready"] == true), "{probe}");
    assert_eq!(probe["pool"]["takes_new_volumes"], true, "{probe}");
    assert!(u(&probe["pool"]["available_capacity"]) > 0, "{probe}");
    let t = table(&d, &["probe"]);
    assert!(
        t.contains("csi-addons") && t.contains("pool: takes new volumes"),
        "{t}"
    );
    let info = json(&d, &["info"]);
    assert_eq!(info["name"], DRIVER_NAME);
    assert_eq!(info["node_id"], NODE_ID);
    assert_eq!(info["manifest"]["volume_group"], d.vg.as_str());
    let has = |list: &Value, name: &str| list.as_array().unwrap().iter().any(|c| c == name);
    assert!(has(
        &info["controller_capabilities"],
        "CREATE_DELETE_VOLUME"
    ));
    assert!(has(&info["node_capabilities"], "STAGE_UNSTAGE_VOLUME"));
    assert!(has(&info["addons"]["capabilities"], "RECLAIM_SPACE_ONLINE"));

    // Capacity: room for what follows.
    let all = json(&d, &["capacity"]);
    assert_eq!(all["default_device_class"], "default", "{all}");
    let cap = &all["device_classes"][0];
    assert_eq!(cap["device_class"], "default", "{all}");
    assert!(u(&cap["available_capacity"]) >= 128 * MIB, "{cap}");
    assert!(u(&cap["maximum_volume_size"]) >= u(&cap["available_capacity"]));
}

/// One volume's life through `tpcsi`: create, list, expand (before
/// staging and published), stage, publish, stats, node reclaim, heal,
/// unpublish, unstage, controller reclaim, delete.
#[tokio::test(flavor = "multi_thread")]
async fn cli_drives_a_volume_lifecycle() {
    let k = Kubelet::new("cli");
    let d = TestDriver::start("cli", 256 * MIB, &k.extra()).await;

    // Create, and find it in the list (JSON and table) and in LVM.
    let v = json(&d, &["create", "pvc-cli", "--size", "64Mi", "--fs", "ext4"]);
    let id = v["volume_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("csi-pvc-cli-"), "{v}");
    assert_eq!(u(&v["capacity_bytes"]), 64 * MIB);
    assert_eq!(v["access_type"], "mount");
    assert_eq!(v["fs_type"], "ext4");
    assert_eq!(lvs(&d.vg).find(&id).unwrap().size, 64 * MIB);
    let list = json(&d, &["list"]);
    let listed: Vec<&Value> = list["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["volume_id"] == id.as_str())
        .collect();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(listed[0]["condition"]["abnormal"], false);
    let t = table(&d, &["list"]);
    assert!(
        t.starts_with("VOLUME ID") && t.contains(&id) && t.contains("64 MiB"),
        "{t}"
    );

    // Expand before staging: the filesystem is made at the new size.
    let e = json(&d, &["expand", &id, "--size", "96Mi"]);
    assert_eq!(u(&e["capacity_bytes"]), 96 * MIB);
    assert_eq!(lvs(&d.vg).find(&id).unwrap().size, 96 * MIB);
    assert!(e["node_capacity_bytes"].is_null());

    // Stage (the access type comes from the volume) and publish.
    let staging = k.staging("cli");
    let target = k.target("cli");
    let st = json(&d, &["stage", &id, &s(&staging)]);
    assert_eq!(st["action"], "staged");
    assert_eq!(st["volume_id"], id.as_str());
    assert!(mounted(&staging));
    let p = json(
        &d,
        &["publish", &id, &s(&target), "--staging", &s(&staging)],
    );
    assert_eq!(p["action"], "published");
    assert!(mounted(&target));

    // Write through the published path.
    std::fs::write(target.join("kept"), b"written through tpcsi publish").unwrap();
    sh(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", target.join("scratch").display()),
            "bs=1M",
            "count=24",
            "conv=fsync",
            "status=none",
        ],
    );
    let stats = json(&d, &["stats", &id, &s(&target), "--staging", &s(&staging)]);
    let b = bytes_usage(&stats);
    assert!(
        u(&b["total"]) > 80 * MIB && u(&b["total"]) <= 96 * MIB,
        "{stats}"
    );
    assert!(u(&b["used"]) >= 24 * MIB, "{stats}");
    assert_eq!(stats["condition"]["abnormal"], false, "{stats}");
    let total_before = u(&b["total"]);

    // Expand a published volume: the filesystem grows on the node too.
    let e = json(
        &d,
        &[
            "expand",
            &id,
            "--size",
            "128Mi",
            "--path",
            &s(&target),
            "--staging",
            &s(&staging),
        ],
    );
    assert_eq!(u(&e["capacity_bytes"]), 128 * MIB, "{e}");
    if e["node_expansion_required"] == true {
        assert_eq!(u(&e["node_capacity_bytes"]), 128 * MIB, "{e}");
    }
    let stats = json(&d, &["stats", &id, &s(&target)]);
    let total_after = u(&bytes_usage(&stats)["total"]);
    assert!(
        total_after >= total_before + 24 * MIB,
        "{total_before} -> {total_after}"
    );

    // Reclaim on the node after a delete: the pool gets the blocks back.
    std::fs::remove_file(target.join("scratch")).unwrap();
    sh("sync", &[]);
    cli_node_reclaim_gives_blocks_back(&d, &id, &target, &staging);
    cli_heal_rebinds_a_vanished_publish(&d, &id, &target, &staging);

    // Unpublish and unstage.
    let up = json(&d, &["unpublish", &id, &s(&target)]);
    assert_eq!(up["action"], "unpublished");
    assert!(!mounted(&target));
    let us = json(&d, &["unstage", &id, &s(&staging)]);
    assert_eq!(us["action"], "unstaged");
    assert!(!mounted(&staging));

    // Controller-side reclaim of the unused volume.
    let r = json(&d, &["reclaim", &id]);
    assert_eq!(r["side"], "controller", "{r}");
    assert!(
        r["pre_usage_bytes"].is_u64() && r["post_usage_bytes"].is_u64(),
        "{r}"
    );

    // Delete: gone from the list and from LVM.
    let del = json(&d, &["delete", &id]);
    assert_eq!(del["action"], "deleted");
    assert!(lvs(&d.vg).find(&id).is_none());
    assert_eq!(json(&d, &["list"])["volumes"], serde_json::json!([]));
    assert_eq!(table(&d, &["list"]), "no volumes\n");
}

/// `tpcsi reclaim --node` of a published volume whose files were
/// deleted: the reclaimed bytes, as lvs sees them, and the progress line.
fn cli_node_reclaim_gives_blocks_back(d: &TestDriver, id: &str, target: &Path, staging: &Path) {
    let out = tpcsi(
        d,
        &[
            "--json",
            "--progress",
            "reclaim",
            id,
            "--node",
            "--path",
            &s(target),
            "--staging",
            &s(staging),
        ],
    );
    assert!(out.status.success());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["side"], "node");
    assert!(u(&r["reclaimed_bytes"]) >= 20 * MIB, "{r}");
    assert_eq!(
        u(&r["reclaimed_bytes"]),
        u(&r["pre_usage_bytes"]) - u(&r["post_usage_bytes"])
    );
    // lvs read after the reclaim: the filesystem may have written since
    // (a journal commit touches a few chunks), never given back more.
    let lv_used = lvs(&d.vg).find(id).unwrap().allocated_bytes().unwrap();
    let post = u(&r["post_usage_bytes"]);
    assert!(
        lv_used + 64 * 1024 >= post && lv_used <= post + 4 * MIB,
        "lvs {lv_used} vs {r}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("reclaiming space of {id}: done in")),
        "progress: {err}"
    );
}

/// `tpcsi heal`: normal while all is there; once the publish mount
/// vanishes behind the driver's back, abnormal, and the mount re-bound.
fn cli_heal_rebinds_a_vanished_publish(d: &TestDriver, id: &str, target: &Path, staging: &Path) {
    let heal = || {
        json(
            d,
            &["heal", id, "--path", &s(target), "--staging", &s(staging)],
        )
    };
    let h = heal();
    assert_eq!(h["abnormal"], false, "{h}");
    sh("umount", &[&s(target)]);
    assert!(!target.join("kept").exists());
    let h = heal();
    assert_eq!(h["abnormal"], true, "{h}");
    assert!(h["message"].as_str().unwrap().contains("re-bound"), "{h}");
    assert_eq!(
        std::fs::read(target.join("kept")).unwrap(),
        b"written through tpcsi publish"
    );
}

/// `tpcsi snapshot create`, `list` and `delete` of a volume's snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn cli_snapshots_create_list_and_delete() {
    let d = TestDriver::start("clisnap", 256 * MIB, "").await;
    let id = create(&d, "pvc-cli", 128 * MIB, mount_cap("ext4")).await;
    // Snapshots.
    let snap = json(&d, &["snapshot", "create", "snap-cli", "--volume", &id]);
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    assert!(snap_id.starts_with("snap-"), "{snap}");
    assert_eq!(snap["source_volume_id"], id.as_str());
    assert_eq!(snap["ready_to_use"], true);
    assert_eq!(u(&snap["size_bytes"]), 128 * MIB);
    assert!(
        snap["creation_time"].as_str().unwrap().ends_with('Z'),
        "{snap}"
    );
    assert!(lvs(&d.vg).find(&snap_id).is_some());
    let snaps = json(&d, &["snapshot", "list", "--volume", &id]);
    let ids: Vec<&str> = snaps["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![snap_id.as_str()]);
    assert!(table(&d, &["snapshot", "list"]).contains(&snap_id));
    let sd = json(&d, &["snapshot", "delete", &snap_id]);
    assert_eq!(sd["action"], "deleted");
    assert!(lvs(&d.vg).find(&snap_id).is_none());
    assert_eq!(
        json(&d, &["snapshot", "list"])["snapshots"],
        serde_json::json!([])
    );
}

/// Errors: the gRPC code in the output, and 10 + the code as exit status.
#[tokio::test(flavor = "multi_thread")]
async fn cli_errors_carry_the_grpc_code_and_exit_status() {
    let k = Kubelet::new("clierr");
    let d = TestDriver::start("clierr", 256 * MIB, &k.extra()).await;
    let target = k.target("cli");
    // Errors: the gRPC code in the output, and 10 + the code as exit status.
    let missing = "csi-missing-0123456789abcdef";
    let out = tpcsi(&d, &["expand", missing, "--size", "1Gi"]);
    assert_eq!(out.status.code(), Some(15), "NOT_FOUND is 5");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NOT_FOUND (5)"), "{err}");
    let out = tpcsi(&d, &["--json", "stats", missing, &s(&target)]);
    assert_eq!(out.status.code(), Some(15));
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["code"], "NOT_FOUND", "{e}");
    assert_eq!(e["error"]["exit_status"], 15);
    let out = tpcsi(&d, &["--json", "create", "too-big", "--size", "64Gi"]);
    assert!(!out.status.success());
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["code"], "RESOURCE_EXHAUSTED", "{e}");
    assert_eq!(out.status.code(), Some(18));
}

/// The pod's readiness (`tpcsi probe`) fails while the pool is missing,
/// with GetCapacity's reason and code, while Probe on both sockets stays
/// ready (the liveness probe must not restart a driver that still has to
/// unstage volumes, and sidecars must not exit); it passes again once the
/// pool is back.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_fails_while_the_pool_is_missing_and_probe_stays_ready() {
    let d = TestDriver::start("rdy", 64 * MIB, "").await;
    assert!(tpcsi(&d, &["probe"]).status.success());
    let (here, away) = (format!("{}/pool", d.vg), format!("{}/away", d.vg));
    sh("lvrename", &[&here, &away]);

    let out = tpcsi(&d, &["probe"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 10 + UNAVAILABLE (14): GetCapacity's code, kept.
    assert_eq!(out.status.code(), Some(24), "tpcsi probe: {stderr}");
    assert!(
        stderr.contains("takes no new volume") && stderr.contains(&here),
        "the reason names the missing pool: {stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("pool: takes no new volume"),
        "the table says it too"
    );
    let ready = d
        .identity()
        .await
        .probe(thinpool_csi::proto::csi::v1::ProbeRequest {})
        .await
        .expect("Probe answers while the pool is missing")
        .into_inner()
        .ready;
    assert_eq!(ready, Some(true), "Probe stays ready");
    let addons = json_of_failed(&d, &["probe"]);
    assert!(
        addons["services"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["ready"] == true),
        "both sockets' Probe stay ready: {addons}"
    );
    assert_eq!(addons["pool"]["takes_new_volumes"], false, "{addons}");

    sh("lvrename", &[&away, &here]);
    let out = tpcsi(&d, &["probe"]);
    assert!(
        out.status.success(),
        "ready again once the pool is back: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `tpcsi --json ARGS`, which must fail; the answer it printed first.
fn json_of_failed(d: &TestDriver, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = tpcsi(d, &all);
    assert!(!out.status.success(), "tpcsi {args:?} succeeded");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("tpcsi {args:?} printed no JSON answer: {text}"))
}
