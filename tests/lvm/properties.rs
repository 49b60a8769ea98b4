//! Property tests (proptest) over every request type the driver serves,
//! against the real binary: random and adversarial names, ids, paths,
//! sizes, parameters, mount flags and secrets. After every case:
//!
//! - the driver still runs (no panic; its log never says "panicked");
//! - an error carries a proper code: never UNKNOWN, INTERNAL or a
//!   transport error for what a client sent;
//! - no hostile request gets OK: an id or name with a control character
//!   or over CSI's 128 bytes ([`hostile_text`]), and for a stage or
//!   publish a path that is not absolute, holds a NUL or `..`, is not
//!   strictly under the allowed root or goes through one of the world's
//!   symlinks out of it ([`hostile_path`]);
//! - nothing changed outside the driver's own work: the mount table, and
//!   a tree listing of a sentinel directory outside `allowed_roots` that
//!   the adversarial paths aim at (`..`, symlinks, absolute paths); after
//!   each request type, the LVs (`lvs`) are the fixtures' ones;
//! - no secret value sent appears in the driver's log.
//!
//! Whatever a case made (a volume, a stage, a publish) is undone by the
//! case itself. `TPCSI_PROPTEST_CASES` (default 64) sets the cases per
//! request type, `TPCSI_PROPTEST_SEED` replays a run. One test per
//! service (the Controller's in two), each on a driver of its own
//! ([`prop_ground`]).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use proptest::collection::{hash_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use thinpool_csi::mountinfo::MountInfo;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use thinpool_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
use thinpool_csi::proto::healer::NodeHealerRequest;
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::{ControllerReclaimSpaceRequest, NodeReclaimSpaceRequest};
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::fixtures::{block_cap, create, mount_cap, s, snapshot, Kubelet};
use crate::harness::{lvs, TestDriver, MIB};

/// Cases per request type.
fn cases() -> u32 {
    std::env::var("TPCSI_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Codes a request may be answered with, whatever it holds.
const PROPER: &[Code] = &[
    Code::Ok,
    Code::InvalidArgument,
    Code::NotFound,
    Code::AlreadyExists,
    Code::FailedPrecondition,
    Code::OutOfRange,
    Code::ResourceExhausted,
    Code::Aborted,
    Code::Unimplemented,
];

/// What the cases aim at: the driver's own fixtures and the places
/// outside its reach.
#[derive(Clone)]
struct World {
    vg: String,
    root: PathBuf,
    sentinel: PathBuf,
    fs_vol: String,
    blk_vol: String,
    snap: String,
}

/// Any string: arbitrary characters, a little longer than CSI's limit.
fn any_string() -> impl Strategy<Value = String> {
    prop_oneof![".{0,40}", ".{100,140}", "[a-z0-9/._-]{0,20}"]
}

/// A volume id: the classics, random strings, id-shaped strings, and
/// (rarely) the real ones.
fn id(w: &World, real: bool) -> BoxedStrategy<String> {
    let vg = w.vg.clone();
    let classics = vec![
        String::new(),
        "vg/root".into(),
        format!("{vg}/root"),
        "pool".into(),
        format!("{vg}/pool"),
        format!("/dev/{vg}/pool"),
        "../x".into(),
        "--yes".into(),
        "-an".into(),
        "csi-".into(),
        "snap-".into(),
        "a\0b".into(),
        "x\ny".into(),
        "x".repeat(128),
        "x".repeat(129),
        "x".repeat(10_000),
    ];
    // Ids of our shape, with class prefixes of every shape (a class this
    // node lacks, `default` spelled out, odd characters).
    let shaped =
        "((fast|default|Fast|a_b|-x|[a-z.;/]{1,6})\\.)?(csi|snap|grp)-[a-z0-9-]{0,12}-[0-9a-f]{16}";
    if real {
        let reals = vec![w.fs_vol.clone(), w.blk_vol.clone(), w.snap.clone()];
        prop_oneof![
            4 => proptest::sample::select(classics),
            4 => any_string(),
            2 => shaped.prop_map(|s| s),
            3 => proptest::sample::select(reals),
        ]
        .boxed()
    } else {
        prop_oneof![
            4 => proptest::sample::select(classics),
            4 => any_string(),
            2 => shaped.prop_map(|s| s),
        ]
        .boxed()
    }
}

/// A CO name for something new: classics, random, and id-like ones.
fn name(w: &World) -> BoxedStrategy<String> {
    let vg = w.vg.clone();
    prop_oneof![
        2 => proptest::sample::select(vec![
            String::new(),
            "pool".into(),
            format!("{vg}/root"),
            "../../etc/passwd".into(),
            "n".repeat(128),
            "n".repeat(129),
            "a,b=c\nd".into(),
        ]),
        3 => any_string(),
    ]
    .boxed()
}

/// A staging or target path: inside the roots, through `..` and symlinks
/// out of them, `/proc`, `/sys`, `/dev`, relative, very long, odd bytes.
fn path(w: &World) -> BoxedStrategy<String> {
    let (r, sen) = (s(&w.root), s(&w.sentinel));
    let classics = vec![
        String::new(),
        "relative/x".into(),
        "/".into(),
        "/proc".into(),
        "/proc/self/root".into(),
        "/proc/self/root/tmp".into(),
        "/sys/kernel".into(),
        "/dev".into(),
        "/dev/null".into(),
        "/etc".into(),
        format!("{r}"),
        format!("{r}/staging/../../etc"),
        format!("{r}/staging/.."),
        format!("{r}/escape/x"),
        format!("{r}/escape"),
        format!("{r}/proc-link/x"),
        format!("{r}/staging/a"),
        format!("{r}/staging/s1"),
        format!("{r}/staging/s1"),
        format!("{r}/pods/a/vol"),
        format!("{r}/pods/a/vol"),
        format!("{r}//staging/./a"),
        format!("{r}/staging/a\nb"),
        format!("{r}/staging/a\0b"),
        format!("{r}/{}", "p".repeat(200)),
        format!("{r}/{}", "p/".repeat(3000)),
        sen.clone(),
        format!("{sen}/new"),
        format!("{sen}/sub/file"),
    ];
    let under =
        "(staging|pods|escape|proc-link)/[a-z./]{0,12}".prop_map(move |s| format!("{r}/{s}"));
    prop_oneof![
        5 => proptest::sample::select(classics),
        3 => under,
        2 => any_string(),
    ]
    .boxed()
}

fn size() -> BoxedStrategy<Option<CapacityRange>> {
    let b = prop_oneof![
        Just(0i64),
        Just(-1),
        Just(1),
        Just(511),
        Just(MIB as i64),
        Just((4 * MIB) as i64),
        Just((4 * MIB + 1) as i64),
        Just(i64::MAX),
        Just(i64::MIN),
        any::<i64>(),
        (0i64..(64 * MIB) as i64),
        (0i64..(64 * MIB) as i64),
        (0i64..(64 * MIB) as i64),
    ];
    proptest::option::weighted(
        0.8,
        (b.clone(), prop_oneof![3 => Just(0i64), 1 => b]).prop_map(
            |(required_bytes, limit_bytes)| CapacityRange {
                required_bytes,
                limit_bytes,
            },
        ),
    )
    .boxed()
}

/// Map keys and values: the driver's own keys with hostile values, and
/// random keys with commas, `=` and newlines.
fn params(w: &World) -> BoxedStrategy<HashMap<String, String>> {
    let key = prop_oneof![
        Just("volumeGroup".to_string()),
        Just("thinPool".to_string()),
        Just("deviceClass".to_string()),
        Just("mkfsOptions".to_string()),
        Just("readAheadSectors".to_string()),
        Just("readIOPS".to_string()),
        Just("writeBytesPerSecond".to_string()),
        Just("csi.storage.k8s.io/pvc/name".to_string()),
        Just("csi.storage.k8s.io/volumesnapshot/name".to_string()),
        Just("--yes; lvremove -y vg".to_string()),
        Just("a,b=c\nd".to_string()),
        any_string(),
    ];
    let value = prop_oneof![
        Just(w.vg.clone()),
        Just("pool".to_string()),
        Just("default".to_string()),
        Just("fast".to_string()),
        Just("Fast; rm -rf /".to_string()),
        Just("vg0".to_string()),
        Just("../".to_string()),
        Just("auto".to_string()),
        Just("256".to_string()),
        Just("7".to_string()),
        Just("-b 4096 -L data".to_string()),
        Just("-O ^has_journal; rm".to_string()),
        Just("-- -F".to_string()),
        Just("-m reflink=0".to_string()),
        Just("-d /etc".to_string()),
        Just("-E root_owner=0:0,nodiscard".to_string()),
        Just("max".to_string()),
        Just("-5".to_string()),
        Just("1e6".to_string()),
        Just("18446744073709551616".to_string()),
        Just("a,b=c\nd".to_string()),
        Just("v".repeat(5000)),
        any_string(),
    ];
    prop_oneof![2 => Just(HashMap::new()), 1 => hash_map(key, value, 1..4)].boxed()
}

/// Mount flags: plain option words, and ones that smuggle options.
fn mount_flag() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(vec!["noatime", "nosuid", "nodev", "noexec", "relatime"])
            .prop_map(String::from),
        2 => proptest::sample::select(vec![
            "ro,exec",
            "uid=0",
            "a\nb",
            "x y",
            "",
            "noatime",
            "nosuid",
            "bind",
            "remount",
            "rw",
            "defaults",
            "context=\"system_u:object_r:tmp_t\"",
            "errors=panic",
            "dax",
            "discard",
            "data=journal",
            "commit=30",
            "commit=-1",
            "allocsize=1m",
            "norecovery",
            "data=journal,errors=panic",
        ])
        .prop_map(String::from),
        1 => any_string(),
    ]
}

fn capability() -> BoxedStrategy<Option<VolumeCapability>> {
    // Mostly modes and file systems the driver takes, so that many cases
    // get past validation into the volume layer.
    let mode = prop_oneof![
        6 => proptest::sample::select(vec![1i32, 2, 6, 7]),
        2 => 0i32..=7,
        1 => Just(99),
        1 => Just(-1),
    ];
    let fs = prop_oneof![
        6 => proptest::sample::select(vec!["", "ext4", "xfs"]).prop_map(String::from),
        2 => proptest::sample::select(vec![
            "",
            "ext4",
            "xfs",
            "btrfs",
            "ext4; rm -rf /",
            "../ext4"
        ])
        .prop_map(String::from),
        1 => any_string(),
    ];
    let mount = (
        fs,
        prop_oneof![2 => Just(vec![]), 1 => vec(mount_flag(), 1..3)],
        prop_oneof![8 => Just(String::new()), 1 => any_string()],
    )
        .prop_map(|(fs_type, mount_flags, volume_mount_group)| {
            AccessType::Mount(MountVolume {
                fs_type,
                mount_flags,
                volume_mount_group,
            })
        });
    let access = proptest::option::weighted(
        0.95,
        prop_oneof![Just(AccessType::Block(BlockVolume {})), mount],
    );
    proptest::option::weighted(
        0.95,
        (proptest::option::weighted(0.95, mode), access).prop_map(|(mode, access_type)| {
            VolumeCapability {
                access_mode: mode.map(|mode| AccessMode { mode }),
                access_type,
            }
        }),
    )
    .boxed()
}

/// A request's capabilities: mostly one, sometimes none or several.
fn caps() -> BoxedStrategy<Vec<Option<VolumeCapability>>> {
    prop_oneof![4 => vec(capability(), 1..=1), 1 => vec(capability(), 0..3)].boxed()
}

/// Secrets: every value is recorded, to be looked for in the log.
fn secrets(seen: Arc<Mutex<BTreeSet<String>>>) -> BoxedStrategy<HashMap<String, String>> {
    hash_map(
        prop_oneof![
            Just("password".to_string()),
            Just("token".to_string()),
            Just("passphrase".to_string()),
            "[a-z,=\n]{1,8}"
        ],
        any::<u64>().prop_map(|n| format!("TpSecret{n:016x}")),
        0..3,
    )
    .prop_map(move |m| {
        seen.lock().unwrap().extend(m.values().cloned());
        m
    })
    .boxed()
}

/// The mount table's mount points and a tree listing of the sentinel.
/// Mounts of other tests running beside this one (their own directories
/// under /tmp) are left out.
fn snapshot_of_host(root: &Path, sentinel: &Path) -> (Vec<String>, Vec<String>) {
    let mut mounts: Vec<String> = MountInfo::read()
        .unwrap()
        .mounts()
        .iter()
        .filter(|m| {
            !m.mount_point.starts_with("/tmp")
                || m.mount_point.starts_with(root)
                || m.mount_point.starts_with(sentinel)
        })
        .map(|m| format!("{} {}:{}", m.mount_point.display(), m.major, m.minor))
        .collect();
    mounts.sort();
    let mut tree = Vec::new();
    let mut todo = vec![sentinel.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            tree.push(format!(
                "{} {:?} {:o}",
                e.path().display(),
                m.file_type(),
                {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode()
                }
            ));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    tree.sort();
    (mounts, tree)
}

/// The clients of one driver.
#[derive(Clone)]
struct Clients {
    c: ControllerClient<Channel>,
    n: NodeClient<Channel>,
    g: GroupControllerClient<Channel>,
    m: SnapshotMetadataClient<Channel>,
    rn: ReclaimSpaceNodeClient<Channel>,
    rc: ReclaimSpaceControllerClient<Channel>,
    h: HealerNodeClient<Channel>,
}

/// An id or name no request may get OK for, whatever exists: a control
/// character, or more than CSI's 128 bytes.
fn hostile_text(s: &str) -> bool {
    s.len() > 128 || s.chars().any(char::is_control)
}

/// A staging or target path a stage or publish must refuse: empty or
/// relative, a NUL, a `..` component, longer than PATH_MAX, not strictly
/// under the allowed root, or through the world's symlinks out of it.
fn hostile_path(w: &World, p: &str) -> bool {
    let root = w.root.as_path();
    let path = Path::new(p);
    let normal: PathBuf = path.components().collect();
    p.len() > 4096
        || p.contains('\0')
        || !path.is_absolute()
        || path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        || normal == root
        || !normal.starts_with(root)
        || ["escape", "proc-link"]
            .iter()
            .any(|l| normal.starts_with(root.join(l)))
}

/// The code of a reply; a stream is read to its end.
fn code_of<T>(r: &Result<Response<T>, Status>) -> Code {
    r.as_ref().err().map(|s| s.code()).unwrap_or(Code::Ok)
}

/// The code that ends a server stream: its call's, or the last message's.
async fn drained<T>(got: Result<Response<tonic::Streaming<T>>, Status>) -> Code {
    let mut s = match got {
        Err(s) => return s.code(),
        Ok(s) => s.into_inner(),
    };
    loop {
        match s.message().await {
            Ok(Some(_)) => {}
            Ok(None) => return Code::Ok,
            Err(e) => return e.code(),
        }
    }
}

struct Runner<'a> {
    rt: &'a tokio::runtime::Runtime,
    world: World,
    clients: Clients,
    fixtures: BTreeSet<String>,
    seed: [u8; 32],
    total: u32,
    summary: Vec<String>,
}

impl Runner<'_> {
    /// Runs `cases()` cases of one request type: `call` sends the request
    /// and undoes what a success made, returning the code; a request
    /// `hostile` says is hostile must not get OK.
    fn run<S, H, F, Fut>(&mut self, what: &str, strategy: S, hostile: H, call: F)
    where
        S: Strategy,
        S::Value: std::fmt::Debug,
        H: Fn(&S::Value) -> bool,
        F: Fn(Clients, S::Value) -> Fut,
        Fut: Future<Output = Code>,
    {
        let config = Config {
            cases: cases(),
            failure_persistence: None,
            max_shrink_iters: 32,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &self.seed));
        let n = std::cell::Cell::new(0u32);
        let codes = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
        let t = Instant::now();
        let (rt, clients) = (self.rt, self.clients.clone());
        let (root, sentinel) = (self.world.root.clone(), self.world.sentinel.clone());
        // The first case that fails, as generated: once the driver is
        // gone every later case fails too, so shrinking may end on
        // another input.
        let first = std::cell::RefCell::new(None::<String>);
        let result = runner.run(&strategy, |req| {
            n.set(n.get() + 1);
            let before = snapshot_of_host(&root, &sentinel);
            let shown = format!("{req:?}");
            let bad = hostile(&req);
            let code = rt.block_on(call(clients.clone(), req));
            *codes.borrow_mut().entry(format!("{code:?}")).or_default() += 1;
            let after = snapshot_of_host(&root, &sentinel);
            if first.borrow().is_none()
                && (!PROPER.contains(&code) || before != after || (bad && code == Code::Ok))
            {
                *first.borrow_mut() = Some(format!("{code:?} for {shown}"));
            }
            prop_assert!(
                PROPER.contains(&code),
                "{what}: improper code {code:?} for {shown}"
            );
            prop_assert!(
                !(bad && code == Code::Ok),
                "{what}: OK for a hostile request {shown}"
            );
            prop_assert_eq!(
                &before.0,
                &after.0,
                "{}: the mount table changed for {}",
                what,
                shown
            );
            prop_assert_eq!(
                &before.1,
                &after.1,
                "{}: the sentinel tree changed for {}",
                what,
                shown
            );
            Ok(())
        });
        let elapsed = t.elapsed();
        if let Err(e) = result {
            panic!("{what}: first failing case: {:?}\n{e}", first.borrow());
        }
        let lvs_now: BTreeSet<String> = lvs(&self.world.vg)
            .thin_volumes("pool")
            .map(|lv| lv.name.clone())
            .collect();
        assert_eq!(
            lvs_now, self.fixtures,
            "{what}: LVs other than the fixtures are left"
        );
        self.total += n.get();
        let line = format!(
            "{what}: {} cases in {elapsed:.1?}, {:?}",
            n.get(),
            codes.borrow()
        );
        eprintln!("property {line}");
        self.summary.push(line);
    }
}

async fn cleanup_volume(c: &mut ControllerClient<Channel>, id: &str) {
    c.delete_volume(DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: HashMap::new(),
    })
    .await
    .unwrap_or_else(|e| panic!("clean-up of volume {id}: {e}"));
}

/// What the property tests start from: a runtime, a driver on a kubelet
/// directory of its own with a few directories and links in it, a
/// sentinel tree outside it that no request may touch, an ext4 and a
/// block volume and a snapshot (the fixtures every case must leave as
/// they are), clients, and the run's seed.
struct Prop {
    rt: tokio::runtime::Runtime,
    _k: Kubelet,
    d: TestDriver,
    _sentinel: tempfile::TempDir,
    world: World,
    clients: Clients,
    seed: [u8; 32],
    secrets_sent: Arc<Mutex<BTreeSet<String>>>,
    t: Instant,
}

fn prop_ground(name: &str) -> Prop {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let k = Kubelet::new(name);
    let d = rt.block_on(TestDriver::start(name, 128 * MIB, &k.extra()));
    let root = k.root.path().to_path_buf();
    for dir in ["staging/s1", "pods/a"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let sentinel = tempfile::Builder::new()
        .prefix("tpcsi-sentinel-")
        .tempdir()
        .unwrap();
    std::fs::create_dir(sentinel.path().join("sub")).unwrap();
    std::fs::write(sentinel.path().join("sub/file"), b"keep").unwrap();
    std::fs::write(sentinel.path().join("file"), b"keep").unwrap();
    std::os::unix::fs::symlink(sentinel.path(), root.join("escape")).unwrap();
    std::os::unix::fs::symlink("/proc/self", root.join("proc-link")).unwrap();

    let clients = rt.block_on(async {
        Clients {
            c: d.controller().await,
            n: d.node().await,
            g: GroupControllerClient::connect(d.uri()).await.unwrap(),
            m: SnapshotMetadataClient::connect(d.uri()).await.unwrap(),
            rn: ReclaimSpaceNodeClient::connect(d.addons_uri())
                .await
                .unwrap(),
            rc: ReclaimSpaceControllerClient::connect(d.addons_uri())
                .await
                .unwrap(),
            h: HealerNodeClient::connect(d.addons_uri()).await.unwrap(),
        }
    });
    let (fs_vol, blk_vol, snap) = rt.block_on(async {
        let fs_vol = create(&d, "prop-fs", 8 * MIB, mount_cap("ext4")).await;
        let blk_vol = create(&d, "prop-blk", 8 * MIB, block_cap()).await;
        let snap = snapshot(&mut clients.c.clone(), "prop-snap", &blk_vol).await;
        (fs_vol, blk_vol, snap)
    });
    let world = World {
        vg: d.vg.clone(),
        root: root.clone(),
        sentinel: sentinel.path().to_path_buf(),
        fs_vol: fs_vol.clone(),
        blk_vol: blk_vol.clone(),
        snap: snap.clone(),
    };
    let seed: u64 = std::env::var("TPCSI_PROPTEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    eprintln!("property tests: seed {seed} (TPCSI_PROPTEST_SEED={seed} replays), {} cases per request type", cases());
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let secrets_sent = Arc::new(Mutex::new(BTreeSet::new()));
    Prop {
        rt,
        _k: k,
        d,
        _sentinel: sentinel,
        world,
        clients,
        seed: seed_bytes,
        secrets_sent,
        t: Instant::now(),
    }
}

impl Prop {
    /// The runner of this test's request types.
    fn runner(&self) -> Runner<'_> {
        let w = &self.world;
        Runner {
            rt: &self.rt,
            world: w.clone(),
            clients: self.clients.clone(),
            fixtures: [w.fs_vol.clone(), w.blk_vol.clone(), w.snap.clone()].into(),
            seed: self.seed,
            total: 0,
            summary: Vec::new(),
        }
    }

    /// After the cases: the driver still runs, logged no panic and none of
    /// the secret values sent.
    fn finish(mut self, total: u32, summary: Vec<String>) {
        assert!(
            self.d.is_running(),
            "the driver died; log:\n{}",
            self.d.log_tail(40)
        );
        let log = self.d.log();
        assert!(
            !log.contains("panicked"),
            "the driver's log shows a panic:\n{}",
            self.d.log_tail(40)
        );
        let leaked: Vec<String> = self
            .secrets_sent
            .lock()
            .unwrap()
            .iter()
            .filter(|v| log.contains(v.as_str()))
            .cloned()
            .collect();
        assert!(
            leaked.is_empty(),
            "secret values in the driver's log: {leaked:?}"
        );
        eprintln!(
            "property tests: {total} cases over {} request types in {:.1?}, {} distinct secret values sent, none logged:\n  {}",
            summary.len(),
            self.t.elapsed(),
            self.secrets_sent.lock().unwrap().len(),
            summary.join("\n  ")
        );
        self.d.stop();
    }
}

/// CreateVolume, DeleteVolume and ValidateVolumeCapabilities under random and hostile input: proper codes only, the host and the fixtures untouched, no secret logged.
#[test]
fn controller_volume_requests_under_random_and_hostile_input() {
    let p = prop_ground("propcv");
    let w = p.world.clone();
    let sec = || secrets(p.secrets_sent.clone());
    let mut r = p.runner();
    // -- Controller ----------------------------------------------------------
    r.run(
        "CreateVolume",
        (
            name(&w),
            caps(),
            size(),
            params(&w),
            params(&w),
            sec(),
            proptest::option::weighted(0.2, id(&w, true)),
        ),
        |v| hostile_text(&v.0) || v.6.as_deref().is_some_and(hostile_text),
        |mut cl, (name, caps, range, parameters, mutable, secrets, source)| async move {
            let req = CreateVolumeRequest {
                name,
                capacity_range: range,
                volume_capabilities: caps.into_iter().flatten().collect(),
                parameters,
                secrets,
                volume_content_source: source.map(|id| VolumeContentSource {
                    r#type: Some(if id.starts_with("snap-") {
                        volume_content_source::Type::Snapshot(
                            volume_content_source::SnapshotSource { snapshot_id: id },
                        )
                    } else {
                        volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                            volume_id: id,
                        })
                    }),
                }),
                accessibility_requirements: None,
                mutable_parameters: mutable,
            };
            let got = cl.c.create_volume(req).await;
            if let Ok(v) = &got {
                let id = v.get_ref().volume.as_ref().unwrap().volume_id.clone();
                cleanup_volume(&mut cl.c, &id).await;
            }
            code_of(&got)
        },
    );
    r.run(
        "DeleteVolume",
        (id(&w, false), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, secrets)| async move {
            code_of(
                &cl.c
                    .delete_volume(DeleteVolumeRequest { volume_id, secrets })
                    .await,
            )
        },
    );
    r.run(
        "ValidateVolumeCapabilities",
        (id(&w, true), caps(), params(&w), params(&w), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, caps, parameters, mutable_parameters, secrets)| async move {
            code_of(
                &cl.c
                    .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                        volume_id,
                        volume_context: HashMap::new(),
                        volume_capabilities: caps.into_iter().flatten().collect(),
                        parameters,
                        secrets,
                        mutable_parameters,
                    })
                    .await,
            )
        },
    );
    let (total, summary) = (r.total, std::mem::take(&mut r.summary));
    drop(r);
    p.finish(total, summary);
}

/// ListVolumes, GetCapacity, ControllerExpand/Get/ModifyVolume and the snapshot RPCs under random and hostile input: proper codes only, the host and the fixtures untouched, no secret logged.
#[test]
fn controller_list_expand_and_snapshot_requests_under_random_and_hostile_input() {
    let p = prop_ground("propcs");
    let w = p.world.clone();
    let sec = || secrets(p.secrets_sent.clone());
    let mut r = p.runner();
    // -- Controller: lists, capacity, expansion, snapshots -------------------
    r.run(
        "ListVolumes",
        (
            prop_oneof![any::<i32>(), 0i32..4],
            prop_oneof![any_string(), id(&w, true)],
        ),
        |v| v.0 < 0 || hostile_text(&v.1),
        |mut cl, (max_entries, starting_token)| async move {
            code_of(
                &cl.c
                    .list_volumes(ListVolumesRequest {
                        max_entries,
                        starting_token,
                    })
                    .await,
            )
        },
    );
    r.run(
        "GetCapacity",
        (vec(capability(), 0..2), params(&w)),
        // Nothing in a GetCapacity is hostile: a CO's parameters and
        // capabilities are answered, not refused.
        |_| false,
        |mut cl, (caps, parameters)| async move {
            code_of(
                &cl.c
                    .get_capacity(GetCapacityRequest {
                        volume_capabilities: caps.into_iter().flatten().collect(),
                        parameters,
                        accessible_topology: None,
                    })
                    .await,
            )
        },
    );
    r.run(
        "ControllerExpandVolume",
        (id(&w, true), size(), capability(), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, capacity_range, volume_capability, secrets)| async move {
            code_of(
                &cl.c
                    .controller_expand_volume(ControllerExpandVolumeRequest {
                        volume_id,
                        capacity_range,
                        secrets,
                        volume_capability,
                    })
                    .await,
            )
        },
    );
    r.run(
        "ControllerGetVolume",
        id(&w, true),
        |v| hostile_text(v),
        |mut cl, volume_id| async move {
            code_of(
                &cl.c
                    .controller_get_volume(ControllerGetVolumeRequest { volume_id })
                    .await,
            )
        },
    );
    r.run(
        "ControllerModifyVolume",
        (id(&w, true), params(&w), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, mutable_parameters, secrets)| async move {
            code_of(
                &cl.c
                    .controller_modify_volume(ControllerModifyVolumeRequest {
                        volume_id,
                        secrets,
                        mutable_parameters,
                    })
                    .await,
            )
        },
    );
    r.run(
        "CreateSnapshot",
        (name(&w), id(&w, true), params(&w), sec()),
        |v| hostile_text(&v.0) || hostile_text(&v.1),
        |mut cl, (name, source_volume_id, parameters, secrets)| async move {
            let got =
                cl.c.create_snapshot(CreateSnapshotRequest {
                    source_volume_id,
                    name,
                    secrets,
                    parameters,
                })
                .await;
            if let Ok(s) = &got {
                let snapshot_id = s.get_ref().snapshot.as_ref().unwrap().snapshot_id.clone();
                cl.c.delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id,
                    secrets: HashMap::new(),
                })
                .await
                .expect("clean-up of a snapshot");
            }
            code_of(&got)
        },
    );
    r.run(
        "DeleteSnapshot",
        (id(&w, false), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (snapshot_id, secrets)| async move {
            code_of(
                &cl.c
                    .delete_snapshot(DeleteSnapshotRequest {
                        snapshot_id,
                        secrets,
                    })
                    .await,
            )
        },
    );
    r.run(
        "ListSnapshots",
        (
            prop_oneof![any::<i32>(), 0i32..4],
            any_string(),
            id(&w, true),
            id(&w, true),
            sec(),
        ),
        |v| v.0 < 0 || hostile_text(&v.1),
        |mut cl, (max_entries, starting_token, source_volume_id, snapshot_id, secrets)| async move {
            code_of(
                &cl.c
                    .list_snapshots(ListSnapshotsRequest {
                        max_entries,
                        starting_token,
                        source_volume_id,
                        snapshot_id,
                        secrets,
                    })
                    .await,
            )
        },
    );
    let (total, summary) = (r.total, std::mem::take(&mut r.summary));
    drop(r);
    p.finish(total, summary);
}

/// The Node service under random and hostile input: proper codes only, the host and the fixtures untouched, no secret logged.
#[test]
fn node_requests_under_random_and_hostile_input() {
    let p = prop_ground("propn");
    let w = p.world.clone();
    let sec = || secrets(p.secrets_sent.clone());
    let mut r = p.runner();
    // -- Node ------------------------------------------------------------------
    r.run(
        "NodeStageVolume",
        (id(&w, true), path(&w), capability(), sec(), params(&w)),
        |v| hostile_text(&v.0) || hostile_path(&w, &v.1),
        |mut cl, (volume_id, staging_target_path, volume_capability, secrets, volume_context)| async move {
            let got = cl
                .n
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: volume_id.clone(),
                    publish_context: HashMap::new(),
                    staging_target_path: staging_target_path.clone(),
                    volume_capability,
                    secrets,
                    volume_context,
                })
                .await;
            if got.is_ok() {
                cl.n.node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id,
                    staging_target_path,
                })
                .await
                .expect("clean-up: unstage");
            }
            code_of(&got)
        },
    );
    r.run(
        "NodeUnstageVolume",
        (id(&w, true), path(&w)),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, staging_target_path)| async move {
            code_of(
                &cl.n
                    .node_unstage_volume(NodeUnstageVolumeRequest {
                        volume_id,
                        staging_target_path,
                    })
                    .await,
            )
        },
    );
    r.run(
        "NodePublishVolume",
        (id(&w, true), path(&w), path(&w), capability(), any::<bool>(), sec()),
        |v| hostile_text(&v.0) || hostile_path(&w, &v.1) || hostile_path(&w, &v.2),
        |mut cl, (volume_id, staging_target_path, target_path, volume_capability, readonly, secrets)| async move {
            let got = cl
                .n
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    publish_context: HashMap::new(),
                    staging_target_path,
                    target_path: target_path.clone(),
                    volume_capability,
                    readonly,
                    secrets,
                    volume_context: HashMap::new(),
                })
                .await;
            if got.is_ok() {
                cl.n.node_unpublish_volume(NodeUnpublishVolumeRequest { volume_id, target_path })
                    .await
                    .expect("clean-up: unpublish");
            }
            code_of(&got)
        },
    );
    r.run(
        "NodeUnpublishVolume",
        (id(&w, true), path(&w)),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, target_path)| async move {
            code_of(
                &cl.n
                    .node_unpublish_volume(NodeUnpublishVolumeRequest {
                        volume_id,
                        target_path,
                    })
                    .await,
            )
        },
    );
    r.run(
        "NodeGetVolumeStats",
        (id(&w, true), path(&w), path(&w)),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, volume_path, staging_target_path)| async move {
            code_of(
                &cl.n
                    .node_get_volume_stats(NodeGetVolumeStatsRequest {
                        volume_id,
                        volume_path,
                        staging_target_path,
                    })
                    .await,
            )
        },
    );
    r.run(
        "NodeExpandVolume",
        (
            id(&w, true),
            path(&w),
            path(&w),
            size(),
            capability(),
            sec(),
        ),
        |v| hostile_text(&v.0),
        |mut cl,
         (
            volume_id,
            volume_path,
            staging_target_path,
            capacity_range,
            volume_capability,
            secrets,
        )| async move {
            code_of(
                &cl.n
                    .node_expand_volume(NodeExpandVolumeRequest {
                        volume_id,
                        volume_path,
                        capacity_range,
                        staging_target_path,
                        volume_capability,
                        secrets,
                    })
                    .await,
            )
        },
    );
    let (total, summary) = (r.total, std::mem::take(&mut r.summary));
    drop(r);
    p.finish(total, summary);
}

/// The GroupController service under random and hostile input: proper codes only, the host and the fixtures untouched, no secret logged.
#[test]
fn group_controller_requests_under_random_and_hostile_input() {
    let p = prop_ground("propg");
    let w = p.world.clone();
    let sec = || secrets(p.secrets_sent.clone());
    let mut r = p.runner();
    // -- GroupController -------------------------------------------------------
    r.run(
        "CreateVolumeGroupSnapshot",
        (name(&w), vec(id(&w, true), 0..3), params(&w), sec()),
        |v| hostile_text(&v.0) || v.1.iter().any(|id| hostile_text(id)),
        |mut cl, (name, source_volume_ids, parameters, secrets)| async move {
            let got =
                cl.g.create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
                    name,
                    source_volume_ids,
                    secrets,
                    parameters,
                })
                .await;
            if let Ok(g) = &got {
                let group_snapshot_id = g
                    .get_ref()
                    .group_snapshot
                    .as_ref()
                    .unwrap()
                    .group_snapshot_id
                    .clone();
                cl.g.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id,
                    snapshot_ids: vec![],
                    secrets: HashMap::new(),
                })
                .await
                .expect("clean-up of a group snapshot");
            }
            code_of(&got)
        },
    );
    r.run(
        "GetVolumeGroupSnapshot",
        (id(&w, true), vec(id(&w, true), 0..2), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (group_snapshot_id, snapshot_ids, secrets)| async move {
            code_of(
                &cl.g
                    .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
                        group_snapshot_id,
                        snapshot_ids,
                        secrets,
                    })
                    .await,
            )
        },
    );
    r.run(
        "DeleteVolumeGroupSnapshot",
        (id(&w, false), vec(id(&w, false), 0..2), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (group_snapshot_id, snapshot_ids, secrets)| async move {
            code_of(
                &cl.g
                    .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
                        group_snapshot_id,
                        snapshot_ids,
                        secrets,
                    })
                    .await,
            )
        },
    );
    let (total, summary) = (r.total, std::mem::take(&mut r.summary));
    drop(r);
    p.finish(total, summary);
}

/// The SnapshotMetadata service under random and hostile input: proper codes only, the host and the fixtures untouched, no secret logged.
#[test]
fn snapshot_metadata_requests_under_random_and_hostile_input() {
    let p = prop_ground("propm");
    let w = p.world.clone();
    let sec = || secrets(p.secrets_sent.clone());
    let mut r = p.runner();
    // -- SnapshotMetadata --------------------------------------------------------
    let offset = || {
        prop_oneof![
            Just(0i64),
            Just(-1),
            Just(i64::MAX),
            any::<i64>(),
            0i64..(16 * MIB) as i64
        ]
    };
    r.run(
        "GetMetadataAllocated",
        (id(&w, true), offset(), any::<i32>(), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (snapshot_id, starting_offset, max_results, secrets)| async move {
            let got =
                cl.m.get_metadata_allocated(GetMetadataAllocatedRequest {
                    snapshot_id,
                    starting_offset,
                    max_results,
                    secrets,
                })
                .await;
            drained(got).await
        },
    );
    r.run(
        "GetMetadataDelta",
        (id(&w, true), id(&w, true), offset(), any::<i32>(), sec()),
        |v| hostile_text(&v.0) || hostile_text(&v.1),
        |mut cl, (base_snapshot_id, target_snapshot_id, starting_offset, max_results, secrets)| async move {
            let got = cl
                .m
                .get_metadata_delta(GetMetadataDeltaRequest {
                    base_snapshot_id,
                    target_snapshot_id,
                    starting_offset,
                    max_results,
                    secrets,
                })
                .await;
            drained(got).await
        },
    );
    let (total, summary) = (r.total, std::mem::take(&mut r.summary));
    drop(r);
    p.finish(total, summary);
}

/// The CSI-Addons services under random and hostile input: proper codes only, the host and the fixtures untouched, no secret logged.
#[test]
fn addons_requests_under_random_and_hostile_input() {
    let p = prop_ground("propa");
    let w = p.world.clone();
    let sec = || secrets(p.secrets_sent.clone());
    let mut r = p.runner();
    // -- CSI-Addons --------------------------------------------------------------
    r.run(
        "NodeReclaimSpace",
        (id(&w, true), path(&w), path(&w), capability(), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, volume_path, staging_target_path, volume_capability, secrets)| async move {
            code_of(
                &cl.rn
                    .node_reclaim_space(NodeReclaimSpaceRequest {
                        volume_id,
                        volume_path,
                        staging_target_path,
                        volume_capability,
                        secrets,
                    })
                    .await,
            )
        },
    );
    r.run(
        "ControllerReclaimSpace",
        (id(&w, true), params(&w), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, parameters, secrets)| async move {
            code_of(
                &cl.rc
                    .controller_reclaim_space(ControllerReclaimSpaceRequest {
                        volume_id,
                        parameters,
                        secrets,
                    })
                    .await,
            )
        },
    );
    r.run(
        "NodeHealer",
        (id(&w, true), path(&w), path(&w), capability(), sec()),
        |v| hostile_text(&v.0),
        |mut cl, (volume_id, volume_path, staging_target_path, volume_capability, secrets)| async move {
            code_of(
                &cl.h
                    .node_healer(NodeHealerRequest {
                        volume_id,
                        volume_path,
                        staging_target_path,
                        volume_capability,
                        secrets,
                        volume_context: HashMap::new(),
                    })
                    .await,
            )
        },
    );
    let (total, summary) = (r.total, std::mem::take(&mut r.summary));
    drop(r);
    p.finish(total, summary);
}
