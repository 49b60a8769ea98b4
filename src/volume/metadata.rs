//! SnapshotMetadata: the byte ranges a snapshot has allocated, or that
//! changed between two snapshots of one volume, computed from the thin
//! pool's metadata (`lvm::thin`), never by reading volume data. Ranges go
//! out as they are parsed, in ascending order, clipped to the request's
//! starting offset and to the volume's capacity.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::SnapshotId;
use crate::error::{Error, Result};
use crate::lvm::thin::Query;
use crate::volume::Volumes;

/// What a SnapshotMetadata call asks about.
#[derive(Debug, Clone)]
pub enum Ask {
    Allocated(SnapshotId),
    Delta {
        base: SnapshotId,
        target: SnapshotId,
    },
}

/// The answer, streamed: the volume's capacity, and `(offset, length)`
/// ranges as they are read, then [`Item::End`] when every range was sent;
/// an error ends the stream. A channel that closes without `End` or an
/// error was cut short (its reader panicked): its ranges are not the
/// whole answer.
pub struct Ranges {
    pub capacity: u64,
    pub ranges: mpsc::Receiver<Result<Item>>,
}

/// One item of [`Ranges`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// `(offset, length)` in bytes.
    Range(u64, u64),
    /// Every range was sent.
    End,
}

/// How many ranges wait between the reader and a slow client.
const QUEUED: usize = 256;

/// `(offset, length)` cut to `[start, capacity)`; `None` when nothing is
/// left of it.
pub fn clip(offset: u64, length: u64, start: u64, capacity: u64) -> Option<(u64, u64)> {
    let begin = offset.max(start);
    let end = offset.saturating_add(length).min(capacity);
    (end > begin).then(|| (begin, end - begin))
}

impl Volumes {
    /// GetMetadataAllocated / GetMetadataDelta; see the module
    /// documentation. The reading runs as a task that stops when the
    /// receiver is dropped (the client went away) and releases the pool's
    /// metadata snapshot on every path.
    pub async fn snapshot_metadata(self: &Arc<Self>, ask: Ask, start: u64) -> Result<Ranges> {
        // Snapshots never change once made, and our own creates and
        // deletes drop the cached report: it is current enough.
        let report = self.lvm.report().await?;
        let thin_id = |lv: &crate::lvm::report::Lv| {
            lv.thin_id.ok_or_else(|| {
                Error::Internal(format!("LVM reports no thin device id for {}", lv.name))
            })
        };
        let (query, capacity) = match &ask {
            Ask::Allocated(id) => {
                let s = self.must_own_snapshot(&report, id)?;
                (
                    Query::Mapped {
                        dev: thin_id(s.lv)?,
                    },
                    s.lv.size,
                )
            }
            Ask::Delta { base, target } => {
                let (b, t) = (
                    self.must_own_snapshot(&report, base)?,
                    self.must_own_snapshot(&report, target)?,
                );
                if b.tags.source != t.tags.source {
                    return Err(Error::InvalidArgument(format!(
                        "snapshots {base} and {target} are of different volumes ({} and {})",
                        b.tags.source, t.tags.source
                    )));
                }
                let q = Query::Delta {
                    base: thin_id(b.lv)?,
                    target: thin_id(t.lv)?,
                };
                (q, t.lv.size)
            }
        };
        if start > capacity {
            return Err(Error::OutOfRange(format!(
                "starting_offset {start} is beyond the volume's {capacity} bytes"
            )));
        }
        // Asked of a fresh view: the cache does not follow the pool down
        // when LVM deactivates it with its last thin LV.
        if !self.pool(&*self.lvm.fresh_report().await?)?.is_active() {
            // Volumes are created inactive and deactivated at unstage, so
            // the pool goes down with its last active thin LV; backing up
            // a volume nobody uses must still work.
            let _alloc = self.alloc.lock().await;
            let fresh = self.lvm.fresh_report().await?;
            if !self.pool(&fresh)?.is_active() {
                self.lvm.activate(&self.lvm.pool).await?;
                tracing::info!(
                    pool = self.lvm.lv_path(&self.lvm.pool),
                    "SnapshotMetadata: activated the thin pool to read its metadata"
                );
            }
        }
        let (tx, rx) = mpsc::channel(QUEUED);
        let d = self.clone();
        // A client that stays connected but stops reading must not hold
        // the pool's metadata snapshot (and every other metadata call)
        // for ever: past this bound without taking a range, it is dropped.
        let stall = self.cfg.command_timeout();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            let out = tx.clone();
            let stalled_in = stalled.clone();
            let res = d
                .lvm
                .read_metadata(query, move |offset, length| {
                    let (out, stalled) = (out.clone(), stalled_in.clone());
                    async move {
                        let Some(r) = clip(offset, length, start, capacity) else {
                            return true;
                        };
                        match tokio::time::timeout(stall, out.send(Ok(Item::Range(r.0, r.1)))).await
                        {
                            Ok(sent) => sent.is_ok(),
                            Err(_) => {
                                tracing::warn!(
                                    ?stall,
                                    "SnapshotMetadata: the client took no range in time; stopping"
                                );
                                stalled.store(true, std::sync::atomic::Ordering::SeqCst);
                                false
                            }
                        }
                    }
                })
                .await;
            // A stream cut short because the client stalled must not end
            // as if it were whole: the metadata snapshot is released by
            // now, so waiting here to say so holds nothing.
            let res = res.and_then(|()| {
                if stalled.load(std::sync::atomic::Ordering::SeqCst) {
                    Err(Error::DeadlineExceeded(format!(
                        "the client took no range for {stall:?}; the stream was stopped"
                    ))
                    .advise("call again with starting_offset after the last range received, and read the stream without pausing"))
                } else {
                    Ok(())
                }
            });
            // The last word is bounded as every range was: a client that
            // stopped reading gets no OK (the stream ends with INTERNAL).
            let last = match res {
                Ok(()) => {
                    tracing::info!(?ask, start, "SnapshotMetadata: done");
                    Ok(Item::End)
                }
                Err(e) => {
                    tracing::warn!(?ask, start, error = %e, "SnapshotMetadata: failed");
                    Err(e)
                }
            };
            let _ = tokio::time::timeout(stall, tx.send(last)).await;
        });
        Ok(Ranges {
            capacity,
            ranges: rx,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_clipped_to_the_start_and_the_capacity() {
        assert_eq!(clip(0, 100, 0, 1000), Some((0, 100)));
        assert_eq!(clip(0, 100, 100, 1000), None, "ends at the start");
        assert_eq!(clip(0, 100, 40, 1000), Some((40, 60)));
        assert_eq!(clip(900, 200, 0, 1000), Some((900, 100)));
        assert_eq!(clip(1000, 64, 0, 1000), None);
        assert_eq!(clip(u64::MAX - 1, 64, 0, u64::MAX), Some((u64::MAX - 1, 1)));
    }
}
