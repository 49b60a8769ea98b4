//! Mount options: the capability's mount flags as the kernel takes them
//! (`MS_*` bits and the filesystem's own words), and the per-mount flags
//! a bind mount carries.

use crate::error::{Error, Result};
use crate::mountinfo;
use crate::sys::MsFlags;

/// Mount flags as the kernel takes them: `MS_*` bits plus the
/// filesystem's own option words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlags,
    pub data: Vec<String>,
}

/// Words of mount(8) that only steer mount(8) or fstab; they mean nothing
/// to the kernel and are dropped.
const IGNORED: &[&str] = &["defaults", "auto", "noauto", "nofail", "_netdev"];

/// Words that would change *how* the mount is made (bind, move,
/// propagation) rather than set an option; refused.
const OPERATIONS: &[&str] = &[
    "bind",
    "rbind",
    "move",
    "remount",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "private",
    "rprivate",
    "unbindable",
    "runbindable",
];

/// Generic option words and the `MS_*` bit each sets (`true`) or clears.
const GENERIC: &[(&str, MsFlags, bool)] = &[
    ("ro", MsFlags::MS_RDONLY, true),
    ("rw", MsFlags::MS_RDONLY, false),
    ("nosuid", MsFlags::MS_NOSUID, true),
    ("suid", MsFlags::MS_NOSUID, false),
    ("nodev", MsFlags::MS_NODEV, true),
    ("dev", MsFlags::MS_NODEV, false),
    ("noexec", MsFlags::MS_NOEXEC, true),
    ("exec", MsFlags::MS_NOEXEC, false),
    ("sync", MsFlags::MS_SYNCHRONOUS, true),
    ("async", MsFlags::MS_SYNCHRONOUS, false),
    ("dirsync", MsFlags::MS_DIRSYNC, true),
    ("noatime", MsFlags::MS_NOATIME, true),
    ("atime", MsFlags::MS_NOATIME, false),
    ("nodiratime", MsFlags::MS_NODIRATIME, true),
    ("diratime", MsFlags::MS_NODIRATIME, false),
    ("relatime", MsFlags::MS_RELATIME, true),
    ("norelatime", MsFlags::MS_RELATIME, false),
    ("strictatime", MsFlags::MS_STRICTATIME, true),
    ("nostrictatime", MsFlags::MS_STRICTATIME, false),
    ("lazytime", MsFlags::MS_LAZYTIME, true),
    ("nolazytime", MsFlags::MS_LAZYTIME, false),
    ("silent", MsFlags::MS_SILENT, true),
    ("loud", MsFlags::MS_SILENT, false),
];

impl MountOptions {
    /// Turns the capability's mount flags (single words, already checked by
    /// `validate::mount_flag`) into kernel flags and data. xfs always gets
    /// `nouuid`: snapshots and clones of a volume share its UUID, and xfs
    /// refuses to mount a second filesystem with a UUID it already has.
    pub fn parse(fs_type: &str, words: &[String]) -> Result<MountOptions> {
        let mut flags = MsFlags::empty();
        let mut data: Vec<String> = Vec::new();
        for w in words {
            let w = w.as_str();
            if IGNORED.contains(&w) {
                continue;
            }
            if OPERATIONS.contains(&w) {
                return Err(Error::InvalidArgument(format!(
                    "mount flag {w:?} changes how a mount is made, it is not a mount option"
                )));
            }
            if let Some((_, bit, set)) = GENERIC.iter().find(|(name, _, _)| *name == w) {
                flags.set(*bit, *set);
            } else if !data.iter().any(|d| d == w) {
                data.push(w.to_string());
            }
        }
        if fs_type == "xfs" && !data.iter().any(|d| d == "nouuid") {
            data.push("nouuid".into());
        }
        Ok(MountOptions { flags, data })
    }

    /// The data argument of mount(2).
    pub fn data(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }
}

/// The per-mount flags, as mountinfo spells them: the part of a mount's
/// options that a bind mount carries on its own.
const PER_MOUNT: &[(MsFlags, &str)] = &[
    (MsFlags::MS_RDONLY, "ro"),
    (MsFlags::MS_NOSUID, "nosuid"),
    (MsFlags::MS_NODEV, "nodev"),
    (MsFlags::MS_NOEXEC, "noexec"),
];

/// The per-mount flags among `flags`.
pub fn per_mount(flags: MsFlags) -> MsFlags {
    PER_MOUNT
        .iter()
        .filter(|(bit, _)| flags.contains(*bit))
        .fold(MsFlags::empty(), |acc, (bit, _)| acc | *bit)
}

/// The per-mount flags a mount carries.
pub fn per_mount_of(m: &mountinfo::Mount) -> MsFlags {
    PER_MOUNT
        .iter()
        .filter(|(_, word)| m.mount_option(word).is_some())
        .fold(MsFlags::empty(), |acc, (bit, _)| acc | *bit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn mount_flags_become_kernel_flags_and_data() {
        let o =
            MountOptions::parse("ext4", &words(&["noatime", "ro", "discard", "defaults"])).unwrap();
        assert_eq!(o.flags, MsFlags::MS_NOATIME | MsFlags::MS_RDONLY);
        assert_eq!(o.data(), Some("discard".into()));
        let o = MountOptions::parse("ext4", &words(&["ro", "rw", "nosuid"])).unwrap();
        assert_eq!(o.flags, MsFlags::MS_NOSUID);
        assert_eq!(o.data(), None);
        let o = MountOptions::parse("xfs", &[]).unwrap();
        assert_eq!(o.data(), Some("nouuid".into()));
        let o = MountOptions::parse("xfs", &words(&["nouuid", "noquota"])).unwrap();
        assert_eq!(o.data(), Some("nouuid,noquota".into()));
        for op in ["bind", "remount", "rshared", "move"] {
            assert!(matches!(
                MountOptions::parse("ext4", &words(&[op])),
                Err(Error::InvalidArgument(_))
            ));
        }
    }
}
