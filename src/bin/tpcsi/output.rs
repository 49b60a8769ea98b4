//! What the commands print: one serde record per answer (its JSON field
//! names are the interface for scripts, and stay), and a readable table
//! of the same record.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use thinpool_csi::naming::class_of;
use thinpool_csi::proto::csi::v1 as csi;

/// An answer: JSON for scripts, a table for people.
pub trait Render: Serialize {
    fn table(&self) -> String;
}

/// Columns padded to their widest cell, two spaces apart; lines carry no
/// trailing blanks.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (cell, width) in cells.zip(&widths) {
            l.push_str(cell);
            l.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 2));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `key:  value` lines, the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let _ = writeln!(out, "{k}:{:pad$}{v}", "", pad = width - k.len() + 2);
    }
    out
}

/// Bytes as a person reads them: the largest binary unit the size reaches,
/// exact when it divides, else with one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut unit = 0;
    let mut div: u64 = 1024;
    while unit + 1 < UNITS.len() && bytes >= div * 1024 {
        unit += 1;
        div *= 1024;
    }
    if bytes % div == 0 {
        format!("{} {}", bytes / div, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / div as f64, UNITS[unit])
    }
}

/// [`human`], or `-` for a size the driver did not give.
fn human_opt(bytes: Option<u64>) -> String {
    bytes.map(human).unwrap_or_else(|| "-".into())
}

/// Seconds since the epoch as RFC 3339 UTC (`2026-11-24T23:52:07Z`).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Days to a civil date (proleptic Gregorian), after Howard Hinnant's
    // well-known derivation: eras of 400 years starting on 1 March.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn bytes(v: i64) -> u64 {
    v.max(0) as u64
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
}

impl From<&csi::VolumeCondition> for Condition {
    fn from(c: &csi::VolumeCondition) -> Condition {
        Condition {
            abnormal: c.abnormal,
            message: c.message.clone(),
        }
    }
}

fn condition_cell(c: &Option<Condition>) -> String {
    match c {
        None => "-".into(),
        Some(c) if c.abnormal => format!("abnormal: {}", c.message),
        Some(_) => "ok".into(),
    }
}

/// A volume, from CreateVolume, ControllerGetVolume or ListVolumes.
#[derive(Debug, Serialize, PartialEq)]
pub struct VolumeOut {
    pub volume_id: String,
    /// The device class the id names (`default` for none).
    pub device_class: String,
    pub capacity_bytes: u64,
    /// `mount` or `block`, from the volume context's `fsType`.
    pub access_type: String,
    pub fs_type: Option<String>,
    /// `{"snapshot": id}` or `{"volume": id}`.
    pub content_source: Option<BTreeMap<String, String>>,
    pub volume_context: BTreeMap<String, String>,
    pub condition: Option<Condition>,
    /// The node that holds it, when listed through the cluster's
    /// controller (from the id's node key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl VolumeOut {
    pub fn new(v: &csi::Volume, condition: Option<&csi::VolumeCondition>) -> VolumeOut {
        use csi::volume_content_source::Type;
        let fs_type = v.volume_context.get("fsType").cloned();
        let content_source = v
            .content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
            .map(|t| match t {
                Type::Snapshot(s) => ("snapshot".to_string(), s.snapshot_id.clone()),
                Type::Volume(v) => ("volume".to_string(), v.volume_id.clone()),
            })
            .map(|kv| [kv].into());
        VolumeOut {
            volume_id: v.volume_id.clone(),
            device_class: class_of(&v.volume_id).to_string(),
            capacity_bytes: bytes(v.capacity_bytes),
            access_type: if fs_type.is_some() { "mount" } else { "block" }.into(),
            fs_type,
            content_source,
            volume_context: v.volume_context.clone().into_iter().collect(),
            condition: condition.map(Condition::from),
            node: None,
        }
    }
}

impl Entry for VolumeOut {
    const PLURAL: &'static str = "volumes";
    const HEADERS: &'static [&'static str] = &[
        "VOLUME ID",
        "CLASS",
        "SIZE",
        "ACCESS",
        "SOURCE",
        "CONDITION",
    ];

    fn device_class(&self) -> &str {
        &self.device_class
    }

    fn id(&self) -> &str {
        &self.volume_id
    }

    fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    fn set_node(&mut self, node: Option<String>) {
        self.node = node;
    }

    fn row(&self) -> Vec<String> {
        let source = match &self.content_source {
            Some(m) => m
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            None => "-".into(),
        };
        vec![
            self.volume_id.clone(),
            self.device_class.clone(),
            human(self.capacity_bytes),
            self.fs_type.clone().unwrap_or_else(|| "block".into()),
            source,
            condition_cell(&self.condition),
        ]
    }
}

/// One row of a listing: a volume or a snapshot.
pub trait Entry: Serialize {
    /// The listing's JSON field, and what its table calls the entries.
    const PLURAL: &'static str;
    const HEADERS: &'static [&'static str];
    /// The device class the entry's id names (`default` for none).
    fn device_class(&self) -> &str;
    fn id(&self) -> &str;
    /// The node that holds it (listed through the cluster's controller).
    fn node(&self) -> Option<&str>;
    fn set_node(&mut self, node: Option<String>);
    fn row(&self) -> Vec<String>;
}

/// Every volume or snapshot, or those of device class `class` (`--class`:
/// ListVolumes and ListSnapshots take no class, the id says it). JSON:
/// `{"volumes": [...]}` or `{"snapshots": [...]}`.
#[derive(Debug)]
pub struct Listing<T> {
    pub entries: Vec<T>,
    pub class: Option<String>,
}

pub type VolumeList = Listing<VolumeOut>;
pub type SnapshotList = Listing<SnapshotOut>;

impl<T: Entry> Listing<T> {
    /// `all` of device class `class` (all: `None`), each with the node
    /// that holds it when `nodes` are the cluster's controller's.
    pub fn new(
        all: Vec<T>,
        class: Option<String>,
        nodes: Option<&crate::cluster::Nodes>,
    ) -> Listing<T> {
        let entries = all
            .into_iter()
            .filter(|e| class.as_deref().is_none_or(|c| e.device_class() == c))
            .map(|mut e| {
                e.set_node(nodes.map(|n| n.node_of(e.id())));
                e
            })
            .collect();
        Listing { entries, class }
    }
}

impl<T: Entry> Serialize for Listing<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(T::PLURAL, &self.entries)?;
        m.end()
    }
}

/// One volume or snapshot alone (create, get): a table of one row.
impl<T: Entry> Render for T {
    fn table(&self) -> String {
        table(T::HEADERS, &[self.row()])
    }
}

impl<T: Entry> Render for Listing<T> {
    fn table(&self) -> String {
        let mut rows: Vec<_> = self.entries.iter().map(T::row).collect();
        let mut headers = T::HEADERS.to_vec();
        // Through the cluster's controller: the node of each, first.
        if self.entries.iter().any(|e| e.node().is_some()) {
            headers.insert(0, "NODE");
            for (row, e) in rows.iter_mut().zip(&self.entries) {
                row.insert(0, e.node().unwrap_or_default().to_string());
            }
        }
        match &self.class {
            _ if !rows.is_empty() => table(&headers, &rows),
            Some(c) => format!("no {} in device class {c}\n", T::PLURAL),
            None => format!("no {}\n", T::PLURAL),
        }
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct SnapshotOut {
    pub snapshot_id: String,
    /// The device class the id names (`default` for none).
    pub device_class: String,
    pub source_volume_id: String,
    pub size_bytes: u64,
    pub creation_time: Option<String>,
    pub ready_to_use: bool,
    pub group_snapshot_id: Option<String>,
    /// The node that holds it, when listed through the cluster's
    /// controller (from the id's node key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl SnapshotOut {
    pub fn new(s: &csi::Snapshot) -> SnapshotOut {
        SnapshotOut {
            snapshot_id: s.snapshot_id.clone(),
            device_class: class_of(&s.snapshot_id).to_string(),
            source_volume_id: s.source_volume_id.clone(),
            size_bytes: bytes(s.size_bytes),
            creation_time: s.creation_time.as_ref().map(|t| rfc3339(t.seconds)),
            ready_to_use: s.ready_to_use,
            group_snapshot_id: Some(s.group_snapshot_id.clone()).filter(|g| !g.is_empty()),
            node: None,
        }
    }
}

impl Entry for SnapshotOut {
    const PLURAL: &'static str = "snapshots";
    const HEADERS: &'static [&'static str] = &[
        "SNAPSHOT ID",
        "CLASS",
        "SOURCE VOLUME",
        "SIZE",
        "CREATED",
        "READY",
    ];

    fn device_class(&self) -> &str {
        &self.device_class
    }

    fn id(&self) -> &str {
        &self.snapshot_id
    }

    fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    fn set_node(&mut self, node: Option<String>) {
        self.node = node;
    }

    fn row(&self) -> Vec<String> {
        vec![
            self.snapshot_id.clone(),
            self.device_class.clone(),
            self.source_volume_id.clone(),
            human(self.size_bytes),
            self.creation_time.clone().unwrap_or_else(|| "-".into()),
            yes_no(self.ready_to_use),
        ]
    }
}

/// The answer of a call that returns nothing but success: what was done
/// to which object (`{"volume_id": …, "action": "deleted"}`).
#[derive(Debug, Serialize)]
pub struct Done {
    #[serde(flatten)]
    pub object: BTreeMap<String, String>,
    pub action: &'static str,
}

impl Done {
    pub fn new(action: &'static str, object: &[(&str, &str)]) -> Done {
        Done {
            object: object
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            action,
        }
    }
}

impl Render for Done {
    fn table(&self) -> String {
        let what: Vec<String> = self
            .object
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{}: {}\n", self.action, what.join(" "))
    }
}

#[derive(Debug, Serialize)]
pub struct ProbeOut {
    pub services: Vec<ProbeService>,
    /// The default device class's pool: the readiness `probe` gave
    /// before device classes, kept for scripts.
    pub pool: PoolReadiness,
    pub default_device_class: String,
    /// Every class's pool, the default one's too, in the manifest's order.
    pub device_classes: Vec<PoolReadiness>,
}

/// Whether a device class's pool takes a new volume, from GetCapacity.
#[derive(Debug, Serialize, Clone)]
pub struct PoolReadiness {
    pub device_class: String,
    pub takes_new_volumes: bool,
    /// GetCapacity's `available_capacity`; absent when it failed.
    pub available_capacity: Option<u64>,
    /// Why it takes none.
    pub reason: Option<String>,
    /// The gRPC code of a failed GetCapacity.
    #[serde(skip)]
    pub code: Option<tonic::Code>,
}

impl PoolReadiness {
    /// Class `device_class`'s readiness from its GetCapacity answer.
    pub fn new(
        device_class: &str,
        answer: &Result<csi::GetCapacityResponse, tonic::Status>,
    ) -> PoolReadiness {
        let device_class = device_class.to_string();
        let r = match answer {
            Ok(r) => r,
            Err(s) => {
                return PoolReadiness {
                    device_class,
                    takes_new_volumes: false,
                    available_capacity: None,
                    reason: Some(format!("GetCapacity: {}", s.message())),
                    code: Some(s.code()),
                }
            }
        };
        let available = bytes(r.available_capacity);
        let takes = available > 0 && r.maximum_volume_size.is_none_or(|m| m > 0);
        PoolReadiness {
            device_class,
            takes_new_volumes: takes,
            available_capacity: Some(available),
            reason: (!takes).then(|| {
                "GetCapacity answers 0: the pool is full, failed, its metadata \
                 read-only, or the overprovision limit is reached (`lvs -a` and \
                 the driver's log say which)"
                    .to_string()
            }),
            code: None,
        }
    }

    /// The exit this readiness gives: a pool that takes no volume is
    /// RESOURCE_EXHAUSTED, a GetCapacity error keeps its own code.
    pub fn verdict(&self) -> Result<(), tonic::Status> {
        let Some(r) = &self.reason else {
            return Ok(());
        };
        let message = format!(
            "the pool of device class {} takes no new volume: {r}",
            self.device_class
        );
        Err(tonic::Status::new(
            self.code.unwrap_or(tonic::Code::ResourceExhausted),
            message,
        ))
    }

    fn summary(&self) -> String {
        match (&self.reason, self.available_capacity) {
            (None, Some(a)) => format!("takes new volumes ({} available)", human(a)),
            (Some(r), _) => format!("takes no new volume: {r}"),
            (None, None) => "unknown".into(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ProbeService {
    /// `csi` or `csi-addons`.
    pub service: &'static str,
    pub endpoint: String,
    /// The driver's answer; an absent `ready` means ready (CSI).
    pub ready: bool,
}

impl Render for ProbeOut {
    fn table(&self) -> String {
        let rows: Vec<_> = self
            .services
            .iter()
            .map(|s| vec![s.service.into(), s.endpoint.clone(), yes_no(s.ready)])
            .collect();
        let mut out = table(&["SERVICE", "ENDPOINT", "READY"], &rows);
        // One class: `pool: …`, as before classes; else one line a class.
        let one = self.device_classes.len() == 1;
        for p in &self.device_classes {
            let label = match p.device_class == self.default_device_class {
                _ if one => "pool".to_string(),
                true => format!("pool of class {} (default)", p.device_class),
                false => format!("pool of class {}", p.device_class),
            };
            let _ = writeln!(out, "{label}: {}", p.summary());
        }
        out
    }
}

#[derive(Debug, Serialize)]
pub struct InfoOut {
    pub name: String,
    pub vendor_version: String,
    pub manifest: BTreeMap<String, String>,
    pub plugin_capabilities: Vec<String>,
    pub controller_capabilities: Vec<String>,
    /// The Node service's answers; absent from the cluster's controller,
    /// which serves no Node service (its manifest names its nodes).
    #[serde(flatten)]
    pub node: Option<NodeInfoOut>,
    /// The CSI-Addons identity; absent when no CSI-Addons socket is configured.
    pub addons: Option<AddonsInfo>,
}

#[derive(Debug, Serialize)]
pub struct NodeInfoOut {
    pub node_id: String,
    pub max_volumes_per_node: i64,
    pub accessible_topology: BTreeMap<String, String>,
    pub node_capabilities: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct AddonsInfo {
    pub name: String,
    pub vendor_version: String,
    pub capabilities: Vec<String>,
}

fn map_cell(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Render for InfoOut {
    fn table(&self) -> String {
        let mut pairs = vec![
            ("name", self.name.clone()),
            ("vendor version", self.vendor_version.clone()),
            ("manifest", map_cell(&self.manifest)),
            ("plugin capabilities", self.plugin_capabilities.join(", ")),
            (
                "controller capabilities",
                self.controller_capabilities.join(", "),
            ),
        ];
        match &self.node {
            Some(n) => pairs.extend([
                ("node id", n.node_id.clone()),
                ("max volumes per node", n.max_volumes_per_node.to_string()),
                ("topology", map_cell(&n.accessible_topology)),
                ("node capabilities", n.node_capabilities.join(", ")),
            ]),
            None => pairs.push((
                "node",
                "none: the cluster's controller (its nodes are in the manifest)".to_string(),
            )),
        }
        if let Some(a) = &self.addons {
            pairs.push(("csi-addons name", a.name.clone()));
            pairs.push(("csi-addons capabilities", a.capabilities.join(", ")));
        }
        fields(&pairs)
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct CapacityOut {
    /// The device class asked about (`deviceClass`, else the driver's
    /// `default_device_class` from GetPluginInfo's manifest).
    pub device_class: String,
    pub available_capacity: u64,
    pub maximum_volume_size: Option<u64>,
    pub minimum_volume_size: Option<u64>,
    /// From the driver's metrics; absent when they could not be read.
    pub metadata: Option<crate::scrape::Metadata>,
    /// From the driver's metrics; absent when the class's autopilot is
    /// off or the metrics could not be read.
    pub autopilot: Option<crate::scrape::Autopilot>,
}

impl From<&csi::GetCapacityResponse> for CapacityOut {
    fn from(r: &csi::GetCapacityResponse) -> CapacityOut {
        CapacityOut {
            device_class: thinpool_csi::naming::DEFAULT_CLASS.to_string(),
            available_capacity: bytes(r.available_capacity),
            maximum_volume_size: r.maximum_volume_size.map(bytes),
            minimum_volume_size: r.minimum_volume_size.map(bytes),
            metadata: None,
            autopilot: None,
        }
    }
}

impl Render for CapacityOut {
    fn table(&self) -> String {
        self.rows(&self.device_class)
    }
}

impl CapacityOut {
    /// The table, with `class` shown as the device class.
    fn rows(&self, class: &str) -> String {
        let mut rows = vec![
            ("device class", class.to_string()),
            ("available", human(self.available_capacity)),
            ("maximum volume size", human_opt(self.maximum_volume_size)),
            ("minimum volume size", human_opt(self.minimum_volume_size)),
        ];
        if let Some(m) = &self.metadata {
            let left = |n: Option<u64>| n.map_or("-".into(), |n| format!("room for {n} more LVs"));
            rows.push((
                "pool metadata",
                format!(
                    "{} used of {}, {}",
                    m.pool_metadata_percent
                        .map_or("-".into(), |p| format!("{p:.1}%")),
                    human_opt(m.pool_metadata_size),
                    left(m.pool_lvs_left)
                ),
            ));
            rows.push((
                "VG metadata area",
                format!(
                    "{} free of {} (LVM uses half), {}",
                    human_opt(m.vg_metadata_area_free),
                    human_opt(m.vg_metadata_area_size),
                    left(m.vg_lvs_left)
                ),
            ));
        }
        if let Some(a) = &self.autopilot {
            rows.push((
                "autopilot",
                format!(
                    "grew data {}x, metadata {}x, backing file {}x; {} refusals{}",
                    a.data_growths,
                    a.metadata_growths,
                    a.backing_file_growths,
                    a.refusals,
                    if a.blocked {
                        "; BLOCKED (see the volumes' conditions)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        fields(&rows)
    }
}

/// `capacity` without a class: every class the driver serves.
#[derive(Debug, Serialize, PartialEq)]
pub struct CapacitiesOut {
    pub default_device_class: String,
    pub device_classes: Vec<ClassCapacity>,
}

/// One class's GetCapacity answer, or its error (a class whose VG is
/// missing answers UNAVAILABLE while the others serve).
#[derive(Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ClassCapacity {
    Answered(CapacityOut),
    Failed { device_class: String, error: String },
}

impl Render for CapacitiesOut {
    fn table(&self) -> String {
        let blocks: Vec<String> = self
            .device_classes
            .iter()
            .map(|c| match c {
                ClassCapacity::Answered(out) if out.device_class == self.default_device_class => {
                    out.rows(&format!("{} (default)", out.device_class))
                }
                ClassCapacity::Answered(out) => out.table(),
                ClassCapacity::Failed {
                    device_class,
                    error,
                } => fields(&[
                    ("device class", device_class.clone()),
                    ("error", error.clone()),
                ]),
            })
            .collect();
        blocks.join("\n")
    }
}

/// `capacity` through the cluster's controller: each node's answer for
/// one device class. JSON: `{"nodes": [...]}`.
#[derive(Debug, Serialize)]
pub struct NodeCapacities {
    pub nodes: Vec<NodeCapacity>,
}

#[derive(Debug, Serialize)]
pub struct NodeCapacity {
    pub node: String,
    /// Named by the controller as missing: its pod is gone, its Node not.
    pub missing: bool,
    /// The `deviceClass` asked, or the node's default.
    pub device_class: String,
    /// 0 for a node the controller cannot reach.
    pub available_capacity: Option<u64>,
    pub maximum_volume_size: Option<u64>,
    pub error: Option<String>,
}

impl Render for NodeCapacities {
    fn table(&self) -> String {
        if self.nodes.is_empty() {
            return "no nodes\n".to_string();
        }
        let rows: Vec<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| {
                let size = |b: Option<u64>| b.map(human).unwrap_or_else(|| "-".into());
                vec![
                    if n.missing {
                        format!("{} (missing)", n.node)
                    } else {
                        n.node.clone()
                    },
                    n.device_class.clone(),
                    size(n.available_capacity),
                    size(n.maximum_volume_size),
                    n.error.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        table(
            &["NODE", "CLASS", "AVAILABLE", "MAX VOLUME", "ERROR"],
            &rows,
        )
    }
}

#[derive(Debug, Serialize)]
pub struct ExpandOut {
    pub volume_id: String,
    pub capacity_bytes: u64,
    pub node_expansion_required: bool,
    /// What NodeExpandVolume answered, when it was called (`--path`).
    pub node_capacity_bytes: Option<u64>,
}

impl Render for ExpandOut {
    fn table(&self) -> String {
        let node = match self.node_capacity_bytes {
            Some(b) => format!("grown to {}", human(b)),
            None if self.node_expansion_required => {
                "required: run expand again with --path, or stage the volume".into()
            }
            None => "not required".into(),
        };
        fields(&[
            ("volume", self.volume_id.clone()),
            ("capacity", human(self.capacity_bytes)),
            ("node expansion", node),
        ])
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct UsageOut {
    /// `bytes` or `inodes`.
    pub unit: String,
    pub total: u64,
    pub used: u64,
    pub available: u64,
}

#[derive(Debug, Serialize)]
pub struct StatsOut {
    pub volume_id: String,
    pub volume_path: String,
    pub usage: Vec<UsageOut>,
    pub condition: Option<Condition>,
}

impl StatsOut {
    pub fn new(id: &str, path: &str, r: &csi::NodeGetVolumeStatsResponse) -> StatsOut {
        StatsOut {
            volume_id: id.into(),
            volume_path: path.into(),
            usage: r
                .usage
                .iter()
                .map(|u| UsageOut {
                    unit: csi::volume_usage::Unit::try_from(u.unit)
                        .map(|u| u.as_str_name().to_ascii_lowercase())
                        .unwrap_or_else(|_| format!("unit {}", u.unit)),
                    total: bytes(u.total),
                    used: bytes(u.used),
                    available: bytes(u.available),
                })
                .collect(),
            condition: r.volume_condition.as_ref().map(Condition::from),
        }
    }
}

impl Render for StatsOut {
    fn table(&self) -> String {
        let rows: Vec<_> = self
            .usage
            .iter()
            .map(|u| {
                let f = |v: u64| {
                    if u.unit == "bytes" {
                        human(v)
                    } else {
                        v.to_string()
                    }
                };
                vec![u.unit.clone(), f(u.total), f(u.used), f(u.available)]
            })
            .collect();
        let mut out = table(&["UNIT", "TOTAL", "USED", "AVAILABLE"], &rows);
        let _ = writeln!(out, "condition: {}", condition_cell(&self.condition));
        out
    }
}

#[derive(Debug, Serialize)]
pub struct ReclaimOut {
    pub volume_id: String,
    /// `node` or `controller`.
    pub side: &'static str,
    pub pre_usage_bytes: Option<u64>,
    pub post_usage_bytes: Option<u64>,
    /// pre − post, when both are known (0 when usage grew meanwhile).
    pub reclaimed_bytes: Option<u64>,
}

impl ReclaimOut {
    pub fn new(id: &str, side: &'static str, pre: Option<i64>, post: Option<i64>) -> ReclaimOut {
        let (pre, post) = (pre.map(bytes), post.map(bytes));
        ReclaimOut {
            volume_id: id.into(),
            side,
            pre_usage_bytes: pre,
            post_usage_bytes: post,
            reclaimed_bytes: pre.zip(post).map(|(a, b)| a.saturating_sub(b)),
        }
    }
}

impl Render for ReclaimOut {
    fn table(&self) -> String {
        fields(&[
            ("volume", self.volume_id.clone()),
            ("reclaimed on", self.side.into()),
            ("usage before", human_opt(self.pre_usage_bytes)),
            ("usage after", human_opt(self.post_usage_bytes)),
            ("reclaimed", human_opt(self.reclaimed_bytes)),
        ])
    }
}

#[derive(Debug, Serialize)]
pub struct HealOut {
    pub volume_id: String,
    pub abnormal: bool,
    pub message: String,
}

impl Render for HealOut {
    fn table(&self) -> String {
        fields(&[
            ("volume", self.volume_id.clone()),
            ("abnormal", yes_no(self.abnormal)),
            ("message", self.message.clone()),
        ])
    }
}

/// An error answer (`--json`): the gRPC code by name and number, or a local
/// error with no code.
#[derive(Debug, Serialize, PartialEq)]
pub struct ErrorOut {
    pub code: Option<String>,
    pub code_number: Option<i32>,
    pub message: String,
    pub exit_status: u8,
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_content_source::{SnapshotSource, Type};

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1024), "1 KiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human((1 << 30) + (1 << 29)), "1.5 GiB");
        assert_eq!(human(1 << 40), "1 TiB");
        assert_eq!(human(3 << 50), "3 PiB");
        assert_eq!(human(5 << 60), "5120 PiB");
        assert_eq!(human(260_046_848), "248 MiB");
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_564_327), "2026-11-24T23:52:07Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn tables_align_columns_without_trailing_blanks() {
        let t = table(
            &["A", "LONG HEADER", "C"],
            &[
                vec!["wide cell".into(), "x".into(), "last".into()],
                vec!["y".into(), "z".into(), "".into()],
            ],
        );
        assert_eq!(
            t,
            "A          LONG HEADER  C\nwide cell  x            last\ny          z\n"
        );
        // Every column starts where its header does.
        let lines: Vec<&str> = t.lines().collect();
        let col = lines[0].find("LONG").unwrap();
        assert_eq!(&lines[1][col..col + 1], "x");
        assert_eq!(&lines[2][col..col + 1], "z");
        let f = fields(&[("a", "1".into()), ("longer", "2".into())]);
        assert_eq!(f, "a:       1\nlonger:  2\n");
    }

    /// A table line's cells (two or more spaces apart).
    fn cells(line: &str) -> Vec<&str> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }

    fn volume() -> csi::Volume {
        csi::Volume {
            capacity_bytes: 128 << 20,
            volume_id: "csi-pvc-1-0123456789abcdef".into(),
            volume_context: [("fsType".to_string(), "ext4".to_string())].into(),
            content_source: Some(csi::VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource {
                    snapshot_id: "snap-s-0011223344556677".into(),
                })),
            }),
            accessible_topology: vec![],
        }
    }

    #[test]
    fn volume_json_has_stable_names() {
        let cond = csi::VolumeCondition {
            abnormal: false,
            message: "fine".into(),
        };
        let v = VolumeOut::new(&volume(), Some(&cond));
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(
            j,
            serde_json::json!({
                "volume_id": "csi-pvc-1-0123456789abcdef",
                "device_class": "default",
                "capacity_bytes": 134217728,
                "access_type": "mount",
                "fs_type": "ext4",
                "content_source": {"snapshot": "snap-s-0011223344556677"},
                "volume_context": {"fsType": "ext4"},
                "condition": {"abnormal": false, "message": "fine"},
            })
        );
        let mut block = volume();
        block.volume_context.clear();
        block.content_source = None;
        let b = serde_json::to_value(VolumeOut::new(&block, None)).unwrap();
        assert_eq!(b["access_type"], "block");
        assert!(b["fs_type"].is_null() && b["content_source"].is_null());
        assert!(b["condition"].is_null());
    }

    #[test]
    fn volume_table() {
        let bad = csi::VolumeCondition {
            abnormal: true,
            message: "pool full".into(),
        };
        let list = VolumeList::new(vec![VolumeOut::new(&volume(), Some(&bad))], None, None);
        let t = list.table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with("VOLUME ID"), "{t}");
        assert_eq!(
            cells(lines[1]),
            vec![
                "csi-pvc-1-0123456789abcdef",
                "default",
                "128 MiB",
                "ext4",
                "snapshot snap-s-0011223344556677",
                "abnormal: pool full"
            ]
        );
        assert_eq!(VolumeList::new(vec![], None, None).table(), "no volumes\n");
    }

    #[test]
    fn listings_keep_the_class_asked_for() {
        let mut fast = volume();
        fast.volume_id = "fast.csi-pvc-2-0123456789abcdef".into();
        let all = || vec![VolumeOut::new(&volume(), None), VolumeOut::new(&fast, None)];
        let ids = |l: &VolumeList| {
            l.entries
                .iter()
                .map(|v| v.volume_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&VolumeList::new(all(), None, None)).len(), 2);
        let only_fast = VolumeList::new(all(), Some("fast".into()), None);
        assert_eq!(ids(&only_fast), vec![fast.volume_id.clone()]);
        assert_eq!(cells(only_fast.table().lines().nth(1).unwrap())[1], "fast");
        // `default`: the ids that carry no class.
        assert_eq!(
            ids(&VolumeList::new(all(), Some("default".into()), None)),
            vec![volume().volume_id]
        );
        let none = VolumeList::new(all(), Some("slow".into()), None);
        assert_eq!(none.table(), "no volumes in device class slow\n");
        // JSON: the same field names, the class not among them.
        assert_eq!(
            serde_json::to_value(&none).unwrap(),
            serde_json::json!({"volumes": []})
        );

        let snap = |id: &str| {
            SnapshotOut::new(&csi::Snapshot {
                snapshot_id: id.into(),
                ..Default::default()
            })
        };
        let snaps = || {
            vec![
                snap("snap-a-0011223344556677"),
                snap("fast.snap-b-0011223344556677"),
            ]
        };
        let fast_snaps = SnapshotList::new(snaps(), Some("fast".into()), None);
        assert_eq!(fast_snaps.entries.len(), 1);
        assert_eq!(fast_snaps.entries[0].device_class, "fast");
        assert_eq!(
            SnapshotList::new(snaps(), Some("default".into()), None).entries[0].snapshot_id,
            "snap-a-0011223344556677"
        );
        assert_eq!(SnapshotList::new(snaps(), None, None).entries.len(), 2);
        assert_eq!(
            SnapshotList::new(snaps(), Some("slow".into()), None).table(),
            "no snapshots in device class slow\n"
        );
        assert_eq!(
            SnapshotList::new(vec![], None, None).table(),
            "no snapshots\n"
        );
    }

    #[test]
    fn snapshot_output() {
        let s = csi::Snapshot {
            size_bytes: 1 << 30,
            snapshot_id: "fast.snap-a-0011223344556677".into(),
            source_volume_id: "fast.csi-v-0123456789abcdef".into(),
            creation_time: Some(prost_types::Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        };
        let out = SnapshotOut::new(&s);
        assert_eq!(
            serde_json::to_value(&out).unwrap(),
            serde_json::json!({
                "snapshot_id": "fast.snap-a-0011223344556677",
                "device_class": "fast",
                "source_volume_id": "fast.csi-v-0123456789abcdef",
                "size_bytes": 1073741824,
                "creation_time": "1970-01-01T00:00:00Z",
                "ready_to_use": true,
                "group_snapshot_id": null,
            })
        );
        let t = out.table();
        assert!(t.starts_with("SNAPSHOT ID"), "{t}");
        assert_eq!(
            cells(t.lines().nth(1).unwrap()),
            vec![
                "fast.snap-a-0011223344556677",
                "fast",
                "fast.csi-v-0123456789abcdef",
                "1 GiB",
                "1970-01-01T00:00:00Z",
                "yes"
            ]
        );
        assert!(
            t.contains("1 GiB") && t.contains("1970-01-01T00:00:00Z") && t.contains("yes"),
            "{t}"
        );
    }

    #[test]
    fn stats_reclaim_and_done() {
        use csi::volume_usage::Unit;
        let r = csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    available: 3 << 20,
                    total: 4 << 20,
                    used: 1 << 20,
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: 90,
                    total: 100,
                    used: 10,
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: None,
        };
        let s = StatsOut::new("csi-v", "/p", &r);
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(
            j["usage"][0],
            serde_json::json!({"unit": "bytes", "total": 4194304, "used": 1048576, "available": 3145728})
        );
        assert_eq!(j["usage"][1]["unit"], "inodes");
        assert_eq!(
            s.table(),
            "UNIT    TOTAL  USED   AVAILABLE\n\
             bytes   4 MiB  1 MiB  3 MiB\n\
             inodes  100    10     90\n\
             condition: -\n"
        );

        let rc = ReclaimOut::new("csi-v", "node", Some(10 << 20), Some(4 << 20));
        assert_eq!(rc.reclaimed_bytes, Some(6 << 20));
        assert_eq!(
            ReclaimOut::new("v", "controller", Some(1), Some(5)).reclaimed_bytes,
            Some(0)
        );
        assert_eq!(
            ReclaimOut::new("v", "controller", None, Some(5)).reclaimed_bytes,
            None
        );
        assert!(
            rc.table().contains("reclaimed:     6 MiB"),
            "{}",
            rc.table()
        );

        let d = Done::new("deleted", &[("volume_id", "csi-v")]);
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"volume_id": "csi-v", "action": "deleted"})
        );
        assert_eq!(d.table(), "deleted: volume_id=csi-v\n");
    }

    #[test]
    fn capacity_output() {
        let c = CapacityOut::from(&csi::GetCapacityResponse {
            available_capacity: 800 << 20,
            maximum_volume_size: Some(3 << 30),
            minimum_volume_size: None,
        });
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"device_class": "default", "available_capacity": 838860800, "maximum_volume_size": 3221225472u64, "minimum_volume_size": null, "metadata": null, "autopilot": null})
        );
        assert_eq!(
            c.table(),
            "device class:         default\navailable:            800 MiB\nmaximum volume size:  3 GiB\nminimum volume size:  -\n"
        );
        let mut c = c;
        c.metadata = Some(crate::scrape::Metadata {
            pool_metadata_size: Some(4 << 20),
            pool_metadata_percent: Some(73.25),
            pool_lvs_left: Some(27),
            vg_metadata_area_size: Some(1020 << 10),
            vg_metadata_area_free: Some(500 << 10),
            vg_lvs_left: None,
        });
        let t = c.table();
        assert!(
            t.contains("pool metadata:        73.2% used of 4 MiB, room for 27 more LVs\n")
                && t.contains(
                    "VG metadata area:     500 KiB free of 1020 KiB (LVM uses half), -\n"
                ),
            "{t}"
        );
    }

    #[test]
    fn capacity_of_every_class_shows_each_and_the_ones_down() {
        let fast = CapacityOut {
            device_class: "fast".into(),
            available_capacity: 1 << 30,
            maximum_volume_size: Some(1 << 30),
            minimum_volume_size: None,
            metadata: None,
            autopilot: Some(crate::scrape::Autopilot {
                data_growths: 2,
                blocked: true,
                ..Default::default()
            }),
        };
        let all = CapacitiesOut {
            default_device_class: "fast".into(),
            device_classes: vec![
                ClassCapacity::Failed {
                    device_class: "default".into(),
                    error: "Unavailable: volume group gone".into(),
                },
                ClassCapacity::Answered(fast),
            ],
        };
        let json = serde_json::to_value(&all).unwrap();
        assert_eq!(
            json["device_classes"][0]["error"],
            "Unavailable: volume group gone"
        );
        assert_eq!(json["device_classes"][1]["device_class"], "fast");
        assert_eq!(json["device_classes"][1]["available_capacity"], 1u64 << 30);
        let t = all.table();
        assert!(
            t.contains("device class:  fast (default)") || t.contains("fast (default)"),
            "{t}"
        );
        assert!(
            t.lines().next().unwrap().starts_with("device class:"),
            "{t}"
        );
        assert!(t.contains("grew data 2x") && t.contains("BLOCKED"), "{t}");
        assert!(
            t.contains("error:") && t.contains("volume group gone"),
            "{t}"
        );
        assert_eq!(t.matches("device class:").count(), 2, "{t}");
    }

    #[test]
    fn probe_readiness_follows_get_capacity() {
        let cap = |available, max| {
            Ok(csi::GetCapacityResponse {
                available_capacity: available,
                maximum_volume_size: max,
                minimum_volume_size: None,
            })
        };
        let ok = PoolReadiness::new("default", &cap(64 << 20, Some(1 << 30)));
        assert!(ok.takes_new_volumes && ok.verdict().is_ok());
        let out = ProbeOut {
            services: vec![],
            pool: ok.clone(),
            default_device_class: "default".into(),
            device_classes: vec![ok],
        };
        // One class: the line it had before classes.
        assert!(
            out.table()
                .ends_with("pool: takes new volumes (64 MiB available)\n"),
            "{}",
            out.table()
        );

        // Full, failed or past the overprovision limit: 0 available, or
        // no room for the smallest volume.
        for r in [cap(0, Some(0)), cap(0, None), cap(4 << 20, Some(0))] {
            let p = PoolReadiness::new("default", &r);
            assert!(!p.takes_new_volumes, "{r:?}");
            let e = p.verdict().unwrap_err();
            assert_eq!(e.code(), tonic::Code::ResourceExhausted);
            assert!(e.message().contains("takes no new volume"), "{e:?}");
        }

        // A missing pool: GetCapacity's own error and code.
        let p = PoolReadiness::new(
            "fast",
            &Err(tonic::Status::unavailable("thin pool vg/pool not found")),
        );
        let e = p.verdict().unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(
            e.message().contains("device class fast") && e.message().contains("vg/pool not found"),
            "{e:?}"
        );
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            serde_json::json!({
                "device_class": "fast",
                "takes_new_volumes": false,
                "available_capacity": null,
                "reason": "GetCapacity: thin pool vg/pool not found",
            })
        );
    }
}
