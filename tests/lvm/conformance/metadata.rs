//! SnapshotMetadata: GetMetadataAllocated and GetMetadataDelta.

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use super::{required, Rules};
use crate::fixtures::{allocated_batches, block_cap, create, delta_batches, snapshot, Batch};
use crate::harness::{TestDriver, MIB};

/// The number of ranges a whole stream carried, or the status that ended
/// it (at the call or in the stream).
async fn allocated(
    m: &mut SnapshotMetadataClient<Channel>,
    id: &str,
    start: i64,
    max: i32,
) -> Result<Response<usize>, Status> {
    Ok(Response::new(ranges(
        allocated_batches(m, id, start, max).await?,
    )))
}

async fn delta(
    m: &mut SnapshotMetadataClient<Channel>,
    base: &str,
    target: &str,
    start: i64,
) -> Result<Response<usize>, Status> {
    Ok(Response::new(ranges(
        delta_batches(m, base, target, start, 0).await?,
    )))
}

fn ranges(batches: Vec<Batch>) -> usize {
    batches.iter().map(|(_, b)| b.len()).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_metadata_rules() {
    let d = TestDriver::start("cfmeta", 64 * MIB, "").await;
    let mut r = Rules::new("SnapshotMetadata");
    let mut c = d.controller().await;
    let mut m = SnapshotMetadataClient::connect(d.uri()).await.unwrap();
    let vol = create(&d, "cf-meta", 4 * MIB, block_cap()).await;
    let mut snaps = Vec::new();
    for name in ["cf-meta-a", "cf-meta-b"] {
        snaps.push(snapshot(&mut c, name, &vol).await);
    }
    let unknown = [
        naming::snapshot_lv_name_for("never"),
        "fake-snap-id".to_string(),
    ];

    r.code(
        &required("GetMetadataAllocated", "snapshot_id"),
        allocated(&mut m, "", 0, 0).await,
        Code::InvalidArgument,
    );
    for u in &unknown {
        r.code(
            &format!("GetMetadataAllocated: snapshot {u} does not exist → NOT_FOUND [\"Invalid snapshot_id: 5 NOT_FOUND\"]"),
            allocated(&mut m, u, 0, 0).await,
            Code::NotFound,
        );
        r.code(
            &format!(
                "{} (base {u} unknown)",
                required("GetMetadataDelta", "target_snapshot_id")
            ),
            delta(&mut m, u, "", 0).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!(
                "{} (target {u} unknown)",
                required("GetMetadataDelta", "base_snapshot_id")
            ),
            delta(&mut m, "", u, 0).await,
            Code::InvalidArgument,
        );
        r.code(
            &format!("GetMetadataDelta: base snapshot {u} does not exist → NOT_FOUND [\"Invalid base_snapshot_id or target_snapshot_id: 5 NOT_FOUND\"]"),
            delta(&mut m, u, &snaps[1], 0).await,
            Code::NotFound,
        );
    }
    let oor = "→ OUT_OF_RANGE [\"Invalid starting_offset: 11 OUT_OF_RANGE: The starting offset is negative or exceeds the volume size\"]";
    r.code(
        &format!("GetMetadataAllocated: a negative starting_offset {oor}"),
        allocated(&mut m, &snaps[0], -1, 0).await,
        Code::OutOfRange,
    );
    r.code(
        &format!("GetMetadataAllocated: a starting_offset beyond the volume size {oor}"),
        allocated(&mut m, &snaps[0], (1024 * MIB) as i64, 0).await,
        Code::OutOfRange,
    );
    r.code(
        &format!("GetMetadataDelta: a negative starting_offset {oor}"),
        delta(&mut m, &snaps[0], &snaps[1], -1).await,
        Code::OutOfRange,
    );
    r.code(
        "GetMetadataAllocated: a negative max_results → INVALID_ARGUMENT [\"Missing or otherwise invalid argument: 3 INVALID_ARGUMENT\"]",
        allocated(&mut m, &snaps[0], 0, -1).await,
        Code::InvalidArgument,
    );
    let a = r.ok(
        "GetMetadataAllocated of a snapshot succeeds",
        allocated(&mut m, &snaps[0], 0, 1).await,
    );
    let b = r.ok(
        "GetMetadataAllocated again → the same answer",
        allocated(&mut m, &snaps[0], 0, 1).await,
    );
    r.check(
        "GetMetadataAllocated: a repeated call gives the same ranges",
        a == b,
        format!("{a:?} vs {b:?}"),
    );
    r.ok(
        "GetMetadataDelta of two snapshots succeeds",
        delta(&mut m, &snaps[0], &snaps[1], 0).await,
    );
    r.finish();
}
