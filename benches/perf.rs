//! The performance benchmark of issue 10: every call of the driver against
//! the bare LVM command (or commands) that does the same job, measured in
//! the same run on the same VG, printed as one table of p50, p95 and their
//! ratios. Run it in the VM with `scripts/bench.sh`. It is not a test: it
//! asserts only that the calls work, that capacity stays exact under
//! concurrency, and that its counts are what it reports.

#[path = "../tests/lvm/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::{TestDriver, MIB};
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;

/// How many samples each serial figure takes: `TPCSI_BENCH_SAMPLES`, else
/// 40 (the p95 of 40 is their third largest).
fn samples() -> usize {
    match std::env::var("TPCSI_BENCH_SAMPLES") {
        Err(_) => 40,
        Ok(s) => match s.parse() {
            Ok(n) if n >= 2 => n,
            _ => panic!("TPCSI_BENCH_SAMPLES must be a whole number of at least 2, not {s:?}"),
        },
    }
}
/// Untimed rounds of P1 before its samples.
const WARM_UP: usize = 10;
/// Where the bare names of P1's untimed rounds start (`bare{i}`), past any
/// sample's.
const WARM_UP_NAMES: usize = 1_000_000;
/// Rounds of the 32-client figure.
const ROUNDS: usize = 3;
const CLIENTS: usize = 32;
/// Volumes in the VG for the listing figures.
const MANY: usize = 500;

fn cap(block: bool, fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            })
        }),
    }
}

fn create_req(name: &str, bytes: u64, c: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![c],
        ..Default::default()
    }
}

fn del(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: HashMap::new(),
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A bare `lvm lvcreate -V SIZE --thinpool POOL -n NAME` plus `extra`,
/// timed.
fn bare_lvcreate(size: &str, pool: &str, name: &str, extra: &[&str]) -> f64 {
    let mut args = vec!["lvcreate", "-V", size, "--thinpool", pool, "-n", name];
    args.extend_from_slice(extra);
    bare("lvm", &args)
}

/// Runs a bare command as an operator would (no extra LVM settings unless
/// `args` give them) and returns its wall time; panics when it fails.
fn bare(cmd: &str, args: &[&str]) -> f64 {
    let t = Instant::now();
    let out = Command::new(cmd)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let took = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

struct Row {
    target: &'static str,
    what: String,
    ours: Vec<f64>,
    bare: Vec<f64>,
    limit: f64,
}

struct Table(Vec<Row>);

impl Table {
    fn add(
        &mut self,
        target: &'static str,
        what: &str,
        ours: Vec<f64>,
        bare: Vec<f64>,
        limit: f64,
    ) {
        self.0.push(Row {
            target,
            what: what.into(),
            ours,
            bare,
            limit,
        });
    }

    fn print(&self, notes: &[String]) {
        println!();
        println!(
            "| target | what | ours p50 | ours p95 | bare p50 | bare p95 | ratio p50 | ratio p95 | limit | met |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let raw = std::env::var("TPCSI_BENCH_RAW").as_deref() == Ok("1");
        for r in &self.0 {
            if raw {
                let ms = |v: &[f64]| v.iter().map(|s| (s * 1000.0) as u64).collect::<Vec<_>>();
                eprintln!("{}: ours {:?} bare {:?}", r.what, ms(&r.ours), ms(&r.bare));
            }
            let (o50, o95, b50, b95) = (
                pct(&r.ours, 0.5),
                pct(&r.ours, 0.95),
                pct(&r.bare, 0.5),
                pct(&r.bare, 0.95),
            );
            let (r50, r95) = (o50 / b50, o95 / b95);
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {} | {} |",
                r.target,
                r.what,
                secs(o50),
                secs(o95),
                secs(b50),
                secs(b95),
                r50,
                r95,
                limit(r.limit),
                if r50 <= r.limit && r95 <= r.limit {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
        println!();
        for n in notes {
            println!("{n}");
        }
    }
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.3} s")
    }
}

fn limit(l: f64) -> String {
    if l < 1.0 {
        format!("1/{:.0}", 1.0 / l)
    } else {
        format!("{l}")
    }
}

/// The LVM commands the counting wrapper has logged so far.
fn calls(log: &Path) -> usize {
    harness::file_lines(log).len()
}

/// VmRSS and VmHWM of a process, in MiB.
fn rss(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap()
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// Bytes the pool has allocated, from a fresh `lvs`.
fn pool_used(vg: &str) -> f64 {
    let r = harness::lvs(vg);
    let p = r.find("pool").unwrap();
    p.size as f64 * p.data_percent.unwrap_or(0.0) / 100.0
}

async fn clients(d: &TestDriver, n: usize) -> Vec<ControllerClient<Channel>> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(d.controller().await);
    }
    v
}

/// Creates `names` over `clients` concurrently (one client per name, in
/// turn); returns the wall time and each call's outcome.
async fn create_all(
    cs: &[ControllerClient<Channel>],
    names: Vec<String>,
    bytes: u64,
) -> (f64, Vec<Result<String, tonic::Code>>) {
    let t = Instant::now();
    let tasks: Vec<_> = names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let mut c = cs[i % cs.len()].clone();
            tokio::spawn(async move {
                c.create_volume(create_req(&name, bytes, cap(true, "")))
                    .await
                    .map(|r| r.into_inner().volume.unwrap().volume_id)
                    .map_err(|e| e.code())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    (t.elapsed().as_secs_f64(), out)
}

async fn delete_all(cs: &[ControllerClient<Channel>], ids: Vec<String>) {
    let tasks: Vec<_> = ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let mut c = cs[i % cs.len()].clone();
            tokio::spawn(async move { c.delete_volume(del(&id)).await.unwrap() })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    harness::require_lvm();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let version = harness::lvm(&["version"]);
    let mut notes = vec![format!(
        "Machine: kernel {}, {}, {} CPUs; driver built with the bench profile.",
        kernel.trim(),
        version.lines().next().unwrap_or("").trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )];
    let mut table = Table(Vec::new());
    let n = samples();

    let work = tempfile::tempdir().unwrap();
    // A wrapper the driver runs as its `lvm_binary`: it logs each LVM
    // command (in a shell too), then runs the real `lvm`.
    let (wrapper, log) = harness::counting_lvm(work.path());
    let root = work.path().join("kubelet");
    std::fs::create_dir_all(&root).unwrap();
    // The deployment defaults (report cache 10 s, udev off as in a
    // container) and a generous ratio for the 500 volumes. Timed phases
    // run the real `lvm`; the phases that count LVM calls restart the
    // driver on the counting wrapper, whose own start-up would otherwise
    // be timed too.
    let mut d = TestDriver::start(
        "bench",
        1024 * MIB,
        &format!(
            "report_max_age_secs = 10\noverprovision_ratio = 50.0\nallowed_roots = [\"{}\"]\n",
            root.display()
        ),
    )
    .await;
    let vg = d.vg.clone();
    let pool = format!("{vg}/pool");
    let mut c = d.controller().await;
    let mut node = d.node().await;

    eprintln!("bench: P1");
    // P1: one CreateVolume, one DeleteVolume, against the bare command,
    // interleaved so that both see the same VG.
    let (mut create, mut create_bare, mut create_bare_an) = (vec![], vec![], vec![]);
    let (mut delete, mut delete_bare, mut delete_bare_an) = (vec![], vec![], vec![]);
    let bare_creates = |i: usize| {
        (
            bare_lvcreate("4m", &pool, &format!("bare{i}"), &[]),
            bare_lvcreate("4m", &pool, &format!("barean{i}"), &["-an"]),
        )
    };
    let bare_deletes = |i: usize| {
        let (lv, lv_an) = (format!("{vg}/bare{i}"), format!("{vg}/barean{i}"));
        (
            bare("lvm", &["lvremove", "-y", &lv]),
            bare(
                "lvm",
                &[
                    "lvremove",
                    "--config",
                    "backup { archive = 0 }",
                    "-y",
                    &lv_an,
                ],
            ),
        )
    };
    // Untimed rounds first. The first thin LV of a new pool costs LVM
    // about twice a later one (770 ms against 320 in the VM), whoever makes
    // it, and in the VM every command of either side ran slower for about
    // the first 25 s of a run.
    for i in 0..WARM_UP {
        let warm = c
            .create_volume(create_req(
                &format!("pvc-p1-warm-{i}"),
                4 * MIB,
                cap(true, ""),
            ))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        bare_creates(WARM_UP_NAMES + i);
        c.delete_volume(del(&warm.volume_id)).await.unwrap();
        bare_deletes(WARM_UP_NAMES + i);
    }
    for i in 0..n {
        // Who goes first alternates: neither side always runs right after
        // the other's command.
        let ours_first = i % 2 == 0;
        let before = (!ours_first).then(|| bare_creates(i));
        let t = Instant::now();
        let v = c
            .create_volume(create_req(&format!("pvc-p1-{i}"), 4 * MIB, cap(true, "")))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        create.push(t.elapsed().as_secs_f64());
        let (b, b_an) = before.unwrap_or_else(|| bare_creates(i));
        create_bare.push(b);
        create_bare_an.push(b_an);
        let before = (!ours_first).then(|| bare_deletes(i));
        let t = Instant::now();
        c.delete_volume(del(&v.volume_id)).await.unwrap();
        delete.push(t.elapsed().as_secs_f64());
        let (b, b_an) = before.unwrap_or_else(|| bare_deletes(i));
        delete_bare.push(b);
        delete_bare_an.push(b_an);
    }
    table.add(
        "P1",
        "CreateVolume ÷ `lvcreate -V 4m --thinpool VG/pool -n NAME`",
        create.clone(),
        create_bare,
        1.0,
    );
    table.add(
        "(info)",
        "CreateVolume ÷ the same `lvcreate` with `-an` (like for like: ours makes it inactive too)",
        create,
        create_bare_an,
        f64::INFINITY,
    );
    table.add(
        "P1",
        "DeleteVolume ÷ `lvremove -y VG/NAME` (of what the bare lvcreate made)",
        delete.clone(),
        delete_bare,
        1.0,
    );
    table.add(
        "(info)",
        "DeleteVolume ÷ `lvremove --config 'backup { archive = 0 }' -y VG/NAME` of an inactive LV (like for like)",
        delete,
        delete_bare_an,
        f64::INFINITY,
    );

    if std::env::var("TPCSI_BENCH_ONLY").as_deref() == Ok("P1") {
        // A quick look at P1 alone.
        table.print(&notes);
        return;
    }

    eprintln!("bench: P5");
    // P5: first stage of an inactive, empty volume, and its unstage,
    // against the bare commands; publish and unpublish run no LVM.
    let vol_size = 512 * MIB;
    for fs in ["ext4", "xfs"] {
        let (mut stage, mut stage_bare, mut unstage, mut unstage_bare) =
            (vec![], vec![], vec![], vec![]);
        let (mut grew, mut grew_bare) = (vec![], vec![]);
        for i in 0..n / 2 {
            let v = c
                .create_volume(create_req(
                    &format!("pvc-{fs}-{i}"),
                    vol_size,
                    cap(false, fs),
                ))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
            let staging = root.join(format!("st-{fs}-{i}"));
            let before = pool_used(&vg);
            let t = Instant::now();
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: s(&staging),
                volume_capability: Some(cap(false, fs)),
                ..Default::default()
            })
            .await
            .unwrap();
            stage.push(t.elapsed().as_secs_f64());
            grew.push(pool_used(&vg) - before);

            let t = Instant::now();
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: s(&staging),
            })
            .await
            .unwrap();
            unstage.push(t.elapsed().as_secs_f64());
            c.delete_volume(del(&v.volume_id)).await.unwrap();

            // The same by hand: an inactive thin LV, activated, formatted
            // with mkfs's defaults, mounted; then unmounted, deactivated.
            let name = format!("bare-{fs}-{i}");
            let lv = format!("{vg}/{name}");
            let dev = format!("/dev/{vg}/{name}");
            let mnt = root.join(format!("bare-{fs}-{i}"));
            std::fs::create_dir_all(&mnt).unwrap();
            bare_lvcreate("512m", &pool, &name, &["-an"]);
            let before = pool_used(&vg);
            let mkfs = format!("mkfs.{fs}");
            let t = bare("lvm", &["lvchange", "-ay", &lv])
                + bare(&mkfs, &["-q", &dev])
                + bare("mount", &[&dev, &s(&mnt)]);
            stage_bare.push(t);
            grew_bare.push(pool_used(&vg) - before);
            unstage_bare.push(bare("umount", &[&s(&mnt)]) + bare("lvm", &["lvchange", "-an", &lv]));
            bare("lvm", &["lvremove", "-y", &lv]);
        }
        let mib = |v: &[f64]| pct(v, 0.5) / MIB as f64;
        notes.push(format!(
            "Keep: staging an empty {fs} volume of {} MiB grew the pool by {:.2} MiB at p50 ({:.3} % of its size; limit 1 %); bare: {:.2} MiB.",
            vol_size / MIB,
            mib(&grew),
            pct(&grew, 0.5) / vol_size as f64 * 100.0,
            mib(&grew_bare)
        ));
        table.add(
            "P5",
            &format!(
                "first NodeStageVolume, {fs}, 512 MiB ÷ `lvchange -ay` + `mkfs.{fs}` + `mount`"
            ),
            stage,
            stage_bare,
            1.15,
        );
        table.add(
            "P5",
            &format!("NodeUnstageVolume, {fs} ÷ `umount` + `lvchange -an`"),
            unstage,
            unstage_bare,
            1.15,
        );
    }
    eprintln!("bench: Keep");
    // Keep: what staging writes to the pool, on a 10 GiB volume (mkfs.xfs
    // writes a 64 MiB log whatever the size: 12.5 % of 512 MiB).
    for fs in ["ext4", "xfs"] {
        let v = c
            .create_volume(create_req(
                &format!("pvc-keep-{fs}"),
                10 << 30,
                cap(false, fs),
            ))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let staging = root.join(format!("keep-{fs}"));
        let before = pool_used(&vg);
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: s(&staging),
            volume_capability: Some(cap(false, fs)),
            ..Default::default()
        })
        .await
        .unwrap();
        let grew = pool_used(&vg) - before;
        notes.push(format!(
            "Keep: staging an empty {fs} volume of 10 GiB grew the pool by {:.2} MiB ({:.3} % of its size; limit 1 %).",
            grew / MIB as f64,
            grew / (10u64 << 30) as f64 * 100.0
        ));
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: s(&staging),
        })
        .await
        .unwrap();
        c.delete_volume(del(&v.volume_id)).await.unwrap();
    }

    // RSS of a driver that has served, idle, before the load.
    let (idle_rss, _) = rss(d.pid());

    eprintln!("bench: P2");
    // P2: 32 clients create 32 distinct volumes at once, against 32 bare
    // lvcreates one after another.
    let cs = clients(&d, CLIENTS).await;
    let (mut conc, mut serial) = (vec![], vec![]);
    for r in 0..ROUNDS {
        let names: Vec<String> = (0..CLIENTS).map(|i| format!("pvc-p2-{r}-{i}")).collect();
        let (wall, out) = create_all(&cs, names, 4 * MIB).await;
        let ids: Vec<String> = out.into_iter().map(|r| r.unwrap()).collect();
        conc.push(wall);
        let t = Instant::now();
        for i in 0..CLIENTS {
            bare_lvcreate("4m", &pool, &format!("bare-p2-{r}-{i}"), &[]);
        }
        serial.push(t.elapsed().as_secs_f64());
        delete_all(&cs, ids).await;
        for i in 0..CLIENTS {
            bare("lvm", &["lvremove", "-y", &format!("{vg}/bare-p2-{r}-{i}")]);
        }
    }
    table.add(
        "P2",
        "32 concurrent CreateVolume (wall) ÷ 32 serial bare lvcreate",
        conc,
        serial,
        1.0,
    );

    eprintln!("bench: P3 fill");
    // P3: 500 volumes; GetCapacity and ListVolumes against one bare lvs.
    let names: Vec<String> = (0..MANY).map(|i| format!("pvc-many-{i}")).collect();
    let (fill, out) = create_all(&cs, names, 4 * MIB).await;
    assert!(out.iter().all(Result::is_ok));
    let (_, load_hwm) = rss(d.pid());
    notes.push(format!(
        "Filling: {MANY} CreateVolume from {CLIENTS} clients took {fill:.1} s ({:.3} s each).",
        fill / MANY as f64
    ));
    eprintln!("bench: P3/P5 counting");
    // From here on the driver counts its LVM calls.
    let text = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(
        &d.config,
        format!("lvm_binary = \"{}\"\n{text}", wrapper.display()),
    )
    .unwrap();
    d.restart().await;
    let mut c = d.controller().await;
    let mut node = d.node().await;

    // P5: publish and unpublish of a staged volume run no LVM command.
    let v = c
        .create_volume(create_req("pvc-publish", 64 * MIB, cap(false, "ext4")))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let staging = root.join("st-publish");
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: s(&staging),
        volume_capability: Some(cap(false, "ext4")),
        ..Default::default()
    })
    .await
    .unwrap();
    let n0 = calls(&log);
    for i in 0..n {
        let target = root.join(format!("pub-{i}"));
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: s(&staging),
            target_path: s(&target),
            volume_capability: Some(cap(false, "ext4")),
            ..Default::default()
        })
        .await
        .unwrap();
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: s(&target),
        })
        .await
        .unwrap();
    }
    let publish_calls = calls(&log) - n0;
    notes.push(format!(
        "P5: NodePublishVolume + NodeUnpublishVolume ran {publish_calls} LVM commands over {n} pairs (target 0)."
    ));
    assert_eq!(publish_calls, 0, "publish and unpublish must run no LVM");
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: s(&staging),
    })
    .await
    .unwrap();
    c.delete_volume(del(&v.volume_id)).await.unwrap();

    let mut lvs_bare = vec![];
    for _ in 0..5 {
        lvs_bare.push(bare("lvm", &["lvs", &vg]));
    }
    let (mut capacity, mut list_one, mut list_paged) = (vec![], vec![], vec![]);
    // A few untimed calls first: the driver was just restarted, and its
    // first calls run code the VM has not run yet in this process.
    for _ in 0..3 {
        c.get_capacity(GetCapacityRequest::default()).await.unwrap();
        c.list_volumes(ListVolumesRequest::default()).await.unwrap();
    }
    for _ in 0..n {
        let t = Instant::now();
        c.get_capacity(GetCapacityRequest::default()).await.unwrap();
        capacity.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let all = c
            .list_volumes(ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner();
        list_one.push(t.elapsed().as_secs_f64());
        assert_eq!(all.entries.len(), MANY);
    }
    for _ in 0..10 {
        let t = Instant::now();
        let (mut token, mut seen) = (String::new(), 0);
        loop {
            let page = c
                .list_volumes(ListVolumesRequest {
                    max_entries: 100,
                    starting_token: token.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            seen += page.entries.len();
            token = page.next_token;
            if token.is_empty() {
                break;
            }
        }
        list_paged.push(t.elapsed().as_secs_f64());
        assert_eq!(seen, MANY);
    }
    table.add(
        "P3",
        "GetCapacity at 500 volumes ÷ bare `lvs VG`",
        capacity,
        lvs_bare.clone(),
        1.0 / 20.0,
    );
    table.add(
        "P3",
        "ListVolumes, one page (max_entries 0), 500 volumes ÷ bare `lvs VG`",
        list_one,
        lvs_bare.clone(),
        1.0 / 20.0,
    );
    table.add(
        "P3",
        "ListVolumes, all pages at max_entries 100, 500 volumes ÷ bare `lvs VG`",
        list_paged,
        lvs_bare,
        1.0 / 10.0,
    );

    eprintln!("bench: P4");
    // P4: an idle minute, counted through the wrapper.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n0 = calls(&log);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let idle_calls = calls(&log) - n0;
    let (rss_after, _) = rss(d.pid());
    let shells_left = harness::descendants(d.pid() as i32).len();
    notes.push(format!(
        "P4: an idle minute ran {idle_calls} LVM commands (target 0), and left {shells_left} processes below the driver (LVM shells close after 30 s idle). RSS idle {idle_rss:.1} MiB before the load, and {rss_after:.1} MiB idle after a restart with {MANY} volumes (target ≤ 20); peak RSS under {CLIENTS} clients filling {MANY} volumes {load_hwm:.1} MiB (target ≤ 40)."
    ));

    eprintln!("bench: capacity");
    // Capacity stays exact under concurrency: on a pool of its own at
    // ratio 1, 32 clients ask for more than fits; exactly what fits is
    // made, and nothing past the ratio.
    let small = TestDriver::start("bcap", 64 * MIB, "overprovision_ratio = 1.0\n").await;
    let scs = clients(&small, CLIENTS).await;
    let (headroom, _) = {
        let mut sc = small.controller().await;
        let cap = sc
            .get_capacity(GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
        (cap.maximum_volume_size.unwrap_or_default() as u64, ())
    };
    let report = harness::lvs(&small.vg);
    let pool_size = report.find("pool").unwrap().size;
    let names: Vec<String> = (0..CLIENTS).map(|i| format!("pvc-cap-{i}")).collect();
    let (_, out) = create_all(&scs, names, 4 * MIB).await;
    let made = out.iter().filter(|r| r.is_ok()).count();
    let refused = out
        .iter()
        .filter(|r| matches!(r, Err(tonic::Code::ResourceExhausted)))
        .count();
    let virtual_sum: u64 = harness::lvs(&small.vg)
        .thin_volumes("pool")
        .map(|lv| lv.size)
        .sum();
    notes.push(format!(
        "P2 capacity: pool {} MiB at ratio 1 (headroom {} MiB): {CLIENTS} concurrent 4 MiB creates made {made} and refused {refused} with RESOURCE_EXHAUSTED; {} MiB handed out.",
        pool_size / MIB,
        headroom / MIB,
        virtual_sum / MIB
    ));
    assert_eq!(
        made + refused,
        CLIENTS,
        "every call got a create or a refusal"
    );
    assert!(virtual_sum <= pool_size, "overcommitted past the ratio");
    assert_eq!(
        made as u64,
        pool_size / (4 * MIB),
        "exactly what fits was made"
    );
    drop(small);

    table.print(&notes);
}
