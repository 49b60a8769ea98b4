//! The gRPC layer: validates requests, calls the volume layer, and maps
//! errors (through `crate::error`). `serve` and `serve_addons` run the
//! servers on listeners `crate::socket` bound, each call logged and
//! counted by `observe`.

pub mod addons;
pub mod controller;
pub mod group;
pub mod healer;
pub mod identity;
pub mod metadata;
pub mod node;
pub mod observe;
pub mod validate;

use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::proto::csi::v1::controller_server::ControllerServer;
use crate::proto::csi::v1::group_controller_server::GroupControllerServer;
use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::csi::v1::node_server::NodeServer;
use crate::proto::csi::v1::snapshot_metadata_server::SnapshotMetadataServer;

/// A handler's result as tonic wants it; errors map through `crate::error`.
pub(crate) fn reply<T>(r: Result<T>) -> std::result::Result<tonic::Response<T>, tonic::Status> {
    r.map(tonic::Response::new).map_err(tonic::Status::from)
}

/// Serves the CSI services on `listener` until `shutdown` resolves.
pub async fn serve(
    driver: Arc<Driver>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tonic::transport::Server::builder()
        .layer(observe::ObserveLayer::new(driver.metrics.clone()))
        .add_service(IdentityServer::new(identity::IdentityService {
            driver: driver.clone(),
        }))
        .add_service(ControllerServer::new(controller::ControllerService {
            driver: driver.clone(),
        }))
        .add_service(NodeServer::new(node::NodeService::new(driver.clone())))
        .add_service(SnapshotMetadataServer::new(metadata::MetadataService {
            driver: driver.clone(),
        }))
        .add_service(GroupControllerServer::new(group::GroupService {
            driver: driver.clone(),
        }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("gRPC server: {e}")))
}

/// Serves the CSI-Addons services on `listener` until `shutdown` resolves.
pub async fn serve_addons(
    driver: Arc<Driver>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    use crate::proto::healer::healer_node_server::HealerNodeServer;
    use crate::proto::identity::identity_server::IdentityServer as AddonsIdentityServer;
    use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceControllerServer;
    use crate::proto::reclaimspace::reclaim_space_node_server::ReclaimSpaceNodeServer;
    let svc = || addons::AddonsService {
        driver: driver.clone(),
    };
    tonic::transport::Server::builder()
        .layer(observe::ObserveLayer::new(driver.metrics.clone()))
        .add_service(AddonsIdentityServer::new(svc()))
        .add_service(ReclaimSpaceNodeServer::new(svc()))
        .add_service(ReclaimSpaceControllerServer::new(svc()))
        .add_service(HealerNodeServer::new(node::NodeService::new(
            driver.clone(),
        )))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("CSI-Addons gRPC server: {e}")))
}
