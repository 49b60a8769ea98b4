//! kubelet's own calls, replayed in its order, with its paths and its
//! file-system work between them, against the driver started on the node
//! image's LVM configuration (`deploy/lvm/`, as the Dockerfile installs
//! it) and the DaemonSet's driver settings (`deploy/kubernetes/base/
//! config.yaml`). Written from kubelet 1.3x's `pkg/volume/csi`
//! (`csi_attacher.go`, `csi_mounter.go`, `csi_block.go`, `expander.go`,
//! `csi_client.go`, `csi_metrics.go`), `pkg/volume/util`
//! (`MapBlockVolume`, `volumepathhandler`) and `pkg/volume/volume_linux.go`
//! (`SetVolumeOwnership`):
//!
//! - before each operation kubelet asks NodeGetCapabilities, and decides
//!   from the answer: staging, who applies fsGroup (VOLUME_MOUNT_GROUP:
//!   the driver, through `volume_mount_group`; else kubelet, after
//!   NodePublishVolume, because the CSIDriver's fsGroupPolicy is File),
//!   and what ReadWriteOnce becomes (SINGLE_NODE_MULTI_WRITER when
//!   advertised, else SINGLE_NODE_WRITER);
//! - filesystem volume: staging at `plugins/kubernetes.io/csi/<driver>/
//!   <sha256 of the volume handle>/globalmount`, which kubelet makes
//!   (0750) with `vol_data.json` beside it; publish at `pods/<uid>/volumes/
//!   kubernetes.io~csi/<pv>/mount`, whose parent kubelet makes with its
//!   `vol_data.json`; stats and expansion at the publish path;
//! - raw block volume: staging at `plugins/kubernetes.io/csi/
//!   volumeDevices/staging/<pv>`, publish at `volumeDevices/publish/<pv>/
//!   <uid>`, then kubelet's `MapBlockVolume`: a bind mount of the published
//!   node on `volumeDevices/<pv>/dev/<uid>`, a symlink in the pod's
//!   `volumeDevices/kubernetes.io~csi/`, and a loop device on the bind
//!   mount that holds the device open (`AttachFileDevice`); stats at the
//!   bind mount;
//! - a restart in the middle (the node plugin's, so the plugin registers
//!   again and kubelet asks NodeGetInfo; and kubelet's, which reconstructs
//!   its volumes and issues NodeStageVolume and NodePublishVolume again,
//!   with the same arguments, then fsGroup again);
//! - teardown in kubelet's order, with kubelet's removal of its own files.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use thinpool_csi::mountinfo::MountInfo;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::node_service_capability::rpc::Type as NodeCap;
use thinpool_csi::proto::csi::v1::node_service_capability::Type as NodeCapType;
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use thinpool_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;

use crate::fixtures::{mounts_under, read_at, s, write_at, Kubelet};
use crate::harness::{
    dm_devices, dm_name, lvs, rdev_of, sh, TestDriver, DRIVER_NAME, MIB, NODE_ID,
};

/// The pods' UIDs.
const U1: &str = "5d3c1b0e-7a41-4c57-9b0e-3f2a6d1c0001";
const U2: &str = "5d3c1b0e-7a41-4c57-9b0e-3f2a6d1c0002";
/// The pod's securityContext: runAsUser, runAsGroup, fsGroup.
const POD_UID: u32 = 1000;
const POD_GID: u32 = 1000;
const FS_GROUP: u32 = 2000;

/// The driver settings of `deploy/kubernetes/base/config.yaml` that the
/// harness does not already write (it writes `udev = "off"`; the
/// deployment keeps `controller_expansion = true`, the default).
const DAEMONSET_SETTINGS: &str = "overprovision_ratio = 4.0\ndefault_fs_type = \"ext4\"\n";

/// The node image's LVM system directory, as the Dockerfile builds it:
/// a link to the host's `lvm.conf` and `devices`, a copy of lvm2's
/// command profiles, and `deploy/lvm/lvmlocal.conf`, whose only absolute
/// path into the image (`profile_dir`) is pointed at this copy. The host
/// stands in for a stock one, which monitors (`activation/monitoring`
/// is 1 by default): this machine's `lvm.conf` with monitoring turned on
/// (the VM's turns it off), so that only the image's file keeps dmeventd
/// away.
fn image_lvm_system_dir(at: &Path) -> PathBuf {
    let host = at.join("host-etc-lvm");
    std::fs::create_dir_all(&host).unwrap();
    let conf = std::fs::read_to_string("/etc/lvm/lvm.conf").unwrap_or_default();
    let off = monitoring_off_line(&conf);
    let conf = match off {
        Some(line) => conf.replace(&line, "monitoring = 1"),
        None => conf,
    };
    std::fs::write(host.join("lvm.conf"), conf).unwrap();
    let sys = at.join("lvm");
    std::fs::create_dir_all(&sys).unwrap();
    std::os::unix::fs::symlink(host.join("lvm.conf"), sys.join("lvm.conf")).unwrap();
    std::os::unix::fs::symlink(host.join("devices"), sys.join("devices")).unwrap();
    sh("cp", &["-a", "/etc/lvm/profile", &s(&sys.join("profile"))]);
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/lvm/lvmlocal.conf"),
    )
    .unwrap();
    let image_profiles = "profile_dir = \"/usr/local/share/thinpool-csi/lvm/profile\"";
    assert_eq!(shipped.matches(image_profiles).count(), 1, "{shipped}");
    let local = shipped.replace(
        image_profiles,
        &format!("profile_dir = \"{}\"", sys.join("profile").display()),
    );
    std::fs::write(sys.join("lvmlocal.conf"), local).unwrap();
    sys
}

/// The line of `conf` that turns monitoring off, if one does.
fn monitoring_off_line(conf: &str) -> Option<String> {
    conf.lines()
        .map(str::trim)
        .find(|l| {
            let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
            l == "monitoring=0"
        })
        .map(str::to_string)
}

/// One setting as LVM reads it with `LVM_SYSTEM_DIR=sys`.
fn lvm_setting(sys: &Path, key: &str) -> String {
    let out = Command::new("lvmconfig")
        .args(["--type", "full", key])
        .env("LVM_SYSTEM_DIR", sys)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "lvmconfig {key}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The processes named `comm` on this machine.
fn processes(comm: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == comm)
                .unwrap_or(false)
        })
        .collect()
}

/// The environment of process `pid`.
fn environ(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

/// The device numbers of volume `id`'s LV, from device-mapper.
fn lv_dev(vg: &str, id: &str) -> Option<(u32, u32)> {
    let name = dm_name(vg, id);
    dm_devices()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, d)| d)
}

/// The PV of a bound claim, as kubelet reads it.
struct Pv {
    name: String,
    handle: String,
    /// `spec.csi.fsType`; empty for a raw block volume.
    fs_type: String,
    /// `spec.csi.volumeAttributes`: CreateVolume's volume_context.
    attributes: HashMap<String, String>,
    /// The VolumeAttachment's `status.attachmentMetadata`: empty, as
    /// external-attacher's trivial handler leaves it.
    publish_context: HashMap<String, String>,
}

/// kubelet: its directory (the driver's `allowed_roots`) and its client
/// on the driver's socket; each method is one of kubelet's operations.
struct Kl {
    k: Kubelet,
    n: NodeClient<Channel>,
}

impl Kl {
    /// Registration: kubelet's NodeGetInfo after the plugin registers,
    /// which must name this node.
    async fn registers(&mut self) {
        let info = self
            .n
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.node_id, NODE_ID);
    }

    fn root(&self) -> &Path {
        self.k.root.path()
    }

    /// `plugins/kubernetes.io/csi`.
    fn csi(&self) -> PathBuf {
        self.root().join("plugins/kubernetes.io/csi")
    }

    /// NodeGetCapabilities, as kubelet asks it before every operation.
    async fn caps(&mut self) -> Vec<NodeCap> {
        self.n
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(NodeCapType::Rpc(r)) => NodeCap::try_from(r.r#type).ok(),
                _ => None,
            })
            .collect()
    }

    /// ReadWriteOnce in kubelet's access mode mapper.
    async fn rwo(&mut self) -> Mode {
        if self.caps().await.contains(&NodeCap::SingleNodeMultiWriter) {
            Mode::SingleNodeMultiWriter
        } else {
            Mode::SingleNodeWriter
        }
    }

    async fn fs_cap(&mut self, pv: &Pv) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode {
                mode: self.rwo().await as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: pv.fs_type.clone(),
                mount_flags: vec![],
                ..Default::default()
            })),
        }
    }

    async fn block_cap(&mut self) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode {
                mode: self.rwo().await as i32,
            }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }
    }

    /// `makeDeviceMountPath`: `<driver>/<sha256 hex of the handle>/globalmount`.
    fn globalmount(&self, pv: &Pv) -> PathBuf {
        let sha = hex(&Sha256::digest(pv.handle.as_bytes()));
        self.csi().join(DRIVER_NAME).join(sha).join("globalmount")
    }

    /// `csiMountMgr.GetPath`.
    fn pod_mount(&self, pod: &str, pv: &Pv) -> PathBuf {
        self.root()
            .join("pods")
            .join(pod)
            .join("volumes/kubernetes.io~csi")
            .join(&pv.name)
            .join("mount")
    }

    fn block_staging(&self, pv: &Pv) -> PathBuf {
        self.csi().join("volumeDevices/staging").join(&pv.name)
    }

    fn block_publish(&self, pod: &str, pv: &Pv) -> PathBuf {
        self.csi()
            .join("volumeDevices/publish")
            .join(&pv.name)
            .join(pod)
    }

    /// `GetGlobalMapPath`: `volumeDevices/<pv>/dev`.
    fn global_map(&self, pv: &Pv) -> PathBuf {
        self.csi().join("volumeDevices").join(&pv.name).join("dev")
    }

    /// The pod's device link (`GetPodDeviceMapPath` + the PV's name).
    fn pod_device(&self, pod: &str, pv: &Pv) -> PathBuf {
        self.root()
            .join("pods")
            .join(pod)
            .join("volumeDevices/kubernetes.io~csi")
            .join(&pv.name)
    }

    /// `csiAttacher.MountDevice`.
    async fn mount_device(&mut self, pv: &Pv) -> PathBuf {
        let caps = self.caps().await;
        assert!(caps.contains(&NodeCap::StageUnstageVolume), "{caps:?}");
        let gm = self.globalmount(pv);
        mkdir_all(&gm);
        save_vol_data(
            gm.parent().unwrap(),
            &[("volumeHandle", &pv.handle), ("driverName", DRIVER_NAME)],
        );
        // VOLUME_MOUNT_GROUP decides whether NodeStage gets the fsGroup.
        let group = self.caps().await.contains(&NodeCap::VolumeMountGroup);
        let cap = self.fs_cap(pv).await;
        let mut cap = cap;
        if group {
            if let Some(AccessType::Mount(m)) = cap.access_type.as_mut() {
                m.volume_mount_group = FS_GROUP.to_string();
            }
        }
        self.n
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: pv.handle.clone(),
                publish_context: pv.publish_context.clone(),
                staging_target_path: s(&gm),
                volume_capability: Some(cap),
                secrets: HashMap::new(),
                volume_context: pv.attributes.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeStageVolume at {}: {e}", gm.display()));
        gm
    }

    /// `NewMounter` then `csiMountMgr.SetUpAt`, then `SetVolumeOwnership`
    /// when the driver does not take the fsGroup.
    async fn set_up(&mut self, pod: &str, pv: &Pv) -> PathBuf {
        let dir = self.pod_mount(pod, pv);
        let data_dir = dir.parent().unwrap();
        mkdir_all(data_dir);
        let attachment = format!(
            "csi-{}",
            hex(&Sha256::digest(
                format!("{}{DRIVER_NAME}{NODE_ID}", pv.handle).as_bytes()
            ))
        );
        save_vol_data(
            data_dir,
            &[
                ("specVolID", &pv.name),
                ("volumeHandle", &pv.handle),
                ("driverName", DRIVER_NAME),
                ("nodeName", NODE_ID),
                ("volumeLifecycleMode", "Persistent"),
                ("attachmentID", &attachment),
            ],
        );
        let caps = self.caps().await;
        assert!(caps.contains(&NodeCap::StageUnstageVolume));
        let gm = self.globalmount(pv);
        let group = self.caps().await.contains(&NodeCap::VolumeMountGroup);
        let mut cap = self.fs_cap(pv).await;
        if group {
            if let Some(AccessType::Mount(m)) = cap.access_type.as_mut() {
                m.volume_mount_group = FS_GROUP.to_string();
            }
        }
        self.n
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: pv.handle.clone(),
                publish_context: pv.publish_context.clone(),
                staging_target_path: s(&gm),
                target_path: s(&dir),
                volume_capability: Some(cap),
                readonly: false,
                secrets: HashMap::new(),
                volume_context: pv.attributes.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("NodePublishVolume at {}: {e}", dir.display()));
        if !group {
            set_volume_ownership(&dir, FS_GROUP);
        }
        dir
    }

    /// `csiMountMgr.TearDownAt`, then kubelet's `removeMountDir`.
    async fn tear_down(&mut self, pod: &str, pv: &Pv) {
        let dir = self.pod_mount(pod, pv);
        self.n
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: pv.handle.clone(),
                target_path: s(&dir),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeUnpublishVolume at {}: {e}", dir.display()));
        assert!(!is_mounted(&dir), "{} is still mounted", dir.display());
        remove_mount_dir(&dir);
    }

    /// `csiAttacher.UnmountDevice`.
    async fn unmount_device(&mut self, pv: &Pv) {
        let caps = self.caps().await;
        assert!(caps.contains(&NodeCap::StageUnstageVolume));
        let gm = self.globalmount(pv);
        self.n
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: pv.handle.clone(),
                staging_target_path: s(&gm),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeUnstageVolume at {}: {e}", gm.display()));
        assert!(!is_mounted(&gm), "{} is still mounted", gm.display());
        remove_mount_dir(&gm);
    }

    /// `csiBlockMapper.SetUpDevice` (`stageVolumeForBlock`), with the
    /// mapper's `vol_data.json` (`NewBlockVolumeMapper`).
    async fn set_up_device(&mut self, pv: &Pv) -> PathBuf {
        let data = self.csi().join("volumeDevices").join(&pv.name).join("data");
        mkdir_all(&data);
        save_vol_data(
            &data,
            &[
                ("specVolID", &pv.name),
                ("volumeHandle", &pv.handle),
                ("driverName", DRIVER_NAME),
                ("nodeName", NODE_ID),
                ("volumeLifecycleMode", "Persistent"),
            ],
        );
        let caps = self.caps().await;
        assert!(caps.contains(&NodeCap::StageUnstageVolume));
        let staging = self.block_staging(pv);
        mkdir_all(&staging);
        let cap = self.block_cap().await;
        self.n
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: pv.handle.clone(),
                publish_context: pv.publish_context.clone(),
                staging_target_path: s(&staging),
                volume_capability: Some(cap),
                secrets: HashMap::new(),
                volume_context: pv.attributes.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeStageVolume at {}: {e}", staging.display()));
        staging
    }

    /// `csiBlockMapper.MapPodDevice` (`publishVolumeForBlock`), then
    /// `util.MapBlockVolume`. Returns the publish path and the bind mount.
    async fn map_pod_device(&mut self, pod: &str, pv: &Pv) -> (PathBuf, PathBuf) {
        let caps = self.caps().await;
        assert!(caps.contains(&NodeCap::StageUnstageVolume));
        let publish = self.block_publish(pod, pv);
        mkdir_all(publish.parent().unwrap());
        let cap = self.block_cap().await;
        self.n
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: pv.handle.clone(),
                publish_context: pv.publish_context.clone(),
                staging_target_path: s(&self.block_staging(pv)),
                target_path: s(&publish),
                volume_capability: Some(cap),
                readonly: false,
                secrets: HashMap::new(),
                volume_context: pv.attributes.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("NodePublishVolume at {}: {e}", publish.display()));

        // MapDevice(publish, globalMapPath, podUID, bindMount): an empty
        // file and a bind mount on it, skipped when a device is there.
        let global = self.global_map(pv);
        mkdir_all(&global);
        let bind = global.join(pod);
        let is_dev = std::fs::metadata(&bind)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if !is_dev {
            if !bind.exists() {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&bind)
                    .unwrap();
                std::fs::set_permissions(&bind, std::fs::Permissions::from_mode(0o750)).unwrap();
            }
            sh("mount", &["--bind", &s(&publish), &s(&bind)]);
        }
        // MapDevice(publish, podVolumeMapPath, pv, symlink).
        let link = self.pod_device(pod, pv);
        mkdir_all(link.parent().unwrap());
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link).unwrap();
        }
        std::os::unix::fs::symlink(&publish, &link).unwrap();
        // AttachFileDevice: a loop device on the bind mount, which holds
        // the device open; one that is there already is kept.
        if loop_of(&bind).is_none() {
            sh("losetup", &["-f", "--show", &s(&bind)]);
        }
        (publish, bind)
    }

    /// `util.UnmapBlockVolume`, `csiBlockMapper.UnmapPodDevice`, then
    /// `TearDownDevice` and kubelet's removal of its block directories.
    async fn unmap(&mut self, pod: &str, pv: &Pv) {
        let global = self.global_map(pv);
        let bind = global.join(pod);
        // DetachFileDevice.
        let lo = loop_of(&bind).expect("kubelet's loop device on the bind mount");
        sh("losetup", &["-d", &lo]);
        // The pod's link, then the bind mount and its file.
        std::fs::remove_file(self.pod_device(pod, pv)).unwrap();
        sh("umount", &[&s(&bind)]);
        std::fs::remove_file(&bind).unwrap();

        let caps = self.caps().await;
        assert!(caps.contains(&NodeCap::StageUnstageVolume));
        let publish = self.block_publish(pod, pv);
        self.n
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: pv.handle.clone(),
                target_path: s(&publish),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeUnpublishVolume at {}: {e}", publish.display()));
        assert!(
            std::fs::symlink_metadata(&publish).is_err(),
            "NodeUnpublishVolume leaves nothing at {}",
            publish.display()
        );
        let _ = std::fs::remove_dir(publish.parent().unwrap());

        let staging = self.block_staging(pv);
        self.n
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: pv.handle.clone(),
                staging_target_path: s(&staging),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeUnstageVolume at {}: {e}", staging.display()));
        assert!(!is_mounted(&staging));
        let _ = std::fs::remove_dir(&staging);
        let _ = std::fs::remove_dir(&global);
        let data = global.parent().unwrap().join("data");
        std::fs::remove_file(data.join("vol_data.json")).unwrap();
        std::fs::remove_dir(&data).unwrap();
        std::fs::remove_dir(global.parent().unwrap()).unwrap();
    }

    /// `csiPlugin.NodeExpand` of a filesystem volume: at the pod's mount,
    /// with the staging path, the PV's new capacity.
    async fn node_expand(&mut self, pod: &str, pv: &Pv, bytes: u64) -> i64 {
        assert!(self.caps().await.contains(&NodeCap::ExpandVolume));
        let cap = self.fs_cap(pv).await;
        self.n
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: pv.handle.clone(),
                volume_path: s(&self.pod_mount(pod, pv)),
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes as i64,
                    limit_bytes: 0,
                }),
                staging_target_path: s(&self.globalmount(pv)),
                volume_capability: Some(cap),
                secrets: HashMap::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeExpandVolume: {e}"))
            .into_inner()
            .capacity_bytes
    }

    /// `metricsCsi.GetMetrics` at `path`.
    async fn stats(&mut self, pv: &Pv, path: &Path) -> NodeGetVolumeStatsResponse {
        assert!(self.caps().await.contains(&NodeCap::GetVolumeStats));
        self.n
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: pv.handle.clone(),
                volume_path: s(path),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("NodeGetVolumeStats at {}: {e}", path.display()))
            .into_inner()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mkdir_all(p: &Path) {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(p)
        .unwrap();
}

/// `saveVolumeData`: `vol_data.json` in `dir`.
fn save_vol_data(dir: &Path, data: &[(&str, &str)]) {
    let map: HashMap<&str, &str> = data.iter().copied().collect();
    std::fs::write(dir.join("vol_data.json"), serde_json::to_vec(&map).unwrap()).unwrap();
}

/// kubelet's `removeMountDir`: the directory if it is there and nothing
/// is mounted on it, then `vol_data.json` and their directory.
fn remove_mount_dir(dir: &Path) {
    assert!(!is_mounted(dir));
    if dir.exists() {
        std::fs::remove_dir(dir).unwrap_or_else(|e| panic!("rmdir {}: {e}", dir.display()));
    }
    let data = dir.parent().unwrap();
    std::fs::remove_file(data.join("vol_data.json")).unwrap();
    std::fs::remove_dir(data).unwrap();
}

fn is_mounted(p: &Path) -> bool {
    MountInfo::read().unwrap().is_mount_point(p)
}

/// `GetLoopDevice`: the loop device backed by `path` (`losetup -j`).
fn loop_of(path: &Path) -> Option<String> {
    let out = sh("losetup", &["-j", &s(path)]);
    out.lines()
        .next()
        .and_then(|l| l.split(':').next())
        .map(str::to_string)
}

/// kubelet's `SetVolumeOwnership` (fsGroupChangePolicy Always): every
/// file's group becomes `gid`, with read-write for the group, and
/// directories get the group's execute bit and setgid. Symlinks get the
/// group only.
fn set_volume_ownership(dir: &Path, gid: u32) {
    let info = std::fs::symlink_metadata(dir).unwrap();
    std::os::unix::fs::lchown(dir, None, Some(gid)).unwrap();
    if info.file_type().is_symlink() {
        return;
    }
    let mut mask = 0o660;
    if info.is_dir() {
        mask |= 0o2000 | 0o110;
    }
    std::fs::set_permissions(
        dir,
        std::fs::Permissions::from_mode((info.mode() & 0o7777) | mask),
    )
    .unwrap();
    if info.is_dir() {
        for e in std::fs::read_dir(dir).unwrap() {
            set_volume_ownership(&e.unwrap().path(), gid);
        }
    }
}

/// Every file under `dir` (itself included) has group `gid`, group
/// read-write, and directories have setgid and the group's execute bit.
fn assert_owned(dir: &Path, gid: u32) {
    let m = std::fs::symlink_metadata(dir).unwrap();
    assert_eq!(m.gid(), gid, "group of {}", dir.display());
    assert_eq!(m.mode() & 0o060, 0o060, "{}: {:o}", dir.display(), m.mode());
    if m.is_dir() {
        assert_eq!(
            m.mode() & 0o2010,
            0o2010,
            "{}: {:o}",
            dir.display(),
            m.mode()
        );
        for e in std::fs::read_dir(dir).unwrap() {
            assert_owned(&e.unwrap().path(), gid);
        }
    }
}

/// Runs `sh -c script` as the pod's user (runAsUser, runAsGroup) with
/// `groups` as its supplementary groups, in the volume's root `dir` as a
/// container sees it (its own mount of the volume: none of kubelet's
/// directories above it on the way); returns whether it succeeded.
fn as_pod(groups: &str, script: &str, dir: &Path) -> bool {
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={POD_UID}"),
            &format!("--regid={POD_GID}"),
            &format!("--groups={groups}"),
            "--",
            "sh",
            "-c",
            script,
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "as the pod (groups {groups}): {script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

/// external-provisioner's CreateVolume for a WaitForFirstConsumer claim
/// on this node (ReadWriteOnce: SINGLE_NODE_MULTI_WRITER, which the
/// controller advertises; `--extra-create-metadata`); the PV that
/// results. external-attacher makes no CSI call: without
/// PUBLISH_UNPUBLISH_VOLUME its trivial handler marks the VolumeAttachment
/// attached, with no attachment metadata.
async fn provision(c: &mut ControllerClient<Channel>, name: &str, bytes: u64, block: bool) -> Pv {
    let topology = Topology {
        segments: [(format!("topology.{DRIVER_NAME}/node"), NODE_ID.to_string())].into(),
    };
    let cap = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeMultiWriter as i32,
        }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })
        }),
    };
    let vol = c
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: [
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "default"),
                ("csi.storage.k8s.io/pv/name", name),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            accessibility_requirements: Some(TopologyRequirement {
                requisite: vec![topology.clone()],
                preferred: vec![topology],
            }),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {name}: {e}"))
        .into_inner()
        .volume
        .unwrap();
    Pv {
        name: name.into(),
        handle: vol.volume_id,
        fs_type: if block { String::new() } else { "ext4".into() },
        attributes: vol.volume_context,
        publish_context: HashMap::new(),
    }
}

/// The image's LVM system directory under `at`, checked: monitoring off
/// there (and on in the stand-in host's), the profiles the driver's LVM
/// shell needs found in it.
fn image_lvm(at: &Path) -> PathBuf {
    let sys = image_lvm_system_dir(at);
    assert_eq!(lvm_setting(&sys, "activation/monitoring"), "monitoring=0");
    let host_only = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(sys.join("lvm.conf"), host_only.path().join("lvm.conf")).unwrap();
    assert_eq!(
        lvm_setting(host_only.path(), "activation/monitoring"),
        "monitoring=1",
        "the stand-in host's lvm.conf monitors"
    );
    assert_eq!(
        lvm_setting(&sys, "config/profile_dir"),
        format!("profile_dir=\"{}\"", sys.join("profile").display())
    );
    assert!(sys.join("profile/lvmdbusd.profile").exists());
    sys
}

/// fsGroup, applied (by kubelet, when the driver does not take it): the
/// pod's user, in group FS_GROUP only through the pod's fsGroup, writes
/// to `mnt`; a user without it cannot.
fn pod_writes_through_its_fs_group(mnt: &Path, driver_takes_group: bool) {
    if !driver_takes_group {
        assert_owned(mnt, FS_GROUP);
    }
    assert!(
        as_pod(
            &FS_GROUP.to_string(),
            "mkdir app && echo written-by-the-pod > app/data",
            mnt
        ),
        "the pod with fsGroup {FS_GROUP} writes to its volume"
    );
    let app = mnt.join("app/data");
    let m = std::fs::metadata(&app).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (POD_UID, FS_GROUP),
        "new files inherit the fsGroup"
    );
    assert!(
        !as_pod("3000", "echo x > other", mnt),
        "a user outside the fsGroup cannot write"
    );
}

/// NodeGetVolumeStats at the pod's mount agrees with statvfs; then the
/// claim grows to 64 MiB (the central resizer's ControllerExpandVolume
/// grows the LV and asks for node expansion; kubelet calls
/// NodeExpandVolume) and the filesystem grows. The filesystem's size
/// before.
async fn stats_then_node_expand(
    kl: &mut Kl,
    c: &mut ControllerClient<Channel>,
    vg: &str,
    pv_fs: &Pv,
    mnt: &Path,
) -> i64 {
    let st = kl.stats(pv_fs, mnt).await;
    let bytes = st
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes usage");
    let inodes = st
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Inodes as i32)
        .expect("inodes usage");
    let vfs = nix::sys::statvfs::statvfs(mnt).unwrap();
    assert_eq!(
        bytes.total as u64,
        vfs.blocks() as u64 * vfs.fragment_size() as u64
    );
    assert!(bytes.used > 0 && inodes.used > 0, "{st:?}");
    assert!(!st.volume_condition.unwrap().abnormal);
    let total_before = bytes.total;

    // The claim grows to 64 MiB: the resizer's ControllerExpandVolume
    // (as external-resizer v2.2.1 sends it: the new size as
    // required_bytes, the PV's capability) grows the LV; a filesystem
    // needs the node's part too.
    let cap = kl.fs_cap(pv_fs).await;
    let grown = c
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: pv_fs.handle.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: (64 * MIB) as i64,
                limit_bytes: 0,
            }),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("ControllerExpandVolume: {e}"))
        .into_inner();
    assert!(grown.capacity_bytes >= (64 * MIB) as i64, "{grown:?}");
    assert!(
        grown.node_expansion_required,
        "a filesystem grows on the node"
    );
    assert_eq!(lvs(vg).find(&pv_fs.handle).unwrap().size, 64 * MIB);
    let got = kl.node_expand(U1, pv_fs, 64 * MIB).await;
    assert!(got >= (64 * MIB) as i64, "NodeExpandVolume answered {got}");
    assert_eq!(
        lvs(vg).find(&pv_fs.handle).unwrap().size,
        64 * MIB,
        "the LV grew"
    );
    let st = kl.stats(pv_fs, mnt).await;
    assert!(
        st.usage[0].total > total_before + (24 * MIB) as i64,
        "the filesystem grew: {} -> {}",
        total_before,
        st.usage[0].total
    );
    total_before
}

/// The LVM shells the driver's start-up opened run with the image's
/// LVM_SYSTEM_DIR, `sys`.
fn lvm_shells_run_with(d: &TestDriver, sys: &Path) {
    let want = format!("LVM_SYSTEM_DIR={}", sys.display());
    let shells: Vec<i32> = crate::harness::descendants(d.pid() as i32)
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .map(|c| c.trim() == "lvm")
                .unwrap_or(false)
        })
        .collect();
    assert!(!shells.is_empty(), "the driver keeps LVM shells");
    for p in &shells {
        assert!(environ(*p).contains(&want), "lvm {p} lacks {want}");
    }
}

/// Nothing of the volumes `pvs` remains after teardown: no mount under
/// kubelet's directory, no active LV, no loop device on `bind`, no file
/// under the pods' directories.
fn nothing_of_the_volumes_remains(kl: &Kl, vg: &str, pvs: &[&Pv], bind: &Path) {
    assert_eq!(mounts_under(kl.root()), Vec::<PathBuf>::new());
    for pv in pvs {
        assert_eq!(
            lv_dev(vg, &pv.handle),
            None,
            "{}'s LV is still active",
            pv.name
        );
    }
    assert!(
        sh("losetup", &["-j", &s(bind)]).trim().is_empty(),
        "kubelet's loop device is gone"
    );
    for pod in [U1, U2] {
        let dir = kl.root().join("pods").join(pod);
        let left: Vec<_> = walk(&dir).into_iter().filter(|p| !p.is_dir()).collect();
        assert!(
            left.is_empty(),
            "files left under {}: {left:?}",
            dir.display()
        );
    }
}

/// Every call succeeded, and the restart's heal had nothing to say
/// (failures are logged at WARN); no dmeventd was started on the image's
/// LVM configuration (beyond `before`).
fn no_warning_and_no_dmeventd(d: &TestDriver, before: &[i32]) {
    let log = d.log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(bad.is_empty(), "the driver logged:\n{}", bad.join("\n"));

    // No dmeventd was started on the image's LVM configuration.
    let started: Vec<i32> = processes("dmeventd")
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(started.is_empty(), "dmeventd started: {started:?}");
    assert!(
        !d.log().contains("dmeventd"),
        "the driver's log mentions dmeventd"
    );
}

/// kubelet's MountDevice (NodeStageVolume at its globalmount) and SetUp
/// (NodePublishVolume at the pod's mount) of the filesystem volume, both
/// on the LV's device: the globalmount, the LV's device numbers, the
/// pod's mount.
async fn stage_and_publish_fs(kl: &mut Kl, vg: &str, pv_fs: &Pv) -> (PathBuf, (u32, u32), PathBuf) {
    let gm = kl.mount_device(pv_fs).await;
    assert!(
        gm.starts_with(kl.csi().join(DRIVER_NAME)) && gm.ends_with("globalmount"),
        "{}",
        gm.display()
    );
    let fs_dev = lv_dev(vg, &pv_fs.handle).expect("the staged LV is active");
    let staged = MountInfo::read()
        .unwrap()
        .top_mount_at(&gm)
        .map(|m| (m.major, m.minor, m.fs_type.clone()));
    assert_eq!(staged, Some((fs_dev.0, fs_dev.1, "ext4".to_string())));
    let mnt = kl.set_up(U1, pv_fs).await;
    let published = MountInfo::read()
        .unwrap()
        .top_mount_at(&mnt)
        .map(|m| (m.major, m.minor, m.fs_type.clone()));
    assert_eq!(published, Some((fs_dev.0, fs_dev.1, "ext4".to_string())));
    assert!(
        mnt.parent().unwrap().join("vol_data.json").exists(),
        "kubelet's file beside the mount is left alone"
    );
    (gm, fs_dev, mnt)
}

/// NodeGetVolumeStats after the restart, at kubelet's paths: the grown
/// filesystem (larger than `total_before` by the growth), the block
/// volume's 16 MiB, both normal.
async fn stats_after_restart(kl: &mut Kl, fs: (&Pv, &Path), blk: (&Pv, &Path), total_before: i64) {
    let ((pv_fs, mnt), (pv_blk, bind)) = (fs, blk);
    let st = kl.stats(pv_fs, mnt).await;
    assert!(
        st.usage[0].total > total_before + (24 * MIB) as i64,
        "{st:?}"
    );
    assert!(!st.volume_condition.unwrap().abnormal);
    let st = kl.stats(pv_blk, bind).await;
    assert_eq!(st.usage[0].total, (16 * MIB) as i64);
    assert!(!st.volume_condition.unwrap().abnormal);
}

#[tokio::test(flavor = "multi_thread")]
async fn kubelets_calls_for_a_filesystem_and_a_block_pod_across_a_restart() {
    crate::harness::require_lvm();
    // The image's LVM: monitoring off (no dmeventd), the profiles the
    // driver's LVM shell needs.
    let lvm_dir = tempfile::Builder::new()
        .prefix("tpcsi-kubelet-lvm-")
        .tempdir()
        .unwrap();
    let sys = image_lvm(lvm_dir.path());
    let env = vec![("LVM_SYSTEM_DIR".to_string(), s(&sys))];
    let dmeventd_before = processes("dmeventd");

    let k = Kubelet::new("kl");
    let mut d = TestDriver::start_with_env(
        "kl",
        256 * MIB,
        &format!("{}{DAEMONSET_SETTINGS}", k.extra()),
        &env,
    )
    .await;
    let vg = d.vg.clone();

    let mut c: ControllerClient<Channel> = d.controller().await;
    // Registration: node-driver-registrar, then kubelet's NodeGetInfo.
    let mut kl = Kl {
        n: d.node().await,
        k,
    };
    kl.registers().await;

    // external-provisioner, for each claim (external-attacher makes no
    // CSI call).
    let pv_fs = provision(&mut c, "pv-fs", 32 * MIB, false).await;
    let pv_blk = provision(&mut c, "pv-blk", 16 * MIB, true).await;

    // Who applies the fsGroup: the driver only with VOLUME_MOUNT_GROUP.
    let driver_takes_group = kl.caps().await.contains(&NodeCap::VolumeMountGroup);

    // ---- pod U1: the filesystem volume.
    let (gm, fs_dev, mnt) = stage_and_publish_fs(&mut kl, &vg, &pv_fs).await;
    pod_writes_through_its_fs_group(&mnt, driver_takes_group);
    std::fs::write(mnt.join("before-restart"), b"fs data before the restart").unwrap();

    // Stats at the pod's mount; the claim grows to 64 MiB.
    let total_before = stats_then_node_expand(&mut kl, &mut c, &vg, &pv_fs, &mnt).await;

    // ---- pod U2: the raw block volume.
    let staging = kl.set_up_device(&pv_blk).await;
    assert!(staging.ends_with("volumeDevices/staging/pv-blk"));
    let blk_dev = lv_dev(&vg, &pv_blk.handle).expect("the staged LV is active");
    let (publish, bind) = kl.map_pod_device(U2, &pv_blk).await;
    assert_eq!(rdev_of(&publish), Some(blk_dev), "{}", publish.display());
    assert_eq!(rdev_of(&bind), Some(blk_dev), "{}", bind.display());
    assert!(is_mounted(&bind));
    let lo = loop_of(&bind).unwrap();
    let pod_dev = kl.pod_device(U2, &pv_blk);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    write_at(&pod_dev, 3 * MIB, &pattern).unwrap();
    let st = kl.stats(&pv_blk, &bind).await;
    assert_eq!(st.usage.len(), 1, "{st:?}");
    assert_eq!(st.usage[0].total, (16 * MIB) as i64);
    assert!(!st.volume_condition.unwrap().abnormal);

    // ---- the restart: the node plugin (it registers again), and kubelet,
    // which reconstructs both volumes and issues the same calls again.
    d.restart_with_env(&env).await;
    kl.n = d.node().await;
    kl.registers().await;
    lvm_shells_run_with(&d, &sys);
    assert_eq!(kl.mount_device(&pv_fs).await, gm);
    assert_eq!(kl.set_up(U1, &pv_fs).await, mnt);
    let staging_again = kl.set_up_device(&pv_blk).await;
    assert_eq!(staging_again, staging);
    let (publish_again, bind_again) = kl.map_pod_device(U2, &pv_blk).await;
    assert_eq!((&publish_again, &bind_again), (&publish, &bind));
    assert_eq!(
        loop_of(&bind).as_deref(),
        Some(lo.as_str()),
        "the same loop"
    );

    // Idempotent: one mount each, the same devices, the data intact.
    let info = MountInfo::read().unwrap();
    for p in [&gm, &mnt] {
        assert_eq!(info.mounts_at(p).len(), 1, "one mount at {}", p.display());
        let m = info.top_mount_at(p).unwrap();
        assert_eq!((m.major, m.minor), fs_dev, "{}", p.display());
    }
    assert_eq!(info.mounts_at(&bind).len(), 1);
    assert_eq!(lv_dev(&vg, &pv_fs.handle), Some(fs_dev));
    assert_eq!(lv_dev(&vg, &pv_blk.handle), Some(blk_dev));
    assert_eq!(rdev_of(&publish), Some(blk_dev));
    assert_eq!(rdev_of(&bind), Some(blk_dev));
    assert_eq!(
        std::fs::read(mnt.join("before-restart")).unwrap(),
        b"fs data before the restart"
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("app/data")).unwrap(),
        "written-by-the-pod\n"
    );
    if !driver_takes_group {
        assert_owned(&mnt, FS_GROUP);
    }
    assert!(as_pod(
        &FS_GROUP.to_string(),
        "echo again >> app/data",
        &mnt
    ));
    crate::harness::drop_caches();
    assert_eq!(read_at(&pod_dev, 3 * MIB, pattern.len()), pattern);

    // Stats after the restart, at kubelet's paths.
    stats_after_restart(&mut kl, (&pv_fs, &mnt), (&pv_blk, &bind), total_before).await;

    // ---- teardown, in kubelet's order (the attacher's detach makes no
    // CSI call).
    kl.tear_down(U1, &pv_fs).await;
    kl.unmount_device(&pv_fs).await;
    kl.unmap(U2, &pv_blk).await;

    nothing_of_the_volumes_remains(&kl, &vg, &[&pv_fs, &pv_blk], &bind);

    no_warning_and_no_dmeventd(&d, &dmeventd_before);
}

/// Every path under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.clone());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(walk(&p));
            }
        }
    }
    out
}
