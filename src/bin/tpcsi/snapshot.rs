//! Snapshot commands: create, list, delete.

use std::collections::HashMap;

use thinpool_csi::proto::csi::v1 as csi;
use tonic::Status;

use crate::args::SnapshotCommand;
use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::{Done, SnapshotList, SnapshotOut};
use crate::pages::all_pages;

pub async fn snapshot(c: &mut Ctx, s: SnapshotCommand) -> Result<()> {
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
        SnapshotCommand::List { volume, id, filter } => {
            let nodes = crate::capacity::before_listing(c, filter.class.as_deref()).await?;
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
            c.show(&SnapshotList::new(snapshots, filter.class, nodes.as_ref()));
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
