//! The target's side of a copy from another node (docs/moving.md): a new
//! thin LV filled with a source snapshot's mapped ranges, each checked
//! against its BLAKE3 hash before it is written, and each read's summary
//! checked against what was written. What the source did not map is never
//! written, so it stays unprovisioned here too.
//!
//! Until the copy is whole the LV carries the filling tag
//! ([`naming::TAG_FILLING`]) with the offset up to which it is written,
//! verified and synced: no call serves it (its tags decode to no volume),
//! and the CreateVolume that made it, retried, goes on from that offset.
//! A range or digest that does not match removes the partial LV (the
//! retry starts again from 0); a cut read is resumed where the last
//! verified range ended, a few times within the call, then by the retry.
//! A copy whose ranges came in more than one read (resumed), or that an
//! earlier call made, is checked whole before it is answered: each
//! 64 MiB of it read back from the device and hashed, against the same
//! hashes of the snapshot from its node.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::transfer::{Digest, Piece, ReadAt, SEGMENT_BYTES};
use crate::error::{Error, Result};
use crate::naming;
use crate::volume::Volumes;

/// Where a copy's pieces come from: a read of the source snapshot from
/// byte `start` on, as `Transfer.Read` sends it (a header, ranges in
/// ascending order, then a summary of that read); with `base` (a snapshot
/// of the same volume the copy holds), only the ranges that differ.
pub trait Source: Sync {
    fn read(
        &self,
        start: u64,
        base: Option<&str>,
    ) -> impl Future<Output = Result<mpsc::Receiver<Result<Piece>>>> + Send;

    /// The BLAKE3 of each [`SEGMENT_BYTES`] of the snapshot's first
    /// `length` bytes (`Transfer.Hash` with segments), for the whole check.
    fn segments(&self, length: u64) -> impl Future<Output = Result<Vec<[u8; 32]>>> + Send;
}

/// Where a copy's bytes go (blocking calls: run off the runtime).
pub trait Sink: Send + Sync + 'static {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    fn sync(&self) -> Result<()>;
    /// Reads back what was written, exactly (the whole check).
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Syncs, then forgets what is cached of it: the whole check reads
    /// the device, not the pages the copy wrote.
    fn drop_cached(&self) -> Result<()>;
}

/// A copy's device, its writes counted (`thinpool_csi_copy_bytes_total`).
struct Device {
    dev: crate::sys::ExclusiveDevice,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Sink for Device {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.dev.write_all_at(offset, data)?;
        self.metrics.copied(data.len() as u64);
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(self.dev.sync_data()?)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.dev.read_exact_at(offset, buf)?)
    }
    fn drop_cached(&self) -> Result<()> {
        Ok(self.dev.drop_cached()?)
    }
}

/// What a copy must agree with, as the source node's grant said: the
/// snapshot's size, its volume's access and encryption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFacts {
    pub size: u64,
    pub access: Option<crate::naming::Access>,
    pub encrypted: bool,
}

/// A copy to pull: the source snapshot's id (with its node key), what
/// its node said of it, or why it said nothing (then only a copy already
/// whole is answered), and where its data comes from.
pub struct Pull<S> {
    pub id: String,
    /// For a clone (`id` a volume): the snapshot its node took for it,
    /// which `source` reads.
    pub via: Option<String>,
    /// A move's round (docs/moving.md): the snapshot of the same volume
    /// the copy may hold whole already; then only what differs is read.
    pub base: Option<String>,
    /// A move's round before the last: the copy, once whole, is held
    /// back (still no volume) for the next round.
    pub hold: bool,
    pub facts: Result<SourceFacts>,
    pub source: S,
}

/// How often the offset reached is recorded: after `bytes` written (not
/// the distance in offsets: a sparse copy or a delta round jumps), or
/// `time`, whichever comes first.
#[derive(Debug, Clone, Copy)]
pub struct Every {
    pub bytes: u64,
    pub time: Duration,
}

/// What a fill records: the offset up to which the copy is written,
/// verified and synced; `Checking` when that is its end, before its
/// whole check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Reached(u64),
    Checking(u64),
}

impl Mark {
    pub fn at(self) -> u64 {
        match self {
            Mark::Reached(at) | Mark::Checking(at) => at,
        }
    }
}

/// Every 64 MiB or 5 s: each record is a metadata commit.
pub const RECORD: Every = Every {
    bytes: 64 * 1024 * 1024,
    time: Duration::from_secs(5),
};

/// Why a copy a DeleteVolume stopped at byte `at` ends: not a passing
/// failure (no retry resumes it: the copy is removed).
fn stopped_at(at: u64) -> Error {
    Error::FailedPrecondition(format!(
        "the copy was cancelled at byte {at} by a DeleteVolume of it, and removed"
    ))
}

/// Turns true when a copy is to stop ([`Copies::stop`]).
pub type Stop = tokio::sync::watch::Receiver<bool>;

/// How many times one call resumes a read that was cut, after 1, 4 and
/// 16 s: a link away for up to about half a minute (beyond the 20 s the
/// HTTP/2 pings take to find it gone) is ridden out within the call.
pub const RESUMES: u32 = 3;

/// What a finished fill wrote: the ranges and bytes of its last read,
/// and the bytes written by all the reads of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    pub ranges: u64,
    pub bytes: u64,
    pub written: u64,
    /// The snapshot's size, as its header said.
    pub capacity: u64,
    /// Whether the copy was checked whole ([`check_whole`]): its ranges
    /// came in more than one read, or an earlier call made it.
    pub checked_whole: bool,
}

/// A fill that failed: why, its device when it was activated (to
/// deactivate), and whether a DeleteVolume stopped it.
type FillFailed = (Error, Option<crate::node::Device>, bool);

/// The filling offset of a copy that is whole but held back by a move
/// for its next round (`Pull::hold`).
pub const WHOLE: u64 = u64::MAX;

/// What a pulled CreateVolume made: the LV and its size, the volume
/// (none while a move holds the copy back), and this call's round.
#[derive(Debug, Clone)]
pub struct PulledCopy {
    pub lv: String,
    pub size: u64,
    pub volume: Option<super::controller::VolumeInfo>,
    pub round: Round,
}

/// What the last read of a call carried, and the base it was read
/// against (a move's delta round).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    pub ranges: u64,
    pub bytes: u64,
    pub base: Option<String>,
}

/// The copies a class fills now, by LV: how far each got (for its
/// VolumeCondition, `ControllerGetVolume`) and how to stop it (a
/// DeleteVolume of it).
#[derive(Debug, Default)]
pub struct Copies(std::sync::Mutex<std::collections::HashMap<String, Running>>);

#[derive(Debug)]
struct Running {
    from: u64,
    at: u64,
    size: u64,
    started: Instant,
    stop: tokio::sync::watch::Sender<bool>,
    /// Whole, and being checked against its source ([`check_whole`]).
    checking: bool,
}

/// A copy counted in [`Copies`] while it fills; out of it when dropped.
struct Counted<'a> {
    copies: &'a Copies,
    lv: String,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.copies.0.lock().unwrap().remove(&self.lv);
    }
}

impl Copies {
    /// `lv` fills from byte `from` of `size`: counted until the guard
    /// drops; the receiver turns true when it is to stop.
    fn start(&self, lv: &str, from: u64, size: u64) -> (Counted<'_>, Stop) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = Running {
            from,
            at: from,
            size,
            started: Instant::now(),
            stop,
            checking: false,
        };
        self.0.lock().unwrap().insert(lv.to_string(), running);
        (
            Counted {
                copies: self,
                lv: lv.to_string(),
            },
            stopped,
        )
    }

    fn reached(&self, lv: &str, mark: Mark) {
        if let Some(r) = self.0.lock().unwrap().get_mut(lv) {
            r.at = mark.at();
            r.checking = matches!(mark, Mark::Checking(_));
        }
    }

    /// Asks the fill of `lv` to stop at its next piece; whether one runs.
    pub fn stop(&self, lv: &str) -> bool {
        self.0
            .lock()
            .unwrap()
            .get(lv)
            .map(|r| r.stop.send_replace(true))
            .is_some()
    }

    /// What a copy at filling offset `recorded` of `size` bytes is doing,
    /// in words: its progress while it fills (the offset reached, the
    /// rate by offset, the time left at it), else where it stopped.
    pub fn describe(&self, lv: &str, recorded: u64, size: u64) -> String {
        if recorded == WHOLE {
            return "a move's copy from another node, whole and held back for the move's next round: no volume until its last round".into();
        }
        let copies = self.0.lock().unwrap();
        let Some(r) = copies.get(lv) else {
            return format!(
                "a copy from another node, stopped at byte {recorded} of {size} ({:.0} %): the CreateVolume retry goes on with it; no volume until it is whole",
                recorded as f64 * 100.0 / size.max(1) as f64
            );
        };
        if r.checking {
            return format!(
                "a copy from another node, every range written ({} bytes), being checked whole against its source (each 64 MiB hashed on both nodes): no volume until it passes",
                r.at
            );
        }
        let secs = r.started.elapsed().as_secs_f64().max(0.001);
        let rate = (r.at - r.from) as f64 / secs;
        let left = match rate > 0.0 {
            true => format!(
                ", about {:.0} s left",
                r.size.saturating_sub(r.at) as f64 / rate
            ),
            false => String::new(),
        };
        format!(
            "being copied from another node: byte {} of {} ({:.0} %), {:.1} MiB/s{left}; no volume until it is whole",
            r.at,
            r.size,
            r.at as f64 * 100.0 / r.size.max(1) as f64,
            rate / 1048576.0
        )
    }
}

/// Where the last record was made, when, and the bytes written since;
/// and the bytes the call wrote.
struct Recorded {
    written: u64,
    when: Instant,
    total: u64,
}

/// How a read ended that did not finish the copy.
enum Ended {
    /// Cut (the stream failed or ended without its summary, the source
    /// is away or busy): resumable from the offset reached.
    Cut(u64, Error),
    /// Anything else, the data's checks included: not resumed.
    Failed(Error),
}

/// Whether a read that failed with `e` can be resumed: the source or
/// the link is away, busy or slow, not the data wrong.
fn resumable(e: &Error) -> bool {
    use tonic::Code;
    matches!(
        e.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::ResourceExhausted
    )
}

/// Fills `sink` (of `size` bytes) from `source`, from byte `from` on;
/// `earlier` when a call before this one made the copy (what it holds
/// may not all come from this call's reads). `record(Mark::Reached(at))`
/// is called, after a sync, as often as `every` says: everything below
/// `at` is written and verified. A cut read is resumed [`RESUMES`] times, after
/// 1, 4 and 16 s. A copy not filled by one read from byte 0 of a
/// copy made in this call is checked whole ([`check_whole`]).
pub async fn fill<S, K, R, F>(
    (source, base): (&S, Option<&str>),
    sink: Arc<K>,
    size: u64,
    (from, earlier): (u64, bool),
    (bound, every, mut stop): (Duration, Every, Stop),
    mut record: R,
) -> Result<Filled>
where
    S: Source,
    K: Sink,
    R: FnMut(Mark) -> F,
    F: Future<Output = Result<()>>,
{
    let mut at = from;
    let mut resumed = 0;
    // Carried across resumed reads: the bound on what is left unrecorded
    // holds for the call, not for each read.
    let mut recorded = Recorded {
        written: 0,
        when: Instant::now(),
        total: 0,
    };
    loop {
        let read = read_once(
            (source, base),
            &sink,
            size,
            at,
            (bound, every, &mut stop),
            &mut record,
            &mut recorded,
        );
        match read.await {
            // Some ranges came in an earlier read (of this call, or of a
            // call before it): each read checked only its own, so the
            // copy is checked whole. A delta read leaves that to the
            // move's last check (`Move.Verify`).
            Ok(filled) if (at > 0 || earlier) && base.is_none() => {
                // Recorded first: a retry after a failed check checks
                // again without reading anything again.
                record(Mark::Checking(filled.capacity)).await?;
                let whole = (filled.capacity, SEGMENT_BYTES);
                check_whole(source, &sink, whole, bound, &stop).await?;
                return Ok(Filled {
                    written: recorded.total,
                    checked_whole: true,
                    ..filled
                });
            }
            Ok(filled) => {
                return Ok(Filled {
                    written: recorded.total,
                    ..filled
                })
            }
            Err(Ended::Cut(reached, e)) if resumed < RESUMES => {
                resumed += 1;
                tracing::warn!(from = at, reached, error = %e, resumed,
                    "copy: the read was cut; resuming where it stopped");
                at = reached;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1 << (2 * (resumed - 1)))) => {}
                    _ = stop.wait_for(|s| *s) => return Err(stopped_at(at)),
                }
            }
            Err(Ended::Cut(_, e)) | Err(Ended::Failed(e)) => return Err(e),
        }
    }
}

/// One read from `start`: every range checked and written, and its
/// summary checked.
async fn read_once<S, K, R, F>(
    (source, base): (&S, Option<&str>),
    sink: &Arc<K>,
    size: u64,
    start: u64,
    (bound, every, stop): (Duration, Every, &mut Stop),
    record: &mut R,
    recorded: &mut Recorded,
) -> std::result::Result<Filled, Ended>
where
    S: Source,
    K: Sink,
    R: FnMut(Mark) -> F,
    F: Future<Output = Result<()>>,
{
    let cut = |at: u64, e: Error| {
        if resumable(&e) {
            Ended::Cut(at, e)
        } else {
            Ended::Failed(e)
        }
    };
    let mut rx = tokio::select! {
        rx = source.read(start, base) => rx.map_err(|e| cut(start, e))?,
        _ = stop.wait_for(|s| *s) => return Err(Ended::Failed(stopped_at(start))),
    };
    let mut next = start;
    let mut digest = Digest::default();
    let mut capacity = None;
    loop {
        let next_piece = tokio::select! {
            p = rx.recv() => p,
            _ = stop.wait_for(|s| *s) => return Err(Ended::Failed(stopped_at(next))),
        };
        let piece = match next_piece {
            Some(Ok(p)) => p,
            Some(Err(e)) => return Err(cut(next, e)),
            None => {
                return Err(Ended::Cut(
                    next,
                    Error::Unavailable(format!(
                        "the source's read ended at byte {next} without its summary"
                    )),
                ))
            }
        };
        match piece {
            Piece::Header { capacity: c, .. } => {
                if capacity.is_some() {
                    return Err(Ended::Failed(Error::DataLoss(
                        "the source sent a second header".into(),
                    )));
                }
                if c > size {
                    return Err(Ended::Failed(Error::FailedPrecondition(format!(
                        "the source snapshot holds {c} bytes, more than the new volume's {size}"
                    ))));
                }
                capacity = Some(c);
            }
            Piece::Range { offset, data, hash } => {
                let length = data.len() as u64;
                let Some(c) = capacity else {
                    return Err(Ended::Failed(Error::DataLoss(
                        "a range came before the header".into(),
                    )));
                };
                if offset < next || offset.checked_add(length).is_none_or(|e| e > c) || length == 0
                {
                    return Err(Ended::Failed(Error::DataLoss(format!(
                        "range {offset}+{length} is out of order or out of bounds (next byte {next}, snapshot {c} bytes)"
                    ))));
                }
                // Checked and written off the runtime: hashing a MiB takes
                // milliseconds on a slow CPU, and the next pieces are
                // decrypted meanwhile.
                let s = sink.clone();
                crate::blocking::run("check and write a copied range", bound, move || {
                    if blake3::hash(&data).as_bytes() != &hash {
                        return Err(Error::DataLoss(format!(
                            "range {offset}+{length} does not match its hash: it changed on the way; nothing of it was written"
                        )));
                    }
                    s.write_at(offset, &data)
                })
                .await
                .map_err(Ended::Failed)?;
                digest.add(offset, length, &hash);
                next = offset + length;
                recorded.written += length;
                recorded.total += length;
                if recorded.written >= every.bytes || recorded.when.elapsed() >= every.time {
                    sync(sink, bound).await.map_err(Ended::Failed)?;
                    record(Mark::Reached(next)).await.map_err(Ended::Failed)?;
                    recorded.written = 0;
                    recorded.when = Instant::now();
                }
            }
            Piece::Summary { .. } if capacity.is_none() => {
                return Err(Ended::Failed(Error::DataLoss(
                    "the source sent a summary without a header".into(),
                )))
            }
            Piece::Summary {
                ranges,
                bytes,
                digest: theirs,
            } => {
                let (mine_ranges, mine_bytes, mine) = digest.finish();
                if (ranges, bytes, theirs) != (mine_ranges, mine_bytes, mine) {
                    return Err(Ended::Failed(Error::DataLoss(format!(
                        "the read from byte {start} does not match its summary: the source sent {ranges} ranges of {bytes} bytes, {mine_ranges} ranges of {mine_bytes} bytes arrived{}",
                        if (ranges, bytes) == (mine_ranges, mine_bytes) { " with another digest" } else { "" }
                    ))));
                }
                sync(sink, bound).await.map_err(Ended::Failed)?;
                return Ok(Filled {
                    ranges,
                    bytes,
                    written: 0,
                    capacity: capacity.unwrap_or(0),
                    checked_whole: false,
                });
            }
        }
    }
}

/// The whole check of a copy of `capacity` bytes: each `segment` bytes
/// ([`SEGMENT_BYTES`], as the source hashes them) of it read back and
/// hashed here, and the same of the snapshot on its node, at once. A
/// segment that differs is DATA_LOSS naming its bytes (the copy is
/// removed); a source that cannot answer is its error (the retry checks
/// again). When either side fails, or a DeleteVolume stops the copy,
/// the local hash ends within a MiB, and is awaited: nothing of it
/// still reads the device once this returns.
async fn check_whole<S: Source, K: Sink>(
    source: &S,
    sink: &Arc<K>,
    (capacity, segment): (u64, u64),
    bound: Duration,
    stop: &Stop,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    if capacity == 0 {
        return Ok(());
    }
    let s = sink.clone();
    crate::blocking::run("drop a copy's cached pages", bound, move || s.drop_cached()).await?;
    let quit = Arc::new(AtomicBool::new(false));
    // Turns true when the local hash failed: the source's is dropped
    // (its node stops hashing when its caller goes away).
    let (failed, local_failed) = tokio::sync::watch::channel(false);
    let read: ReadAt = {
        let sink = sink.clone();
        Arc::new(move |at, buf| sink.read_exact_at(at, buf))
    };
    let run = super::transfer::HashRun {
        bound,
        quit: quit.clone(),
        pace: None,
    };
    let theirs = async {
        let (mut stop, mut local_failed) = (stop.clone(), local_failed);
        let r = tokio::select! {
            r = source.segments(capacity) => r,
            _ = stop.wait_for(|s| *s) => Err(stopped_at(capacity)),
            _ = local_failed.wait_for(|f| *f) => Err(Error::Aborted("the copy's own hash failed".into())),
        };
        if r.is_err() {
            quit.store(true, Ordering::Relaxed);
        }
        r
    };
    let mine = async {
        let mut stop = stop.clone();
        let hash = super::transfer::hash_device(read, capacity, Some(segment), run);
        tokio::pin!(hash);
        let r = tokio::select! {
            r = &mut hash => r,
            // The guard wait_for gives is dropped before the await below.
            _ = async { drop(stop.wait_for(|s| *s).await) } => {
                quit.store(true, Ordering::Relaxed);
                let _ = (&mut hash).await;
                Err(stopped_at(capacity))
            }
        };
        if r.is_err() {
            quit.store(true, Ordering::Relaxed);
            let _ = failed.send(true);
        }
        r
    };
    let (theirs, mine) = tokio::join!(theirs, mine);
    if *stop.borrow() {
        return Err(stopped_at(capacity));
    }
    // The local failure is the cause when there is one (the source's
    // hash was dropped for it).
    let mine = mine?;
    let theirs = theirs?;
    let expected = capacity.div_ceil(segment) as usize;
    if theirs.len() != expected {
        return Err(Error::FailedPrecondition(format!(
            "the source node answered {} segment hashes for {capacity} bytes, not {expected}: it does not hash by segments",
            theirs.len()
        ))
        .advise("run this version of the node plugin on the source node; the retry checks the copy again without reading it again"));
    }
    if let Some(differ) = super::transfer::segments_that_differ(&theirs, &mine, (capacity, segment))
    {
        return Err(Error::DataLoss(format!(
            "the copy read back does not match its source in bytes {differ}: it is removed"
        )));
    }
    tracing::info!(
        capacity,
        segments = mine.len(),
        "copy: checked whole against the source"
    );
    Ok(())
}

async fn sync<K: Sink>(sink: &Arc<K>, bound: Duration) -> Result<()> {
    let s = sink.clone();
    crate::blocking::run("sync a copy", bound, move || s.sync()).await
}

impl Volumes {
    /// CreateVolume of a copy of `pull`'s snapshot (an id with another
    /// node's key): a new thin LV of `spec`'s size, at least the
    /// snapshot's, filled from `pull.source` ([`Volumes::fill_copy`]),
    /// after the checks a restore on the snapshot's own node makes (its
    /// access and encryption, [`super::controller::fits_source`]). It is
    /// made with the volume's tags but its owner tag, with the filling tag
    /// and the pulled tag (the source's id); a retry finds it and goes on
    /// where the filling tag says, when it names the same source and asks
    /// for what made it (as any CreateVolume retry:
    /// [`super::controller::same_request`]); once whole it has its owner
    /// tag and is the volume, and a retry answers it even when the source
    /// node can no longer say anything (`pull.facts` an error).
    ///
    /// `spec.from` is empty: the source names an object of another node,
    /// which no call of this node can act on.
    pub async fn create_pulled<S: Source + Send + 'static>(
        self: &Arc<Self>,
        spec: super::controller::CreateSpec,
        pull: Pull<S>,
    ) -> Result<PulledCopy> {
        let lv_name = self.in_class_id(naming::lv_name_for(&spec.co_name));
        self.detached(&lv_name.clone(), "CreateVolume", move |d, _| async move {
            let Pull {
                id: source_id,
                via,
                base,
                hold,
                facts,
                source,
            } = pull;
            let name = spec.co_name.clone();
            let tags = d.tags_for(&spec);
            let pulled = naming::pulled_tag(&source_id);
            let via = via.as_deref().map(naming::via_tag);
            let mut filling_tags = vec![pulled.clone()];
            filling_tags.extend(via.clone());
            let report = d.lvm.known().await?;
            let refuse = || {
                Error::AlreadyExists(format!(
                    "volume {name:?} exists as {lv_name} and is not this request's copy of {source_id}"
                ))
            };
            let fits = |size| super::size::size_fits(spec.range.as_ref(), size);
            // Whether a call before this one made the copy: then what it
            // holds is checked whole once filled.
            let mut earlier = true;
            match report.find(&lv_name) {
                Some(lv) if d.filling_here(lv).is_some() => {
                    // What it was made with, read as the volume it will be.
                    let with_owner = lv
                        .tags
                        .iter()
                        .filter(|t| !t.starts_with(naming::TAG_FILLING))
                        .cloned()
                        .chain([d.owner_tag()])
                        .collect::<Vec<_>>();
                    let made = naming::VolumeTags::decode(&lv_name, with_owner.iter().map(String::as_str));
                    let same = made.is_some_and(|m| super::controller::same_request(&m, &tags));
                    if !same || !fits(lv.size) {
                        return Err(refuse());
                    }
                    let at = d.filling_here(lv).unwrap_or(0);
                    let facts = facts?;
                    // A move's next round: the copy holds the base snapshot
                    // whole; only what differs from it is read.
                    let delta_from = base
                        .as_deref()
                        .filter(|b| via.is_none() && at == WHOLE && lv.tags.contains(&naming::pulled_tag(b)));
                    if let Some(b) = delta_from.filter(|_| !lv.tags.contains(&pulled)) {
                        if facts.size > lv.size {
                            return Err(Error::FailedPrecondition(format!(
                                "snapshot {source_id} holds {} bytes, more than the copy's {}: the volume grew during the move",
                                facts.size, lv.size
                            ))
                            .advise("delete the copy (DeleteVolume of its id) and move the volume again"));
                        }
                        let driver = &d.cfg.driver_name;
                        d.lvm
                            .retag_all(
                                &lv_name,
                                &[naming::pulled_tag(b), naming::filling_tag(WHOLE, driver)],
                                &[pulled.clone(), naming::base_tag(b), naming::filling_tag(0, driver)],
                            )
                            .await?;
                        tracing::info!(name, lv = lv_name, base = b, snapshot = source_id,
                            "CreateVolume: a move's next round: the copy holds the base; reading what differs from it");
                    } else if !lv.tags.contains(&pulled) {
                        return Err(refuse());
                    } else if via.as_ref().is_some_and(|v| !lv.tags.contains(v)) {
                        // The snapshot the source took for this clone is
                        // another one now (the first was released or
                        // expired): another point in time, so the copy
                        // starts again.
                        d.lvm.remove_owned(&lv_name, &naming::filling_tag(at, &d.cfg.driver_name)).await?;
                        tracing::warn!(name, lv = lv_name, at, "CreateVolume: the clone's source is another snapshot now; removed the partial copy, starting again from 0");
                        d.make_filling(&lv_name, &tags, &filling_tags, spec.range.as_ref(), facts.size)
                            .await?;
                        earlier = false;
                    } else {
                        tracing::info!(name, lv = lv_name, at, "CreateVolume: going on with a copy from another node");
                    }
                }
                Some(_) => {
                    let existing = d.owned(&report, &lv_name).map_err(|_| refuse())?;
                    let existing = existing.ok_or_else(refuse)?;
                    if !super::controller::same_request(&existing.tags, &tags)
                        || !existing.lv.tags.contains(&pulled)
                        || !fits(existing.lv.size)
                    {
                        return Err(refuse());
                    }
                    tracing::info!(name, lv = lv_name, "CreateVolume: already copied, returning it");
                    return Ok(PulledCopy {
                        lv: lv_name.clone(),
                        size: existing.lv.size,
                        volume: Some(super::controller::VolumeInfo::of(&d, &report, existing)),
                        round: Round::default(),
                    });
                }
                None => {
                    let facts = facts?;
                    super::controller::fits_source(
                        &format!("source {source_id}"),
                        facts.access.as_ref(),
                        facts.encrypted,
                        &tags,
                    )?;
                    d.make_filling(&lv_name, &tags, &filling_tags, spec.range.as_ref(), facts.size)
                        .await?;
                    earlier = false;
                }
            };
            let (round, size) = d.fill_copy(&lv_name, &source, (hold, earlier)).await?;
            let volume = match hold {
                true => None,
                false => {
                    let report = d.lvm.known().await?;
                    let vol = d.must_own(&report, &lv_name)?;
                    Some(super::controller::VolumeInfo::of(&d, &report, vol))
                }
            };
            Ok(PulledCopy { lv: lv_name.clone(), size, volume, round })
        })
        .await
    }

    /// Makes the LV a copy fills: checked and reserved as a new volume
    /// is, with its tags but the owner's, the `pulled` tags (and the via
    /// tag of a clone) and the filling tag at 0. Its size: the request's, at least the source's. A pool
    /// that does not zero new chunks is refused: a range written into
    /// part of a chunk would leave a deleted volume's data beside it
    /// where the source reads zeros.
    async fn make_filling(
        &self,
        lv_name: &str,
        tags: &naming::VolumeTags,
        pulled: &[String],
        range: Option<&super::SizeRange>,
        source_size: u64,
    ) -> Result<u64> {
        let owner = self.owner_tag();
        let mut all: Vec<String> = tags.encode().into_iter().filter(|t| *t != owner).collect();
        all.extend(pulled.iter().cloned());
        all.push(naming::filling_tag(0, &self.cfg.driver_name));
        let what = "a copy from another node";
        let size = self
            .create_reserved(lv_name, what, tags, &all, |report, extent| {
                if !self.pool(report)?.zeroes_new_chunks() {
                    return Err(Error::FailedPrecondition(format!(
                        "thin pool {} does not zero new chunks: a copy from another node would show a deleted volume's data where its source reads zeros",
                        self.lvm.lv_path(&self.lvm.pool)
                    ))
                    .advise("turn zeroing on (lvchange --zero y), or restore the snapshot on its own node"));
                }
                let size = super::size::size(range, extent, source_size)?.max(source_size);
                if range.is_some_and(|r| r.limit > 0 && r.limit < size) {
                    return Err(Error::OutOfRange(format!(
                        "the source snapshot holds {source_size} bytes, more than limit_bytes allows"
                    )));
                }
                Ok(size)
            })
            .await?;
        tracing::info!(
            name = tags.co_name,
            lv = lv_name,
            size,
            "CreateVolume: made a copy to fill from another node"
        );
        Ok(size)
    }

    /// Fills the copy `lv_name` (made by [`Volumes::make_filling`]) from
    /// `source`, from the offset its filling tag records, and swaps the
    /// filling tag for the owner tag once the copy is whole, in one
    /// `lvchange`: the LV becomes the volume. A copy whose data did not
    /// match is removed (its filling tag set back to 0 first, so a retry
    /// after a crash between the two starts again from 0); a cut one is
    /// left for the retry to resume.
    async fn fill_copy<S: Source>(
        &self,
        lv_name: &str,
        source: &S,
        (hold, earlier): (bool, bool),
    ) -> Result<(Round, u64)> {
        let report = self.lvm.known().await?;
        let lv = report
            .find(lv_name)
            .filter(|lv| self.filling_here(lv).is_some())
            .ok_or_else(|| Error::Internal(format!("{lv_name} is no copy this driver fills")))?
            .clone();
        let from = self.filling_here(&lv).unwrap_or(0);
        let base = naming::base_of(&lv.tags);
        let driver = self.cfg.driver_name.clone();
        let size = lv.size;
        let tag = std::sync::Mutex::new(naming::filling_tag(from, &driver));
        let filled = match from {
            // Whole already (a round of a move held back, asked again):
            // nothing to read.
            WHOLE => Ok((
                Filled {
                    ranges: 0,
                    bytes: 0,
                    written: 0,
                    capacity: 0,
                    checked_whole: false,
                },
                None,
            )),
            _ => self
                .fill_from(&lv, (source, base.as_deref()), earlier, &tag)
                .await
                .map(|(f, dev)| (f, Some(dev))),
        };
        let last = tag.lock().unwrap().clone();
        match filled {
            Ok((f, dev)) => {
                // One lvchange: the filling and base tags go, and the copy
                // is the volume (or, held back by a move, marked whole;
                // already so when it was whole: nothing to change).
                let mut del = vec![last];
                del.extend(base.as_deref().map(naming::base_tag));
                let add = match hold {
                    true => naming::filling_tag(WHOLE, &driver),
                    false => self.owner_tag(),
                };
                if !(hold && from == WHOLE) {
                    self.lvm.retag_all(lv_name, &del, &[add]).await?;
                }
                // Left inactive, as every new volume is until it is staged.
                if let Some(dev) = &dev {
                    self.deactivate_if_unused(dev).await;
                }
                tracing::info!(
                    lv = lv_name,
                    from,
                    base,
                    held = hold,
                    last_read_ranges = f.ranges,
                    last_read_bytes = f.bytes,
                    checked_whole = f.checked_whole,
                    "{}",
                    match hold {
                        true => "copy: filled and verified; held back for the move's next round",
                        false => "copy: filled and verified; the volume is served",
                    }
                );
                Ok((
                    Round {
                        ranges: f.ranges,
                        bytes: f.written,
                        base,
                    },
                    size,
                ))
            }
            // The data did not match, or a DeleteVolume stopped the copy:
            // it goes now, so no CreateVolume retry resumes it before the
            // DeleteVolume retry comes.
            Err((e, dev, stopped)) if stopped || e.code() == tonic::Code::DataLoss => {
                match stopped {
                    true => {
                        tracing::warn!(lv = lv_name, error = %e, "copy: stopped by a DeleteVolume; removing the partial copy")
                    }
                    false => {
                        tracing::error!(lv = lv_name, error = %e, "copy: the data did not match; removing the partial copy")
                    }
                }
                let zero = naming::filling_tag(0, &driver);
                if let Err(r) = self.lvm.retag(lv_name, Some(&last), Some(&zero)).await {
                    tracing::error!(lv = lv_name, error = %r, "copy: could not set the partial copy back to 0");
                    return Err(e);
                }
                if let Some(dev) = &dev {
                    self.deactivate_if_unused(dev).await;
                }
                if let Err(r) = self.lvm.remove_owned(lv_name, &zero).await {
                    tracing::error!(lv = lv_name, error = %r, "copy: could not remove the partial copy; the retry starts it again from 0");
                }
                Err(e)
            }
            Err((e, _, _)) => {
                tracing::warn!(lv = lv_name, error = %e, "copy: stopped; the retry resumes it");
                Err(e)
            }
        }
    }

    /// The fill itself: `lv` activated and opened exclusively, filled
    /// from its filling offset on (with `base`: what differs from it), the
    /// offset recorded in `tag` as it goes ([`fill`]). Its device, to
    /// deactivate, with the answer.
    async fn fill_from<S: Source>(
        &self,
        lv: &crate::lvm::report::Lv,
        (source, base): (&S, Option<&str>),
        earlier: bool,
        tag: &std::sync::Mutex<String>,
    ) -> std::result::Result<(Filled, crate::node::Device), FillFailed> {
        let lv_name = lv.name.as_str();
        let from = self.filling_here(lv).unwrap_or(0);
        let driver = self.cfg.driver_name.clone();
        let size = lv.size;
        // Counted first: a DeleteVolume from now on stops it.
        let (_counted, stop) = self.copies.start(lv_name, from, size);
        let stopped = stop.clone();
        let failed = |e, dev| (e, dev, *stopped.borrow());
        let (dev, _) = self.activate(lv).await.map_err(|e| failed(e, None))?;
        let path = dev.path.clone();
        let metrics = self.metrics.clone();
        let sink = self
            .tools
            .blocking("open the copy to fill it", move || {
                Ok(Arc::new(Device {
                    dev: crate::sys::open_exclusive(&path)?,
                    metrics,
                }))
            })
            .await
            .map_err(|e| failed(e, Some(dev.clone())))?;
        let _filling = self.metrics.filling();
        let started = Instant::now();
        tracing::info!(
            lv = lv_name,
            from,
            size,
            base,
            "copy: filling from the source node"
        );
        let record = |mark: Mark| {
            let at = mark.at();
            // Progress by offset (holes count as done): a rough rate, and
            // how long what is left takes at it.
            let secs = started.elapsed().as_secs_f64().max(0.001);
            let rate = (at - from) as f64 / secs;
            let eta = (rate > 0.0).then(|| size.saturating_sub(at) as f64 / rate);
            match mark {
                Mark::Reached(_) => tracing::info!(
                    lv = lv_name,
                    at,
                    size,
                    mib_per_sec = rate / 1048576.0,
                    eta_secs = eta.map(|e| e.round()),
                    "copy: progress recorded"
                ),
                Mark::Checking(_) => tracing::info!(
                    lv = lv_name,
                    at,
                    "copy: every range written; checking the copy whole against the source"
                ),
            }
            self.copies.reached(lv_name, mark);
            let new = naming::filling_tag(at, &driver);
            let old = std::mem::replace(&mut *tag.lock().unwrap(), new.clone());
            async move { self.lvm.retag(lv_name, Some(&old), Some(&new)).await }
        };
        let bounds = (self.cfg.command_timeout(), RECORD, stop);
        match fill((source, base), sink, size, (from, earlier), bounds, record).await {
            Ok(f) => Ok((f, dev)),
            Err(e) => Err(failed(e, Some(dev))),
        }
    }

    /// DeleteVolume of a copy being filled: the copy stops (a running
    /// fill holds the volume, so this waits as ABORTED until it ends) and
    /// the partial LV is removed, selected by its filling tag inside the
    /// locked LVM command.
    pub(super) async fn remove_filling(&self, id: &str) -> Result<()> {
        let report = self.lvm.fresh_report().await?;
        let Some(at) = report.find(id).and_then(|lv| self.filling_here(lv)) else {
            return Ok(());
        };
        self.lvm
            .remove_owned(id, &naming::filling_tag(at, &self.cfg.driver_name))
            .await?;
        tracing::info!(
            id,
            at,
            "DeleteVolume: removed a copy being filled from another node"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A snapshot of `capacity` bytes whose mapped ranges hold a pattern;
    /// reads can be cut after `cut_after` ranges (once each), and a range
    /// or the summary spoiled.
    struct Fake {
        capacity: u64,
        ranges: Vec<(u64, u64)>,
        cuts: Mutex<Vec<usize>>,
        spoil_range: Option<u64>,
        spoil_summary: bool,
        starts: Mutex<Vec<u64>>,
        /// What its whole check hashes by.
        segment: u64,
    }

    fn byte(at: u64) -> u8 {
        (at % 251) as u8 + 1
    }

    impl Fake {
        fn new(capacity: u64, ranges: &[(u64, u64)]) -> Fake {
            Fake {
                capacity,
                ranges: ranges.to_vec(),
                cuts: Mutex::new(vec![]),
                spoil_range: None,
                spoil_summary: false,
                starts: Mutex::new(vec![]),
                segment: SEGMENT_BYTES,
            }
        }

        /// The snapshot's first `length` bytes.
        fn image(&self, length: u64) -> Vec<u8> {
            let mut image = vec![0; length as usize];
            for &(o, l) in &self.ranges {
                for at in o..(o + l).min(length) {
                    image[at as usize] = byte(at);
                }
            }
            image
        }
    }

    impl Source for Fake {
        async fn segments(&self, length: u64) -> Result<Vec<[u8; 32]>> {
            let image = Arc::new(self.image(length));
            let read: ReadAt = Arc::new(move |at, buf: &mut [u8]| {
                buf.copy_from_slice(&image[at as usize..at as usize + buf.len()]);
                Ok(())
            });
            let run = super::super::transfer::HashRun {
                bound: Duration::from_secs(5),
                quit: Default::default(),
                pace: None,
            };
            super::super::transfer::hash_device(read, length, Some(self.segment), run).await
        }

        async fn read(&self, start: u64, _: Option<&str>) -> Result<mpsc::Receiver<Result<Piece>>> {
            self.starts.lock().unwrap().push(start);
            let (tx, rx) = mpsc::channel(1000);
            tx.try_send(Ok(Piece::Header {
                capacity: self.capacity,
                chunk: 64,
            }))
            .unwrap();
            let cut = {
                let mut cuts = self.cuts.lock().unwrap();
                (!cuts.is_empty()).then(|| cuts.remove(0))
            };
            let mut digest = Digest::default();
            let mut sent = 0;
            for &(offset, length) in &self.ranges {
                let (offset, length) = match offset + length {
                    end if end <= start => continue,
                    end => (offset.max(start), end - offset.max(start)),
                };
                if cut == Some(sent) {
                    return Ok(rx);
                }
                let data: Vec<u8> = (offset..offset + length).map(byte).collect();
                let hash = *blake3::hash(&data).as_bytes();
                let mut data = data;
                if self.spoil_range == Some(offset) {
                    data[0] ^= 1;
                }
                digest.add(offset, length, &hash);
                tx.try_send(Ok(Piece::Range { offset, data, hash }))
                    .unwrap();
                sent += 1;
            }
            let (ranges, bytes, mut digest) = digest.finish();
            if self.spoil_summary {
                digest[0] ^= 1;
            }
            tx.try_send(Ok(Piece::Summary {
                ranges,
                bytes,
                digest,
            }))
            .unwrap();
            Ok(rx)
        }
    }

    /// A device in memory that counts what was written where.
    struct Mem {
        bytes: Mutex<Vec<u8>>,
        written: Mutex<Vec<(u64, u64)>>,
        /// What happened, in order: `w<offset>`, `sync`, and what the
        /// test's record adds.
        events: Arc<Mutex<Vec<String>>>,
        /// Reads back fail (a device error).
        unreadable: std::sync::atomic::AtomicBool,
    }

    impl Mem {
        fn new(size: usize) -> Arc<Mem> {
            Arc::new(Mem {
                bytes: Mutex::new(vec![0; size]),
                written: Mutex::new(vec![]),
                unreadable: false.into(),
                events: Default::default(),
            })
        }
    }

    impl Sink for Mem {
        fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
            let o = offset as usize;
            self.bytes.lock().unwrap()[o..o + data.len()].copy_from_slice(data);
            self.written
                .lock()
                .unwrap()
                .push((offset, data.len() as u64));
            self.events.lock().unwrap().push(format!("w{offset}"));
            Ok(())
        }
        fn sync(&self) -> Result<()> {
            self.events.lock().unwrap().push("sync".into());
            Ok(())
        }
        fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            if self.unreadable.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::Internal(format!("EIO at {offset}")));
            }
            let o = offset as usize;
            buf.copy_from_slice(&self.bytes.lock().unwrap()[o..o + buf.len()]);
            Ok(())
        }
        fn drop_cached(&self) -> Result<()> {
            self.events.lock().unwrap().push("drop cached".into());
            Ok(())
        }
    }

    const RANGES: &[(u64, u64)] = &[(0, 100), (1000, 300), (4000, 64), (9000, 1000)];

    /// What a whole fill of `src` did, in order (`w<offset>`, `sync`,
    /// `record <at>`), recording as `every` says.
    async fn events_of(src: &Fake, every: Every) -> Vec<String> {
        let size = src.capacity;
        let sink = Mem::new(size as usize);
        let events = sink.events.clone();
        fill(
            (src, None),
            sink,
            size,
            (0, false),
            (Duration::from_secs(5), every, never()),
            |m: Mark| {
                events.lock().unwrap().push(format!("record {}", m.at()));
                async { Ok(()) }
            },
        )
        .await
        .unwrap();
        let done = events.lock().unwrap().clone();
        done
    }

    /// A stop that never comes (its sender kept alive for the test).
    fn never() -> Stop {
        let (tx, rx) = tokio::sync::watch::channel(false);
        std::mem::forget(tx);
        rx
    }

    async fn run(src: &Fake, sink: Arc<Mem>, from: u64) -> (Result<Filled>, Vec<Mark>) {
        let records = Mutex::new(vec![]);
        let r = fill(
            (src, None),
            sink,
            10_000,
            (from, from > 0),
            (Duration::from_secs(5), RECORD, never()),
            |m| {
                records.lock().unwrap().push(m);
                async { Ok(()) }
            },
        )
        .await;
        (r, records.into_inner().unwrap())
    }

    fn expected(from: u64) -> Vec<u8> {
        let mut want = vec![0u8; 10_000];
        for &(o, l) in RANGES {
            for at in o.max(from)..o + l {
                want[at as usize] = byte(at);
            }
        }
        want
    }

    #[tokio::test]
    async fn only_the_mapped_ranges_are_written_and_each_checked() {
        let src = Fake::new(10_000, RANGES);
        let sink = Mem::new(10_000);
        let (r, _) = run(&src, sink.clone(), 0).await;
        assert_eq!(
            r.unwrap(),
            Filled {
                ranges: 4,
                bytes: 1464,
                written: 1464,
                capacity: 10_000,
                checked_whole: false,
            },
            "one read covered every range: its summary is the whole check"
        );
        assert_eq!(*sink.bytes.lock().unwrap(), expected(0));
        assert_eq!(
            *sink.written.lock().unwrap(),
            RANGES.to_vec(),
            "nothing unmapped is written"
        );
    }

    #[tokio::test]
    async fn a_spoiled_range_fails_the_copy_naming_it_and_is_not_written() {
        let mut src = Fake::new(10_000, RANGES);
        src.spoil_range = Some(1000);
        let sink = Mem::new(10_000);
        let (r, _) = run(&src, sink.clone(), 0).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DataLoss);
        assert!(e.to_string().contains("range 1000+300"), "{e}");
        assert_eq!(*sink.written.lock().unwrap(), vec![(0, 100)]);
        assert_eq!(
            src.starts.lock().unwrap().len(),
            1,
            "a data error is not resumed"
        );
    }

    #[tokio::test]
    async fn a_summary_that_does_not_match_fails_the_copy() {
        let mut src = Fake::new(10_000, RANGES);
        src.spoil_summary = true;
        let (r, _) = run(&src, Mem::new(10_000), 0).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DataLoss);
        assert!(e.to_string().contains("with another digest"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_read_resumes_where_the_last_checked_range_ended() {
        let src = Fake::new(10_000, RANGES);
        *src.cuts.lock().unwrap() = vec![2, 1];
        let sink = Mem::new(10_000);
        let (r, _) = run(&src, sink.clone(), 0).await;
        let r = r.unwrap();
        // Cut after two ranges (the next byte 1300), then after one more
        // (4064).
        assert_eq!(*src.starts.lock().unwrap(), vec![0, 1300, 4064]);
        assert_eq!(*sink.bytes.lock().unwrap(), expected(0));
        // The last read's summary is its own; what the call wrote is all,
        // and the copy was checked whole.
        assert_eq!(
            r,
            Filled {
                ranges: 1,
                bytes: 1000,
                written: 1464,
                capacity: 10_000,
                checked_whole: true,
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_cut_too_often_is_left_for_the_retry() {
        let src = Fake::new(10_000, RANGES);
        *src.cuts.lock().unwrap() = vec![0; RESUMES as usize + 1];
        let (r, _) = run(&src, Mem::new(10_000), 0).await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::Unavailable);
        assert_eq!(src.starts.lock().unwrap().len(), RESUMES as usize + 1);
    }

    /// A device that holds what a call before wrote below `below`.
    fn written_below(below: u64) -> Arc<Mem> {
        let sink = Mem::new(10_000);
        let want = expected(0);
        sink.bytes.lock().unwrap()[..below as usize].copy_from_slice(&want[..below as usize]);
        sink
    }

    #[tokio::test]
    async fn a_retry_goes_on_from_the_recorded_offset_and_checks_the_copy_whole() {
        let src = Fake::new(10_000, RANGES);
        let sink = written_below(1150);
        let (r, records) = run(&src, sink.clone(), 1150).await;
        assert_eq!(
            r.unwrap(),
            Filled {
                ranges: 3,
                bytes: 1214,
                written: 1214,
                capacity: 10_000,
                checked_whole: true,
            }
        );
        assert_eq!(*src.starts.lock().unwrap(), vec![1150]);
        assert_eq!(*sink.bytes.lock().unwrap(), expected(0));
        assert_eq!(
            records,
            vec![Mark::Checking(10_000)],
            "recorded whole before the check: a retry after a failed check reads nothing again"
        );
    }

    #[tokio::test]
    async fn a_copy_an_earlier_call_made_is_checked_whole_even_from_0() {
        // A byte the source never maps, wrong on the device (a copy a
        // failed check could not remove): no range covers it.
        let src = Fake::new(10_000, RANGES);
        let fill_from_0 = |earlier: bool| {
            let sink = Mem::new(10_000);
            sink.bytes.lock().unwrap()[5000] = 9;
            let src = &src;
            async move {
                fill(
                    (src, None),
                    sink,
                    10_000,
                    (0, earlier),
                    (Duration::from_secs(5), RECORD, never()),
                    |_| async { Ok(()) },
                )
                .await
            }
        };
        let e = fill_from_0(true).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DataLoss, "{e}");
        assert!(!fill_from_0(false).await.unwrap().checked_whole);
    }

    /// A source whose whole check never answers.
    struct Mute(Fake);
    impl Source for Mute {
        async fn segments(&self, _: u64) -> Result<Vec<[u8; 32]>> {
            std::future::pending().await
        }
        async fn read(&self, start: u64, b: Option<&str>) -> Result<mpsc::Receiver<Result<Piece>>> {
            self.0.read(start, b).await
        }
    }

    #[tokio::test]
    async fn a_failed_local_hash_ends_the_check_without_waiting_for_the_source() {
        let src = Mute(Fake::new(10_000, RANGES));
        let stop = never();
        let sink = written_below(10_000);
        sink.unreadable
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let check = check_whole(&src, &sink, (10_000, 1000), Duration::from_secs(5), &stop);
        let e = tokio::time::timeout(Duration::from_secs(10), check)
            .await
            .expect("the check ends on its own failure")
            .unwrap_err();
        assert!(e.to_string().contains("EIO at 0"), "{e}");
    }

    #[tokio::test]
    async fn a_source_that_does_not_hash_by_segments_fails_the_check_but_keeps_the_copy() {
        let mut src = Fake::new(10_000, RANGES);
        src.segment = 10_000;
        let sink = written_below(10_000);
        let e = check_whole(
            &src,
            &sink,
            (10_000, 1000),
            Duration::from_secs(5),
            &never(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    }

    #[tokio::test]
    async fn a_stop_during_the_whole_check_ends_it_and_its_local_hash() {
        let src = Mute(Fake::new(10_000, RANGES));
        let (tx, stop) = tokio::sync::watch::channel(false);
        let sink = written_below(1150);
        let filling = fill(
            (&src, None),
            sink,
            10_000,
            (1150, true),
            (Duration::from_secs(5), RECORD, stop),
            |_| async { Ok(()) },
        );
        let stopping = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(true).unwrap();
        };
        let (r, _) = tokio::join!(filling, stopping);
        let e = r.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.to_string().contains("cancelled"), "{e}");
    }

    #[tokio::test]
    async fn a_hash_told_to_quit_ends_aborted() {
        let read: ReadAt = Arc::new(|_, buf: &mut [u8]| {
            buf.fill(1);
            Ok(())
        });
        let run = |quit: bool| super::super::transfer::HashRun {
            bound: Duration::from_secs(5),
            quit: Arc::new(quit.into()),
            pace: None,
        };
        let h = super::super::transfer::hash_device;
        let e = h(read.clone(), 4 << 20, None, run(true)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted, "{e}");
        let whole = h(read.clone(), 3000, None, run(false)).await.unwrap();
        let segments = h(read, 3000, Some(1000), run(false)).await.unwrap();
        assert_eq!(whole, vec![*blake3::hash(&[1u8; 3000]).as_bytes()]);
        assert_eq!(segments, vec![*blake3::hash(&[1u8; 1000]).as_bytes(); 3]);
    }

    #[tokio::test]
    async fn a_resumed_copy_that_differs_from_its_source_fails_whole() {
        // What a call before wrote was lost below 1150 (the device forgot
        // it): each range of this read checks, the whole does not.
        let src = Fake::new(10_000, RANGES);
        let (r, _) = run(&src, Mem::new(10_000), 1150).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DataLoss);
        assert!(e.to_string().contains("in bytes 0+10000"), "{e}");
    }

    #[tokio::test]
    async fn the_whole_check_names_the_segments_that_differ() {
        let mut src = Fake::new(10_000, RANGES);
        src.segment = 1000;
        let sink = Mem::new(10_000);
        sink.bytes.lock().unwrap().copy_from_slice(&expected(0));
        let src = &src;
        let check = |sink: Arc<Mem>| async move {
            check_whole(src, &sink, (10_000, 1000), Duration::from_secs(5), &never()).await
        };
        check(sink.clone()).await.unwrap();
        // One byte wrong in the second segment, one in the last.
        sink.bytes.lock().unwrap()[1100] ^= 1;
        sink.bytes.lock().unwrap()[9999] ^= 1;
        let e = check(sink).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DataLoss);
        assert!(
            e.to_string().contains("in bytes 1000+1000, 9000+1000:"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_snapshot_larger_than_the_volume_is_refused() {
        let src = Fake::new(20_000, RANGES);
        let (r, _) = run(&src, Mem::new(10_000), 0).await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn progress_is_recorded_after_each_record_bytes_once_synced() {
        let big = 1000;
        let every = Every {
            bytes: big,
            time: Duration::from_secs(3600),
        };
        let src = Fake::new(3 * big, &[(0, big), (big, big), (2 * big + 10, 10)]);
        // Each record after a sync of what it covers; the end synced too.
        assert_eq!(
            events_of(&src, every).await,
            [
                "w0",
                "sync",
                "record 1000",
                "w1000",
                "sync",
                "record 2000",
                "w2010",
                "sync"
            ]
        );
    }

    #[tokio::test]
    async fn a_summary_without_a_header_is_no_copy() {
        struct Bare;
        impl Source for Bare {
            async fn segments(&self, _: u64) -> Result<Vec<[u8; 32]>> {
                unreachable!("this copy is never checked whole: it never completes")
            }
            async fn read(&self, _: u64, _: Option<&str>) -> Result<mpsc::Receiver<Result<Piece>>> {
                let (tx, rx) = mpsc::channel(1);
                tx.try_send(Ok(Piece::Summary {
                    ranges: 0,
                    bytes: 0,
                    digest: Digest::default().finish().2,
                }))
                .unwrap();
                Ok(rx)
            }
        }
        let r = fill(
            (&Bare, None),
            Mem::new(10),
            10,
            (0, false),
            (Duration::from_secs(5), RECORD, never()),
            |_| async { Ok(()) },
        )
        .await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::DataLoss);
    }

    #[tokio::test]
    async fn a_stopped_copy_ends_at_its_next_piece_and_is_not_resumed() {
        // A source that sends its header and then nothing.
        struct Silent(Mutex<Vec<mpsc::Sender<Result<Piece>>>>);
        impl Source for Silent {
            async fn segments(&self, _: u64) -> Result<Vec<[u8; 32]>> {
                unreachable!("this copy is never checked whole: it never completes")
            }
            async fn read(&self, _: u64, _: Option<&str>) -> Result<mpsc::Receiver<Result<Piece>>> {
                let (tx, rx) = mpsc::channel(4);
                tx.try_send(Ok(Piece::Header {
                    capacity: 10,
                    chunk: 64,
                }))
                .unwrap();
                self.0.lock().unwrap().push(tx);
                Ok(rx)
            }
        }
        let src = Silent(Mutex::new(vec![]));
        let copies = Copies::default();
        let (counted, stop) = copies.start("csi-x", 0, 10);
        let filling = fill(
            (&src, None),
            Mem::new(10),
            10,
            (0, false),
            (Duration::from_secs(5), RECORD, stop),
            |_| async { Ok(()) },
        );
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(copies.stop("csi-x"), "the copy runs");
        };
        let (r, ()) = tokio::join!(filling, stopper);
        let e = r.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.to_string().contains("cancelled at byte 0"), "{e}");
        assert_eq!(src.0.lock().unwrap().len(), 1, "a stop is not resumed");
        drop(counted);
        assert!(!copies.stop("csi-x"), "no longer counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_says_how_far_it_got() {
        let copies = Copies::default();
        let (_counted, _stop) = copies.start("csi-x", 0, 4 << 20);
        tokio::time::advance(Duration::from_secs(2)).await;
        copies.reached("csi-x", Mark::Reached(1 << 20));
        let running = copies.describe("csi-x", 0, 4 << 20);
        assert!(running.starts_with("being copied from another node: byte 1048576 of 4194304 (25 %), 0.5 MiB/s, about 6 s left"), "{running}");
        copies.reached("csi-x", Mark::Checking(3 << 20));
        let checking = copies.describe("csi-x", 3 << 20, 4 << 20);
        assert!(
            checking.contains("every range written (3145728 bytes), being checked whole"),
            "{checking}"
        );
        let stopped = copies.describe("csi-y", 1 << 20, 4 << 20);
        assert!(
            stopped.contains("stopped at byte 1048576 of 4194304 (25 %)"),
            "{stopped}"
        );
        assert!(copies
            .describe("csi-y", WHOLE, 4 << 20)
            .contains("held back"));
    }

    #[tokio::test]
    async fn a_sparse_copy_records_by_bytes_written_not_by_offsets() {
        let every = Every {
            bytes: 1000,
            time: Duration::from_secs(3600),
        };
        let src = Fake::new(100_000, &[(0, 10), (50_000, 10), (99_000, 995)]);
        // 1015 bytes written: one record, after the third range.
        assert_eq!(
            events_of(&src, every).await,
            ["w0", "w50000", "w99000", "sync", "record 99995", "sync"]
        );
    }
}
