//! Thin-pool metadata, read without reading a byte of volume data: which
//! chunks a thin device maps (`thin_dump`), and which differ between two
//! thin devices (`thin_delta`), from thin-provisioning-tools.
//!
//! The tools read a *metadata snapshot* of the live pool: reserved with
//! `dmsetup message <vg>-<pool>-tpool 0 reserve_metadata_snap` (the kernel
//! commits the pool's metadata first) and released with
//! `release_metadata_snap` on every path. A pool holds one at a time, so
//! callers take [`Lvm`]'s metadata lock; one left by a killed driver is
//! released before the next reservation.
//!
//! Output is parsed line by line as the tools print it (one XML element
//! per line) and handed on as merged byte ranges in ascending order.

use std::future::Future;
use std::path::PathBuf;

use super::Lvm;
use crate::error::{Error, Result};
use crate::exec::{self, Lines};

/// What to read from the pool's metadata, by thin device id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// The chunks device `dev` maps.
    Mapped { dev: u32 },
    /// The chunks that differ between `base` and `target` (written in
    /// either, mapped in only one, or mapped to other data).
    Delta { base: u32, target: u32 },
}

/// A run of pool chunks: `[begin, begin + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    pub begin: u64,
    pub len: u64,
}

/// One element of the tools' XML output: its name and attributes.
fn element(line: &str) -> Option<(&str, Vec<(&str, &str)>)> {
    let body = line.trim().strip_prefix('<')?;
    let body = body.strip_suffix("/>").or_else(|| body.strip_suffix('>'))?;
    let (name, mut rest) = body.split_once(' ').unwrap_or((body, ""));
    let mut attrs = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once("=\"")?;
        let (value, after) = after.split_once('"')?;
        attrs.push((key.trim(), value));
        rest = after;
    }
    Some((name, attrs))
}

fn attr(attrs: &[(&str, &str)], key: &str) -> Option<u64> {
    attrs.iter().find(|(k, _)| *k == key)?.1.parse().ok()
}

/// What one output line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// The superblock: the chunk size in 512-byte sectors.
    ChunkSectors(u64),
    /// A run of chunks the query selects.
    Chunks(Chunks),
    /// Anything else (unchanged runs, device headers, closing tags).
    Other,
}

/// Parses one line of `thin_dump` (for [`Query::Mapped`]) or `thin_delta`
/// (for [`Query::Delta`]) output. A line that looks like an element the
/// query counts but lacks its numbers is an error, never skipped.
pub fn parse_line(q: Query, line: &str) -> Result<Line> {
    let Some((name, attrs)) = element(line) else {
        return Ok(Line::Other);
    };
    let bad = || Error::Internal(format!("unexpected thin metadata line: {line:?}"));
    let run = |b: &str, l: Option<&str>| -> Result<Line> {
        let begin = attr(&attrs, b).ok_or_else(bad)?;
        let len = match l {
            Some(l) => attr(&attrs, l).ok_or_else(bad)?,
            None => 1,
        };
        Ok(Line::Chunks(Chunks { begin, len }))
    };
    match (q, name) {
        (_, "superblock") => Ok(Line::ChunkSectors(
            attr(&attrs, "data_block_size").ok_or_else(bad)?,
        )),
        (Query::Mapped { .. }, "range_mapping") => run("origin_begin", Some("length")),
        (Query::Mapped { .. }, "single_mapping") => run("origin_block", None),
        (Query::Delta { .. }, "different" | "left_only" | "right_only") => {
            run("begin", Some("length"))
        }
        _ => Ok(Line::Other),
    }
}

/// Merges ascending runs that touch into one.
#[derive(Debug, Default)]
pub struct Merge {
    current: Option<Chunks>,
}

impl Merge {
    /// Adds a run; returns the run it completes, if any. A run that starts
    /// before the end of the last one is an error: the ranges handed out
    /// must ascend without overlap, whatever a tool version prints.
    pub fn push(&mut self, c: Chunks) -> Result<Option<Chunks>> {
        match &mut self.current {
            Some(cur) if c.begin < cur.begin + cur.len => Err(Error::Internal(format!(
                "thin metadata output is out of order: chunks {}+{} after {}+{}",
                c.begin, c.len, cur.begin, cur.len
            ))),
            Some(cur) if cur.begin + cur.len == c.begin => {
                cur.len += c.len;
                Ok(None)
            }
            _ => Ok(self.current.replace(c)),
        }
    }

    /// The last run.
    pub fn finish(self) -> Option<Chunks> {
        self.current
    }
}

/// Whether a pool's `dmsetup status` line shows a held metadata snapshot:
/// `0 <len> thin-pool <transaction> <meta used/total> <data used/total>
/// <held root|-> ...`.
pub fn holds_metadata_snap(status: &str) -> Result<bool> {
    let fields: Vec<&str> = status.split_whitespace().collect();
    match fields.as_slice() {
        [_, _, "thin-pool", _, _, _, held, ..] => Ok(*held != "-"),
        [_, _, "thin-pool", "Fail", ..] => Err(Error::FailedPrecondition(
            "the thin pool is marked Fail by the kernel: check it (dmesg, lvs -a)".into(),
        )),
        _ => Err(Error::Internal(format!(
            "dmsetup status: not a thin pool: {status:?}"
        ))),
    }
}

impl Lvm {
    fn tpool(&self) -> String {
        format!("{}-tpool", super::lv_dm_name(&self.vg, &self.pool))
    }

    fn tmeta(&self) -> PathBuf {
        PathBuf::from(format!(
            "/dev/mapper/{}_tmeta",
            super::lv_dm_name(&self.vg, &self.pool)
        ))
    }

    async fn dmsetup(&self, args: Vec<String>) -> Result<String> {
        Ok(exec::run("dmsetup", &args, &[], self.timeout).await?.stdout)
    }

    /// Whether `thin_dump` and `thin_delta` run on this machine; what
    /// fails is logged.
    pub async fn thin_tools_run(&self) -> bool {
        for tool in ["thin_dump", "thin_delta"] {
            if let Err(e) = exec::run(tool, &["-V".to_string()], &[], self.timeout).await {
                tracing::warn!(tool, error = %e, "thin-provisioning-tools do not run here: SnapshotMetadata is not offered");
                return false;
            }
        }
        true
    }

    async fn pool_message(&self, message: &str) -> Result<()> {
        self.dmsetup(crate::argv!["message", self.tpool(), "0", message])
            .await
            .map(drop)
    }

    /// Reads `q` from a metadata snapshot of the pool and hands each merged
    /// run to `emit` as bytes `(offset, length)`, in ascending order;
    /// `emit` answers `false` to stop early. The snapshot is released on
    /// every path. The pool must be active.
    pub async fn read_metadata<F, Fut>(&self, q: Query, mut emit: F) -> Result<()>
    where
        F: FnMut(u64, u64) -> Fut,
        Fut: Future<Output = bool>,
    {
        let _one = self.metadata_lock.lock().await;
        let status = self.dmsetup(crate::argv!["status", self.tpool()]).await?;
        if holds_metadata_snap(&status)? {
            tracing::warn!(
                pool = self.tpool(),
                "a metadata snapshot is held (left by a killed driver?); releasing it"
            );
            self.pool_message("release_metadata_snap").await?;
        }
        self.pool_message("reserve_metadata_snap").await?;
        tracing::info!(pool = self.tpool(), ?q, "reserved a metadata snapshot");
        let res = self.read_reserved(q, &mut emit).await;
        let released = self.pool_message("release_metadata_snap").await;
        match &released {
            Ok(()) => tracing::info!(pool = self.tpool(), "released the metadata snapshot"),
            Err(e) => {
                tracing::error!(pool = self.tpool(), error = %e, "could not release the metadata snapshot; the next read releases it")
            }
        }
        res.and(released)
    }

    async fn read_reserved<F, Fut>(&self, q: Query, emit: &mut F) -> Result<()>
    where
        F: FnMut(u64, u64) -> Fut,
        Fut: Future<Output = bool>,
    {
        let meta = self.tmeta().display().to_string();
        let (program, args) = match q {
            Query::Mapped { dev } => (
                "thin_dump",
                crate::argv!["--metadata-snap", "--dev-id", dev.to_string(), meta],
            ),
            Query::Delta { base, target } => (
                "thin_delta",
                crate::argv![
                    "--metadata-snap",
                    "--snap1",
                    base.to_string(),
                    "--snap2",
                    target.to_string(),
                    meta
                ],
            ),
        };
        let mut out = Lines::spawn(program, &args, self.timeout)?;
        let mut chunk_bytes = None;
        let mut merge = Merge::default();
        let mut wanted = true;
        while let Some(line) = out.next().await? {
            let done = match parse_line(q, &line)? {
                Line::ChunkSectors(s) => {
                    chunk_bytes = Some(s * 512);
                    None
                }
                Line::Chunks(c) => merge.push(c)?,
                Line::Other => None,
            };
            if let Some(c) = done {
                if !emit_run(chunk_bytes, c, emit).await? {
                    wanted = false;
                    break;
                }
            }
        }
        if wanted {
            if let Some(c) = std::mem::take(&mut merge).finish() {
                emit_run(chunk_bytes, c, emit).await?;
            }
        }
        out.finish().await
    }
}

async fn emit_run<F, Fut>(chunk_bytes: Option<u64>, c: Chunks, emit: &mut F) -> Result<bool>
where
    F: FnMut(u64, u64) -> Fut,
    Fut: Future<Output = bool>,
{
    let size = chunk_bytes.ok_or_else(|| {
        Error::Internal("thin metadata output named chunks before its chunk size".into())
    })?;
    Ok(emit(c.begin * size, c.len * size).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELTA: &str = r#"<superblock uuid="" time="2" transaction="3" data_block_size="128" nr_data_blocks="0">
  <diff left="2" right="3">
    <same begin="0" length="1"/>
    <different begin="1" length="2"/>
    <left_only begin="3" length="1"/>
    <right_only begin="500" length="1"/>
  </diff>
</superblock>"#;

    const DUMP: &str = r#"<superblock uuid="" time="2" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="0">
  <device dev_id="2" mapped_blocks="4" transaction="1" creation_time="1" snap_time="1">
    <range_mapping origin_begin="0" data_begin="0" length="3" time="0"/>
    <single_mapping origin_block="100" data_block="3" time="0"/>
  </device>
</superblock>"#;

    fn runs(q: Query, text: &str) -> Vec<(u64, u64)> {
        let (mut size, mut merge, mut out) = (0, Merge::default(), Vec::new());
        for line in text.lines() {
            match parse_line(q, line).unwrap() {
                Line::ChunkSectors(s) => size = s * 512,
                Line::Chunks(c) => out.extend(merge.push(c).unwrap()),
                Line::Other => {}
            }
        }
        out.extend(merge.finish());
        out.iter().map(|c| (c.begin * size, c.len * size)).collect()
    }

    #[test]
    fn delta_counts_every_kind_of_change_and_merges_neighbours() {
        let k = 64 * 1024;
        assert_eq!(
            runs(Query::Delta { base: 2, target: 3 }, DELTA),
            vec![(k, 3 * k), (500 * k, k)]
        );
    }

    #[test]
    fn dump_lists_mapped_chunks() {
        let k = 64 * 1024;
        assert_eq!(
            runs(Query::Mapped { dev: 2 }, DUMP),
            vec![(0, 3 * k), (100 * k, k)]
        );
    }

    #[test]
    fn a_damaged_line_is_an_error() {
        let q = Query::Delta { base: 1, target: 2 };
        assert!(parse_line(q, r#"<different begin="x" length="1"/>"#).is_err());
        assert!(parse_line(q, r#"<different length="1"/>"#).is_err());
        assert_eq!(parse_line(q, "</diff>").unwrap(), Line::Other);
        assert_eq!(parse_line(q, "").unwrap(), Line::Other);
    }

    #[test]
    fn held_metadata_snapshots_are_read_from_status() {
        let free =
            "0 409600 thin-pool 3 113/1024 7/3200 - rw discard_passdown queue_if_no_space - 256";
        let held =
            "0 409600 thin-pool 3 114/1024 7/3200 37 rw discard_passdown queue_if_no_space - 256";
        assert!(!holds_metadata_snap(free).unwrap());
        assert!(holds_metadata_snap(held).unwrap());
        assert!(holds_metadata_snap("0 8 linear").is_err());
        assert_eq!(
            holds_metadata_snap("0 8 thin-pool Fail")
                .unwrap_err()
                .code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn runs_out_of_order_are_refused() {
        let mut m = Merge::default();
        assert_eq!(m.push(Chunks { begin: 10, len: 5 }).unwrap(), None);
        assert!(m.push(Chunks { begin: 12, len: 1 }).is_err(), "overlap");
        assert!(m.push(Chunks { begin: 3, len: 1 }).is_err(), "backwards");
        assert_eq!(m.push(Chunks { begin: 15, len: 1 }).unwrap(), None);
        assert_eq!(
            m.push(Chunks { begin: 20, len: 1 }).unwrap(),
            Some(Chunks { begin: 10, len: 6 })
        );
    }
}
