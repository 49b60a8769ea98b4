//! ReclaimSpace: give blocks that hold no data back to the thin pool, with
//! the volume's usage (`lv_size × data_percent` from a fresh `lvs`) before
//! and after.
//!
//! ControllerReclaimSpace runs as a detached operation holding the volume's
//! guard until the scan has ended, so no publish can reach the volume while
//! the scan may still discard. When its caller goes away the scan stops at
//! its next step and discards nothing more; it is bounded by
//! `reclaim_timeout_secs` as well.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Cancel, VolumeId};
use crate::error::{Error, Result};
use crate::lvm::report::round_up;
use crate::naming::Access;
use crate::node::reclaim::{self, Stop};
use crate::volume::Volumes;

/// Pool usage of a volume before and after a reclaim, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    pub pre: u64,
    pub post: u64,
}

impl Volumes {
    /// Bytes the volume has allocated in the pool (size × Data%), from a
    /// fresh `lvs` report.
    pub async fn usage(&self, id: &str) -> Result<u64> {
        let report = self.lvm.fresh_report().await?;
        let vol = self.must_own(&report, id)?;
        vol.lv.allocated_bytes().ok_or_else(|| {
            Error::Internal(format!("lvs reports no Data% for {}", self.lvm.lv_path(id)))
        })
    }

    fn reclaim_stop(&self, cancel: &Cancel) -> Stop {
        Stop::new(cancel.flag(), self.cfg.reclaim_timeout())
    }

    /// NodeReclaimSpace: FITRIM of the volume's mounted filesystem, found
    /// from the mount table by the LV's device numbers (the request's
    /// paths are not trusted).
    pub async fn node_reclaim(self: &Arc<Self>, id: VolumeId) -> Result<Reclaimed> {
        self.detached(&id.clone(), "NodeReclaimSpace", move |d, cancel| async move {
            let report = d.lvm.fresh_report().await?;
            let vol = d.must_own(&report, &id)?;
            let not_staged = || {
                Error::FailedPrecondition(format!(
                    "volume {id} is not active on this node, so nothing is staged to trim"
                ))
                .advise("use ControllerReclaimSpace for a volume nobody uses")
            };
            let Some(lv_numbers) = vol.lv.kernel else {
                return Err(not_staged());
            };
            let access = vol.tags.access.clone();
            let pre = vol.lv.allocated_bytes().unwrap_or(0);
            // An encrypted volume's filesystem is on its crypt mapping,
            // which passes discards on only where its class allows them.
            let (major, minor) = match vol.tags.encrypted {
                false => lv_numbers,
                true => {
                    let mapped = d.data_device(&id, true).await?.ok_or_else(not_staged)?;
                    let n = mapped.numbers();
                    let passes = d
                        .tools
                        .blocking("read the mapping's discard limit", move || {
                            Ok(crate::node::dm::passes_discards(n))
                        })
                        .await?;
                    if !passes {
                        return d.nothing_reclaimed(&id, pre, "its crypt mapping passes no discards (encryption.allow_discards is off)").await;
                    }
                    n
                }
            };
            let size = vol.lv.size;
            let stop = d.reclaim_stop(&cancel);
            let trimmed = crate::blocking::run(
                "NodeReclaimSpace trim",
                d.cfg.reclaim_timeout() + d.cfg.command_timeout(),
                move || {
                    let Some((mountpoint, fs)) = reclaim::fs_mount_of(major, minor)? else {
                        return Err(match access {
                            Some(Access::Block) => Error::Unimplemented(format!(
                                "volume {id} is a raw block volume in use: a whole-device discard would destroy live data"
                            ))
                            .advise("reclaim it with ControllerReclaimSpace while nothing uses it"),
                            _ => Error::FailedPrecondition(format!(
                                "volume {id} is active but its filesystem is not mounted on this node"
                            )),
                        });
                    };
                    reclaim::trim_filesystem(&mountpoint, (major, minor), &fs, size, &stop)
                },
            )
            .await?;
            let post = d.usage(&vol.lv.name).await?;
            tracing::info!(id = vol.lv.name, pre, post, trimmed, "NodeReclaimSpace: trimmed");
            d.metrics.reclaimed(pre, post);
            Ok(Reclaimed { pre, post })
        })
        .await
    }

    /// ControllerReclaimSpace on a volume nothing has open: an unstaged
    /// filesystem is mounted privately under `state_dir` and trimmed; an
    /// unused block volume has only its all-zero runs discarded. The LV's
    /// activation state is restored. A volume in use is left alone and
    /// answered with its usage as both figures.
    pub async fn controller_reclaim(self: &Arc<Self>, id: VolumeId) -> Result<Reclaimed> {
        self.detached(&id.clone(), "ControllerReclaimSpace", move |d, cancel| async move {
            let report = d.lvm.fresh_report().await?;
            let vol = d.must_own(&report, &id)?;
            // A volume in use is the node's to trim: the csi-addons
            // controller (reclaimspacejob_controller.go at v0.14.0) makes
            // this call right after NodeReclaimSpace and fails the whole
            // job on any error, so it is answered OK with nothing done
            // and the usage as it stands (nothing reclaimed here).
            let staged = d.load_record(&id).await?.is_some();
            if staged || vol.lv.is_open() {
                let used = vol.lv.allocated_bytes().unwrap_or(0);
                let why = match staged {
                    true => "it is staged on this node (NodeReclaimSpace trims it)",
                    false => "its device is open on this node",
                };
                tracing::info!(%id, used, why, "ControllerReclaimSpace: in use, nothing done");
                return Ok(Reclaimed { pre: used, post: used });
            }
            let access = vol.tags.access.clone();
            let encrypted = vol.tags.encrypted;
            let pool_chunk = d.pool(&report)?.chunk_size.max(512);
            let was_active = vol.lv.is_active();
            // An LV that was active already has its usage in this report;
            // an inactive one shows no Data% until it is activated (an
            // encrypted one too: activating the LV opens no mapping).
            let known_pre = vol.lv.allocated_bytes().filter(|_| was_active);
            if !was_active {
                d.lvm.activate(&id).await?;
            }
            let res = d
                .reclaim_unused(&id, access, encrypted, pool_chunk, known_pre, &cancel)
                .await;
            if !was_active {
                if let Err(e) = d.lvm.deactivate(&id).await {
                    tracing::warn!(%id, error = %e, "ControllerReclaimSpace: could not deactivate again");
                }
            }
            res
        })
        .await
    }

    /// The reclaim itself, on an active LV nothing else uses; none for an
    /// encrypted volume, which the controller holds no key to mount.
    async fn reclaim_unused(
        &self,
        id: &VolumeId,
        access: Option<Access>,
        encrypted: bool,
        chunk: u64,
        known_pre: Option<u64>,
        cancel: &Cancel,
    ) -> Result<Reclaimed> {
        let dev = PathBuf::from(self.lvm.dev_path(id));
        let pre = match known_pre {
            Some(p) => p,
            None => self.usage(id).await?,
        };
        if encrypted {
            let why = "it is encrypted and the controller holds no key to mount it";
            return self.nothing_reclaimed(id, pre, why).await;
        }
        let stop = self.reclaim_stop(cancel);
        let bound = self.cfg.reclaim_timeout() + self.cfg.command_timeout();
        match access {
            Some(Access::Mount { fs_type }) => {
                let dir = self.private_mount_dir(id);
                let trimmed =
                    crate::blocking::run("ControllerReclaimSpace trim", bound, move || {
                        reclaim::trim_unmounted(&dev, &fs_type, &dir, &stop)
                    })
                    .await?;
                tracing::info!(%id, trimmed, "ControllerReclaimSpace: trimmed unmounted filesystem");
            }
            Some(Access::Block) => {
                let run = round_up(self.cfg.reclaim_zero_run.max(chunk), chunk).unwrap_or(chunk);
                let discarded = crate::blocking::run(
                    "ControllerReclaimSpace zero-run scan",
                    bound,
                    move || reclaim::discard_zero_runs(&dev, run, &stop),
                )
                .await?;
                tracing::info!(%id, run, discarded, "ControllerReclaimSpace: discarded zero runs");
            }
            None => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} carries no access type tag; refusing to guess how to reclaim it"
                ))
                .advise("reclaim it with NodeReclaimSpace while it is staged on this node"))
            }
        }
        let post = self.usage(id).await?;
        self.metrics.reclaimed(pre, post);
        Ok(Reclaimed { pre, post })
    }

    /// A reclaim that trims nothing, and says why: usage before, and after
    /// read again (the volume's own writes may have changed it).
    async fn nothing_reclaimed(&self, id: &str, pre: u64, why: &str) -> Result<Reclaimed> {
        let post = self.usage(id).await?;
        tracing::info!(id, pre, post, why, "ReclaimSpace: nothing trimmed");
        Ok(Reclaimed { pre, post })
    }

    /// Where ControllerReclaimSpace mounts a filesystem privately.
    pub fn private_mount_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("reclaim").join(id)
    }
}
