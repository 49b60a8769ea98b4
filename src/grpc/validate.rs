//! Request validation shared by the gRPC services. Everything a CO sends is
//! checked here before any LVM or node work starts, so a bad request is
//! answered with INVALID_ARGUMENT (or the code the spec names) and nothing
//! is touched.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::config::FS_TYPES;
use crate::error::{Error, Result};
use crate::naming::{self, Access, ContentSource, MAX_STRING};
use crate::node::fs::MountOptions;
use crate::node::paths;
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::csi::v1::volume_capability::AccessType;
use crate::proto::csi::v1::volume_content_source::Type as SourceType;
use crate::proto::csi::v1::{
    CapacityRange, TopologyRequirement, VolumeCapability, VolumeContentSource,
};
use crate::volume::{Capability, NodePath, SizeRange, SnapshotId, VolumeId};

fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::InvalidArgument(msg.into()))
}

/// A string field that must be present, within CSI's size limit, and free
/// of control characters.
pub fn required_string<'a>(field: &str, value: &'a str) -> Result<&'a str> {
    if value.is_empty() {
        return invalid(format!("{field} is required"));
    }
    bounded_string(field, value)
}

pub fn bounded_string<'a>(field: &str, value: &'a str) -> Result<&'a str> {
    if value.len() > MAX_STRING {
        return invalid(format!(
            "{field} is {} bytes; CSI limits it to {MAX_STRING}",
            value.len()
        ));
    }
    Ok(value)
}

/// A path field that must be present. Paths override CSI's 128-byte
/// string limit ("SP MUST accept a max path length of at least 128
/// bytes"): they are bounded by the OS's PATH_MAX instead.
pub fn required_path<'a>(field: &str, value: &'a str) -> Result<&'a str> {
    if value.is_empty() {
        return invalid(format!("{field} is required"));
    }
    if value.len() > paths::MAX_PATH {
        return invalid(format!(
            "{field} is {} bytes; the limit is {}",
            value.len(),
            paths::MAX_PATH
        ));
    }
    Ok(value)
}

/// CSI-Addons paths override CSI's 128-byte limit: as long as the OS
/// allows, within this bound.
pub const MAX_ADDONS_PATH: usize = 4096;

pub fn addons_path_len(field: &str, value: &str) -> Result<()> {
    if value.len() > MAX_ADDONS_PATH {
        return invalid(format!("{field} is longer than {MAX_ADDONS_PATH} bytes"));
    }
    Ok(())
}

/// A volume id in a request. `Ok(None)` means well formed for CSI but not
/// an id this driver ever issues: no such volume of ours exists. The id
/// goes into the call's log line (`observe`).
pub fn volume_id(id: &str) -> Result<Option<VolumeId>> {
    required_string("volume_id", id)?;
    if id.chars().any(char::is_control) {
        return invalid("volume_id contains control characters");
    }
    super::observe::note_volume_id(id);
    Ok(naming::is_volume_id(id).then(|| VolumeId::new_unchecked(id.to_string())))
}

/// A volume id that must name one of ours; anything else is NOT_FOUND.
pub fn existing_volume_id(id: &str) -> Result<VolumeId> {
    known_volume(volume_id(id)?, id)
}

/// The second half of [`existing_volume_id`], for requests with more
/// fields: the spec checks the whole request (INVALID_ARGUMENT) before it
/// looks anything up, so a well-formed id of a shape we never issue
/// becomes NOT_FOUND only after every other field passed.
pub fn known_volume(id: Option<VolumeId>, raw: &str) -> Result<VolumeId> {
    id.ok_or_else(|| Error::NotFound(format!("volume {raw:?} does not exist")))
}

/// A snapshot id in a request; `Ok(None)` when well formed for CSI but not
/// an id this driver issues.
pub fn snapshot_id(field: &str, id: &str) -> Result<Option<SnapshotId>> {
    required_string(field, id)?;
    if id.chars().any(char::is_control) {
        return invalid(format!("{field} contains control characters"));
    }
    super::observe::note_snapshot_id(id);
    Ok(naming::is_snapshot_id(id).then(|| SnapshotId::new_unchecked(id.to_string())))
}

/// CreateVolume's content source: a snapshot or a volume of ours. An id of
/// another shape names nothing that exists: NOT_FOUND.
pub fn content_source(src: Option<&VolumeContentSource>) -> Result<Option<ContentSource>> {
    let Some(src) = src else {
        return Ok(None);
    };
    match &src.r#type {
        None => invalid("volume_content_source names neither a snapshot nor a volume"),
        Some(SourceType::Snapshot(s)) => match snapshot_id("snapshot_id", &s.snapshot_id)? {
            Some(id) => Ok(Some(ContentSource::Snapshot(id.to_string()))),
            None => Err(Error::NotFound(format!(
                "snapshot {:?} does not exist",
                s.snapshot_id
            ))),
        },
        Some(SourceType::Volume(v)) => Ok(Some(ContentSource::Volume(
            existing_volume_id(&v.volume_id)?.to_string(),
        ))),
    }
}

/// CreateSnapshot's parameters: only what external-snapshotter adds
/// (`csi.storage.k8s.io/volumesnapshot/...`); this driver takes none.
pub fn snapshot_parameters(params: &HashMap<String, String>) -> Result<()> {
    match params
        .keys()
        .find(|k| !k.starts_with("csi.storage.k8s.io/"))
    {
        Some(k) => invalid(format!(
            "unknown snapshot parameter {k:?}: this driver takes no snapshot parameters"
        )),
        None => Ok(()),
    }
}

/// Mutable parameters (CreateVolume, ControllerModifyVolume): only
/// `readAheadSectors`, as `auto` or a multiple of 8 sectors up to 1 GiB'
/// worth; a creation parameter is immutable. Values come back canonical.
pub fn mutable_parameters(params: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    use crate::volume::controller::READ_AHEAD;
    let mut out = BTreeMap::new();
    for (key, value) in params {
        if key != READ_AHEAD {
            return invalid(if PARAMETERS.iter().any(|(k, _)| k == key) {
                format!("parameter {key:?} is set at creation and cannot be modified")
            } else {
                format!("unknown mutable parameter {key:?} (known: [{READ_AHEAD:?}])")
            });
        }
        let canonical = match value.as_str() {
            "auto" => "auto".to_string(),
            v => match v.parse::<u32>() {
                Ok(n) if n % 8 == 0 && n <= 2 * 1024 * 1024 => n.to_string(),
                _ => {
                    return invalid(format!(
                        "{key}={value:?}: use \"auto\" or a number of 512-byte sectors that is a multiple of 8, at most 2097152"
                    ))
                }
            },
        };
        out.insert(key.clone(), canonical);
    }
    Ok(out)
}

/// A list call's paging: `max_entries` not negative, and a token this
/// driver issued (`issued` checks its shape) or none; a foreign token is
/// ABORTED, as the spec says.
pub fn page(max_entries: i32, token: &str, issued: fn(&str) -> bool) -> Result<usize> {
    if max_entries < 0 {
        return invalid("max_entries must not be negative");
    }
    if !token.is_empty() && !issued(token) {
        return Err(Error::Aborted(format!(
            "starting_token {token:?} was not issued by this driver"
        ))
        .advise("start the listing again with an empty starting_token"));
    }
    Ok(max_entries as usize)
}

/// A staging or target path, checked against `allowed_roots`.
pub fn node_path(field: &str, value: &str, roots: &[PathBuf]) -> Result<NodePath> {
    paths::check(field, value, roots).map(NodePath::new_unchecked)
}

/// A required capability, checked, with its mount options parsed.
pub fn full_capability(cap: Option<&VolumeCapability>, default_fs: &str) -> Result<Capability> {
    let cap = cap.ok_or_else(|| {
        Error::InvalidArgument("volume_capability is required".into())
            .advise("set volume_capability (mount or block, with an access_mode)")
    })?;
    let access = capability(cap, default_fs)?;
    let mode = cap
        .access_mode
        .as_ref()
        .and_then(|m| Mode::try_from(m.mode).ok())
        .unwrap_or(Mode::Unknown);
    let mount_flags = match &cap.access_type {
        Some(AccessType::Mount(m)) => m.mount_flags.clone(),
        _ => Vec::new(),
    };
    let mount = match &access {
        Access::Mount { fs_type } => Some(MountOptions::parse(fs_type, &mount_flags)?),
        Access::Block => None,
    };
    Ok(Capability {
        access,
        mode,
        mount_flags,
        mount,
    })
}

/// Access modes a node-local volume can honour.
fn single_node(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter
    )
}

/// Checks one capability and says how the volume is consumed. An empty
/// fs_type means `default_fs`.
pub fn capability(cap: &VolumeCapability, default_fs: &str) -> Result<Access> {
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("volume capability lacks access_mode".into()))?;
    let mode = Mode::try_from(mode.mode)
        .map_err(|_| Error::InvalidArgument(format!("unknown access mode {}", mode.mode)))?;
    if mode == Mode::Unknown {
        return invalid("access mode UNKNOWN is not valid");
    }
    if !single_node(mode) {
        return invalid(format!(
            "access mode {} is not supported: thin volumes are local to one node",
            mode.as_str_name()
        ));
    }
    match &cap.access_type {
        None => invalid("volume capability lacks access_type (block or mount)"),
        Some(AccessType::Block(_)) => Ok(Access::Block),
        Some(AccessType::Mount(m)) => {
            let fs = if m.fs_type.is_empty() {
                default_fs
            } else {
                m.fs_type.as_str()
            };
            if !FS_TYPES.contains(&fs) {
                return invalid(format!(
                    "fs_type {:?} is not supported (supported: {FS_TYPES:?})",
                    m.fs_type
                ));
            }
            if !m.volume_mount_group.is_empty() {
                return invalid("volume_mount_group is not supported");
            }
            for flag in &m.mount_flags {
                mount_flag(flag)?;
            }
            Ok(Access::Mount {
                fs_type: fs.to_string(),
            })
        }
    }
}

/// One mount flag: a single option word, no way to smuggle a second option
/// (`,`), a value (`=`) or anything non-printable.
pub fn mount_flag(flag: &str) -> Result<&str> {
    let ok = !flag.is_empty()
        && flag.len() <= 64
        && flag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(flag)
    } else {
        invalid(format!(
            "mount flag {flag:?} is not a single option word (letters, digits, '_', '-')"
        ))
    }
}

/// All capabilities of a request must agree on one way to consume the
/// volume, since the driver records one.
pub fn capabilities(caps: &[VolumeCapability], default_fs: &str) -> Result<Access> {
    let mut access: Option<Access> = None;
    if caps.is_empty() {
        return invalid("volume_capabilities is required");
    }
    for cap in caps {
        let a = capability(cap, default_fs)?;
        match &access {
            Some(prev) if *prev != a => {
                return invalid(format!(
                    "volume capabilities disagree ({prev:?} and {a:?}); one volume has one access type and fs type"
                ))
            }
            _ => access = Some(a),
        }
    }
    Ok(access.expect("non-empty"))
}

/// The StorageClass parameters this driver understands, with the short
/// names they are stored under in LVM tags.
pub const PARAMETERS: &[(&str, &str)] = &[
    ("volumeGroup", "vg"),
    ("thinPool", "pool"),
    ("csi.storage.k8s.io/pvc/name", "pvcname"),
    ("csi.storage.k8s.io/pvc/namespace", "pvcns"),
    ("csi.storage.k8s.io/pv/name", "pvname"),
];

/// Checks parameters: only known keys, within CSI's size limits, and a
/// volume group and pool (when named) that are the ones this driver
/// serves. Returns them keyed by their short names.
pub fn parameters(
    params: &HashMap<String, String>,
    vg: &str,
    pool: &str,
) -> Result<BTreeMap<String, String>> {
    let total: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > 4096 {
        return invalid(format!(
            "parameters are {total} bytes; CSI limits a map to 4 KiB"
        ));
    }
    let mut out = BTreeMap::new();
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        let value = &params[key];
        let Some((_, short)) = PARAMETERS.iter().find(|(k, _)| k == key) else {
            let known: Vec<&str> = PARAMETERS.iter().map(|(k, _)| *k).collect();
            return invalid(format!("unknown parameter {key:?} (known: {known:?})"));
        };
        bounded_string(&format!("parameter {key}"), value)?;
        let expected = match *short {
            "vg" => Some(vg),
            "pool" => Some(pool),
            _ => None,
        };
        if let Some(expected) = expected {
            if value != expected {
                return invalid(format!(
                    "parameter {key}={value:?} does not match this driver's {expected:?}"
                ));
            }
        }
        out.insert(short.to_string(), value.clone());
    }
    Ok(out)
}

/// A capacity range as the volume layer takes it: not negative.
pub fn size_range(range: Option<&CapacityRange>) -> Result<Option<SizeRange>> {
    let Some(r) = range else { return Ok(None) };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return invalid(format!(
            "capacity_range must not be negative (required_bytes={}, limit_bytes={})",
            r.required_bytes, r.limit_bytes
        ));
    }
    Ok(Some(SizeRange {
        required: r.required_bytes as u64,
        limit: r.limit_bytes as u64,
    }))
}

/// Whether a topology segment describes this node: every key in it must be
/// ours and carry our node id.
pub fn segment_is_ours(segments: &HashMap<String, String>, key: &str, node: &str) -> bool {
    !segments.is_empty() && segments.iter().all(|(k, v)| k == key && v == node)
}

/// CreateVolume: a requisite topology must include this node. Preferred
/// topologies are only an order of preference (the spec's MUST binds the
/// requisite list alone), and this node is the only place we provision.
pub fn topology_allows(req: Option<&TopologyRequirement>, key: &str, node: &str) -> bool {
    match req {
        None => true,
        Some(r) if r.requisite.is_empty() => true,
        Some(r) => r
            .requisite
            .iter()
            .any(|t| segment_is_ours(&t.segments, key, node)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_id_is_not_found_only_after_the_rest_passed() {
        let foreign = volume_id("fake-vol-id").unwrap();
        assert!(foreign.is_none(), "well formed, never issued");
        assert!(matches!(
            known_volume(foreign, "fake-vol-id"),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(volume_id(""), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn mutable_parameters_take_read_ahead_only() {
        let m = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        let ok = mutable_parameters(&m("readAheadSectors", "0512")).unwrap();
        assert_eq!(ok["readAheadSectors"], "512");
        assert_eq!(
            mutable_parameters(&m("readAheadSectors", "auto")).unwrap()["readAheadSectors"],
            "auto"
        );
        for (k, v) in [
            ("readAheadSectors", "13"),
            ("readAheadSectors", "-8"),
            ("readAheadSectors", "99999999"),
            ("readAheadSectors", "none; rm"),
            ("volumeGroup", "vg0"),
            ("iops", "100"),
        ] {
            let e = mutable_parameters(&m(k, v)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}={v}");
        }
        assert!(mutable_parameters(&HashMap::new()).unwrap().is_empty());
    }
    use crate::proto::csi::v1::volume_capability::{AccessMode, BlockVolume, MountVolume};
    use crate::proto::csi::v1::Topology;

    fn mount(fs: &str, mode: Mode, flags: &[&str]) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            })),
        }
    }
    fn block(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }
    }

    #[test]
    fn capabilities_are_checked() {
        let ext4 = Access::Mount {
            fs_type: "ext4".into(),
        };
        assert_eq!(
            capabilities(&[mount("", Mode::SingleNodeWriter, &[])], "ext4").unwrap(),
            ext4
        );
        assert_eq!(
            capabilities(&[block(Mode::SingleNodeMultiWriter)], "ext4").unwrap(),
            Access::Block
        );
        assert!(capabilities(&[], "ext4").is_err());
        assert!(capabilities(&[mount("btrfs", Mode::SingleNodeWriter, &[])], "ext4").is_err());
        assert!(capabilities(&[mount("ext4", Mode::MultiNodeMultiWriter, &[])], "ext4").is_err());
        assert!(capabilities(&[mount("ext4", Mode::Unknown, &[])], "ext4").is_err());
        assert!(capabilities(
            &[
                mount("ext4", Mode::SingleNodeWriter, &[]),
                block(Mode::SingleNodeWriter)
            ],
            "ext4"
        )
        .is_err());
        let mut no_mode = block(Mode::SingleNodeWriter);
        no_mode.access_mode = None;
        assert!(capabilities(&[no_mode], "ext4").is_err());
        let mut bad_mode = block(Mode::SingleNodeWriter);
        bad_mode.access_mode = Some(AccessMode { mode: 99 });
        assert!(capabilities(&[bad_mode], "ext4").is_err());
        let mut no_type = block(Mode::SingleNodeWriter);
        no_type.access_type = None;
        assert!(capabilities(&[no_type], "ext4").is_err());
    }

    #[test]
    fn mount_flags_cannot_smuggle_options() {
        assert!(capabilities(
            &[mount(
                "xfs",
                Mode::SingleNodeWriter,
                &["noatime", "nodiscard"]
            )],
            "ext4"
        )
        .is_ok());
        for bad in ["ro,exec", "uid=0", "a\nb", "", "x y", "context=\"a\""] {
            assert!(mount_flag(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parameters_are_whitelisted_and_bounded() {
        let p = |kv: &[(&str, &str)]| -> HashMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ok = parameters(
            &p(&[
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("thinPool", "pool"),
            ]),
            "vg",
            "pool",
        )
        .unwrap();
        assert_eq!(ok.get("pvcname").unwrap(), "data");
        assert_eq!(ok.get("pool").unwrap(), "pool");
        let e = parameters(&p(&[("fsType; rm -rf /", "x")]), "vg", "pool").unwrap_err();
        assert!(e.to_string().contains("unknown parameter"), "{e}");
        assert!(parameters(&p(&[("volumeGroup", "other")]), "vg", "pool").is_err());
        assert!(parameters(
            &p(&[("csi.storage.k8s.io/pv/name", &"x".repeat(129))]),
            "vg",
            "pool"
        )
        .is_err());
    }

    #[test]
    fn negative_ranges_are_invalid() {
        let r = |required_bytes, limit_bytes| CapacityRange {
            required_bytes,
            limit_bytes,
        };
        assert_eq!(size_range(None).unwrap(), None);
        assert_eq!(
            size_range(Some(&r(5, 9))).unwrap(),
            Some(SizeRange {
                required: 5,
                limit: 9
            })
        );
        assert!(matches!(
            size_range(Some(&r(-1, 0))),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            size_range(Some(&r(0, -5))),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn ids_and_strings() {
        assert!(matches!(volume_id(""), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            volume_id(&"x".repeat(10_000)),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(volume_id("a\0b"), Err(Error::InvalidArgument(_))));
        assert_eq!(volume_id("vg0/root").unwrap(), None);
        assert_eq!(volume_id("../x").unwrap(), None);
        let id = naming::lv_name_for("pvc-1");
        assert_eq!(volume_id(&id).unwrap().as_deref(), Some(id.as_str()));
        assert!(matches!(
            existing_volume_id("pool"),
            Err(Error::NotFound(_))
        ));
    }

    #[test]
    fn topology() {
        let seg = |k: &str, v: &str| Topology {
            segments: [(k.to_string(), v.to_string())].into_iter().collect(),
        };
        let key = "topology.x.y/node";
        let req = |t: Vec<Topology>| TopologyRequirement {
            requisite: t,
            preferred: vec![],
        };
        assert!(topology_allows(None, key, "n1"));
        assert!(topology_allows(
            Some(&req(vec![seg(key, "n2"), seg(key, "n1")])),
            key,
            "n1"
        ));
        assert!(!topology_allows(
            Some(&req(vec![seg(key, "n2")])),
            key,
            "n1"
        ));
        assert!(!topology_allows(
            Some(&req(vec![seg("zone", "a")])),
            key,
            "n1"
        ));
        assert!(topology_allows(Some(&req(vec![])), key, "n1"));
        // Preferred alone is no requirement.
        let preferred_elsewhere = TopologyRequirement {
            requisite: vec![],
            preferred: vec![seg(key, "n2")],
        };
        assert!(topology_allows(Some(&preferred_elsewhere), key, "n1"));
    }
}
