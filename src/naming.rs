//! Names and tags: how a CO's volume name becomes an LV name, how what we
//! must remember is written into LVM tags, and which ids we accept.
//!
//! The LVs are the driver's only state. Each LV we create carries:
//! - `tpcsi.owner=<driver name>`: without it we never touch an LV;
//! - `tpcsi.name=<hex of the CO name>`: the CO name, any bytes, reversible;
//!   left out of a volume whose LV name spells the CO name out in full (a
//!   Kubernetes PV name, `pvc-<uuid>`);
//! - `tpcsi.access=block` or `tpcsi.access=mount:<fstype>`;
//! - `tpcsi.p.<key>=<hex value>`: each creation parameter, `:n` for a value
//!   equal to the CO name (external-provisioner's PV name).
//!
//! Hex keeps every tag inside LVM's tag alphabet whatever the input. Every
//! byte of a tag is repeated in every write of the VG's metadata, which
//! LVM reads, checks and rewrites whole for each command: a Kubernetes
//! volume's tags went from 343 to 170 bytes this way (docs/capacity.md).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// CSI's general limit for strings (spec, "Size Limits").
pub const MAX_STRING: usize = 128;
/// What every volume id (and its LV name) begins with, after its class.
pub const ID_PREFIX: &str = "csi-";
const READABLE_LEN: usize = 40;
const HASH_HEX: usize = 16;

pub const TAG_OWNER: &str = "tpcsi.owner=";
pub const TAG_NAME: &str = "tpcsi.name=";
pub const TAG_ACCESS: &str = "tpcsi.access=";
pub const TAG_PARAM: &str = "tpcsi.p.";
/// A mutable parameter (ControllerModifyVolume): `tpcsi.m.<key>=<hex value>`.
pub const TAG_MUTABLE: &str = "tpcsi.m.";
/// The device class's option for the volume at its creation, where the
/// request named none: `tpcsi.c.<key>=<hex value>` (`mkfs`, `mnt`).
pub const TAG_CLASS_OPTION: &str = "tpcsi.c.";
/// The short name of the mkfs options, as a parameter (`mkfsOptions`) and
/// as a class option.
pub const PARAM_MKFS: &str = "mkfs";
/// The class option that holds the class's mount options, space-separated.
pub const CLASS_MOUNT: &str = "mnt";
/// On a volume made from a snapshot or a volume: `snapshot:<id>` or
/// `volume:<id>`.
pub const TAG_FROM: &str = "tpcsi.from=";
/// On a snapshot: the id of the volume it was taken from.
pub const TAG_SOURCE: &str = "tpcsi.source=";
/// On an encrypted volume, and on its snapshots: `tpcsi.crypt=luks2`
/// (LUKS2 on the LV, the filesystem inside; `node::crypt`).
pub const TAG_CRYPT: &str = "tpcsi.crypt=luks2";
/// On a member of a group snapshot: `<group id>:<number of members>`.
pub const TAG_GROUP: &str = "tpcsi.group=";
/// On a volume still being filled from another node (`volume/fill.rs`):
/// `tpcsi.filling=<offset>:<driver name>`, the byte up to which the copy
/// is written, verified and synced, and the driver filling it. Such an
/// LV carries no owner tag until it is whole (so no version of the
/// driver, this one or an older one, takes it for a volume); only the
/// CreateVolume that made it goes on from the offset.
pub const TAG_FILLING: &str = "tpcsi.filling=";
/// On a volume pulled from another node: `tpcsi.pulled=<hex of the
/// source's id>` (the content source: a snapshot, or for a clone a
/// volume; an id with its node key, which an LVM tag cannot spell). Kept
/// when it is whole; a retry must name the same source.
pub const TAG_PULLED: &str = "tpcsi.pulled=";

/// On a clone pulled from another node: `tpcsi.via=<hex of the id of the
/// snapshot read>`, the one the source node took of the volume for it. A
/// retry that reads another one (the first was released or expired)
/// starts the copy again from 0: two points in time never mix.
pub const TAG_VIA: &str = "tpcsi.via=";

/// On a copy a move's delta round fills: `tpcsi.base=<hex of the id of
/// the snapshot the copy held whole>` (of the same volume as the one
/// pulled). Only what differs from it is read, and a resumed round reads
/// against it again.
pub const TAG_BASE: &str = "tpcsi.base=";

/// The base tag of a copy filled against snapshot `id`.
pub fn base_tag(id: &str) -> String {
    format!("{TAG_BASE}{}", hex(id.as_bytes()))
}

/// The base snapshot's id a copy's base tag names.
pub fn base_of<'a>(tags: impl IntoIterator<Item = &'a String>) -> Option<String> {
    tags.into_iter()
        .find_map(|t| unhex_text(t.strip_prefix(TAG_BASE)?))
}

/// On a read-only snapshot a node took of a volume for a clone on
/// another node: `tpcsi.clone-for=<hex of the clone's CO name>:<unix
/// seconds it expires at>`. Never listed; removed when the controller
/// releases it, or after it expires.
pub const TAG_CLONE_FOR: &str = "tpcsi.clone-for=";

/// The filling tag of a copy `driver` has written up to byte `at`.
pub fn filling_tag(at: u64, driver: &str) -> String {
    format!("{TAG_FILLING}{at}:{driver}")
}

/// The offset and driver a filling LV's tags record, if it is one (the
/// first filling tag; an offset that is no number reads as 0: start
/// again).
pub fn filling<'a>(tags: impl IntoIterator<Item = &'a String>) -> Option<(u64, &'a str)> {
    tags.into_iter()
        .find_map(|t| t.strip_prefix(TAG_FILLING))
        .map(|v| {
            let (at, driver) = v.split_once(':').unwrap_or((v, ""));
            (at.parse().unwrap_or(0), driver)
        })
}

/// The pulled tag of a copy of snapshot or volume `id` (with its node key).
pub fn pulled_tag(id: &str) -> String {
    format!("{TAG_PULLED}{}", hex(id.as_bytes()))
}

/// The via tag of a clone that reads snapshot `id` (with its node key).
pub fn via_tag(id: &str) -> String {
    format!("{TAG_VIA}{}", hex(id.as_bytes()))
}

/// The clone-for tag of a snapshot taken for clone `name`, expiring at
/// `expires` (unix seconds).
pub fn clone_for_tag(name: &str, expires: u64) -> String {
    format!("{TAG_CLONE_FOR}{}:{expires}", hex(name.as_bytes()))
}

/// A clone-for tag's clone name and expiry, when `tags` has one.
pub fn clone_for<'a>(tags: impl IntoIterator<Item = &'a String>) -> Option<(String, u64)> {
    tags.into_iter().find_map(|t| {
        let (name, expires) = t.strip_prefix(TAG_CLONE_FOR)?.split_once(':')?;
        Some((unhex_text(name)?, expires.parse().ok()?))
    })
}

pub const SNAPSHOT_PREFIX: &str = "snap-";
const GROUP_PREFIX: &str = "group-";

/// The LV name (and CSI volume id) for a CO volume name: a readable part
/// from the name's safe characters, then 64 bits of its SHA-256, so two
/// different names never share an LV.
pub fn lv_name_for(co_name: &str) -> String {
    name_with(ID_PREFIX, co_name)
}

/// The LV name (and CSI snapshot id) for a CO snapshot name; the prefix
/// keeps snapshots and volumes apart whatever the names.
pub fn snapshot_lv_name_for(co_name: &str) -> String {
    name_with(SNAPSHOT_PREFIX, co_name)
}

/// The id of a group snapshot, from its CO name.
pub fn group_id_for(co_name: &str) -> String {
    name_with(GROUP_PREFIX, co_name)
}

/// True when `id` has the exact shape of an id [`group_id_for`] makes.
pub fn is_group_id(id: &str) -> bool {
    has_shape(GROUP_PREFIX, id)
}

/// The snapshot LV name of the member of group `group_name` taken from
/// volume `source`.
pub fn group_member_name(group_name: &str, source: &str) -> String {
    snapshot_lv_name_for(&member_co_name(group_name, source))
}

/// The name a group member carries in its name tag.
pub fn member_co_name(group_name: &str, source: &str) -> String {
    format!("{group_name}/{source}")
}

fn name_with(prefix: &str, co_name: &str) -> String {
    let readable: String = co_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .take(READABLE_LEN)
        .collect();
    let digest = Sha256::digest(co_name.as_bytes());
    let hash = hex(&digest[..HASH_HEX / 2]);
    format!("{prefix}{readable}-{hash}")
}

/// True when `id` has the exact shape of an id [`lv_name_for`] makes, in
/// any device class ([`split_class`]). Only such ids are ever passed to
/// LVM, so `vg0/root`, `../x` or the pool name can never reach an LVM
/// command line.
pub fn is_volume_id(id: &str) -> bool {
    has_shape(ID_PREFIX, id)
}

/// True when `id` has the exact shape of an id [`snapshot_lv_name_for`]
/// makes.
pub fn is_snapshot_id(id: &str) -> bool {
    has_shape(SNAPSHOT_PREFIX, id)
}

/// The name of the device class made of the top-level pool keys, whose
/// ids carry no class.
pub const DEFAULT_CLASS: &str = "default";

/// What joins a device class to a name in ids and LV names
/// (`fast.csi-data-…`): outside the class alphabet, inside LVM's.
const CLASS_SEP: char = '.';

/// Longest device class name: ids stay within LVM's 127-character names.
const CLASS_MAX: usize = 32;

/// Device class names: lowercase letters, digits and inner '-', at most
/// [`CLASS_MAX`] characters; [`DEFAULT_CLASS`] names the top-level pool.
pub fn validate_class_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= CLASS_MAX
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a device class name (lowercase letters, digits and '-', \
             not at either end, at most {CLASS_MAX} characters)"
        ))
    }
}

/// The device class an id or LV name belongs to, by name (a node key in
/// front is skipped).
pub fn class_of(id: &str) -> &str {
    split_class(split_node(id).1).0.unwrap_or(DEFAULT_CLASS)
}

/// The device class an id or LV name belongs to (`None`: the default
/// class, whose names carry none) and the name within it. A prefix that is
/// not a class name is left in the name, so the shape checks refuse it.
pub fn split_class(id: &str) -> (Option<&str>, &str) {
    match id.split_once(CLASS_SEP) {
        Some((class, rest)) if validate_class_name(class).is_ok() && class != DEFAULT_CLASS => {
            (Some(class), rest)
        }
        _ => (None, id),
    }
}

/// `name` as an id of device class `class` (`None`: the default class).
pub fn in_class(class: Option<&str>, name: String) -> String {
    match class {
        Some(c) => format!("{c}{CLASS_SEP}{name}"),
        None => name,
    }
}

fn has_shape(prefix: &str, id: &str) -> bool {
    let (_, id) = split_class(id);
    let Some(rest) = id.strip_prefix(prefix) else {
        return false;
    };
    if rest.len() < HASH_HEX + 1 || rest.len() > READABLE_LEN + 1 + HASH_HEX {
        return false;
    }
    let (readable, tail) = rest.split_at(rest.len() - HASH_HEX - 1);
    let (dash, hash) = tail.split_at(1);
    dash == "-"
        && readable
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What joins a node key to an id: `n<key>~<id>` (docs/cluster.md). `~`
/// is in no LV name, device class or id of the per-node design, so a keyed
/// id is never mistaken for an unkeyed one.
const NODE_SEP: char = '~';
/// Hex digits of SHA-256 of the node id in a node key: 40 bits.
const NODE_KEY_HEX: usize = 10;

/// The node key of `node_id`: `n` and the first [`NODE_KEY_HEX`] hex
/// digits of SHA-256 of the node id. Ids minted on a cluster carry it, so
/// the cluster's controller finds the node of an id without asking.
pub fn node_key(node_id: &str) -> String {
    let digest = Sha256::digest(node_id.as_bytes());
    format!("n{}", hex(&digest[..NODE_KEY_HEX / 2]))
}

fn is_node_key(key: &str) -> bool {
    key.len() == 1 + NODE_KEY_HEX
        && key.starts_with('n')
        && key[1..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The node key an id carries (`None`: an id without one) and the id
/// within its node. A prefix that is not a node key stays in the id, so
/// the shape checks refuse it.
pub fn split_node(id: &str) -> (Option<&str>, &str) {
    match id.split_once(NODE_SEP) {
        Some((key, rest)) if is_node_key(key) => (Some(key), rest),
        _ => (None, id),
    }
}

/// `id` with node key `key` in front.
pub fn with_node(key: &str, id: &str) -> String {
    format!("{key}{NODE_SEP}{id}")
}

/// How this node reads and writes the node key of ids: it accepts its own
/// key (or none) on every id it is sent, takes another node's key as an id
/// it does not hold, and puts its key on the ids it hands out while it
/// serves a cluster's controller (`[cluster]`).
#[derive(Debug, Clone)]
pub struct NodeIds {
    key: String,
    mint: bool,
}

impl NodeIds {
    pub fn new(node_id: &str, mint: bool) -> NodeIds {
        NodeIds {
            key: node_key(node_id),
            mint,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether this node serves a cluster's controller (and so puts its
    /// key on the ids it hands out).
    pub fn mints(&self) -> bool {
        self.mint
    }

    /// The id within this node: `id` without this node's key; `None` when
    /// it carries another node's key (the object is not on this node).
    pub fn local<'a>(&self, id: &'a str) -> Option<&'a str> {
        match split_node(id) {
            (Some(key), rest) if key == self.key => Some(rest),
            (Some(_), _) => None,
            (None, id) => Some(id),
        }
    }

    /// The node key `id` carries when it is another node's: a call that
    /// removes what an id names must not take such an id as gone (it is
    /// on that node; the call came to the wrong one).
    pub fn foreign<'a>(&self, id: &'a str) -> Option<&'a str> {
        split_node(id).0.filter(|k| *k != self.key)
    }

    /// The id this node hands out for its object `id`.
    pub fn public(&self, id: String) -> String {
        if self.mint {
            with_node(&self.key, &id)
        } else {
            id
        }
    }
}

/// The tag in which versions before the node record kept a volume's
/// staging path (hex) on its LV; read once at start-up and dropped.
pub const LEGACY_TAG_STAGED: &str = "tpcsi.staged=";

/// The legacy staging tag among `tags`, and the path it holds.
pub fn legacy_staged_path(tags: &[String]) -> Option<(&str, std::path::PathBuf)> {
    use std::os::unix::ffi::OsStringExt;
    tags.iter().find_map(|t| {
        let bytes = unhex(t.strip_prefix(LEGACY_TAG_STAGED)?)?;
        Some((
            t.as_str(),
            std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes)),
        ))
    })
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 2);
    unhex_into(s, &mut out)?;
    Some(out)
}

/// [`unhex`] appending to `out`.
fn unhex_into(s: &str, out: &mut Vec<u8>) -> Option<()> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| nibble(c.to_ascii_lowercase());
    for h in s.as_bytes().chunks_exact(2) {
        out.push(digit(h[0])? << 4 | digit(h[1])?);
    }
    Some(())
}

/// How a volume is consumed, as recorded at creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Block,
    Mount { fs_type: String },
}

impl Access {
    /// `block` or `mount:<fsType>`, as its tag holds it.
    pub fn as_text(&self) -> String {
        match self {
            Access::Block => "block".into(),
            Access::Mount { fs_type } => format!("mount:{fs_type}"),
        }
    }

    /// What [`Access::as_text`] wrote.
    pub fn from_text(v: &str) -> Option<Access> {
        decode_access(v)
    }

    fn describe(&self) -> String {
        match self {
            Access::Block => "raw block access".into(),
            Access::Mount { fs_type } => format!("a {fs_type} filesystem"),
        }
    }
}

/// Whether a requested access fits the one volume `name` was created with;
/// `Err` says why not. A volume without a recorded access accepts either.
pub fn fits(name: &str, have: Option<&Access>, wanted: &Access) -> Result<(), String> {
    match have {
        Some(have) if have != wanted => Err(format!(
            "volume {name} was created for {}, not {}",
            have.describe(),
            wanted.describe()
        )),
        _ => Ok(()),
    }
}

/// What we store about a volume in its tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeTags {
    pub owner: String,
    pub co_name: String,
    pub access: Option<Access>,
    pub params: BTreeMap<String, String>,
    /// Mutable parameters as last set (at creation or by a modify).
    pub mutable: BTreeMap<String, String>,
    /// The device class's mkfs (`mkfs`) and mount (`mnt`) options for the
    /// volume's filesystem at its creation, where its parameters named
    /// none: a later change to the class does not reach it.
    pub class_options: BTreeMap<String, String>,
    /// What the volume was made from, when it was not made empty.
    pub from: Option<ContentSource>,
    /// The LV holds LUKS2 ([`TAG_CRYPT`]).
    pub encrypted: bool,
}

/// The content a volume was made from (its ids have a checked shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

impl ContentSource {
    /// The id of the snapshot or volume copied.
    pub fn id(&self) -> &str {
        match self {
            ContentSource::Snapshot(id) | ContentSource::Volume(id) => id,
        }
    }

    fn encode(&self) -> String {
        match self {
            ContentSource::Snapshot(id) => format!("snapshot:{id}"),
            ContentSource::Volume(id) => format!("volume:{id}"),
        }
    }

    fn decode(v: &str) -> Option<ContentSource> {
        if let Some(id) = v.strip_prefix("snapshot:").filter(|id| is_snapshot_id(id)) {
            return Some(ContentSource::Snapshot(id.to_string()));
        }
        v.strip_prefix("volume:")
            .filter(|id| is_volume_id(id))
            .map(|id| ContentSource::Volume(id.to_string()))
    }
}

/// What we store about a snapshot in the tags of its LV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotTags {
    pub owner: String,
    pub co_name: String,
    /// The id of the volume it was taken from.
    pub source: String,
    /// The source's access, so a restore knows what it holds.
    pub access: Option<Access>,
    /// The group snapshot this one belongs to.
    pub group: Option<GroupTag>,
    /// Its volume was encrypted, and so is the snapshot's content.
    pub encrypted: bool,
}

/// A member's group: its id and how many members it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTag {
    pub id: String,
    pub members: usize,
}

impl SnapshotTags {
    pub fn encode(&self) -> Vec<String> {
        let mut tags = vec![
            format!("{TAG_OWNER}{}", self.owner),
            format!("{TAG_NAME}{}", hex(self.co_name.as_bytes())),
            format!("{TAG_SOURCE}{}", self.source),
        ];
        tags.extend(encode_access(self.access.as_ref()));
        if let Some(g) = &self.group {
            tags.push(format!("{TAG_GROUP}{}:{}", g.id, g.members));
        }
        if self.encrypted {
            tags.push(TAG_CRYPT.to_string());
        }
        tags
    }

    /// `None` unless the LV carries an owner, a name and a source tag.
    pub fn decode<'a>(tags: impl IntoIterator<Item = &'a str>) -> Option<SnapshotTags> {
        let (mut owner, mut co_name, mut source, mut access) = (None, None, None, None);
        let (mut group, mut encrypted) = (None, false);
        for t in tags {
            if t == TAG_CRYPT {
                encrypted = true;
                continue;
            }
            if let Some(v) = t.strip_prefix(TAG_OWNER) {
                owner = Some(v.to_string());
            } else if let Some(v) = t.strip_prefix(TAG_NAME) {
                co_name = Some(String::from_utf8(unhex(v)?).ok()?);
            } else if let Some(v) = t.strip_prefix(TAG_SOURCE) {
                source = Some(v.to_string()).filter(|s| is_volume_id(s));
            } else if let Some(v) = t.strip_prefix(TAG_ACCESS) {
                access = decode_access(v);
            } else if let Some(v) = t.strip_prefix(TAG_GROUP) {
                let (id, n) = v.rsplit_once(':')?;
                if !is_group_id(id) {
                    return None;
                }
                group = Some(GroupTag {
                    id: id.to_string(),
                    members: n.parse().ok()?,
                });
            }
        }
        Some(SnapshotTags {
            owner: owner?,
            co_name: co_name?,
            source: source?,
            access,
            group,
            encrypted,
        })
    }
}

/// The tag that records mutable parameter `key` as `value`.
pub fn mutable_tag(key: &str, value: &str) -> String {
    format!("{TAG_MUTABLE}{key}={}", hex(value.as_bytes()))
}

fn encode_access(access: Option<&Access>) -> Option<String> {
    match access? {
        Access::Block => Some(format!("{TAG_ACCESS}block")),
        Access::Mount { fs_type } => Some(format!("{TAG_ACCESS}mount:{fs_type}")),
    }
}

fn decode_access(v: &str) -> Option<Access> {
    match v {
        "block" => Some(Access::Block),
        _ => v.strip_prefix("mount:").map(|fs| Access::Mount {
            fs_type: fs.to_string(),
        }),
    }
}

/// A parameter's value written as "the volume's CO name" (`pvname`, which
/// external-provisioner sets to the name it creates the volume under):
/// `:` never occurs in hex.
const SAME_AS_NAME: &str = ":n";

/// Whether the LV name [`lv_name_for`] makes spells `co_name` out in full
/// (a Kubernetes PV name, `pvc-<uuid>`, does): its name tag is then left
/// out, as every byte of a tag is repeated in every VG metadata write.
fn spelled_out(co_name: &str) -> bool {
    !co_name.is_empty()
        && co_name.len() <= READABLE_LEN
        && co_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The CO name a volume's LV name spells out in full, when it does.
fn name_in(lv_name: &str) -> Option<String> {
    let (_, lv_name) = split_class(lv_name);
    let rest = lv_name.strip_prefix(ID_PREFIX)?;
    let (readable, tail) = rest.split_at_checked(rest.len().checked_sub(HASH_HEX + 1)?)?;
    // A spelled-out name is its own readable part, so `lv_name_for` of it
    // is this LV's name exactly when the tail is `-` and its hash: checked
    // without building the name (every ListVolumes entry decodes this).
    if !spelled_out(readable) {
        return None;
    }
    let hash = tail.strip_prefix('-')?.as_bytes();
    let digest = Sha256::digest(readable.as_bytes());
    let matches = digest[..HASH_HEX / 2]
        .iter()
        .zip(hash.chunks_exact(2))
        .all(|(b, h)| nibble(h[0]) == Some(b >> 4) && nibble(h[1]) == Some(b & 15));
    matches.then(|| readable.to_string())
}

/// A lowercase hex digit's value (what [`hex`] writes).
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl VolumeTags {
    /// The mkfs options the volume is made with: its `mkfsOptions`
    /// parameter, else its class's at creation (unchecked text).
    pub fn mkfs_options(&self) -> &str {
        self.params
            .get(PARAM_MKFS)
            .or_else(|| self.class_options.get(PARAM_MKFS))
            .map_or("", String::as_str)
    }

    /// Its class's mount options at creation (unchecked words).
    pub fn class_mount_options(&self) -> Vec<String> {
        self.class_options
            .get(CLASS_MOUNT)
            .map(|m| m.split_ascii_whitespace().map(String::from).collect())
            .unwrap_or_default()
    }

    /// The tags to pass to `lvcreate --addtag`, in a stable order. What
    /// the LV name already says is not repeated: no name tag when the name
    /// spells the CO name out, and a parameter equal to it is `:n`.
    pub fn encode(&self) -> Vec<String> {
        let mut tags = vec![format!("{TAG_OWNER}{}", self.owner)];
        if !spelled_out(&self.co_name) {
            tags.push(format!("{TAG_NAME}{}", hex(self.co_name.as_bytes())));
        }
        tags.extend(encode_access(self.access.as_ref()));
        for (k, v) in &self.params {
            if *v == self.co_name {
                tags.push(format!("{TAG_PARAM}{k}={SAME_AS_NAME}"));
            } else {
                tags.push(format!("{TAG_PARAM}{k}={}", hex(v.as_bytes())));
            }
        }
        tags.extend(self.mutable.iter().map(|(k, v)| mutable_tag(k, v)));
        tags.extend(
            self.class_options
                .iter()
                .map(|(k, v)| format!("{TAG_CLASS_OPTION}{k}={}", hex(v.as_bytes()))),
        );
        if let Some(f) = &self.from {
            tags.push(format!("{TAG_FROM}{}", f.encode()));
        }
        if self.encrypted {
            tags.push(TAG_CRYPT.to_string());
        }
        tags
    }

    /// Reads the tags of LV `lv_name` back; `None` when it carries no owner
    /// tag, or its name tag is damaged or missing where the LV name does
    /// not spell the CO name out (such an LV is not ours to touch), or it
    /// is a snapshot.
    pub fn decode<'a>(
        lv_name: &str,
        tags: impl IntoIterator<Item = &'a str>,
    ) -> Option<VolumeTags> {
        let mut owner = None;
        let mut co_name = None;
        let mut access = None;
        let mut params = BTreeMap::new();
        let mut from = None;
        let mut mutable = BTreeMap::new();
        let mut class_options = BTreeMap::new();
        let mut encrypted = false;
        for t in tags {
            match VolumeTag::of(t)? {
                VolumeTag::Crypt => encrypted = true,
                VolumeTag::Owner(v) => owner = Some(v.to_string()),
                VolumeTag::Name(v) => co_name = Some(unhex_text(v)?),
                VolumeTag::Access(v) => access = decode_access(v),
                VolumeTag::Param(k, v) => {
                    let v = match v {
                        SAME_AS_NAME => None,
                        hexed => Some(unhex_text(hexed)?),
                    };
                    params.insert(k.to_string(), v);
                }
                VolumeTag::Mutable(k, v) => {
                    mutable.insert(k.to_string(), unhex_text(v)?);
                }
                VolumeTag::ClassOption(k, v) => {
                    class_options.insert(k.to_string(), unhex_text(v)?);
                }
                VolumeTag::From(v) => from = Some(ContentSource::decode(v)?),
                VolumeTag::Source | VolumeTag::Filling => return None,
                VolumeTag::Other => {}
            }
        }
        let co_name = co_name.or_else(|| name_in(lv_name))?;
        let params = params
            .into_iter()
            .map(|(k, v)| (k, v.unwrap_or_else(|| co_name.clone())))
            .collect();
        Some(VolumeTags {
            owner: owner?,
            co_name,
            access,
            params,
            mutable,
            class_options,
            from,
            encrypted,
        })
    }
}

/// What ListVolumes shows of a volume's tags: [`VolumeTags::listed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTags<'a> {
    pub owner: &'a str,
    pub access: Option<Access>,
    pub mutable: BTreeMap<String, String>,
    pub from: Option<ContentSource>,
}

impl VolumeTags {
    /// [`VolumeTags::decode`]'s verdict on the same tags (`None` exactly
    /// where it gives `None`), keeping only what a ListVolumes entry
    /// shows: the CO name, parameters and class options are checked as
    /// decode reads them, but not kept (every entry of a page is decoded).
    pub fn listed<'a>(
        lv_name: &str,
        tags: impl IntoIterator<Item = &'a str>,
    ) -> Option<ListedTags<'a>> {
        let (mut owner, mut named, mut access, mut from) = (None, false, None, None);
        let mut mutable = BTreeMap::new();
        let mut scratch = Vec::new();
        let mut text = |hexed: &str| -> Option<()> {
            scratch.clear();
            unhex_into(hexed, &mut scratch)?;
            std::str::from_utf8(&scratch).ok().map(drop)
        };
        for t in tags {
            match VolumeTag::of(t)? {
                VolumeTag::Crypt | VolumeTag::Other => {}
                VolumeTag::Owner(v) => owner = Some(v),
                VolumeTag::Name(v) => {
                    text(v)?;
                    named = true;
                }
                VolumeTag::Access(v) => access = decode_access(v),
                VolumeTag::Param(_, SAME_AS_NAME) => {}
                VolumeTag::Param(_, v) | VolumeTag::ClassOption(_, v) => text(v)?,
                VolumeTag::Mutable(k, v) => {
                    mutable.insert(k.to_string(), unhex_text(v)?);
                }
                VolumeTag::From(v) => from = Some(ContentSource::decode(v)?),
                VolumeTag::Source | VolumeTag::Filling => return None,
            }
        }
        if !named {
            name_in(lv_name)?;
        }
        Some(ListedTags {
            owner: owner?,
            access,
            mutable,
            from,
        })
    }
}

/// One tag of a volume's LV, told by its prefix, its value not decoded.
enum VolumeTag<'a> {
    Crypt,
    Owner(&'a str),
    Name(&'a str),
    Access(&'a str),
    Param(&'a str, &'a str),
    Mutable(&'a str, &'a str),
    ClassOption(&'a str, &'a str),
    From(&'a str),
    /// A snapshot's tag: the LV is no volume.
    Source,
    /// A copy not yet filled: the LV is no volume yet.
    Filling,
    Other,
}

impl<'a> VolumeTag<'a> {
    /// `None`: a key-value tag without its `=`.
    fn of(t: &'a str) -> Option<VolumeTag<'a>> {
        Some(if t == TAG_CRYPT {
            VolumeTag::Crypt
        } else if let Some(v) = t.strip_prefix(TAG_OWNER) {
            VolumeTag::Owner(v)
        } else if let Some(v) = t.strip_prefix(TAG_NAME) {
            VolumeTag::Name(v)
        } else if let Some(v) = t.strip_prefix(TAG_ACCESS) {
            VolumeTag::Access(v)
        } else if let Some(kv) = t.strip_prefix(TAG_PARAM) {
            let (k, v) = kv.split_once('=')?;
            VolumeTag::Param(k, v)
        } else if let Some(kv) = t.strip_prefix(TAG_MUTABLE) {
            let (k, v) = kv.split_once('=')?;
            VolumeTag::Mutable(k, v)
        } else if let Some(kv) = t.strip_prefix(TAG_CLASS_OPTION) {
            let (k, v) = kv.split_once('=')?;
            VolumeTag::ClassOption(k, v)
        } else if let Some(v) = t.strip_prefix(TAG_FROM) {
            VolumeTag::From(v)
        } else if t.starts_with(TAG_SOURCE) {
            VolumeTag::Source
        } else if t.starts_with(TAG_FILLING) {
            VolumeTag::Filling
        } else {
            VolumeTag::Other
        })
    }
}

/// Hex of UTF-8 text, decoded.
fn unhex_text(hexed: &str) -> Option<String> {
    String::from_utf8(unhex(hexed)?).ok()
}

/// CSI plugin names: at most 63 characters, domain style, starting and
/// ending with an alphanumeric character.
pub fn validate_driver_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ends_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 63 || !ok_chars || !ends_ok || !name.contains('.') {
        return Err(format!(
            "{name:?} is not a domain-style driver name (lowercase letters, digits, '-', '.', \
             at most 63 characters, e.g. thinpool.csi.example.org)"
        ));
    }
    Ok(())
}

/// Node ids end up in topology values and tags: keep them to a safe set.
pub fn validate_node_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_STRING
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{id:?} is not a valid node id (letters, digits, '-', '.', '_', at most {MAX_STRING})"
        ))
    }
}

/// LVM's rules for VG and LV names, kept stricter than LVM's own.
pub fn validate_lvm_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid LVM name (letters, digits, '+', '_', '.', '-'; not starting with '-')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_keys_are_short_fixed_and_never_an_lv_name() {
        let k = node_key("worker-1");
        assert_eq!(k, node_key("worker-1"));
        assert_ne!(k, node_key("worker-2"));
        assert_eq!(k.len(), 11, "{k}");
        assert!(k.starts_with('n') && is_node_key(&k), "{k}");
        let vol = in_class(Some("fast"), lv_name_for("pvc-1"));
        let keyed = with_node(&k, &vol);
        assert_eq!(split_node(&keyed), (Some(k.as_str()), vol.as_str()));
        assert_eq!(split_node(&vol), (None, vol.as_str()));
        // A keyed id never reaches LVM as a name; its class still reads.
        assert!(is_volume_id(&vol));
        assert!(!is_volume_id(&keyed));
        assert!(validate_lvm_name(&keyed).is_err(), "{keyed}");
        assert_eq!(class_of(&keyed), "fast");
        // Not a key: wrong length, capitals, another letter.
        for bad in [
            "n123~csi-x",
            "nABCDEF0123~x",
            "x0123456789~x",
            "n0123456789a~x",
        ] {
            assert_eq!(split_node(bad).0, None, "{bad}");
        }
        // The longest id stays within CSI's 128 bytes.
        let longest = with_node(
            &k,
            &in_class(Some(&"c".repeat(CLASS_MAX)), lv_name_for(&"x".repeat(200))),
        );
        assert!(longest.len() <= MAX_STRING, "{} bytes", longest.len());
    }

    #[test]
    fn a_node_reads_its_own_key_and_mints_it_only_on_a_cluster() {
        let vol = lv_name_for("pvc-1");
        let on = NodeIds::new("worker-1", true);
        let off = NodeIds::new("worker-1", false);
        assert_eq!(
            on.public(vol.clone()),
            with_node(&node_key("worker-1"), &vol)
        );
        assert_eq!(off.public(vol.clone()), vol);
        for ids in [&on, &off] {
            assert_eq!(ids.local(&on.public(vol.clone())), Some(vol.as_str()));
            assert_eq!(ids.local(&vol), Some(vol.as_str()));
            assert_eq!(ids.local(&with_node(&node_key("worker-2"), &vol)), None);
        }
    }

    #[test]
    fn lv_names_are_deterministic_valid_and_distinct() {
        let a = lv_name_for("pvc-3f1e6a52-1b0c-4c4e-9e8a-1c2d3e4f5a6b");
        assert_eq!(a, lv_name_for("pvc-3f1e6a52-1b0c-4c4e-9e8a-1c2d3e4f5a6b"));
        assert!(
            a.starts_with("csi-pvc-3f1e6a52-1b0c-4c4e-9e8a-1c2d3e4f"),
            "{a}"
        );
        assert!(is_volume_id(&a), "{a}");
        // Names that sanitize alike still differ by hash.
        assert_ne!(lv_name_for("a/b"), lv_name_for("a.b"));
        assert_ne!(lv_name_for("A"), lv_name_for("a"));
        for hostile in [
            "",
            "../x",
            "vg0/root",
            "a\0b",
            "ünïcødé",
            &"x".repeat(128),
            " -- --yes",
        ] {
            let n = lv_name_for(hostile);
            assert!(is_volume_id(&n), "{hostile:?} -> {n}");
            assert!(n.len() <= 4 + 40 + 1 + 16);
            validate_lvm_name(&n).unwrap();
        }
    }

    #[test]
    fn foreign_ids_are_rejected() {
        for id in [
            "",
            "root",
            "vg0/root",
            "../x",
            "pool",
            "csi-",
            "csi-x-0123456789abcdeg",
            "csi-X-0123456789abcdef",
            "csi-x_0123456789abcdef",
            "csi-x-0123456789abcdef/../../y",
            "csi-x-0123456789abcde",
            "csi-x-0123456789abcdef0",
            &format!("csi-{}-0123456789abcdef", "a".repeat(41)),
        ] {
            assert!(!is_volume_id(id), "{id:?} accepted");
        }
        assert!(is_volume_id("csi--0123456789abcdef"));
        assert!(is_volume_id(&format!(
            "csi-{}-0123456789abcdef",
            "a".repeat(40)
        )));
    }

    #[test]
    fn ids_name_their_device_class() {
        let base = lv_name_for("pvc-1");
        let fast = in_class(Some("fast"), base.clone());
        assert_eq!(fast, format!("fast.{base}"));
        assert_eq!(split_class(&fast), (Some("fast"), base.as_str()));
        assert_eq!(split_class(&base), (None, base.as_str()));
        assert_eq!(in_class(None, base.clone()), base);
        assert!(is_volume_id(&fast) && !is_snapshot_id(&fast));
        let snap = in_class(Some("hdd-2"), snapshot_lv_name_for("s"));
        assert!(is_snapshot_id(&snap) && !is_volume_id(&snap));
        validate_lvm_name(&in_class(
            Some(&"c".repeat(32)),
            lv_name_for(&"x".repeat(128)),
        ))
        .unwrap();
        // Class parts of odd shape, or the default class spelled out, are
        // no class: the id is then refused whole.
        for bad in [
            "Fast",
            "-a",
            "a-",
            "a_b",
            "a b",
            "default",
            "",
            &"c".repeat(33),
            "a.b",
            "..",
            "fast/x",
        ] {
            let id = format!("{bad}.{base}");
            assert!(!is_volume_id(&id), "{id:?} accepted");
        }
        for name in ["fast", "a", "nvme-0", &"c".repeat(32)] {
            validate_class_name(name).unwrap();
        }
        for name in [
            "",
            "Fast",
            "-a",
            "a-",
            "a.b",
            "a_b",
            "ä",
            &"c".repeat(33),
            "fast;rm",
        ] {
            assert!(validate_class_name(name).is_err(), "{name:?} accepted");
        }
    }

    #[test]
    fn a_classed_pv_name_needs_no_name_tag() {
        let t = VolumeTags {
            owner: "o.x".into(),
            co_name: "pvc-1".into(),
            access: None,
            params: BTreeMap::new(),
            mutable: BTreeMap::new(),
            class_options: BTreeMap::new(),
            from: None,
            encrypted: false,
        };
        let lv = in_class(Some("fast"), lv_name_for("pvc-1"));
        let tags = t.encode();
        assert!(!tags.iter().any(|x| x.starts_with(TAG_NAME)), "{tags:?}");
        let back = VolumeTags::decode(&lv, tags.iter().map(String::as_str)).unwrap();
        assert_eq!(back.co_name, "pvc-1");
    }

    #[test]
    fn tags_round_trip_any_name_and_params() {
        let mut params = BTreeMap::new();
        params.insert(
            "pvcns".to_string(),
            "ns with spaces;$(rm -rf /)".to_string(),
        );
        let t = VolumeTags {
            owner: "thinpool.csi.storage.dev".into(),
            co_name: "weird/\u{0}name,with=tags ünï".into(),
            access: Some(Access::Mount {
                fs_type: "xfs".into(),
            }),
            params,
            mutable: [("readAheadSectors".to_string(), "256".to_string())].into(),
            class_options: [("mkfs".to_string(), "-O ^has_journal -L a.b".to_string())].into(),
            from: None,
            encrypted: true,
        };
        let enc = t.encode();
        for tag in &enc {
            assert!(
                tag.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_+.-/=!:&#".contains(&b)),
                "tag {tag:?} leaves LVM's alphabet"
            );
        }
        let back = VolumeTags::decode("csi-x", enc.iter().map(String::as_str)).unwrap();
        assert_eq!(back, t);
        let block = VolumeTags {
            access: Some(Access::Block),
            ..t
        };
        let back = VolumeTags::decode("csi-x", block.encode().iter().map(String::as_str)).unwrap();
        assert_eq!(back.access, Some(Access::Block));
    }

    /// What a Kubernetes volume's LV name says is not repeated in its
    /// tags: a PV name (`pvc-<uuid>`) is spelled out by the LV name, and
    /// external-provisioner's `pvname` parameter equals it.
    #[test]
    fn tags_leave_out_what_the_lv_name_says() {
        let pv = "pvc-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let params: BTreeMap<String, String> = [
            ("pvname", pv),
            ("pvcname", "data-postgres-0"),
            ("pvcns", "default"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let t = VolumeTags {
            owner: "thinpool.csi.storage.dev".into(),
            co_name: pv.into(),
            access: Some(Access::Mount {
                fs_type: "ext4".into(),
            }),
            params,
            mutable: BTreeMap::new(),
            class_options: BTreeMap::new(),
            from: None,
            encrypted: false,
        };
        let enc = t.encode();
        assert!(!enc.iter().any(|t| t.starts_with(TAG_NAME)), "{enc:?}");
        assert!(enc.contains(&"tpcsi.p.pvname=:n".to_string()), "{enc:?}");
        let lv = lv_name_for(pv);
        assert_eq!(
            VolumeTags::decode(&lv, enc.iter().map(String::as_str)),
            Some(t.clone())
        );
        // The bytes every metadata write repeats, before and after.
        let written: usize = enc.iter().map(|t| t.len() + 4).sum();
        let before = written - "tpcsi.p.pvname=:n".len()
            + "tpcsi.p.pvname=".len()
            + 2 * pv.len()
            + "tpcsi.name=".len()
            + 2 * pv.len()
            + 4;
        eprintln!("tags of a Kubernetes volume: {before} -> {written} bytes");
        assert!(written * 10 < before * 6, "{before} -> {written}");
        // Without a name tag, only the LV name that spells it is ours: a
        // name of another shape, or whose hash does not match, is not.
        for other in ["csi-x", &lv[..lv.len() - 1], &format!("{lv}0")] {
            assert_eq!(
                VolumeTags::decode(other, enc.iter().map(String::as_str)),
                None
            );
        }
        let forged = format!("csi-{pv}-0000000000000000");
        assert_eq!(
            VolumeTags::decode(&forged, enc.iter().map(String::as_str)),
            None
        );
        // A name the LV name cannot spell (too long, upper case, other
        // characters) keeps its tag.
        for name in [
            "snapshot-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            "Data",
            "a_b",
        ] {
            let t = VolumeTags {
                co_name: name.into(),
                ..t.clone()
            };
            let enc = t.encode();
            assert!(enc.iter().any(|t| t.starts_with(TAG_NAME)), "{name}");
            let back = VolumeTags::decode(&lv_name_for(name), enc.iter().map(String::as_str));
            assert_eq!(back, Some(t));
        }
    }

    #[test]
    fn lvs_without_owner_or_with_damaged_tags_are_not_ours() {
        assert!(VolumeTags::decode("csi-x", ["tpcsi.name=6161"]).is_none());
        assert!(VolumeTags::decode("csi-x", ["tpcsi.owner=x", "tpcsi.name=zz"]).is_none());
        assert!(VolumeTags::decode("csi-x", ["tpcsi.owner=x", "tpcsi.name=616"]).is_none());
        assert!(VolumeTags::decode("csi-x", ["tpcsi.owner=x", "other"]).is_none());
        let t =
            VolumeTags::decode("csi-x", ["tpcsi.owner=x", "tpcsi.name=6161", "foreign"]).unwrap();
        assert_eq!(t.co_name, "aa");
        assert_eq!(t.access, None);
    }

    #[test]
    fn capability_must_fit_recorded_access() {
        let ext4 = Access::Mount {
            fs_type: "ext4".into(),
        };
        let xfs = Access::Mount {
            fs_type: "xfs".into(),
        };
        assert!(fits("v", Some(&ext4), &ext4).is_ok());
        let why = fits("v", Some(&ext4), &xfs).unwrap_err();
        assert!(why.contains("ext4") && why.contains("xfs"), "{why}");
        assert!(fits("v", Some(&Access::Block), &ext4).is_err());
        assert!(fits("v", Some(&ext4), &Access::Block).is_err());
        assert!(fits("v", None, &Access::Block).is_ok());
    }

    #[test]
    fn snapshot_ids_and_volume_ids_never_meet() {
        let snap = snapshot_lv_name_for("snapshot-1");
        let vol = lv_name_for("snapshot-1");
        assert!(is_snapshot_id(&snap) && !is_volume_id(&snap));
        assert!(is_volume_id(&vol) && !is_snapshot_id(&vol));
        assert_ne!(snap, vol);
        assert!(!is_snapshot_id("snap-../x-0123456789abcdef"));
    }

    #[test]
    fn snapshot_tags_round_trip_and_are_no_volume() {
        let t = SnapshotTags {
            owner: "d.x".into(),
            co_name: "snap one".into(),
            source: lv_name_for("pvc-1"),
            access: Some(Access::Mount {
                fs_type: "xfs".into(),
            }),
            group: Some(GroupTag {
                id: group_id_for("g1"),
                members: 3,
            }),
            encrypted: true,
        };
        let enc = t.encode();
        assert_eq!(
            SnapshotTags::decode(enc.iter().map(String::as_str)),
            Some(t)
        );
        assert!(is_group_id(&group_id_for("g1")) && !is_snapshot_id(&group_id_for("g1")));
        let member = group_member_name("g1", &lv_name_for("pvc-1"));
        assert!(is_snapshot_id(&member));
        assert_ne!(member, group_member_name("g1", &lv_name_for("pvc-2")));
        // A snapshot LV is never taken for a volume.
        assert_eq!(
            VolumeTags::decode("csi-x", enc.iter().map(String::as_str)),
            None
        );
        // A source of the wrong shape is no snapshot of ours.
        let bad = ["tpcsi.owner=d.x", "tpcsi.name=61", "tpcsi.source=vg0/root"];
        assert_eq!(SnapshotTags::decode(bad), None);
    }

    #[test]
    fn volume_sources_round_trip() {
        for from in [
            ContentSource::Snapshot(snapshot_lv_name_for("s")),
            ContentSource::Volume(lv_name_for("v")),
        ] {
            let t = VolumeTags {
                owner: "d.x".into(),
                co_name: "restored".into(),
                access: Some(Access::Block),
                params: BTreeMap::new(),
                mutable: BTreeMap::new(),
                class_options: BTreeMap::new(),
                from: Some(from),
                encrypted: false,
            };
            let enc = t.encode();
            let lv = lv_name_for(&t.co_name);
            assert_eq!(
                VolumeTags::decode(&lv, enc.iter().map(String::as_str)),
                Some(t)
            );
        }
        // A damaged source tag makes the LV not ours to touch.
        let bad = [
            "tpcsi.owner=d.x",
            "tpcsi.name=61",
            "tpcsi.from=volume:vg0/root",
        ];
        assert_eq!(VolumeTags::decode("csi-x", bad), None);
    }

    #[test]
    fn legacy_staging_tags_are_read() {
        let tags = vec![
            "tpcsi.owner=x".to_string(),
            format!("{LEGACY_TAG_STAGED}{}", hex(b"/var/lib/kubelet/s")),
        ];
        let (tag, path) = legacy_staged_path(&tags).unwrap();
        assert_eq!(tag, tags[1]);
        assert_eq!(path, std::path::Path::new("/var/lib/kubelet/s"));
        assert!(legacy_staged_path(&["tpcsi.staged=zz".to_string()]).is_none());
        assert!(legacy_staged_path(&[]).is_none());
    }

    #[test]
    fn hex_round_trip() {
        assert_eq!(hex(b"\x00\xffA"), "00ff41");
        assert_eq!(unhex("00ff41").unwrap(), b"\x00\xffA");
        assert!(unhex("0").is_none());
        assert!(unhex("g0").is_none());
        assert!(unhex("é0").is_none());
        assert!(unhex("+f").is_none(), "a sign is no hex digit");
        assert_eq!(unhex("FF").unwrap(), b"\xff");
    }

    /// The listing decode gives decode's verdict on every tag list, and
    /// the same access, mutable parameters and source.
    #[test]
    fn listed_tags_agree_with_decode() {
        let spelled = lv_name_for("pvc-1");
        let hashed = lv_name_for("Data_1");
        let hex_of = |s: &str| hex(s.as_bytes());
        let owner = format!("{TAG_OWNER}d.x");
        let name_tag = format!("{TAG_NAME}{}", hex_of("Data_1"));
        let good = [
            owner.clone(),
            format!("{TAG_ACCESS}mount:ext4"),
            format!("{TAG_PARAM}a={}", hex_of("1")),
            format!("{TAG_PARAM}pv={SAME_AS_NAME}"),
            format!("{TAG_MUTABLE}readAheadSectors={}", hex_of("256")),
            format!("{TAG_CLASS_OPTION}mkfs={}", hex_of("-m 0")),
            format!("{TAG_FROM}snapshot:{}", snapshot_lv_name_for("s1")),
            TAG_CRYPT.to_string(),
            "someone.else=1".to_string(),
        ];
        let cases: Vec<(String, Vec<String>)> = vec![
            (spelled.clone(), good.to_vec()),
            (
                hashed.clone(),
                [&good[..], std::slice::from_ref(&name_tag)].concat(),
            ),
            // No name tag and a name the LV name does not spell out.
            (hashed.clone(), good.to_vec()),
            (spelled.clone(), vec![format!("{TAG_ACCESS}block")]),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_PARAM}a=zz")],
            ),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_PARAM}a=f")],
            ),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_PARAM}a")],
            ),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_PARAM}a=ff")],
            ),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_CLASS_OPTION}m=c3")],
            ),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_MUTABLE}k=0")],
            ),
            (hashed.clone(), vec![owner.clone(), format!("{TAG_NAME}ff")]),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_FROM}nothing")],
            ),
            (
                spelled.clone(),
                vec![owner.clone(), format!("{TAG_SOURCE}{spelled}")],
            ),
            // A copy still being filled is no volume yet.
            (
                spelled.clone(),
                [&good[..], &[filling_tag(4096, "d.x")]].concat(),
            ),
        ];
        let mut kept = 0;
        for (lv, tags) in &cases {
            let full = VolumeTags::decode(lv, tags.iter().map(String::as_str));
            let listed = VolumeTags::listed(lv, tags.iter().map(String::as_str));
            assert_eq!(full.is_some(), listed.is_some(), "{lv} {tags:?}");
            if let (Some(f), Some(l)) = (full, listed) {
                kept += 1;
                assert_eq!(
                    (f.owner.as_str(), f.access, f.mutable, f.from),
                    (l.owner, l.access, l.mutable, l.from)
                );
            }
        }
        assert_eq!(kept, 2, "the two good cases are volumes");
    }

    #[test]
    fn a_filling_tag_records_its_offset_and_driver() {
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let t = tags(&["tpcsi.p.a=31", "tpcsi.filling=1048576:d.x"]);
        assert_eq!(filling(&t), Some((1 << 20, "d.x")));
        let t = tags(&["tpcsi.filling=x:d.x"]);
        assert_eq!(filling(&t), Some((0, "d.x")), "unreadable: start again");
        assert_eq!(filling(&tags(&["tpcsi.owner=d"])), None);
        assert_eq!(filling(&[filling_tag(7, "d.y")]), Some((7, "d.y")));
        // An LVM tag cannot hold a keyed id's `~`.
        let p = pulled_tag("nabcdef0123~snap-s1-0123456789abcdef");
        assert!(
            p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._=".contains(c)),
            "{p}"
        );
    }

    #[test]
    fn a_snapshot_taken_for_a_clone_names_it_and_its_expiry() {
        let t = vec![
            "tpcsi.owner=d".to_string(),
            clone_for_tag("pvc-9/x:y", 1_900_000_000),
        ];
        assert_eq!(
            clone_for(&t),
            Some(("pvc-9/x:y".to_string(), 1_900_000_000))
        );
        // Only what LVM takes in a tag.
        assert!(
            t[1].chars()
                .all(|c| c.is_ascii_alphanumeric() || "._=:-".contains(c)),
            "{}",
            t[1]
        );
        assert_eq!(clone_for(&t[..1]), None);
        assert_eq!(
            clone_for(&["tpcsi.clone-for=zz:1".to_string()]),
            None,
            "no hex: no clone"
        );
        let v = via_tag("nabcdef0123~snap-s1-0123456789abcdef");
        assert!(v.starts_with(TAG_VIA) && !v.contains('~'), "{v}");
        // Neither tag makes a snapshot or a volume of another LV.
        let snap = SnapshotTags {
            owner: "d".into(),
            co_name: "s".into(),
            source: lv_name_for("v"),
            access: None,
            group: None,
            encrypted: false,
        };
        let mut tags = snap.encode();
        tags.push(clone_for_tag("c", 1));
        assert_eq!(
            SnapshotTags::decode(tags.iter().map(String::as_str)),
            Some(snap)
        );
    }

    #[test]
    fn a_spelled_out_name_is_read_back_only_with_its_own_hash() {
        let name = "pvc-0a1b2c3d-4b5a-6978-8796-a5b4c3d2e1f0";
        let lv = lv_name_for(name);
        assert_eq!(name_in(&lv).as_deref(), Some(name));
        assert_eq!(
            name_in(&in_class(Some("fast"), lv.clone())).as_deref(),
            Some(name)
        );
        let (body, hash) = lv.split_at(lv.len() - HASH_HEX);
        let wrong = format!("{body}{}", if hash.starts_with('0') { "1" } else { "0" }) + &hash[1..];
        assert_eq!(name_in(&wrong), None, "another name's hash");
        assert_eq!(name_in(&format!("{body}{}", hash.to_uppercase())), None);
        assert_eq!(name_in(&format!("{body}{hash}0")), None, "a longer tail");
        // A name that is not spelled out (too long, or other characters)
        // is never read from the LV name.
        let long = "a".repeat(READABLE_LEN + 1);
        assert_eq!(name_in(&lv_name_for(&long)), None);
        assert_eq!(name_in(&lv_name_for("Data_1")), None);
    }

    #[test]
    fn driver_and_lvm_names() {
        validate_driver_name("thinpool.csi.example.org").unwrap();
        for bad in [
            "",
            "nodots",
            "Upper.case",
            "-a.b",
            "a.b-",
            &format!("{}.x", "a".repeat(63)),
        ] {
            assert!(validate_driver_name(bad).is_err(), "{bad:?}");
        }
        validate_lvm_name("vg_0+x.y-z").unwrap();
        for bad in ["", "-a", "..", "a/b", "a b", "a\0"] {
            assert!(validate_lvm_name(bad).is_err(), "{bad:?}");
        }
        validate_node_id("node-1.example_x").unwrap();
        assert!(validate_node_id("a/b").is_err());
        assert!(validate_node_id(&"n".repeat(129)).is_err());
    }
}
