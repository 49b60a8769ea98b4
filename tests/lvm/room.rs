//! A thin pool whose metadata fills with many empty thin devices (the
//! dense node of issue 22): the driver refuses new volumes and snapshots
//! with RESOURCE_EXHAUSTED naming the pool's metadata while LVM itself
//! would still make one, GetCapacity answers 0, the volume condition and
//! readiness say so, and once the metadata is grown everything works again.
//!
//! Most of the thin devices are made straight in the kernel's pool
//! (`dmsetup message ... create_thin`, no LVM metadata), as 600 LVM
//! commands would take minutes under TCG: the pool's Metadata% is what the
//! driver reads, and it counts them like any other.

use std::time::Instant;

use thinpool_csi::lvm::room::Room;
use thinpool_csi::proto::csi::v1::*;
use tonic::Code;

use crate::fixtures::{create_req, del, mount_cap, tpcsi};
use crate::harness::{dm_name, dmsetup, lvm, lvs, try_lvm, TestDriver, MIB};

const RESERVE: u64 = 16;

/// What LVM reports of the pool's metadata now: (size, Metadata%).
fn pool_metadata(vg: &str) -> (u64, f64) {
    let r = lvs(vg);
    let p = r.find("pool").expect("the pool");
    (p.metadata_size, p.metadata_percent.expect("an active pool"))
}

async fn create(d: &TestDriver, name: &str) -> Result<String, tonic::Status> {
    d.controller()
        .await
        .create_volume(create_req(name, 4 * MIB, mount_cap("ext4")))
        .await
        .map(|r| r.into_inner().volume.unwrap().volume_id)
}

#[tokio::test(flavor = "multi_thread")]
async fn pool_metadata_refuses_before_lvm_and_recovers_after_growing_it() {
    let d = TestDriver::start(
        "room",
        64 * MIB,
        &format!("metadata_reserve_lvs = {RESERVE}\n"),
    )
    .await;
    let vg = d.vg.clone();
    let first = create(&d, "room-first").await.expect("a first volume");
    let (size, pct) = pool_metadata(&vg);
    let room = Room::estimate(size, pct, 0, 0, 1, 0);
    let left = room.pool_lvs_left().expect("the metadata LV's size");
    eprintln!("MEASURE pool metadata {size} bytes, {pct}% used, {left} thin devices left");

    // Thin devices in the kernel's pool until RESERVE + 4 are left.
    let tpool = format!("{}-tpool", dm_name(&vg, "pool"));
    let t = Instant::now();
    let fill = left - RESERVE - 4;
    for i in 0..fill {
        dmsetup(&[
            "message",
            &tpool,
            "0",
            &format!("create_thin {}", 1_000_000 + i),
        ])
        .unwrap_or_else(|e| panic!("create_thin {i}: {e}"));
    }
    let (_, filled) = pool_metadata(&vg);
    eprintln!(
        "MEASURE {fill} thin devices made in {:?}: Metadata% {pct} -> {filled}",
        t.elapsed()
    );

    // Creates go on until the reserve is reached, then stop with
    // RESOURCE_EXHAUSTED naming the pool's metadata.
    let mut made = vec![first.clone()];
    let refusal = loop {
        // The fill leaves RESERVE + 4 by the driver's estimate (4,200
        // bytes a device); each took 4,155, so some 10 fit in the VM.
        assert!(made.len() < 40, "never refused; made {made:?}");
        match create(&d, &format!("room-{}", made.len())).await {
            Ok(id) => made.push(id),
            Err(s) => break s,
        }
    };
    eprintln!(
        "CreateVolume after {} more: {:?}: {}",
        made.len() - 1,
        refusal.code(),
        refusal.message()
    );
    assert!(made.len() > 1, "room for a few before the reserve");
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    let msg = refusal.message();
    assert!(
        msg.contains("pool's metadata is") && msg.contains("lvextend --poolmetadatasize"),
        "names the pool's metadata and what to do: {msg}"
    );
    let (_, at_refusal) = pool_metadata(&vg);
    assert!(at_refusal < 75.0, "refused before LVM's 75%: {at_refusal}");

    // LVM itself would still make one: the driver stopped first.
    let bare = format!("{vg}/bare");
    try_lvm(&[
        "lvcreate",
        "--type",
        "thin",
        "--virtualsize",
        "4m",
        "--thinpool",
        &format!("{vg}/pool"),
        "--name",
        "bare",
        "--activate",
        "n",
        "--yes",
    ])
    .expect("LVM still makes a thin volume where the driver refused");
    lvm(&["lvremove", "--yes", &bare]);

    // A snapshot is refused the same way.
    let snap = d
        .controller()
        .await
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: first.clone(),
            name: "room-snap".into(),
            ..Default::default()
        })
        .await
        .expect_err("a snapshot past the reserve");
    assert_eq!(snap.code(), Code::ResourceExhausted, "{snap:?}");

    // GetCapacity, the volume condition and readiness say no new LV fits.
    let cap = d.capacity().await;
    assert_eq!(
        (cap.available_capacity, cap.maximum_volume_size),
        (0, Some(0))
    );
    let cond = d.condition(&first).await;
    assert!(
        cond.abnormal && cond.message.contains("metadata"),
        "{cond:?}"
    );
    assert_eq!(tpcsi(&d, &["probe"]).status.code(), Some(18));

    // Grown by hand: the cached report says short, CreateVolume reads
    // again and goes on.
    lvm(&[
        "lvextend",
        "--yes",
        "--poolmetadatasize",
        "+4m",
        &format!("{vg}/pool"),
    ]);
    let (grown, pct) = pool_metadata(&vg);
    eprintln!("MEASURE grown to {grown} bytes: {pct}% used");
    made.push(create(&d, "room-after").await.expect("creates work again"));
    let cap = d.capacity().await;
    assert!(cap.available_capacity > 0, "{cap:?}");
    assert!(tpcsi(&d, &["probe"]).status.success());
    for id in made {
        d.controller().await.delete_volume(del(&id)).await.unwrap();
    }
}

/// What the driver builds is sized for `loop_pool.max_lvs` (plus the
/// reserve): the PV's metadata area and the pool's metadata LV hold that
/// many LVs by the sizing rule, in 64 KiB chunks; a backing file too small
/// for it gets what fits, and the log says so.
#[tokio::test(flavor = "multi_thread")]
async fn the_built_vg_and_pool_are_sized_for_max_lvs() {
    use thinpool_csi::lvm::room::{lvs_in, lvs_in_mda};
    let d = TestDriver::start_with_loop_keys(
        "sized",
        1024 * MIB,
        "metadata_reserve_lvs = 64\n",
        "max_lvs = 4000\n",
        &[],
    )
    .await;
    let r = lvs(&d.vg);
    let pool = r.find("pool").unwrap();
    eprintln!(
        "MEASURE 1 GiB file, max_lvs 4000: VG metadata area {} bytes, pool {} bytes, \
         metadata LV {} bytes, chunk {}",
        pool.vg_mda_size, pool.size, pool.metadata_size, pool.chunk_size
    );
    assert_eq!(pool.chunk_size, 64 << 10);
    assert!(lvs_in_mda(pool.vg_mda_size) >= 4064, "{pool:?}");
    assert!(pool.vg_mda_size > 2 * MIB, "more than LVM's default area");
    assert!(
        lvs_in(pool.metadata_size, pool.size, pool.chunk_size) >= 4064,
        "{pool:?}"
    );
    assert!(d.log().contains("created thin pool"), "{}", d.log_tail(20));
    drop(d);

    // 64 MiB cannot give 12,000 LVs their metadata: it gets what fits,
    // and the log says so when max_lvs was set.
    let small =
        TestDriver::start_with_loop_keys("small", 64 * MIB, "", "max_lvs = 12000\n", &[]).await;
    let pool = lvs(&small.vg).find("pool").unwrap().clone();
    assert!(pool.metadata_size >= 2 * MIB, "{pool:?}");
    let log = small.log();
    assert!(
        log.contains("no room for the pool metadata max_lvs asks for"),
        "the shortfall is logged: {}",
        small.log_tail(20)
    );
}

/// A restart heals every staged volume from one `lvs` of the VG, not one
/// per volume: on a dense node each is a report of every LV.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_heals_every_staged_volume_from_one_report() {
    use crate::fixtures::{stage_req, Kubelet};
    let tools = tempfile::tempdir().unwrap();
    let (wrapper, calls) = crate::harness::counting_lvm(tools.path());
    let k = Kubelet::new("heal1");
    let mut d = TestDriver::start(
        "heal1",
        128 * MIB,
        // A report cache, as deployed: start-up's reads share one report.
        &format!(
            "{}lvm_binary = \"{}\"\nreport_max_age_secs = 60\n",
            k.extra(),
            wrapper.display()
        ),
    )
    .await;
    for i in 0..4 {
        let id = create(&d, &format!("heal1-{i}")).await.unwrap();
        let staging = k.staging(&format!("v{i}"));
        d.node()
            .await
            .node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
            .await
            .unwrap();
    }
    let runs = |command: &str| {
        crate::harness::file_lines(&calls)
            .iter()
            .filter(|l| l.starts_with(command))
            .count()
    };
    d.stop();
    // Devices a killed `dmsetup create` or `cryptsetup open` left without
    // a table, for volumes of this class, go at start-up (found by the
    // driver's DM_LIST_DEVICES, checked here with `dmsetup ls`); a
    // table-less device that is not the driver's stays.
    let ids: Vec<String> = lvs(&d.vg)
        .lvs
        .iter()
        .filter(|lv| lv.name.starts_with("csi-"))
        .map(|lv| lv.name.clone())
        .collect();
    let debris = [
        thinpool_csi::node::dm::overlay_name(&ids[0], &k.target("gone")),
        thinpool_csi::node::crypt::mapping_name(&ids[1]),
    ];
    // Not this class's: a name of no driver shape, and the driver's
    // shapes for a volume this class does not hold.
    let foreign = [
        format!("{}-not-the-drivers", d.vg),
        thinpool_csi::node::dm::overlay_name("csi-not-this-class", &k.target("gone")),
        thinpool_csi::node::crypt::mapping_name("csi-not-this-class"),
    ];
    for name in debris.iter().chain(&foreign) {
        dmsetup(&["create", name, "--notable"]).unwrap();
    }
    let (lvs_before, vgs_before) = (runs("lvs"), runs("vgs"));
    d.spawn_and_heal().await;
    let names: Vec<String> = crate::harness::dm_devices()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for name in &foreign {
        dmsetup(&["remove", name]).unwrap();
    }
    for name in &debris {
        assert!(!names.contains(name), "{name} is left: {names:?}");
    }
    for name in &foreign {
        assert!(names.contains(name), "{name} was removed: {names:?}");
    }
    let (n, vgs) = (runs("lvs") - lvs_before, runs("vgs") - vgs_before);
    eprintln!("MEASURE restart with 4 staged volumes: {n} lvs runs, {vgs} vgs runs");
    // `pool::ensure`'s report (which the zeroing check, the earlier
    // versions' tags and Probe take too), and one for every heal.
    assert!(n <= 2, "{n} lvs runs for a restart with 4 staged volumes");
    // The list of VGs is read only when the report fails: each LVM
    // command reads the whole VG, so a start runs no other.
    assert_eq!(vgs, 0, "a restart of a VG that is there lists the VGs");
}
