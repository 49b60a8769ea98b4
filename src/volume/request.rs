//! Typed request values. The gRPC layer parses each request once into
//! these, so the volume layer never sees a raw string from a CO: an id of
//! our shape, a path checked against `allowed_roots`, a capability with
//! its mount options already parsed, a size range that is not negative.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::naming::Access;
use crate::node::mount_options::MountOptions;
use crate::proto::csi::v1::volume_capability::access_mode::Mode;

/// An id of a shape this driver issues, checked by `grpc::validate`.
macro_rules! checked_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Only `grpc::validate` and the volume layer's own listings
            /// make ids.
            pub(crate) fn new_unchecked(id: String) -> $name {
                $name(id)
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

checked_id!(
    /// A volume id of the shape this driver issues (`naming::is_volume_id`).
    VolumeId
);
checked_id!(
    /// A snapshot id of the shape this driver issues
    /// (`naming::is_snapshot_id`).
    SnapshotId
);

/// A staging or target path that passed `node::paths::check`: absolute,
/// normalized, no `..`, under one of the allowed roots. Where it really
/// leads is found with `Volumes::resolve` when the call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePath(PathBuf);

impl NodePath {
    pub(crate) fn new_unchecked(p: PathBuf) -> NodePath {
        NodePath(p)
    }
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for NodePath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

/// A checked volume capability: the access type (with fs type), the access
/// mode, and for filesystems the mount flags as given and as the kernel
/// takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub access: Access,
    pub mode: Mode,
    /// The CO's mount flags, each a single checked word.
    pub mount_flags: Vec<String>,
    /// `mount_flags` parsed for mount(2); `None` for block.
    pub mount: Option<MountOptions>,
}

impl Capability {
    /// A publish is read-only when asked, and always for a reader-only mode.
    pub fn readonly(&self, asked: bool) -> bool {
        asked || self.mode == Mode::SingleNodeReaderOnly
    }
}

/// A capacity range that is not negative; 0 means "not given".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeRange {
    pub required: u64,
    pub limit: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_only_mode_forces_read_only() {
        let cap = |mode| Capability {
            access: Access::Block,
            mode,
            mount_flags: vec![],
            mount: None,
        };
        assert!(cap(Mode::SingleNodeReaderOnly).readonly(false));
        assert!(cap(Mode::SingleNodeWriter).readonly(true));
        assert!(!cap(Mode::SingleNodeMultiWriter).readonly(false));
    }
}
