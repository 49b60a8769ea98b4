//! Raw block volumes.
//!
//! **Staging** makes no filesystem: the volume layer has activated the LV,
//! made sure its /dev node exists and written the node record
//! (`node::record`), which is what says the volume is staged here and
//! which publishes were made (block publishes are device nodes, which the
//! mount table does not show).
//!
//! **Publish** places a device node at target_path (a file; the CO makes
//! only its parent directory): the LV's own major:minor, mode 0600, for
//! read-write, or a read-only device-mapper overlay of it, mode 0400, for
//! read-only (see [`crate::node::dm`] for why a mode or a read-only bind
//! mount would not stop writes). Device numbers change across reboots and
//! re-activations, so a node at a target the record names is ours whatever
//! numbers it carries: a stale one is replaced with the current numbers,
//! and never opened.

use std::path::Path;

use crate::error::{Error, Result};
use crate::node::record::Publish as Published;
use crate::node::{dm, left_alone, mount_table, mounts, paths, Device, Tools};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::sys;

/// What a block device node found at a target path points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// The LV itself: a read-write publish of ours.
    Lv,
    /// One of our read-only overlays of the LV (its dm name).
    Overlay(String),
    /// No device has these numbers any more (e.g. after a reboot or an
    /// overlay removed earlier): the node leads nowhere.
    Dangling,
    /// Some other live device: not ours.
    Foreign,
}

/// Classifies a node with numbers `node`, given the LV's numbers when it
/// is active.
pub fn classify(node: (u32, u32), lv: Option<(u32, u32)>) -> NodeKind {
    if Some(node) == lv {
        return NodeKind::Lv;
    }
    if let Some(name) = lv.and_then(|lv| dm::overlay_on(node, lv)) {
        return NodeKind::Overlay(name);
    }
    if dm::device_exists(node.0, node.1) {
        NodeKind::Foreign
    } else {
        NodeKind::Dangling
    }
}

/// The numbers of the block node at `path`, `None` when there is no block
/// node (missing, or another kind of file).
fn node_at(path: &Path) -> Result<Option<(u32, u32)>> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_block_device() => Ok(sys::device_numbers(path)?),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("stat {}", path.display()), e)),
    }
}

/// NodeStageVolume for block access: the staging directory exists and is
/// not a mount (the record, written by the volume layer, says the rest).
pub fn stage(dev: &Device, staging: &Path, roots: &[std::path::PathBuf]) -> Result<()> {
    let info = mount_table()?;
    if let Some(m) = info.top_mount_at(staging) {
        return Err(if m.device() == dev.numbers() {
            Error::AlreadyExists(format!(
                "volume {} is already staged at {} as a {} filesystem, not as a raw block device",
                dev.volume_id,
                staging.display(),
                m.fs_type
            ))
        } else {
            left_alone(format!(
                "staging path {} is a mount of another device ({}:{})",
                staging.display(),
                m.major,
                m.minor
            ))
        });
    }
    mounts::ensure_dir(staging, roots)?;
    tracing::info!(volume = dev.volume_id, staging = %staging.display(), "NodeStageVolume: staged (block)");
    Ok(())
}

/// NodeUnstageVolume for block access: removes the read-only overlays of
/// the LV (every publish is gone by now).
pub async fn unstage(tools: &Tools, dev: Option<&Device>) -> Result<()> {
    if let Some(dev) = dev {
        let lv = dev.numbers();
        let overlays = tools
            .blocking("list overlays", move || Ok(dm::overlays_of(lv)))
            .await?;
        for (name, _) in overlays {
            dm::remove_overlay(tools, &name).await?;
        }
    }
    Ok(())
}

/// What is at a block publish target already.
enum AtTarget {
    /// A node of ours for this publish: nothing to do.
    Published,
    /// Nothing (any more): make the node.
    Free,
}

/// The blocking part of [`publish`]: looks at the target, and removes a
/// node there that leads nowhere or is ours by the record but stale.
fn inspect_target(
    volume_id: &str,
    lv: (u32, u32),
    target: &Path,
    readonly: bool,
    recorded: bool,
    roots: &[std::path::PathBuf],
) -> Result<AtTarget> {
    if mount_table()?.is_mount_point(target) {
        return Err(left_alone(format!(
            "target {} is a mount point",
            target.display()
        )));
    }
    let Some(n) = node_at(target)? else {
        if std::fs::symlink_metadata(target).is_ok() {
            return Err(left_alone(format!(
                "target {} exists and is not a device node (published as a filesystem?)",
                target.display()
            )));
        }
        return Ok(AtTarget::Free);
    };
    let kind = classify(n, Some(lv));
    // What this publish itself would have made: the LV for read-write, its
    // own overlay (named after the target) for read-only.
    let as_wanted = match &kind {
        NodeKind::Lv => !readonly,
        NodeKind::Overlay(name) => readonly && *name == dm::overlay_name(volume_id, target),
        _ => false,
    };
    match kind {
        NodeKind::Lv | NodeKind::Overlay(_) if as_wanted => {
            tracing::info!(volume = volume_id, target = %target.display(), "NodePublishVolume: already published (block)");
            Ok(AtTarget::Published)
        }
        NodeKind::Lv | NodeKind::Overlay(_) | NodeKind::Foreign if recorded => {
            // Ours by the record, but its numbers are old (a reboot, a
            // re-activation) and now name another device, possibly this
            // LV or an overlay of another publish: never opened, replaced.
            remove_node(target, roots)?;
            tracing::warn!(volume = volume_id, target = %target.display(), stale = ?n, current = ?lv,
                "removed a stale device node of ours that carried old device numbers");
            Ok(AtTarget::Free)
        }
        NodeKind::Lv | NodeKind::Overlay(_) => Err(Error::AlreadyExists(format!(
            "volume {volume_id} is already published at {} with readonly={}",
            target.display(),
            !readonly
        ))
        .advise("publish it there with the first call's readonly, use another target_path, or NodeUnpublishVolume it first")),
        NodeKind::Dangling => {
            remove_node(target, roots)?;
            tracing::info!(target = %target.display(), "removed a stale device node that led to no device");
            Ok(AtTarget::Free)
        }
        NodeKind::Foreign => Err(left_alone(format!(
            "target {} is a device node of another device ({}:{})",
            target.display(),
            n.0,
            n.1
        ))),
    }
}

/// NodePublishVolume for block access; see the module documentation.
/// `others` are the other publishes the record holds; `recorded` says the
/// record already names this target (a node there is ours).
pub async fn publish(
    tools: &Tools,
    dev: &Device,
    target: &Path,
    mode: Mode,
    readonly: bool,
    others: &[Published],
    recorded: bool,
) -> Result<()> {
    let lv = dev.numbers();
    let (v, t, roots) = (
        dev.volume_id.clone(),
        target.to_path_buf(),
        tools.roots.clone(),
    );
    let at = tools
        .blocking("publish: inspect the target", move || {
            inspect_target(&v, lv, &t, readonly, recorded, &roots)
        })
        .await?;
    if let AtTarget::Published = at {
        return Ok(());
    }

    let single = Mode::SingleNodeSingleWriter.as_str_name();
    if let Some(other) = others
        .iter()
        .find(|p| p.target != target && (p.mode == single || mode.as_str_name() == single))
    {
        return Err(Error::FailedPrecondition(format!(
            "volume {} is already published at {} and one of the publishes is SINGLE_NODE_SINGLE_WRITER",
            dev.volume_id,
            other.target.display()
        ))
        .advise("NodeUnpublishVolume it there first, or publish every target with SINGLE_NODE_MULTI_WRITER"));
    }

    let (t, roots) = (target.to_path_buf(), tools.roots.clone());
    if readonly {
        let name = dm::overlay_name(&dev.volume_id, target);
        let path = dev.path.clone();
        let sectors = tools
            .blocking("read the LV's size", move || {
                Ok(sys::block_size_bytes(&path)?)
            })
            .await?
            / 512;
        let n = dm::ensure_overlay(tools, &name, lv, sectors).await?;
        let made = tools
            .blocking("make a device node", move || {
                paths::beneath(&t, &roots, |at| {
                    sys::make_block_node_beneath(at, n.0, n.1, 0o400)
                })
            })
            .await;
        if let Err(e) = made {
            let _ = dm::remove_overlay(tools, &name).await;
            return Err(e);
        }
    } else {
        tools
            .blocking("make a device node", move || {
                paths::beneath(&t, &roots, |at| {
                    sys::make_block_node_beneath(at, lv.0, lv.1, 0o600)
                })
            })
            .await?;
    }
    tracing::info!(volume = dev.volume_id, target = %target.display(), readonly, "NodePublishVolume: device node created");
    Ok(())
}

/// Removes the overlay of the read-only publish of `volume_id` at
/// `target` if one is left, with or without a table (a publish stopped
/// before it made its node leaves one that no node leads to); a leftover
/// that maps nothing of the LV `lv` and is held open goes deferred
/// ([`dm::remove_for_unpublish`]).
pub async fn drop_own_overlay(
    tools: &Tools,
    volume_id: &str,
    target: &Path,
    lv: Option<(u32, u32)>,
) -> Result<()> {
    let name = dm::overlay_name(volume_id, target);
    let n = name.clone();
    let exists = tools
        .blocking("look for a publish's overlay", move || {
            Ok(sys::dm_has_table(&n)?.is_some())
        })
        .await?;
    if exists {
        dm::remove_for_unpublish(tools, &name, lv).await?;
    }
    Ok(())
}

/// Removes the node at `target` with unlinkat beneath its allowed root.
fn remove_node(target: &Path, roots: &[std::path::PathBuf]) -> Result<()> {
    paths::beneath(target, roots, |at| sys::remove_beneath(at, false))
}

/// NodeUnpublishVolume for a block node at `target` with numbers `node`:
/// removes it when it is ours (and its overlay), refuses otherwise. A node
/// the record names (`recorded`) is ours whatever its numbers: a stale one
/// is removed, and the device its old numbers now name is not touched.
pub async fn unpublish_node(
    tools: &Tools,
    lv: Option<(u32, u32)>,
    volume_id: &str,
    target: &Path,
    node: (u32, u32),
    recorded: bool,
) -> Result<()> {
    let ours = dm::overlay_name(volume_id, target);
    let (kind, our_overlay) = {
        let ours = ours.clone();
        tools
            .blocking("unpublish: inspect the node", move || {
                Ok((classify(node, lv), sys::dm_has_table(&ours)?.is_some()))
            })
            .await?
    };
    match kind {
        NodeKind::Overlay(name) if name == ours => dm::remove_overlay(tools, &name).await?,
        NodeKind::Foreign | NodeKind::Overlay(_) if !recorded => {
            return Err(left_alone(format!(
                "target {} is a device node of another device ({}:{}), not of this publish of volume {volume_id}",
                target.display(),
                node.0,
                node.1
            )))
        }
        // The LV, a device gone, or (by the record ours, with stale
        // numbers) another device: only the node goes, with this
        // publish's own overlay if one is left.
        _ => {
            if our_overlay {
                dm::remove_for_unpublish(tools, &ours, lv).await?;
            }
        }
    }
    let (t, roots) = (target.to_path_buf(), tools.roots.clone());
    tools
        .blocking("remove a device node", move || remove_node(&t, &roots))
        .await?;
    tracing::info!(volume = volume_id, target = %target.display(), "NodeUnpublishVolume: removed device node");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_classified_by_their_numbers() {
        // The LV's own numbers are ours whatever sysfs says.
        assert_eq!(classify((253, 7), Some((253, 7))), NodeKind::Lv);
        // Numbers no block device has: the node leads nowhere.
        assert_eq!(
            classify((4095, 1048575), Some((253, 7))),
            NodeKind::Dangling
        );
        assert_eq!(classify((4095, 1048575), None), NodeKind::Dangling);
        // Any live block device of this machine that is not the LV.
        let live = std::fs::read_dir("/sys/dev/block")
            .unwrap()
            .filter_map(|e| e.ok())
            .find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let (ma, mi) = name.split_once(':')?;
                Some((ma.parse::<u32>().ok()?, mi.parse::<u32>().ok()?))
            });
        if let Some(live) = live {
            assert_eq!(classify(live, Some((4095, 0))), NodeKind::Foreign);
        }
    }
}
