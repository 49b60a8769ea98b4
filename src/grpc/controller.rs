//! CSI Controller service: volumes are thin LVs of one pool on this node.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{reply, validate};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::lvm::report::{Capacity, Lv, Report};
use crate::naming::{self, Access, VolumeTags};
use crate::proto::csi::v1::controller_server::Controller;
use crate::proto::csi::v1::controller_service_capability::rpc::Type as RpcType;
use crate::proto::csi::v1::controller_service_capability::{Rpc, Type as CapType};
use crate::proto::csi::v1::*;

pub struct ControllerService {
    pub driver: Arc<Driver>,
}

/// The RPCs this controller implements, and nothing else.
pub const CAPABILITIES: &[RpcType] = &[
    RpcType::CreateDeleteVolume,
    RpcType::PublishUnpublishVolume,
    RpcType::ListVolumes,
    RpcType::GetCapacity,
    RpcType::ExpandVolume,
    RpcType::GetVolume,
    RpcType::VolumeCondition,
    RpcType::SingleNodeMultiWriter,
];

/// A thin volume of our pool that carries our owner tag.
pub struct Owned<'a> {
    pub lv: &'a Lv,
    pub tags: VolumeTags,
}

impl Driver {
    /// Looks `id` up in `report` and proves it is ours: a thin LV of our
    /// pool with our owner tag. A foreign LV is FAILED_PRECONDITION and is
    /// never touched.
    pub fn owned<'a>(&self, report: &'a Report, id: &str) -> Result<Option<Owned<'a>>> {
        let Some(lv) = report.find(id) else {
            return Ok(None);
        };
        let tags = VolumeTags::decode(lv.tags.iter().map(String::as_str));
        match tags {
            Some(tags)
                if tags.owner == self.cfg.driver_name
                    && lv.is_thin_volume()
                    && lv.pool == self.lvm.pool =>
            {
                Ok(Some(Owned { lv, tags }))
            }
            _ => Err(Error::FailedPrecondition(format!(
                "LV {} exists but is not a thin volume owned by {} in pool {}; it is left alone",
                self.lvm.lv_path(id),
                self.cfg.driver_name,
                self.lvm.pool
            ))),
        }
    }

    /// Like [`Driver::owned`], but a missing volume is NOT_FOUND.
    pub fn must_own<'a>(&self, report: &'a Report, id: &str) -> Result<Owned<'a>> {
        self.owned(report, id)?
            .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist")))
    }

    /// The pool's LV, or UNAVAILABLE when it is missing.
    pub fn pool<'a>(&self, report: &'a Report) -> Result<&'a Lv> {
        report
            .find(&self.lvm.pool)
            .filter(|lv| lv.is_thin_pool())
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "thin pool {} not found",
                    self.lvm.lv_path(&self.lvm.pool)
                ))
            })
    }

    /// Capacity left in the pool.
    pub fn capacity(&self, report: &Report) -> Result<(Capacity, u64)> {
        let pool = self.pool(report)?;
        let virtual_sum: u64 = report.thin_volumes(&self.lvm.pool).map(|lv| lv.size).sum();
        let cap = Capacity::compute(
            pool.size,
            pool.data_percent.unwrap_or(0.0),
            self.cfg.overprovision_ratio,
            virtual_sum,
        );
        Ok((cap, pool.vg_extent_size))
    }

    fn topology(&self) -> Vec<Topology> {
        vec![Topology {
            segments: [(self.topology_key(), self.node_id.clone())].into(),
        }]
    }

    fn volume(&self, id: &str, size: u64, tags: &VolumeTags) -> Volume {
        let mut ctx = HashMap::new();
        if let Some(Access::Mount { fs_type }) = &tags.access {
            ctx.insert("fsType".to_string(), fs_type.clone());
        }
        Volume {
            capacity_bytes: size as i64,
            volume_id: id.to_string(),
            volume_context: ctx,
            content_source: None,
            accessible_topology: self.topology(),
        }
    }

    fn owned_volume(&self, o: &Owned) -> Volume {
        self.volume(&o.lv.name, o.lv.size, &o.tags)
    }

    /// The condition of a volume and its pool, for ControllerGetVolume,
    /// ListVolumes and the node side.
    pub fn condition(&self, report: &Report, lv: &Lv) -> VolumeCondition {
        let problem = lv
            .problem()
            .or_else(|| self.pool(report).ok().and_then(Lv::problem));
        VolumeCondition {
            abnormal: problem.is_some(),
            message: problem.unwrap_or_else(|| "volume and thin pool are healthy".into()),
        }
    }

    /// Refuses allocation in a pool that cannot take it.
    fn check_pool_usable(&self, report: &Report) -> Result<()> {
        if let Some(p) = self.pool(report)?.problem() {
            return Err(if p.contains("full") {
                Error::ResourceExhausted(p)
            } else {
                Error::FailedPrecondition(p)
            });
        }
        Ok(())
    }

    fn check_node(&self, node_id: &str) -> Result<()> {
        validate::required_string("node_id", node_id)?;
        if node_id != self.node_id {
            return Err(Error::NotFound(format!(
                "node {node_id:?} is not served by this driver (its node is {:?}); thin volumes are local",
                self.node_id
            )));
        }
        Ok(())
    }
}

impl ControllerService {
    async fn create(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse> {
        let d = &self.driver;
        let name = validate::required_string("name", &req.name)?;
        let access = validate::capabilities(&req.volume_capabilities, &d.cfg.default_fs_type)?;
        let params = validate::parameters(&req.parameters, &d.lvm.vg, &d.lvm.pool)?;
        if !req.mutable_parameters.is_empty() {
            return Err(Error::InvalidArgument(
                "mutable_parameters are not supported (no MODIFY_VOLUME capability)".into(),
            ));
        }
        if req.volume_content_source.is_some() {
            return Err(Error::InvalidArgument(
                "volume_content_source is not supported: this driver neither clones nor restores snapshots".into(),
            ));
        }
        if !validate::topology_allows(
            req.accessibility_requirements.as_ref(),
            &d.topology_key(),
            &d.node_id,
        ) {
            return Err(Error::ResourceExhausted(format!(
                "accessibility_requirements exclude node {:?}, the only node this pool serves",
                d.node_id
            )));
        }
        let lv_name = naming::lv_name_for(name);
        let _held = d.inflight.try_hold(&lv_name, "CreateVolume")?;
        let tags = VolumeTags {
            owner: d.cfg.driver_name.clone(),
            co_name: name.to_string(),
            access: Some(access),
            params,
        };

        let report = d.lvm.report().await?;
        if let Some(existing) = d
            .owned(&report, &lv_name)
            .map_err(|e| Error::AlreadyExists(format!("cannot create volume {name:?}: {e}")))?
        {
            let same = existing.tags == tags
                && validate::size_fits(req.capacity_range.as_ref(), existing.lv.size);
            if !same {
                return Err(Error::AlreadyExists(format!(
                    "volume {name:?} exists as {lv_name} ({} bytes, {:?}, parameters {:?}) and is incompatible with this request",
                    existing.lv.size, existing.tags.access, existing.tags.params
                )));
            }
            tracing::info!(
                name,
                lv = lv_name,
                "CreateVolume: already exists, returning it"
            );
            return Ok(CreateVolumeResponse {
                volume: Some(d.owned_volume(&existing)),
            });
        }

        let _alloc = d.alloc.lock().await;
        let report = d.lvm.report().await?;
        d.check_pool_usable(&report)?;
        let (cap, extent) = d.capacity(&report)?;
        let size = validate::size(
            req.capacity_range.as_ref(),
            extent,
            d.cfg.default_volume_size,
        )?;
        let size = validate::fs_minimum(
            tags.access.as_ref(),
            size,
            req.capacity_range.as_ref(),
            extent,
        )?;
        if size > cap.virtual_headroom {
            return Err(Error::ResourceExhausted(format!(
                "{size} bytes requested but thin pool {} can hand out only {} more bytes at overprovision ratio {}",
                d.lvm.lv_path(&d.lvm.pool),
                cap.virtual_headroom,
                d.cfg.overprovision_ratio
            )));
        }
        d.lvm.create_thin(&lv_name, size, &tags.encode()).await?;
        tracing::info!(name, lv = lv_name, size, "CreateVolume: created");
        // lvcreate made exactly this size (extent-aligned) with these
        // tags: no need to read the report back.
        Ok(CreateVolumeResponse {
            volume: Some(d.volume(&lv_name, size, &tags)),
        })
    }

    async fn delete(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse> {
        let d = &self.driver;
        let Some(id) = validate::volume_id(&req.volume_id)? else {
            tracing::info!(
                id = req.volume_id,
                "DeleteVolume: not an id this driver issues; nothing to delete"
            );
            return Ok(DeleteVolumeResponse {});
        };
        let _held = d.inflight.try_hold(id, "DeleteVolume")?;
        // Never decide a removal on a cached view.
        let report = d.lvm.fresh_report().await?;
        if d.owned(&report, id)?.is_none() {
            tracing::info!(id, "DeleteVolume: already gone");
            return Ok(DeleteVolumeResponse {});
        }
        d.lvm.remove(id).await?;
        tracing::info!(id, "DeleteVolume: removed");
        Ok(DeleteVolumeResponse {})
    }

    async fn publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        validate::required_string("node_id", &req.node_id)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("volume_capability is required".into()))?;
        let access = validate::capability(cap, &d.cfg.default_fs_type)?;
        let report = d.lvm.report().await?;
        let vol = d.must_own(&report, id)?;
        d.check_node(&req.node_id)?;
        check_access(&vol, &access)?;
        Ok(ControllerPublishVolumeResponse {
            publish_context: [("devicePath".to_string(), d.lvm.dev_path(id))].into(),
        })
    }

    async fn validate_caps(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::InvalidArgument(
                "volume_capabilities is required".into(),
            ));
        }
        let report = d.lvm.report().await?;
        let vol = d.must_own(&report, id)?;
        let verdict = validate::capabilities(&req.volume_capabilities, &d.cfg.default_fs_type)
            .and_then(|a| check_access(&vol, &a))
            .and_then(|_| validate::parameters(&req.parameters, &d.lvm.vg, &d.lvm.pool).map(drop));
        Ok(match verdict {
            Ok(()) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            },
            Err(e) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.to_string(),
            },
        })
    }

    async fn list(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse> {
        let d = &self.driver;
        if req.max_entries < 0 {
            return Err(Error::InvalidArgument(
                "max_entries must not be negative".into(),
            ));
        }
        if !req.starting_token.is_empty() && !naming::is_volume_id(&req.starting_token) {
            return Err(Error::Aborted(format!(
                "starting_token {:?} was not issued by this driver",
                req.starting_token
            )));
        }
        let report = d.lvm.report().await?;
        let (page, next_token) = paginate(
            owned_volumes(d, &report),
            &req.starting_token,
            req.max_entries as usize,
        );
        let entries = page
            .iter()
            .map(|o| list_volumes_response::Entry {
                volume: Some(d.owned_volume(o)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: vec![],
                    volume_condition: Some(d.condition(&report, o.lv)),
                }),
            })
            .collect();
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    async fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse> {
        let d = &self.driver;
        for cap in &req.volume_capabilities {
            validate::capability(cap, &d.cfg.default_fs_type)?;
        }
        validate::parameters(&req.parameters, &d.lvm.vg, &d.lvm.pool)?;
        if let Some(t) = &req.accessible_topology {
            if !validate::segment_is_ours(&t.segments, &d.topology_key(), &d.node_id) {
                return Ok(GetCapacityResponse {
                    available_capacity: 0,
                    maximum_volume_size: Some(0),
                    minimum_volume_size: None,
                });
            }
        }
        let report = d.lvm.report().await?;
        let (cap, extent) = d.capacity(&report)?;
        let floor = |b: u64| (b / extent.max(1) * extent.max(1)) as i64;
        Ok(GetCapacityResponse {
            available_capacity: floor(cap.available()),
            maximum_volume_size: Some(floor(cap.virtual_headroom)),
            minimum_volume_size: Some(extent as i64),
        })
    }

    async fn expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("capacity_range is required".into()))?;
        let requested_access = req
            .volume_capability
            .as_ref()
            .map(|c| validate::capability(c, &d.cfg.default_fs_type))
            .transpose()?;
        let _held = d.inflight.try_hold(id, "ControllerExpandVolume")?;
        let _alloc = d.alloc.lock().await;
        let report = d.lvm.report().await?;
        let vol = d.must_own(&report, id)?;
        let access = vol.tags.access.clone().or(requested_access);
        // Block volumes need the node step too: a read-only publish is a
        // device-mapper overlay that NodeExpandVolume resizes.
        let node_expansion_required = access.is_some();
        let (cap, extent) = d.capacity(&report)?;
        let target = validate::size(Some(range), extent, vol.lv.size)?;
        let current = vol.lv.size;
        if target <= current {
            tracing::info!(
                id,
                current,
                target,
                "ControllerExpandVolume: already large enough"
            );
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: current as i64,
                node_expansion_required,
            });
        }
        d.check_pool_usable(&report)?;
        if target - current > cap.virtual_headroom {
            return Err(Error::ResourceExhausted(format!(
                "growing {id} by {} bytes exceeds what thin pool {} may still hand out ({} bytes)",
                target - current,
                d.lvm.lv_path(&d.lvm.pool),
                cap.virtual_headroom
            )));
        }
        d.lvm.extend(id, target).await?;
        tracing::info!(
            id,
            from = current,
            to = target,
            "ControllerExpandVolume: extended"
        );
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: target as i64,
            node_expansion_required,
        })
    }

    async fn get_volume(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse> {
        let d = &self.driver;
        let id = validate::existing_volume_id(&req.volume_id)?;
        let report = d.lvm.report().await?;
        let vol = d.must_own(&report, id)?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(d.owned_volume(&vol)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: vec![],
                volume_condition: Some(d.condition(&report, vol.lv)),
            }),
        })
    }
}

/// A capability must fit how the volume was created: block stays block,
/// and a filesystem volume is mounted with its own filesystem.
fn check_access(vol: &Owned, wanted: &Access) -> Result<()> {
    naming::fits(&vol.lv.name, vol.tags.access.as_ref(), wanted).map_err(Error::InvalidArgument)
}

/// Our volumes, sorted by id: the order ListVolumes pages through.
fn owned_volumes<'a>(d: &Driver, report: &'a Report) -> Vec<Owned<'a>> {
    let mut vols: Vec<Owned> = report
        .thin_volumes(&d.lvm.pool)
        .filter(|lv| naming::is_volume_id(&lv.name))
        .filter_map(|lv| d.owned(report, &lv.name).ok().flatten())
        .collect();
    vols.sort_by(|a, b| a.lv.name.cmp(&b.lv.name));
    vols
}

impl AsRef<str> for Owned<'_> {
    fn as_ref(&self) -> &str {
        &self.lv.name
    }
}

/// One page of `items` (sorted by name) after `token`. The token is the
/// last name of the previous page, so creates and deletes between pages
/// neither repeat nor skip the volumes that stayed.
pub fn paginate<T: AsRef<str>>(items: Vec<T>, token: &str, max: usize) -> (Vec<T>, String) {
    let rest: Vec<T> = items
        .into_iter()
        .filter(|n| token.is_empty() || n.as_ref() > token)
        .collect();
    if max == 0 || rest.len() <= max {
        return (rest, String::new());
    }
    let page: Vec<T> = rest.into_iter().take(max).collect();
    let next = page
        .last()
        .map(|t| t.as_ref().to_string())
        .unwrap_or_default();
    (page, next)
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        r: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        reply(self.create(r.into_inner()).await)
    }
    async fn delete_volume(
        &self,
        r: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        reply(self.delete(r.into_inner()).await)
    }
    async fn controller_publish_volume(
        &self,
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        reply(self.publish(r.into_inner()).await)
    }
    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        // Publishing keeps no state, so there is nothing to undo; a volume
        // or node that is gone counts as unpublished (spec: reply OK).
        let r = r.into_inner();
        validate::required_string("volume_id", &r.volume_id)?;
        validate::bounded_string("node_id", &r.node_id)?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }
    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        reply(self.validate_caps(r.into_inner()).await)
    }
    async fn list_volumes(
        &self,
        r: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        reply(self.list(r.into_inner()).await)
    }
    async fn get_capacity(
        &self,
        r: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        reply(ControllerService::get_capacity(self, r.into_inner()).await)
    }
    async fn controller_get_capabilities(
        &self,
        _r: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|t| ControllerServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }
    async fn create_snapshot(
        &self,
        _r: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not implemented"))
    }
    async fn delete_snapshot(
        &self,
        _r: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not implemented"))
    }
    async fn list_snapshots(
        &self,
        _r: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("snapshots are not implemented"))
    }
    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        reply(self.expand(r.into_inner()).await)
    }
    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        reply(self.get_volume(r.into_inner()).await)
    }
    async fn controller_modify_volume(
        &self,
        _r: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "volume modification is not implemented",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pagination_pages_and_survives_changes() {
        let all = names(&["a", "b", "c", "d", "e"]);
        let (p1, t1) = paginate(all.clone(), "", 2);
        assert_eq!(p1, names(&["a", "b"]));
        assert_eq!(t1, "b");
        // "b" deleted and "bb" created between pages: nothing repeats,
        // nothing that stayed is skipped, and the new one is seen.
        let changed = names(&["a", "bb", "c", "d", "e"]);
        let (p2, t2) = paginate(changed.clone(), &t1, 2);
        assert_eq!(p2, names(&["bb", "c"]));
        let (p3, t3) = paginate(changed, &t2, 2);
        assert_eq!(p3, names(&["d", "e"]));
        assert_eq!(t3, "", "last page has no token");
        let (all_page, t) = paginate(all.clone(), "", 0);
        assert_eq!(all_page.len(), 5);
        assert!(t.is_empty());
        let (exact, t) = paginate(all, "", 5);
        assert_eq!(exact.len(), 5);
        assert!(t.is_empty());
    }

    #[test]
    fn capabilities_advertised_have_handlers() {
        // Everything advertised is something create/delete/list/... serve;
        // snapshots, clones and modify are neither advertised nor served.
        for t in CAPABILITIES {
            assert!(!matches!(
                t,
                RpcType::CreateDeleteSnapshot
                    | RpcType::ListSnapshots
                    | RpcType::CloneVolume
                    | RpcType::ModifyVolume
                    | RpcType::ListVolumesPublishedNodes
            ));
        }
    }
}
