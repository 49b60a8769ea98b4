//! Many clients at once: 32 clients create, then delete, 200 volumes whose
//! names they share (several clients per name); and concurrent calls on
//! one volume get ABORTED (README: "Concurrent calls on the same volume
//! get ABORTED").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use crate::fixtures::{
    block_cap, create, create_req, del, mount_cap, stage_req, unstage_req, Kubelet,
};
use crate::harness::{dm_of_vg, lvs, pool_dm_names, TestDriver, MIB};

const CLIENTS: usize = 32;
/// How many clients share each name.
const PER_NAME: usize = 3;

/// The number of volumes: 200, or `TPCSI_CONCURRENT_VOLUMES`.
fn volumes() -> usize {
    std::env::var("TPCSI_CONCURRENT_VOLUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// The names client `c` works on, in an order of its own, so that the
/// clients sharing a name reach it at different moments.
fn names_of(c: usize, total: usize) -> Vec<usize> {
    let mut mine: Vec<usize> = (0..total)
        .filter(|i| (0..PER_NAME).any(|j| (i + j * CLIENTS / PER_NAME) % CLIENTS == c))
        .collect();
    let turn = c % mine.len().max(1);
    mine.rotate_left(turn);
    if c % 2 == 1 {
        mine.reverse();
    }
    mine
}

/// What the clients saw: codes per call kind, volume ids per name, and
/// every answer that was not OK or ABORTED.
#[derive(Default)]
struct Seen {
    codes: BTreeMap<(&'static str, String), usize>,
    ids: BTreeMap<usize, BTreeSet<String>>,
    wrong: Vec<String>,
}

/// Calls `call` until it is not ABORTED; records every answer.
async fn until_done<T, F, Fut>(
    seen: &Mutex<Seen>,
    what: &'static str,
    name: usize,
    mut call: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let start = Instant::now();
    loop {
        let got = call().await;
        let code = got.as_ref().err().map(|s| s.code()).unwrap_or(Code::Ok);
        *seen
            .lock()
            .unwrap()
            .codes
            .entry((what, format!("{code:?}")))
            .or_default() += 1;
        match got {
            Ok(r) => return Some(r.into_inner()),
            Err(e) if e.code() == Code::Aborted && start.elapsed() < Duration::from_secs(300) => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => {
                seen.lock().unwrap().wrong.push(format!(
                    "{what} of name {name}: {:?}: {}",
                    e.code(),
                    e.message()
                ));
                return None;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn thirty_two_clients_create_and_delete_overlapping_names() {
    let total = volumes();
    // With the report cache on, as deployed: repeated creates are
    // answered from it.
    let d = TestDriver::start(
        "many",
        128 * MIB,
        "overprovision_ratio = 20.0\nreport_max_age_secs = 10",
    )
    .await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut clients: Vec<ControllerClient<Channel>> = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(d.controller().await);
    }
    let name = |i: usize| format!("many-{i:03}");

    let t = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let (seen, client) = (seen.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            for i in names_of(c, total) {
                let req = create_req(&name(i), MIB, block_cap());
                let v = until_done(&seen, "CreateVolume", i, || {
                    let (mut client, req) = (client.clone(), req.clone());
                    async move { client.create_volume(req).await }
                })
                .await;
                if let Some(v) = v.and_then(|v| v.volume) {
                    seen.lock()
                        .unwrap()
                        .ids
                        .entry(i)
                        .or_default()
                        .insert(v.volume_id);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let created = t.elapsed();
    {
        let s = seen.lock().unwrap();
        assert!(
            s.wrong.is_empty(),
            "answers other than OK or ABORTED:\n{}",
            s.wrong.join("\n")
        );
        for i in 0..total {
            let ids = s.ids.get(&i).cloned().unwrap_or_default();
            assert_eq!(
                ids.len(),
                1,
                "name {i}: every client got the same volume, got {ids:?}"
            );
        }
        let lvs_now: BTreeSet<String> = lvs(&d.vg)
            .thin_volumes("pool")
            .map(|lv| lv.name.clone())
            .collect();
        let ids: BTreeSet<String> = s.ids.values().flatten().cloned().collect();
        assert_eq!(lvs_now.len(), total, "exactly one LV per name");
        assert_eq!(
            lvs_now, ids,
            "the LVs are the volumes the clients were given"
        );
    }

    let t = Instant::now();
    let ids: BTreeMap<usize, String> = seen
        .lock()
        .unwrap()
        .ids
        .iter()
        .map(|(i, s)| (*i, s.iter().next().unwrap().clone()))
        .collect();
    let ids = Arc::new(ids);
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let (seen, client, ids) = (seen.clone(), client.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            for i in names_of(c, total) {
                let id = ids[&i].clone();
                until_done(&seen, "DeleteVolume", i, || {
                    let (mut client, req) = (client.clone(), del(&id));
                    async move { client.delete_volume(req).await }
                })
                .await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let deleted = t.elapsed();
    let s = seen.lock().unwrap();
    eprintln!(
        "{CLIENTS} clients, {total} names ({PER_NAME} clients each): created in {created:?}, deleted in {deleted:?}; answers {:?}",
        s.codes
    );
    assert!(
        s.wrong.is_empty(),
        "answers other than OK or ABORTED:\n{}",
        s.wrong.join("\n")
    );
    assert_eq!(lvs(&d.vg).thin_volumes("pool").count(), 0, "no LV is left");
    let pool_devs = pool_dm_names(&d.vg, "pool");
    let left: Vec<String> = dm_of_vg(&d.vg)
        .into_iter()
        .filter(|n| !pool_devs.contains(n))
        .collect();
    assert!(left.is_empty(), "device-mapper devices left: {left:?}");
    let records = d.state_dir().join("volumes");
    let files: Vec<_> = std::fs::read_dir(&records)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "record files left: {files:?}");
}

/// Sends `n` copies of a call at once; returns their codes.
async fn at_once<F, Fut, T>(n: usize, call: F) -> Vec<Code>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
    T: Send + 'static,
{
    let calls: Vec<_> = (0..n).map(|_| tokio::spawn(call())).collect();
    let mut codes = Vec::new();
    for c in calls {
        codes.push(match c.await.unwrap() {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        });
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_calls_on_one_volume_get_aborted() {
    let k = Kubelet::new("abort");
    let d = TestDriver::start("abort", 128 * MIB, &k.extra()).await;
    let c = d.controller().await;

    // Eight identical creates at once: one creates, the others are ABORTED.
    let codes = at_once(8, || {
        let mut c = c.clone();
        async move {
            c.create_volume(create_req("abort-vol", 16 * MIB, mount_cap("ext4")))
                .await
        }
    })
    .await;
    eprintln!("8 concurrent CreateVolume: {codes:?}");
    assert!(
        codes.iter().all(|c| matches!(c, Code::Ok | Code::Aborted)),
        "{codes:?}"
    );
    assert!(
        codes.contains(&Code::Ok) && codes.contains(&Code::Aborted),
        "{codes:?}"
    );
    assert_eq!(lvs(&d.vg).thin_volumes("pool").count(), 1, "one LV");
    let id = create(&d, "abort-vol", 16 * MIB, mount_cap("ext4")).await;

    // While NodeStage (mkfs) runs, every other call on the volume is
    // ABORTED; a call on another volume is not held up.
    let staging = k.staging("abort");
    let n = d.node().await;
    let stage = {
        let (mut n, id, staging) = (n.clone(), id.clone(), staging.clone());
        tokio::spawn(async move {
            n.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
                .await
        })
    };
    // Let the stage take the volume's guard first.
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Each answer counts only if the stage still ran after it came.
    let mut busy: Vec<(&str, Code)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut turn = 0;
    while !stage.is_finished() && Instant::now() < deadline {
        let (mut c, mut n) = (c.clone(), n.clone());
        let (what, got) = match turn % 3 {
            0 => (
                "ControllerExpandVolume",
                c.controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: id.clone(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: (20 * MIB) as i64,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await
                .err(),
            ),
            1 => ("DeleteVolume", c.delete_volume(del(&id)).await.err()),
            _ => (
                "NodeStageVolume",
                n.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
                    .await
                    .err(),
            ),
        };
        turn += 1;
        if !stage.is_finished() {
            busy.push((what, got.map(|s| s.code()).unwrap_or(Code::Ok)));
        }
    }
    stage
        .await
        .unwrap()
        .expect("the first NodeStageVolume succeeds");
    eprintln!("calls while NodeStageVolume ran: {busy:?}");
    assert!(
        busy.len() >= 3,
        "too few calls were made while NodeStageVolume ran: {busy:?}"
    );
    // The last answer may have raced the end of the stage.
    for (what, code) in &busy[..busy.len() - 1] {
        assert_eq!(
            *code,
            Code::Aborted,
            "{what} during NodeStageVolume: {busy:?}"
        );
    }
    // Afterwards the same calls succeed.
    let mut n = n;
    n.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4")))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    let mut c = c;
    c.delete_volume(del(&id)).await.unwrap();
}
