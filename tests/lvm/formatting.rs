//! Per-class and per-StorageClass formatting (issue 23, part 2): the
//! options a volume is made with are decided at CreateVolume and recorded
//! with it; a later change to the class does not reach it, a restage never
//! reformats, and nothing off the allow-lists reaches mkfs or mount(2).

use std::path::Path;

use thinpool_csi::proto::csi::v1::*;
use tonic::Code;

use crate::fixtures::{
    block_cap, create_req, create_volume, mkfs_runs, mount_cap, mount_flags, mounts_under,
    stage_req, unstage_req, Kubelet,
};
use crate::harness::{lvs, sh, TestDriver, MIB};

/// A CreateVolumeRequest with StorageClass parameter `mkfsOptions`.
fn with_mkfs(mut req: CreateVolumeRequest, opts: &str) -> CreateVolumeRequest {
    req.parameters
        .insert("mkfsOptions".to_string(), opts.to_string());
    req
}

async fn create_id(d: &TestDriver, req: CreateVolumeRequest) -> String {
    create_volume(&mut d.controller().await, req)
        .await
        .volume_id
}

/// The staging mount at `staging`: its filesystem label, block size and
/// super options.
fn mounted(staging: &Path) -> (String, u64, Vec<String>) {
    let mi = thinpool_csi::mountinfo::MountInfo::read().unwrap();
    let m = mi.top_mount_at(staging).expect("staged").clone();
    let source = m.source.to_string_lossy().into_owned();
    let label = sh("blkid", &["-o", "value", "-s", "LABEL", &source])
        .trim()
        .to_string();
    let bsize = sh(
        "stat",
        &["-f", "--format=%S", &staging.display().to_string()],
    )
    .trim()
    .parse()
    .unwrap();
    (label, bsize, m.super_options.clone())
}

/// Rewrites the driver's config (each `from` becomes its `to`) and
/// restarts it.
async fn reconfigure(d: &mut TestDriver, changes: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(&d.config).unwrap();
    for (from, to) in changes {
        assert!(text.contains(from), "{text}");
        text = text.replace(from, to);
    }
    std::fs::write(&d.config, text).unwrap();
    d.restart().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn options_are_decided_at_creation_and_a_restage_never_reformats() {
    let k = Kubelet::new("fmt");
    let class = "mkfs_options = { ext4 = \"-L old -m 0\", xfs = \"-L oldx\" }\n\
                 mount_options = { ext4 = [\"commit=30\"] }\noverprovision_ratio = 10\n";
    let mut d = TestDriver::start("fmt", 128 * MIB, &format!("{}{class}", k.extra())).await;
    let a = create_id(&d, create_req("fmt-a", 24 * MIB, mount_cap("ext4"))).await;
    let b = create_id(
        &d,
        with_mkfs(
            create_req("fmt-b", 24 * MIB, mount_cap("ext4")),
            "-L sc -b 2048",
        ),
    )
    .await;
    let x = create_id(&d, create_req("fmt-x", 8 * MIB, mount_cap("xfs"))).await;
    // The class changes; A, B and X were created before it did.
    reconfigure(
        &mut d,
        &[("-L old -m 0", "-L new"), ("commit=30", "commit=40")],
    )
    .await;
    let c = create_id(&d, create_req("fmt-c", 24 * MIB, mount_cap("ext4"))).await;

    let mut n = d.node().await;
    let stage = |id: &str, cap| stage_req(id, &k.staging(id), cap);
    n.node_stage_volume(stage(&a, mount_cap("ext4")))
        .await
        .unwrap();
    let (label, bsize, opts) = mounted(&k.staging(&a));
    assert_eq!(label, "old", "A keeps the class's options of its creation");
    assert_ne!(bsize, 2048);
    assert!(opts.iter().any(|o| o == "commit=30"), "{opts:?}");
    // The StorageClass's mkfsOptions replace the class's; its mount
    // flags win over the class's.
    n.node_stage_volume(stage(&b, mount_flags("ext4", &["commit=5"])))
        .await
        .unwrap();
    let (label, bsize, opts) = mounted(&k.staging(&b));
    assert_eq!((label.as_str(), bsize), ("sc", 2048));
    assert!(
        !opts.iter().any(|o| o == "commit=30" || o == "commit=40"),
        "{opts:?}"
    );
    n.node_stage_volume(stage(&c, mount_cap("ext4")))
        .await
        .unwrap();
    let (label, _, opts) = mounted(&k.staging(&c));
    assert_eq!(label, "new", "C has the class's options of its creation");
    assert!(opts.iter().any(|o| o == "commit=40"), "{opts:?}");
    n.node_stage_volume(stage(&x, mount_cap("xfs")))
        .await
        .unwrap();
    assert_eq!(mounted(&k.staging(&x)).0, "oldx");
    assert!(d.log().contains("-L old -m 0"), "{}", d.log_tail(30));

    // A restage of a written volume, with the class changed again,
    // mounts what is there: no mkfs, the data kept.
    std::fs::write(k.staging(&a).join("kept"), b"data").unwrap();
    n.node_unstage_volume(unstage_req(&a, &k.staging(&a)))
        .await
        .unwrap();
    reconfigure(&mut d, &[("-L new", "-L newer -b 1024")]).await;
    let runs = mkfs_runs(&d);
    let mut n = d.node().await;
    n.node_stage_volume(stage(&a, mount_cap("ext4")))
        .await
        .unwrap();
    assert_eq!(mkfs_runs(&d), runs, "a restage never formats");
    assert_eq!(std::fs::read(k.staging(&a).join("kept")).unwrap(), b"data");
    assert_eq!(mounted(&k.staging(&a)).0, "old");
    for id in [&a, &b, &c, &x] {
        n.node_unstage_volume(unstage_req(id, &k.staging(id)))
            .await
            .unwrap();
    }
    assert!(mounts_under(k.root.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn options_off_the_lists_are_refused_by_name_and_touch_nothing() {
    let k = Kubelet::new("fmtbad");
    let d = TestDriver::start("fmtbad", 96 * MIB, &k.extra()).await;
    let mut c = d.controller().await;
    for (opts, named) in [
        ("-O ^has_journal; rm", "^has_journal;"),
        ("-O ^has_journal ; rm -rf /", "\";\""),
        ("--", "\"--\""),
        ("-m reflink=0", "-m"),
        ("-F", "\"-F\""),
    ] {
        let e = c
            .create_volume(with_mkfs(
                create_req("fmt-bad", 16 * MIB, mount_cap("ext4")),
                opts,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{opts}: {e:?}");
        assert!(
            e.message().contains("mkfsOptions") && e.message().contains(named),
            "{opts}: {}",
            e.message()
        );
    }
    // xfs options for an ext4 volume, and the other way round.
    let e = c
        .create_volume(with_mkfs(
            create_req("fmt-bad", 16 * MIB, mount_cap("xfs")),
            "-O ^has_journal",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        lvs(&d.vg).thin_volumes("pool").next().is_none(),
        "a refused CreateVolume made no LV"
    );
    // A block volume is never formatted: its mkfsOptions are not read.
    let blk = create_id(
        &d,
        with_mkfs(create_req("fmt-blk", 16 * MIB, block_cap()), "-b 1024"),
    )
    .await;
    assert!(!blk.is_empty());
    // A mount flag off the list is refused before anything is mounted.
    let id = create_id(&d, create_req("fmt-ok", 16 * MIB, mount_cap("ext4"))).await;
    let mut n = d.node().await;
    for flag in ["errors=panic", "norecovery", "allocsize=1m"] {
        let e = n
            .node_stage_volume(stage_req(
                &id,
                &k.staging(&id),
                mount_flags("ext4", &[flag]),
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{flag}: {e:?}");
        assert!(e.message().contains(flag), "{}", e.message());
    }
    assert_eq!(mkfs_runs(&d), 0);
    assert!(mounts_under(k.root.path()).is_empty());
}
