//! The volume capability a request carries, from `--fs`, `--block`,
//! `--mode` and mount flags.

use thinpool_csi::proto::csi::v1 as csi;

use crate::args::AccessArgs;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};

/// A capability from `--fs`/`--block`/`--mode` and mount flags; a mount
/// with an empty fs type (the driver's default) when neither is given.
pub fn capability(a: &AccessArgs, mount_flags: &[String]) -> csi::VolumeCapability {
    let access_type = if a.block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: a.fs.clone().unwrap_or_default(),
            mount_flags: mount_flags.to_vec(),
            ..Default::default()
        })
    };
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: csi::volume_capability::access_mode::Mode::from(a.mode) as i32,
        }),
        access_type: Some(access_type),
    }
}

/// The capability `--fs` or `--block` asks for, if either is given.
pub fn given_capability(a: &AccessArgs) -> Option<csi::VolumeCapability> {
    (a.fs.is_some() || a.block).then(|| capability(a, &[]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    #[test]
    fn capabilities_from_flags() {
        use csi::volume_capability::access_mode::Mode;
        let a = AccessArgs {
            fs: Some("xfs".into()),
            block: false,
            mode: args::AccessMode::SingleNodeMultiWriter,
        };
        let cap = capability(&a, &["noatime".to_string()]);
        assert_eq!(
            cap.access_mode.unwrap().mode,
            Mode::SingleNodeMultiWriter as i32
        );
        match cap.access_type {
            Some(AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "xfs");
                assert_eq!(m.mount_flags, vec!["noatime"]);
            }
            other => panic!("{other:?}"),
        }
        let b = capability(
            &AccessArgs {
                block: true,
                ..Default::default()
            },
            &[],
        );
        assert!(matches!(b.access_type, Some(AccessType::Block(_))));
        let default = capability(&AccessArgs::default(), &[]);
        match default.access_type {
            Some(AccessType::Mount(m)) => assert_eq!(m.fs_type, ""),
            other => panic!("{other:?}"),
        }
    }
}
