//! `tpcsi move`: a volume moved to another node through the cluster's
//! controller (`Move.Round`, docs/moving.md). While its workload runs,
//! rounds copy snapshots of it to the target, each after the first by
//! what changed since the one before, as long as that shrinks; the copy
//! stays no volume. Once the workload is stopped, `--final` copies what
//! changed since the last round and makes the copy the volume, then
//! checks it whole against the last snapshot (`Move.Verify`). The old
//! volume is never touched: it goes only when its user deletes it, after
//! the new one is checked.

use std::time::Instant;

use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::thinpool::cluster::v1::move_client::MoveClient;
use thinpool_csi::proto::thinpool::cluster::v1::{RoundRequest, RoundResponse, VerifyRequest};
use tonic::Status;

use thinpool_csi::naming;

use crate::args::MoveArgs;
use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::Done;

pub async fn move_volume(c: &mut Ctx, a: MoveArgs) -> Result<()> {
    // Found before anything moves, not after.
    let manifest = match &a.manifest {
        Some(path) => Some(manifest_inputs(path, &a).map_err(crate::failure::Failure::Local)?),
        None => None,
    };
    let mut ctl = c.controller().await?;
    let volume = ctl
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: a.volume_id.clone(),
        })
        .await?
        .into_inner()
        .volume
        .ok_or_else(|| Status::internal("ControllerGetVolume answered no volume"))?;
    let driver = crate::cluster::plugin_info(c).await?.name;
    let node = csi::Topology {
        segments: [(thinpool_csi::config::topology_key(&driver), a.to.clone())].into(),
    };
    // As given, or else the volume's own access (its context's fsType;
    // none means block), as stage and publish take it.
    let capability = crate::capability::given_capability(&a.access).unwrap_or_else(|| {
        crate::capability::capability(&crate::node::access_of(&volume, &a.access), &[])
    });
    let params = with_class(&a.volume_id, &a.params);
    // The parameters as given, for the commands printed to go on.
    let given: String = a
        .params
        .iter()
        .map(|(k, v)| format!(" --param {}", quoted(&format!("{k}={v}"))))
        .collect();
    let create = |snapshot_id: &str| csi::CreateVolumeRequest {
        name: a.name.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: volume.capacity_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability.clone()],
        parameters: params.iter().cloned().collect(),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![node.clone()],
            preferred: vec![node.clone()],
        }),
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot_id.to_string(),
                },
            )),
        }),
        ..Default::default()
    };
    let mover = MoveClient::new(c.csi().await?);
    // The copy's id on the target: its condition tells how far a round got.
    let class = params
        .iter()
        .find(|(k, _)| k == "deviceClass")
        .map(|(_, v)| v.as_str())
        .filter(|c| *c != naming::DEFAULT_CLASS);
    let copy_id = naming::with_node(
        &naming::node_key(&a.to),
        &naming::in_class(class, naming::lv_name_for(&a.name)),
    );
    let mut base = a.base.clone();
    let mut last_bytes = None;
    let rounds = if a.r#final { 1 } else { a.rounds.max(1) };
    for k in 1..=rounds {
        let hold = !a.r#final;
        // A snapshot of this moment, named for the move and the time (or,
        // resuming a round that failed, that round's).
        let snap = match (k, &a.snapshot) {
            (1, Some(id)) => id.clone(),
            _ => take_snapshot(c, &mut ctl, &a, k).await?,
        };
        // Said at once: a move cut off (Ctrl-C, --timeout) leaves it.
        eprintln!("round {k}: snapshot {snap}");
        let started = Instant::now();
        let req = RoundRequest {
            create: Some(create(&snap)),
            base_snapshot_id: base.clone().unwrap_or_default(),
            hold,
        };
        let label = format!("round {k}: copying to {}", a.to);
        let detail = std::sync::Mutex::new(String::new());
        let asked = with_retries(c, &label, &detail, || {
            let (mut m, r) = (mover.clone(), req.clone());
            async move { m.round(r).await }
        });
        let r: RoundResponse = match watching(&mut ctl, &copy_id, &detail, asked).await {
            Ok(r) => r,
            Err(e) if e.code() == tonic::Code::DataLoss => {
                // The copy's data did not match: the target removed it.
                forget(&mut ctl, &snap).await;
                let base = base
                    .map(|b| format!(", and delete the base: tpcsi snapshot delete {b}"))
                    .unwrap_or_default();
                eprintln!("the copy on {} was removed (its data did not match): move again from the start{base}", a.to);
                return Err(e.into());
            }
            Err(e) => {
                // The copy may be part way from the base to this snapshot:
                // only the same round goes on from there, once the cause
                // is gone. Nothing is deleted here.
                let also = base
                    .as_ref()
                    .map(|b| format!(" and tpcsi snapshot delete {b}"))
                    .unwrap_or_default();
                eprintln!(
                    "resume with: tpcsi move {} --to {} --name {}{given}{} --snapshot {snap}{}; or give the move up: tpcsi delete {copy_id}, then tpcsi snapshot delete {snap}{also}",
                    a.volume_id,
                    a.to,
                    a.name,
                    base.as_ref().map(|b| format!(" --base {b}")).unwrap_or_default(),
                    if a.r#final { " --final" } else { "" },
                );
                return Err(e.into());
            }
        };
        let round = r.round.unwrap_or_default();
        let secs = format!("{:.1}", started.elapsed().as_secs_f64());
        let (bytes, ranges) = (round.bytes.to_string(), round.ranges.to_string());
        let kind = match round.base_snapshot_id.is_empty() {
            true => "whole",
            false => "changes since the base",
        };
        c.show(&Done::new(
            if hold {
                "copied, held back"
            } else {
                "copied, the volume"
            },
            &[
                ("round", &k.to_string()),
                ("snapshot_id", &snap),
                ("read", kind),
                ("bytes", &bytes),
                ("ranges", &ranges),
                ("seconds", &secs),
            ],
        ));
        // The copy holds this round's snapshot now: the base before it is
        // of no more use.
        if let Some(b) = base.replace(snap.clone()) {
            forget(&mut ctl, &b).await;
        }
        if !hold {
            let v = r
                .volume
                .ok_or_else(|| Status::internal("the final round answered no volume"))?;
            // The last check, before anything of the source goes: the new
            // volume's whole device against the snapshot's, each read on
            // its own node. On a mismatch the snapshot stays, for a look.
            let check = VerifyRequest {
                volume_id: v.volume_id.clone(),
                snapshot_id: snap.clone(),
            };
            let label = format!("checking {} against {snap}", v.volume_id);
            let none = std::sync::Mutex::new(String::new());
            let verified = match with_retries(c, &label, &none, || {
                let (mut m, r) = (mover.clone(), check.clone());
                async move { m.verify(r).await }
            })
            .await
            {
                Ok(v) => v,
                Err(e) => {
                    eprintln!(
                        "the new volume {} is made but not checked: snapshot {snap} is kept; check again: tpcsi move {} --to {} --name {}{given} --snapshot {snap} --final (it answers the volume made and checks it); or delete the new volume (tpcsi delete {}) and move again; the old volume is as it was",
                        v.volume_id, a.volume_id, a.to, a.name, v.volume_id
                    );
                    return Err(e.into());
                }
            };
            let hash: String = verified.blake3.iter().map(|b| format!("{b:02x}")).collect();
            // Written while the last snapshot is kept: the same command
            // again answers the volume made, checks it and writes it.
            if let Some(inputs) = &manifest {
                if let Err(e) = write_manifest(inputs, &a, &v, (&driver, &capability)) {
                    eprintln!(
                        "the move is done and checked (volume {}, BLAKE3 {hash}), but its manifest is not written; snapshot {snap} is kept: fix the cause, then run tpcsi move {} --to {} --name {}{given} --snapshot {snap} --final with the same --manifest flags (it answers the volume made, checks it again and writes the file)",
                        v.volume_id, a.volume_id, a.to, a.name
                    );
                    return Err(e);
                }
            }
            forget(&mut ctl, &snap).await;
            let written = a
                .manifest
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let mut fields = vec![
                ("volume_id", v.volume_id.as_str()),
                ("node", a.to.as_str()),
                ("from_volume_id", a.volume_id.as_str()),
                ("verified_blake3", hash.as_str()),
            ];
            if !written.is_empty() {
                fields.push(("manifest", written.as_str()));
            }
            c.show(&Done::new("moved", &fields));
            match written.is_empty() {
                true => eprintln!(
                    "next: point a PersistentVolume at {} (node affinity: {}), bind the claim to it, check the data, then delete the old volume {} (docs/moving.md; --manifest writes both)",
                    v.volume_id, a.to, a.volume_id
                ),
                false => eprintln!(
                    "next: set the old PV to Retain and delete the claim, then kubectl apply -f {written}; check the data, then delete the old volume {} (docs/moving.md)",
                    a.volume_id
                ),
            }
            return Ok(());
        }
        // While the workload runs, go on while what changed shrinks.
        let shrinking = last_bytes.is_none_or(|l| round.bytes < l);
        last_bytes = Some(round.bytes);
        if !shrinking {
            break;
        }
    }
    let base = base.unwrap_or_default();
    eprintln!(
        "next: stop the volume's workload, then: tpcsi move {} --to {} --name {}{given} --base {base} --final",
        a.volume_id, a.to, a.name
    );
    Ok(())
}

/// `--manifest`'s inputs, read once from the arguments.
struct ManifestInputs<'a> {
    path: &'a std::path::Path,
    /// `--claim`: namespace and name.
    claim: (&'a str, &'a str),
    storage_class: &'a str,
    /// `--node-stage-secret`: namespace and name.
    stage_secret: Option<(&'a str, &'a str)>,
}

/// What `--manifest` needs, checked before anything moves: names that
/// Kubernetes takes, and a file that can be written (a directory that
/// exists; not `-`: stdout carries the command's own output).
fn manifest_inputs<'a>(
    path: &'a std::path::Path,
    a: &'a MoveArgs,
) -> std::result::Result<ManifestInputs<'a>, String> {
    use crate::manifest::{bad_name, ref_of};
    let claim = ref_of("--claim", a.claim.as_deref().unwrap_or_default())?;
    let stage_secret = a
        .node_stage_secret
        .as_deref()
        .map(|s| ref_of("--node-stage-secret", s))
        .transpose()?;
    let class = a.storage_class.as_deref().unwrap_or_default();
    if let Some(e) =
        bad_name("--storage-class", class, false).or_else(|| bad_name("--name", &a.name, false))
    {
        return Err(e);
    }
    if path.as_os_str() == "-" {
        return Err("--manifest -: give a file (stdout carries the command's own output)".into());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "--manifest {}: {} is no directory",
            path.display(),
            dir.display()
        ));
    }
    Ok(ManifestInputs {
        path,
        claim,
        storage_class: class,
        stage_secret,
    })
}

/// Writes the PV of the moved volume `v` and the claim bound to it
/// (`--manifest`, [`crate::manifest`]) to its path: written and synced
/// beside it as `<name>.part`, then renamed into place.
fn write_manifest(
    inputs: &ManifestInputs,
    a: &MoveArgs,
    v: &csi::Volume,
    (driver, capability): (&str, &csi::VolumeCapability),
) -> Result<()> {
    use csi::volume_capability::{access_mode::Mode, AccessType};
    use std::io::Write;
    let (path, (namespace, claim)) = (inputs.path, inputs.claim);
    let key = thinpool_csi::config::topology_key(driver);
    let fs_type = match &capability.access_type {
        Some(AccessType::Mount(m)) => Some(m.fs_type.as_str()),
        _ => None,
    };
    let single_writer = capability
        .access_mode
        .as_ref()
        .is_some_and(|m| m.mode == Mode::SingleNodeSingleWriter as i32);
    let text = crate::manifest::moved_volume(&crate::manifest::Moved {
        pv: &a.name,
        namespace,
        claim,
        storage_class: inputs.storage_class,
        driver,
        node: &a.to,
        topology_key: &key,
        volume_id: &v.volume_id,
        bytes: v.capacity_bytes,
        fs_type,
        single_writer,
        stage_secret: inputs.stage_secret,
        mount_options: &a.mount_options,
    });
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&part)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&part, path)
    };
    write().map_err(|e| {
        crate::failure::Failure::Local(format!("--manifest {}: {e}", path.display()))
    })?;
    Ok(())
}

/// `word` as a shell reads it back: as it is when it is plain, else in
/// single quotes.
fn quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-=.,:/@+".contains(c);
    match word.chars().all(plain) && !word.is_empty() {
        true => word.to_string(),
        false => format!("'{}'", word.replace('\'', "'\\''")),
    }
}

/// The new volume's parameters: `params`, and the old one's device
/// class (in its id) unless they name one.
fn with_class(volume_id: &str, params: &[(String, String)]) -> Vec<(String, String)> {
    let mut params = params.to_vec();
    let class = naming::class_of(volume_id);
    if class != naming::DEFAULT_CLASS && !params.iter().any(|(k, _)| k == "deviceClass") {
        params.push(("deviceClass".into(), class.to_string()));
    }
    params
}

/// Takes round `k`'s snapshot of the volume; its id.
async fn take_snapshot(
    c: &mut Ctx,
    ctl: &mut csi::controller_client::ControllerClient<tonic::transport::Channel>,
    a: &MoveArgs,
    k: u32,
) -> Result<String> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let snap = c
        .progress
        .run(
            &format!("round {k}: snapshotting {}", a.volume_id),
            ctl.create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: a.volume_id.clone(),
                name: format!("{}-move-{stamp}", a.name),
                ..Default::default()
            }),
        )
        .await?
        .into_inner()
        .snapshot
        .ok_or_else(|| Status::internal("CreateSnapshot answered no snapshot"))?;
    Ok(snap.snapshot_id)
}

/// How often a round that failed for a passing reason (a node away, busy
/// or slow, the call's deadline) is asked again, 2 s apart: the copy goes
/// on where it stopped.
const RETRIES: u32 = 3;

/// A call of the move, asked again as [`RETRIES`] says on a passing
/// failure (`cluster::nodes::passing`) or an expired grant, and for as
/// long as ABORTED says the copy still runs: the copy goes on where it
/// stopped.
async fn with_retries<T, F, Fut>(
    c: &Ctx,
    label: &str,
    detail: &std::sync::Mutex<String>,
    call: F,
) -> std::result::Result<T, Status>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
{
    let mut tries = 0;
    loop {
        match c.progress.run_with(label, detail, call()).await {
            Ok(r) => return Ok(r.into_inner()),
            // The copy still runs (a call before this one was cut, and its
            // work goes on on the node): asked again until it ends, bounded
            // by --timeout.
            Err(e) if e.code() == tonic::Code::Aborted => {
                eprintln!("{label}: {}; asking again in 5 s", e.message());
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
            // A passing failure, or a grant that expired meanwhile (a new
            // call gets a new one).
            Err(e)
                if tries < RETRIES
                    && (thinpool_csi::cluster::nodes::passing(&e)
                        || e.code() == tonic::Code::PermissionDenied) =>
            {
                tries += 1;
                eprintln!("{label}: {} ({:?}); asking again", e.message(), e.code());
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `call`, with the copy's progress (its condition, asked of the
/// controller every second) kept in `detail` for the spinner.
async fn watching<T>(
    ctl: &mut csi::controller_client::ControllerClient<tonic::transport::Channel>,
    copy_id: &str,
    detail: &std::sync::Mutex<String>,
    call: impl std::future::Future<Output = T>,
) -> T {
    let watch = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let asked = ctl
                .controller_get_volume(csi::ControllerGetVolumeRequest {
                    volume_id: copy_id.to_string(),
                })
                .await;
            let said = asked
                .ok()
                .and_then(|r| r.into_inner().status)
                .and_then(|s| s.volume_condition)
                .map(|v| v.message)
                .unwrap_or_default();
            *detail.lock().unwrap() = said;
        }
    };
    tokio::select! {
        out = call => out,
        never = watch => never,
    }
}

/// Deletes a snapshot the move took; a failure is said, not fatal (the
/// snapshot stays listed, for its user to delete).
async fn forget(
    ctl: &mut thinpool_csi::proto::csi::v1::controller_client::ControllerClient<
        tonic::transport::Channel,
    >,
    id: &str,
) {
    let r = ctl
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: id.to_string(),
            ..Default::default()
        })
        .await;
    if let Err(e) = r {
        eprintln!(
            "warning: could not delete the move's snapshot {id}: {}",
            e.message()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tpcsi move` parsed with `extra`, as main would get it.
    fn move_args(extra: &[&str]) -> MoveArgs {
        use clap::Parser;
        let base = [
            "tpcsi", "move", "v", "--to", "node-3", "--name", "pv-new", "--final",
        ];
        let cli = crate::args::Cli::try_parse_from([&base[..], extra].concat()).unwrap();
        match cli.command {
            crate::args::Command::Move(m) => m,
            _ => panic!("not move"),
        }
    }

    #[test]
    fn manifest_inputs_are_checked_before_anything_moves() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("moved.yaml");
        let file = file.to_str().unwrap();
        let with = |claim: &str, class: &str, path: &str, more: &[&str]| {
            let m = [
                &[
                    "--manifest",
                    path,
                    "--claim",
                    claim,
                    "--storage-class",
                    class,
                ][..],
                more,
            ]
            .concat();
            let a = move_args(&m);
            manifest_inputs(a.manifest.as_deref().unwrap(), &a).map(drop)
        };
        with("apps/data", "thinpool-csi", file, &[]).unwrap();
        with(
            "apps/data",
            "thinpool-csi",
            file,
            &[
                "--node-stage-secret",
                "apps/key",
                "--mount-option",
                "noatime",
            ],
        )
        .unwrap();
        for (claim, class, path, more, why) in [
            (
                "apps/Data",
                "thinpool-csi",
                file,
                &[][..],
                "no Kubernetes name",
            ),
            ("apps/data", "Fast", file, &[], "no Kubernetes name"),
            ("apps/data", "thinpool-csi", "-", &[], "give a file"),
            (
                "apps/data",
                "thinpool-csi",
                "/nonexistent/dir/m.yaml",
                &[],
                "is no directory",
            ),
            (
                "apps/data",
                "thinpool-csi",
                file,
                &["--node-stage-secret", "key"],
                "NAMESPACE/NAME",
            ),
        ] {
            let e = with(claim, class, path, more).unwrap_err();
            assert!(e.contains(why), "{claim} {class} {path} {more:?}: {e}");
        }
    }

    #[test]
    fn the_new_volume_is_of_the_old_one_s_class_unless_told() {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            with_class(
                &naming::with_node(&naming::node_key("node-1"), "fast.csi-x"),
                &[p("encrypted", "true")]
            ),
            vec![p("encrypted", "true"), p("deviceClass", "fast")]
        );
        assert_eq!(
            with_class("fast.csi-x", &[p("deviceClass", "slow")]),
            vec![p("deviceClass", "slow")]
        );
        assert_eq!(with_class("csi-x", &[]), vec![]);
    }

    #[test]
    fn printed_parameters_read_back_as_given() {
        assert_eq!(quoted("fsOptions=noatime"), "fsOptions=noatime");
        assert_eq!(quoted("mkfsOptions=-E a b"), "'mkfsOptions=-E a b'");
        assert_eq!(quoted("k=it's"), "'k=it'\\''s'");
    }
}
