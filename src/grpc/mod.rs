//! The gRPC layer: validates requests, calls the LVM and node layers, and
//! maps errors (through `crate::error`). `serve` binds the unix socket.

pub mod addons;
pub mod controller;
pub mod healer;
pub mod identity;
pub mod node;
pub mod validate;

use std::path::Path;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::proto::csi::v1::controller_server::ControllerServer;
use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::csi::v1::node_server::NodeServer;

/// A handler's result as tonic wants it; errors map through `crate::error`.
pub(crate) fn reply<T>(r: Result<T>) -> std::result::Result<tonic::Response<T>, tonic::Status> {
    r.map(tonic::Response::new).map_err(tonic::Status::from)
}

/// Binds `socket`, replacing a stale socket file (one nobody answers on)
/// but nothing else.
pub fn bind(socket: &Path) -> Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) => {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(Error::FailedPrecondition(format!(
                    "{} exists and is not a socket; refusing to replace it",
                    socket.display()
                )));
            }
            // A socket someone still answers on is not stale.
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(Error::FailedPrecondition(format!(
                    "{} is live: another process serves on it; refusing to replace it",
                    socket.display()
                )));
            }
            std::fs::remove_file(socket)
                .map_err(|e| Error::io(format!("remove stale {}", socket.display()), e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("stat {}", socket.display()), e)),
    }
    UnixListener::bind(socket).map_err(|e| Error::io(format!("bind {}", socket.display()), e))
}

/// Serves the CSI services on `listener` until `shutdown` resolves.
pub async fn serve(
    driver: Arc<Driver>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity::IdentityService {
            driver: driver.clone(),
        }))
        .add_service(ControllerServer::new(controller::ControllerService {
            driver: driver.clone(),
        }))
        .add_service(NodeServer::new(node::NodeService::new(driver.clone())))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_live_socket_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("csi.sock");
        let first = bind(&sock).unwrap();
        let e = bind(&sock).unwrap_err();
        assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
        assert!(sock.exists(), "the live socket stays");
        drop(first);
        // Nobody answers any more: stale, replaced.
        let _second = bind(&sock).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, b"not a socket").unwrap();
        assert!(matches!(bind(&sock), Err(Error::FailedPrecondition(_))));
    }
}
