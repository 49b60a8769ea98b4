//! Raw block volumes.
//!
//! **Staging** makes no filesystem. The gRPC layer has already activated
//! the LV and made sure its /dev node exists; staging itself only writes a
//! small record, [`RECORD`], into the staging directory: the volume id and
//! the publishes made from it (target, access mode, read-only). Publish
//! needs it to know the volume is staged here, to tell a repeated publish
//! from a conflicting one, and to enforce SINGLE_NODE_SINGLE_WRITER: block
//! publishes are device nodes, which the mount table does not show.
//! NodeUnpublishVolume is not told the staging path, so it cannot update
//! the record; instead every entry is checked against what really is at
//! its target, and entries whose node is gone count for nothing.
//!
//! **Publish** places a device node at target_path (a file; the CO makes
//! only its parent directory): the LV's own major:minor, mode 0600, for
//! read-write, or a read-only device-mapper overlay of it, mode 0400, for
//! read-only (see [`crate::node::dm`] for why a mode or a read-only bind
//! mount would not stop writes).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::node::{dm, fs, mount_table, Device, Tools};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::sys;

/// File name of the staging record inside the staging directory.
pub const RECORD: &str = "thinpool-csi-block.json";

/// What block staging remembers; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub volume_id: String,
    #[serde(default)]
    pub publishes: Vec<Published>,
}

/// One block publish made from a staging record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub target: PathBuf,
    /// The access mode's CSI name, e.g. `SINGLE_NODE_WRITER`.
    pub mode: String,
    pub readonly: bool,
}

/// Reads the staging record in `staging`, if there is one.
pub fn read_record(staging: &Path) -> Result<Option<Record>> {
    let path = staging.join(RECORD);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        Error::FailedPrecondition(format!(
            "{} is not a staging record of this driver ({e}); it is left alone",
            path.display()
        ))
    })
}

/// Writes the record atomically (temporary file, then rename).
fn write_record(staging: &Path, record: &Record) -> Result<()> {
    let path = staging.join(RECORD);
    let tmp = staging.join(format!(".{RECORD}.tmp"));
    let text = serde_json::to_string_pretty(record)
        .map_err(|e| Error::Internal(format!("encode staging record: {e}")))?;
    std::fs::write(&tmp, text).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| Error::io(format!("rename {} to {}", tmp.display(), path.display()), e))?;
    tracing::info!(path = %path.display(), publishes = record.publishes.len(), "wrote block staging record");
    Ok(())
}

/// The error for a staging path that holds a block record when something
/// else was asked for: the same volume staged as block (ALREADY_EXISTS,
/// incompatible capability), or another volume (FAILED_PRECONDITION).
pub fn record_conflict(record: &Record, volume_id: &str, staging: &Path, wanted: &str) -> Error {
    if record.volume_id == volume_id {
        Error::AlreadyExists(format!(
            "volume {volume_id} is already staged at {} as a raw block device, not as {wanted}",
            staging.display()
        ))
    } else {
        Error::FailedPrecondition(format!(
            "staging path {} holds the staging record of another volume ({}); it is left alone",
            staging.display(),
            record.volume_id
        ))
    }
}

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

/// True when `target` still carries a publish of the LV `lv`.
fn is_live(target: &Path, lv: (u32, u32)) -> bool {
    matches!(
        node_at(target)
            .ok()
            .flatten()
            .map(|n| classify(n, Some(lv))),
        Some(NodeKind::Lv | NodeKind::Overlay(_))
    )
}

/// NodeStageVolume for block access.
pub fn stage(dev: &Device, staging: &Path) -> Result<()> {
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
            Error::FailedPrecondition(format!(
                "staging path {} is a mount of another device ({}:{}); it is left alone",
                staging.display(),
                m.major,
                m.minor
            ))
        });
    }
    fs::ensure_dir(staging)?;
    match read_record(staging)? {
        Some(r) if r.volume_id == dev.volume_id => {
            tracing::info!(volume = dev.volume_id, staging = %staging.display(), "NodeStageVolume: already staged (block)");
            Ok(())
        }
        Some(r) => Err(record_conflict(&r, &dev.volume_id, staging, "block")),
        None => {
            write_record(
                staging,
                &Record {
                    volume_id: dev.volume_id.clone(),
                    publishes: Vec::new(),
                },
            )?;
            tracing::info!(volume = dev.volume_id, staging = %staging.display(), "NodeStageVolume: staged (block)");
            Ok(())
        }
    }
}

/// NodeUnstageVolume for block access: refuses while publishes are live,
/// removes read-only overlays nobody publishes any more, then the record.
pub async fn unstage(
    tools: &Tools,
    dev: Option<&Device>,
    volume_id: &str,
    staging: &Path,
) -> Result<()> {
    let Some(record) = read_record(staging)? else {
        return Ok(());
    };
    if record.volume_id != volume_id {
        return Err(record_conflict(&record, volume_id, staging, "block"));
    }
    if let Some(dev) = dev {
        if let Some(p) = record
            .publishes
            .iter()
            .find(|p| is_live(&p.target, dev.numbers()))
        {
            return Err(Error::FailedPrecondition(format!(
                "volume {volume_id} is still published at {}: unpublish it first",
                p.target.display()
            )));
        }
        for (name, _) in dm::overlays_of(dev.numbers()) {
            dm::remove_overlay(tools, &name).await?;
        }
    }
    let path = staging.join(RECORD);
    std::fs::remove_file(&path).map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
    tracing::info!(volume = volume_id, staging = %staging.display(), "NodeUnstageVolume: removed block staging record");
    Ok(())
}

/// NodePublishVolume for block access; see the module documentation.
pub async fn publish(
    tools: &Tools,
    dev: &Device,
    staging: &Path,
    target: &Path,
    mode: Mode,
    readonly: bool,
) -> Result<()> {
    let mut record = match read_record(staging)? {
        Some(r) if r.volume_id == dev.volume_id => r,
        _ => {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is not staged as a raw block device at {}: call NodeStageVolume first",
                dev.volume_id,
                staging.display()
            )))
        }
    };
    let lv = dev.numbers();
    let wanted = Published {
        target: target.to_path_buf(),
        mode: mode.as_str_name().to_string(),
        readonly,
    };
    if mount_table()?.is_mount_point(target) {
        return Err(Error::FailedPrecondition(format!(
            "target {} is a mount point; it is left alone",
            target.display()
        )));
    }
    if let Some(n) = node_at(target)? {
        match classify(n, Some(lv)) {
            kind @ (NodeKind::Lv | NodeKind::Overlay(_)) => {
                let have_ro = matches!(kind, NodeKind::Overlay(_));
                let recorded = record.publishes.iter().find(|p| p.target == target);
                if have_ro != readonly || recorded.is_some_and(|p| p.mode != wanted.mode) {
                    return Err(Error::AlreadyExists(format!(
                        "volume {} is already published at {} with other arguments (readonly={have_ro}{})",
                        dev.volume_id,
                        target.display(),
                        recorded.map(|p| format!(", {}", p.mode)).unwrap_or_default()
                    )));
                }
                if recorded.is_none() {
                    record.publishes.push(wanted);
                    write_record(staging, &record)?;
                }
                tracing::info!(volume = dev.volume_id, target = %target.display(), "NodePublishVolume: already published (block)");
                return Ok(());
            }
            NodeKind::Dangling => {
                std::fs::remove_file(target)
                    .map_err(|e| Error::io(format!("remove {}", target.display()), e))?;
                tracing::info!(target = %target.display(), "removed a stale device node that led to no device");
            }
            NodeKind::Foreign => {
                return Err(Error::FailedPrecondition(format!(
                    "target {} is a device node of another device ({}:{}); it is left alone",
                    target.display(),
                    n.0,
                    n.1
                )))
            }
        }
    } else if std::fs::symlink_metadata(target).is_ok() {
        return Err(Error::FailedPrecondition(format!(
            "target {} exists and is not a device node (published as a filesystem?); it is left alone",
            target.display()
        )));
    }

    record.publishes.retain(|p| is_live(&p.target, lv));
    let single = Mode::SingleNodeSingleWriter.as_str_name();
    if let Some(other) = record
        .publishes
        .iter()
        .find(|p| p.target != target && (p.mode == single || wanted.mode == single))
    {
        return Err(Error::FailedPrecondition(format!(
            "volume {} is already published at {} and one of the publishes is SINGLE_NODE_SINGLE_WRITER",
            dev.volume_id,
            other.target.display()
        )));
    }

    if readonly {
        let name = dm::overlay_name(&dev.volume_id, target);
        let sectors = sys::block_size_bytes(&dev.path)? / 512;
        let n = dm::ensure_overlay(tools, &name, lv, sectors).await?;
        if let Err(e) = sys::make_block_node(target, n.0, n.1, 0o400) {
            let _ = dm::remove_overlay(tools, &name).await;
            return Err(e.into());
        }
    } else {
        sys::make_block_node(target, lv.0, lv.1, 0o600)?;
    }
    record.publishes.retain(|p| p.target != target);
    record.publishes.push(wanted);
    if let Err(e) = write_record(staging, &record) {
        tracing::warn!(error = %e, "could not record the publish; the node at the target stays valid");
    }
    tracing::info!(volume = dev.volume_id, target = %target.display(), readonly, "NodePublishVolume: device node created");
    Ok(())
}

/// NodeUnpublishVolume for a block node at `target` with numbers `node`:
/// removes it when it is ours (and its overlay), refuses otherwise.
pub async fn unpublish_node(
    tools: &Tools,
    lv: Option<(u32, u32)>,
    volume_id: &str,
    target: &Path,
    node: (u32, u32),
) -> Result<()> {
    match classify(node, lv) {
        NodeKind::Foreign => {
            return Err(Error::FailedPrecondition(format!(
                "target {} is a device node of another device ({}:{}), not of volume {volume_id}; it is left alone",
                target.display(),
                node.0,
                node.1
            )))
        }
        NodeKind::Overlay(name) => dm::remove_overlay(tools, &name).await?,
        NodeKind::Lv | NodeKind::Dangling => {}
    }
    std::fs::remove_file(target)
        .map_err(|e| Error::io(format!("remove {}", target.display()), e))?;
    tracing::info!(volume = volume_id, target = %target.display(), "NodeUnpublishVolume: removed device node");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_record(dir.path()).unwrap(), None);
        assert_eq!(read_record(&dir.path().join("missing")).unwrap(), None);
        let r = Record {
            volume_id: "csi-a".into(),
            publishes: vec![Published {
                target: "/t/1".into(),
                mode: "SINGLE_NODE_WRITER".into(),
                readonly: true,
            }],
        };
        write_record(dir.path(), &r).unwrap();
        assert_eq!(read_record(dir.path()).unwrap(), Some(r.clone()));
        assert!(matches!(
            record_conflict(&r, "csi-a", dir.path(), "ext4"),
            Error::AlreadyExists(_)
        ));
        assert!(matches!(
            record_conflict(&r, "csi-b", dir.path(), "ext4"),
            Error::FailedPrecondition(_)
        ));
        std::fs::write(dir.path().join(RECORD), "{not json").unwrap();
        assert!(matches!(
            read_record(dir.path()),
            Err(Error::FailedPrecondition(_))
        ));
    }

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
