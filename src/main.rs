//! `thinpool-csi --config FILE [--endpoint unix:///path] [--node-id ID]
//! [--log-format text|json]`: the node plugin.
//! `thinpool-csi controller --config FILE [--endpoint unix:///path]`: the
//! cluster's controller (docs/cluster.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::UnixListener;

use thinpool_csi::config::{parse_endpoint, Config, LogFormat};
use thinpool_csi::volume::classes::Classes;
use thinpool_csi::{grpc, naming, pool};

const USAGE: &str = "usage: thinpool-csi [--config FILE] [--endpoint unix:///path] [--node-id ID]
                    [--log-format text|json]
       thinpool-csi controller --config FILE [--endpoint unix:///path]

  --config FILE     TOML configuration (see config/defaults.toml)
  --endpoint ADDR   listen address; overrides CSI_ENDPOINT and the config
  --node-id ID      node id; overrides the config (default: hostname)
  --log-format F    text (default) or json lines; overrides the config";

struct Args {
    config: Option<PathBuf>,
    endpoint: Option<String>,
    node_id: Option<String>,
    log_format: Option<LogFormat>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: None,
        endpoint: None,
        node_id: None,
        log_format: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--config" => args.config = Some(PathBuf::from(value("--config")?)),
            "--endpoint" => args.endpoint = Some(value("--endpoint")?),
            "--node-id" => args.node_id = Some(value("--node-id")?),
            "--log-format" => {
                args.log_format = Some(
                    value("--log-format")?
                        .parse()
                        .map_err(|e| format!("--log-format: {e}"))?,
                )
            }
            "--version" => {
                println!("thinpool-csi {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn setup() -> Result<(Config, String, PathBuf), String> {
    let args = parse_args()?;
    let mut cfg = match &args.config {
        Some(path) => Config::load(path).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    // The CO gives the socket in CSI_ENDPOINT; a flag wins over both.
    if let Ok(ep) = std::env::var("CSI_ENDPOINT") {
        cfg.endpoint = ep;
    }
    if let Some(ep) = args.endpoint {
        cfg.endpoint = ep;
    }
    if let Some(id) = args.node_id {
        cfg.node_id = id;
    }
    if let Some(f) = args.log_format {
        cfg.log_format = f;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    let socket = parse_endpoint(&cfg.endpoint).map_err(|e| format!("endpoint: {e}"))?;
    let node_id = if cfg.node_id.is_empty() {
        nix::unistd::gethostname()
            .map_err(|e| format!("cannot read hostname for node_id: {e}"))?
            .to_string_lossy()
            .into_owned()
    } else {
        cfg.node_id.clone()
    };
    naming::validate_node_id(&node_id).map_err(|e| format!("node_id: {e}"))?;
    Ok((cfg, node_id, socket))
}

/// The single-instance lock, `<state_dir>/lock`.
fn take_lock(state_dir: &std::path::Path) -> Result<thinpool_csi::sys::FileLock, String> {
    std::fs::create_dir_all(state_dir)
        .map_err(|e| format!("cannot create state_dir {}: {e}", state_dir.display()))?;
    let path = state_dir.join("lock");
    thinpool_csi::sys::lock_file(&path).map_err(|e| {
        if e.is_busy() {
            let pid = std::fs::read_to_string(&path).unwrap_or_default();
            format!(
                "another thinpool-csi (pid {}) already runs on state_dir {} (it holds {}); \
                 this one exits and leaves its sockets alone",
                pid.trim(),
                state_dir.display(),
                path.display()
            )
        } else {
            format!("cannot take the lock {}: {e}", path.display())
        }
    })
}

/// The CSI socket, and the CSI-Addons socket when `addons_endpoint` (a
/// validated config value) names one; a socket that cannot be bound is
/// logged, and stops the start.
fn bind_sockets(
    socket: &std::path::Path,
    addons_endpoint: &str,
) -> Result<(UnixListener, Option<PathBuf>, Option<UnixListener>), ()> {
    let bind = |path: &std::path::Path| {
        thinpool_csi::socket::bind(path)
            .map_err(|e| tracing::error!(socket = %path.display(), error = %e, "cannot listen"))
    };
    let listener = bind(socket)?;
    let addons_socket = match addons_endpoint {
        "" => None,
        ep => Some(parse_endpoint(ep).expect("validated with the config")),
    };
    let addons_listener = addons_socket.as_deref().map(bind).transpose()?;
    Ok((listener, addons_socket, addons_listener))
}

/// A receiver that turns true at SIGTERM or SIGINT: every server stops.
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    stop_rx
}

/// Resolves once `rx` (from [`stop_on_signal`]) turns true.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    tracing::info!("signal received, shutting down");
}

/// `thinpool-csi controller`: its config and socket.
fn controller_setup(
    args: impl Iterator<Item = String>,
) -> Result<(thinpool_csi::cluster::ControllerConfig, PathBuf), String> {
    let (mut config, mut endpoint) = (None, None);
    let mut it = args;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--endpoint" => endpoint = Some(value("--endpoint")?),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let config = config.ok_or_else(|| format!("controller needs --config FILE\n{USAGE}"))?;
    let mut cfg = thinpool_csi::cluster::ControllerConfig::load(&config)?;
    if let Ok(ep) = std::env::var("CSI_ENDPOINT") {
        cfg.endpoint = ep;
    }
    if let Some(ep) = endpoint {
        cfg.endpoint = ep;
    }
    if let Ok(ep) = std::env::var("CSI_ADDONS_ENDPOINT") {
        cfg.csi_addons_endpoint = ep;
    }
    let socket = parse_endpoint(&cfg.endpoint).map_err(|e| format!("endpoint: {e}"))?;
    if !cfg.csi_addons_endpoint.is_empty() {
        parse_endpoint(&cfg.csi_addons_endpoint)
            .map_err(|e| format!("csi_addons_endpoint: {e}"))?;
    }
    Ok((cfg, socket))
}

/// The cluster's controller: forwards every controller call to its node.
async fn controller_main(args: impl Iterator<Item = String>) -> ExitCode {
    let (cfg, socket) = match controller_setup(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("thinpool-csi controller: {e}");
            return ExitCode::from(2);
        }
    };
    thinpool_csi::logging::init(cfg.log_format);
    tracing::info!(driver = cfg.driver_name, endpoint = %socket.display(),
        nodes = cfg.nodes.len(), "starting the cluster's controller");
    // The Kubernetes API, from the pod's service account, when the nodes
    // are found there.
    let client = match &cfg.discovery {
        None => None,
        Some(_) => match kube::Client::try_default().await {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("thinpool-csi controller: the Kubernetes API: {e}");
                tracing::error!(error = %e, "not starting: discovery needs the Kubernetes API");
                return ExitCode::FAILURE;
            }
        },
    };
    let cluster = match thinpool_csi::cluster::Cluster::new(cfg, client).await {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("thinpool-csi controller: {e}");
            tracing::error!(error = %e, "not starting");
            return ExitCode::FAILURE;
        }
    };
    let Ok((listener, addons_socket, addons_listener)) =
        bind_sockets(&socket, &cluster.cfg.csi_addons_endpoint)
    else {
        return ExitCode::FAILURE;
    };
    if let Some(f) = cluster.finder() {
        tokio::spawn(f.run(cluster.clone()));
    }
    // One signal stops both servers.
    let stop_rx = stop_on_signal();
    tracing::info!(socket = %socket.display(), addons = ?addons_socket, "serving CSI (controller)");
    let metrics: Arc<thinpool_csi::metrics::Metrics> = Arc::default();
    let csi = grpc::serve_controller(
        cluster.clone(),
        metrics.clone(),
        listener,
        stopped(stop_rx.clone()),
    );
    let addons = async {
        match addons_listener {
            Some(l) => {
                grpc::serve_controller_addons(
                    cluster.clone(),
                    metrics.clone(),
                    l,
                    stopped(stop_rx.clone()),
                )
                .await
            }
            None => Ok(()),
        }
    };
    match tokio::try_join!(csi, addons) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e.message(), "server failed");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("controller") {
        return controller_main(std::env::args().skip(2)).await;
    }
    let (cfg, node_id, socket) = match setup() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("thinpool-csi: {e}");
            return ExitCode::from(2);
        }
    };
    thinpool_csi::logging::init(cfg.log_format);
    tracing::info!(driver = cfg.driver_name, node_id, vg = cfg.volume_group, pool = cfg.thin_pool,
        endpoint = %socket.display(), lvm_metadata_archive = cfg.lvm_metadata_archive,
        lvm_shell = cfg.lvm_shell,
        controller_expansion = cfg.controller_expansion, "starting");
    // One driver per state_dir: a second process stops here, before it
    // touches a socket, a mount or LVM.
    let _lock = match take_lock(&cfg.state_dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("thinpool-csi: {e}");
            tracing::error!(error = %e, "not starting");
            return ExitCode::FAILURE;
        }
    };
    let classes = Arc::new(Classes::new(&cfg, &node_id));
    let base = classes.base().clone();
    // Pods wait on a filesystem left frozen: before anything that can fail.
    base.thaw_left_frozen().await;
    // Whether thin-provisioning-tools run is asked beside the pools'
    // start, and known before the sockets come up.
    let thin_tools = {
        let lvm = base.lvm.clone();
        tokio::spawn(async move { lvm.thin_tools_run().await })
    };
    // Each device class comes up on its own: a pool that cannot be brought
    // up is reported by Probe and its calls, and the others serve.
    for v in classes.all() {
        let class = v.class_name();
        match pool::ensure(&v.cfg, &v.lvm).await {
            Err(e) => {
                tracing::error!(class, error = %e.message(), "thin pool is not usable");
                // Private reclaim mounts a killed driver left need no LVM to go.
                v.clean_debris().await;
            }
            Ok(()) => {
                if let Err(e) = pool::check_zeroing(&v.cfg, &v.lvm).await {
                    let e = e.message();
                    eprintln!("thinpool-csi: device class {class:?}: {e}");
                    tracing::error!(class, error = %e, "not starting");
                    return ExitCode::FAILURE;
                }
                // What an earlier version recorded becomes node records,
                // and debris of a killed driver goes, before any call can
                // come in.
                v.adopt_legacy().await;
                v.clean_debris().await;
                v.remove_expired_clone_sources().await;
                // Bring back what was staged here (a rebooted node lost
                // its mounts), while the sockets come up; the per-volume
                // guard keeps it apart from calls the CO makes meanwhile.
                let d = v.clone();
                tokio::spawn(async move { d.heal_recorded().await });
                // What the pool does when full, then its autopilot (when on).
                if let Err(e) = v.apply_when_full().await {
                    tracing::warn!(class, error = %e.message(), "cannot set what the thin pool does when full");
                }
                tokio::spawn(v.clone().run_autopilot());
            }
        }
    }
    let thin_tools = thin_tools.await.unwrap_or(false);
    for v in classes.all() {
        v.thin_tools
            .store(thin_tools, std::sync::atomic::Ordering::Relaxed);
    }
    // Off unless configured; a port taken by another process stops
    // start-up before any socket is bound.
    let metrics_addr = base
        .cfg
        .metrics_socket_addr()
        .expect("validated with the config");
    let metrics_listener = match metrics_addr {
        None => None,
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!(address = %addr, "serving metrics at /metrics");
                Some(l)
            }
            Err(e) => {
                tracing::error!(address = %addr, error = %e, "cannot listen for metrics");
                return ExitCode::FAILURE;
            }
        },
    };
    // The internal channel: off unless configured; unreadable TLS files
    // or a port taken stop start-up, as for the metrics endpoint.
    let channel = match base
        .cfg
        .cluster_listen_addr()
        .expect("validated with the config")
    {
        None => None,
        Some(addr) => {
            let c = &base.cfg.cluster;
            let peer_ca = Some(c.peer_ca.as_path()).filter(|p| !p.as_os_str().is_empty());
            let tls = thinpool_csi::channel::server_config_with_peers(
                &c.tls_cert,
                &c.tls_key,
                &c.client_ca,
                peer_ca,
            );
            let tls = match tls {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e.message(), "cannot serve the internal channel");
                    return ExitCode::FAILURE;
                }
            };
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    tracing::info!(address = %addr, "serving the internal channel (mutual TLS)");
                    Some(thinpool_csi::channel::incoming(
                        l,
                        tls,
                        classes.metrics().clone(),
                        thinpool_csi::channel::HANDSHAKE_TIMEOUT,
                    ))
                }
                Err(e) => {
                    tracing::error!(address = %addr, error = %e, "cannot listen for the internal channel");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let Ok((listener, addons_socket, addons_listener)) =
        bind_sockets(&socket, &base.cfg.csi_addons_endpoint)
    else {
        return ExitCode::FAILURE;
    };
    // One signal stops every server.
    let stop_rx = stop_on_signal();
    tracing::info!(socket = %socket.display(), addons = ?addons_socket, "serving CSI");
    let csi = grpc::serve(classes.clone(), listener, stopped(stop_rx.clone()));
    let addons = async {
        match addons_listener {
            Some(l) => grpc::serve_addons(classes.clone(), l, stopped(stop_rx.clone())).await,
            None => Ok(()),
        }
    };
    let metrics = async {
        match metrics_listener {
            Some(l) => {
                let d = classes.clone();
                let render = move || {
                    let d = d.clone();
                    async move { d.exposition().await }
                };
                thinpool_csi::metrics::http::serve(l, render, stopped(stop_rx.clone())).await
            }
            None => Ok(()),
        }
    };
    let cluster = async {
        match channel {
            Some(incoming) => {
                grpc::serve_channel(classes.clone(), incoming, stopped(stop_rx.clone())).await
            }
            None => Ok(()),
        }
    };
    let (res, addons_res, metrics_res, cluster_res) = tokio::join!(csi, addons, metrics, cluster);
    if let Err(e) = metrics_res {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
    // No new call comes in now; operations whose caller already left still
    // run (a CO's retry expects them done). Leaving now would cut them off
    // at their next step, so a routine restart would act like a kill -9.
    // One bound for all classes together.
    let until = std::time::Instant::now() + base.cfg.command_timeout();
    for v in classes.all() {
        v.drain(until.saturating_duration_since(std::time::Instant::now()))
            .await;
    }
    let _ = std::fs::remove_file(&socket);
    if let Some(p) = &addons_socket {
        let _ = std::fs::remove_file(p);
    }
    let res = res.and(addons_res).and(cluster_res);
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}
