//! Issue 22's scale phase (`scripts/bench.sh scale`; not in CI): one
//! loop-backed pool the driver builds, filled step by step with volumes
//! (and a snapshot for every fifth), and at each step the figures a dense
//! node lives by, each against the bare LVM command in the same run:
//!
//! - CreateVolume p50 of serial creates, and a bare `lvcreate` p50 (as an
//!   operator types it, with the node's LVM config; and like for like, no
//!   metadata archive, shown only), with the same tags;
//! - GetCapacity, a full ListVolumes (every page), and a restart's time to
//!   ready (until Probe answers and GetCapacity has a report);
//! - the VG metadata area and the pool's metadata in use.
//!
//! Judged: no call fails; CreateVolume p50 at the last step within 2× of
//! its p50 at 100 volumes; the driver's p50 no more than the bare
//! `lvcreate`'s at each step; restart to ready within 10 s at the last step.
//! A missed limit prints `MISSED: ...` and the bench exits 1.
//!
//! Knobs: `TPCSI_SCALE_MAX` (volumes at the last step, default 10000),
//! `TPCSI_SCALE_STEP` (default 2000), `TPCSI_SCALE_SAMPLES` (timed creates
//! per step and side, default 20).

#[path = "../tests/lvm/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;
#[path = "../tests/lvm/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::collections::HashMap;
use std::time::Instant;

use fixtures::block_cap;
use harness::{TestDriver, MIB};
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;

const FILL_CLIENTS: usize = 8;
const VOLUME: u64 = 4 * MIB;

fn knob(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(s) => s
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{name} must be a positive whole number, not {s:?}")),
    }
}

/// A create as external-provisioner sends it: a PV name, and the PVC and
/// PV names (`--extra-create-metadata`).
fn create_req(i: usize) -> CreateVolumeRequest {
    let name = format!("pvc-{i:08x}-4b5a-6978-8796-a5b4c3d2e1f0");
    let params: HashMap<String, String> = [
        ("csi.storage.k8s.io/pvc/name", format!("data-{i}")),
        ("csi.storage.k8s.io/pvc/namespace", "default".to_string()),
        ("csi.storage.k8s.io/pv/name", name.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    CreateVolumeRequest {
        name,
        capacity_range: Some(CapacityRange {
            required_bytes: VOLUME as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![block_cap()],
        parameters: params,
        ..Default::default()
    }
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// A bare `lvcreate` of a thin LV shaped like the driver's (same size,
/// inactive, tags of the same length); `extra` adds `--config` text.
fn bare_lvcreate(vg: &str, name: &str, tags: &[String], extra: Option<&str>) -> f64 {
    let mut args: Vec<String> = ["lvcreate", "--type", "thin", "--virtualsize"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend([
        format!("{VOLUME}b"),
        "--thinpool".into(),
        format!("{vg}/pool"),
        "--name".into(),
        name.into(),
        "--activate".into(),
        "n".into(),
        "--yes".into(),
    ]);
    for t in tags {
        args.extend(["--addtag".to_string(), t.clone()]);
    }
    if let Some(c) = extra {
        args.extend(["--config".to_string(), c.to_string()]);
    }
    args.push(vg.into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    harness::bare("lvm", &args)
}

/// Volume `i`'s CreateVolume, which must succeed; its id.
async fn create(c: &mut ControllerClient<Channel>, i: usize) -> String {
    c.create_volume(create_req(i))
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {i}: {e:?}"))
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

/// Creates volumes `from..to` over the clients concurrently, and a
/// snapshot of every fifth; panics on any failure.
async fn fill(cs: &[ControllerClient<Channel>], from: usize, to: usize, ids: &mut Vec<String>) {
    let mut next = from;
    while next < to {
        let batch: Vec<usize> = (next..to.min(next + 64)).collect();
        next += batch.len();
        let tasks: Vec<_> = batch
            .into_iter()
            .map(|i| {
                let mut c = cs[i % cs.len()].clone();
                tokio::spawn(async move {
                    let id = create(&mut c, i).await;
                    if i % 5 == 4 {
                        c.create_snapshot(CreateSnapshotRequest {
                            source_volume_id: id.clone(),
                            name: format!("snapshot-{i:08x}-4b5a-6978-8796-a5b4c3d2e1f0"),
                            ..Default::default()
                        })
                        .await
                        .unwrap_or_else(|e| panic!("CreateSnapshot {i}: {e:?}"));
                    }
                    id
                })
            })
            .collect();
        for t in tasks {
            ids.push(t.await.unwrap());
        }
    }
}

struct Step {
    volumes: usize,
    lvs: usize,
    create: f64,
    bare: f64,
    bare_no_archive: f64,
    capacity: f64,
    list: f64,
    restart: f64,
    mda: String,
    meta: String,
}

#[tokio::main]
async fn main() {
    harness::require_lvm();
    let max = knob("TPCSI_SCALE_MAX", 10_000);
    let step = knob("TPCSI_SCALE_STEP", 2_000);
    let samples = knob("TPCSI_SCALE_SAMPLES", 20);
    let mut marks = vec![100.min(max)];
    marks.extend(
        (1..)
            .map(|k| k * step)
            .take_while(|m| *m < max)
            .filter(|m| *m > 100),
    );
    if *marks.last().unwrap() != max {
        marks.push(max);
    }
    // A 16 GiB sparse file: only metadata is ever written. The pool takes
    // 80 % of it, overprovisioned 400 times so capacity is never the limit.
    let mut d = TestDriver::start_with_loop_keys(
        "scale",
        16 << 30,
        "overprovision_ratio = 400\nreport_max_age_secs = 10\n",
        &format!("max_lvs = {}\n", max + max / 5 + 2 * samples),
        &[],
    )
    .await;
    let vg = d.vg.clone();
    let mut cs = Vec::new();
    for _ in 0..FILL_CLIENTS {
        cs.push(d.controller().await);
    }
    let mut ids = Vec::new();
    let mut made = 0;
    let mut rows = Vec::new();
    let mut bare_n = 0;
    for &mark in &marks {
        fill(&cs, made, mark - samples, &mut ids).await;
        made = mark - samples;
        // Serial creates through the driver, and bare ones, in turn.
        let (mut ours, mut bare, mut bare_na) = (Vec::new(), Vec::new(), Vec::new());
        let tags = {
            let r = harness::lvs(&vg);
            let lv = r.find(ids.last().unwrap()).expect("a volume").clone();
            lv.tags
        };
        let mut c = cs[0].clone();
        for _ in 0..samples {
            let t = Instant::now();
            let id = create(&mut c, made).await;
            ours.push(t.elapsed().as_secs_f64());
            ids.push(id);
            made += 1;
            bare.push(bare_lvcreate(&vg, &format!("bare-{bare_n}"), &tags, None));
            bare_na.push(bare_lvcreate(
                &vg,
                &format!("bare-{}", bare_n + 1),
                &tags,
                Some("backup { archive = 0 }"),
            ));
            for n in [bare_n, bare_n + 1] {
                harness::lvm(&["lvremove", "--yes", &format!("{vg}/bare-{n}")]);
            }
            bare_n += 2;
        }
        let mut caps = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            c.get_capacity(GetCapacityRequest::default()).await.unwrap();
            caps.push(t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let (mut listed, mut token) = (0, String::new());
        loop {
            let r = c
                .list_volumes(ListVolumesRequest {
                    max_entries: 500,
                    starting_token: token,
                })
                .await
                .unwrap()
                .into_inner();
            listed += r.entries.len();
            token = r.next_token;
            if token.is_empty() {
                break;
            }
        }
        let list = t.elapsed().as_secs_f64();
        assert_eq!(listed, made, "ListVolumes lists every volume");
        let t = Instant::now();
        d.restart().await;
        let mut c2 = d.controller().await;
        c2.get_capacity(GetCapacityRequest::default())
            .await
            .expect("GetCapacity after the restart");
        let restart = t.elapsed().as_secs_f64();
        cs = Vec::new();
        for _ in 0..FILL_CLIENTS {
            cs.push(d.controller().await);
        }
        let r = harness::lvs(&vg);
        let pool = r.find("pool").unwrap();
        let row = Step {
            volumes: made,
            lvs: r.lvs.len(),
            create: p50(&mut ours),
            bare: p50(&mut bare),
            bare_no_archive: p50(&mut bare_na),
            capacity: p50(&mut caps),
            list,
            restart,
            mda: format!("{} of {} B free", pool.vg_mda_free, pool.vg_mda_size / 2),
            meta: format!(
                "{:.2} % of {} MiB",
                pool.metadata_percent.unwrap_or(0.0),
                pool.metadata_size / MIB
            ),
        };
        eprintln!(
            "scale: {} volumes ({} LVs): CreateVolume p50 {:.3} s, bare {:.3} s",
            row.volumes, row.lvs, row.create, row.bare
        );
        rows.push(row);
    }

    println!("| volumes | LVs | CreateVolume p50 | bare lvcreate p50 | ratio | bare, no archive | GetCapacity | ListVolumes (all) | restart to ready | VG metadata area | pool metadata |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.3} s | {:.3} s | {:.2} | {:.3} s | {:.4} s | {:.3} s | {:.2} s | {} | {} |",
            r.volumes,
            r.lvs,
            r.create,
            r.bare,
            r.create / r.bare,
            r.bare_no_archive,
            r.capacity,
            r.list,
            r.restart,
            r.mda,
            r.meta
        );
    }
    let mut missed = Vec::new();
    let first = &rows[0];
    let last = rows.last().unwrap();
    if last.create > 2.0 * first.create {
        missed.push(format!(
            "CreateVolume p50 at {} volumes: {:.3} s > 2 × {:.3} s (at {})",
            last.volumes, last.create, first.create, first.volumes
        ));
    }
    for r in &rows {
        if r.create > r.bare {
            missed.push(format!(
                "CreateVolume / bare lvcreate at {} volumes: {:.2} > 1.0",
                r.volumes,
                r.create / r.bare
            ));
        }
    }
    if last.restart > 10.0 {
        missed.push(format!(
            "restart to ready at {} volumes: {:.2} s > 10 s",
            last.volumes, last.restart
        ));
    }
    println!();
    if missed.is_empty() {
        println!("scale: every limit met.");
    } else {
        for m in &missed {
            println!("MISSED: {m}");
        }
    }
    drop(d);
    if !missed.is_empty() {
        std::process::exit(1);
    }
}
