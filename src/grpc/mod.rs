//! The gRPC layer: validates requests, calls the volume layer, and maps
//! errors (through `crate::error`). `serve` and `serve_addons` run the
//! servers on listeners `crate::socket` bound, each call logged and
//! counted by `observe`.

pub mod addons;
pub mod cluster;
pub mod controller;
pub mod forward;
pub mod group;
pub mod healer;
pub mod identity;
pub mod keyrotation;
pub mod metadata;
pub mod node;
pub mod observe;
pub mod peer;
pub mod validate;

use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::error::{Error, Result};
use crate::proto::csi::v1::controller_server::ControllerServer;
use crate::proto::csi::v1::group_controller_server::GroupControllerServer;
use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::csi::v1::node_server::NodeServer;
use crate::proto::csi::v1::snapshot_metadata_server::SnapshotMetadataServer;
use crate::volume::classes::Classes;

/// A handler's result as tonic wants it; errors map through `crate::error`.
pub(crate) fn reply<T>(r: Result<T>) -> std::result::Result<tonic::Response<T>, tonic::Status> {
    r.map(tonic::Response::new).map_err(tonic::Status::from)
}

/// `server` serving CSI Identity, Controller, SnapshotMetadata and
/// GroupController: what the node's socket and the internal channel both
/// serve.
fn csi_router<L: Clone>(
    mut server: tonic::transport::Server<L>,
    classes: &Arc<Classes>,
) -> tonic::transport::server::Router<L> {
    server
        .add_service(IdentityServer::new(identity::IdentityService {
            classes: classes.clone(),
        }))
        .add_service(ControllerServer::new(controller::ControllerService {
            classes: classes.clone(),
        }))
        .add_service(SnapshotMetadataServer::new(metadata::MetadataService {
            classes: classes.clone(),
        }))
        .add_service(GroupControllerServer::new(group::GroupService {
            classes: classes.clone(),
        }))
}

/// A server with the observe layer (each call logged and counted).
fn observed(
    classes: &Arc<Classes>,
) -> tonic::transport::Server<tower_layer::Stack<observe::ObserveLayer, tower_layer::Identity>> {
    tonic::transport::Server::builder().layer(observe::ObserveLayer::new(classes.metrics().clone()))
}

/// Serves the CSI services on `listener` until `shutdown` resolves.
pub async fn serve(
    classes: Arc<Classes>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    csi_router(observed(&classes), &classes)
        .add_service(NodeServer::new(node::NodeService::new(classes.clone())))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("gRPC server: {e}")))
}

/// Serves the CSI-Addons services on `listener` until `shutdown` resolves.
pub async fn serve_addons(
    classes: Arc<Classes>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    use crate::proto::encryptionkeyrotation::encryption_key_rotation_controller_server::EncryptionKeyRotationControllerServer;
    use crate::proto::healer::healer_node_server::HealerNodeServer;
    use crate::proto::identity::identity_server::IdentityServer as AddonsIdentityServer;
    use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceControllerServer;
    use crate::proto::reclaimspace::reclaim_space_node_server::ReclaimSpaceNodeServer;
    let svc = || addons::AddonsService {
        classes: classes.clone(),
    };
    tonic::transport::Server::builder()
        .layer(observe::ObserveLayer::new(classes.metrics().clone()))
        .add_service(AddonsIdentityServer::new(svc()))
        .add_service(ReclaimSpaceNodeServer::new(svc()))
        .add_service(ReclaimSpaceControllerServer::new(svc()))
        .add_service(EncryptionKeyRotationControllerServer::new(svc()))
        .add_service(HealerNodeServer::new(node::NodeService::new(
            classes.clone(),
        )))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("CSI-Addons gRPC server: {e}")))
}

/// Serves the calls a controller forwards (docs/cluster.md) on the
/// connections `incoming` yields (`channel::incoming`: each one passed
/// mutual TLS), until `shutdown` resolves: CSI Identity, Controller,
/// GroupController and SnapshotMetadata, and the CSI-Addons Identity and
/// ReclaimSpace controller service. Never the Node service: the kubelet
/// reaches that on the node's socket.
pub async fn serve_channel<S, IO, E>(
    classes: Arc<Classes>,
    incoming: S,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()>
where
    S: tokio_stream::Stream<Item = std::result::Result<IO, E>>,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use crate::proto::identity::identity_server::IdentityServer as AddonsIdentityServer;
    use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceControllerServer;
    use crate::proto::thinpool::cluster::v1::capacity_server::CapacityServer;
    use crate::proto::thinpool::cluster::v1::transfer_server::TransferServer;
    let addons = || addons::AddonsService {
        classes: classes.clone(),
    };
    // Each call must name this node (`channel::NODE_HEADER`): one meant
    // for another is refused before any service sees it, and observed.
    // Every answer carries the node's change counter
    // (`channel::GENERATION_HEADER`).
    let only_here = tonic::service::InterceptorLayer::new(crate::channel::OnlyFor(
        classes.base().node_id.as_str().into(),
    ));
    let counted = crate::channel::GenerationLayer(classes.changes().clone());
    // With `cluster.peer_ca`, other node plugins get through the
    // handshake too, and reach `Transfer.Read` alone.
    let cluster = &classes.base().cfg.cluster;
    let callers = match cluster.peer_ca.as_os_str().is_empty() {
        true => None,
        false => Some(crate::channel::Callers::new(&cluster.client_ca)?),
    };
    let gate = crate::channel::PeerGate(callers);
    let peer_only =
        tonic::service::InterceptorLayer::new(crate::channel::PeerOnly(classes.metrics().clone()));
    // The capacity streams end when the server stops: it waits for every
    // connection to close, and the controller keeps a watched one open.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    csi_router(
        observed(&classes)
            .layer(gate)
            .layer(counted)
            .layer(only_here)
            .layer(peer_only),
        &classes,
    )
    .add_service(AddonsIdentityServer::new(addons()))
    .add_service(ReclaimSpaceControllerServer::new(addons()))
    .add_service(CapacityServer::new(cluster::CapacityService {
        classes: classes.clone(),
        stopping: stopping.clone(),
    }))
    .add_service(TransferServer::new(cluster::TransferService {
        classes: classes.clone(),
        stopping,
    }))
    .serve_with_incoming_shutdown(incoming, shutdown)
    .await
    .map_err(|e| Error::Internal(format!("channel gRPC server: {e}")))
}

/// Serves the cluster controller's CSI Identity, Controller,
/// GroupController and SnapshotMetadata (`forward`), and the driver's own
/// `Move` for `tpcsi move`, on `listener` until `shutdown` resolves.
pub async fn serve_controller(
    cluster: Arc<crate::cluster::Cluster>,
    metrics: Arc<crate::metrics::Metrics>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let svc = || forward::ForwardService {
        cluster: cluster.clone(),
    };
    tonic::transport::Server::builder()
        .layer(observe::ObserveLayer::new(metrics))
        .add_service(IdentityServer::new(svc()))
        .add_service(ControllerServer::new(svc()))
        .add_service(GroupControllerServer::new(svc()))
        .add_service(SnapshotMetadataServer::new(svc()))
        .add_service(crate::proto::thinpool::cluster::v1::move_server::MoveServer::new(svc()))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("gRPC server: {e}")))
}

/// Serves the cluster controller's CSI-Addons Identity and
/// ReclaimSpace controller (`forward`) on `listener` until `shutdown`
/// resolves.
pub async fn serve_controller_addons(
    cluster: Arc<crate::cluster::Cluster>,
    metrics: Arc<crate::metrics::Metrics>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    use crate::proto::identity::identity_server::IdentityServer as AddonsIdentityServer;
    use crate::proto::reclaimspace::reclaim_space_controller_server::ReclaimSpaceControllerServer;
    let svc = || forward::ForwardAddons {
        cluster: cluster.clone(),
    };
    tonic::transport::Server::builder()
        .layer(observe::ObserveLayer::new(metrics))
        .add_service(AddonsIdentityServer::new(svc()))
        .add_service(ReclaimSpaceControllerServer::new(svc()))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|e| Error::Internal(format!("CSI-Addons gRPC server: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The Python of the pinned venv that holds grpcio
    /// (`scripts/check-packaging.sh --setup` makes it; CI does).
    fn venv_python() -> std::path::PathBuf {
        let venv = std::env::var("PACKAGING_VENV")
            .unwrap_or_else(|_| format!("{}/target/packaging-venv", env!("CARGO_MANIFEST_DIR")));
        let python = std::path::Path::new(&venv).join("bin/python");
        let ok = std::process::Command::new(&python)
            .args(["-c", "import grpc"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "{} cannot import grpcio: run scripts/check-packaging.sh --setup (it installs scripts/packaging-requirements.txt)",
            python.display()
        );
        python
    }

    /// One call from grpcio: (status code name, details, reply bytes).
    async fn grpcio(
        socket: &std::path::Path,
        method: &str,
        authority: Option<&str>,
    ) -> (String, String, Vec<u8>) {
        let script = format!("{}/scripts/grpcio_call.py", env!("CARGO_MANIFEST_DIR"));
        let mut cmd = tokio::process::Command::new(venv_python());
        cmd.arg(script).arg(socket).arg(method).args(authority);
        let out = tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output())
            .await
            .expect("grpcio call within 60 s")
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let hex = v["reply"].as_str().unwrap();
        let reply = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        (
            v["code"].as_str().unwrap().to_string(),
            v["details"].as_str().unwrap().to_string(),
            reply,
        )
    }

    /// A real grpcio client on the driver's socket (issue 11, clients).
    /// With `grpc.default_authority=localhost` (docs/troubleshooting.md)
    /// every call reaches the driver: GetPluginInfo answers, and
    /// GetCapacity answers the driver's own FAILED_PRECONDITION (this
    /// driver's `lvm` is missing on purpose: no LVM needed, and the answer
    /// is visibly the driver's). With grpcio's default, the socket path percent-
    /// encoded as `:authority`, h2 0.4 resets the stream with
    /// PROTOCOL_ERROR before tonic sees the request: h2 has no option to
    /// accept such an authority (hyperium/h2#487 is open), and the driver
    /// cannot reach below it without forking the HTTP/2 stack. When this
    /// assertion fails, h2 accepts them: drop the workaround from docs/troubleshooting.md.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grpcio_clients_work_with_localhost_and_h2_refuses_a_path_authority() {
        let python = venv_python();
        assert!(python.exists());
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            driver_name: "grpcio.test.example".into(),
            lvm_binary: "/nonexistent/lvm".into(),
            state_dir: dir.path().join("state"),
            ..Config::default()
        };
        let driver = Arc::new(Classes::new(&cfg, "node-1"));
        let socket = dir.path().join("csi.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(driver, listener, async {
            let _ = stopped.await;
        }));

        let info = "/csi.v1.Identity/GetPluginInfo";
        let capacity = "/csi.v1.Controller/GetCapacity";
        let (code, details, reply) = grpcio(&socket, info, Some("localhost")).await;
        assert_eq!(code, "OK", "{details}");
        let reply =
            <crate::proto::csi::v1::GetPluginInfoResponse as prost::Message>::decode(&reply[..])
                .unwrap();
        assert_eq!(reply.name, "grpcio.test.example");
        let (code, details, _) = grpcio(&socket, capacity, Some("localhost")).await;
        assert_eq!(code, "FAILED_PRECONDITION", "{details}");
        assert!(
            details.contains("lvm2"),
            "the driver's own answer: {details}"
        );

        // grpcio's default authority for a unix target.
        let (code, details, _) = grpcio(&socket, info, None).await;
        assert_eq!(code, "INTERNAL", "{details}");
        // RST_STREAM with HTTP/2 error code 1: PROTOCOL_ERROR.
        assert!(
            details.contains("RST_STREAM with error code 1"),
            "{details}"
        );

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
