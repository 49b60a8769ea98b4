//! `tpcsi`: a command-line client of thinpool-csi. It speaks CSI on the
//! driver's CSI socket and CSI-Addons on its CSI-Addons socket, as a CO and
//! the csi-addons sidecar would, and prints a table, or JSON (`--json`).
//! The driver decides; the client checks only what it must to build a
//! request (sizes, `KEY=VALUE`).

mod addons;
mod args;
mod capability;
mod capacity;
mod cluster;
mod connect;
mod failure;
mod info;
mod manifest;
mod moving;
mod node;
mod output;
mod pages;
mod probe;
mod progress;
mod scrape;
mod snapshot;
mod volume;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use args::{Cli, Command};
use connect::{endpoints, Ctx};
use failure::{Failure, Result, EXIT_LOCAL};
use progress::Progress;

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
        Command::Probe(a) => probe::probe(c, a).await,
        Command::Info => info::info(c).await,
        Command::Capacity(a) => capacity::capacity(c, a).await,
        Command::Create(a) => volume::create(c, a).await,
        Command::List(f) => volume::list_volumes(c, f.class).await,
        Command::Get { volume_id } => volume::get(c, volume_id).await,
        Command::Expand(a) => volume::expand(c, a).await,
        Command::Delete { volume_id } => volume::delete(c, volume_id).await,
        Command::Snapshot(s) => snapshot::snapshot(c, s).await,
        Command::Move(a) => moving::move_volume(c, a).await,
        Command::Stage(a) => node::stage(c, a).await,
        Command::Unstage {
            volume_id,
            staging_path,
        } => node::unstage(c, volume_id, staging_path).await,
        Command::Publish(a) => node::publish(c, a).await,
        Command::Unpublish {
            volume_id,
            target_path,
        } => node::unpublish(c, volume_id, target_path).await,
        Command::Stats {
            volume_id,
            volume_path,
            staging,
        } => node::stats(c, volume_id, volume_path, staging).await,
        Command::Reclaim(a) => addons::reclaim(c, a).await,
        Command::Heal(a) => addons::heal(c, a).await,
        Command::RotateKey(a) => addons::rotate_key(c, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use connect::Endpoints;

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
        let probe = Command::Probe(args::ProbeArgs {
            tolerate_other_classes: false,
        });
        match within(Some(t), command(&mut c, probe)).await {
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
}
