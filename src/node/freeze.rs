//! Freezes of filesystem volumes: FIFREEZE / FITHAW on a mount checked to
//! be of its device, and the freeze records that let a driver killed while
//! filesystems were frozen thaw them when it starts again.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::mountinfo::MountInfo;
use crate::node::mount_table;
use crate::sys;

/// A mount point and the block device whose filesystem must be the one
/// mounted there: what is done through the path (freeze, thaw, grow) is
/// done only if, once opened, it is the root of a mount of that device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountOf {
    pub path: PathBuf,
    /// (major, minor).
    pub device: (u32, u32),
}

/// Where the filesystem of device `dev` is mounted on this node (its
/// staging mount), if anywhere.
pub fn mounted_at(dev: (u32, u32)) -> Result<Option<MountOf>> {
    Ok(mount_table()?
        .mounts_of_device(dev.0, dev.1)
        .first()
        .map(|m| MountOf {
            path: m.mount_point.clone(),
            device: dev,
        }))
}

/// Freezes the filesystem of `at.device` at `at.path` (FIFREEZE).
pub fn freeze(at: &MountOf) -> Result<()> {
    Ok(sys::freeze::freeze(&at.path, at.device)?)
}

/// Freezes every mount point, after writing them (with their devices)
/// durably to `record`, so a driver killed while they are frozen thaws
/// them when it starts again ([`thaw_left_frozen`]). On failure, thaws
/// what it froze.
pub fn freeze_recorded(record: &Path, points: &[MountOf]) -> Result<()> {
    let json = serde_json::to_vec(points)
        .map_err(|e| Error::Internal(format!("encode the frozen mount points: {e}")))?;
    crate::node::durable::write_atomic(record, &json)?;
    for (i, p) in points.iter().enumerate() {
        if let Err(e) = freeze(p) {
            thaw_recorded(record, &points[..i]);
            return Err(e);
        }
    }
    Ok(())
}

/// Thaws every mount point (one not frozen is fine), then drops `record`
/// if every thaw worked; a record left behind is tried again at start-up.
pub fn thaw_recorded(record: &Path, points: &[MountOf]) {
    let mut all = true;
    for p in points {
        if let Err(e) = thaw(p) {
            all = false;
            tracing::error!(mountpoint = %p.path.display(), error = %e, "could not thaw a filesystem");
        }
    }
    if !all {
        return;
    }
    if let Err(e) = crate::node::durable::remove(record) {
        tracing::error!(record = %record.display(), error = %e, "could not remove a freeze record");
    }
}

/// One entry of a freeze record: a mount point with its device, or (as
/// versions before the device was recorded wrote them) a bare path.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Recorded {
    At(MountOf),
    Path(PathBuf),
}

impl Recorded {
    /// Where to thaw: the recorded path if it is still a mount of the
    /// recorded device (a bare path: of the device mounted there now).
    /// After a reboot a recorded path is a plain directory again, or
    /// another filesystem's: a thaw there would reach the wrong one.
    fn still_mounted(self, table: &MountInfo) -> Result<MountOf, PathBuf> {
        let (path, want) = match self {
            Recorded::At(m) => (m.path, Some(m.device)),
            Recorded::Path(p) => (p, None),
        };
        match table.top_mount_at(&path).map(|m| m.device()) {
            Some(device) if want.is_none_or(|w| w == device) => Ok(MountOf { path, device }),
            _ => Err(path),
        }
    }
}

/// Start-up: thaws what the freeze records in `dir` name (a driver killed
/// while filesystems were frozen for it) and removes the records. Returns
/// the mount points it went through.
pub fn thaw_left_frozen(dir: &Path) -> Result<Vec<MountOf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("read {}", dir.display()), e)),
    };
    let mut all = Vec::new();
    for record in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let points: Vec<Recorded> = match std::fs::read(&record)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(record = %record.display(), error = %e, "unreadable freeze record; left for an admin");
                continue;
            }
        };
        let table = mount_table()?;
        let (mounted, gone): (Vec<_>, Vec<_>) = points
            .into_iter()
            .map(|p| p.still_mounted(&table))
            .partition(|r| r.is_ok());
        let mounted: Vec<MountOf> = mounted.into_iter().filter_map(|r| r.ok()).collect();
        let gone: Vec<PathBuf> = gone.into_iter().filter_map(|r| r.err()).collect();
        tracing::warn!(record = %record.display(), ?mounted, not_mounted = ?gone,
            "start-up: thawing filesystems a killed driver froze");
        thaw_recorded(&record, &mounted);
        all.extend(mounted);
    }
    Ok(all)
}

/// Whether LVM's own freeze of a snapshot origin nests inside a FIFREEZE
/// we hold (Linux 6.8 and later).
pub fn freezes_nest() -> bool {
    sys::freeze::kernel_freeze_nests()
}

/// Thaws the filesystem of `at.device` at `at.path` (FITHAW); whether it
/// was frozen.
pub fn thaw(at: &MountOf) -> Result<bool> {
    Ok(sys::freeze::thaw(&at.path, at.device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freeze records name each mount point with its device; records of
    /// versions that wrote bare paths are still read.
    #[test]
    fn freeze_records_keep_the_device_and_read_bare_paths() {
        let at = MountOf {
            path: "/k/a".into(),
            device: (253, 4),
        };
        let json = serde_json::to_string(&[&at]).unwrap();
        assert_eq!(json, r#"[{"path":"/k/a","device":[253,4]}]"#);
        let read: Vec<Recorded> = serde_json::from_str(&json).unwrap();
        assert!(matches!(&read[..], [Recorded::At(m)] if *m == at));
        let old: Vec<Recorded> = serde_json::from_str(r#"["/k/b"]"#).unwrap();
        assert!(matches!(&old[..], [Recorded::Path(p)] if p == Path::new("/k/b")));

        // Thawed only where the recorded device is still mounted; a bare
        // path takes the device mounted there now.
        let table = MountInfo::parse(
            "30 1 253:4 / /k/a rw - xfs /dev/dm-4 rw\n\
             31 1 7:3 / /k/b rw - ext4 /dev/loop3 rw\n",
        )
        .unwrap();
        let at_a = |device| {
            Recorded::At(MountOf {
                path: "/k/a".into(),
                device,
            })
        };
        assert_eq!(at_a((253, 4)).still_mounted(&table), Ok(at.clone()));
        assert_eq!(
            at_a((253, 5)).still_mounted(&table),
            Err(PathBuf::from("/k/a"))
        );
        assert_eq!(
            Recorded::Path("/k/b".into()).still_mounted(&table),
            Ok(MountOf {
                path: "/k/b".into(),
                device: (7, 3)
            })
        );
        assert_eq!(
            Recorded::Path("/k/c".into()).still_mounted(&table),
            Err(PathBuf::from("/k/c"))
        );
    }
}
