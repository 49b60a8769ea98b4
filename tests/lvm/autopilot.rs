//! The thin-pool autopilot (issue 24, part 3): a pool that starts small
//! grows under a writer before it sees an I/O error, growing its
//! loop-backed VG's file first; with no room left the condition says so
//! and creates are refused; an idle pool costs no LVM command. Issue 33
//! item 3: a steady writer faster than fixed steps keep up with sees no
//! out-of-data-space mode, with writes that would fail if it did.

use std::time::{Duration, Instant};

use tonic::Code;

use crate::fixtures::{
    autopilot_run, block_cap, create, create_req, publish_block, unpublish_block, Kubelet, Steps,
};
use crate::harness::{counting_lvm, file_lines, lvs, sh, TestDriver, MIB};

/// `dd` of `mib` MiB of zeros into `dev` with direct I/O (dm-thin maps a
/// chunk for any write, zeros too); its exit status and stderr.
fn write_mib(dev: &std::path::Path, mib: u64) -> (bool, String) {
    let out = std::process::Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", dev.display()),
            "bs=1M",
            &format!("count={mib}"),
            "oflag=direct",
            "conv=fsync",
        ])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn pool_size(vg: &str) -> u64 {
    lvs(vg).find("pool").unwrap().size
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_pool_grows_under_a_writer_and_an_idle_pool_costs_no_lvm() {
    let k = Kubelet::new("auto");
    let tools = tempfile::tempdir().unwrap();
    let (wrapper, calls) = counting_lvm(tools.path());
    let extra = format!(
        "{}lvm_binary = \"{}\"\noverprovision_ratio = 10\nerror_when_full = false\n\
         autopilot = {{ enabled = true, data_threshold_percent = 60, step_percent = 50, \
         backing_file_limit = \"320MiB\", host_reserve = 0, poll_secs = 1 }}\n",
        k.extra(),
        wrapper.display()
    );
    let mut d =
        TestDriver::start_with_loop_keys("auto", 64 * MIB, &extra, "pool_percent = 40\n", &[])
            .await;
    let (start_pool, start_file) = (
        pool_size(&d.vg),
        std::fs::metadata(&d.backing).unwrap().len(),
    );
    assert!(start_pool <= 28 * MIB, "{start_pool}");
    // GetCapacity counts what the autopilot may add: the VG's free space
    // and the file's room up to its limit.
    let cap = d.capacity().await;
    assert!(
        cap.available_capacity as u64 > 200 * MIB,
        "{cap:?} (pool {start_pool})"
    );
    let id = create(&d, "pvc-stream", 160 * MIB, block_cap()).await;
    let dev = publish_block(&d, &k, &id).await;

    let t = Instant::now();
    let (ok, err) = write_mib(&dev, 100);
    let took = t.elapsed();
    let grown = d.log().matches("autopilot: grew the thin pool").count();
    assert!(ok, "the writer saw an error: {err}\n{}", d.log_tail(30));
    let backing = d
        .log()
        .matches("autopilot: grew the loop-backed volume group")
        .count();
    let (end_pool, end_file) = (
        pool_size(&d.vg),
        std::fs::metadata(&d.backing).unwrap().len(),
    );
    eprintln!(
        "MEASURE autopilot: 100 MiB written in {took:?}; pool {} -> {} MiB in {grown} data growths, \
         file {} -> {} MiB in {backing} growths",
        start_pool / MIB,
        end_pool / MIB,
        start_file / MIB,
        end_file / MIB
    );
    assert!(end_pool >= 100 * MIB, "pool {end_pool}");
    assert!(
        end_file > start_file && end_file <= 320 * MIB,
        "file {end_file}"
    );
    assert!(grown >= 1 && backing >= 1, "{}", d.log_tail(30));
    let cond = d.condition(&id).await;
    assert!(!cond.abnormal, "{cond:?}");

    // The pool settles below its threshold (a growth may still be under
    // way as the writer ends).
    let deadline = Instant::now() + Duration::from_secs(120);
    while lvs(&d.vg)
        .find("pool")
        .unwrap()
        .data_percent
        .unwrap_or(100.0)
        >= 60.0
    {
        assert!(Instant::now() < deadline, "{}", d.log_tail(20));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Idle: the autopilot reads device-mapper, not LVM.
    let before = file_lines(&calls).len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let idle: Vec<String> = file_lines(&calls).split_off(before);
    assert!(idle.is_empty(), "an idle minute ran LVM: {idle:?}");
    unpublish_block(&d, &k, &id).await;

    // A restart finds the file at a size the autopilot reached: expected,
    // said at INFO, never the warning of a file of another size.
    d.restart().await;
    let log = d.log();
    assert!(
        !log.contains("backing file exists with another size"),
        "a false warning:\n{log}"
    );
    assert!(
        log.contains("backing file is as the autopilot grew it"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_room_left_the_condition_says_so_and_creates_are_refused() {
    let k = Kubelet::new("autofull");
    // The pool and its metadata take all but an extent of the VG and the
    // file never grows: the autopilot has almost nothing to give. A full
    // pool fails writes.
    let extra = format!(
        "{}overprovision_ratio = 10\nerror_when_full = true\n\
         autopilot = {{ enabled = true, data_threshold_percent = 60, poll_secs = 1 }}\n",
        k.extra()
    );
    let d = TestDriver::start("autofull", 64 * MIB, &extra).await;
    let pool_dm = format!("{}-pool-tpool", d.vg.replace('-', "--"));
    let status = |name: &str| sh("dmsetup", &["status", name]);
    let id = create(&d, "pvc-fill", 96 * MIB, block_cap()).await;
    let dev = publish_block(&d, &k, &id).await;
    assert!(
        status(&pool_dm).contains("error_if_no_space"),
        "{}",
        status(&pool_dm)
    );
    let (ok, _) = write_mib(&dev, 90);
    assert!(!ok, "a write past a full pool that cannot grow fails");
    // The autopilot tried, and says why it could not.
    let deadline = Instant::now() + Duration::from_secs(30);
    let cond = loop {
        let c = d.condition(&id).await;
        if c.message.contains("autopilot cannot grow") || Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let autopilot_lines: Vec<String> = d
        .log()
        .lines()
        .filter(|l| l.contains("autopilot") || l.contains("panicked") || l.contains("lvextend"))
        .map(String::from)
        .collect();
    assert!(
        cond.abnormal && cond.message.contains("autopilot cannot grow"),
        "{cond:?}\n{}",
        autopilot_lines.join("\n")
    );
    assert!(cond.message.contains("backing_file_limit"), "{cond:?}");
    // What little it could add is written too: the pool is full now.
    let (ok, _) = write_mib(&dev, 90);
    assert!(!ok);
    let e = d
        .controller()
        .await
        .create_volume(create_req("pvc-late", 8 * MIB, block_cap()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(d.capacity().await.available_capacity, 0);
    unpublish_block(&d, &k, &id).await;
    assert!(!dev.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_pressure_grows_the_metadata_before_it_fills() {
    let k = Kubelet::new("automd");
    // The smallest metadata LV the driver builds (sized for one LV and the
    // reserve: one 4 MiB extent), a threshold a few dozen snapshots pass,
    // and a file that may grow for the metadata and its spare copy.
    let extra = format!(
        "{}overprovision_ratio = 10\n\
         autopilot = {{ enabled = true, metadata_threshold_percent = 15, \
         backing_file_limit = \"128MiB\", host_reserve = 0, poll_secs = 1 }}\n",
        k.extra()
    );
    let d =
        TestDriver::start_with_loop_keys("automd", 64 * MIB, &extra, "max_lvs = 1\n", &[]).await;
    let meta = || {
        let r = lvs(&d.vg);
        let p = r.find("pool").unwrap();
        (p.metadata_size, p.metadata_percent.unwrap_or(0.0))
    };
    let (start_size, start_pct) = meta();
    let id = create(&d, "pvc-md", 8 * MIB, block_cap()).await;
    let dev = publish_block(&d, &k, &id).await;
    assert!(write_mib(&dev, 4).0);
    // Each snapshot shares the origin's mapping tree; the write after it
    // copies the path to the chunk it changes: metadata grows by a few
    // blocks a round, as under a snapshot schedule of a busy volume.
    let mut c = d.controller().await;
    let mut made = 0;
    let grew = |d: &TestDriver| d.log().contains("store=\"metadata\"");
    while !grew(&d) && made < 200 {
        crate::fixtures::snapshot(&mut c, &format!("snap-md-{made}"), &id).await;
        let out = std::process::Command::new("dd")
            .args([
                "if=/dev/urandom",
                &format!("of={}", dev.display()),
                "bs=64k",
                "count=1",
                &format!("seek={}", made % 64),
                "oflag=direct",
                "conv=notrunc",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        made += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !grew(&d) {
        assert!(
            Instant::now() < deadline,
            "no metadata growth after {made} snapshots (metadata {start_pct:.1}% of {start_size} at the start, now {:?})\n{}",
            meta(),
            d.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (end_size, end_pct) = meta();
    eprintln!(
        "MEASURE autopilot metadata: {made} snapshots took it from {start_pct:.1}% of {} KiB to a growth; now {end_pct:.1}% of {} KiB",
        start_size >> 10,
        end_size >> 10
    );
    assert!(end_size > start_size, "{start_size} -> {end_size}");
    assert!(end_pct < 15.0, "{end_pct}");
    unpublish_block(&d, &k, &id).await;
}

/// The rate [`a_steady_writer_faster_than_fixed_steps_never_fills_the_pool`]
/// writes at, in MiB a second. With the driver's default threshold (80 %)
/// and step (20 %), the fixed-step autopilot added 12 MiB a growth to the
/// 60 MiB pool, less than this writer wrote while a growth ran: it fell
/// behind and the pool filled. The rate-sized one grows the pool at the
/// first read that sees the writer, by what it writes in a poll and two
/// growths: its first growth lands within about 1.6 s (a read at most a
/// second after the writer starts, a growth of about 0.6 s under TCG),
/// and the pool fills at this rate in 3.75 s.
const STEADY_MIB_S: u64 = 16;

#[tokio::test(flavor = "multi_thread")]
async fn a_steady_writer_faster_than_fixed_steps_never_fills_the_pool() {
    // error_when_full = true: a write the pool has no room for fails at
    // once, so the writer's own result says whether the pool ever filled.
    let steps = Steps {
        threshold: 80,
        step: 20,
    };
    let run = autopilot_run("autorate", STEADY_MIB_S * MIB, 240 * MIB, true, steps).await;
    eprintln!(
        "MEASURE autopilot rate (60 MiB pool, threshold 80 %, step 20 %, poll_secs 1): \
         {STEADY_MIB_S} MiB/s for {} MiB in {:?}, slowest 1 MiB write {:?}; \
         pool {} -> {} MiB; out-of-data-space switches {}",
        run.paced.written / MIB,
        run.paced.took,
        run.paced.slowest,
        run.start_pool / MIB,
        run.end_pool / MIB,
        run.switches.len()
    );
    for g in &run.growths {
        eprintln!("  {g}");
    }
    assert!(
        run.paced.error.is_none(),
        "the writer saw an error: {:?}\n{:?}\n{}",
        run.paced.error,
        run.switches,
        run.growths.join("\n")
    );
    assert!(
        run.switches.is_empty(),
        "the pool ran out of data space: {:?}\n{}",
        run.switches,
        run.growths.join("\n")
    );
    assert!(run.clean());
    assert_eq!(run.paced.written, 240 * MIB);
    assert!(run.end_pool >= 240 * MIB, "pool {}", run.end_pool);
}
