//! LUKS2 encryption (issue 24, part 1): the key comes with NodeStageVolume
//! and goes nowhere else; a wrong key is refused and changes nothing; the
//! filesystem lives inside the mapping, grows with the LV, and travels
//! with snapshots and clones; raw block publishes the opened device;
//! discards pass only where the class allows; key rotation survives a kill
//! at any point; a killed first stage and a reboot both end in a volume
//! kubelet's next stage opens.
//!
//! Key slots use pbkdf2 at its minimum cost ([`encryption_table`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thinpool_csi::node::crypt::mapping_name;
use thinpool_csi::node::marker::UNFINISHED;
use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::proto::encryptionkeyrotation::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient;
use thinpool_csi::proto::encryptionkeyrotation::EncryptionKeyRotateRequest;
use tonic::Code;

use crate::fixtures::{
    block_cap, controller_reclaim, create_volume, crypt_mapping, encrypted_req, encryption_table,
    heal, keyed_stage, mount_cap, node_reclaim, publish_req, read_at, secrets, snap_req, stage_req,
    unpublish_req, unstage_req, write_at, Kubelet, KEY,
};
use crate::harness::{dm_devices, dm_name, dmsetup, lvm, rdev_of, TestDriver, MIB};

const OTHER: &str = "tr0ub4dor&3 is not the key";

/// The driver's config for these tests: the kubelet root, and key slots
/// cheap to derive.
fn crypt_extra(k: &Kubelet, discards: bool) -> String {
    format!("{}{}", k.extra(), encryption_table(discards))
}

/// What the tests start from: a kubelet directory, a driver of
/// `pool` bytes on [`crypt_extra`]'s config, an encrypted volume `pvc` of
/// `bytes` made for `cap`, and that volume's staging directory.
async fn ground(
    name: &str,
    pool: u64,
    discards: bool,
    pvc: &str,
    bytes: u64,
    cap: VolumeCapability,
) -> (Kubelet, TestDriver, String, PathBuf) {
    let k = Kubelet::new(name);
    let d = TestDriver::start(name, pool, &crypt_extra(&k, discards)).await;
    let id = create_volume(&mut d.controller().await, encrypted_req(pvc, bytes, cap))
        .await
        .volume_id;
    let staging = k.staging(pvc);
    (k, d, id, staging)
}

/// The LV's device node (LVM makes it when it activates the LV).
fn lv_node(d: &TestDriver, id: &str) -> PathBuf {
    Path::new("/dev/mapper").join(dm_name(&d.vg, id))
}

fn lv_active(d: &TestDriver, id: &str) -> bool {
    let name = dm_name(&d.vg, id);
    dm_devices().iter().any(|(n, _)| *n == name)
}

/// Whether `pass` opens a key slot of the volume's LV (activated for the
/// check when it is not active, and left as found).
fn opens_with(d: &TestDriver, id: &str, pass: &str) -> bool {
    use std::io::Write;
    let was = lv_active(d, id);
    let lv = format!("{}/{id}", d.vg);
    if !was {
        lvm(&["lvchange", "-ay", "-K", &lv]);
    }
    let mut child = std::process::Command::new("cryptsetup")
        .args([
            "open",
            "--type",
            "luks2",
            "--test-passphrase",
            "--key-file=-",
        ])
        .arg(lv_node(d, id))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(pass.as_bytes())
        .unwrap();
    let ok = child.wait().unwrap().success();
    if !was {
        lvm(&["lvchange", "-an", &lv]);
    }
    ok
}

/// Whether `bytes` hold `needle`.
fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Reads every process's command line and environment until stopped;
/// the processes in which one of `needles` was seen.
struct ProcWatch {
    stop: Arc<AtomicBool>,
    seen: std::thread::JoinHandle<Vec<String>>,
}

impl ProcWatch {
    fn start(needles: &[&'static str]) -> ProcWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let me = std::process::id().to_string();
        let needles = needles.to_vec();
        let seen = std::thread::spawn(move || {
            let mut found = Vec::new();
            while !s.load(Ordering::Relaxed) {
                for e in std::fs::read_dir("/proc").unwrap().flatten() {
                    let pid = e.file_name().to_string_lossy().into_owned();
                    if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
                        continue;
                    }
                    for f in ["cmdline", "environ"] {
                        let bytes = std::fs::read(e.path().join(f)).unwrap_or_default();
                        if needles.iter().any(|n| holds(&bytes, n)) {
                            found.push(format!("{pid}/{f}: {}", String::from_utf8_lossy(&bytes)));
                        }
                    }
                }
            }
            found
        });
        ProcWatch { stop, seen }
    }

    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.seen.join().unwrap()
    }
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            out.extend(files_holding(&p, needle));
        } else if meta.is_file() && holds(&std::fs::read(&p).unwrap_or_default(), needle) {
            out.push(p);
        }
    }
    out
}

/// No process was `seen` with a key ([`ProcWatch::finish`]), and none of
/// `keys` is in the driver's log (every start's) or in a file under its
/// state_dir.
#[track_caller]
fn assert_no_key_leaks(d: &TestDriver, seen: Vec<String>, keys: &[&str]) {
    assert!(seen.is_empty(), "a key in a process: {seen:?}");
    let log = d.log();
    for key in keys {
        assert!(!log.contains(key), "the key {key:?} in the driver's log");
        let holding = files_holding(&d.state_dir(), key);
        assert!(holding.is_empty(), "the key {key:?} in {holding:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_opens_what_it_formatted_a_wrong_one_changes_nothing_and_no_key_leaks() {
    let cap = mount_cap("ext4");
    let (_k, d, id, staging) =
        ground("crypt", 128 * MIB, false, "pvc-enc", 40 * MIB, cap.clone()).await;
    let mut n = d.node().await;

    // No secret: INVALID_ARGUMENT naming the StorageClass parameter.
    let e = n
        .node_stage_volume(stage_req(&id, &staging, cap.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("node-stage-secret-name"), "{e:?}");
    assert!(crypt_mapping(&id).is_none() && !lv_active(&d, &id));

    let watch = ProcWatch::start(&[KEY]);
    n.node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
        .await
        .unwrap();
    // The formatting marker means one thing, a format an earlier call
    // began and did not finish: a first stage that nothing cut (LUKS2,
    // then ext4 inside under the marker it wrote itself) warns of none.
    let log = d.log();
    assert!(!log.contains(UNFINISHED), "a false alarm:\n{log}");
    assert!(
        log.contains("formatting the filesystem inside the LUKS2 this stage wrote"),
        "{log}"
    );
    let dump = std::process::Command::new("cryptsetup")
        .arg("luksDump")
        .arg(lv_node(&d, &id))
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert!(
        dump.lines()
            .any(|l| l.starts_with("Version:") && l.trim_end().ends_with('2')),
        "{dump}"
    );
    let crypt = crypt_mapping(&id).expect("the mapping is open while staged");
    let mounted = std::fs::metadata(&staging).unwrap();
    assert_eq!(
        (
            nix::sys::stat::major(std::os::unix::fs::MetadataExt::dev(&mounted)) as u32,
            nix::sys::stat::minor(std::os::unix::fs::MetadataExt::dev(&mounted)) as u32
        ),
        crypt,
        "the filesystem is the mapping's"
    );
    std::fs::write(staging.join("data"), b"sealed words").unwrap();
    nix::unistd::sync();
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    assert!(crypt_mapping(&id).is_none(), "unstage closes the mapping");
    assert!(!lv_active(&d, &id), "and deactivates the LV");

    // A wrong key: UNAUTHENTICATED, and the volume stays as it was.
    let e = n
        .node_stage_volume(keyed_stage(&id, &staging, cap.clone(), OTHER))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(!e.message().contains(OTHER), "{e:?}");
    assert!(crypt_mapping(&id).is_none() && !lv_active(&d, &id));
    assert!(std::fs::read_dir(&staging).unwrap().next().is_none());

    // The right one: the data is there.
    n.node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(staging.join("data")).unwrap(),
        b"sealed words"
    );
    // A retried stage with another key is refused too.
    let e = n
        .node_stage_volume(keyed_stage(&id, &staging, cap.clone(), OTHER))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    assert!(crypt_mapping(&id).is_none());

    assert_no_key_leaks(&d, watch.finish(), &[KEY]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_encrypted_volume_grows_online_and_its_copies_open_with_its_key() {
    let cap = mount_cap("ext4");
    let (k, d, id, staging) = ground(
        "cryptgrow",
        256 * MIB,
        false,
        "pvc-grow",
        32 * MIB,
        cap.clone(),
    )
    .await;
    let mut c = d.controller().await;
    let mut n = d.node().await;
    n.node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
        .await
        .unwrap();
    std::fs::write(staging.join("data"), b"travels with copies").unwrap();
    nix::unistd::sync();
    let before = nix::sys::statvfs::statvfs(&staging).unwrap();

    c.controller_expand_volume(ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: (64 * MIB) as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let grown = n
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            staging_target_path: staging.display().to_string(),
            capacity_range: Some(CapacityRange {
                required_bytes: (64 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, (64 * MIB) as i64, "the LV's size");
    let after = nix::sys::statvfs::statvfs(&staging).unwrap();
    let bytes = |s: &nix::sys::statvfs::Statvfs| s.blocks() * s.fragment_size();
    eprintln!(
        "MEASURE encrypted ext4 grew online from {} to {} bytes",
        bytes(&before),
        bytes(&after)
    );
    assert!(
        bytes(&after) >= bytes(&before) + 28 * MIB,
        "{} -> {}",
        bytes(&before),
        bytes(&after)
    );

    // A snapshot's restore and a clone: the same bytes, the same key. The
    // file is written right before the snapshot and never synced: the
    // driver freezes the mapping's filesystem around lvcreate (LVM's own
    // suspend of the LV below reaches no filesystem).
    std::fs::write(staging.join("late"), b"written just before").unwrap();
    let snap = c
        .create_snapshot(snap_req("snap-enc", &id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id;
    let from = |source: volume_content_source::Type| VolumeContentSource {
        r#type: Some(source),
    };
    let mut restore = encrypted_req("pvc-restore", 64 * MIB, cap.clone());
    restore.volume_content_source = Some(from(volume_content_source::Type::Snapshot(
        volume_content_source::SnapshotSource {
            snapshot_id: snap.clone(),
        },
    )));
    let mut plain = restore.clone();
    plain.name = "pvc-plain-restore".into();
    plain.parameters.remove("encrypted");
    let e = c.create_volume(plain).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let restored = create_volume(&mut c, restore).await.volume_id;
    let mut clone = encrypted_req("pvc-clone", 64 * MIB, cap.clone());
    clone.volume_content_source = Some(from(volume_content_source::Type::Volume(
        volume_content_source::VolumeSource {
            volume_id: id.clone(),
        },
    )));
    let cloned = create_volume(&mut c, clone).await.volume_id;
    for copy in [&restored, &cloned] {
        let st = k.staging(copy);
        n.node_stage_volume(keyed_stage(copy, &st, cap.clone(), KEY))
            .await
            .unwrap_or_else(|e| panic!("stage {copy}: {e:?}"));
        assert_eq!(
            std::fs::read(st.join("data")).unwrap(),
            b"travels with copies"
        );
        if *copy == restored {
            assert_eq!(
                std::fs::read(st.join("late")).unwrap(),
                b"written just before"
            );
        }
        n.node_unstage_volume(unstage_req(copy, &st)).await.unwrap();
        assert!(crypt_mapping(copy).is_none());
    }
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_raw_block_volume_publishes_the_opened_device() {
    let (k, d, id, staging) = ground(
        "cryptblk",
        96 * MIB,
        false,
        "pvc-blk",
        24 * MIB,
        block_cap(),
    )
    .await;
    let target = k.target("pod-blk");
    let mut n = d.node().await;
    n.node_stage_volume(keyed_stage(&id, &staging, block_cap(), KEY))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &staging, &target, block_cap(), false))
        .await
        .unwrap();
    let crypt = crypt_mapping(&id).expect("open while staged");
    assert_eq!(rdev_of(&target), Some(crypt), "the target is the mapping");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    write_at(&target, 0, &pattern).unwrap();
    assert_eq!(read_at(&target, 0, 4096), pattern);
    // On the LV, past the LUKS2 header, the same block is ciphertext.
    let offset = dmsetup(&["table", &mapping_name(&id)])
        .unwrap()
        .split_whitespace()
        .nth(7)
        .and_then(|o| o.parse::<u64>().ok())
        .expect("dmsetup table of a crypt target: start len crypt cipher key iv dev offset");
    let raw = read_at(&lv_node(&d, &id), offset * 512, 4096);
    assert_ne!(raw, pattern, "the LV holds the data encrypted");
    // An unstage at a path it is not staged at changes nothing: the
    // published mapping stays open.
    let elsewhere = k.staging("not-here");
    n.node_unstage_volume(unstage_req(&id, &elsewhere))
        .await
        .unwrap();
    assert_eq!(crypt_mapping(&id), Some(crypt));
    assert_eq!(read_at(&target, 0, 4096), pattern);
    n.node_unpublish_volume(unpublish_req(&id, &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    assert!(crypt_mapping(&id).is_none() && !lv_active(&d, &id));
}

/// ReclaimSpace through dm-crypt: only where the class lets discards
/// through, and truthfully nothing elsewhere.
async fn reclaim_through_the_mapping(discards: bool) -> (u64, u64) {
    let name = if discards { "cryptdisc" } else { "cryptnodisc" };
    let cap = mount_cap("ext4");
    let (_k, d, id, staging) =
        ground(name, 128 * MIB, discards, "pvc-trim", 48 * MIB, cap.clone()).await;
    let mut n = d.node().await;
    n.node_stage_volume(keyed_stage(&id, &staging, cap, KEY))
        .await
        .unwrap();
    let crypt = crypt_mapping(&id).unwrap();
    let limit = std::fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/queue/discard_max_bytes",
        crypt.0, crypt.1
    ))
    .unwrap();
    assert_eq!(limit.trim() != "0", discards, "discard_max_bytes {limit}");
    std::fs::write(staging.join("big"), vec![0x5a; (16 * MIB) as usize]).unwrap();
    nix::unistd::sync();
    std::fs::remove_file(staging.join("big")).unwrap();
    nix::unistd::sync();
    let (pre, post) = node_reclaim(&d, &id, &staging).await;
    eprintln!("RECLAIM encrypted, allow_discards={discards}: pre {pre} post {post}");
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    controller_reclaim_leaves_it_closed(&d, &id).await;
    (pre, post)
}

/// Unstaged, its LV inactive: ControllerReclaimSpace trims nothing (the
/// controller holds no key), answers the usage LVM shows once the LV is
/// active, opens no mapping and leaves the LV inactive.
async fn controller_reclaim_leaves_it_closed(d: &TestDriver, id: &str) {
    let lv = |d: &TestDriver| crate::harness::lvs(&d.vg).find(id).cloned().unwrap();
    assert!(!lv(d).is_active());
    let (pre, post) = controller_reclaim(d, id).await;
    assert!(pre > 0 && post == pre, "nothing trimmed: {pre} -> {post}");
    assert!(crypt_mapping(id).is_none() && !lv(d).is_active());
}

#[tokio::test(flavor = "multi_thread")]
async fn reclaim_passes_the_mapping_only_where_the_class_allows_discards() {
    let (pre, post) = reclaim_through_the_mapping(true).await;
    assert!(post + 8 * MIB < pre, "trimmed: {pre} -> {post}");
    let (pre, post) = reclaim_through_the_mapping(false).await;
    assert!(pre >= 16 * MIB, "{pre}");
    assert!(post >= pre, "nothing trimmed, and said so: {pre} -> {post}");
}

async fn rotate(d: &TestDriver, id: &str, current: &str, new: &str) -> Result<(), tonic::Status> {
    let mut r = EncryptionKeyRotationControllerClient::connect(d.addons_uri())
        .await
        .unwrap();
    r.encryption_key_rotate(EncryptionKeyRotateRequest {
        volume_id: id.into(),
        encryption_key: new.into(),
        secrets: secrets(current),
        ..Default::default()
    })
    .await
    .map(|_| ())
}

/// As the csi-addons sidecar calls it, on a volume staged at `staging`
/// that [`KEY`] opens: the node-stage Secret as secrets, no
/// encryption_key; the Secret's nextPassphrase is the new key ([`OTHER`]).
/// Without nextPassphrase the rotation is INVALID_ARGUMENT. A stage with
/// that Secret opens the volume after (passphrase refused, nextPassphrase
/// taken), and one whose Secret was promoted (the old key as
/// previousPassphrase) too.
async fn sidecar_rotation(d: &TestDriver, id: &str, staging: &Path) {
    let mut r = EncryptionKeyRotationControllerClient::connect(d.addons_uri())
        .await
        .unwrap();
    let secret: HashMap<String, String> = [
        ("passphrase".to_string(), KEY.to_string()),
        ("nextPassphrase".to_string(), OTHER.to_string()),
    ]
    .into();
    let sidecar = |secrets: HashMap<String, String>| EncryptionKeyRotateRequest {
        volume_id: id.into(),
        secrets,
        ..Default::default()
    };
    let e = r
        .encryption_key_rotate(sidecar(secrets(KEY)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("nextPassphrase"), "{e:?}");
    r.encryption_key_rotate(sidecar(secret.clone()))
        .await
        .unwrap();
    assert!(opens_with(d, id, OTHER) && !opens_with(d, id, KEY));
    let mut n = d.node().await;
    for secrets in [
        secret,
        [
            ("passphrase".to_string(), "not it".to_string()),
            ("previousPassphrase".to_string(), OTHER.to_string()),
        ]
        .into(),
    ] {
        n.node_unstage_volume(unstage_req(id, staging))
            .await
            .unwrap();
        let mut restage = stage_req(id, staging, block_cap());
        restage.secrets = secrets;
        n.node_stage_volume(restage).await.unwrap();
    }
}

/// Rotations between [`KEY`] (the volume's key now) and [`OTHER`], each
/// cut by a kill of the driver at a fraction of `whole` (how long a
/// rotation takes here) and retried after the restart: one key opens the
/// volume after each kill, and only the new one after each retry. What
/// each kill met: (ms after the call, old key opens, new key opens).
async fn rotations_cut_by_kills(
    d: &mut TestDriver,
    id: &str,
    whole: Duration,
) -> Vec<(u128, bool, bool, bool)> {
    let (mut current, mut new) = (KEY, OTHER);
    let mut states: Vec<(u128, bool, bool, bool)> = Vec::new();
    let mut plan: std::collections::VecDeque<u32> =
        [0u32, 5, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 24].into();
    // A rotation can take longer than the one timed (under TCG the wipe
    // once took more than 1.2 times as long): later kills, until one
    // lands after the wipe.
    let mut later = [30u32, 40, 60, 80].into_iter();
    while let Some(twentieth) = plan.pop_front() {
        let delay = whole * twentieth / 20;
        let uri = d.addons_uri();
        let (i, cur, nw) = (id.to_string(), current.to_string(), new.to_string());
        let call = tokio::spawn(async move {
            // The driver may be gone before the call reaches it.
            let Ok(mut r) = EncryptionKeyRotationControllerClient::connect(uri).await else {
                return;
            };
            let _ = r
                .encryption_key_rotate(EncryptionKeyRotateRequest {
                    volume_id: i,
                    encryption_key: nw,
                    secrets: secrets(&cur),
                    ..Default::default()
                })
                .await;
        });
        tokio::time::sleep(delay).await;
        // Whether the rotation had answered before the kill: a kill after
        // it cut nothing.
        let answered = call.is_finished();
        d.kill9_with_children();
        let _ = call.await;
        let (old_opens, new_opens) = (opens_with(d, id, current), opens_with(d, id, new));
        states.push((delay.as_millis(), old_opens, new_opens, answered));
        assert!(
            old_opens || new_opens,
            "killed after {delay:?}: neither key opens"
        );
        d.spawn_and_heal().await;
        rotate(d, id, current, new)
            .await
            .unwrap_or_else(|e| panic!("the retry after {delay:?}: {e:?}"));
        assert!(opens_with(d, id, new) && !opens_with(d, id, current));
        (current, new) = (new, current);
        if plan.is_empty() && !states.iter().any(|s| !s.1 && s.2) {
            plan.extend(later.next());
        }
    }
    states
}

#[tokio::test(flavor = "multi_thread")]
async fn key_rotation_killed_at_any_point_leaves_a_volume_one_key_opens() {
    let (k, mut d, id, staging) = ground(
        "cryptrot",
        96 * MIB,
        false,
        "pvc-rot",
        24 * MIB,
        block_cap(),
    )
    .await;
    // Neither passphrase in a process through the first rotations (the
    // watch ends before the timed one, whose time places the kills).
    let watch = ProcWatch::start(&[KEY, OTHER]);
    d.node()
        .await
        .node_stage_volume(keyed_stage(&id, &staging, block_cap(), KEY))
        .await
        .unwrap();
    rotate(&d, &id, KEY, OTHER).await.unwrap();
    assert!(opens_with(&d, &id, OTHER) && !opens_with(&d, &id, KEY));
    // The old key no longer authenticates a rotation.
    let e = rotate(&d, &id, KEY, "a third key").await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(opens_with(&d, &id, OTHER) && !opens_with(&d, &id, "a third key"));
    let seen = watch.finish();

    // A key an interrupted earlier rotation added (by hand here) is wiped
    // by the next rotation: only the new key opens afterwards.
    let stray = k.path("stray-key");
    std::fs::write(&stray, "a stray key").unwrap();
    let mut add = std::process::Command::new("cryptsetup")
        .args(["luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "--key-file=-"])
        .arg(lv_node(&d, &id))
        .arg(&stray)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut add.stdin.take().unwrap(), OTHER.as_bytes()).unwrap();
    assert!(add.wait().unwrap().success());
    assert!(opens_with(&d, &id, "a stray key"));
    let t = std::time::Instant::now();
    rotate(&d, &id, OTHER, KEY).await.unwrap();
    // How long a whole rotation takes here (with a slot to wipe), so the
    // kills below land before, between and after its steps.
    let whole = t.elapsed();
    eprintln!("MEASURE key rotation took {whole:?}");
    assert!(opens_with(&d, &id, KEY) && !opens_with(&d, &id, OTHER));
    assert!(
        !opens_with(&d, &id, "a stray key"),
        "every other slot is wiped"
    );

    sidecar_rotation(&d, &id, &staging).await;
    rotate(&d, &id, OTHER, KEY).await.unwrap();
    let states = rotations_cut_by_kills(&mut d, &id, whole).await;
    eprintln!(
        "MEASURE key rotation killed at (ms, old opens, new opens, answered before the kill): {states:?}"
    );
    // Kills cut the rotation before the new key was added and between the
    // add and the wipe (both keys open), while it ran; and one met the
    // volume after the wipe.
    assert!(states.iter().any(|s| s.1 && !s.2 && !s.3), "{states:?}");
    assert!(states.iter().any(|s| s.1 && s.2 && !s.3), "{states:?}");
    assert!(states.iter().any(|s| !s.1 && s.2), "{states:?}");
    // Still staged through it all; unstage closes the mapping.
    d.node()
        .await
        .node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    assert!(crypt_mapping(&id).is_none());
    // Through every rotation, kill and restart: neither passphrase in the
    // driver's log or its state_dir.
    assert_no_key_leaks(&d, seen, &[KEY, OTHER]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_first_stage_and_a_reboot_end_in_a_volume_the_next_stage_opens() {
    let k = Kubelet::new("cryptcrash");
    let mut d = TestDriver::start("cryptcrash", 192 * MIB, &crypt_extra(&k, false)).await;
    let cap = mount_cap("ext4");
    // Kill the driver while it formats (LUKS2, then ext4 inside), at
    // several points; kubelet's retry after the restart must stage it.
    let mut cut = Vec::new();
    for (i, delay) in [30u64, 150, 300, 500, 800, 1200].into_iter().enumerate() {
        let name = format!("pvc-crash-{i}");
        let mut c = d.controller().await;
        let id = create_volume(&mut c, encrypted_req(&name, 24 * MIB, cap.clone()))
            .await
            .volume_id;
        let staging = k.staging(&name);
        let mut n = d.node().await;
        let (req, mut nn) = (keyed_stage(&id, &staging, cap.clone(), KEY), n.clone());
        let call = tokio::spawn(async move { nn.node_stage_volume(req).await });
        tokio::time::sleep(Duration::from_millis(delay)).await;
        d.kill9_with_children();
        let _ = call.await;
        // Whether the kill cut a format: its marker stays until mkfs ends.
        let marker = d.state_dir().join("formatting").join(&id).exists();
        cut.push((delay, marker, crypt_mapping(&id).is_some()));
        d.spawn_and_heal().await;
        n = d.node().await;
        let mut tries = 0;
        loop {
            match n
                .node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
                .await
            {
                Ok(_) => break,
                Err(e) if e.code() == Code::Aborted && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!(
                    "stage after a kill at {delay} ms: {e:?}\n{}",
                    d.log_tail(30)
                ),
            }
        }
        // Exactly one warning of an unfinished format for a stage the
        // kill cut inside its format (the marker stayed), none otherwise:
        // the retry's own filesystem inside its new LUKS2 is not one.
        let warned = d
            .log()
            .lines()
            .filter(|l| l.contains(UNFINISHED) && l.contains(id.as_str()))
            .count();
        assert_eq!(
            warned,
            usize::from(marker),
            "kill at {delay} ms, marker left: {marker}\n{}",
            d.log_tail(30)
        );
        std::fs::write(staging.join("f"), b"after the crash").unwrap();
        n.node_unstage_volume(unstage_req(&id, &staging))
            .await
            .unwrap();
        assert!(
            crypt_mapping(&id).is_none(),
            "nothing stays open after unstage"
        );
        n.node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read(staging.join("f")).unwrap(),
            b"after the crash"
        );
        n.node_unstage_volume(unstage_req(&id, &staging))
            .await
            .unwrap();
    }

    eprintln!("MEASURE first stage killed at (ms, format unfinished, mapping open): {cut:?}");
    assert!(
        cut.iter().any(|c| c.1),
        "no kill landed inside a format: {cut:?}"
    );

    // A reboot: mounts, mappings and activations are gone; the start-up
    // heal cannot re-open without the key and says so; kubelet's stage does.
    let mut c = d.controller().await;
    let id = create_volume(&mut c, encrypted_req("pvc-reboot", 24 * MIB, cap.clone()))
        .await
        .volume_id;
    let staging = k.staging("pvc-reboot");
    let target = k.target("pod-reboot");
    let mut n = d.node().await;
    n.node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &staging, &target, cap.clone(), false))
        .await
        .unwrap();
    std::fs::write(target.join("f"), b"survives a reboot").unwrap();
    nix::unistd::sync();
    d.kill9();
    crate::harness::umount_all_under(k.root.path());
    let closed = std::process::Command::new("cryptsetup")
        .args(["close", &mapping_name(&id)])
        .status()
        .unwrap();
    assert!(closed.success());
    lvm(&["lvchange", "-an", &format!("{}/{id}", d.vg)]);
    d.spawn_and_heal().await;
    let (abnormal, message) = heal(&d, &id, &target, &staging, None).await;
    assert!(abnormal && message.contains("closed"), "{message}");
    assert!(crypt_mapping(&id).is_none());
    n = d.node().await;
    n.node_stage_volume(keyed_stage(&id, &staging, cap.clone(), KEY))
        .await
        .unwrap();
    n.node_publish_volume(publish_req(&id, &staging, &target, cap.clone(), false))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(target.join("f")).unwrap(),
        b"survives a reboot"
    );
    n.node_unpublish_volume(unpublish_req(&id, &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    assert!(crypt_mapping(&id).is_none() && !lv_active(&d, &id));

    // A mapping of the driver's name that no record names (what a killed
    // failing stage can leave) is closed at start-up.
    lvm(&["lvchange", "-ay", "-K", &format!("{}/{id}", d.vg)]);
    let mut open = std::process::Command::new("cryptsetup")
        .args(["open", "--type", "luks2", "--key-file=-"])
        .arg(lv_node(&d, &id))
        .arg(mapping_name(&id))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut open.stdin.take().unwrap(), KEY.as_bytes()).unwrap();
    assert!(open.wait().unwrap().success());
    assert!(crypt_mapping(&id).is_some());
    d.stop();
    d.spawn_and_heal().await;
    assert!(crypt_mapping(&id).is_none(), "{}", d.log_tail(20));
    assert!(d.log().contains("closed a crypt mapping no record names"));
}

/// `tpcsi` stages with a passphrase file and rotates with two, the
/// passphrases never on its command line.
#[tokio::test(flavor = "multi_thread")]
async fn tpcsi_stages_and_rotates_with_passphrase_files() {
    let (k, d, id, staging) = ground(
        "cryptcli",
        96 * MIB,
        false,
        "pvc-cli",
        24 * MIB,
        mount_cap("ext4"),
    )
    .await;
    let (old, new) = (k.path("old-key"), k.path("new-key"));
    // The file's bytes are the key, as in a Secret made --from-file.
    std::fs::write(&old, KEY).unwrap();
    std::fs::write(&new, OTHER).unwrap();
    let st = staging.display().to_string();
    let stage = |key: &Path| {
        let f = key.display().to_string();
        let out = crate::fixtures::tpcsi(&d, &["stage", &id, &st, "--passphrase-file", &f]);
        out.status.success()
    };
    assert!(stage(&old));
    assert!(crate::fixtures::tpcsi(&d, &["unstage", &id, &st])
        .status
        .success());
    let out = crate::fixtures::tpcsi(
        &d,
        &[
            "rotate-key",
            &id,
            "--passphrase-file",
            &old.display().to_string(),
            "--new-passphrase-file",
            &new.display().to_string(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(opens_with(&d, &id, OTHER) && !opens_with(&d, &id, KEY));
    assert!(!stage(&old), "the old key is refused");
    assert!(stage(&new));
    assert!(crate::fixtures::tpcsi(&d, &["unstage", &id, &st])
        .status
        .success());
    assert!(crypt_mapping(&id).is_none() && !lv_active(&d, &id));
}
