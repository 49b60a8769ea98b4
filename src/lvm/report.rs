//! Parsing of `lvs --reportformat json --units b --nosuffix` output, and the
//! facts derived from it: which LVs are thin volumes of our pool, the pool's
//! health, and the capacity arithmetic.
//!
//! lvm2 2.03.16 prints every value as a JSON string; newer releases can
//! print numbers (`json_std`). Both are accepted.
//!
//! The report of our VG is read straight into [`Lv`] rows
//! ([`Report::parse`]): each row is converted as it is read, and no
//! `serde_json::Value` tree of the document is ever built. A report of 500
//! LVs is 0.3 MiB of text; as a `Value` tree it took 1.5 MiB (a map, a
//! key string and a value per cell), and it was held, with a copy of its
//! rows, beside the text and the previous report at every refresh of the
//! cache. Typed, the rows take 0.3 MiB in 5,500 allocations (about 50,000
//! before, counting the copies).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The columns we ask `lvs` for, in one call.
pub const LVS_FIELDS: &str = "lv_name,vg_name,lv_attr,lv_size,pool_lv,segtype,data_percent,\
metadata_percent,lv_tags,lv_health_status,lv_kernel_major,lv_kernel_minor,vg_extent_size,\
vg_size,vg_free,chunk_size,lv_time,origin,lv_read_ahead,thin_id,lv_metadata_size,vg_mda_size,\
vg_mda_free";

/// Arguments of `lvs` for the report of volume group `vg`.
pub fn lvs_args(vg: &str) -> Vec<String> {
    report_args(LVS_FIELDS, vg)
}

/// Arguments of a JSON report (`lvs`, `vgs`) of `fields` of `target`,
/// sizes in bytes without a suffix.
pub fn report_args(fields: &str, target: &str) -> Vec<String> {
    crate::argv![
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
        target
    ]
}

#[derive(Debug, Clone, PartialEq)]
pub struct Lv {
    pub name: String,
    pub vg: String,
    pub attr: String,
    pub size: u64,
    pub pool: String,
    pub segtype: String,
    pub data_percent: Option<f64>,
    pub metadata_percent: Option<f64>,
    pub tags: Vec<String>,
    pub health: String,
    /// Device numbers when the LV is active in the kernel.
    pub kernel: Option<(u32, u32)>,
    pub vg_extent_size: u64,
    pub vg_size: u64,
    pub vg_free: u64,
    /// Thin pool allocation unit (0 for LVs that have none).
    pub chunk_size: u64,
    /// When the LV was created, in seconds since the epoch.
    pub created: Option<i64>,
    /// The LV a thin snapshot was taken from, while it exists.
    pub origin: String,
    /// Read-ahead as LVM reports it: `auto`, or bytes.
    pub read_ahead: String,
    /// The thin device id in the pool's metadata (thin LVs only).
    pub thin_id: Option<u32>,
    /// Size of a thin pool's metadata LV (0 for other LVs).
    pub metadata_size: u64,
    /// The VG's metadata area, the smallest of its PVs' (the same on every
    /// row): its size and what LVM counts as free in it; 0 when unknown.
    pub vg_mda_size: u64,
    pub vg_mda_free: u64,
}

impl Lv {
    fn attr_char(&self, i: usize) -> char {
        self.attr.chars().nth(i).unwrap_or('-')
    }
    fn set_attr_char(&mut self, i: usize, c: char) {
        let mut chars: Vec<char> = self.attr.chars().collect();
        if chars.len() <= i {
            chars.resize(i + 1, '-');
        }
        chars[i] = c;
        self.attr = chars.into_iter().collect();
    }
    pub fn is_thin_pool(&self) -> bool {
        self.attr_char(0) == 't'
    }
    /// A thin pool that zeroes newly provisioned chunks (lv_attr column
    /// 8): a fresh thin volume then reads zeros everywhere, even inside
    /// partly written chunks, never an earlier volume's data.
    pub fn zeroes_new_chunks(&self) -> bool {
        self.attr_char(7) == 'z'
    }
    pub fn is_thin_volume(&self) -> bool {
        self.attr_char(0) == 'V' || self.segtype == "thin"
    }
    /// Device-open column of lv_attr: something holds the device open
    /// (a mount, a process, a device-mapper table above it).
    pub fn is_open(&self) -> bool {
        self.attr_char(5) == 'o'
    }
    /// State column of lv_attr: `a` is active.
    pub fn is_active(&self) -> bool {
        self.attr_char(4) == 'a'
    }
    /// Bytes of the pool this LV has allocated (size × Data%).
    pub fn allocated_bytes(&self) -> Option<u64> {
        self.data_percent
            .map(|p| (self.size as f64 * p / 100.0).round() as u64)
    }

    /// Why this LV cannot serve I/O, decoded once from the health column
    /// of lv_attr and lv_health_status (which say the same in two ways),
    /// with words a person can act on; `None` when healthy.
    pub fn problem(&self) -> Option<Problem> {
        let what = if self.is_thin_pool() {
            "thin pool"
        } else {
            "logical volume"
        };
        // Built only for a problem: ListVolumes asks every entry.
        let id = format_args!("{}/{}", self.vg, self.name);
        let h = self.attr_char(8);
        let found = |condition, what: String, remedy: String| {
            Some(Problem {
                condition,
                what,
                remedy,
            })
        };
        if h == 'F' || self.health == "failed" {
            return found(
                Condition::Failed,
                format!("{what} {id} has failed"),
                format!(
                    "check `lvs -a {}` and dmesg, then repair it (lvconvert --repair)",
                    self.vg
                ),
            );
        }
        if self.is_thin_pool() {
            // The kernel enters out-of-data-space when an allocation
            // finds no free chunk, and leaves it by itself at its next
            // pass once chunks are free again (discards, a reclaim): with
            // free chunks the pool is recovering, not full.
            let out_of_data = h == 'D' || self.health == "out_of_data";
            if self.data_percent.is_some_and(|p| p >= 100.0)
                || (out_of_data && self.data_percent.is_none_or(|p| p >= 99.99))
            {
                return found(
                    Condition::Full,
                    format!("thin pool {id} is 100% full"),
                    "extend it (lvextend) or reclaim space (delete volumes or snapshots, ReclaimSpace)".into(),
                );
            }
            if h == 'M' || self.health == "metadata_read_only" {
                return found(
                    Condition::MetadataReadOnly,
                    format!("thin pool {id} metadata is read-only"),
                    format!("repair it (lvconvert --repair {id})"),
                );
            }
            if self.metadata_percent.is_some_and(|p| p >= 100.0) {
                return found(
                    Condition::MetadataFull,
                    format!("thin pool {id} metadata is full"),
                    "extend it (lvextend --poolmetadatasize)".into(),
                );
            }
        }
        if h == 'p' || self.health == "partial" {
            return found(
                Condition::Partial,
                format!("{what} {id} is missing physical volumes (partial)"),
                "bring the missing disks back (vgs -o +pv_missing), or repair the VG (vgreduce --removemissing) if they are gone".into(),
            );
        }
        None
    }
}

/// What is wrong with an LV or the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// The kernel failed it.
    Failed,
    /// The pool's data space is used up: no new chunk can be written.
    Full,
    /// The pool's metadata went read-only (after an error).
    MetadataReadOnly,
    /// The pool's metadata space is used up.
    MetadataFull,
    /// The pool's metadata or the VG's metadata area has no room for
    /// another LV short of LVM's own refusal (`lvm::room`).
    MetadataShort,
    /// A physical volume is missing.
    Partial,
}

/// A [`Condition`]: what is wrong, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub condition: Condition,
    pub what: String,
    pub remedy: String,
}

impl Problem {
    /// The error of a call the problem stops, with `cause` (what failed)
    /// added: RESOURCE_EXHAUSTED when space ran out, FAILED_PRECONDITION
    /// otherwise; the problem's remedy says what to do.
    pub fn error(&self, cause: Option<&Error>) -> Error {
        let what = match cause {
            Some(e) => format!("{} ({e})", self.what),
            None => self.what.clone(),
        };
        let e = if self.is_out_of_space() {
            Error::ResourceExhausted(what)
        } else {
            Error::FailedPrecondition(what)
        };
        e.advise(self.remedy.clone())
    }

    /// Space ran out (data or metadata): freeing or adding space mends it.
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self.condition,
            Condition::Full | Condition::MetadataFull | Condition::MetadataShort
        )
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.remedy)
    }
}

/// One `lvs` snapshot of our volume group.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Sorted by name (byte order), each name once: [`Report::parse`]
    /// sorts what LVM printed and [`Report::apply`] keeps the order, so a
    /// name is found, and a page of names begun, by binary search.
    pub lvs: Vec<Lv>,
    /// How many LVs LVM printed: the LVs our writes added since (the
    /// metadata figures do not count them yet) are the difference.
    pub read_len: usize,
    /// [`Report::mean_thin_text`] of one pool, once asked: every
    /// ListVolumes page and GetCapacity asks for it, and it reads every LV.
    /// Our writes clear it.
    thin_text: std::sync::OnceLock<(String, u64)>,
}

impl Report {
    /// The `lv` rows of an `lvs` JSON report (of every `report` section),
    /// each converted as it is read: no `Value` tree of the document.
    pub fn parse(json: &str) -> Result<Report> {
        let mut sink = Sink::default();
        let mut de = serde_json::Deserializer::from_str(json);
        let read = Document(&mut sink)
            .deserialize(&mut de)
            .and_then(|()| de.end());
        if let Some(e) = sink.failed {
            return Err(e);
        }
        read.map_err(|e| Error::Internal(format!("cannot parse LVM JSON report: {e}")))?;
        if !sink.saw_report {
            return Err(Error::Internal("LVM JSON has no \"report\" array".into()));
        }
        sink.lvs.shrink_to_fit();
        // LVM prints by name already (its default sort), so this is one
        // pass; its order of names is not relied on.
        sink.lvs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Report {
            read_len: sink.lvs.len(),
            lvs: sink.lvs,
            thin_text: Default::default(),
        })
    }

    /// LVs our writes added since LVM printed this report.
    pub fn added_since_read(&self) -> u64 {
        self.lvs.len().saturating_sub(self.read_len) as u64
    }

    /// Where `name` is, or would be inserted, in `lvs`.
    fn position(&self, name: &str) -> std::result::Result<usize, usize> {
        self.lvs.binary_search_by(|lv| lv.name.as_str().cmp(name))
    }

    pub fn find(&self, name: &str) -> Option<&Lv> {
        self.position(name).ok().map(|i| &self.lvs[i])
    }

    /// The LVs whose names begin with `prefix`, in name order, from the
    /// first name after `after` (every one when `after` is empty): a page
    /// starts with two binary searches, whatever the VG holds.
    pub fn named_after<'a>(
        &'a self,
        prefix: &'a str,
        after: &str,
    ) -> impl Iterator<Item = &'a Lv> + 'a {
        let mut start = self.lvs.partition_point(|lv| lv.name.as_str() < prefix);
        if !after.is_empty() {
            start = start.max(self.lvs.partition_point(|lv| lv.name.as_str() <= after));
        }
        self.lvs[start..]
            .iter()
            .take_while(move |lv| lv.name.starts_with(prefix))
    }

    /// The thin volumes that live in `pool`.
    pub fn thin_volumes<'a>(&'a self, pool: &str) -> impl Iterator<Item = &'a Lv> + 'a {
        let pool = pool.to_string();
        self.lvs
            .iter()
            .filter(move |lv| lv.is_thin_volume() && lv.pool == pool)
    }
}

/// One of the driver's own LVM writes, as it changes the report: applied
/// to the cached report once the command succeeded, so the next read needs
/// no `lvs` (see `Lvm::change_with`).
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// `lvcreate --type thin --activate n` of `name` in `pool`.
    CreatedThin {
        name: String,
        pool: String,
        size: u64,
        tags: Vec<String>,
        read_ahead: Option<String>,
    },
    Removed(String),
    Resized {
        name: String,
        size: u64,
    },
    /// Activated, with the device numbers the kernel gave it.
    Activated {
        name: String,
        kernel: (u32, u32),
    },
    Deactivated(String),
    Retagged {
        name: String,
        del: Vec<String>,
        add: Vec<String>,
    },
}

impl Write {
    /// The LV the write is to.
    pub fn name(&self) -> &str {
        match self {
            Write::CreatedThin { name, .. }
            | Write::Resized { name, .. }
            | Write::Activated { name, .. }
            | Write::Retagged { name, .. } => name,
            Write::Removed(name) | Write::Deactivated(name) => name,
        }
    }
}

impl Report {
    /// VG metadata text per thin LV of `pool`: the mean over them, each
    /// its name and tags on top of LVM's own (`room::lv_text_bytes`); a
    /// volume with a 60-character name and 150 characters of tags when
    /// there is none.
    pub fn mean_thin_text(&self, pool: &str) -> u64 {
        if let Some((p, mean)) = self.thin_text.get() {
            if p == pool {
                return *mean;
            }
        }
        let (mut n, mut sum) = (0u64, 0u64);
        for lv in self.thin_volumes(pool) {
            n += 1;
            sum += super::room::lv_text_bytes(&lv.name, &lv.tags);
        }
        let mean = match n {
            0 => super::room::LV_TEXT_BYTES + 210,
            n => sum.div_ceil(n),
        };
        // A VG shared by two classes' pools keeps the first one asked.
        let _ = self.thin_text.set((pool.to_string(), mean));
        mean
    }

    /// Applies one of our writes. Idempotent: a report read after the
    /// write already shows it, and applying it again changes nothing.
    pub fn apply(&mut self, w: &Write) {
        self.thin_text = Default::default();
        match w {
            Write::CreatedThin {
                name,
                pool,
                size,
                tags,
                read_ahead,
            } => {
                let Err(at) = self.position(name) else {
                    return;
                };
                // VG figures are the same on every row, and a thin LV
                // takes nothing from the VG's free space.
                let Some(p) = self.find(pool).cloned() else {
                    return;
                };
                let mut tags = tags.clone();
                tags.sort();
                self.lvs.insert(
                    at,
                    Lv {
                        name: name.clone(),
                        vg: p.vg.clone(),
                        // Thin volume, writable, inherited allocation,
                        // inactive, thin target, zeroing as LVM shows it.
                        attr: "Vwi---tz--".into(),
                        size: *size,
                        pool: pool.clone(),
                        segtype: "thin".into(),
                        data_percent: None,
                        metadata_percent: None,
                        tags,
                        health: String::new(),
                        kernel: None,
                        vg_extent_size: p.vg_extent_size,
                        vg_size: p.vg_size,
                        vg_free: p.vg_free,
                        chunk_size: 0,
                        created: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .ok()
                            .map(|d| d.as_secs() as i64),
                        origin: String::new(),
                        read_ahead: match read_ahead.as_deref() {
                            None | Some("auto") => "auto".into(),
                            Some(sectors) => sectors
                                .parse::<u64>()
                                .map_or_else(|_| sectors.to_string(), |n| (n * 512).to_string()),
                        },
                        thin_id: None,
                        metadata_size: 0,
                        vg_mda_size: p.vg_mda_size,
                        vg_mda_free: p.vg_mda_free,
                    },
                );
            }
            Write::Removed(name) => {
                if let Ok(at) = self.position(name) {
                    self.lvs.remove(at);
                }
            }
            Write::Resized { name, size } => {
                if let Some(lv) = self.find_mut(name) {
                    lv.size = *size;
                }
            }
            Write::Activated { name, kernel } => {
                if let Some(lv) = self.find_mut(name) {
                    lv.set_attr_char(4, 'a');
                    lv.kernel = Some(*kernel);
                }
            }
            Write::Deactivated(name) => {
                if let Some(lv) = self.find_mut(name) {
                    lv.set_attr_char(4, '-');
                    lv.set_attr_char(5, '-');
                    lv.kernel = None;
                    lv.data_percent = None;
                }
            }
            Write::Retagged { name, del, add } => {
                if let Some(lv) = self.find_mut(name) {
                    lv.tags.retain(|t| !del.contains(t) || add.contains(t));
                    for a in add {
                        if !lv.tags.contains(a) {
                            lv.tags.push(a.clone());
                        }
                    }
                    lv.tags.sort();
                }
            }
        }
    }

    fn find_mut(&mut self, name: &str) -> Option<&mut Lv> {
        self.position(name).ok().map(|i| &mut self.lvs[i])
    }
}

/// The rows of one kind (`lv`, `pv`, `vg`) in an LVM JSON report.
/// For the small reports (`vgs`, `pvs`, the pool's own LVs); the report
/// of the VG's LVs goes through [`Report::parse`].
pub fn rows(json: &str, kind: &str) -> Result<Vec<Value>> {
    let root: Value = serde_json::from_str(json)
        .map_err(|e| Error::Internal(format!("cannot parse LVM JSON report: {e}")))?;
    let Some(Value::Array(reports)) = (match root {
        Value::Object(mut top) => top.remove("report"),
        _ => None,
    }) else {
        return Err(Error::Internal("LVM JSON has no \"report\" array".into()));
    };
    Ok(reports
        .into_iter()
        .flat_map(|rep| match rep {
            Value::Object(mut rep) => match rep.remove(kind) {
                Some(Value::Array(rows)) => rows,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        })
        .collect())
}

/// A text column of a report row (lists are joined with commas).
pub fn text(row: &Value, key: &str) -> Result<String> {
    Ok(match field(row, key)? {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    })
}

fn field<'a>(row: &'a Value, key: &str) -> Result<&'a Value> {
    row.get(key)
        .ok_or_else(|| Error::Internal(format!("lvs JSON row lacks {key:?}")))
}

/// What [`Report::parse`] has read so far: the rows, whether the document
/// had a `report` array, and the first row that could not be converted
/// (which stops the parse).
#[derive(Default)]
struct Sink {
    lvs: Vec<Lv>,
    saw_report: bool,
    failed: Option<Error>,
}

/// The keys the walk through a report looks at; every other one is
/// skipped unread (`log`, `vg`, ...).
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Key {
    Report,
    Lv,
    #[serde(other)]
    Other,
}

/// The whole document: `{"report": [...], "log": [...]}`.
struct Document<'s>(&'s mut Sink);

/// The `report` array: one section per report (`lvs` prints one).
struct Sections<'s>(&'s mut Sink);

/// One section: `{"lv": [...]}`.
struct Section<'s>(&'s mut Sink);

/// The `lv` rows of a section, converted one by one into the sink.
struct Rows<'s>(&'s mut Sink);

impl<'de> DeserializeSeed<'de> for Document<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Document<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an LVM JSON report")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let sink = self.0;
        while let Some(key) = map.next_key::<Key>()? {
            if let Key::Report = key {
                sink.saw_report = true;
                map.next_value_seed(Sections(&mut *sink))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Sections<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Sections<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a \"report\" array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let sink = self.0;
        while seq.next_element_seed(Section(&mut *sink))?.is_some() {}
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Section<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Section<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a report section")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let sink = self.0;
        while let Some(key) = map.next_key::<Key>()? {
            if let Key::Lv = key {
                map.next_value_seed(Rows(&mut *sink))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Rows<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Rows<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of LV rows")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let sink = self.0;
        if let Some(n) = seq.size_hint() {
            sink.lvs.reserve(n);
        }
        while let Some(row) = seq.next_element::<Row<'de>>()? {
            match row.lv() {
                Ok(lv) => sink.lvs.push(lv),
                Err(e) => {
                    let text = e.to_string();
                    sink.failed = Some(e);
                    return Err(de::Error::custom(text));
                }
            }
        }
        Ok(())
    }
}

/// One row of an `lvs` report as read: each cell borrowed from the text
/// where it has no escapes, so that a number printed as a string costs
/// no allocation. Columns we did not ask for are skipped.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Row<'a> {
    #[serde(borrow)]
    lv_name: Cell<'a>,
    #[serde(borrow)]
    vg_name: Cell<'a>,
    #[serde(borrow)]
    lv_attr: Cell<'a>,
    #[serde(borrow)]
    lv_size: Cell<'a>,
    #[serde(borrow)]
    pool_lv: Cell<'a>,
    #[serde(borrow)]
    segtype: Cell<'a>,
    #[serde(borrow)]
    data_percent: Cell<'a>,
    #[serde(borrow)]
    metadata_percent: Cell<'a>,
    #[serde(borrow)]
    lv_tags: Cell<'a>,
    #[serde(borrow)]
    lv_health_status: Cell<'a>,
    #[serde(borrow)]
    lv_kernel_major: Cell<'a>,
    #[serde(borrow)]
    lv_kernel_minor: Cell<'a>,
    #[serde(borrow)]
    vg_extent_size: Cell<'a>,
    #[serde(borrow)]
    vg_size: Cell<'a>,
    #[serde(borrow)]
    vg_free: Cell<'a>,
    #[serde(borrow)]
    chunk_size: Cell<'a>,
    #[serde(borrow)]
    lv_time: Cell<'a>,
    #[serde(borrow)]
    origin: Cell<'a>,
    #[serde(borrow)]
    lv_read_ahead: Cell<'a>,
    #[serde(borrow)]
    thin_id: Cell<'a>,
    #[serde(borrow)]
    lv_metadata_size: Cell<'a>,
    #[serde(borrow)]
    vg_mda_size: Cell<'a>,
    #[serde(borrow)]
    vg_mda_free: Cell<'a>,
}

impl Row<'_> {
    fn lv(self) -> Result<Lv> {
        let major = self
            .lv_kernel_major
            .number("lv_kernel_major")?
            .unwrap_or(-1.0);
        let minor = self
            .lv_kernel_minor
            .number("lv_kernel_minor")?
            .unwrap_or(-1.0);
        let tags = self.lv_tags.text("lv_tags")?;
        Ok(Lv {
            name: self.lv_name.text("lv_name")?,
            vg: self.vg_name.text("vg_name")?,
            attr: self.lv_attr.text("lv_attr")?,
            size: self.lv_size.bytes("lv_size")?,
            pool: self.pool_lv.text("pool_lv")?,
            segtype: self.segtype.text("segtype")?,
            data_percent: self.data_percent.number("data_percent")?,
            metadata_percent: self.metadata_percent.number("metadata_percent")?,
            tags: tags
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
            health: self.lv_health_status.text("lv_health_status")?,
            kernel: (major >= 0.0 && minor >= 0.0).then_some((major as u32, minor as u32)),
            vg_extent_size: self.vg_extent_size.bytes("vg_extent_size")?,
            vg_size: self.vg_size.bytes("vg_size")?,
            vg_free: self.vg_free.bytes("vg_free")?,
            chunk_size: self
                .chunk_size
                .number("chunk_size")?
                .unwrap_or(0.0)
                .max(0.0) as u64,
            // Older samples and reports without these columns still parse.
            created: self
                .lv_time
                .number("lv_time")
                .ok()
                .flatten()
                .map(|t| t as i64),
            origin: self.origin.text_or_empty("origin")?,
            read_ahead: self.lv_read_ahead.text_or_empty("lv_read_ahead")?,
            thin_id: self
                .thin_id
                .number("thin_id")
                .ok()
                .flatten()
                .map(|n| n as u32),
            metadata_size: self.lv_metadata_size.optional_bytes(),
            vg_mda_size: self.vg_mda_size.optional_bytes(),
            vg_mda_free: self.vg_mda_free.optional_bytes(),
        })
    }
}

/// One cell of a report row, as LVM printed it.
#[derive(Debug, Default)]
enum Cell<'a> {
    /// The row has no such column.
    #[default]
    Absent,
    Null,
    Bool(bool),
    Text(Cow<'a, str>),
    Number(serde_json::Number),
    /// A list (`lv_tags` with `json_std`): its strings.
    List(Vec<Cow<'a, str>>),
    /// An object: no column of ours is one.
    Object,
}

impl Cell<'_> {
    /// The cell as text (lists joined with commas); an error when the row
    /// lacks the column.
    fn text(self, key: &str) -> Result<String> {
        Ok(match self {
            Cell::Absent => return Err(lacks(key)),
            Cell::Null => String::new(),
            Cell::Bool(b) => b.to_string(),
            Cell::Text(s) => s.into_owned(),
            Cell::Number(n) => n.to_string(),
            Cell::List(items) => items.join(","),
            Cell::Object => {
                return Err(Error::Internal(format!(
                    "lvs field {key} is an object, not text"
                )))
            }
        })
    }

    /// As [`Cell::text`], with an absent column read as empty.
    fn text_or_empty(self, key: &str) -> Result<String> {
        match self {
            Cell::Absent => Ok(String::new()),
            cell => cell.text(key),
        }
    }

    /// The cell as a number: `None` when empty or null.
    fn number(&self, key: &str) -> Result<Option<f64>> {
        match self {
            Cell::Absent => Err(lacks(key)),
            Cell::Number(n) => Ok(n.as_f64()),
            Cell::Null => Ok(None),
            Cell::Text(s) if s.trim().is_empty() => Ok(None),
            Cell::Text(s) => s
                .trim()
                .parse::<f64>()
                .map(Some)
                .map_err(|_| Error::Internal(format!("lvs field {key} is not a number: {s:?}"))),
            other => Err(Error::Internal(format!(
                "lvs field {key} is not a number: {other:?}"
            ))),
        }
    }

    /// A byte count of a column older samples lack: 0 when absent, empty
    /// or not a count.
    fn optional_bytes(&self) -> u64 {
        match self.number("") {
            Ok(Some(n)) if n >= 0.0 => n as u64,
            _ => 0,
        }
    }

    fn bytes(&self, key: &str) -> Result<u64> {
        match self.number(key)? {
            Some(n) if n >= 0.0 => Ok(n as u64),
            _ => Err(Error::Internal(format!(
                "lvs field {key} is not a byte count"
            ))),
        }
    }
}

fn lacks(key: &str) -> Error {
    Error::Internal(format!("lvs JSON row lacks {key:?}"))
}

impl<'de: 'a, 'a> Deserialize<'de> for Cell<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(CellVisitor)
    }
}

struct CellVisitor;

impl<'de> Visitor<'de> for CellVisitor {
    type Value = Cell<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a report cell")
    }
    fn visit_unit<E>(self) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Null)
    }
    fn visit_bool<E>(self, b: bool) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Number(n.into()))
    }
    fn visit_i64<E>(self, n: i64) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> std::result::Result<Cell<'de>, E> {
        // JSON has no NaN or infinity.
        Ok(serde_json::Number::from_f64(n).map_or(Cell::Null, Cell::Number))
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Text(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Text(Cow::Owned(s.to_string())))
    }
    fn visit_string<E>(self, s: String) -> std::result::Result<Cell<'de>, E> {
        Ok(Cell::Text(Cow::Owned(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Cell<'de>, A::Error> {
        // The strings of a list; anything else in it is left out.
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Cell<'de>>()? {
            if let Cell::Text(s) = item {
                items.push(s);
            }
        }
        Ok(Cell::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Cell<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Cell::Object)
    }
}

/// Capacity of a thin pool for new volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// What new virtual sizes may still add: ratio × pool size − sum of the
    /// virtual sizes already handed out.
    pub virtual_headroom: u64,
    /// What the pool can still physically hold at its current Data%.
    pub physical_free: u64,
}

impl Capacity {
    pub fn compute(pool_size: u64, data_percent: f64, ratio: f64, virtual_sum: u64) -> Capacity {
        let limit = (pool_size as f64 * ratio).floor() as u64;
        let used = (pool_size as f64 * data_percent.clamp(0.0, 100.0) / 100.0).ceil() as u64;
        Capacity {
            virtual_headroom: limit.saturating_sub(virtual_sum),
            physical_free: pool_size.saturating_sub(used),
        }
    }
    /// The figure GetCapacity reports: never more than either bound.
    pub fn available(&self) -> u64 {
        self.virtual_headroom.min(self.physical_free)
    }
}

/// Rounds `bytes` up to a whole number of extents.
pub fn round_up(bytes: u64, extent: u64) -> Option<u64> {
    if extent == 0 {
        return Some(bytes);
    }
    bytes.div_ceil(extent).checked_mul(extent)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shaped like lvm2 2.03.16 output: every value a string.
    const SAMPLE: &str = r#"{
      "report": [
          {
              "lv": [
                  {"lv_name":"csi-pvc-1-0123456789abcdef", "vg_name":"vg0", "lv_attr":"Vwi-a-tz--", "lv_size":"1073741824", "pool_lv":"pool", "segtype":"thin", "data_percent":"12.50", "metadata_percent":"", "lv_tags":"tpcsi.owner=d.x,tpcsi.name=61", "lv_health_status":"", "lv_kernel_major":"253", "lv_kernel_minor":"4", "vg_extent_size":"4194304", "vg_size":"268435456", "vg_free":"4194304", "chunk_size":"65536", "lv_time":"1795448321", "origin":""},
                  {"lv_name":"pool", "vg_name":"vg0", "lv_attr":"twi-aotz--", "lv_size":"209715200", "pool_lv":"", "segtype":"thin-pool", "data_percent":"25.00", "metadata_percent":"10.55", "lv_tags":"", "lv_health_status":"", "lv_kernel_major":"253", "lv_kernel_minor":"2", "vg_extent_size":"4194304", "vg_size":"268435456", "vg_free":"4194304", "chunk_size":"65536"},
                  {"lv_name":"root", "vg_name":"vg0", "lv_attr":"-wi-------", "lv_size":"8388608", "pool_lv":"", "segtype":"linear", "data_percent":"", "metadata_percent":"", "lv_tags":"", "lv_health_status":"", "lv_kernel_major":"-1", "lv_kernel_minor":"-1", "vg_extent_size":"4194304", "vg_size":"268435456", "vg_free":"4194304", "chunk_size":"65536"}
              ]
          }
      ]
      ,
      "log": []
  }"#;

    #[test]
    fn parses_string_valued_report() {
        let r = Report::parse(SAMPLE).unwrap();
        assert_eq!(r.lvs.len(), 3);
        let v = r.find("csi-pvc-1-0123456789abcdef").unwrap();
        assert!(v.is_thin_volume() && v.is_active() && !v.is_thin_pool());
        assert_eq!(v.size, 1 << 30);
        assert_eq!(v.kernel, Some((253, 4)));
        assert_eq!(v.tags, vec!["tpcsi.owner=d.x", "tpcsi.name=61"]);
        assert_eq!(v.allocated_bytes(), Some(134217728));
        assert_eq!(v.created, Some(1795448321));
        assert_eq!(v.origin, "");
        let pool = r.find("pool").unwrap();
        assert!(pool.is_thin_pool());
        assert_eq!(pool.metadata_percent, Some(10.55));
        assert_eq!(pool.chunk_size, 65536);
        assert!(pool.is_open() && !v.is_open());
        let root = r.find("root").unwrap();
        assert_eq!(root.kernel, None);
        assert_eq!(root.data_percent, None);
        assert!(!root.is_active());
        assert!(root.tags.is_empty());
        assert_eq!(r.thin_volumes("pool").count(), 1);
        assert_eq!(r.thin_volumes("other").count(), 0);
    }

    #[test]
    fn parses_numeric_report() {
        let json = r#"{"report":[{"lv":[{"lv_name":"p","vg_name":"v","lv_attr":"twi-a-tz--","lv_size":1048576,"pool_lv":"","segtype":"thin-pool","data_percent":50.0,"metadata_percent":1.5,"lv_tags":["a","b"],"lv_health_status":"","lv_kernel_major":253,"lv_kernel_minor":0,"vg_extent_size":4194304,"vg_size":8388608,"vg_free":0,"chunk_size":65536}]}]}"#;
        let r = Report::parse(json).unwrap();
        let p = &r.lvs[0];
        assert_eq!(p.size, 1048576);
        assert_eq!(p.data_percent, Some(50.0));
        assert_eq!(p.tags, vec!["a", "b"]);
        assert_eq!(p.kernel, Some((253, 0)));
    }

    #[test]
    fn empty_and_broken_reports() {
        assert!(Report::parse(r#"{"report":[{"lv":[]}]}"#)
            .unwrap()
            .lvs
            .is_empty());
        assert!(Report::parse("not json").is_err());
        assert!(Report::parse(r#"{"nope":1}"#).is_err());
        let missing = r#"{"report":[{"lv":[{"lv_name":"x"}]}]}"#;
        assert!(Report::parse(missing)
            .unwrap_err()
            .to_string()
            .contains("lacks"));
        let bad = SAMPLE.replace("\"1073741824\"", "\"12abc\"");
        let e = Report::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("lv_size is not a number"), "{e}");
        assert!(Report::parse(r#"{"report":{"lv":[]}}"#).is_err());
        assert!(Report::parse(r#"{"report":[{"lv":[]}]} trailing"#).is_err());
        assert!(Report::parse(r#"{"report":[{"lv":[1]}]}"#).is_err());
        let e = Report::parse(r#"{"log":[]}"#).unwrap_err().to_string();
        assert!(e.contains("no \"report\" array"), "{e}");
        let object = SAMPLE.replace("\"tpcsi.owner=d.x,tpcsi.name=61\"", "{\"a\":1}");
        assert!(Report::parse(&object).is_err());
    }

    /// The rows are read as the document goes: whatever comes before or
    /// after them, cells with escapes, nulls, columns nobody asked for,
    /// and rows of every section.
    #[test]
    fn parses_rows_wherever_the_document_puts_them() {
        let pool = r#"{"lv_name":"pool","vg_name":"vg0","lv_attr":"twi-aotz--","lv_size":"209715200","pool_lv":"","segtype":"thin-pool","data_percent":"25.00","metadata_percent":"10.55","lv_tags":"","lv_health_status":"","lv_kernel_major":"253","lv_kernel_minor":"2","vg_extent_size":"4194304","vg_size":"268435456","vg_free":"4194304","chunk_size":"65536","lv_time":"not a time","thin_id":null}"#;
        let vol = r#"{"extra":{"nested":[1,2]},"lv_name":"csi-\u0061","vg_name":"vg0","lv_attr":"Vwi---tz--","lv_size":4194304,"pool_lv":"pool","segtype":"thin","data_percent":null,"metadata_percent":"","lv_tags":["tpcsi.owner=d\u002ex",7,"tpcsi.name=61"],"lv_health_status":null,"lv_kernel_major":-1,"lv_kernel_minor":-1,"vg_extent_size":"4194304","vg_size":"268435456","vg_free":"4194304","chunk_size":"0","lv_time":1795448321,"origin":"csi-b","lv_read_ahead":"auto","thin_id":"7"}"#;
        let json = format!(
            r#"{{"log":[{{"log_type":"status"}}],"report":[{{"vg":[{{"vg_name":"vg0"}}],"lv":[{pool}]}},{{"lv":[{vol}]}},{{}}],"more":null}}"#
        );
        let r = Report::parse(&json).unwrap();
        assert_eq!(r.lvs.len(), 2);
        let p = r.find("pool").unwrap();
        assert_eq!(p.created, None, "a time that is no number is left out");
        assert_eq!(p.thin_id, None);
        assert_eq!(p.origin, "", "an absent column reads as empty");
        assert_eq!(p.read_ahead, "");
        let v = r.find("csi-a").unwrap();
        assert_eq!(v.size, 4 << 20);
        assert_eq!(v.data_percent, None);
        assert_eq!(v.metadata_percent, None);
        assert_eq!(v.tags, vec!["tpcsi.owner=d.x", "tpcsi.name=61"]);
        assert_eq!(v.health, "");
        assert_eq!(v.kernel, None);
        assert_eq!(v.created, Some(1795448321));
        assert_eq!(v.origin, "csi-b");
        assert_eq!(v.read_ahead, "auto");
        assert_eq!(v.thin_id, Some(7));
        assert_eq!(r.thin_volumes("pool").count(), 1);
    }

    /// `rows` (the small reports) gives each section's rows of one kind.
    #[test]
    fn rows_of_a_kind_from_every_section() {
        let json =
            r#"{"report":[{"vg":[{"vg_name":"a"}]},{"vg":[{"vg_name":"b"}],"pv":[]},{}],"log":[]}"#;
        let vgs = rows(json, "vg").unwrap();
        let names: Vec<String> = vgs.iter().map(|r| text(r, "vg_name").unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(rows(json, "lv").unwrap().is_empty());
        assert!(rows(r#"{"log":[]}"#, "vg").is_err());
        assert!(rows(r#"[]"#, "vg").is_err());
    }

    fn pool(attr: &str, health: &str, data: f64, meta: f64) -> Lv {
        let mut lv = Report::parse(SAMPLE).unwrap().find("pool").unwrap().clone();
        lv.attr = attr.into();
        lv.health = health.into();
        lv.data_percent = Some(data);
        lv.metadata_percent = Some(meta);
        lv
    }

    #[test]
    fn pool_zeroing_is_read_from_lv_attr() {
        assert!(pool("twi-aotz--", "", 0.0, 0.0).zeroes_new_chunks());
        assert!(!pool("twi-aot---", "", 0.0, 0.0).zeroes_new_chunks());
        assert!(!pool("", "", 0.0, 0.0).zeroes_new_chunks());
    }

    #[test]
    fn pool_problems_are_decoded_from_attr_and_health() {
        let cond = |lv: Lv| lv.problem().map(|p| p.condition);
        assert_eq!(pool("twi-aotz--", "", 50.0, 10.0).problem(), None);
        let full = pool("twi-aotzD-", "out_of_data", 100.0, 10.0)
            .problem()
            .unwrap();
        assert_eq!(full.condition, Condition::Full);
        assert!(
            full.what.contains("100% full")
                && full.what.contains("vg0/pool")
                && full.remedy.contains("lvextend"),
            "{full}"
        );
        assert!(full.is_out_of_space());
        assert_eq!(
            cond(pool("twi-aotz--", "", 100.0, 1.0)),
            Some(Condition::Full)
        );
        // Still flagged out of data right after a reclaim freed chunks:
        // the kernel leaves that mode by itself, so it is not full.
        assert_eq!(
            pool("twi-aotzD-", "out_of_data", 2.11, 10.0).problem(),
            None
        );
        assert_eq!(
            cond(pool("twi-aotzD-", "out_of_data", 99.99, 10.0)),
            Some(Condition::Full)
        );
        assert_eq!(
            cond(pool("twi-aotzF-", "failed", 1.0, 1.0)),
            Some(Condition::Failed)
        );
        assert_eq!(
            cond(pool("twi-aotzM-", "metadata_read_only", 1.0, 1.0)),
            Some(Condition::MetadataReadOnly)
        );
        let meta = pool("twi-aotz--", "", 1.0, 100.0).problem().unwrap();
        assert_eq!(meta.condition, Condition::MetadataFull);
        assert!(meta.what.contains("metadata is full"));
        assert!(meta.to_string().contains("--poolmetadatasize"), "{meta}");
        let e = meta.error(None);
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.remedy().contains("--poolmetadatasize"), "{e:?}");
        let mut thin = Report::parse(SAMPLE).unwrap().lvs[0].clone();
        assert_eq!(thin.problem(), None);
        thin.attr = "Vwi-a-tzF-".into();
        let failed = thin.problem().unwrap();
        assert!(!failed.is_out_of_space());
        assert!(failed.what.starts_with("logical volume vg0/csi-pvc-1"));
        assert_eq!(failed.error(None).code(), tonic::Code::FailedPrecondition);
    }

    #[test]
    fn capacity_arithmetic() {
        let gib = 1u64 << 30;
        // 10 GiB pool, ratio 2, 15 GiB handed out, 30% physically used.
        let c = Capacity::compute(10 * gib, 30.0, 2.0, 15 * gib);
        assert_eq!(c.virtual_headroom, 5 * gib);
        assert_eq!(c.physical_free, 7 * gib);
        assert_eq!(c.available(), 5 * gib);
        // Physically nearly full: the physical bound wins.
        let c = Capacity::compute(10 * gib, 95.0, 2.0, 0);
        assert_eq!(c.available(), c.physical_free);
        assert!(c.physical_free <= gib / 2 + 1);
        // Over-committed beyond the ratio: no headroom, never negative.
        assert_eq!(Capacity::compute(gib, 0.0, 1.0, 2 * gib).available(), 0);
        assert_eq!(Capacity::compute(gib, 150.0, 1.0, 0).physical_free, 0);
    }

    #[test]
    fn our_writes_apply_to_a_cached_report_as_lvs_would_show_them() {
        let mut r = Report::parse(SAMPLE).unwrap();
        let before = r.clone();
        let w = Write::CreatedThin {
            name: "csi-new-1".into(),
            pool: "pool".into(),
            size: 8 << 20,
            tags: vec!["tpcsi.owner=d.x".into(), "tpcsi.a=1".into()],
            read_ahead: Some("256".into()),
        };
        r.apply(&w);
        r.apply(&w);
        assert_eq!(r.lvs.len(), before.lvs.len() + 1, "idempotent");
        let v = r.find("csi-new-1").unwrap().clone();
        assert!(v.is_thin_volume() && !v.is_active() && !v.is_open());
        assert_eq!(v.pool, "pool");
        assert_eq!(v.size, 8 << 20);
        assert_eq!(v.tags, vec!["tpcsi.a=1", "tpcsi.owner=d.x"]);
        assert_eq!(v.read_ahead, "131072");
        assert_eq!(v.vg_extent_size, 4194304);
        assert_eq!(r.thin_volumes("pool").count(), 2);

        r.apply(&Write::Activated {
            name: "csi-new-1".into(),
            kernel: (253, 9),
        });
        let v = r.find("csi-new-1").unwrap();
        assert!(v.is_active());
        assert_eq!(v.kernel, Some((253, 9)));
        assert_eq!(v.attr, "Vwi-a-tz--");
        r.apply(&Write::Resized {
            name: "csi-new-1".into(),
            size: 12 << 20,
        });
        r.apply(&Write::Retagged {
            name: "csi-new-1".into(),
            del: vec!["tpcsi.a=1".into()],
            add: vec!["tpcsi.a=2".into()],
        });
        let v = r.find("csi-new-1").unwrap();
        assert_eq!(v.size, 12 << 20);
        assert_eq!(v.tags, vec!["tpcsi.a=2", "tpcsi.owner=d.x"]);
        // A tag both deleted and added stays (as `retag_all` sends it).
        r.apply(&Write::Retagged {
            name: "csi-new-1".into(),
            del: vec!["tpcsi.a=2".into(), "tpcsi.b=1".into()],
            add: vec!["tpcsi.a=2".into(), "tpcsi.c=1".into()],
        });
        let v = r.find("csi-new-1").unwrap();
        assert_eq!(v.tags, vec!["tpcsi.a=2", "tpcsi.c=1", "tpcsi.owner=d.x"]);
        r.apply(&Write::Retagged {
            name: "csi-new-1".into(),
            del: vec!["tpcsi.c=1".into()],
            add: vec![],
        });
        r.apply(&Write::Deactivated("csi-new-1".into()));
        let v = r.find("csi-new-1").unwrap();
        assert!(!v.is_active() && v.kernel.is_none());
        r.apply(&Write::Removed("csi-new-1".into()));
        r.apply(&Write::Removed("csi-new-1".into()));
        assert_eq!(r.lvs, before.lvs);
        // A create in a pool the report does not show is not guessed.
        r.apply(&Write::CreatedThin {
            name: "x".into(),
            pool: "nopool".into(),
            size: 1,
            tags: vec![],
            read_ahead: None,
        });
        assert!(r.find("x").is_none());
    }

    /// The report is kept in name order, whatever order LVM printed and
    /// whatever our writes added or removed, and a page of names is begun
    /// by prefix and after a name.
    #[test]
    fn rows_stay_in_name_order_and_pages_begin_by_search() {
        let pool = r#"{"lv_name":"pool","vg_name":"vg1","lv_attr":"twi-aotz--","lv_size":"8388608","pool_lv":"","segtype":"thin-pool","data_percent":"1.00","metadata_percent":"1.00","lv_tags":"","lv_health_status":"","lv_kernel_major":"253","lv_kernel_minor":"1","vg_extent_size":"4194304","vg_size":"16777216","vg_free":"0","chunk_size":"65536"}"#;
        let thin = |n: &str| {
            pool.replace(r#""pool","vg_name""#, &format!(r#""{n}","vg_name""#))
                .replace(r#""pool_lv":"""#, r#""pool_lv":"pool""#)
                .replace("twi-aotz--", "Vwi---tz--")
                .replace("thin-pool", "thin")
        };
        let printed = ["csi-c", "snap-a", "csi-a", "fast.csi-a", "csi-e"].map(thin);
        let mut r = Report::parse(&format!(
            r#"{{"report":[{{"lv":[{},{pool}]}}]}}"#,
            printed.join(",")
        ))
        .unwrap();
        let names = |r: &Report| r.lvs.iter().map(|lv| lv.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&r),
            ["csi-a", "csi-c", "csi-e", "fast.csi-a", "pool", "snap-a"]
        );
        let create = |name: &str| Write::CreatedThin {
            name: name.into(),
            pool: "pool".into(),
            size: 1,
            tags: vec![],
            read_ahead: None,
        };
        r.apply(&create("csi-d"));
        r.apply(&create("csi-0"));
        r.apply(&create("zz"));
        r.apply(&Write::Removed("csi-c".into()));
        assert_eq!(
            names(&r),
            [
                "csi-0",
                "csi-a",
                "csi-d",
                "csi-e",
                "fast.csi-a",
                "pool",
                "snap-a",
                "zz"
            ]
        );
        for n in names(&r) {
            assert_eq!(r.find(&n).unwrap().name, n);
        }
        assert!(r.find("csi-c").is_none() && r.find("csi-b").is_none());
        let page = |prefix: &str, after: &str| {
            r.named_after(prefix, after)
                .map(|lv| lv.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(page("csi-", ""), ["csi-0", "csi-a", "csi-d", "csi-e"]);
        assert_eq!(page("csi-", "csi-a"), ["csi-d", "csi-e"]);
        // A token that is gone (deleted since) still pages on after it.
        assert_eq!(page("csi-", "csi-c"), ["csi-d", "csi-e"]);
        assert!(page("csi-", "csi-e").is_empty());
        assert_eq!(page("fast.csi-", ""), ["fast.csi-a"]);
        // A token before the prefix's names starts at the first of them.
        assert_eq!(page("fast.csi-", "csi-0"), ["fast.csi-a"]);
        assert!(page("nothing-", "").is_empty());

        // The mean VG text per thin LV is read once, and again after a write.
        let mean = r.mean_thin_text("pool");
        let expected = |r: &Report| {
            let texts: Vec<u64> = r
                .thin_volumes("pool")
                .map(|lv| super::super::room::lv_text_bytes(&lv.name, &lv.tags))
                .collect();
            texts.iter().sum::<u64>().div_ceil(texts.len() as u64)
        };
        assert_eq!(mean, expected(&r));
        assert_eq!(r.mean_thin_text("pool"), mean);
        r.apply(&Write::CreatedThin {
            name: "csi-long-name-that-shifts-the-mean".into(),
            pool: "pool".into(),
            size: 1,
            tags: vec!["tpcsi.owner=a-long-owner-tag-of-some-length".into()],
            read_ahead: None,
        });
        assert!(r.mean_thin_text("pool") > mean);
        assert_eq!(r.mean_thin_text("pool"), expected(&r));
        assert_eq!(
            r.mean_thin_text("nopool"),
            super::super::room::LV_TEXT_BYTES + 210
        );
    }

    #[test]
    fn rounding() {
        let e = 4 << 20;
        assert_eq!(round_up(1, e), Some(e));
        assert_eq!(round_up(e, e), Some(e));
        assert_eq!(round_up(e + 1, e), Some(2 * e));
        assert_eq!(round_up(0, e), Some(0));
        assert_eq!(round_up(u64::MAX, e), None);
    }
}
