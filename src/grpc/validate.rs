//! Request validation shared by the gRPC services. Everything a CO sends is
//! checked here before any LVM or node work starts, so a bad request is
//! answered with INVALID_ARGUMENT (or the code the spec names) and nothing
//! is touched.

use std::collections::{BTreeMap, HashMap};

use crate::config::FS_TYPES;
use crate::error::{Error, Result};
use crate::lvm::report::round_up;
use crate::naming::{self, Access, MAX_STRING};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::csi::v1::volume_capability::AccessType;
use crate::proto::csi::v1::{CapacityRange, TopologyRequirement, VolumeCapability};

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
/// an id this driver ever issues: no such volume of ours exists.
pub fn volume_id(id: &str) -> Result<Option<&str>> {
    required_string("volume_id", id)?;
    if id.chars().any(char::is_control) {
        return invalid("volume_id contains control characters");
    }
    Ok(naming::is_volume_id(id).then_some(id))
}

/// A volume id that must name one of ours; anything else is NOT_FOUND.
pub fn existing_volume_id(id: &str) -> Result<&str> {
    volume_id(id)?.ok_or_else(|| Error::NotFound(format!("volume {id:?} does not exist")))
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

/// The size to allocate for a capacity range: at least required_bytes,
/// rounded up to whole extents, at most limit_bytes; `default` when the
/// range is empty.
pub fn size(range: Option<&CapacityRange>, extent: u64, default: u64) -> Result<u64> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return invalid(format!(
            "capacity_range must not be negative (required_bytes={required}, limit_bytes={limit})"
        ));
    }
    let (required, limit) = (required as u64, limit as u64);
    if limit > 0 && required > limit {
        return invalid(format!(
            "required_bytes {required} exceeds limit_bytes {limit}"
        ));
    }
    let want = match (required, limit) {
        (0, 0) => default,
        (0, l) => default.min(l),
        (r, _) => r,
    };
    let rounded = round_up(want, extent)
        .filter(|s| *s <= i64::MAX as u64)
        .ok_or_else(|| Error::OutOfRange(format!("{want} bytes is larger than any volume")))?;
    if limit > 0 && rounded > limit {
        // Rounding up broke the limit; the largest whole-extent size under
        // the limit may still satisfy required_bytes.
        let down = limit / extent.max(1) * extent.max(1);
        if down >= required.max(1) {
            return Ok(down);
        }
        return Err(Error::OutOfRange(format!(
            "no whole number of {extent}-byte extents lies between required_bytes {required} and limit_bytes {limit}"
        )));
    }
    Ok(rounded)
}

/// mkfs.xfs refuses filesystems under 300 MB. A thin volume costs only
/// what is written, so an xfs volume is raised to that minimum, unless
/// limit_bytes forbids it (OUT_OF_RANGE).
pub const XFS_MIN_BYTES: u64 = 300 * 1000 * 1000;

pub fn fs_minimum(
    access: Option<&Access>,
    size: u64,
    range: Option<&CapacityRange>,
    extent: u64,
) -> Result<u64> {
    let min = match access {
        Some(Access::Mount { fs_type }) if fs_type == "xfs" => XFS_MIN_BYTES,
        _ => return Ok(size),
    };
    if size >= min {
        return Ok(size);
    }
    let raised = round_up(min, extent).unwrap_or(min);
    match range.map(|r| r.limit_bytes) {
        Some(limit) if limit > 0 && raised > limit as u64 => Err(Error::OutOfRange(format!(
            "xfs needs at least {min} bytes, but limit_bytes is {limit}"
        ))),
        _ => Ok(raised),
    }
}

/// True when a volume of size `have` satisfies the range.
pub fn size_fits(range: Option<&CapacityRange>, have: u64) -> bool {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    have >= required.max(0) as u64 && (limit <= 0 || have <= limit as u64)
}

/// Whether a topology segment describes this node: every key in it must be
/// ours and carry our node id.
pub fn segment_is_ours(segments: &HashMap<String, String>, key: &str, node: &str) -> bool {
    !segments.is_empty() && segments.iter().all(|(k, v)| k == key && v == node)
}

/// CreateVolume: a requisite topology must include this node.
pub fn topology_allows(req: Option<&TopologyRequirement>, key: &str, node: &str) -> bool {
    match req {
        None => true,
        Some(r) if r.requisite.is_empty() && r.preferred.is_empty() => true,
        Some(r) => r
            .requisite
            .iter()
            .chain(r.preferred.iter())
            .any(|t| segment_is_ours(&t.segments, key, node)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn sizes_round_to_extents_within_limits() {
        let e = 4u64 << 20;
        let r = |req: i64, lim: i64| CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        };
        assert_eq!(size(None, e, 1 << 30).unwrap(), 1 << 30);
        assert_eq!(size(Some(&r(1, 0)), e, 1 << 30).unwrap(), e);
        assert_eq!(size(Some(&r(0, 10 << 20)), e, 1 << 30).unwrap(), 8 << 20);
        assert_eq!(
            size(Some(&r(5 << 20, 10 << 20)), e, 1 << 30).unwrap(),
            8 << 20
        );
        assert!(matches!(
            size(Some(&r(5 << 20, 6 << 20)), e, 0),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(
            size(Some(&r(-1, 0)), e, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            size(Some(&r(0, -5)), e, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            size(Some(&r(10, 5)), e, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            size(Some(&r(i64::MAX, 0)), e, 0),
            Err(Error::OutOfRange(_))
        ));
        assert!(size_fits(Some(&r(5, 0)), 8));
        assert!(!size_fits(Some(&r(9, 0)), 8));
        assert!(!size_fits(Some(&r(1, 4)), 8));
        assert!(size_fits(None, 8));
    }

    #[test]
    fn xfs_volumes_are_raised_to_its_minimum() {
        let xfs = Access::Mount {
            fs_type: "xfs".into(),
        };
        let ext4 = Access::Mount {
            fs_type: "ext4".into(),
        };
        let e = 4 << 20;
        assert_eq!(fs_minimum(Some(&ext4), e, None, e).unwrap(), e);
        assert_eq!(fs_minimum(Some(&Access::Block), e, None, e).unwrap(), e);
        let raised = fs_minimum(Some(&xfs), e, None, e).unwrap();
        assert!(raised >= XFS_MIN_BYTES && raised % e == 0 && raised - XFS_MIN_BYTES < e);
        assert_eq!(fs_minimum(Some(&xfs), 1 << 30, None, e).unwrap(), 1 << 30);
        let tight = CapacityRange {
            required_bytes: 1,
            limit_bytes: 100 << 20,
        };
        assert!(matches!(
            fs_minimum(Some(&xfs), e, Some(&tight), e),
            Err(Error::OutOfRange(_))
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
        assert_eq!(volume_id(&id).unwrap(), Some(id.as_str()));
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
    }
}
