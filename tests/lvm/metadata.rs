//! SnapshotMetadata through the socket, checked against the truth: known
//! chunks are written to a block volume between snapshots, and the
//! reported ranges must be exactly those chunks, at the pool's chunk
//! granularity. Plus a timing against reading both snapshots whole.

use std::path::Path;
use std::time::Instant;

use thinpool_csi::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use crate::fixtures::{
    allocated_batches, block_cap, create_req, del, delta_batches, publish_req, snapshot, stage_req,
    unpublish_req, unstage_req, write_at, Batch, Kubelet,
};
use crate::harness::{dm_name, dmsetup, lvm, lvs, sh, TestDriver, MIB};

/// Every range of a GetMetadataAllocated stream, checking the stream's
/// rules on the way: one type, one capacity, batches within `max`,
/// ascending and not overlapping.
async fn allocated(
    m: &mut SnapshotMetadataClient<Channel>,
    id: &str,
    start: i64,
    max: i32,
) -> Result<Vec<(i64, i64)>, tonic::Status> {
    Ok(checked(
        allocated_batches(m, id, start, max).await?,
        max,
        start,
    ))
}

/// Every range of a GetMetadataDelta stream, checked as [`allocated`]'s.
async fn delta(
    m: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
    start: i64,
    max: i32,
) -> Result<Vec<(i64, i64)>, tonic::Status> {
    Ok(checked(
        delta_batches(m, base, target, start, max).await?,
        max,
        start,
    ))
}

/// The ranges of a stream's batches, each batch checked.
fn checked(batches: Vec<Batch>, max: i32, start: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for (kind, batch) in batches {
        check(&mut out, kind, batch, max, start);
    }
    out
}

fn check(out: &mut Vec<(i64, i64)>, kind: i32, batch: Vec<BlockMetadata>, max: i32, start: i64) {
    assert_eq!(kind, BlockMetadataType::VariableLength as i32);
    assert!(
        max == 0 || batch.len() <= max as usize,
        "{} > {max}",
        batch.len()
    );
    for b in batch {
        assert!(b.size_bytes > 0);
        assert!(
            b.byte_offset + b.size_bytes > start,
            "{b:?} ends before {start}"
        );
        if let Some((o, l)) = out.last() {
            assert!(
                o + l <= b.byte_offset,
                "overlap or disorder: ({o},{l}) then {b:?}"
            );
        }
        out.push((b.byte_offset, b.size_bytes));
    }
}

/// Chunk numbers to merged byte ranges.
fn ranges(chunks: &[u64], chunk: u64) -> Vec<(i64, i64)> {
    let mut sorted = chunks.to_vec();
    sorted.sort();
    sorted.dedup();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for c in sorted {
        let (o, l) = ((c * chunk) as i64, chunk as i64);
        match out.last_mut() {
            Some((po, pl)) if *po + *pl == o => *pl += l,
            _ => out.push((o, l)),
        }
    }
    out
}

fn write_chunks(dev: &Path, chunks: &[u64], chunk: u64, seed: u8) {
    for c in chunks {
        let data: Vec<u8> = (0..chunk).map(|i| (i as u8) ^ seed ^ (*c as u8)).collect();
        write_at(dev, c * chunk, &data).unwrap();
    }
}

fn pool_chunk(vg: &str) -> u64 {
    lvs(vg).find("pool").unwrap().chunk_size
}

fn holds_metadata_snap(vg: &str) -> bool {
    let status = dmsetup(&["status", &format!("{}-tpool", dm_name(vg, "pool"))]).unwrap();
    thinpool_csi::lvm::thin::holds_metadata_snap(&status).unwrap()
}

async fn block_volume(
    d: &TestDriver,
    k: &Kubelet,
    name: &str,
    bytes: u64,
) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let (mut c, mut n) = (d.controller().await, d.node().await);
    let id = c
        .create_volume(create_req(name, bytes, block_cap()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let (st, t) = (k.staging(name), k.target(name));
    n.node_stage_volume(stage_req(&id, &st, block_cap()))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &st, &t, block_cap(), false))
        .await
        .unwrap();
    (id, st, t)
}

async fn drop_volume(d: &TestDriver, id: &str, st: &Path, t: &Path) {
    let (mut c, mut n) = (d.controller().await, d.node().await);
    n.node_unpublish_volume(unpublish_req(id, t)).await.unwrap();
    n.node_unstage_volume(unstage_req(id, st)).await.unwrap();
    c.delete_volume(del(id)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_reports_exactly_the_chunks_written() {
    let k = Kubelet::new("zmeta");
    let d = TestDriver::start("zmeta", 256 * MIB, &k.extra()).await;
    let mut c = d.controller().await;
    let mut m = SnapshotMetadataClient::connect(d.uri()).await.unwrap();
    let chunk = pool_chunk(&d.vg);
    let (id, st, dev) = block_volume(&d, &k, "zmeta-v", 64 * MIB).await;
    let (other, ost, odev) = block_volume(&d, &k, "zmeta-o", 16 * MIB).await;

    let first = [0u64, 1, 2, 10, 50, 51];
    write_chunks(&dev, &first, chunk, 1);
    let s1 = snapshot(&mut c, "zmeta-s1", &id).await;
    let got = allocated(&mut m, &s1, 0, 0).await.unwrap();
    eprintln!("MEASURE metadata allocated s1 (chunk {chunk}): {got:?}");
    assert_eq!(got, ranges(&first, chunk));

    let last = 64 * MIB / chunk - 1;
    let second = [1u64, 20, 21, 51, last];
    write_chunks(&dev, &second, chunk, 2);
    let s2 = snapshot(&mut c, "zmeta-s2", &id).await;
    let changed = delta(&mut m, &s1, &s2, 0, 0).await.unwrap();
    eprintln!("MEASURE metadata delta s1..s2: {changed:?}");
    assert_eq!(changed, ranges(&second, chunk));
    let all: Vec<u64> = first.iter().chain(second.iter()).copied().collect();
    assert_eq!(
        allocated(&mut m, &s2, 0, 0).await.unwrap(),
        ranges(&all, chunk)
    );

    // Continuing from the end of what was received gives the same union.
    let head = delta(&mut m, &s1, &s2, 0, 1).await.unwrap();
    let (o, l) = head[0];
    let rest = delta(&mut m, &s1, &s2, o + l, 2).await.unwrap();
    let mut joined = vec![head[0]];
    joined.extend(rest);
    assert_eq!(joined, changed);
    // A start inside a range gives what lies after it.
    let inside = allocated(&mut m, &s1, chunk as i64, 0).await.unwrap();
    assert_eq!(inside[0], (chunk as i64, 2 * chunk as i64));

    // Errors.
    write_chunks(&odev, &[3], chunk, 3);
    let so = snapshot(&mut c, "zmeta-so", &other).await;
    let e = delta(&mut m, &s1, &so, 0, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = allocated(&mut m, "snap-gone-0123456789abcdef", 0, 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = allocated(&mut m, &s1, 65 * MIB as i64, 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let e = allocated(&mut m, "", 0, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        !holds_metadata_snap(&d.vg),
        "the metadata snapshot is released"
    );

    // A client that stops reading early: the snapshot is still released.
    let mut early = m
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: s2.clone(),
            max_results: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(early.message().await.unwrap().is_some());
    drop(early);
    let released = Instant::now();
    while holds_metadata_snap(&d.vg) {
        assert!(released.elapsed().as_secs() < 30, "never released");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        allocated(&mut m, &s1, 0, 0).await.unwrap(),
        ranges(&first, chunk)
    );

    for s in [&s2, &so] {
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s.to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    drop_volume(&d, &id, &st, &dev).await;
    drop_volume(&d, &other, &ost, &odev).await;

    // Its source gone and the pool inactive (nothing of it in use): the
    // snapshot's metadata still answers, the driver bringing the pool up.
    lvm(&["lvchange", "--activate", "n", &format!("{}/pool", d.vg)]);
    assert!(!lvs(&d.vg).find("pool").unwrap().is_active());
    assert_eq!(
        allocated(&mut m, &s1, 0, 0).await.unwrap(),
        ranges(&first, chunk)
    );
    assert!(
        !holds_metadata_snap(&d.vg),
        "the metadata snapshot is released"
    );
    c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: s1.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// GetMetadataDelta on a 1 GiB volume with 1 % changed, against reading
/// both snapshots whole (what a backup tool does without it).
#[tokio::test(flavor = "multi_thread")]
async fn bench_metadata_delta_vs_reading_both_snapshots() {
    let k = Kubelet::new("zmbench");
    let extra = format!("{}overprovision_ratio = 20.0\n", k.extra());
    let d = TestDriver::start("zmbench", 256 * MIB, &extra).await;
    let mut c = d.controller().await;
    let mut m = SnapshotMetadataClient::connect(d.uri()).await.unwrap();
    let chunk = pool_chunk(&d.vg);
    let size = 1024 * MIB;
    let (id, st, dev) = block_volume(&d, &k, "zmbench-v", size).await;
    let chunks = size / chunk;
    let spread =
        |n: u64, salt: u64| -> Vec<u64> { (0..n).map(|i| (i * 7919 + salt) % chunks).collect() };
    let one_percent = chunks / 100;
    write_chunks(&dev, &spread(one_percent, 1), chunk, 1);
    let s1 = snapshot(&mut c, "zmbench-s1", &id).await;
    let changed = spread(one_percent, 5);
    write_chunks(&dev, &changed, chunk, 2);
    let s2 = snapshot(&mut c, "zmbench-s2", &id).await;

    let t = Instant::now();
    let got = delta(&mut m, &s1, &s2, 0, 0).await.unwrap();
    let delta_time = t.elapsed();
    assert_eq!(got, ranges(&changed, chunk));

    let t = Instant::now();
    for s in [&s1, &s2] {
        let lv = format!("{}/{s}", d.vg);
        lvm(&["lvchange", "-ay", "-K", &lv]);
        sh(
            "dd",
            &[
                &format!("if=/dev/{lv}"),
                "of=/dev/null",
                "bs=4M",
                "iflag=direct",
            ],
        );
        lvm(&["lvchange", "-an", &lv]);
    }
    let read_time = t.elapsed();
    eprintln!(
        "MEASURE metadata delta 1 GiB, {} of {chunks} chunks changed: GetMetadataDelta {:.3}s, \
         reading both snapshots {:.3}s, ratio {:.4}",
        changed.len(),
        delta_time.as_secs_f64(),
        read_time.as_secs_f64(),
        delta_time.as_secs_f64() / read_time.as_secs_f64()
    );
    assert!(!holds_metadata_snap(&d.vg));
    for s in [&s1, &s2] {
        c.delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s.to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    drop_volume(&d, &id, &st, &dev).await;
}
