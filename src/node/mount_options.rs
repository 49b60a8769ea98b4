//! Mount options: the capability's mount flags as the kernel takes them
//! (`MS_*` bits and the filesystem's own words), and the per-mount flags
//! a bind mount carries.

use crate::error::{Error, Result};
use crate::fs_options::{is_operation, mount_option_key, mount_word, MountWord};
use crate::mountinfo;
use crate::sys::MsFlags;

/// Mount flags as the kernel takes them: `MS_*` bits plus the
/// filesystem's own option words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlags,
    pub data: Vec<String>,
}

impl MountOptions {
    /// Turns mount option words (the device class's, then the CO's mount
    /// flags), each on `fs_options`' lists, into kernel flags and data. xfs always gets
    /// `nouuid`: snapshots and clones of a volume share its UUID, and xfs
    /// refuses to mount a second filesystem with a UUID it already has.
    pub fn parse(fs_type: &str, words: &[String]) -> Result<MountOptions> {
        Self::parse_words(fs_type, words, false)
    }

    /// [`MountOptions::parse`] of the mount flags a node record kept: a
    /// word an earlier version took (any single word) is passed on as it
    /// was then, so a restart does not fail to bring back what it staged.
    /// Operations (`bind`, ...) are refused all the same.
    pub fn parse_recorded(fs_type: &str, words: &[String]) -> Result<MountOptions> {
        Self::parse_words(fs_type, words, true)
    }

    fn parse_words(fs_type: &str, words: &[String], recorded: bool) -> Result<MountOptions> {
        let mut flags = MsFlags::empty();
        let mut data: Vec<String> = Vec::new();
        for w in words {
            let word = match mount_word(fs_type, w) {
                Err(_) if recorded && !is_operation(w) && !w.contains([',', '=']) => MountWord::Own,
                other => other.map_err(Error::InvalidArgument)?,
            };
            match word {
                MountWord::Ignored => {}
                MountWord::Generic(bit, set) => flags.set(bit, set),
                MountWord::Own => {
                    // A later word of the same key replaces an earlier one:
                    // the CO's flags come after the device class's.
                    let key = mount_option_key(w);
                    data.retain(|d| mount_option_key(d) != key);
                    data.push(w.to_string());
                }
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
        // A recorded word an earlier version took is passed on; a new one
        // is refused.
        assert!(MountOptions::parse("ext4", &words(&["nouser_xattr"])).is_err());
        let o = MountOptions::parse_recorded("ext4", &words(&["nouser_xattr", "noatime"])).unwrap();
        assert_eq!(o.data(), Some("nouser_xattr".into()));
        assert!(MountOptions::parse_recorded("ext4", &words(&["bind"])).is_err());
        for op in ["bind", "remount", "rshared", "move"] {
            assert!(matches!(
                MountOptions::parse("ext4", &words(&[op])),
                Err(Error::InvalidArgument(_))
            ));
        }
    }
}
