//! The source's side of a copy to another node (docs/moving.md): a
//! snapshot's mapped ranges, read from its device with their BLAKE3
//! hashes. What is unmapped is never read. The snapshot is never
//! written: it is activated when it is not active (thin snapshots carry
//! the activation-skip flag) and read through a read-only descriptor.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::metadata::{Ask, Item};
use super::SnapshotId;
use crate::error::{Error, Result};
use crate::volume::Volumes;

/// One piece of a snapshot read, in the order they are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// First: the snapshot's size and the pool's chunk size.
    Header { capacity: u64, chunk: u64 },
    /// Mapped bytes at `offset`, and their BLAKE3 hash.
    Range {
        offset: u64,
        data: Vec<u8>,
        hash: [u8; 32],
    },
    /// Last: how many ranges and bytes went out, and [`Digest`]'s hash
    /// of them all.
    Summary {
        ranges: u64,
        bytes: u64,
        digest: [u8; 32],
    },
}

/// The largest range sent in one piece: a mapped run longer than this
/// goes out in several.
pub const PIECE_BYTES: u64 = 1024 * 1024;

/// How many pieces wait between the reader and a slow client.
const QUEUED: usize = 4;

/// The whole copy's check: BLAKE3 over every range's offset and length
/// (little-endian u64s) and its hash, in order. Both sides of a copy
/// compute it.
#[derive(Default)]
pub struct Digest {
    hasher: blake3::Hasher,
    ranges: u64,
    bytes: u64,
}

impl Digest {
    pub fn add(&mut self, offset: u64, length: u64, hash: &[u8; 32]) {
        self.hasher.update(&offset.to_le_bytes());
        self.hasher.update(&length.to_le_bytes());
        self.hasher.update(hash);
        self.ranges += 1;
        self.bytes += length;
    }

    /// How many ranges and bytes were added, and the hash of them all.
    pub fn finish(&self) -> (u64, u64, [u8; 32]) {
        (self.ranges, self.bytes, *self.hasher.finalize().as_bytes())
    }
}

/// The node's cap on transfer reads (`cluster.transfer_mib_per_sec`),
/// shared by every transfer: each piece takes its turn, `length / rate`
/// after the one before, so the reads average at most the rate with a
/// burst of one piece.
#[derive(Debug)]
pub struct Pace {
    /// Bytes a second; 0: no cap.
    rate: u64,
    next: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Pace {
    pub fn new(mib_per_sec: u64) -> Pace {
        Pace {
            rate: mib_per_sec.saturating_mul(1024 * 1024),
            next: std::sync::Mutex::new(None),
        }
    }

    /// Waits until `bytes` may be read.
    pub async fn take(&self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        let start = {
            let mut next = self.next.lock().unwrap();
            let now = tokio::time::Instant::now();
            let start = next.map_or(now, |n| n.max(now));
            *next =
                Some(start + std::time::Duration::from_secs_f64(bytes as f64 / self.rate as f64));
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

/// `(offset, length)` ranges cut into pieces of at most `max` bytes, as
/// they are needed (a fragmented snapshot's pieces are never all held).
pub fn pieces(ranges: &[(u64, u64)], max: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let max = max.max(1);
    ranges.iter().flat_map(move |&(offset, length)| {
        let end = offset + length;
        (offset..end)
            .step_by(max as usize)
            .map(move |at| (at, (end - at).min(max)))
    })
}

/// How much of a device each hash of a segmented whole check covers
/// (`Transfer.Hash` with `segments`): a mismatch names these ranges.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// What `Transfer.Hash` hashes: a snapshot (or a volume), its first
/// `length` bytes (0: all of it), as one hash or by segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashOf {
    pub snapshot: bool,
    pub length: u64,
    pub segmented: bool,
    /// Paced by the node's cap (`cluster.transfer_mib_per_sec`): a peer
    /// asked (a copy's whole check), as a peer's reads are.
    pub paced: bool,
}

/// Reads a device's bytes at an offset, exactly (off the runtime).
pub type ReadAt = Arc<dyn Fn(u64, &mut [u8]) -> Result<()> + Send + Sync>;

/// How much of a device one blocking step of [`hash_device`] reads (and
/// the cap, when it paces the hash, takes at a time).
const HASH_STEP: u64 = 8 * 1024 * 1024;

/// How a [`hash_device`] runs: each step bounded by `bound`; `quit`
/// looked at every MiB (set when the caller went away, or the other
/// side of a check failed: the hash ends ABORTED at once); paced by the
/// node's cap when `pace` is given (a peer asked for it), each step
/// charged its share of mapped bytes (the fraction given): the cap is
/// for what the disks read, and a hole reads none.
pub struct HashRun<'a> {
    pub bound: std::time::Duration,
    pub quit: Arc<std::sync::atomic::AtomicBool>,
    pub pace: Option<(&'a Pace, f64)>,
}

/// The BLAKE3 of the first `size` bytes `read` gives: one hash of them
/// all, or with `segment` one of each `segment` bytes in order, read a
/// step at a time on a blocking thread.
pub async fn hash_device(
    read: ReadAt,
    size: u64,
    segment: Option<u64>,
    run: HashRun<'_>,
) -> Result<Vec<[u8; 32]>> {
    let mut hashes = Vec::new();
    let mut h = blake3::Hasher::new();
    let mut at = 0;
    while at < size {
        let segment_end = segment
            .map(|s| (at / s.max(1) + 1) * s.max(1))
            .unwrap_or(size)
            .min(size);
        let end = (at + HASH_STEP).min(segment_end);
        if let Some((p, mapped)) = run.pace {
            p.take(((end - at) as f64 * mapped.clamp(0.0, 1.0)) as u64)
                .await;
        }
        let (read, quit) = (read.clone(), run.quit.clone());
        h = crate::blocking::run("hash a device", run.bound, move || {
            let mut buf = vec![0u8; (1024 * 1024).min((end - at) as usize)];
            let mut o = at;
            while o < end {
                if quit.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(Error::Aborted(format!(
                        "the hash stopped at byte {o}: its caller went away"
                    )));
                }
                let n = ((end - o) as usize).min(buf.len());
                read(o, &mut buf[..n])?;
                h.update(&buf[..n]);
                o += n as u64;
            }
            Ok(h)
        })
        .await?;
        at = end;
        if segment.is_some() && at == segment_end {
            hashes.push(*std::mem::take(&mut h).finalize().as_bytes());
        }
    }
    if segment.is_none() {
        hashes.push(*h.finalize().as_bytes());
    }
    Ok(hashes)
}

/// Where two segmented hashes of `length` bytes (each of `segment`
/// bytes, [`hash_device`]) differ, as `offset+length` ranges joined by
/// ", "; `None` when they are equal. Hash lists of different lengths
/// differ everywhere.
pub fn segments_that_differ<A: AsRef<[u8]>, B: AsRef<[u8]>>(
    a: &[A],
    b: &[B],
    (length, segment): (u64, u64),
) -> Option<String> {
    let segment = segment.max(1);
    let differ: Vec<String> = match a.len() == b.len() {
        true => (0..a.len() as u64)
            .filter(|&i| a[i as usize].as_ref() != b[i as usize].as_ref())
            .map(|i| {
                let at = i * segment;
                format!("{at}+{}", length.saturating_sub(at).min(segment))
            })
            .collect(),
        false => vec![format!("0+{length}")],
    };
    (!differ.is_empty()).then(|| differ.join(", "))
}

/// How many snapshot reads a node serves at once; one more is
/// RESOURCE_EXHAUSTED (the copy retries).
pub const MAX_READS: usize = 4;

/// What every snapshot read of a node shares: the cap, the bound on
/// reads at once, and who reads which snapshot, so the first reader
/// activates it and the last one deactivates it.
#[derive(Debug)]
pub struct Transfers {
    pace: Pace,
    slots: Arc<tokio::sync::Semaphore>,
    /// Readers by the snapshot's LV path, and whether a reader activated
    /// it; held across the activation, so two first readers wait.
    readers: tokio::sync::Mutex<std::collections::HashMap<String, (usize, bool)>>,
    /// Grants of reads to peers: token, the snapshot id it grants, the
    /// base it may be read against, and its expiry.
    grants: std::sync::Mutex<std::collections::HashMap<String, Grant>>,
}

/// A grant of a snapshot's reads: the snapshot, the one base it may be
/// read against (besides none), and its expiry.
#[derive(Debug)]
struct Grant {
    of: String,
    base: Option<String>,
    until: std::time::Instant,
}

/// How many grants a node keeps at once; expired ones go first.
pub const MAX_GRANTS: usize = 1024;

/// A grant's default and longest life.
pub const GRANT_TTL: std::time::Duration = std::time::Duration::from_secs(3600);
pub const GRANT_MAX_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Transfers {
    pub fn new(mib_per_sec: u64) -> Transfers {
        Transfers {
            pace: Pace::new(mib_per_sec),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_READS)),
            readers: Default::default(),
            grants: Default::default(),
        }
    }

    /// A new grant of snapshot `id`'s reads to a peer, for `ttl` (zero:
    /// [`GRANT_TTL`]; at most [`GRANT_MAX_TTL`]): its token (256 random
    /// bits, hex) and its life. RESOURCE_EXHAUSTED while
    /// [`MAX_GRANTS`] live ones are kept.
    pub fn grant(
        &self,
        id: &str,
        base: Option<&str>,
        ttl: std::time::Duration,
    ) -> Result<(String, std::time::Duration)> {
        let ttl = match ttl {
            t if t.is_zero() => GRANT_TTL,
            t => t.min(GRANT_MAX_TTL),
        };
        let mut bits = [0u8; 32];
        tokio_rustls::rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut bits)
            .map_err(|_| Error::Internal("no random bits for a transfer grant".into()))?;
        let token: String = bits.iter().map(|b| format!("{b:02x}")).collect();
        let now = std::time::Instant::now();
        let mut grants = self.grants.lock().unwrap();
        grants.retain(|_, g| g.until > now);
        // A retried copy asks again: a live grant of the snapshot (and
        // base) with at least half the asked life left serves it (no pile
        // of grants).
        if let Some((token, g)) = grants
            .iter()
            .find(|(_, g)| g.of == id && g.base.as_deref() == base && g.until - now >= ttl / 2)
        {
            return Ok((token.clone(), g.until - now));
        }
        if grants.len() >= MAX_GRANTS {
            return Err(Error::ResourceExhausted(format!(
                "this node already keeps {MAX_GRANTS} transfer grants"
            ))
            .advise("retry once some have expired"));
        }
        grants.insert(
            token.clone(),
            Grant {
                of: id.to_string(),
                base: base.map(str::to_string),
                until: now + ttl,
            },
        );
        tracing::info!(
            snapshot = id,
            ttl_secs = ttl.as_secs(),
            "transfer: granted a peer's reads of a snapshot"
        );
        Ok((token, ttl))
    }

    /// One of the node's [`MAX_READS`] reads; RESOURCE_EXHAUSTED when all
    /// are taken.
    fn slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            Error::ResourceExhausted(format!(
                "this node already reads {MAX_READS} snapshots for copies"
            ))
            .advise("retry once one of them has ended")
        })
    }

    /// Whether `token` is a live grant of snapshot `id`'s reads, whole
    /// or against `base` (the grant's base alone).
    pub fn granted(&self, token: &str, id: &str, base: Option<&str>) -> bool {
        let grants = self.grants.lock().unwrap();
        grants.get(token).is_some_and(|g| {
            g.of == id
                && (base.is_none() || g.base.as_deref() == base)
                && g.until > std::time::Instant::now()
        })
    }
}

/// One reader of a snapshot's device: released (and the snapshot
/// deactivated when it was the last reader and a reader activated it)
/// when dropped, whatever ended the read (a panic included).
struct Reading {
    volumes: Arc<Volumes>,
    transfers: Arc<Transfers>,
    dev: crate::node::Device,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let (v, t, dev) = (
            self.volumes.clone(),
            self.transfers.clone(),
            self.dev.clone(),
        );
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let key = dev.path.display().to_string();
            let mut readers = t.readers.lock().await;
            let last = match readers.get_mut(&key) {
                Some((n, activated)) => {
                    *n -= 1;
                    (*n == 0).then_some(*activated)
                }
                None => None,
            };
            if let Some(activated) = last {
                readers.remove(&key);
                if activated {
                    v.deactivate_if_unused(&dev).await;
                }
            }
        });
    }
}

impl Volumes {
    /// What a copy of snapshot `id` on another node must agree with: its
    /// size, its volume's access and encryption. NOT_FOUND when it is
    /// not a snapshot of ours.
    pub async fn snapshot_facts(&self, id: &SnapshotId) -> Result<super::fill::SourceFacts> {
        let report = self.lvm.report().await?;
        let snap = self.must_own_snapshot(&report, id)?;
        Ok(super::fill::SourceFacts {
            size: snap.lv.size,
            access: snap.tags.access.clone(),
            encrypted: snap.tags.encrypted,
        })
    }

    /// Snapshot `id`'s mapped ranges from byte `start` on (with `base`, a
    /// snapshot of the same volume: the ranges where the two differ, as
    /// `id` holds them), read and hashed (see the module documentation),
    /// as a stream of [`Piece`]s; an
    /// error ends it, and a stream that ends without its summary was cut
    /// short. The ranges are listed first (the pool's metadata snapshot
    /// is released before any data is read), then read one piece at a
    /// time on a blocking thread, paced by the node's cap. The reading
    /// stops when the receiver is dropped, when it takes no piece for
    /// `command_timeout_secs` (DEADLINE_EXCEEDED), and when `stopping`
    /// turns true (UNAVAILABLE: the node plugin stops); either way the
    /// snapshot is deactivated after its last reader if a reader
    /// activated it. More than [`MAX_READS`] at once: RESOURCE_EXHAUSTED.
    pub async fn read_snapshot(
        self: &Arc<Self>,
        id: SnapshotId,
        start: u64,
        base: Option<SnapshotId>,
        transfers: Arc<Transfers>,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Result<mpsc::Receiver<Result<Piece>>> {
        let slot = transfers.slot()?;
        let ask = match base.clone() {
            None => Ask::Allocated(id.clone()),
            Some(base) => Ask::Delta {
                base,
                target: id.clone(),
            },
        };
        let listed = self.snapshot_metadata(ask, start).await?;
        let capacity = listed.capacity;
        let mut rx = listed.ranges;
        let mut ranges = Vec::new();
        loop {
            match rx.recv().await {
                Some(Ok(Item::Range(offset, length))) => ranges.push((offset, length)),
                Some(Ok(Item::End)) => break,
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(Error::Internal(format!(
                        "the mapped ranges of snapshot {id} were cut short"
                    )))
                }
            }
        }
        let report = self.lvm.report().await?;
        let chunk = self.pool(&report)?.chunk_size;
        let lv = self.must_own_snapshot(&report, &id)?.lv.clone();
        let (reading, device) = self.open_reading(&lv, &transfers, slot).await?;
        tracing::info!(snapshot = %id, base = base.as_deref(), start, capacity, ranges = ranges.len(),
            "transfer: reading a snapshot's mapped ranges (with a base: those that differ from it)");
        let (tx, out) = mpsc::channel(QUEUED);
        let d = self.clone();
        tokio::spawn(async move {
            let sending = Sending {
                tx: &tx,
                stall: d.cfg.command_timeout(),
                stopping,
            };
            let res = d
                .send_pieces(sending, &device, &ranges, capacity, chunk, &transfers.pace)
                .await;
            match res {
                Ok(true) => tracing::info!(snapshot = %id, start, "transfer: snapshot read"),
                Ok(false) => {
                    tracing::info!(snapshot = %id, start, "transfer: the reader went away")
                }
                Err(e) => {
                    tracing::warn!(snapshot = %id, start, error = %e, "transfer: reading ended");
                    let _ = tx.try_send(Err(e));
                }
            }
            drop(device);
            drop(reading);
        });
        Ok(out)
    }

    /// [`hash_device`] of snapshot `id`'s device (or volume `id`'s, see
    /// [`HashOf`]) and the bytes hashed, read here through a read-only
    /// descriptor, under the object's guard, counted as one of the node's
    /// reads (the first reader activates it, the last deactivates it).
    /// Paced by `cluster.transfer_mib_per_sec` only when a peer asked
    /// ([`HashOf::paced`]); the controller's (`Move.Verify`) is not. A
    /// caller that goes away stops it within a MiB.
    pub async fn hash_whole(
        self: &Arc<Self>,
        id: &str,
        what: HashOf,
        transfers: Arc<Transfers>,
    ) -> Result<(u64, Vec<[u8; 32]>)> {
        // Under the object's guard: no stage, delete or grow meanwhile.
        let id = id.to_string();
        self.detached(&id.clone(), "Transfer.Hash", move |d, cancel| async move {
            d.hash_held(&id, what, transfers, cancel).await
        })
        .await
    }

    async fn hash_held(
        self: &Arc<Self>,
        id: &str,
        what: HashOf,
        transfers: Arc<Transfers>,
        cancel: super::Cancel,
    ) -> Result<(u64, Vec<[u8; 32]>)> {
        let slot = transfers.slot()?;
        let report = self.lvm.report().await?;
        let lv = match what.snapshot {
            true => self.must_own_snapshot(&report, id)?.lv.clone(),
            false => self.must_own(&report, id)?.lv.clone(),
        };
        drop(report);
        let size = match what.length {
            0 => lv.size,
            l if l <= lv.size => l,
            l => {
                return Err(Error::OutOfRange(format!(
                    "{id} holds {} bytes, fewer than the {l} to hash",
                    lv.size
                )))
            }
        };
        let (reading, device) = self.open_reading(&lv, &transfers, slot).await?;
        let read: ReadAt = {
            let device = device.clone();
            Arc::new(move |at, buf| Ok(device.read_exact_at(at, buf)?))
        };
        let segment = what.segmented.then_some(SEGMENT_BYTES);
        let run = HashRun {
            bound: self.cfg.command_timeout(),
            quit: cancel.flag(),
            // Charged by the share of the device the pool maps for it.
            pace: what.paced.then(|| {
                let mapped = lv.data_percent.map_or(1.0, |p| p / 100.0);
                (&transfers.pace, mapped)
            }),
        };
        let hashes = hash_device(read, size, segment, run).await;
        // Closed before the last reader's deactivation.
        drop(device);
        drop(reading);
        let hashes = hashes?;
        let whole = (!what.segmented).then(|| blake3::Hash::from(hashes[0]).to_hex().to_string());
        tracing::info!(
            id,
            size,
            segments = what.segmented.then_some(hashes.len()),
            blake3 = whole.as_deref(),
            "transfer: hashed a whole device"
        );
        Ok((size, hashes))
    }

    /// [`Volumes::start_reading`], and `lv`'s device opened read-only: to
    /// be closed before the reader is dropped (its last reader deactivates
    /// it).
    async fn open_reading(
        self: &Arc<Self>,
        lv: &crate::lvm::report::Lv,
        transfers: &Arc<Transfers>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<(Reading, Arc<crate::sys::ReadOnlyDevice>)> {
        let reading = self.start_reading(lv, transfers, slot).await?;
        let path = reading.dev.path.clone();
        let device = self
            .tools
            .blocking("open a device to read it", move || {
                Ok(Arc::new(crate::sys::open_read_only(&path)?))
            })
            .await?;
        Ok((reading, device))
    }

    /// Counts a reader of `lv`, activating it for the first one when it
    /// is inactive. An LV gone meanwhile is NOT_FOUND.
    async fn start_reading(
        self: &Arc<Self>,
        lv: &crate::lvm::report::Lv,
        transfers: &Arc<Transfers>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Reading> {
        let mut readers = transfers.readers.lock().await;
        let activated = match self.activate(lv).await {
            Ok(a) => a,
            Err(e) => {
                let fresh = self.lvm.fresh_report().await?;
                return Err(match fresh.find(&lv.name) {
                    None => Error::NotFound(format!("{} does not exist", lv.name)),
                    Some(_) => e,
                });
            }
        };
        let (dev, activated_now) = activated;
        let entry = readers
            .entry(dev.path.display().to_string())
            .or_insert((0, false));
        entry.0 += 1;
        entry.1 |= activated_now;
        Ok(Reading {
            volumes: self.clone(),
            transfers: transfers.clone(),
            dev,
            _slot: slot,
        })
    }

    /// Sends the header, every piece of `ranges` read from `device` and
    /// hashed, and the summary; `Ok(false)` when the reader went away.
    async fn send_pieces(
        &self,
        out: Sending<'_>,
        device: &Arc<crate::sys::ReadOnlyDevice>,
        ranges: &[(u64, u64)],
        capacity: u64,
        chunk: u64,
        pace: &Pace,
    ) -> Result<bool> {
        let mut out = out;
        // A read ended before its first range resumes where that starts.
        let first = ranges.first().map_or(capacity, |r| r.0);
        if !out.send(Piece::Header { capacity, chunk }, first).await? {
            return Ok(false);
        }
        let mut digest = Digest::default();
        for (offset, length) in pieces(ranges, PIECE_BYTES) {
            out.until_stopped(pace.take(length), offset).await?;
            let device = device.clone();
            let (data, hash) = self
                .tools
                .blocking("read a snapshot range", move || {
                    let mut data = vec![0u8; length as usize];
                    device.read_exact_at(offset, &mut data)?;
                    let hash = *blake3::hash(&data).as_bytes();
                    Ok((data, hash))
                })
                .await?;
            digest.add(offset, length, &hash);
            if !out
                .send(Piece::Range { offset, data, hash }, offset)
                .await?
            {
                return Ok(false);
            }
        }
        let (ranges, bytes, digest) = digest.finish();
        out.send(
            Piece::Summary {
                ranges,
                bytes,
                digest,
            },
            capacity,
        )
        .await
    }
}

/// Where a read's pieces go, and what ends it early.
struct Sending<'a> {
    tx: &'a mpsc::Sender<Result<Piece>>,
    /// How long the reader may take no piece.
    stall: std::time::Duration,
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Sending<'_> {
    /// Sends `piece` (at byte `at`, for the error's advice); `Ok(false)`
    /// when the reader went away. A stalled reader, or the node stopping,
    /// ends the read with an error.
    async fn send(&mut self, piece: Piece, at: u64) -> Result<bool> {
        let tx = self.tx;
        let stall = self.stall;
        let sent = async move { tokio::time::timeout(stall, tx.send(Ok(piece))).await };
        match self.until_stopped(sent, at).await? {
            Ok(Ok(())) => Ok(true),
            Ok(Err(_)) => Ok(false),
            Err(_) => Err(Error::DeadlineExceeded(format!(
                "the reader took no piece for {stall:?}; the read was stopped"
            ))
            .advise(format!("read again from start {at}, and without pausing"))),
        }
    }

    /// `fut`, unless the node plugin stops first.
    async fn until_stopped<T>(
        &mut self,
        fut: impl std::future::Future<Output = T>,
        at: u64,
    ) -> Result<T> {
        tokio::select! {
            v = fut => Ok(v),
            _ = self.stopping.wait_for(|s| *s) => Err(Error::Unavailable(
                "the node plugin is stopping".into(),
            )
            .advise(format!("read again from start {at} once it is back"))),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn segments_that_differ_are_named_by_their_bytes() {
        let (a, b) = ([[1u8; 32], [2; 32], [3; 32]], [[1u8; 32], [9; 32], [3; 32]]);
        let length = 2 * SEGMENT_BYTES + 10;
        assert_eq!(segments_that_differ(&a, &a, (length, SEGMENT_BYTES)), None);
        assert_eq!(
            segments_that_differ(&a, &b, (length, SEGMENT_BYTES)).unwrap(),
            format!("{SEGMENT_BYTES}+{SEGMENT_BYTES}")
        );
        let mut c = b.to_vec();
        c[2] = [7; 32];
        assert_eq!(
            segments_that_differ(&a, &c, (length, SEGMENT_BYTES)).unwrap(),
            format!("{SEGMENT_BYTES}+{SEGMENT_BYTES}, {}+10", 2 * SEGMENT_BYTES)
        );
        assert_eq!(
            segments_that_differ(&a, &a[..2], (length, SEGMENT_BYTES)).unwrap(),
            format!("0+{length}"),
            "lists of different lengths differ everywhere"
        );
    }
    use super::*;

    #[test]
    fn long_runs_are_cut_into_pieces_and_short_ones_kept() {
        assert_eq!(
            pieces(&[(0, 100), (1000, 250), (5000, 64)], 100).collect::<Vec<_>>(),
            vec![(0, 100), (1000, 100), (1100, 100), (1200, 50), (5000, 64)]
        );
        assert_eq!(pieces(&[], 100).count(), 0);
    }

    /// On tokio's paused clock: 10 pieces of 1 MiB at 5 MiB/s take 1.8 s
    /// (the first goes at once, each next 0.2 s later), two transfers
    /// share the rate, and no cap waits for nothing.
    #[tokio::test(start_paused = true)]
    async fn the_cap_paces_every_transfer_of_the_node_together() {
        let mib = 1024 * 1024;
        let pace = Pace::new(5);
        let t = tokio::time::Instant::now();
        for _ in 0..10 {
            pace.take(mib).await;
        }
        assert_eq!(t.elapsed(), std::time::Duration::from_millis(1800));

        let pace = Arc::new(Pace::new(5));
        let t = tokio::time::Instant::now();
        let one = |p: Arc<Pace>| async move {
            for _ in 0..5 {
                p.take(mib).await;
            }
        };
        tokio::join!(one(pace.clone()), one(pace.clone()));
        assert_eq!(t.elapsed(), std::time::Duration::from_millis(1800));

        let none = Pace::new(0);
        let t = tokio::time::Instant::now();
        for _ in 0..10 {
            none.take(mib).await;
        }
        assert_eq!(t.elapsed(), std::time::Duration::ZERO);
    }

    #[test]
    fn a_grant_names_one_snapshot_and_expires() {
        let t = Transfers::new(0);
        let (token, ttl) = t.grant("snap-a", None, std::time::Duration::ZERO).unwrap();
        assert_eq!(ttl, GRANT_TTL);
        assert_eq!(token.len(), 64);
        assert!(t.granted(&token, "snap-a", None));
        assert!(!t.granted(&token, "snap-b", None), "another snapshot");
        assert!(!t.granted("00", "snap-a", None), "no such token");
        assert!(
            !t.granted(&token, "snap-a", Some("snap-0")),
            "no base granted"
        );
        // A retry is served the live grant.
        let (again, _) = t.grant("snap-a", None, std::time::Duration::ZERO).unwrap();
        assert_eq!(again, token);
        let (other, _) = t.grant("snap-b", None, std::time::Duration::ZERO).unwrap();
        assert_ne!(other, token, "random");
        let (short, _) = t
            .grant("snap-c", None, std::time::Duration::from_nanos(1))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(!t.granted(&short, "snap-c", None), "expired");
        let (_, long) = t.grant("snap-d", None, 2 * GRANT_MAX_TTL).unwrap();
        assert_eq!(long, GRANT_MAX_TTL);
        // A move's grant names its base: that base, or none, and no other.
        let (moved, _) = t
            .grant("snap-e", Some("snap-0"), std::time::Duration::ZERO)
            .unwrap();
        assert!(t.granted(&moved, "snap-e", Some("snap-0")));
        assert!(
            t.granted(&moved, "snap-e", None),
            "whole, when the copy holds no base"
        );
        assert!(!t.granted(&moved, "snap-e", Some("snap-x")), "another base");
        let (plain, _) = t.grant("snap-e", None, std::time::Duration::ZERO).unwrap();
        assert_ne!(plain, moved, "a grant without the base is another");
    }

    #[test]
    fn grants_are_bounded() {
        let t = Transfers::new(0);
        for i in 0..MAX_GRANTS {
            t.grant(&format!("snap-{i}"), None, std::time::Duration::ZERO)
                .unwrap();
        }
        let e = t
            .grant("snap-more", None, std::time::Duration::ZERO)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn the_digest_covers_offsets_lengths_and_hashes_in_order() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let mut one = Digest::default();
        one.add(0, 10, &a);
        one.add(10, 20, &b);
        let (ranges, bytes, d1) = one.finish();
        assert_eq!((ranges, bytes), (2, 30));
        let mut swapped = Digest::default();
        swapped.add(10, 20, &b);
        swapped.add(0, 10, &a);
        assert_ne!(swapped.finish().2, d1, "order counts");
        let mut moved = Digest::default();
        moved.add(0, 10, &a);
        moved.add(11, 20, &b);
        assert_ne!(moved.finish().2, d1, "offsets count");
    }
}
