//! CSI Node service. Each call: validate the request (ids, paths under
//! `allowed_roots`, capability), hold the volume's in-flight guard, prove
//! the volume is ours from a fresh LVM report, get the LV active, then hand
//! the work to the node layer (`crate::node`).
//!
//! Error codes follow the spec's tables: a volume id that is not ours is
//! NOT_FOUND; a capability that does not fit the volume's recorded access
//! is FAILED_PRECONDITION (INVALID_ARGUMENT for NodeExpandVolume); the same
//! path already set up with other arguments is ALREADY_EXISTS.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::controller::Owned;
use super::{reply, validate};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::lvm::report::{Lv, Report};
use crate::naming::{self, Access};
use crate::node::{self, block, fs, paths, Device, Tools};
use crate::proto::csi::v1::node_server::Node;
use crate::proto::csi::v1::node_service_capability::rpc::Type as RpcType;
use crate::proto::csi::v1::node_service_capability::{Rpc, Type as CapType};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::csi::v1::volume_capability::AccessType;
use crate::proto::csi::v1::volume_usage::Unit;
use crate::proto::csi::v1::*;

/// The node RPCs this driver implements and advertises.
pub const CAPABILITIES: &[RpcType] = &[
    RpcType::StageUnstageVolume,
    RpcType::GetVolumeStats,
    RpcType::ExpandVolume,
    RpcType::VolumeCondition,
    RpcType::SingleNodeMultiWriter,
];

pub struct NodeService {
    pub driver: Arc<Driver>,
    pub(super) tools: Tools,
}

impl NodeService {
    pub fn new(driver: Arc<Driver>) -> NodeService {
        let tools = Tools::new(&driver.cfg);
        NodeService { driver, tools }
    }
}

/// Whether a capability fits how the volume was created; `Err` says why
/// not. Volumes without a recorded access accept either.
fn access_fits(vol: &Owned, wanted: &Access) -> std::result::Result<(), String> {
    naming::fits(&vol.lv.name, vol.tags.access.as_ref(), wanted)
}

/// The access mode of a capability that `validate::capability` accepted.
pub(super) fn mode(cap: &VolumeCapability) -> Mode {
    cap.access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok())
        .unwrap_or(Mode::Unknown)
}

pub(super) fn mount_flags(cap: &VolumeCapability) -> &[String] {
    match &cap.access_type {
        Some(AccessType::Mount(m)) => &m.mount_flags,
        _ => &[],
    }
}

/// A publish is read-only when asked, and always for a reader-only mode.
pub fn effective_readonly(mode: Mode, readonly: bool) -> bool {
    readonly || mode == Mode::SingleNodeReaderOnly
}

/// Whether the pool zeroes newly provisioned chunks (lv_attr column 8):
/// then a fresh thin volume reads zeros everywhere, even inside partly
/// written chunks, and mkfs may skip zeroing inode tables.
pub fn pool_zeroes_new_chunks(pool_attr: &str) -> bool {
    pool_attr.chars().nth(7) == Some('z')
}

/// What staging needs to know of the pool in `report`.
pub(super) fn pool_state(d: &Driver, report: &Report) -> fs::PoolState {
    let pool = d.pool(report).ok();
    fs::PoolState {
        zeroes_new_chunks: pool.is_some_and(|p| pool_zeroes_new_chunks(&p.attr)),
        problem: pool.and_then(Lv::problem),
    }
}

/// The volume's device when its LV is active (no /dev changes).
fn current_device(d: &Driver, lv: &Lv) -> Option<Device> {
    let (major, minor) = lv.kernel.filter(|_| lv.is_active())?;
    Some(Device {
        volume_id: lv.name.clone(),
        path: PathBuf::from(d.lvm.dev_path(&lv.name)),
        major,
        minor,
    })
}

fn required_cap(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability> {
    cap.ok_or_else(|| Error::InvalidArgument("volume_capability is required".into()))
}

impl NodeService {
    pub(super) fn path(&self, field: &str, value: &str) -> Result<PathBuf> {
        paths::check(field, value, &self.driver.cfg.allowed_roots)
    }

    /// The real location of a checked path; `None` when its parent is
    /// missing.
    pub(super) fn resolve(&self, path: &Path) -> Result<Option<PathBuf>> {
        Ok(
            match paths::resolve(path, &self.driver.cfg.allowed_roots)? {
                paths::Resolved::At(p) => Some(p),
                paths::Resolved::ParentMissing => None,
            },
        )
    }

    /// Activates the LV when needed and returns its device, with the /dev
    /// node in place. The bool says whether this call activated it.
    pub(super) async fn activate(&self, lv: &Lv, id: &str) -> Result<(Device, bool)> {
        let d = &self.driver;
        let (lv, activated) = if lv.is_active() && lv.kernel.is_some() {
            (lv.clone(), false)
        } else {
            d.lvm.activate(id).await?;
            tracing::info!(id, "activated LV");
            let fresh = d.lvm.fresh_report().await?;
            (d.must_own(&fresh, id)?.lv.clone(), true)
        };
        let kernel = lv.kernel.ok_or_else(|| {
            Error::Internal(format!(
                "LV {id} is active but LVM reports no device numbers"
            ))
        })?;
        let dev = node::ensure_dev_node(id, Path::new(&d.lvm.dev_path(id)), kernel)?;
        Ok((dev, activated))
    }

    /// Deactivates the LV when nothing uses it any more; a failure is
    /// logged, not returned (the LV merely stays active).
    async fn deactivate_if_unused(&self, dev: &Device) {
        match node::device_unused(dev) {
            Ok(true) => match self.driver.lvm.deactivate(&dev.volume_id).await {
                Ok(()) => tracing::info!(id = dev.volume_id, "deactivated LV"),
                Err(e) => {
                    tracing::warn!(id = dev.volume_id, error = %e, "could not deactivate LV; it stays active")
                }
            },
            Ok(false) => tracing::info!(
                id = dev.volume_id,
                "LV still in use on this node; it stays active"
            ),
            Err(e) => {
                tracing::warn!(id = dev.volume_id, error = %e, "cannot tell whether the LV is in use; it stays active")
            }
        }
    }

    async fn stage(&self, req: NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let cap = required_cap(req.volume_capability.as_ref())?;
        let access = validate::capability(cap, &d.cfg.default_fs_type)?;
        let opts = match &access {
            Access::Mount { fs_type } => Some(fs::MountOptions::parse(fs_type, mount_flags(cap))?),
            Access::Block => None,
        };
        let _held = d.inflight.try_hold(id, "NodeStageVolume")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        access_fits(&vol, &access).map_err(Error::FailedPrecondition)?;
        let staging = self.resolve(&staging)?.ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "the parent directory of staging_target_path {} does not exist",
                staging.display()
            ))
        })?;
        let pool = pool_state(d, &report);
        let (dev, activated) = self.activate(vol.lv, id).await?;
        let res = match (&access, &opts) {
            (Access::Mount { fs_type }, Some(opts)) => {
                fs::stage(&self.tools, &dev, &staging, fs_type, opts, &pool).await
            }
            _ => block::stage(&dev, &staging),
        };
        if res.is_err() && activated {
            // Leave the LV as it was found.
            self.deactivate_if_unused(&dev).await;
        }
        res?;
        // Remember where it is staged, so a restarted driver can heal it.
        let tag = naming::staged_tag(&staging);
        let old = naming::staged_path(&vol.lv.tags).map(|(t, _)| t.to_string());
        if old.as_deref() != Some(tag.as_str()) {
            d.lvm.retag(id, old.as_deref(), Some(&tag)).await?;
        }
        Ok(NodeStageVolumeResponse {})
    }

    async fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<NodeUnstageVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let _held = d.inflight.try_hold(id, "NodeUnstageVolume")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        let dev = current_device(d, vol.lv);
        match self.resolve(&staging)? {
            Some(p) if p.exists() => node::unstage(&self.tools, dev.as_ref(), id, &p).await?,
            _ => {
                tracing::info!(id, staging = %staging.display(), "NodeUnstageVolume: staging path is gone")
            }
        }
        if let Some((tag, _)) = naming::staged_path(&vol.lv.tags) {
            d.lvm.retag(id, Some(tag), None).await?;
        }
        if let Some(dev) = &dev {
            self.deactivate_if_unused(dev).await;
        }
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<NodePublishVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let target = self.path("target_path", &req.target_path)?;
        if req.staging_target_path.is_empty() {
            return Err(Error::FailedPrecondition(
                "staging_target_path is required: this driver stages volumes (STAGE_UNSTAGE_VOLUME)".into(),
            ));
        }
        let staging = self.path("staging_target_path", &req.staging_target_path)?;
        let cap = required_cap(req.volume_capability.as_ref())?;
        let access = validate::capability(cap, &d.cfg.default_fs_type)?;
        let mode = mode(cap);
        let readonly = effective_readonly(mode, req.readonly);
        let _held = d.inflight.try_hold(id, "NodePublishVolume")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        access_fits(&vol, &access).map_err(Error::FailedPrecondition)?;
        let not_staged = || {
            Error::FailedPrecondition(format!(
                "volume {id} is not staged at {}: call NodeStageVolume first",
                staging.display()
            ))
        };
        let staging = self.resolve(&staging)?.ok_or_else(not_staged)?;
        let target = self.resolve(&target)?.ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "the parent directory of target_path {} does not exist",
                target.display()
            ))
        })?;
        let dev = current_device(d, vol.lv).ok_or_else(not_staged)?;
        let dev = node::ensure_dev_node(id, &dev.path, dev.numbers())?;
        match access {
            Access::Mount { .. } => fs::publish(
                &dev,
                &staging,
                &target,
                readonly,
                mode == Mode::SingleNodeSingleWriter,
            )?,
            Access::Block => {
                block::publish(&self.tools, &dev, &staging, &target, mode, readonly).await?
            }
        }
        Ok(NodePublishVolumeResponse {})
    }

    async fn unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let target = self.path("target_path", &req.target_path)?;
        let _held = d.inflight.try_hold(id, "NodeUnpublishVolume")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        let lv = current_device(d, vol.lv).map(|dev| dev.numbers());
        match self.resolve(&target)? {
            Some(p) => node::unpublish(&self.tools, lv, id, &p).await?,
            None => {
                tracing::info!(id, target = %target.display(), "NodeUnpublishVolume: target already gone")
            }
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let path = self.path("volume_path", &req.volume_path)?;
        if !req.staging_target_path.is_empty() {
            self.path("staging_target_path", &req.staging_target_path)?;
        }
        let report = d.lvm.report().await?;
        let vol = d.must_own(&report, id)?;
        let missing = || {
            Error::NotFound(format!(
                "volume {id} is not at {}: the path does not exist",
                path.display()
            ))
        };
        let real = self.resolve(&path)?.ok_or_else(missing)?;
        if std::fs::symlink_metadata(&real).is_err() {
            return Err(missing());
        }
        let health = d.condition(&report, vol.lv);
        let mut problems = Vec::new();
        if health.abnormal {
            problems.push(health.message);
        }
        let usage = match current_device(d, vol.lv) {
            Some(dev) => {
                let s = node::stats(&dev, &real)?;
                problems.extend(s.problems);
                s.usage
            }
            None => {
                problems.push(format!(
                    "LV {} is not active: the volume is not staged on this node, or was deactivated \
                     outside the driver; unstage and stage it again (restart the workload)",
                    d.lvm.lv_path(id)
                ));
                node::Usage::Unknown
            }
        };
        Ok(NodeGetVolumeStatsResponse {
            usage: volume_usage(&usage),
            volume_condition: Some(VolumeCondition {
                abnormal: !problems.is_empty(),
                message: if problems.is_empty() {
                    "volume, filesystem and thin pool are healthy".into()
                } else {
                    problems.join("; ")
                },
            }),
        })
    }

    async fn expand(&self, req: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let path = self.path("volume_path", &req.volume_path)?;
        let staging = if req.staging_target_path.is_empty() {
            None
        } else {
            Some(self.path("staging_target_path", &req.staging_target_path)?)
        };
        let requested = req
            .volume_capability
            .as_ref()
            .map(|c| validate::capability(c, &d.cfg.default_fs_type))
            .transpose()?;
        let (required, limit) = req
            .capacity_range
            .as_ref()
            .map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 {
            return Err(Error::InvalidArgument(
                "capacity_range must not be negative".into(),
            ));
        }
        let _held = d.inflight.try_hold(id, "NodeExpandVolume")?;
        let report = d.lvm.fresh_report().await?;
        let vol = d.must_own(&report, id)?;
        if let Some(a) = &requested {
            access_fits(&vol, a).map_err(Error::InvalidArgument)?;
        }
        let block_access = matches!(
            vol.tags.access.as_ref().or(requested.as_ref()),
            Some(Access::Block)
        );
        let real = self
            .resolve(&path)?
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "volume {id} is not at {}: the path does not exist",
                    path.display()
                ))
            })?;
        let staging = match staging {
            Some(s) => self.resolve(&s)?,
            None => None,
        };
        let dev = current_device(d, vol.lv).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "volume {id} is not staged on this node: stage it before NodeExpandVolume"
            ))
        })?;
        let mut at: Vec<&Path> = vec![&real];
        at.extend(staging.as_deref());
        let size = node::expand(&self.tools, &dev, block_access, &at).await?;
        if required as u64 > size {
            return Err(Error::OutOfRange(format!(
                "volume {id} is {size} bytes, less than the required {required}: ControllerExpandVolume must grow it first"
            )));
        }
        if limit > 0 && size > limit as u64 {
            return Err(Error::OutOfRange(format!(
                "volume {id} is {size} bytes, more than limit_bytes {limit}"
            )));
        }
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        })
    }
}

/// Usage as CSI reports it: bytes and inodes for a filesystem, the total
/// bytes for a block volume, nothing when unknown.
fn volume_usage(u: &node::Usage) -> Vec<VolumeUsage> {
    let n = |v: u64| v.min(i64::MAX as u64) as i64;
    match u {
        node::Usage::Filesystem(f) => vec![
            VolumeUsage {
                available: n(f.bytes_available),
                total: n(f.bytes_total),
                used: n(f.bytes_used),
                unit: Unit::Bytes as i32,
            },
            VolumeUsage {
                available: n(f.inodes_free),
                total: n(f.inodes_total),
                used: n(f.inodes_used),
                unit: Unit::Inodes as i32,
            },
        ],
        node::Usage::Block(size) => vec![VolumeUsage {
            available: 0,
            total: n(*size),
            used: 0,
            unit: Unit::Bytes as i32,
        }],
        node::Usage::Unknown => Vec::new(),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        reply(self.stage(r.into_inner()).await)
    }
    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        reply(self.unstage(r.into_inner()).await)
    }
    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        reply(self.publish(r.into_inner()).await)
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        reply(self.unpublish(r.into_inner()).await)
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        reply(self.stats(r.into_inner()).await)
    }
    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        reply(self.expand(r.into_inner()).await)
    }
    async fn node_get_capabilities(
        &self,
        _r: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|t| NodeServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }
    async fn node_get_info(
        &self,
        _r: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let d = &self.driver;
        Ok(Response::new(NodeGetInfoResponse {
            node_id: d.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology {
                segments: [(d.topology_key(), d.node_id.clone())].into(),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_the_implemented_ones() {
        assert!(!CAPABILITIES.contains(&RpcType::VolumeMountGroup));
        assert!(!CAPABILITIES.contains(&RpcType::Unknown));
        assert_eq!(CAPABILITIES.len(), 5);
    }

    #[test]
    fn reader_only_mode_forces_read_only() {
        assert!(effective_readonly(Mode::SingleNodeReaderOnly, false));
        assert!(effective_readonly(Mode::SingleNodeWriter, true));
        assert!(!effective_readonly(Mode::SingleNodeMultiWriter, false));
    }

    #[test]
    fn pool_zeroing_is_read_from_lv_attr() {
        assert!(pool_zeroes_new_chunks("twi-aotz--"));
        assert!(!pool_zeroes_new_chunks("twi-aot---"));
        assert!(!pool_zeroes_new_chunks(""));
    }

    #[test]
    fn usage_reports_bytes_and_inodes() {
        let u = volume_usage(&node::Usage::Filesystem(fs::Usage {
            bytes_total: 100,
            bytes_available: 60,
            bytes_used: 30,
            inodes_total: 10,
            inodes_free: 7,
            inodes_used: 3,
        }));
        assert_eq!(u.len(), 2);
        assert_eq!(
            (u[0].unit, u[0].total, u[0].used),
            (Unit::Bytes as i32, 100, 30)
        );
        assert_eq!((u[1].unit, u[1].available), (Unit::Inodes as i32, 7));
        let b = volume_usage(&node::Usage::Block(u64::MAX));
        assert_eq!((b.len(), b[0].total), (1, i64::MAX));
        assert!(volume_usage(&node::Usage::Unknown).is_empty());
    }
}
