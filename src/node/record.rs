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
use crate::node::cgroup::IoLimits;
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
    /// Made at start-up from what an earlier version of the driver left
    /// (see [`adopt_legacy`]): the mount flags and publish modes were not
    /// known, so a heal enforces no flags and the next NodeStageVolume
    /// supplies them (a publish mode of "" is filled in the same way).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
    /// The volume's I/O limits, set in the cgroup of each pod it is
    /// published to (`node::cgroup`): read from its LV at stage time and
    /// changed by ControllerModifyVolume, so a publish needs no LVM.
    #[serde(default, skip_serializing_if = "IoLimits::is_unlimited")]
    pub io_limits: IoLimits,
    /// The volume is LUKS2: what is staged and published is its open
    /// crypt mapping (`node::crypt`), never the LV itself. No key is kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
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

/// The file in which versions before the node record kept a block
/// volume's publishes, in its staging directory.
pub const LEGACY_BLOCK_FILE: &str = "thinpool-csi-block.json";

#[derive(Deserialize)]
struct LegacyBlock {
    #[serde(default)]
    publishes: Vec<LegacyPublish>,
}

#[derive(Deserialize)]
struct LegacyPublish {
    target: PathBuf,
    mode: String,
    readonly: bool,
}

/// A record for a volume an earlier version of the driver staged at
/// `staging` (it kept that in an LV tag): the kind from the volume's
/// access tag (or what is mounted there), the publishes from the block
/// file in the staging directory, or from the bind mounts of the LV
/// (`lv`: its numbers when active). The block file is read, not removed.
pub fn adopt_legacy(
    volume_id: &str,
    staging: &Path,
    access: Option<&crate::naming::Access>,
    lv: Option<(u32, u32)>,
    state_dir: &Path,
) -> Result<Record> {
    use crate::naming::Access;
    let table = crate::node::mount_table()?;
    let mounted = table
        .top_mount_at(staging)
        .filter(|m| Some(m.device()) == lv);
    let kind = match (access, mounted) {
        (Some(Access::Block), _) => Kind::Block,
        (Some(Access::Mount { fs_type }), _) => Kind::Filesystem {
            fs_type: fs_type.clone(),
        },
        (None, Some(m)) => Kind::Filesystem {
            fs_type: m.fs_type.clone(),
        },
        (None, None) => Kind::Block,
    };
    let publishes = match &kind {
        Kind::Block => {
            let file = staging.join(LEGACY_BLOCK_FILE);
            match std::fs::read(&file) {
                Ok(text) => serde_json::from_slice::<LegacyBlock>(&text)
                    .map_err(|e| Error::Internal(format!("{}: {e}", file.display())))?
                    .publishes
                    .into_iter()
                    .map(|p| Publish {
                        target: p.target,
                        readonly: p.readonly,
                        mode: p.mode,
                        removing: false,
                    })
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(Error::io(format!("read {}", file.display()), e)),
            }
        }
        Kind::Filesystem { .. } => {
            let staging_n = crate::mountinfo::normalize(staging);
            lv.map(|(ma, mi)| table.mounts_of_device(ma, mi))
                .unwrap_or_default()
                .into_iter()
                // Publishes bind the whole filesystem: subPath binds
                // (another root) are kubelet's, and mounts under state_dir
                // the driver's own.
                .filter(|m| m.root == Path::new("/"))
                .filter(|m| !m.mount_point.starts_with(state_dir))
                .filter(|m| crate::mountinfo::normalize(&m.mount_point) != staging_n)
                .map(|m| Publish {
                    target: m.mount_point.clone(),
                    readonly: m.mount_option("ro").is_some(),
                    mode: String::new(),
                    removing: false,
                })
                .collect()
        }
    };
    Ok(Record {
        volume_id: volume_id.to_string(),
        staging: staging.to_path_buf(),
        kind,
        mount_flags: Vec::new(),
        publishes,
        unstaging: false,
        adopted: true,
        io_limits: IoLimits::default(),
        encrypted: false,
    })
}

/// Removes the block file an earlier version kept in `staging`, once its
/// content is in a record; a missing one is fine.
pub fn drop_legacy_block_file(staging: &Path) {
    let file = staging.join(LEGACY_BLOCK_FILE);
    if std::fs::remove_file(&file).is_ok() {
        tracing::info!(file = %file.display(), "removed an earlier version's block file");
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
            Error::Internal(format!("{} is not a node record ({e})", path.display()))
                .advise("move that file away (the driver then treats the volume as not staged on this node), then retry")
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
            io_limits: IoLimits::default(),
            adopted: false,
            encrypted: false,
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

    /// A block volume an earlier version staged: its publishes come from
    /// the block file in the staging directory; flags are unknown.
    #[test]
    fn legacy_block_staging_is_adopted_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("staging");
        std::fs::create_dir(&staging).unwrap();
        std::fs::write(
            staging.join(LEGACY_BLOCK_FILE),
            br#"{"volume_id":"v","publishes":[{"target":"/var/lib/kubelet/t","mode":"SINGLE_NODE_WRITER","readonly":true}]}"#,
        )
        .unwrap();
        let r = adopt_legacy(
            "v",
            &staging,
            Some(&crate::naming::Access::Block),
            None,
            dir.path(),
        )
        .unwrap();
        assert_eq!(r.kind, Kind::Block);
        assert!(r.adopted);
        assert_eq!(r.publishes.len(), 1);
        assert!(r.publishes[0].readonly);
        assert_eq!(r.publishes[0].target, Path::new("/var/lib/kubelet/t"));
        // Without the file: staged, nothing published.
        std::fs::remove_file(staging.join(LEGACY_BLOCK_FILE)).unwrap();
        let r = adopt_legacy("v", &staging, None, None, dir.path()).unwrap();
        assert!(r.publishes.is_empty() && r.kind == Kind::Block);
        // A torn file is an error, not an empty list.
        std::fs::write(staging.join(LEGACY_BLOCK_FILE), b"{\"publishes\":[").unwrap();
        assert!(adopt_legacy("v", &staging, None, None, dir.path()).is_err());
    }

    #[test]
    fn torn_records_are_errors_not_guesses() {
        let dir = tempfile::tempdir().unwrap();
        let rs = Records::new(dir.path());
        let id = crate::naming::lv_name_for("pvc-1");
        std::fs::create_dir_all(dir.path().join("volumes")).unwrap();
        std::fs::write(rs.path(&id), b"{\"volume_id\":").unwrap();
        let e = rs.load(&id).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        assert!(e.message().contains("move that file away"), "{e}");
    }
}
