//! Encrypted volumes: the LV holds LUKS2 (`node::crypt`), and what is
//! staged, published, measured, grown and trimmed on this node is its open
//! dm-crypt mapping. The driver keeps no key: each NodeStageVolume brings
//! the passphrase in its secrets, and a mapping stays open from stage to
//! unstage (the start-up heal cannot re-open a closed one; kubelet's next
//! NodeStageVolume does).
//!
//! The format guard is the filesystem's: LUKS2 is written only on an LV
//! that maps no sector of its pool, or under the volume's formatting
//! marker (a format this driver began and did not finish), and the marker
//! stays until the filesystem inside is made, so an interrupted first
//! stage is redone whole. An LV that holds data but no LUKS header is
//! refused and left alone.

use std::path::Path;
use std::sync::Arc;

use super::{Owned, VolumeId};
use crate::error::{Error, Result};
use crate::node::crypt::{self, Keys, Secret};
use crate::node::mounts::StageFacts;
use crate::node::{self, dm, marker, Device};
use crate::volume::Volumes;

/// INVALID_ARGUMENT: the stage of an encrypted volume carries no
/// passphrase; names the StorageClass parameter that makes Kubernetes send it.
pub fn missing_passphrase(id: &str) -> Error {
    Error::InvalidArgument(format!(
        "volume {id} is encrypted and the call's secrets have no {:?}",
        crypt::PASSPHRASE_KEY
    ))
    .advise(format!(
        "set the StorageClass parameters csi.storage.k8s.io/node-stage-secret-name and -namespace to a Secret with a {:?} key",
        crypt::PASSPHRASE_KEY
    ))
}

/// What [`Volumes::open_crypt`] did for a stage.
pub(super) struct OpenedCrypt {
    /// The open mapping.
    pub dev: Device,
    /// This call opened it (and closes it again if the stage fails).
    pub opened: bool,
    /// This call wrote LUKS2 under the formatting marker: the marker is
    /// this stage's own, and the filesystem inside is the rest of the
    /// format, not a format an earlier call left unfinished.
    pub formatted: bool,
}

impl Volumes {
    /// The open crypt mapping of volume `id` over its LV `lv`, if there
    /// is one. A device of the mapping's name that maps anything else is
    /// FAILED_PRECONDITION, left alone.
    pub async fn crypt_device(&self, id: &str, lv: &Device) -> Result<Option<Device>> {
        let name = crypt::mapping_name(id);
        let (n, lower, vid) = (name.clone(), lv.numbers(), id.to_string());
        self.tools
            .blocking("look at the crypt mapping", move || {
                let Some(numbers) = crate::sys::dm_numbers(&n)? else {
                    return Ok(None);
                };
                if !dm::stacked_on(numbers, lower) {
                    return Err(Error::FailedPrecondition(format!(
                        "device-mapper device {n} exists but does not map volume {vid}'s LV; it is left alone"
                    ))
                    .advise(format!("remove it (dmsetup remove {n}) if nothing uses it, then retry")));
                }
                node::ensure_dev_node(&vid, &crypt::mapping_path(&n), numbers).map(Some)
            })
            .await
    }

    /// The device that carries the volume's data on this node: for an
    /// encrypted volume its open mapping (`None` while it is closed), else
    /// its LV while active (no look for a mapping it cannot have).
    pub async fn data_device(&self, id: &str, encrypted: bool) -> Result<Option<Device>> {
        let Some(lv) = self.live_device(id).await? else {
            return Ok(None);
        };
        match encrypted {
            true => self.crypt_device(id, &lv).await,
            false => Ok(Some(lv)),
        }
    }

    /// Opens the encrypted volume `vol` on its active LV `lv` for a stage,
    /// writing LUKS2 first when the LV is blank (or a format of ours did
    /// not finish). `block`: nothing is formatted inside, so the formatting
    /// marker goes once LUKS2 is written; a filesystem stage removes it
    /// after mkfs, and is told by [`OpenedCrypt::formatted`] that the
    /// marker it finds is this stage's own.
    pub(super) async fn open_crypt(
        &self,
        vol: &Owned<'_>,
        lv: &Device,
        keys: &Keys,
        facts: &StageFacts,
        block: bool,
    ) -> Result<OpenedCrypt> {
        let id = vol.lv.name.as_str();
        let name = crypt::mapping_name(id);
        let marker_path = self.formatting_marker(id);
        let m = marker_path.clone();
        let unfinished = self
            .tools
            .blocking("read the formatting marker", move || marker::exists(&m))
            .await?;
        // A device of this name left without a table (a cryptsetup killed
        // half-way) would stop every open.
        crypt::remove_stale(&self.tools, &name).await?;
        if let Some(open) = self.crypt_device(id, lv).await? {
            if !unfinished {
                // Open already (a retry, or a restart since): the key must
                // still open it, as it must for a closed one.
                if !self.any_key_opens(&lv.path, keys).await? {
                    return Err(crypt::refused(&lv.path.display().to_string()));
                }
                return Ok(OpenedCrypt {
                    dev: open,
                    opened: false,
                    formatted: false,
                });
            }
            // A first stage that stopped before its filesystem was made:
            // done again from the start.
            crypt::close(&self.tools, &name).await?;
        }
        let mapped = dm::thin_mapped_sectors(&self.tools, lv.major, lv.minor).await?;
        let fresh = mapped == 0 || unfinished;
        if unfinished {
            // Found before this call wrote anything: an earlier stage was
            // cut inside its format (LUKS2 or the filesystem inside).
            tracing::warn!(volume = id, marker = %marker_path.display(), "{}", marker::UNFINISHED);
        }
        if fresh {
            if let Some(problem) = &facts.problem {
                return Err(Error::ResourceExhausted(format!(
                    "cannot format encrypted volume {id}: {}",
                    problem.what
                ))
                .advise(format!("{}, then stage the volume again", problem.remedy)));
            }
            let (m, v) = (marker_path.clone(), id.to_string());
            self.tools
                .blocking("write the formatting marker", move || marker::write(&m, &v))
                .await?;
            crypt::format(&self.tools, &self.cfg.encryption, &lv.path, &keys.current).await?;
        } else if !crypt::is_luks(&self.tools, &lv.path).await? {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is marked encrypted, but its LV holds {} bytes of data and no LUKS header; it is neither formatted nor opened",
                mapped * 512
            ))
            .advise("restore the LUKS header from a backup (cryptsetup luksHeaderRestore), or recreate the volume"));
        }
        crypt::open(
            &self.tools,
            &lv.path,
            &name,
            keys,
            self.cfg.encryption.allow_discards,
        )
        .await?;
        let opened = async {
            let dev = self.crypt_device(id, lv).await?.ok_or_else(|| {
                Error::Internal(format!(
                    "cryptsetup opened {name}, but device-mapper has no such device"
                ))
            })?;
            if fresh && block {
                let m = marker_path;
                self.tools
                    .blocking("remove the formatting marker", move || marker::remove(&m))
                    .await?;
            }
            Ok(dev)
        }
        .await;
        match opened {
            Ok(dev) => Ok(OpenedCrypt {
                dev,
                opened: true,
                formatted: fresh,
            }),
            Err(e) => {
                // Opened here: closed again, so the stage leaves nothing.
                if let Err(c) = crypt::close(&self.tools, &name).await {
                    tracing::warn!(id, error = %c, "could not close the crypt mapping again");
                }
                Err(e)
            }
        }
    }

    async fn any_key_opens(&self, dev: &Path, keys: &Keys) -> Result<bool> {
        for key in keys.each() {
            if crypt::opens(&self.tools, dev, key).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Closes the crypt mapping of `id`, if open (after its unmount).
    pub(super) async fn close_crypt(&self, id: &str) -> Result<()> {
        crypt::close(&self.tools, &crypt::mapping_name(id)).await
    }

    /// CSI-Addons EncryptionKeyRotate: `new` becomes the volume's only
    /// passphrase. Its key slot is added (authorised by `current`) before
    /// any other is wiped, so a kill at any point leaves a volume that
    /// opens with one of the two; a retry finishes what is left, and wipes
    /// every slot `new` does not open (one an interrupted earlier rotation
    /// added as well). The volume key stays, so snapshots and clones made
    /// before keep the passphrases they had. An inactive LV is activated
    /// for it and deactivated again.
    pub async fn rotate_key(
        self: &Arc<Self>,
        id: VolumeId,
        current: Secret,
        new: Secret,
    ) -> Result<()> {
        self.detached(&id.clone(), "EncryptionKeyRotate", move |d, _| async move {
            let report = d.lvm.known().await?;
            let vol = d.must_own(&report, &id)?;
            if !vol.tags.encrypted {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is not encrypted: it has no key to rotate"
                ))
                .advise("rotate keys only of volumes made with encrypted: \"true\" (or an encrypting class)"));
            }
            let (lv, activated) = d.activate(vol.lv).await?;
            let res = d.rotate_on(&id, &lv, &current, &new).await;
            if activated {
                d.deactivate_if_unused(&lv).await;
            }
            res
        })
        .await
    }

    async fn rotate_on(&self, id: &str, lv: &Device, current: &Secret, new: &Secret) -> Result<()> {
        if !crypt::is_luks(&self.tools, &lv.path).await? {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} has no LUKS header yet: it was never staged"
            ))
            .advise("stage it first: its first NodeStageVolume formats it with the passphrase that stage brings"));
        }
        if crypt::opens(&self.tools, &lv.path, new).await? {
            // Added by an earlier call that stopped before the wipe.
            tracing::info!(id, "EncryptionKeyRotate: the new key is in place already");
        } else {
            crypt::add_key(&self.tools, &self.cfg.encryption, &lv.path, current, new).await?;
        }
        let mut wiped = Vec::new();
        for slot in crypt::key_slots(&self.tools, &lv.path).await? {
            if !crypt::opens_slot(&self.tools, &lv.path, new, slot).await? {
                crypt::kill_slot(&self.tools, &lv.path, slot, new).await?;
                wiped.push(slot);
            }
        }
        tracing::info!(id, ?wiped, "EncryptionKeyRotate: rotated");
        Ok(())
    }
}
