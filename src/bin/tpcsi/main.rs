//! `tpcsi`: a command-line client of thinpool-csi. It speaks CSI on the
//! driver's CSI socket and CSI-Addons on its CSI-Addons socket, as a CO and
//! the csi-addons sidecar would, and prints a table, or JSON (`--json`).
//! The driver decides; the client checks only what it must to build a
//! request (sizes, `KEY=VALUE`).

mod args;
mod output;
mod progress;
mod scrape;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use thinpool_csi::config::{parse_endpoint, Config};
use thinpool_csi::metrics::code_name;
use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
use thinpool_csi::proto::healer::NodeHealerRequest;
use thinpool_csi::proto::identity as addons;
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::{ControllerReclaimSpaceRequest, NodeReclaimSpaceRequest};
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use args::{AccessArgs, Cli, Command, Global, SnapshotCommand};
use csi::controller_client::ControllerClient;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use output::*;
use progress::Progress;

/// Why a command failed, and so its exit status.
#[derive(Debug)]
enum Failure {
    /// Bad input or config, found before any call: 1.
    Local(String),
    /// The socket could not be reached: 3.
    Connect(String),
    /// No answer within `--timeout`: 4.
    Timeout(Duration),
    /// The driver answered an error: 10 + its gRPC code.
    Grpc(Status),
}

const EXIT_LOCAL: u8 = 1;
const EXIT_CONNECT: u8 = 3;
const EXIT_TIMEOUT: u8 = 4;
const EXIT_GRPC_BASE: u8 = 10;

impl Failure {
    fn exit_status(&self) -> u8 {
        match self {
            Failure::Local(_) => EXIT_LOCAL,
            Failure::Connect(_) => EXIT_CONNECT,
            Failure::Timeout(_) => EXIT_TIMEOUT,
            Failure::Grpc(s) => EXIT_GRPC_BASE + s.code() as u8,
        }
    }

    fn to_out(&self) -> ErrorOut {
        let (code, code_number, message) = match self {
            Failure::Local(m) | Failure::Connect(m) => (None, None, m.clone()),
            Failure::Timeout(t) => (
                None,
                None,
                format!(
                    "no answer within {} s; the driver goes on with what it started \
                     (run the command again to see where it stands)",
                    t.as_secs()
                ),
            ),
            Failure::Grpc(s) => (
                Some(code_name(s.code()).to_string()),
                Some(s.code() as i32),
                s.message().to_string(),
            ),
        };
        ErrorOut {
            code,
            code_number,
            message,
            exit_status: self.exit_status(),
        }
    }

    /// The line on stderr: `error: NOT_FOUND (5): volume … does not exist`.
    fn line(&self) -> String {
        let e = self.to_out();
        match (e.code, e.code_number) {
            (Some(c), Some(n)) => format!("error: {c} ({n}): {}", e.message),
            _ => format!("error: {}", e.message),
        }
    }
}

impl From<Status> for Failure {
    fn from(s: Status) -> Failure {
        Failure::Grpc(s)
    }
}

type Result<T> = std::result::Result<T, Failure>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.global.json;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_LOCAL);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("{}", f.line());
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "error": f.to_out() }))
                        .expect("an error serializes")
                );
            }
            ExitCode::from(f.exit_status())
        }
    }
}

/// The two sockets, as URIs: flag, else environment, else the config file
/// (`--config`), else the defaults (config/defaults.toml).
#[derive(Debug, PartialEq)]
struct Endpoints {
    csi: String,
    /// None when the config serves no CSI-Addons (`csi_addons_endpoint = ""`).
    addons: Option<String>,
    /// The metrics endpoint (`metrics_address`); None when there is none.
    metrics: Option<String>,
}

fn endpoints(g: &Global, env: impl Fn(&str) -> Option<String>) -> Result<Endpoints> {
    let cfg = match &g.config {
        Some(p) => Config::load(p).map_err(|e| Failure::Local(e.to_string()))?,
        None => Config::default(),
    };
    let csi = g
        .endpoint
        .clone()
        .or_else(|| env("CSI_ENDPOINT"))
        .unwrap_or(cfg.endpoint);
    let addons = g
        .addons_endpoint
        .clone()
        .or_else(|| env("CSI_ADDONS_ENDPOINT"))
        .unwrap_or(cfg.csi_addons_endpoint);
    let metrics = g
        .metrics_address
        .clone()
        .or_else(|| env("METRICS_ADDRESS"))
        .unwrap_or(cfg.metrics_address);
    Ok(Endpoints {
        csi,
        addons: Some(addons).filter(|a| !a.is_empty()),
        metrics: Some(metrics).filter(|m| !m.is_empty()),
    })
}

/// One command's connections (made when first needed) and printer.
struct Ctx {
    ends: Endpoints,
    json: bool,
    progress: Progress,
    csi: Option<Channel>,
    addons: Option<Channel>,
}

async fn connect(uri: &str) -> Result<Channel> {
    let path = parse_endpoint(uri).map_err(|e| Failure::Local(format!("endpoint {uri:?}: {e}")))?;
    let ep = Endpoint::from_shared(format!("unix://{}", path.display()))
        .map_err(|e| Failure::Local(format!("endpoint {uri:?}: {e}")))?;
    ep.connect().await.map_err(|e| {
        let mut msg = format!("cannot reach {uri}: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            // Transport errors repeat their cause in their own text.
            let text = s.to_string();
            if !msg.contains(&text) {
                msg.push_str(&format!(": {text}"));
            }
            src = s.source();
        }
        Failure::Connect(msg)
    })
}

impl Ctx {
    async fn csi(&mut self) -> Result<Channel> {
        if self.csi.is_none() {
            self.csi = Some(connect(&self.ends.csi).await?);
        }
        Ok(self.csi.clone().expect("connected"))
    }

    async fn addons(&mut self) -> Result<Channel> {
        let Some(uri) = self.ends.addons.clone() else {
            return Err(Failure::Local(
                "no CSI-Addons socket: the config's csi_addons_endpoint is empty; \
                 give --addons-endpoint"
                    .into(),
            ));
        };
        if self.addons.is_none() {
            self.addons = Some(connect(&uri).await?);
        }
        Ok(self.addons.clone().expect("connected"))
    }

    async fn controller(&mut self) -> Result<ControllerClient<Channel>> {
        Ok(ControllerClient::new(self.csi().await?))
    }

    async fn node(&mut self) -> Result<NodeClient<Channel>> {
        Ok(NodeClient::new(self.csi().await?))
    }

    /// Runs a call whose answer is success alone, and says what was done.
    async fn done<T>(
        &self,
        label: &str,
        call: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
        done: Done,
    ) -> Result<()> {
        self.progress.run(label, call).await?;
        self.show(&done);
        Ok(())
    }

    fn show<T: Render>(&self, v: &T) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(v).expect("output serializes")
            );
        } else {
            print!("{}", v.table());
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let g = &cli.global;
    let mut ctx = Ctx {
        ends: endpoints(g, |k| std::env::var(k).ok())?,
        json: g.json,
        progress: Progress::for_stderr(g.progress),
        csi: None,
        addons: None,
    };
    within(
        g.timeout.map(Duration::from_secs),
        command(&mut ctx, cli.command),
    )
    .await
}

/// `work`, given up after `limit` (the whole command: connecting and
/// every call it makes).
async fn within(
    limit: Option<Duration>,
    work: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    match limit {
        Some(t) => tokio::time::timeout(t, work)
            .await
            .unwrap_or(Err(Failure::Timeout(t))),
        None => work.await,
    }
}

async fn command(c: &mut Ctx, command: Command) -> Result<()> {
    match command {
        Command::Probe => probe(c).await,
        Command::Info => info(c).await,
        Command::Capacity(a) => {
            let req = csi::GetCapacityRequest {
                volume_capabilities: given_capability(&a.access).into_iter().collect(),
                parameters: a.params.into_iter().collect(),
                accessible_topology: None,
            };
            let r = c.controller().await?.get_capacity(req).await?.into_inner();
            let mut out = CapacityOut::from(&r);
            out.metadata = metadata(&c.ends).await;
            c.show(&out);
            Ok(())
        }
        Command::Create(a) => create(c, a).await,
        Command::List => list_volumes(c).await,
        Command::Get { volume_id } => {
            let (v, cond) = get_volume(c, &volume_id).await?;
            c.show(&VolumeOut::new(&v, cond.as_ref()));
            Ok(())
        }
        Command::Expand(a) => expand(c, a).await,
        Command::Delete { volume_id } => {
            let req = csi::DeleteVolumeRequest {
                volume_id: volume_id.clone(),
                secrets: HashMap::new(),
            };
            let mut ctl = c.controller().await?;
            c.done(
                &format!("deleting {volume_id}"),
                ctl.delete_volume(req),
                Done::new("deleted", &[("volume_id", &volume_id)]),
            )
            .await
        }
        Command::Snapshot(s) => snapshot(c, s).await,
        Command::Stage(a) => {
            let cap = node_capability(c, &a.volume_id, &a.node).await?;
            let req = csi::NodeStageVolumeRequest {
                volume_id: a.volume_id.clone(),
                staging_target_path: a.staging_path.clone(),
                volume_capability: Some(cap),
                ..Default::default()
            };
            let mut node = c.node().await?;
            c.done(
                &format!("staging {}", a.volume_id),
                node.node_stage_volume(req),
                Done::new(
                    "staged",
                    &[
                        ("volume_id", &a.volume_id),
                        ("staging_target_path", &a.staging_path),
                    ],
                ),
            )
            .await
        }
        Command::Unstage {
            volume_id,
            staging_path,
        } => {
            let req = csi::NodeUnstageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: staging_path.clone(),
            };
            let mut node = c.node().await?;
            c.done(
                &format!("unstaging {volume_id}"),
                node.node_unstage_volume(req),
                Done::new(
                    "unstaged",
                    &[
                        ("volume_id", &volume_id),
                        ("staging_target_path", &staging_path),
                    ],
                ),
            )
            .await
        }
        Command::Publish(a) => {
            let cap = node_capability(c, &a.volume_id, &a.node).await?;
            let req = csi::NodePublishVolumeRequest {
                volume_id: a.volume_id.clone(),
                staging_target_path: a.staging.clone(),
                target_path: a.target_path.clone(),
                volume_capability: Some(cap),
                readonly: a.readonly,
                ..Default::default()
            };
            let mut node = c.node().await?;
            c.done(
                &format!("publishing {}", a.volume_id),
                node.node_publish_volume(req),
                Done::new(
                    "published",
                    &[("volume_id", &a.volume_id), ("target_path", &a.target_path)],
                ),
            )
            .await
        }
        Command::Unpublish {
            volume_id,
            target_path,
        } => {
            let req = csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: target_path.clone(),
            };
            let mut node = c.node().await?;
            c.done(
                &format!("unpublishing {volume_id}"),
                node.node_unpublish_volume(req),
                Done::new(
                    "unpublished",
                    &[("volume_id", &volume_id), ("target_path", &target_path)],
                ),
            )
            .await
        }
        Command::Stats {
            volume_id,
            volume_path,
            staging,
        } => {
            let req = csi::NodeGetVolumeStatsRequest {
                volume_id: volume_id.clone(),
                volume_path: volume_path.clone(),
                staging_target_path: staging.unwrap_or_default(),
            };
            let r = c
                .node()
                .await?
                .node_get_volume_stats(req)
                .await?
                .into_inner();
            c.show(&StatsOut::new(&volume_id, &volume_path, &r));
            Ok(())
        }
        Command::Reclaim(a) => reclaim(c, a).await,
        Command::Heal(a) => {
            let req = NodeHealerRequest {
                volume_id: a.volume_id.clone(),
                volume_path: a.path,
                staging_target_path: a.staging.unwrap_or_default(),
                volume_capability: given_capability(&a.access),
                ..Default::default()
            };
            let mut healer = HealerNodeClient::new(c.addons().await?);
            let r = c
                .progress
                .run(&format!("healing {}", a.volume_id), healer.node_healer(req))
                .await?
                .into_inner();
            c.show(&HealOut {
                volume_id: a.volume_id,
                abnormal: r.abnormal,
                message: r.message,
            });
            Ok(())
        }
    }
}

/// A capability from `--fs`/`--block`/`--mode` and mount flags; a mount
/// with an empty fs type (the driver's default) when neither is given.
fn capability(a: &AccessArgs, mount_flags: &[String]) -> csi::VolumeCapability {
    let access_type = if a.block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: a.fs.clone().unwrap_or_default(),
            mount_flags: mount_flags.to_vec(),
            ..Default::default()
        })
    };
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: csi::volume_capability::access_mode::Mode::from(a.mode) as i32,
        }),
        access_type: Some(access_type),
    }
}

/// The capability `--fs` or `--block` asks for, if either is given.
fn given_capability(a: &AccessArgs) -> Option<csi::VolumeCapability> {
    (a.fs.is_some() || a.block).then(|| capability(a, &[]))
}

/// Both metadata stores from the driver's metrics, or why they are not
/// shown (on stderr; GetCapacity's answer stands on its own).
async fn metadata(ends: &Endpoints) -> Option<scrape::Metadata> {
    let Some(listen) = &ends.metrics else {
        eprintln!(
            "note: no metrics address (--metrics-address, $METRICS_ADDRESS or the config's \
             metrics_address): metadata figures not shown"
        );
        return None;
    };
    let got = match scrape::dial_address(listen) {
        Ok(addr) => thinpool_csi::metrics::http::scrape(addr).await,
        Err(e) => Err(e),
    };
    match got {
        Ok(s) => Some(scrape::Metadata::from_samples(
            &s,
            thinpool_csi::naming::DEFAULT_CLASS,
        )),
        Err(e) => {
            eprintln!("note: {e}: metadata figures not shown");
            None
        }
    }
}

/// The capability to stage or publish with: as given, or else the
/// volume's own (its context's `fsType`; none means block).
async fn node_capability(
    c: &mut Ctx,
    id: &str,
    a: &args::NodeAccessArgs,
) -> Result<csi::VolumeCapability> {
    if a.access.fs.is_some() || a.access.block {
        return Ok(capability(&a.access, &a.mount_flags));
    }
    let (v, _) = get_volume(c, id).await?;
    let access = access_of(&v, &a.access);
    Ok(capability(&access, &a.mount_flags))
}

/// `--fs`/`--block` as the volume's context says.
fn access_of(v: &csi::Volume, given: &AccessArgs) -> AccessArgs {
    let fs = v.volume_context.get("fsType").cloned();
    AccessArgs {
        block: fs.is_none(),
        fs,
        mode: given.mode,
    }
}

async fn get_volume(c: &mut Ctx, id: &str) -> Result<(csi::Volume, Option<csi::VolumeCondition>)> {
    let r = c
        .controller()
        .await?
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.to_string(),
        })
        .await?
        .into_inner();
    let v = r
        .volume
        .ok_or_else(|| Status::internal(format!("ControllerGetVolume of {id}: no volume")))?;
    Ok((v, r.status.and_then(|s| s.volume_condition)))
}

async fn probe(c: &mut Ctx) -> Result<()> {
    let mut services = Vec::new();
    let r = IdentityClient::new(c.csi().await?)
        .probe(csi::ProbeRequest {})
        .await?
        .into_inner();
    services.push(ProbeService {
        service: "csi",
        endpoint: c.ends.csi.clone(),
        ready: r.ready.unwrap_or(true),
    });
    if let Some(uri) = c.ends.addons.clone() {
        let r = addons::identity_client::IdentityClient::new(c.addons().await?)
            .probe(addons::ProbeRequest {})
            .await?
            .into_inner();
        services.push(ProbeService {
            service: "csi-addons",
            endpoint: uri,
            ready: r.ready.unwrap_or(true),
        });
    }
    // Probe says the driver serves; whether its pool takes a new volume
    // is GetCapacity's answer (0 while it is full, failed or read-only, an
    // error while it is missing). The pod's readiness runs this.
    let pool = match c
        .controller()
        .await?
        .get_capacity(csi::GetCapacityRequest::default())
        .await
    {
        Ok(r) => PoolReadiness::from_capacity(&r.into_inner()),
        Err(s) => PoolReadiness::refused(s.code(), s.message()),
    };
    let all_ready = services.iter().all(|s| s.ready);
    let verdict = if !all_ready {
        Err(Status::unavailable("the driver says it is not ready"))
    } else {
        pool.verdict()
    };
    c.show(&ProbeOut { services, pool });
    verdict.map_err(Into::into)
}

/// An enum value's name as the proto spells it, `#n` for one this client
/// does not know.
fn name_of<T: TryFrom<i32>>(value: i32, name: fn(&T) -> &str) -> String {
    T::try_from(value)
        .map(|t| name(&t).to_string())
        .unwrap_or_else(|_| format!("#{value}"))
}

async fn info(c: &mut Ctx) -> Result<()> {
    use csi::controller_service_capability::{rpc, Type as CtlType};
    use csi::node_service_capability::{rpc as node_rpc, Type as NodeType};
    use csi::plugin_capability::{service, volume_expansion, Type as PlugType};
    let mut id = IdentityClient::new(c.csi().await?);
    let plugin = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await?
        .into_inner();
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await?
        .into_inner();
    let plugin_capabilities = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|cap| match cap {
            PlugType::Service(s) => name_of(s.r#type, service::Type::as_str_name),
            PlugType::VolumeExpansion(e) => format!(
                "VOLUME_EXPANSION_{}",
                name_of(e.r#type, volume_expansion::Type::as_str_name)
            ),
        })
        .collect();
    let ctl = c
        .controller()
        .await?
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await?
        .into_inner();
    let controller_capabilities = ctl
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|CtlType::Rpc(r)| name_of(r.r#type, rpc::Type::as_str_name))
        .collect();
    let mut node = c.node().await?;
    let ninfo = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await?
        .into_inner();
    let ncaps = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await?
        .into_inner();
    let node_capabilities = ncaps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|NodeType::Rpc(r)| name_of(r.r#type, node_rpc::Type::as_str_name))
        .collect();
    let addons = match c.ends.addons {
        Some(_) => Some(addons_info(c).await?),
        None => None,
    };
    c.show(&InfoOut {
        name: plugin.name,
        vendor_version: plugin.vendor_version,
        manifest: plugin.manifest.into_iter().collect(),
        plugin_capabilities,
        controller_capabilities,
        node_id: ninfo.node_id,
        max_volumes_per_node: ninfo.max_volumes_per_node,
        accessible_topology: ninfo
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default(),
        node_capabilities,
        addons,
    });
    Ok(())
}

async fn addons_info(c: &mut Ctx) -> Result<AddonsInfo> {
    use addons::capability::{reclaim_space, service, Type};
    let mut id = addons::identity_client::IdentityClient::new(c.addons().await?);
    let ident = id
        .get_identity(addons::GetIdentityRequest {})
        .await?
        .into_inner();
    let caps = id
        .get_capabilities(addons::GetCapabilitiesRequest {})
        .await?
        .into_inner();
    let capabilities = caps
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|cap| match cap {
            Type::Service(s) => name_of(s.r#type, service::Type::as_str_name),
            Type::ReclaimSpace(r) => format!(
                "RECLAIM_SPACE_{}",
                name_of(r.r#type, reclaim_space::Type::as_str_name)
            ),
            // Families this driver never advertises: by name only.
            Type::NetworkFence(_) => "NETWORK_FENCE".into(),
            Type::VolumeReplication(_) => "VOLUME_REPLICATION".into(),
            Type::VolumeGroup(_) => "VOLUME_GROUP".into(),
            Type::EncryptionKeyRotation(_) => "ENCRYPTION_KEY_ROTATION".into(),
        })
        .collect();
    Ok(AddonsInfo {
        name: ident.name,
        vendor_version: ident.vendor_version,
        capabilities,
    })
}

fn capacity_range(size: Option<u64>, limit: Option<u64>) -> Option<csi::CapacityRange> {
    (size.is_some() || limit.is_some()).then(|| csi::CapacityRange {
        required_bytes: size.unwrap_or(0) as i64,
        limit_bytes: limit.unwrap_or(0) as i64,
    })
}

async fn create(c: &mut Ctx, a: args::CreateArgs) -> Result<()> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let source = match (a.from_snapshot, a.from_volume) {
        (Some(snapshot_id), _) => Some(Type::Snapshot(SnapshotSource { snapshot_id })),
        (None, Some(volume_id)) => Some(Type::Volume(VolumeSource { volume_id })),
        (None, None) => None,
    };
    let req = csi::CreateVolumeRequest {
        name: a.name.clone(),
        capacity_range: capacity_range(a.size, a.limit),
        volume_capabilities: vec![capability(&a.access, &[])],
        parameters: a.params.into_iter().collect(),
        volume_content_source: source.map(|t| csi::VolumeContentSource { r#type: Some(t) }),
        mutable_parameters: a.mutable.into_iter().collect(),
        ..Default::default()
    };
    let mut ctl = c.controller().await?;
    let r = c
        .progress
        .run(&format!("creating {}", a.name), ctl.create_volume(req))
        .await?
        .into_inner();
    let v = r
        .volume
        .ok_or_else(|| Status::internal("CreateVolume answered no volume"))?;
    c.show(&VolumeOut::new(&v, None));
    Ok(())
}

/// Follows `next_token` until it is empty; a token that comes back twice
/// is an error rather than a loop.
async fn all_pages<T, F, Fut>(mut page: F) -> Result<Vec<T>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String)>>,
{
    let mut all = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut token = String::new();
    loop {
        let (items, next) = page(token).await?;
        all.extend(items);
        if next.is_empty() {
            return Ok(all);
        }
        if !seen.insert(next.clone()) {
            return Err(
                Status::internal(format!("the driver sent page token {next:?} twice")).into(),
            );
        }
        token = next;
    }
}

async fn list_volumes(c: &mut Ctx) -> Result<()> {
    let ctl = c.controller().await?;
    let volumes = all_pages(|starting_token| {
        let mut ctl = ctl.clone();
        async move {
            let r = ctl
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token,
                })
                .await?
                .into_inner();
            let page = r
                .entries
                .iter()
                .filter_map(|e| {
                    let cond = e.status.as_ref().and_then(|s| s.volume_condition.as_ref());
                    e.volume.as_ref().map(|v| VolumeOut::new(v, cond))
                })
                .collect();
            Ok((page, r.next_token))
        }
    })
    .await?;
    c.show(&VolumeList { volumes });
    Ok(())
}

async fn expand(c: &mut Ctx, a: args::ExpandArgs) -> Result<()> {
    let range = capacity_range(Some(a.size), a.limit);
    let req = csi::ControllerExpandVolumeRequest {
        volume_id: a.volume_id.clone(),
        capacity_range: range,
        ..Default::default()
    };
    let mut ctl = c.controller().await?;
    let r = c
        .progress
        .run(
            &format!("expanding {}", a.volume_id),
            ctl.controller_expand_volume(req),
        )
        .await?
        .into_inner();
    let mut out = ExpandOut {
        volume_id: a.volume_id.clone(),
        capacity_bytes: r.capacity_bytes.max(0) as u64,
        node_expansion_required: r.node_expansion_required,
        node_capacity_bytes: None,
    };
    if let (Some(path), true) = (a.path, r.node_expansion_required) {
        let req = csi::NodeExpandVolumeRequest {
            volume_id: a.volume_id.clone(),
            volume_path: path,
            capacity_range: range,
            staging_target_path: a.staging.unwrap_or_default(),
            ..Default::default()
        };
        let mut node = c.node().await?;
        let n = c
            .progress
            .run(
                &format!("growing the filesystem of {}", a.volume_id),
                node.node_expand_volume(req),
            )
            .await?
            .into_inner();
        out.node_capacity_bytes = Some(n.capacity_bytes.max(0) as u64);
    }
    c.show(&out);
    Ok(())
}

async fn snapshot(c: &mut Ctx, s: SnapshotCommand) -> Result<()> {
    let ctl = c.controller().await?;
    match s {
        SnapshotCommand::Create { name, volume } => {
            let req = csi::CreateSnapshotRequest {
                source_volume_id: volume,
                name: name.clone(),
                ..Default::default()
            };
            let r = c
                .progress
                .run(
                    &format!("snapshotting as {name}"),
                    ctl.clone().create_snapshot(req),
                )
                .await?
                .into_inner();
            let s = r
                .snapshot
                .ok_or_else(|| Status::internal("CreateSnapshot answered no snapshot"))?;
            c.show(&SnapshotOut::new(&s));
        }
        SnapshotCommand::List { volume, id } => {
            let (volume, id) = (volume.unwrap_or_default(), id.unwrap_or_default());
            let snapshots = all_pages(|starting_token| {
                let mut ctl = ctl.clone();
                let req = csi::ListSnapshotsRequest {
                    max_entries: 0,
                    starting_token,
                    source_volume_id: volume.clone(),
                    snapshot_id: id.clone(),
                    ..Default::default()
                };
                async move {
                    let r = ctl.list_snapshots(req).await?.into_inner();
                    let page = r
                        .entries
                        .iter()
                        .filter_map(|e| e.snapshot.as_ref().map(SnapshotOut::new))
                        .collect();
                    Ok((page, r.next_token))
                }
            })
            .await?;
            c.show(&SnapshotList { snapshots });
        }
        SnapshotCommand::Delete { snapshot_id } => {
            let req = csi::DeleteSnapshotRequest {
                snapshot_id: snapshot_id.clone(),
                secrets: HashMap::new(),
            };
            c.done(
                &format!("deleting {snapshot_id}"),
                ctl.clone().delete_snapshot(req),
                Done::new("deleted", &[("snapshot_id", &snapshot_id)]),
            )
            .await?;
        }
    }
    Ok(())
}

async fn reclaim(c: &mut Ctx, a: args::ReclaimArgs) -> Result<()> {
    let ch = c.addons().await?;
    let label = format!("reclaiming space of {}", a.volume_id);
    let (side, pre, post) = if a.node {
        let req = NodeReclaimSpaceRequest {
            volume_id: a.volume_id.clone(),
            volume_path: a.path.unwrap_or_default(),
            staging_target_path: a.staging.unwrap_or_default(),
            ..Default::default()
        };
        let mut n = ReclaimSpaceNodeClient::new(ch);
        let r = c
            .progress
            .run(&label, n.node_reclaim_space(req))
            .await?
            .into_inner();
        ("node", r.pre_usage, r.post_usage)
    } else {
        let req = ControllerReclaimSpaceRequest {
            volume_id: a.volume_id.clone(),
            ..Default::default()
        };
        let mut n = ReclaimSpaceControllerClient::new(ch);
        let r = c
            .progress
            .run(&label, n.controller_reclaim_space(req))
            .await?
            .into_inner();
        ("controller", r.pre_usage, r.post_usage)
    };
    c.show(&ReclaimOut::new(
        &a.volume_id,
        side,
        pre.map(|u| u.usage_bytes),
        post.map(|u| u.usage_bytes),
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tonic::Code;

    fn global(config: Option<PathBuf>, endpoint: Option<&str>) -> Global {
        Global {
            endpoint: endpoint.map(String::from),
            addons_endpoint: None,
            metrics_address: None,
            config,
            json: false,
            progress: false,
            timeout: None,
        }
    }

    #[test]
    fn endpoints_come_from_flag_then_environment_then_config() {
        let none = |_: &str| None;
        let d = endpoints(&global(None, None), none).unwrap();
        assert_eq!(
            d,
            Endpoints {
                csi: "unix:///run/thinpool-csi/csi.sock".into(),
                addons: Some("unix:///run/thinpool-csi/csi-addons.sock".into()),
                metrics: None,
            }
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            "endpoint = \"unix:///x/csi.sock\"\ncsi_addons_endpoint = \"\"\n",
        )
        .unwrap();
        let from_cfg = endpoints(&global(Some(cfg.clone()), None), none).unwrap();
        assert_eq!(from_cfg.csi, "unix:///x/csi.sock");
        assert_eq!(from_cfg.addons, None);
        let env = |k: &str| (k == "CSI_ENDPOINT").then(|| "unix:///env.sock".to_string());
        assert_eq!(
            endpoints(&global(Some(cfg.clone()), None), env)
                .unwrap()
                .csi,
            "unix:///env.sock"
        );
        assert_eq!(
            endpoints(&global(Some(cfg), Some("unix:///flag.sock")), env)
                .unwrap()
                .csi,
            "unix:///flag.sock"
        );
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "endpoitn = 1\n").unwrap();
        match endpoints(&global(Some(bad), None), none) {
            Err(Failure::Local(m)) => assert!(m.contains("endpoitn"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_status_and_error_line_carry_the_grpc_code() {
        let f = Failure::Grpc(Status::not_found("volume csi-x does not exist"));
        assert_eq!(f.exit_status(), 15);
        assert_eq!(
            f.line(),
            "error: NOT_FOUND (5): volume csi-x does not exist"
        );
        assert_eq!(
            serde_json::to_value(f.to_out()).unwrap(),
            serde_json::json!({
                "code": "NOT_FOUND", "code_number": 5,
                "message": "volume csi-x does not exist", "exit_status": 15
            })
        );
        assert_eq!(Failure::Grpc(Status::unauthenticated("")).exit_status(), 26);
        assert_eq!(Failure::Connect("x".into()).exit_status(), 3);
        assert_eq!(Failure::Local("x".into()).line(), "error: x");
        assert_eq!(Failure::Local("x".into()).exit_status(), 1);
    }

    #[test]
    fn code_names_are_grpc_names() {
        for n in 0..=16 {
            let c = Code::from_i32(n);
            let name = code_name(c);
            // tonic's Debug spelling, in upper snake case.
            let debug = format!("{c:?}");
            let mut snake = String::new();
            for (i, ch) in debug.chars().enumerate() {
                if ch.is_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(ch.to_ascii_uppercase());
            }
            assert_eq!(name, snake);
        }
    }

    #[test]
    fn capabilities_from_flags() {
        use csi::volume_capability::access_mode::Mode;
        let a = AccessArgs {
            fs: Some("xfs".into()),
            block: false,
            mode: args::AccessMode::SingleNodeMultiWriter,
        };
        let cap = capability(&a, &["noatime".to_string()]);
        assert_eq!(
            cap.access_mode.unwrap().mode,
            Mode::SingleNodeMultiWriter as i32
        );
        match cap.access_type {
            Some(AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "xfs");
                assert_eq!(m.mount_flags, vec!["noatime"]);
            }
            other => panic!("{other:?}"),
        }
        let b = capability(
            &AccessArgs {
                block: true,
                ..Default::default()
            },
            &[],
        );
        assert!(matches!(b.access_type, Some(AccessType::Block(_))));
        let default = capability(&AccessArgs::default(), &[]);
        match default.access_type {
            Some(AccessType::Mount(m)) => assert_eq!(m.fs_type, ""),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn access_follows_the_volume_context() {
        let mut v = csi::Volume::default();
        let a = access_of(&v, &AccessArgs::default());
        assert!(a.block && a.fs.is_none());
        v.volume_context.insert("fsType".into(), "xfs".into());
        let a = access_of(&v, &AccessArgs::default());
        assert!(!a.block);
        assert_eq!(a.fs.as_deref(), Some("xfs"));
    }

    #[tokio::test]
    async fn pages_are_followed_and_a_repeated_token_stops() {
        let got = all_pages(|token| async move {
            Ok(match token.as_str() {
                "" => (vec![1, 2], "a".to_string()),
                "a" => (vec![3], "b".to_string()),
                _ => (vec![4], String::new()),
            })
        })
        .await
        .unwrap();
        assert_eq!(got, vec![1, 2, 3, 4]);
        let looped = all_pages(|_| async { Ok((vec![0], "same".to_string())) }).await;
        assert!(matches!(looped, Err(Failure::Grpc(s)) if s.code() == Code::Internal));
    }

    #[tokio::test]
    async fn a_silent_socket_is_given_up_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        // Bound and listening, and never answering.
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut c = Ctx {
            ends: Endpoints {
                csi: format!("unix://{}", path.display()),
                addons: None,
                metrics: None,
            },
            json: false,
            progress: Progress::Off,
            csi: None,
            addons: None,
        };
        let t = Duration::from_millis(300);
        let start = std::time::Instant::now();
        match within(Some(t), command(&mut c, Command::Probe)).await {
            Err(f @ Failure::Timeout(_)) => {
                assert_eq!(f.exit_status(), 4);
                assert!(f.line().contains("no answer within"), "{}", f.line());
            }
            other => panic!("{other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        let quick = within(Some(t), async { Ok(()) }).await;
        assert!(quick.is_ok());
    }

    #[tokio::test]
    async fn an_absent_socket_is_a_connect_failure() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("unix://{}/none.sock", dir.path().display());
        match connect(&uri).await {
            Err(f @ Failure::Connect(_)) => {
                assert_eq!(f.exit_status(), 3);
                assert!(f.line().contains("none.sock"), "{}", f.line());
            }
            other => panic!("{other:?}"),
        }
        match connect("tcp://1.2.3.4:5").await {
            Err(Failure::Local(m)) => assert!(m.contains("unix"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
