//! Controller and Identity over the socket, against real LVM.

use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::AccessMode;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;
use tonic::Code;

use crate::fixtures::{block_cap, create_req, create_volume, del, mount_cap};
use crate::harness::{lvm, lvs, try_lvm, TestDriver, DRIVER_NAME, MIB, NODE_ID};

fn thin_names(vg: &str) -> Vec<String> {
    let mut v: Vec<String> = lvs(vg)
        .thin_volumes("pool")
        .map(|lv| lv.name.clone())
        .collect();
    v.sort();
    v
}

/// A driver with one 10 MiB ext4 volume, "pvc-life", created on it.
async fn one_volume(name: &str) -> (TestDriver, ControllerClient<Channel>, Volume) {
    let d = TestDriver::start(name, 256 * MIB, "").await;
    let mut c = d.controller().await;
    let v1 = create_volume(&mut c, create_req("pvc-life", 10 * MIB, mount_cap("ext4"))).await;
    (d, c, v1)
}

#[tokio::test(flavor = "multi_thread")]
async fn identity_and_controller_capabilities_are_served() {
    let d = TestDriver::start("ident", 64 * MIB, "").await;
    let mut id = d.identity().await;
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, DRIVER_NAME);
    assert!(!info.vendor_version.is_empty());
    let caps = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 5, "{caps:?}");
    assert_eq!(
        id.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );

    let mut c = d.controller().await;
    let ccaps = c
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!ccaps.capabilities.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn create_again_returns_the_same_volume_rounded_to_extents_and_tagged() {
    let d = TestDriver::start("life", 256 * MIB, "").await;
    let mut c = d.controller().await;
    // Create, and create again: same volume, one LV.
    let req = create_req("pvc-life", 10 * MIB, mount_cap("ext4"));
    let v1 = c
        .create_volume(req.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let v2 = c
        .create_volume(req.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v1, v2);
    let extent = 4 * MIB;
    assert_eq!(
        v1.capacity_bytes as u64,
        12 * MIB,
        "10 MiB rounds up to 3 extents"
    );
    assert_eq!(
        v1.accessible_topology[0]
            .segments
            .get(&format!("topology.{DRIVER_NAME}/node")),
        Some(&NODE_ID.to_string())
    );
    let report = lvs(&d.vg);
    let lv = report.find(&v1.volume_id).expect("LV exists");
    assert_eq!(lv.size, 12 * MIB);
    assert_eq!(lv.size % extent, 0);
    assert!(
        lv.tags
            .iter()
            .any(|t| t == &format!("tpcsi.owner={DRIVER_NAME}")),
        "{:?}",
        lv.tags
    );
    // "pvc-life" is spelled out by the LV name: no name tag repeats it
    // in every VG metadata write (naming.rs).
    assert!(
        !lv.tags.iter().any(|t| t.starts_with("tpcsi.name=")),
        "{:?}",
        lv.tags
    );
    assert_eq!(thin_names(&d.vg).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn get_and_validate_answer_for_a_volume() {
    let (_d, mut c, v1) = one_volume("lifeget").await;
    // Get, then validate (its own access type, then another).
    let got = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v1.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let cond = got.status.unwrap().volume_condition.unwrap();
    assert!(!cond.abnormal, "{cond:?}");
    let val = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v1.volume_id.clone(),
            volume_capabilities: vec![mount_cap("ext4")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(val.confirmed.is_some(), "{val:?}");
    let val = c
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v1.volume_id.clone(),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(val.confirmed.is_none() && !val.message.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn expand_rounds_up_asks_the_node_and_list_shows_the_new_size() {
    let (d, mut c, v1) = one_volume("lifegrow").await;
    // Expand (twice: the second is a no-op), then a smaller request.
    for _ in 0..2 {
        let e = c
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: v1.volume_id.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: (30 * MIB) as i64,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(e.capacity_bytes as u64, 32 * MIB);
        assert!(
            e.node_expansion_required,
            "filesystem volumes need the node step"
        );
    }
    assert_eq!(lvs(&d.vg).find(&v1.volume_id).unwrap().size, 32 * MIB);

    // List shows it with its new size.
    let list = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1);
    assert_eq!(
        list.entries[0].volume.as_ref().unwrap().capacity_bytes as u64,
        32 * MIB
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_again_succeeds_and_leaves_no_lv() {
    let (d, mut c, v1) = one_volume("lifedel").await;
    // Delete, and delete again.
    c.delete_volume(del(&v1.volume_id)).await.unwrap();
    c.delete_volume(del(&v1.volume_id)).await.unwrap();
    assert!(thin_names(&d.vg).is_empty());
    let gone = c
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: v1.volume_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread")]
async fn already_exists_exhausted_and_hostile_input() {
    let d = TestDriver::start("bad", 128 * MIB, "overprovision_ratio = 2.0").await;
    let mut c = d.controller().await;
    let v = c
        .create_volume(create_req("pvc-a", 8 * MIB, mount_cap("ext4")))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    // Same name, incompatible size / filesystem / access type.
    let mut bigger = create_req("pvc-a", 8 * MIB, mount_cap("ext4"));
    bigger.capacity_range = Some(CapacityRange {
        required_bytes: (64 * MIB) as i64,
        limit_bytes: 0,
    });
    for req in [
        bigger,
        create_req("pvc-a", 8 * MIB, mount_cap("xfs")),
        create_req("pvc-a", 8 * MIB, block_cap()),
    ] {
        let e = c.create_volume(req).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    }

    // Beyond ratio × pool: RESOURCE_EXHAUSTED, nothing created.
    let before = thin_names(&d.vg);
    let e = c
        .create_volume(create_req("pvc-huge", 4096 * MIB, block_cap()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // A requisite topology that excludes this node.
    let mut elsewhere = create_req("pvc-elsewhere", 8 * MIB, block_cap());
    elsewhere.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![Topology {
            segments: [(format!("topology.{DRIVER_NAME}/node"), "node-9".to_string())].into(),
        }],
        preferred: vec![],
    });
    assert_eq!(
        c.create_volume(elsewhere).await.unwrap_err().code(),
        Code::ResourceExhausted
    );

    // Hostile names, sizes, parameters and capabilities.
    let long = "x".repeat(10_000);
    let mut cases: Vec<(CreateVolumeRequest, Code)> = vec![
        (create_req("", MIB, block_cap()), Code::InvalidArgument),
        (create_req(&long, MIB, block_cap()), Code::InvalidArgument),
        // No CO makes a name with a control character.
        (create_req("a\0b", MIB, block_cap()), Code::InvalidArgument),
        (
            create_req("pvc-1\n", MIB, block_cap()),
            Code::InvalidArgument,
        ),
        (
            create_req("n", MIB, mount_cap("btrfs")),
            Code::InvalidArgument,
        ),
        (
            create_req("n", MIB, mount_cap("ext4; rm -rf /")),
            Code::InvalidArgument,
        ),
    ];
    let mut neg = create_req("neg", MIB, block_cap());
    neg.capacity_range = Some(CapacityRange {
        required_bytes: -5,
        limit_bytes: 0,
    });
    cases.push((neg, Code::InvalidArgument));
    let mut absurd = create_req("absurd", MIB, block_cap());
    absurd.capacity_range = Some(CapacityRange {
        required_bytes: i64::MAX,
        limit_bytes: 0,
    });
    cases.push((absurd, Code::OutOfRange));
    let mut limit = create_req("limit", 5 * MIB, block_cap());
    limit.capacity_range = Some(CapacityRange {
        required_bytes: (5 * MIB) as i64,
        limit_bytes: (6 * MIB) as i64,
    });
    cases.push((limit, Code::OutOfRange));
    let mut inj = create_req("inj", MIB, block_cap());
    inj.parameters = [("--yes; lvremove -y vg".to_string(), "x".to_string())].into();
    cases.push((inj, Code::InvalidArgument));
    let mut othervg = create_req("othervg", MIB, block_cap());
    othervg.parameters = [("volumeGroup".to_string(), "vg0".to_string())].into();
    cases.push((othervg, Code::InvalidArgument));
    let mut nocaps = create_req("nocaps", MIB, block_cap());
    nocaps.volume_capabilities.clear();
    cases.push((nocaps, Code::InvalidArgument));
    let mut multi = create_req("multi", MIB, block_cap());
    multi.volume_capabilities[0].access_mode = Some(AccessMode {
        mode: Mode::MultiNodeMultiWriter as i32,
    });
    cases.push((multi, Code::InvalidArgument));
    for (req, code) in cases {
        let name = req.name.chars().take(20).collect::<String>();
        let e = c.create_volume(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{name}: {e:?}");
        assert!(!e.message().is_empty());
    }
    // Names with any other characters are fine, and map to distinct LVs.
    let mut ids = vec![];
    for name in ["../x", "vg0/root", "a b;$(x)", "ünï cødé/../.."] {
        let v = c
            .create_volume(create_req(name, MIB, block_cap()))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v.volume_id);
    }
    let after = thin_names(&d.vg);
    assert_eq!(
        after.len(),
        before.len() + 4,
        "only the four valid creates made LVs"
    );
    for id in ids {
        c.delete_volume(del(&id)).await.unwrap();
    }
    assert_eq!(thin_names(&d.vg), before);
    c.delete_volume(del(&v.volume_id)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_lvs_are_never_touched() {
    let d = TestDriver::start("foreign", 128 * MIB, "").await;
    let vg = d.vg.clone();
    // A plain LV, an untagged thin LV with an id-shaped name, and one
    // tagged for another driver.
    lvm(&["lvcreate", "--yes", "-L", "4m", "-n", "root", &vg]);
    let fake = "csi-fake-0123456789abcdef";
    lvm(&[
        "lvcreate",
        "--yes",
        "-an",
        "-V",
        "4m",
        "--thinpool",
        &format!("{vg}/pool"),
        "-n",
        fake,
    ]);
    let other = "csi-other-fedcba9876543210";
    lvm(&[
        "lvcreate",
        "--yes",
        "-an",
        "-V",
        "4m",
        "--thinpool",
        &format!("{vg}/pool"),
        "-n",
        other,
        "--addtag",
        "tpcsi.owner=other.driver",
        "--addtag",
        "tpcsi.name=6f",
    ]);
    let mut c = d.controller().await;
    let vg_root = format!("{vg}/root");
    let vg_pool = format!("{vg}/pool");
    for id in [
        "root",
        "pool",
        vg_root.as_str(),
        vg_pool.as_str(),
        "../x",
        "/dev/x",
        "--yes",
    ] {
        c.delete_volume(del(id))
            .await
            .unwrap_or_else(|e| panic!("{id}: {e:?}"));
    }
    for id in [fake, other] {
        let e = c.delete_volume(del(id)).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{id}: {e:?}");
        let e = c
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: (64 * MIB) as i64,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{id}: {e:?}");
    }
    for bad in [String::new(), "x".repeat(200), "a\0b".to_string()] {
        let e = c.delete_volume(del(&bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    let r = lvs(&vg);
    for name in ["root", "pool", fake, other] {
        assert!(r.find(name).is_some(), "{name} was removed");
    }
    assert_eq!(
        r.find(fake).unwrap().size,
        4 * MIB,
        "expand must not touch it"
    );
    // They are not listed as ours either.
    let list = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.entries.is_empty(), "{list:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pagination_across_creates_and_deletes() {
    let d = TestDriver::start("page", 128 * MIB, "").await;
    let mut c = d.controller().await;
    let mut ids = vec![];
    for i in 0..5 {
        let v = c
            .create_volume(create_req(&format!("pvc-page-{i}"), MIB, block_cap()))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v.volume_id);
    }
    ids.sort();
    let page = |token: &str, max: i32| ListVolumesRequest {
        max_entries: max,
        starting_token: token.into(),
    };
    let p1 = c.list_volumes(page("", 2)).await.unwrap().into_inner();
    let p1_ids: Vec<String> = p1
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    assert_eq!(p1_ids, ids[..2].to_vec());
    assert!(!p1.next_token.is_empty());
    // Between pages: the last volume of page 1 and one later volume are
    // deleted, and a new volume is created.
    c.delete_volume(del(&ids[1])).await.unwrap();
    c.delete_volume(del(&ids[3])).await.unwrap();
    c.create_volume(create_req("pvc-page-new", MIB, block_cap()))
        .await
        .unwrap();
    let mut rest = vec![];
    let mut token = p1.next_token.clone();
    loop {
        let p = c.list_volumes(page(&token, 2)).await.unwrap().into_inner();
        assert!(p.entries.len() <= 2);
        rest.extend(
            p.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if p.next_token.is_empty() {
            break;
        }
        token = p.next_token;
    }
    // Nothing from page 1 repeats, the surviving volumes are all seen.
    for id in [&ids[2], &ids[4]] {
        assert!(rest.contains(id), "{id} missing from {rest:?}");
    }
    for id in &p1_ids {
        assert!(!rest.contains(id), "{id} repeated");
    }
    assert!(!rest.contains(&ids[3]));
    let e = c.list_volumes(page("not-a-token", 2)).await.unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    let e = c.list_volumes(page("", -1)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_matches_lvs_and_restart_keeps_everything() {
    let mut d = TestDriver::start("cap", 128 * MIB, "overprovision_ratio = 3.0").await;
    let mut c = d.controller().await;
    let v = c
        .create_volume(create_req("pvc-cap", 40 * MIB, block_cap()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // Write some data so Data% is not zero.
    lvm(&["lvchange", "-ay", &format!("{}/{}", d.vg, v.volume_id)]);
    crate::harness::sh(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of=/dev/{}/{}", d.vg, v.volume_id),
            "bs=1M",
            "count=8",
            "oflag=direct",
            "status=none",
        ],
    );
    let cap = c
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    let pool = lvs(&d.vg).find("pool").unwrap().clone();
    let (expect, max) = crate::harness::capacity_from_lvs(&d.vg, 3.0);
    eprintln!(
        "capacity: pool {} B, data {:?}% -> available {} (expected {expect})",
        pool.size, pool.data_percent, cap.available_capacity
    );
    assert!(pool.data_percent.unwrap() > 0.0);
    assert_eq!(cap.available_capacity as u64, expect);
    assert_eq!(cap.maximum_volume_size, Some(max as i64));
    // Another node's topology has no capacity here.
    let elsewhere = c
        .get_capacity(GetCapacityRequest {
            accessible_topology: Some(Topology {
                segments: [(format!("topology.{DRIVER_NAME}/node"), "node-9".to_string())].into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(elsewhere.available_capacity, 0);
    let bad = c
        .get_capacity(GetCapacityRequest {
            parameters: [("bogus".to_string(), "1".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);

    // Restart: same loop device, same VG, same volumes.
    let loop_before = thinpool_csi::pool::loopdev::find_loop_for_file(&d.backing_file())
        .unwrap()
        .unwrap();
    d.restart().await;
    let loop_after = thinpool_csi::pool::loopdev::find_loop_for_file(&d.backing_file())
        .unwrap()
        .unwrap();
    assert_eq!(loop_before, loop_after);
    let loops_on_file = std::fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path().join("loop/backing_file")).ok())
        .filter(|f| f.trim() == d.backing_file().display().to_string())
        .count();
    assert_eq!(loops_on_file, 1, "one loop device per backing file");
    let vgs = lvm(&["vgs", "--noheadings", "-o", "vg_name"]);
    assert_eq!(vgs.lines().filter(|l| l.trim() == d.vg).count(), 1);
    assert!(
        d.log().contains("reusing attached loop device"),
        "{}",
        d.log()
    );
    let mut c = d.controller().await;
    let list = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1);
    assert_eq!(
        list.entries[0].volume.as_ref().unwrap().volume_id,
        v.volume_id
    );
    c.delete_volume(del(&v.volume_id)).await.unwrap();
}

/// README's run command: `thinpool-csi --config config/dev.toml` starts on
/// a loop-backed pool from nothing, serves, and finds its volumes after a
/// restart.
#[tokio::test(flavor = "multi_thread")]
async fn dev_config_starts_from_nothing() {
    crate::harness::require_lvm();
    let cfg_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/dev.toml");
    let cfg = thinpool_csi::config::Config::load(&cfg_path).unwrap();
    let backing = cfg.loop_pool.as_ref().unwrap().backing_file.clone();
    assert!(
        !backing.exists(),
        "{} must not exist before the test",
        backing.display()
    );
    assert!(
        try_lvm(&["vgs", &cfg.volume_group]).is_err(),
        "VG must not exist yet"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut d =
        TestDriver::with_config(dir, cfg_path, cfg.volume_group.clone(), backing.clone()).await;
    assert!(backing.exists());
    let mut c = d.controller().await;
    let v = c
        .create_volume(create_req("pvc-dev", 16 * MIB, mount_cap("")))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        v.volume_context.get("fsType").map(String::as_str),
        Some("ext4")
    );
    c.controller_expand_volume(ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: (20 * MIB) as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    d.restart().await;
    let mut c = d.controller().await;
    let list = c
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1);
    let vol = list.entries[0].volume.as_ref().unwrap();
    assert_eq!(vol.volume_id, v.volume_id);
    assert_eq!(vol.capacity_bytes as u64, 20 * MIB);
    c.delete_volume(del(&v.volume_id)).await.unwrap();
    drop(d);
    let _ = std::fs::remove_file(&backing);
}

/// A thin pool that does not zero new chunks would let a new raw block
/// volume read a deleted volume's data: start-up stops with a message
/// naming the config key that accepts it, and that key does.
#[tokio::test(flavor = "multi_thread")]
async fn an_unzeroed_pool_is_refused_unless_accepted() {
    let mut d = TestDriver::start("zunzero", 64 * MIB, "").await;
    let pool = format!("{}/pool", d.vg);
    assert!(lvs(&d.vg).find("pool").unwrap().zeroes_new_chunks());
    d.stop();
    lvm(&["lvchange", "--zero", "n", &pool]);

    let (status, err, _) = d.run_to_exit(&[]).await;
    eprintln!(
        "MEASURE unzeroed pool: {status}: {}",
        err.trim().lines().last().unwrap_or("")
    );
    assert!(!status.success());
    assert!(err.contains("allow_unzeroed_pool"), "{err}");
    assert!(!d.socket.exists(), "nothing was served");

    let text = std::fs::read_to_string(&d.config).unwrap();
    std::fs::write(&d.config, format!("allow_unzeroed_pool = true\n{text}")).unwrap();
    d.spawn().await;
    assert!(
        d.log().contains("accepted by allow_unzeroed_pool"),
        "{}",
        d.log_tail(20)
    );
}

/// A failed LVM write gets its code from LVM's state read after it, never
/// from LVM's words: an LV held open is FAILED_PRECONDITION and says what
/// to do; a VG that `vgs` does not list is UNAVAILABLE.
#[tokio::test(flavor = "multi_thread")]
async fn lvm_failures_get_their_codes_from_state() {
    use std::sync::Arc;
    use thinpool_csi::config::{Config, UdevMode};
    use thinpool_csi::lvm::Lvm;
    let d = TestDriver::start("lvmerr", 256 * MIB, "").await;
    let cfg = |vg: &str| Config {
        volume_group: vg.into(),
        thin_pool: "pool".into(),
        udev: UdevMode::Off,
        report_max_age_secs: 0,
        ..Config::default()
    };
    let lvm = Arc::new(Lvm::new(&cfg(&d.vg)));
    assert!(lvm.vg_exists().await.unwrap());
    let name = "csi-lvmerr-held-open";
    lvm.create_thin(name, 8 * MIB, &["tpcsi.owner=someone.else".into()], None)
        .await
        .unwrap();
    lvm.activate(name).await.unwrap();
    let held = std::fs::File::open(lvm.dev_path(name)).unwrap();
    let e = lvm.remove(name).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(
        e.to_string().contains("is open") && e.message().contains("unmount or close it"),
        "{e}"
    );
    assert!(
        lvs(&d.vg).find(name).is_some(),
        "the open LV is still there"
    );
    drop(held);
    lvm.remove(name).await.unwrap();
    assert!(lvs(&d.vg).find(name).is_none());

    let missing = Arc::new(Lvm::new(&cfg("tpt-no-such-vg")));
    assert!(!missing.vg_exists().await.unwrap());
    let e = missing.fresh_report().await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(
        e.to_string()
            .contains("volume group tpt-no-such-vg does not exist"),
        "{e}"
    );
    let e = missing
        .create_thin("csi-x", 8 * MIB, &[], None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}

/// The driver's writes leave no copy of the VG's metadata in LVM's archive
/// unless `lvm_metadata_archive` asks for one; the current copy in LVM's
/// backup is written either way.
#[tokio::test(flavor = "multi_thread")]
async fn writes_skip_lvms_metadata_archive_unless_configured() {
    fn archived(vg: &str) -> usize {
        let prefix = format!("{vg}_");
        std::fs::read_dir("/etc/lvm/archive").map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
            .count()
        })
    }
    for (tag, extra, archives) in [
        ("noarch", "", false),
        ("arch", "lvm_metadata_archive = true\n", true),
    ] {
        let d = TestDriver::start(tag, 64 * MIB, extra).await;
        let mut c = d.controller().await;
        let before = archived(&d.vg);
        let v = c
            .create_volume(create_req(&format!("pvc-{tag}"), 4 * MIB, block_cap()))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let backup = std::fs::read_to_string(format!("/etc/lvm/backup/{}", d.vg)).unwrap();
        assert!(
            backup.contains(&v.volume_id),
            "{tag}: LVM's backup of {} lacks the new LV {}",
            d.vg,
            v.volume_id
        );
        c.delete_volume(del(&v.volume_id)).await.unwrap();
        let after = archived(&d.vg);
        eprintln!("MEASURE metadata archive ({tag}): {before} files before a create and a delete, {after} after");
        if archives {
            // At least one per command (LVM 2.03.16 made 4 files for
            // this create and delete).
            assert!(after >= before + 2, "{tag}: {before} -> {after}");
        } else {
            assert_eq!(after, before, "{tag}: the driver's writes archived");
        }
    }
}

/// The driver sends its LVM commands, one line each, to LVM's own shell
/// with the profile lvm2 ships (one start-up check, `version`, per shell),
/// a shell that dies while idle is replaced, and `lvm_shell = false`
/// starts `lvm` for each command.
#[tokio::test(flavor = "multi_thread")]
async fn lvm_commands_go_to_lvms_shell_unless_turned_off() {
    use crate::harness::{counting_lvm, descendants, file_lines as lines};
    // What the wrapper wrote for `sub`: a shell line carries the whole
    // command, an exec'd lvm only its subcommand.
    fn count(lines: &[String], sub: &str, in_shell: bool) -> usize {
        let prefix = format!("{sub} ");
        lines
            .iter()
            .filter(|l| {
                if in_shell {
                    l.starts_with(&prefix)
                } else {
                    *l == sub
                }
            })
            .count()
    }
    for (tag, extra, shell) in [
        ("shell", "", true),
        ("noshell", "lvm_shell = false\n", false),
    ] {
        let tools = tempfile::tempdir().unwrap();
        let (wrapper, log) = counting_lvm(tools.path());
        let d = TestDriver::start(
            tag,
            64 * MIB,
            &format!("{extra}lvm_binary = \"{}\"\n", wrapper.display()),
        )
        .await;
        let mut c = d.controller().await;
        let before = lines(&log);
        let mut ids = Vec::new();
        for name in ["a", "b"] {
            let v = c
                .create_volume(create_req(
                    &format!("pvc-{tag}-{name}"),
                    4 * MIB,
                    block_cap(),
                ))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
            ids.push(v.volume_id);
        }
        c.delete_volume(del(&ids[0])).await.unwrap();
        let all = lines(&log);
        let during = &all[before.len()..];
        let said: Vec<String> = d
            .log()
            .lines()
            .filter(|l| l.contains("shell"))
            .map(String::from)
            .collect();
        assert_eq!(
            count(during, "lvcreate", shell),
            2,
            "{tag}: {during:?}; the driver said: {said:?}"
        );
        assert_eq!(count(during, "lvremove", shell), 1, "{tag}: {during:?}");
        assert_eq!(count(during, "lvcreate", !shell), 0, "{tag}: {during:?}");
        let starts = |l: &[String]| l.iter().filter(|l| *l == "version").count();
        if !shell {
            assert_eq!(starts(&all), 0, "{tag}: a shell was started: {all:?}");
            continue;
        }
        assert!(starts(&all) >= 1, "no shell was started: {all:?}");
        let shells: Vec<i32> = descendants(d.pid() as i32)
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "lvm")
            })
            .collect();
        assert!(!shells.is_empty(), "no lvm shell waits after the calls");
        // An idle shell that gets SIGINT ends; the next command gets a new
        // one. A shell still busy (a background lvs) finishes its command
        // first, so SIGINT goes again until every one has ended.
        let ended = |p: &i32| {
            !std::path::Path::new(&format!("/proc/{p}")).exists()
                || std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        };
        for _ in 0..200 {
            let left: Vec<&i32> = shells.iter().filter(|p| !ended(p)).collect();
            if left.is_empty() {
                break;
            }
            for p in left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*p),
                    nix::sys::signal::Signal::SIGINT,
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(
            shells.iter().all(ended),
            "an lvm shell outlived SIGINT for 10 s"
        );
        let started = starts(&lines(&log));
        c.create_volume(create_req(&format!("pvc-{tag}-c"), 4 * MIB, block_cap()))
            .await
            .unwrap();
        assert_eq!(
            starts(&lines(&log)),
            started + 1,
            "the create after the shells ended did not start a new one: {:?}",
            lines(&log)
        );
    }
}
