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

/// `(offset, length)` ranges cut into pieces of at most `max` bytes.
pub fn pieces(ranges: &[(u64, u64)], max: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(offset, length) in ranges {
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let n = (end - at).min(max.max(1));
            out.push((at, n));
            at += n;
        }
    }
    out
}

impl Volumes {
    /// Snapshot `id`'s mapped ranges from byte `start` on, read and hashed
    /// (see the module documentation), as a stream of [`Piece`]s; an
    /// error ends it, and a stream that ends without its summary was cut
    /// short. The ranges are listed first (the pool's metadata snapshot
    /// is released before any data is read), then read one piece at a
    /// time on a blocking thread; the reading stops when the receiver is
    /// dropped, and a snapshot this call activated is deactivated again
    /// when nothing else uses it.
    pub async fn read_snapshot(
        self: &Arc<Self>,
        id: SnapshotId,
        start: u64,
        pace: Arc<Pace>,
    ) -> Result<mpsc::Receiver<Result<Piece>>> {
        let listed = self
            .snapshot_metadata(Ask::Allocated(id.clone()), start)
            .await?;
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
        let (dev, activated) = self.activate(&lv).await?;
        let path = dev.path.clone();
        let device = self
            .tools
            .blocking("open a snapshot to read it", move || {
                Ok(Arc::new(crate::sys::open_read_only(&path)?))
            })
            .await;
        let device = match device {
            Ok(d) => d,
            Err(e) => {
                if activated {
                    self.deactivate_if_unused(&dev).await;
                }
                return Err(e);
            }
        };
        tracing::info!(snapshot = %id, start, capacity, ranges = ranges.len(),
            "transfer: reading a snapshot's mapped ranges");
        let (tx, out) = mpsc::channel(QUEUED);
        let d = self.clone();
        tokio::spawn(async move {
            let res = d
                .send_pieces(&tx, &device, &ranges, capacity, chunk, &pace)
                .await;
            drop(device);
            match res {
                Ok(true) => tracing::info!(snapshot = %id, start, "transfer: snapshot read"),
                Ok(false) => {
                    tracing::info!(snapshot = %id, start, "transfer: the reader went away")
                }
                Err(e) => {
                    tracing::warn!(snapshot = %id, start, error = %e, "transfer: reading failed");
                    let _ = tx.send(Err(e)).await;
                }
            }
            if activated {
                d.deactivate_if_unused(&dev).await;
            }
        });
        Ok(out)
    }

    /// Sends the header, every piece of `ranges` read from `device` and
    /// hashed, and the summary; `Ok(false)` when the receiver went away.
    async fn send_pieces(
        &self,
        tx: &mpsc::Sender<Result<Piece>>,
        device: &Arc<crate::sys::ReadOnlyDevice>,
        ranges: &[(u64, u64)],
        capacity: u64,
        chunk: u64,
        pace: &Pace,
    ) -> Result<bool> {
        if tx
            .send(Ok(Piece::Header { capacity, chunk }))
            .await
            .is_err()
        {
            return Ok(false);
        }
        let mut digest = Digest::default();
        for (offset, length) in pieces(ranges, PIECE_BYTES) {
            pace.take(length).await;
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
            if tx
                .send(Ok(Piece::Range { offset, data, hash }))
                .await
                .is_err()
            {
                return Ok(false);
            }
        }
        let (ranges, bytes, digest) = digest.finish();
        Ok(tx
            .send(Ok(Piece::Summary {
                ranges,
                bytes,
                digest,
            }))
            .await
            .is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_are_cut_into_pieces_and_short_ones_kept() {
        assert_eq!(
            pieces(&[(0, 100), (1000, 250), (5000, 64)], 100),
            vec![(0, 100), (1000, 100), (1100, 100), (1200, 50), (5000, 64)]
        );
        assert!(pieces(&[], 100).is_empty());
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
