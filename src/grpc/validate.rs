//! Request validation shared by the gRPC services. Everything a CO sends is
//! checked here before any LVM or node work starts, so a bad request is
//! answered with INVALID_ARGUMENT (or the code the spec names) and nothing
//! is touched.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::config::FS_TYPES;
use crate::error::{Error, Result};
use crate::fs_options;
use crate::naming::{self, Access, ContentSource, NodeIds, MAX_STRING};
use crate::node::mount_options::MountOptions;
use crate::node::{cgroup, crypt, paths};
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
    bounded_string(field, value)?;
    // A CO name or id with a tab, a newline or an escape is no name a CO
    // makes (Kubernetes' never have one); it could only mislead whoever
    // reads it back (`lvs`, logs, `tpcsi list`).
    if value.chars().any(char::is_control) {
        return invalid(format!("{field} contains control characters"));
    }
    Ok(value)
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
///
/// An id may carry this node's key (`naming::NodeIds`), which is taken
/// off; one with another node's key names nothing here (`Ok(None)`).
pub fn volume_id(id: &str, ids: &NodeIds) -> Result<Option<VolumeId>> {
    required_string("volume_id", id)?;
    super::observe::note_volume_id(id);
    Ok(ids
        .local(id)
        .filter(|id| naming::is_volume_id(id))
        .map(|id| VolumeId::new_unchecked(id.to_string())))
}

/// FAILED_PRECONDITION for an id with another node's key in a call that
/// removes what it names: "not here" must not become "gone, OK" (the
/// object is on that node; the caller sent the call to the wrong one).
pub fn not_elsewhere(field: &str, id: &str, ids: &NodeIds) -> Result<()> {
    match ids.foreign(id) {
        None => Ok(()),
        Some(key) => Err(Error::FailedPrecondition(format!(
            "{field} {id:?} is on the node of key {key}, not on this node (key {}): nothing was removed",
            ids.key()
        ))
        .advise("send the call to the node that holds it (the cluster's controller does)")),
    }
}

/// A volume id that must name one of ours; anything else is NOT_FOUND.
pub fn existing_volume_id(id: &str, ids: &NodeIds) -> Result<VolumeId> {
    known_volume(volume_id(id, ids)?, id)
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
/// Node keys as [`volume_id`] reads them.
pub fn snapshot_id(field: &str, id: &str, ids: &NodeIds) -> Result<Option<SnapshotId>> {
    required_string(field, id)?;
    super::observe::note_snapshot_id(id);
    Ok(ids
        .local(id)
        .filter(|id| naming::is_snapshot_id(id))
        .map(|id| SnapshotId::new_unchecked(id.to_string())))
}

/// CreateVolume's content source: a snapshot or a volume of ours. An id of
/// another shape names nothing that exists: NOT_FOUND.
pub fn content_source(
    src: Option<&VolumeContentSource>,
    ids: &NodeIds,
) -> Result<Option<ContentSource>> {
    let Some(src) = src else {
        return Ok(None);
    };
    match &src.r#type {
        None => invalid("volume_content_source names neither a snapshot nor a volume"),
        Some(SourceType::Snapshot(s)) => match snapshot_id("snapshot_id", &s.snapshot_id, ids)? {
            Some(id) => Ok(Some(ContentSource::Snapshot(id.to_string()))),
            None => Err(Error::NotFound(format!(
                "snapshot {:?} does not exist",
                s.snapshot_id
            ))),
        },
        Some(SourceType::Volume(v)) => Ok(Some(ContentSource::Volume(
            existing_volume_id(&v.volume_id, ids)?.to_string(),
        ))),
    }
}

/// A CreateVolume's content source when the controller asked this node
/// to pull a copy of it (`channel::COPY_HEADER`): a snapshot id with the
/// key of `source_node`, which is not this node; or a volume id with that
/// key and `via`, the snapshot of that node to read (a clone; none when
/// the source node gave no grant, `granted` false). As sent.
pub fn pulled_source(
    src: Option<&VolumeContentSource>,
    ids: &NodeIds,
    source_node: &str,
    via: &str,
    granted: bool,
) -> Result<Pulled> {
    let of_source = |id: &str, is: fn(&str) -> bool| of_node(id, ids, source_node, is);
    let (id, snapshot) =
        match src.and_then(|s| s.r#type.as_ref()) {
            Some(SourceType::Snapshot(s)) => (s.snapshot_id.as_str(), true),
            Some(SourceType::Volume(v)) => (v.volume_id.as_str(), false),
            None => return invalid(
                "a copy from another node needs a snapshot or a volume as volume_content_source",
            ),
        };
    match snapshot {
        true if of_source(id, naming::is_snapshot_id) && via.is_empty() => Ok(Pulled {
            id: id.to_string(),
            via: None,
        }),
        true => invalid(format!(
            "snapshot {id:?} is no snapshot id of node {source_node:?}, the node to copy from"
        )),
        false if !of_source(id, naming::is_volume_id) => invalid(format!(
            "volume {id:?} is no volume id of node {source_node:?}, the node to copy from"
        )),
        // The source node gave no grant, so no snapshot to read: the
        // target answers a clone it made whole, else the source's error.
        false if via.is_empty() && !granted => Ok(Pulled {
            id: id.to_string(),
            via: None,
        }),
        false if !of_source(via, naming::is_snapshot_id) => invalid(format!(
            "the snapshot to read for a clone of {id:?}, {via:?}, is no snapshot id of node {source_node:?}"
        )),
        false => Ok(Pulled {
            id: id.to_string(),
            via: Some(via.to_string()),
        }),
    }
}

/// Whether `id` carries the key of `node`, which is not this node, and
/// is of the shape `is` takes.
fn of_node(id: &str, ids: &NodeIds, node: &str, is: fn(&str) -> bool) -> bool {
    match naming::split_node(id) {
        (Some(key), rest) => ids.foreign(id).is_some() && key == naming::node_key(node) && is(rest),
        _ => false,
    }
}

/// The base of a move's round (`CopyFrom.base_snapshot_id`): empty, or a
/// snapshot id of `source_node`, as the snapshot pulled.
pub fn pulled_base<'a>(base: &'a str, ids: &NodeIds, source_node: &str) -> Result<Option<&'a str>> {
    match base {
        "" => Ok(None),
        b if of_node(b, ids, source_node, naming::is_snapshot_id) => Ok(Some(b)),
        b => invalid(format!(
            "base snapshot {b:?} is no snapshot id of node {source_node:?}, the node to copy from"
        )),
    }
}

/// What a copy from another node pulls: `id`, the content source (a
/// snapshot, or the volume a clone is of), and for a clone `via`, the
/// snapshot the source node took of the volume for it, which is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    pub id: String,
    pub via: Option<String>,
}

/// The parameters of CreateSnapshot or CreateVolumeGroupSnapshot: this
/// driver takes none, so only what csi-snapshotter adds to that call
/// ([`SIDECAR_KEYS`]) may be there, and it is ignored.
pub fn snapshot_parameters(carrier: Carrier, params: &HashMap<String, String>) -> Result<()> {
    map_size(params)?;
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        sidecar_key_in(carrier, key).unwrap_or_else(|| {
            invalid(format!(
                "unknown snapshot parameter {key:?}: this driver takes no snapshot parameters"
            ))
        })?;
    }
    Ok(())
}

/// Mutable parameters (CreateVolume's, `Carrier::CreateVolumeMutable`;
/// ControllerModifyVolume's, `Carrier::ControllerModifyVolume`): only
/// `readAheadSectors`, as `auto` or a multiple of 8 sectors up to 1 GiB'
/// worth; a creation parameter is immutable. What a sidecar adds to that
/// call ([`SIDECAR_KEYS`]: external-resizer's PVC and PV names) is
/// ignored and not returned, so it is never stored or reported back.
/// Values come back canonical.
pub fn mutable_parameters(
    carrier: Carrier,
    params: &HashMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    use crate::volume::controller::READ_AHEAD;
    map_size(params)?;
    let mut out = BTreeMap::new();
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        let value = &params[key];
        if let Some(ignored) = sidecar_key_in(carrier, key) {
            ignored?;
            continue;
        }
        if let Some(limit) = io_limit(key, value) {
            out.insert(key.clone(), limit?);
            continue;
        }
        if key != READ_AHEAD {
            let known: Vec<&str> = std::iter::once(READ_AHEAD)
                .chain(cgroup::KEYS.iter().map(|(k, _)| *k))
                .collect();
            return invalid(if PARAMETERS.iter().any(|(k, _)| k == key) {
                format!("parameter {key:?} is set at creation and cannot be modified")
            } else {
                format!("unknown mutable parameter {key:?} (known: {known:?})")
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
/// A listing's `max_entries`, and its token as an id within this node
/// (without this node's key; "" for the first page). A token of another
/// node, or of no shape `issued` accepts, is ABORTED.
pub fn page<'a>(
    max_entries: i32,
    token: &'a str,
    issued: fn(&str) -> bool,
    ids: &NodeIds,
) -> Result<(usize, &'a str)> {
    if max_entries < 0 {
        return invalid("max_entries must not be negative");
    }
    let local = match token {
        "" => Some(""),
        t => ids.local(t).filter(|t| issued(t)),
    };
    let Some(local) = local else {
        return Err(Error::Aborted(format!(
            "starting_token {token:?} was not issued by this driver"
        ))
        .advise("start the listing again with an empty starting_token"));
    };
    Ok((max_entries as usize, local))
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
                fs_options::mount_word(fs, flag).map_err(|why| {
                    Error::InvalidArgument(why).advise(format!(
                        "use only the mount options docs/configuration.md lists for {fs}"
                    ))
                })?;
            }
            Ok(Access::Mount {
                fs_type: fs.to_string(),
            })
        }
    }
}

/// One mount flag: a single option, a word or `key=value`, with no way
/// to smuggle a second option (`,`) or anything non-printable. Which words
/// and values are accepted is `fs_options`' allow-list.
pub fn mount_flag(flag: &str) -> Result<&str> {
    let ok = !flag.is_empty()
        && flag.len() <= 64
        && flag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-=".contains(&b));
    if ok {
        Ok(flag)
    } else {
        invalid(format!(
            "mount flag {flag:?} is not a single option (a word or key=value: letters, digits, '_', '-')"
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

/// The request field a parameter map came in. It decides which of the
/// sidecars' reserved keys ([`SIDECAR_KEYS`]) may be in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// GetCapacity's parameters.
    GetCapacity,
    /// CreateVolume's parameters (ValidateVolumeCapabilities checks its
    /// `parameters` by the same rule: they are CreateVolume's).
    CreateVolume,
    /// CreateVolume's mutable_parameters: a VolumeAttributesClass's
    /// parameters, which external-provisioner passes unchanged.
    CreateVolumeMutable,
    /// CreateSnapshot's parameters.
    CreateSnapshot,
    /// CreateVolumeGroupSnapshot's parameters.
    CreateVolumeGroupSnapshot,
    /// ControllerModifyVolume's mutable_parameters.
    ControllerModifyVolume,
}

impl Carrier {
    fn call(self) -> &'static str {
        match self {
            Carrier::GetCapacity => "GetCapacity",
            Carrier::CreateVolume => "CreateVolume",
            Carrier::CreateVolumeMutable => "CreateVolume's mutable_parameters",
            Carrier::CreateSnapshot => "CreateSnapshot",
            Carrier::CreateVolumeGroupSnapshot => "CreateVolumeGroupSnapshot",
            Carrier::ControllerModifyVolume => "ControllerModifyVolume",
        }
    }
}

/// A key a Kubernetes sidecar reserves in the parameter maps it reads or
/// sends: which sidecar, what it does with the key, and the maps it
/// reaches this driver in.
#[derive(Debug)]
pub struct SidecarKey {
    pub key: &'static str,
    /// Matched ignoring case (external-provisioner lower-cases `fstype`).
    pub any_case: bool,
    pub sidecar: &'static str,
    pub does: &'static str,
    pub sent_in: &'static [Carrier],
}

impl SidecarKey {
    fn matches(&self, key: &str) -> bool {
        self.key == key || (self.any_case && key.to_lowercase() == self.key)
    }
}

/// The PVC and PV names external-provisioner's `--extra-create-metadata`
/// adds to CreateVolume's parameters (kept in the LV's tags, see
/// [`PARAMETERS`]) and external-resizer's `--extra-modify-metadata` adds
/// to ControllerModifyVolume's mutable parameters (ignored there).
pub const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME: &str = "csi.storage.k8s.io/pv/name";

/// Every key the sidecars this deployment runs reserve in a parameter map,
/// read from their sources at the pinned versions: external-provisioner
/// v6.3.0 (`prepareProvision`, `removePrefixedParameters`, the capacity
/// controller's `syncCapacity`), csi-snapshotter v8.6.0
/// (`RemovePrefixedParameters`, the `--extra-create-metadata` keys of
/// snapshots and group snapshots), external-resizer v2.2
/// (`--extra-modify-metadata`). A key is ignored in the maps its `sent_in`
/// names (the sidecar acted on it already, or it is only metadata) and
/// refused, saying why, in any other: no sidecar puts it there, and a
/// caller that does expects an effect this driver does not give.
///
/// The choice for CreateVolume: the provisioner strips the
/// `csi.storage.k8s.io/` keys it reads (fs type, secrets) before
/// CreateVolume, so a CreateVolume that carries one did not come through
/// it, and its caller believes the driver reads the fs type or a secret
/// from there: refused (the fs type is the volume capability's). The
/// deprecated un-prefixed spellings (`fstype` in any case,
/// `csiProvisionerSecretName`, ...) are read by the provisioner and passed
/// on unchanged, to CreateVolume too: accepted and ignored there, since
/// the provisioner has put their effect in the capability and the secrets.
pub const SIDECAR_KEYS: &[SidecarKey] = &[
    stripped("csi.storage.k8s.io/fstype"),
    stripped("csi.storage.k8s.io/secret-name"),
    stripped("csi.storage.k8s.io/secret-namespace"),
    stripped("csi.storage.k8s.io/provisioner-secret-name"),
    stripped("csi.storage.k8s.io/provisioner-secret-namespace"),
    stripped("csi.storage.k8s.io/controller-publish-secret-name"),
    stripped("csi.storage.k8s.io/controller-publish-secret-namespace"),
    stripped("csi.storage.k8s.io/node-stage-secret-name"),
    stripped("csi.storage.k8s.io/node-stage-secret-namespace"),
    stripped("csi.storage.k8s.io/node-publish-secret-name"),
    stripped("csi.storage.k8s.io/node-publish-secret-namespace"),
    stripped("csi.storage.k8s.io/controller-expand-secret-name"),
    stripped("csi.storage.k8s.io/controller-expand-secret-namespace"),
    stripped("csi.storage.k8s.io/node-expand-secret-name"),
    stripped("csi.storage.k8s.io/node-expand-secret-namespace"),
    // `strings.ToLower(k) == "fstype"`: any case.
    SidecarKey {
        any_case: true,
        ..passed("fstype")
    },
    passed("csiProvisionerSecretName"),
    passed("csiProvisionerSecretNamespace"),
    passed("csiControllerPublishSecretName"),
    passed("csiControllerPublishSecretNamespace"),
    passed("csiNodeStageSecretName"),
    passed("csiNodeStageSecretNamespace"),
    passed("csiNodePublishSecretName"),
    passed("csiNodePublishSecretNamespace"),
    metadata(PVC_NAME),
    metadata(PVC_NAMESPACE),
    metadata(PV_NAME),
    snapshot("csi.storage.k8s.io/volumesnapshot/name"),
    snapshot("csi.storage.k8s.io/volumesnapshot/namespace"),
    snapshot("csi.storage.k8s.io/volumesnapshotcontent/name"),
    group_snapshot("csi.storage.k8s.io/volumegroupsnapshot/name"),
    group_snapshot("csi.storage.k8s.io/volumegroupsnapshot/namespace"),
    group_snapshot("csi.storage.k8s.io/volumegroupsnapshotcontent/name"),
    snapshot_secret("csi.storage.k8s.io/snapshotter-secret-name"),
    snapshot_secret("csi.storage.k8s.io/snapshotter-secret-namespace"),
    snapshot_secret("csi.storage.k8s.io/snapshotter-list-secret-name"),
    snapshot_secret("csi.storage.k8s.io/snapshotter-list-secret-namespace"),
    snapshot_secret("csi.storage.k8s.io/group-snapshotter-secret-name"),
    snapshot_secret("csi.storage.k8s.io/group-snapshotter-secret-namespace"),
];

const PROVISIONER: &str = "external-provisioner v6.3.0";
const SNAPSHOTTER: &str = "csi-snapshotter v8.6.0";

/// external-provisioner reads it and strips it before CreateVolume; its
/// capacity controller sends the StorageClass's parameters to GetCapacity
/// unchanged.
const fn stripped(key: &'static str) -> SidecarKey {
    SidecarKey {
        key,
        any_case: false,
        sidecar: PROVISIONER,
        does: "reads it (the volume capability's fs type, the secrets of the calls and the PV's \
               secret references) and removes it before CreateVolume, while its capacity \
               controller sends the StorageClass's parameters to GetCapacity unchanged",
        sent_in: &[Carrier::GetCapacity],
    }
}

/// A deprecated spelling external-provisioner reads and passes on.
const fn passed(key: &'static str) -> SidecarKey {
    SidecarKey {
        does: "reads it (a deprecated spelling: the volume capability's fs type, the secrets) \
               and passes it on unchanged, to GetCapacity and CreateVolume",
        sent_in: &[Carrier::GetCapacity, Carrier::CreateVolume],
        ..stripped(key)
    }
}

/// The PVC's and PV's names, added by external-provisioner with
/// `--extra-create-metadata` to CreateVolume (and to GetCapacity when it
/// provisions an Immediate claim on a node) and by external-resizer with
/// `--extra-modify-metadata` to ControllerModifyVolume's mutable
/// parameters.
const fn metadata(key: &'static str) -> SidecarKey {
    SidecarKey {
        key,
        any_case: false,
        sidecar: "external-provisioner v6.3.0 (--extra-create-metadata) and external-resizer \
                  v2.2 (--extra-modify-metadata)",
        does: "adds it (the PVC's name and namespace, the PV's name) to CreateVolume's \
               parameters and ControllerModifyVolume's mutable parameters",
        sent_in: &[
            Carrier::GetCapacity,
            Carrier::CreateVolume,
            Carrier::ControllerModifyVolume,
        ],
    }
}

/// Added by csi-snapshotter with `--extra-create-metadata` to CreateSnapshot.
const fn snapshot(key: &'static str) -> SidecarKey {
    SidecarKey {
        key,
        any_case: false,
        sidecar: SNAPSHOTTER,
        does: "adds it with --extra-create-metadata (the VolumeSnapshot's name and namespace, \
               its content's name) to CreateSnapshot",
        sent_in: &[Carrier::CreateSnapshot],
    }
}

/// Added by csi-snapshotter with `--extra-create-metadata` to
/// CreateVolumeGroupSnapshot.
const fn group_snapshot(key: &'static str) -> SidecarKey {
    SidecarKey {
        does: "adds it with --extra-create-metadata (the VolumeGroupSnapshot's name and \
               namespace, its content's name) to CreateVolumeGroupSnapshot",
        sent_in: &[Carrier::CreateVolumeGroupSnapshot],
        ..snapshot(key)
    }
}

/// A secret key of the snapshot classes: csi-snapshotter reads it and
/// strips it, so it never reaches the driver.
const fn snapshot_secret(key: &'static str) -> SidecarKey {
    SidecarKey {
        does: "reads it (the secrets of the snapshot calls) and removes it before it calls the \
               driver",
        sent_in: &[],
        ..snapshot(key)
    }
}

/// `None` when `key` is no sidecar's; `Some(Ok)` when the sidecar that
/// reserves it sends it in `carrier`'s map (ignore it); `Some(Err)`, saying
/// why, when it does not.
fn sidecar_key_in(carrier: Carrier, key: &str) -> Option<Result<()>> {
    let k = SIDECAR_KEYS.iter().find(|k| k.matches(key))?;
    if k.sent_in.contains(&carrier) {
        return Some(Ok(()));
    }
    Some(Err(Error::InvalidArgument(format!(
        "parameter {key:?} is reserved by {}, which {}; it never sends it in {}, and this driver does not read it there",
        k.sidecar,
        k.does,
        carrier.call()
    ))
    .advise(format!(
        "leave {key:?} out of {}{}",
        carrier.call(),
        if carrier == Carrier::CreateVolume && key.to_lowercase().ends_with("fstype") {
            ": the filesystem is the volume capability's mount.fs_type"
        } else {
            ""
        }
    ))))
}

/// Parameters that mean nothing to this driver and are ignored, bounded
/// only by CSI's 4 KiB: ControllerReclaimSpace's. The csi-addons
/// controller fills them from the PV's volume attributes (the provisioner
/// identity, fsType, readAheadSectors) or from a CSIAddonsJob's own
/// key-value list, so no key set can be known in advance.
pub fn opaque_parameters(params: &HashMap<String, String>) -> Result<()> {
    map_size(params)
}

/// CSI bounds a map to 4 KiB.
fn map_size(params: &HashMap<String, String>) -> Result<()> {
    let total: usize = params.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > 4096 {
        return invalid(format!(
            "parameters are {total} bytes; CSI limits a map to 4 KiB"
        ));
    }
    Ok(())
}

/// The StorageClass parameter that picks a device class
/// (`volume::classes`); checked against the class the id or the request
/// went to, and not kept in tags (the id carries the class).
pub const DEVICE_CLASS: &str = "deviceClass";

/// The device class a StorageClass's parameters name, if any.
pub fn device_class(params: &HashMap<String, String>) -> Result<Option<&str>> {
    match params.get(DEVICE_CLASS) {
        None => Ok(None),
        Some(v) => {
            bounded_string(&format!("parameter {DEVICE_CLASS}"), v)?;
            Ok(Some(v.as_str()))
        }
    }
}

/// What GetCapacity's validation reads of one device class of a node.
#[derive(Debug, Clone, Copy)]
pub struct ClassShape<'a> {
    pub name: &'a str,
    pub vg: &'a str,
    pub pool: &'a str,
    pub default_fs_type: &'a str,
}

/// What a valid GetCapacity asks of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityAsk {
    /// The topology names another node: 0, and no volume fits.
    Elsewhere,
    /// The figures of the class at this index.
    Class(usize),
}

/// GetCapacity's request against a node's `classes` (`default`: the index
/// of default_device_class), whose segments are `topology_key` =
/// `node_id`. The node plugin and the cluster's controller (answering
/// from a node's capacity it keeps) both decide here, so both refuse the
/// same requests with the same words.
///
/// external-provisioner's capacity controller sends no capability and
/// the StorageClass's parameters as they are, reserved
/// `csi.storage.k8s.io/` keys included (`SIDECAR_KEYS`), once per
/// StorageClass: so each class gets its own CSIStorageCapacity objects.
pub fn capacity_ask(
    req: &crate::proto::csi::v1::GetCapacityRequest,
    classes: &[ClassShape],
    default: usize,
    topology_key: &str,
    node_id: &str,
) -> Result<CapacityAsk> {
    let index = match device_class(&req.parameters)? {
        None => default,
        Some(name) => classes.iter().position(|c| c.name == name).ok_or_else(|| {
            crate::volume::classes::unknown_class(
                name,
                &classes.iter().map(|c| c.name).collect::<Vec<_>>(),
            )
        })?,
    };
    let class = classes
        .get(index)
        .ok_or_else(|| Error::Internal(format!("no device class at index {index}")))?;
    for cap in &req.volume_capabilities {
        capability(cap, class.default_fs_type)?;
    }
    class_parameters(
        Carrier::GetCapacity,
        &req.parameters,
        class.name,
        class.vg,
        class.pool,
    )?;
    match &req.accessible_topology {
        Some(t) if !segment_is_ours(&t.segments, topology_key, node_id) => {
            Ok(CapacityAsk::Elsewhere)
        }
        _ => Ok(CapacityAsk::Class(index)),
    }
}

/// An I/O limit (`node::cgroup::KEYS`), when `key` is one: its value,
/// checked and canonical.
fn io_limit(key: &str, value: &str) -> Option<Result<String>> {
    cgroup::KEYS.iter().find(|(k, _)| *k == key)?;
    Some(
        cgroup::parse_value(value)
            .map(|v| v.map_or("max".to_string(), |n| n.to_string()))
            .map_err(|why| Error::InvalidArgument(format!("parameter {key}: {why}"))),
    )
}

/// The I/O limits among a StorageClass's parameters, checked: CreateVolume
/// stores them with the volume's mutable parameters (which win where both
/// set one), so a later ControllerModifyVolume changes them.
pub fn io_limits(params: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (k, v) in params {
        if let Some(limit) = io_limit(k, v) {
            out.insert(k.clone(), limit?);
        }
    }
    Ok(out)
}

/// The StorageClass parameter that encrypts a volume (`"true"`) or not
/// (`"false"`) whatever its class's `encryption.enabled` says; kept as
/// the volume's `tpcsi.crypt` tag, not as a parameter.
pub const ENCRYPTED: &str = "encrypted";

/// The `encrypted` parameter, if given: `"true"` or `"false"`.
pub fn encrypted(params: &HashMap<String, String>) -> Result<Option<bool>> {
    match params.get(ENCRYPTED).map(String::as_str) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => invalid(format!(
            "parameter {ENCRYPTED}={other:?} must be \"true\" or \"false\""
        )),
    }
}

/// The passphrases among a call's secrets (`node::crypt::PASSPHRASE_KEY`
/// and, optionally, `PREVIOUS_PASSPHRASE_KEY`); `None` when there is no
/// `passphrase`. An empty or over-long one is INVALID_ARGUMENT, naming
/// the key and never the value.
pub fn passphrases(secrets: &HashMap<String, String>) -> Result<Option<crypt::Keys>> {
    let one = |key: &str| -> Result<Option<crypt::Secret>> {
        match secrets.get(key) {
            None => Ok(None),
            Some(v) if v.is_empty() || v.len() > MAX_PASSPHRASE => invalid(format!(
                "secret {key:?} must hold 1 to {MAX_PASSPHRASE} bytes (it holds {})",
                v.len()
            )),
            Some(v) => Ok(Some(crypt::Secret::new(v.as_bytes()))),
        }
    };
    let Some(current) = one(crypt::PASSPHRASE_KEY)? else {
        return Ok(None);
    };
    Ok(Some(crypt::Keys {
        current,
        previous: one(crypt::PREVIOUS_PASSPHRASE_KEY)?,
        next: one(crypt::NEXT_PASSPHRASE_KEY)?,
    }))
}

/// EncryptionKeyRotate's keys: the current passphrase (the secrets'
/// `passphrase`), and the new one: `encryption_key` when the call gives
/// one, else the secrets' `nextPassphrase`. The csi-addons sidecar
/// (kubernetes-csi-addons, internal/sidecar/service/encryptionkeyrotation.go)
/// sends the PV's node-stage Secret as `secrets` and never sets
/// `encryption_key`, so a Secret holding `nextPassphrase` is how a
/// Kubernetes rotation says where to go. Missing either, or a new key
/// equal to the current one, is INVALID_ARGUMENT naming the key.
pub fn rotation_keys(
    encryption_key: &str,
    secrets: &HashMap<String, String>,
) -> Result<(crypt::Secret, crypt::Secret)> {
    let keys = passphrases(secrets)?.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the secrets have no {:?}: the volume's current passphrase is needed to add the new one",
            crypt::PASSPHRASE_KEY
        ))
    })?;
    let new = match encryption_key {
        "" => keys.next.clone().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no new passphrase: encryption_key is empty and the secrets have no {:?}",
                crypt::NEXT_PASSPHRASE_KEY
            ))
            .advise(format!(
                "put the new passphrase in the volume's node-stage Secret as {:?} (or pass encryption_key), then retry",
                crypt::NEXT_PASSPHRASE_KEY
            ))
        })?,
        k if k.len() > MAX_PASSPHRASE => {
            return invalid(format!(
                "encryption_key must hold 1 to {MAX_PASSPHRASE} bytes (it holds {})",
                k.len()
            ))
        }
        k => crypt::Secret::new(k.as_bytes()),
    };
    if new == keys.current {
        return invalid(format!(
            "the new passphrase is the secrets' {:?} already: nothing would rotate",
            crypt::PASSPHRASE_KEY
        ));
    }
    Ok((keys.current.clone(), new))
}

/// The longest passphrase taken: cryptsetup's own bound on one typed in
/// (512 characters); a key file could be longer, but a passphrase that
/// also works typed at a console is what an operator can recover with.
pub const MAX_PASSPHRASE: usize = 512;

/// The StorageClass parameter that replaces the device class's mkfs
/// options (`fs_options`), and the short name it is kept under.
pub const MKFS_OPTIONS: &str = "mkfsOptions";
pub const MKFS: &str = naming::PARAM_MKFS;

/// The StorageClass parameters this driver understands, with the short
/// names they are stored under in LVM tags.
pub const PARAMETERS: &[(&str, &str)] = &[
    (DEVICE_CLASS, "class"),
    (MKFS_OPTIONS, MKFS),
    ("volumeGroup", "vg"),
    ("thinPool", "pool"),
    (PVC_NAME, "pvcname"),
    (PVC_NAMESPACE, "pvcns"),
    (PV_NAME, "pvname"),
];

/// CreateVolume's parameters (see [`class_parameters`]), for a volume
/// consumed as `access`: `mkfsOptions` must be on the lists of its
/// filesystem, and is dropped for a raw block volume, which is never
/// formatted (one StorageClass may serve both kinds of claim).
pub fn parameters(
    params: &HashMap<String, String>,
    class: &str,
    vg: &str,
    pool: &str,
    access: &Access,
) -> Result<BTreeMap<String, String>> {
    let mut out = class_parameters(Carrier::CreateVolume, params, class, vg, pool)?;
    if let (Access::Mount { fs_type }, Some(text)) = (access, out.remove(MKFS)) {
        let opts = fs_options::mkfs_options(fs_type, &text).map_err(|why| {
            Error::InvalidArgument(format!("parameter {MKFS_OPTIONS}: {why}")).advise(format!(
                "give {MKFS_OPTIONS} only options the lists in docs/configuration.md allow for {fs_type}"
            ))
        })?;
        out.insert(MKFS.to_string(), opts.text());
    }
    Ok(out)
}

/// Checks the StorageClass parameters of GetCapacity or CreateVolume:
/// known keys ([`PARAMETERS`]) within CSI's size limits, with a volume
/// group and pool (when named) that are the ones this driver serves, and
/// the sidecar keys that reach `carrier` ([`SIDECAR_KEYS`]), ignored. Any
/// other key is INVALID_ARGUMENT, named. Returns the known ones keyed by
/// their short names, for CreateVolume to keep in the LV's tags.
pub fn class_parameters(
    carrier: Carrier,
    params: &HashMap<String, String>,
    class: &str,
    vg: &str,
    pool: &str,
) -> Result<BTreeMap<String, String>> {
    map_size(params)?;
    let mut out = BTreeMap::new();
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        let value = &params[key];
        if let Some(limit) = io_limit(key, value) {
            // Checked here; CreateVolume keeps it with the mutable
            // parameters (`io_limits`), so ModifyVolume can change it.
            limit?;
            continue;
        }
        if key == ENCRYPTED {
            // Checked here; CreateVolume takes it as `encrypted`.
            encrypted(params)?;
            continue;
        }
        let Some((_, short)) = PARAMETERS.iter().find(|(k, _)| k == key) else {
            if let Some(ignored) = sidecar_key_in(carrier, key) {
                ignored?;
                continue;
            }
            let known: Vec<&str> = PARAMETERS
                .iter()
                .map(|(k, _)| *k)
                .chain([ENCRYPTED])
                .collect();
            return invalid(format!("unknown parameter {key:?} (known: {known:?})"));
        };
        bounded_string(&format!("parameter {key}"), value)?;
        let expected = match *short {
            "class" => Some(class),
            "vg" => Some(vg),
            "pool" => Some(pool),
            _ => None,
        };
        if let Some(expected) = expected {
            if value != expected {
                return invalid(format!(
                    "parameter {key}={value:?} does not match device class {class:?}'s {expected:?}"
                ));
            }
        }
        if *short != "class" {
            out.insert(short.to_string(), value.clone());
        }
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
    fn a_pulled_copy_names_a_snapshot_or_a_volume_of_its_source_node() {
        use crate::proto::csi::v1::volume_content_source::{SnapshotSource, VolumeSource};
        let here = NodeIds::new("n1", true);
        let snap = naming::snapshot_lv_name_for("s1");
        let vol = naming::lv_name_for("v1");
        let src = |id: String| VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource { snapshot_id: id })),
        };
        let vsrc = |id: String| VolumeContentSource {
            r#type: Some(SourceType::Volume(VolumeSource { volume_id: id })),
        };
        let n2 = |id: &str| naming::with_node(&naming::node_key("n2"), id);
        let of_n2 = n2(&snap);
        assert_eq!(
            pulled_source(Some(&src(of_n2.clone())), &here, "n2", "", true).unwrap(),
            Pulled {
                id: of_n2.clone(),
                via: None
            }
        );
        for (id, node) in [
            (of_n2.clone(), "n3"),                                     // another node's key
            (naming::with_node(&naming::node_key("n1"), &snap), "n1"), // this node's own
            (snap.clone(), "n2"),                                      // no key
            (n2("csi-x"), "n2"),                                       // no snapshot
        ] {
            let e = pulled_source(Some(&src(id.clone())), &here, node, "", true).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id} {node}");
        }
        // A restore reads its own snapshot, never another.
        assert!(pulled_source(Some(&src(of_n2.clone())), &here, "n2", &of_n2, true).is_err());
        // A clone: the volume and the snapshot to read, both of n2.
        let v2 = n2(&vol);
        assert_eq!(
            pulled_source(Some(&vsrc(v2.clone())), &here, "n2", &of_n2, true).unwrap(),
            Pulled {
                id: v2.clone(),
                via: Some(of_n2.clone())
            }
        );
        for (id, via) in [
            (v2.clone(), String::new()), // nothing to read
            (v2.clone(), snap.clone()),  // a snapshot without key
            (
                v2.clone(),
                naming::with_node(&naming::node_key("n3"), &snap),
            ), // of another node
            (v2.clone(), v2.clone()),    // a volume to read
            (n2(&snap), of_n2.clone()),  // no volume
        ] {
            let e = pulled_source(Some(&vsrc(id.clone())), &here, "n2", &via, true).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id} {via}");
        }
        assert!(pulled_source(None, &here, "n2", "", true).is_err());
        // No grant: a clone names no snapshot to read, and is still one.
        assert_eq!(
            pulled_source(Some(&vsrc(v2.clone())), &here, "n2", "", false).unwrap(),
            Pulled {
                id: v2.clone(),
                via: None
            }
        );
        // A move's base: a snapshot of the same node, or none.
        assert_eq!(pulled_base("", &here, "n2").unwrap(), None);
        assert_eq!(
            pulled_base(&of_n2, &here, "n2").unwrap(),
            Some(of_n2.as_str())
        );
        for b in [snap.clone(), v2.clone(), n2("x")] {
            assert!(pulled_base(&b, &here, "n2").is_err(), "{b}");
        }
        assert!(pulled_base(&of_n2, &here, "n3").is_err());
    }

    /// A node that is not serving a cluster: ids go out without a key.
    fn ids() -> NodeIds {
        NodeIds::new("node-1", false)
    }

    #[test]
    fn an_unknown_id_is_not_found_only_after_the_rest_passed() {
        let foreign = volume_id("fake-vol-id", &ids()).unwrap();
        assert!(foreign.is_none(), "well formed, never issued");
        assert!(matches!(
            known_volume(foreign, "fake-vol-id"),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            volume_id("", &ids()),
            Err(Error::InvalidArgument(_))
        ));
    }

    /// Names and ids: present, at most 128 bytes, no control character
    /// (CreateVolume once took a name of one tab).
    #[test]
    fn names_and_ids_refuse_control_characters() {
        for bad in ["\t", "\u{b}", "pvc-1\n", "a\u{1b}[31mb", "\0"] {
            for (field, r) in [
                ("name", required_string("name", bad).map(drop)),
                ("volume_id", volume_id(bad, &ids()).map(drop)),
                (
                    "snapshot_id",
                    snapshot_id("snapshot_id", bad, &ids()).map(drop),
                ),
            ] {
                let e = r.unwrap_err();
                assert!(
                    matches!(e, Error::InvalidArgument(_)),
                    "{field} {bad:?}: {e:?}"
                );
                assert!(e.to_string().contains("control characters"), "{e}");
            }
        }
        assert!(required_string("name", "").is_err());
        assert!(required_string("name", &"n".repeat(129)).is_err());
        assert_eq!(
            required_string("name", "pvc-1 ünïcode").unwrap(),
            "pvc-1 ünïcode"
        );
    }

    #[test]
    fn mutable_parameters_take_read_ahead_only() {
        let m = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        let modify = Carrier::ControllerModifyVolume;
        let ok = mutable_parameters(modify, &m("readAheadSectors", "0512")).unwrap();
        assert_eq!(ok["readAheadSectors"], "512");
        assert_eq!(
            mutable_parameters(modify, &m("readAheadSectors", "auto")).unwrap()["readAheadSectors"],
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
            for carrier in [modify, Carrier::CreateVolumeMutable] {
                let e = mutable_parameters(carrier, &m(k, v)).unwrap_err();
                assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}={v}");
            }
        }
        assert!(mutable_parameters(modify, &HashMap::new())
            .unwrap()
            .is_empty());
    }

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The shipped StorageClass's parameters plus every key
    /// external-provisioner v6.3.0 reserves, as its capacity controller
    /// sends them to GetCapacity (unchanged).
    fn storage_class_as_the_capacity_controller_sends_it() -> HashMap<String, String> {
        let mut p = map(&[
            ("csi.storage.k8s.io/fstype", "ext4"),
            ("volumeGroup", "vg"),
            ("thinPool", "pool"),
        ]);
        for k in SIDECAR_KEYS
            .iter()
            .filter(|k| k.sidecar == PROVISIONER && k.key != "fstype")
        {
            p.entry(k.key.to_string())
                .or_insert_with(|| "${pvc.namespace}".to_string());
        }
        p
    }

    #[test]
    fn get_capacity_takes_the_storage_class_as_the_provisioner_sends_it() {
        let mut p = storage_class_as_the_capacity_controller_sends_it();
        assert_eq!(p.len(), 3 + 14 + 8, "{p:?}");
        class_parameters(Carrier::GetCapacity, &p, "default", "vg", "pool").unwrap();
        // The deprecated fs type, in the spellings the provisioner takes;
        // and the immediate-binding path's metadata.
        for fstype in ["fstype", "fsType", "FSTYPE"] {
            let mut q = p.clone();
            q.remove("csi.storage.k8s.io/fstype");
            q.insert(fstype.into(), "xfs".into());
            class_parameters(Carrier::GetCapacity, &q, "default", "vg", "pool").unwrap();
        }
        for k in [PVC_NAME, PVC_NAMESPACE, PV_NAME] {
            p.insert(k.into(), "x".into());
        }
        class_parameters(Carrier::GetCapacity, &p, "default", "vg", "pool").unwrap();
        // Still checked: the driver's own keys, and keys nobody reserves.
        p.insert("volumeGroup".into(), "other".into());
        assert!(class_parameters(Carrier::GetCapacity, &p, "default", "vg", "pool").is_err());
        for bogus in ["csi.storage.k8s.io/bogus", "fs-type", "iops"] {
            let e = class_parameters(
                Carrier::GetCapacity,
                &map(&[(bogus, "1"), ("csi.storage.k8s.io/fstype", "ext4")]),
                "default",
                "vg",
                "pool",
            )
            .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(
                e.to_string()
                    .contains(&format!("unknown parameter {bogus:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn create_volume_takes_what_the_provisioner_leaves_and_adds() {
        // Stripped of the prefixed keys; the deprecated spellings left;
        // --extra-create-metadata added.
        let p = map(&[
            ("fsType", "ext4"),
            ("csiProvisionerSecretName", "s"),
            ("csiProvisionerSecretNamespace", "ns"),
            ("csiNodeStageSecretName", "s"),
            ("csiNodeStageSecretNamespace", "ns"),
            ("thinPool", "pool"),
            (PVC_NAME, "data"),
            (PVC_NAMESPACE, "default"),
            (PV_NAME, "pvc-1"),
        ]);
        let kept = parameters(&p, "default", "vg", "pool", &Access::Block).unwrap();
        // What the provisioner acted on is not the volume's: not kept in
        // its tags, so a retry with or without it is the same volume.
        assert_eq!(
            kept.keys().collect::<Vec<_>>(),
            ["pool", "pvcname", "pvcns", "pvname"]
        );
        // The provisioner never sends a prefixed key it reads: a caller
        // that does expects an effect, and is told.
        let e = parameters(
            &map(&[("csi.storage.k8s.io/fstype", "xfs")]),
            "default",
            "vg",
            "pool",
            &Access::Block,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let msg = e.message();
        assert!(msg.contains("\"csi.storage.k8s.io/fstype\""), "{msg}");
        assert!(msg.contains("external-provisioner v6.3.0"), "{msg}");
        assert!(msg.contains("mount.fs_type"), "{msg}");
        let e = parameters(
            &map(&[("csi.storage.k8s.io/node-stage-secret-name", "s")]),
            "default",
            "vg",
            "pool",
            &Access::Block,
        )
        .unwrap_err();
        assert!(e.to_string().contains("node-stage-secret-name"), "{e}");
        // A snapshot's metadata is not a volume's.
        assert!(parameters(
            &map(&[("csi.storage.k8s.io/volumesnapshot/name", "s")]),
            "default",
            "vg",
            "pool",
            &Access::Block
        )
        .is_err());
        // mkfsOptions: checked against the volume's filesystem, kept by
        // its canonical spelling; dropped for a block volume.
        let ext4 = Access::Mount {
            fs_type: "ext4".into(),
        };
        let mk = |v: &str| map(&[(MKFS_OPTIONS, v)]);
        let kept = parameters(&mk(" -b  4096 "), "default", "vg", "pool", &ext4).unwrap();
        assert_eq!(kept.get(MKFS).unwrap(), "-b 4096");
        assert!(
            parameters(&mk("-b 4096"), "default", "vg", "pool", &Access::Block)
                .unwrap()
                .is_empty()
        );
        for bad in ["-O ^has_journal; rm", "--", "-m reflink=0 -f", "-F"] {
            let e = parameters(&mk(bad), "default", "vg", "pool", &ext4).unwrap_err();
            assert!(
                e.code() == tonic::Code::InvalidArgument && e.to_string().contains(MKFS_OPTIONS),
                "{bad}: {e}"
            );
        }
    }

    /// Rotation keys: the current passphrase from the secrets, the new one
    /// from encryption_key or else the Secret's nextPassphrase (the
    /// sidecar's way); each refusal names its key and never a value.
    #[test]
    fn rotation_keys_come_from_the_call_or_the_secret() {
        let sec = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (cur, new) = rotation_keys("new-one", &sec(&[("passphrase", "old-one")])).unwrap();
        assert_eq!(
            (cur.bytes(), new.bytes()),
            (&b"old-one"[..], &b"new-one"[..])
        );
        let both = sec(&[("passphrase", "old-one"), ("nextPassphrase", "next-one")]);
        assert_eq!(rotation_keys("", &both).unwrap().1.bytes(), b"next-one");
        assert_eq!(rotation_keys("given", &both).unwrap().1.bytes(), b"given");
        for (key, secrets, named) in [
            ("", sec(&[("passphrase", "old-one")]), "nextPassphrase"),
            ("new-one", sec(&[]), "passphrase"),
            ("old-one", sec(&[("passphrase", "old-one")]), "already"),
            ("new-one", sec(&[("passphrase", "")]), "passphrase"),
        ] {
            let e = rotation_keys(key, &secrets).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
            assert!(e.to_string().contains(named), "{e}");
            assert!(!e.to_string().contains("old-one"), "{e}");
        }
        let long = "x".repeat(MAX_PASSPHRASE + 1);
        assert!(rotation_keys(&long, &sec(&[("passphrase", "old-one")])).is_err());
        let keys = passphrases(&both).unwrap().unwrap();
        assert_eq!(keys.each().count(), 2, "passphrase, then nextPassphrase");
    }

    #[test]
    fn each_reserved_key_is_taken_exactly_where_its_sidecar_sends_it() {
        let all = [
            Carrier::GetCapacity,
            Carrier::CreateVolume,
            Carrier::CreateVolumeMutable,
            Carrier::CreateSnapshot,
            Carrier::CreateVolumeGroupSnapshot,
            Carrier::ControllerModifyVolume,
        ];
        let check = |carrier: Carrier, p: &HashMap<String, String>| match carrier {
            Carrier::GetCapacity | Carrier::CreateVolume => {
                class_parameters(carrier, p, "default", "vg", "pool").map(|_| ())
            }
            Carrier::CreateVolumeMutable | Carrier::ControllerModifyVolume => {
                mutable_parameters(carrier, p).map(|_| ())
            }
            Carrier::CreateSnapshot | Carrier::CreateVolumeGroupSnapshot => {
                snapshot_parameters(carrier, p)
            }
        };
        let mut seen = std::collections::BTreeSet::new();
        for k in SIDECAR_KEYS {
            assert!(seen.insert(k.key.to_lowercase()), "{} twice", k.key);
            for carrier in all {
                let got = check(carrier, &map(&[(k.key, "v")]));
                if k.sent_in.contains(&carrier) {
                    assert!(got.is_ok(), "{} in {carrier:?}: {got:?}", k.key);
                } else {
                    let e = got.unwrap_err();
                    assert_eq!(e.code(), tonic::Code::InvalidArgument);
                    assert!(e.to_string().contains(&format!("{:?}", k.key)), "{e}");
                }
            }
        }
        // Nobody's key is anybody's.
        for carrier in all {
            for bogus in ["csi.storage.k8s.io/bogus", "csi.storage.k8s.io/", "x"] {
                let e = check(carrier, &map(&[(bogus, "v")])).unwrap_err();
                assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bogus}");
                assert!(e.to_string().contains(&format!("{bogus:?}")), "{e}");
            }
        }
    }

    #[test]
    fn snapshots_take_only_the_snapshotters_metadata() {
        let snap = map(&[
            ("csi.storage.k8s.io/volumesnapshot/name", "s1"),
            ("csi.storage.k8s.io/volumesnapshot/namespace", "default"),
            (
                "csi.storage.k8s.io/volumesnapshotcontent/name",
                "snapcontent-1",
            ),
        ]);
        snapshot_parameters(Carrier::CreateSnapshot, &snap).unwrap();
        assert!(snapshot_parameters(Carrier::CreateVolumeGroupSnapshot, &snap).is_err());
        let group = map(&[
            ("csi.storage.k8s.io/volumegroupsnapshot/name", "g1"),
            (
                "csi.storage.k8s.io/volumegroupsnapshot/namespace",
                "default",
            ),
            (
                "csi.storage.k8s.io/volumegroupsnapshotcontent/name",
                "groupcontent-1",
            ),
        ]);
        snapshot_parameters(Carrier::CreateVolumeGroupSnapshot, &group).unwrap();
        assert!(snapshot_parameters(Carrier::CreateSnapshot, &group).is_err());
        // csi-snapshotter strips its secret keys before it calls.
        let e = snapshot_parameters(
            Carrier::CreateSnapshot,
            &map(&[("csi.storage.k8s.io/snapshotter-secret-name", "s")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("csi-snapshotter v8.6.0"), "{e}");
        let e =
            snapshot_parameters(Carrier::CreateSnapshot, &map(&[("class", "gold")])).unwrap_err();
        assert!(e.to_string().contains("\"class\""), "{e}");
    }

    #[test]
    fn modify_ignores_the_resizers_metadata() {
        let p = map(&[
            ("readAheadSectors", "256"),
            (PVC_NAME, "data"),
            (PVC_NAMESPACE, "default"),
            (PV_NAME, "pvc-1"),
        ]);
        let got = mutable_parameters(Carrier::ControllerModifyVolume, &p).unwrap();
        assert_eq!(
            got,
            BTreeMap::from([("readAheadSectors".into(), "256".into())])
        );
        let only = map(&[(PVC_NAME, "data"), (PV_NAME, "pvc-1")]);
        assert!(mutable_parameters(Carrier::ControllerModifyVolume, &only)
            .unwrap()
            .is_empty());
        // The provisioner adds nothing to a VolumeAttributesClass's map.
        assert!(mutable_parameters(Carrier::CreateVolumeMutable, &only).is_err());
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
        for bad in ["ro,exec", "a\nb", "", "x y", "context=\"a\"", "a.b"] {
            assert!(mount_flag(bad).is_err(), "{bad:?}");
        }
        // A single key=value is one flag, then on the filesystem's list.
        let one = |fs: &str, flag: &str| {
            capabilities(&[mount(fs, Mode::SingleNodeWriter, &[flag])], "ext4")
        };
        assert!(one("ext4", "data=journal").is_ok());
        assert!(one("xfs", "allocsize=64k").is_ok());
        for (fs, flag, says) in [
            ("ext4", "uid=0", "\"uid=0\" is not allowed for ext4"),
            ("ext4", "errors=panic", "errors=panic"),
            ("xfs", "data=journal", "not allowed for xfs"),
            ("ext4", "bind", "changes how a mount is made"),
        ] {
            let e = one(fs, flag).unwrap_err().to_string();
            assert!(e.contains(says), "{fs} {flag}: {e}");
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
            "default",
            "vg",
            "pool",
            &Access::Block,
        )
        .unwrap();
        assert_eq!(ok.get("pvcname").unwrap(), "data");
        assert_eq!(ok.get("pool").unwrap(), "pool");
        let e = parameters(
            &p(&[("fsType; rm -rf /", "x")]),
            "default",
            "vg",
            "pool",
            &Access::Block,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown parameter"), "{e}");
        assert!(parameters(
            &p(&[("volumeGroup", "other")]),
            "default",
            "vg",
            "pool",
            &Access::Block
        )
        .is_err());
        assert!(parameters(
            &p(&[("csi.storage.k8s.io/pv/name", &"x".repeat(129))]),
            "default",
            "vg",
            "pool",
            &Access::Block
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
        assert!(matches!(
            volume_id("", &ids()),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            volume_id(&"x".repeat(10_000), &ids()),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            volume_id("a\0b", &ids()),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(volume_id("vg0/root", &ids()).unwrap(), None);
        assert_eq!(volume_id("../x", &ids()).unwrap(), None);
        let id = naming::lv_name_for("pvc-1");
        assert_eq!(
            volume_id(&id, &ids()).unwrap().as_deref(),
            Some(id.as_str())
        );
        assert!(matches!(
            existing_volume_id("pool", &ids()),
            Err(Error::NotFound(_))
        ));
    }

    #[test]
    fn ids_with_a_node_key_name_objects_of_that_node_only() {
        let here = NodeIds::new("node-1", true);
        let vol = naming::lv_name_for("pvc-1");
        let snap = naming::snapshot_lv_name_for("snap-1");
        let mine = naming::with_node(here.key(), &vol);
        let theirs = naming::with_node(&naming::node_key("node-2"), &vol);
        // This node's key comes off; the id within the node is the LV's.
        assert_eq!(
            volume_id(&mine, &here).unwrap().as_deref(),
            Some(vol.as_str())
        );
        // An id without a key (minted before the cluster) is still read.
        assert_eq!(
            volume_id(&vol, &here).unwrap().as_deref(),
            Some(vol.as_str())
        );
        // Another node's key: well formed, and not here (NOT_FOUND later).
        assert_eq!(volume_id(&theirs, &here).unwrap(), None);
        assert!(matches!(
            existing_volume_id(&theirs, &here),
            Err(Error::NotFound(_))
        ));
        let snap_theirs = naming::with_node(&naming::node_key("node-2"), &snap);
        assert_eq!(
            snapshot_id("snapshot_id", &snap_theirs, &here).unwrap(),
            None
        );
        assert_eq!(
            snapshot_id("snapshot_id", &naming::with_node(here.key(), &snap), &here)
                .unwrap()
                .as_deref(),
            Some(snap.as_str())
        );
        // A page token: this node's comes off, another node's is ABORTED.
        assert_eq!(
            page(5, &mine, naming::is_volume_id, &here).unwrap(),
            (5, vol.as_str())
        );
        assert_eq!(
            page(5, &theirs, naming::is_volume_id, &here)
                .unwrap_err()
                .code(),
            tonic::Code::Aborted
        );
        // A key on a key, or a key on nothing, is no id of ours.
        assert_eq!(
            volume_id(&naming::with_node(here.key(), &mine), &here).unwrap(),
            None
        );
        assert_eq!(
            volume_id(&naming::with_node(here.key(), ""), &here).unwrap(),
            None
        );
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
