//! Identity: GetPluginInfo, GetPluginCapabilities, Probe; and every
//! service the plugin advertises answers, every RPC a service advertises
//! is served.

use thinpool_csi::proto::csi::v1::controller_service_capability::rpc::Type as CtlRpc;
use thinpool_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use thinpool_csi::proto::csi::v1::plugin_capability::service::Type as Service;
use thinpool_csi::proto::csi::v1::plugin_capability::Type as PluginCap;
use thinpool_csi::proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use thinpool_csi::proto::csi::v1::*;
use tokio_stream::StreamExt;
use tonic::Code;

use super::Rules;
use crate::harness::{TestDriver, MIB};

/// The services GetPluginCapabilities advertises, the rule being that it
/// answers.
async fn advertised(r: &mut Rules, d: &TestDriver) -> Vec<Service> {
    let mut id = d.identity().await;
    r.ok(
        "GetPluginCapabilities answers",
        id.get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await,
    )
    .map(|c| {
        c.capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(PluginCap::Service(s)) => Service::try_from(s.r#type).ok(),
                _ => None,
            })
            .collect()
    })
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_info_and_probe_rules() {
    let d = TestDriver::start("cfid", 64 * MIB, "").await;
    let mut r = Rules::new("Identity");
    let mut id = d.identity().await;

    let info = r.ok(
        "GetPluginInfo answers",
        id.get_plugin_info(GetPluginInfoRequest {}).await,
    );
    if let Some(info) = info {
        r.check(
            "GetPluginInfo: name is REQUIRED, at most 63 characters, domain style [\"MUST be 63 characters or less, beginning and ending with an alphanumeric character\"]",
            !info.name.is_empty()
                && info.name.len() <= 63
                && info.name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && info.name.ends_with(|c: char| c.is_ascii_alphanumeric()),
            format!("name {:?}", info.name),
        );
        r.check(
            "GetPluginInfo: vendor_version is REQUIRED",
            !info.vendor_version.is_empty(),
            "empty vendor_version",
        );
    }
    let probe = r.ok("Probe answers", id.probe(ProbeRequest {}).await);
    r.check(
        "Probe: a ready plugin says so [\"ready ... SHOULD be set to true\" when ready]",
        probe.is_some_and(|p| p.ready != Some(false)),
        "ready = false on a started driver",
    );
    r.finish();
}

#[tokio::test(flavor = "multi_thread")]
async fn advertised_services_and_rpcs_are_served() {
    let d = TestDriver::start("cfsvc", 64 * MIB, "").await;
    let mut r = Rules::new("Identity services");
    let services = advertised(&mut r, &d).await;

    // Advertised services answer; the controller's advertised RPCs are
    // served (not UNIMPLEMENTED).
    r.check(
        "GetPluginCapabilities: CONTROLLER_SERVICE is advertised (the driver serves the Controller)",
        services.contains(&Service::ControllerService),
        format!("{services:?}"),
    );
    let mut c = d.controller().await;
    let caps: Vec<CtlRpc> = r
        .ok(
            "ControllerGetCapabilities answers",
            c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await,
        )
        .map(|c| {
            c.capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(controller_service_capability::Type::Rpc(r)) => {
                        CtlRpc::try_from(r.r#type).ok()
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    for (cap, code) in [
        (
            CtlRpc::ListVolumes,
            c.list_volumes(ListVolumesRequest::default())
                .await
                .err()
                .map(|s| s.code()),
        ),
        (
            CtlRpc::GetCapacity,
            c.get_capacity(GetCapacityRequest::default())
                .await
                .err()
                .map(|s| s.code()),
        ),
        (
            CtlRpc::ListSnapshots,
            c.list_snapshots(ListSnapshotsRequest::default())
                .await
                .err()
                .map(|s| s.code()),
        ),
    ] {
        r.check(
            &format!("ControllerGetCapabilities: {cap:?} is advertised and its RPC is served"),
            caps.contains(&cap) && code.is_none(),
            format!("advertised {}, answer {code:?}", caps.contains(&cap)),
        );
    }
    if services.contains(&Service::GroupControllerService) {
        let mut g = GroupControllerClient::connect(d.uri()).await.unwrap();
        let got = r.ok(
            "GROUP_CONTROLLER_SERVICE advertised: GroupControllerGetCapabilities answers",
            g.group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {})
                .await,
        );
        let types: Vec<Option<i32>> = got
            .as_ref()
            .map(|g| {
                g.capabilities
                    .iter()
                    .map(|c| {
                        c.r#type.as_ref().map(|t| match t {
                            group_controller_service_capability::Type::Rpc(r) => r.r#type,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        r.check(
            "GroupControllerGetCapabilities: the only type advertised is CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",
            !types.is_empty()
                && types.iter().all(|t| {
                    *t == Some(group_controller_service_capability::rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32)
                }),
            format!("{types:?}"),
        );
    }
    if services.contains(&Service::SnapshotMetadataService) {
        // Served: an unknown snapshot is NOT_FOUND, not UNIMPLEMENTED.
        let mut m = SnapshotMetadataClient::connect(d.uri()).await.unwrap();
        let got = match m
            .get_metadata_allocated(GetMetadataAllocatedRequest {
                snapshot_id: "snap-none".into(),
                ..Default::default()
            })
            .await
        {
            Ok(s) => s
                .into_inner()
                .next()
                .await
                .and_then(|x| x.err())
                .map(|s| s.code()),
            Err(s) => Some(s.code()),
        };
        r.check(
            "SNAPSHOT_METADATA_SERVICE advertised: GetMetadataAllocated is served",
            got != Some(Code::Unimplemented),
            format!("{got:?}"),
        );
    }
    r.finish();
}
