//! The node record: one file per volume staged on this node,
//! `<state_dir>/volumes/<volume id>.json`, written atomically
//! ([`durable`]). It says what the CO asked for, so that a restarted
//! driver, the start-up heal and NodeHealer restore exactly that and
//! nothing else: the staging path with its fs type and mount flags, and
//! every publish target with its kind and read-only flag.
//!
//! Order of writes, so that a crash at any point leaves nothing a retry
//! cannot finish and nothing the heal would wrongly restore:
//! - stage and publish write the record *before* they mount or make a
//!   node, and drop what they added when they fail;
//! - unstage and unpublish mark their part of the record as going away
//!   (`unstaging`, `removing`) *before* they unmount or remove a node, and
//!   drop it once that is done; a heal finishes such a part instead of
//!   bringing back what the CO took away.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::node::durable;

/// How a volume is consumed on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A filesystem of this type, mounted at the staging path.
    Filesystem { fs_type: String },
    /// A raw block device; publishes are device nodes.
    Block,
}

/// One publish of the volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    pub target: PathBuf,
    pub readonly: bool,
    /// The access mode's CSI name, e.g. `SINGLE_NODE_WRITER`.
    pub mode: String,
    /// NodeUnpublishVolume began: the publish is being taken away, and a
    /// heal finishes that instead of restoring it.
    #[serde(default)]
    pub removing: bool,
}

/// What is staged and published of one volume on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub volume_id: String,
    /// The real (resolved) staging path.
    pub staging: PathBuf,
    pub kind: Kind,
    /// The CO's mount flags, as given.
    #[serde(default)]
    pub mount_flags: Vec<String>,
    #[serde(default)]
    pub publishes: Vec<Publish>,
    /// NodeUnstageVolume began: a heal finishes it instead of re-staging.
    #[serde(default)]
    pub unstaging: bool,
}

impl Record {
    pub fn publish(&self, target: &Path) -> Option<&Publish> {
        self.publishes.iter().find(|p| p.target == target)
    }

    /// Whether `flags` are the recorded mount flags (order and repeats
    /// do not matter).
    pub fn same_flags(&self, flags: &[String]) -> bool {
        let norm = |f: &[String]| {
            let mut v: Vec<String> = f.to_vec();
            v.sort();
            v.dedup();
            v
        };
        norm(&self.mount_flags) == norm(flags)
    }
}

/// The records of one node, under `<state_dir>/volumes`.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(state_dir: &Path) -> Records {
        Records {
            dir: state_dir.join("volumes"),
        }
    }

    fn path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(format!("{volume_id}.json"))
    }

    /// The record of a volume, if it is staged here.
    pub fn load(&self, volume_id: &str) -> Result<Option<Record>> {
        let path = self.path(volume_id);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
        };
        let r: Record = serde_json::from_slice(&text).map_err(|e| {
            Error::Internal(format!(
                "{} is not a node record ({e}); move it away to let the driver go on",
                path.display()
            ))
        })?;
        if r.volume_id != volume_id {
            return Err(Error::Internal(format!(
                "{} records volume {}, not {volume_id}",
                path.display(),
                r.volume_id
            )));
        }
        Ok(Some(r))
    }

    /// Writes the record atomically.
    pub fn save(&self, r: &Record) -> Result<()> {
        let text = serde_json::to_vec_pretty(r)
            .map_err(|e| Error::Internal(format!("encode node record: {e}")))?;
        durable::write_atomic(&self.path(&r.volume_id), &text)?;
        tracing::info!(volume = r.volume_id, staging = %r.staging.display(), publishes = r.publishes.len(), "node record written");
        Ok(())
    }

    /// Removes the record of a volume; a missing one is fine.
    pub fn remove(&self, volume_id: &str) -> Result<()> {
        if durable::remove(&self.path(volume_id))? {
            tracing::info!(volume = volume_id, "node record removed");
        }
        Ok(())
    }

    /// The ids of every volume with a record, sorted.
    pub fn ids(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("read {}", self.dir.display()), e)),
        };
        let mut ids: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".json")?;
                crate::naming::is_volume_id(id).then(|| id.to_string())
            })
            .collect();
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> Record {
        Record {
            volume_id: id.into(),
            staging: "/var/lib/kubelet/s".into(),
            kind: Kind::Filesystem {
                fs_type: "ext4".into(),
            },
            mount_flags: vec!["noexec".into(), "noatime".into()],
            publishes: vec![Publish {
                target: "/var/lib/kubelet/t".into(),
                readonly: true,
                mode: "SINGLE_NODE_WRITER".into(),
                removing: false,
            }],
            unstaging: false,
        }
    }

    #[test]
    fn records_round_trip_and_list() {
        let dir = tempfile::tempdir().unwrap();
        let rs = Records::new(dir.path());
        let id = crate::naming::lv_name_for("pvc-1");
        assert_eq!(rs.load(&id).unwrap(), None);
        assert!(rs.ids().unwrap().is_empty());
        let r = rec(&id);
        rs.save(&r).unwrap();
        assert_eq!(rs.load(&id).unwrap(), Some(r.clone()));
        assert_eq!(rs.ids().unwrap(), vec![id.clone()]);
        assert!(r.publish(Path::new("/var/lib/kubelet/t")).unwrap().readonly);
        assert!(r.same_flags(&["noatime".into(), "noexec".into(), "noexec".into()]));
        assert!(!r.same_flags(&["noatime".into()]));
        // A record under another id's name is not believed.
        let other = crate::naming::lv_name_for("pvc-2");
        std::fs::copy(rs.path(&id), rs.path(&other)).unwrap();
        assert!(rs.load(&other).is_err());
        rs.remove(&id).unwrap();
        rs.remove(&id).unwrap();
        assert_eq!(rs.load(&id).unwrap(), None);
        // Stray files are not volumes.
        std::fs::write(dir.path().join("volumes/.x.json.tmp"), b"{").unwrap();
        assert_eq!(rs.ids().unwrap(), vec![other]);
    }

    #[test]
    fn torn_records_are_errors_not_guesses() {
        let dir = tempfile::tempdir().unwrap();
        let rs = Records::new(dir.path());
        let id = crate::naming::lv_name_for("pvc-1");
        std::fs::create_dir_all(dir.path().join("volumes")).unwrap();
        std::fs::write(rs.path(&id), b"{\"volume_id\":").unwrap();
        assert!(matches!(rs.load(&id), Err(Error::Internal(_))));
    }
}
