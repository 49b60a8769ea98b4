//! The thin-pool autopilot of one device class (`[autopilot]` in its
//! config): it grows the pool before a writer sees ENOSPC.
//!
//! It watches the pool without LVM: device-mapper's status of the
//! thin-pool target (`pool::status`), read every `poll_secs` and at once
//! when the device's event counter moves (a thread waits in DM_DEV_WAIT,
//! as dmeventd does; the kernel raises the counter when the pool passes a
//! low water mark, runs out of space or changes mode). So an idle node
//! runs no LVM command. When data or metadata use passes its threshold it
//! grows that store by `step_percent` of its size, at least an extent,
//! from the VG's free space, growing a loop-backed VG's file, loop device
//! and PV first where the VG has too little (`pool::grow`), within the
//! limits. When it cannot, it says why once (log, metric, the volumes'
//! conditions, `tpcsi capacity`) and tries again a minute later; the
//! metadata accounting's refusal of new LVs (`lvm::room`) is what happens
//! meanwhile. GetCapacity counts what it may still add.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::lvm::report::{round_up, Lv};
use crate::pool::{grow, status};
use crate::volume::Volumes;

/// How long a pool that could not grow waits before the autopilot asks
/// LVM again, at first (a blocked pool above its threshold would otherwise
/// cost an LVM command at every poll); each further refusal doubles it, up
/// to [`BLOCKED_RETRY_MAX`]. A device-mapper event (the pool or its VG
/// changed) asks again at once.
const BLOCKED_RETRY: Duration = Duration::from_secs(60);
const BLOCKED_RETRY_MAX: Duration = Duration::from_secs(16 * 60);

/// What the autopilot did and why it last could not.
#[derive(Default)]
pub struct AutopilotState {
    /// Per store, why the pool could not grow when it last had to; cleared
    /// once that store grew or fell below its threshold.
    blocked: Mutex<std::collections::BTreeMap<&'static str, String>>,
    pub data_growths: AtomicU64,
    pub metadata_growths: AtomicU64,
    pub backing_growths: AtomicU64,
    pub refusals: AtomicU64,
}

impl AutopilotState {
    pub fn blocked(&self) -> Option<String> {
        let b = self.blocked.lock().unwrap();
        (!b.is_empty()).then(|| b.values().cloned().collect::<Vec<_>>().join("; "))
    }
}

/// When a store that could not grow is tried again.
#[derive(Default)]
struct Hold {
    until: Option<Instant>,
    wait: Option<Duration>,
}

impl Hold {
    fn refused(&mut self) {
        let wait = self
            .wait
            .map_or(BLOCKED_RETRY, |w| (w * 2).min(BLOCKED_RETRY_MAX));
        self.wait = Some(wait);
        self.until = Some(Instant::now() + wait);
    }

    fn holds(&self) -> bool {
        self.until.is_some_and(|t| Instant::now() < t)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Data,
    Metadata,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Data => "data",
            Store::Metadata => "metadata",
        }
    }
}

impl Volumes {
    /// Makes the pool fail writes when full, or queue them, as
    /// `error_when_full` says (unset: left as it is): one `lvchange` when
    /// device-mapper shows the pool doing otherwise, none when it does not.
    pub async fn apply_when_full(&self) -> Result<()> {
        let Some(want) = self.cfg.error_when_full else {
            return Ok(());
        };
        let Some((_, st)) = self.pool_status().await? else {
            return Ok(());
        };
        if st.error_if_no_space != want {
            grow::set_error_when_full(&self.lvm, want).await?;
            tracing::info!(
                class = self.class_name(),
                pool = self.lvm.lv_path(&self.lvm.pool),
                error_when_full = want,
                "set what the thin pool does when full"
            );
        }
        Ok(())
    }

    async fn pool_status(&self) -> Result<Option<(String, status::PoolStatus)>> {
        let (vg, pool) = (self.lvm.vg.clone(), self.lvm.pool.clone());
        self.tools
            .blocking("read the thin pool's status", move || {
                status::read(&vg, &pool)
            })
            .await
    }

    /// Runs the autopilot for the life of the driver (returns at once when
    /// it is off).
    pub async fn run_autopilot(self: Arc<Self>) {
        let a = self.cfg.autopilot.clone();
        if !a.enabled {
            return;
        }
        let poll = Duration::from_secs(a.poll_secs);
        let wake = Arc::new(tokio::sync::Notify::new());
        wait_for_events(
            self.lvm.vg.clone(),
            self.lvm.pool.clone(),
            wake.clone(),
            poll,
        );
        tracing::info!(
            class = self.class_name(),
            pool = self.lvm.lv_path(&self.lvm.pool),
            data_threshold = a.data_threshold_percent,
            metadata_threshold = a.metadata_threshold_percent,
            step_percent = a.step_percent,
            "autopilot: watching the thin pool"
        );
        let mut holds = [Hold::default(), Hold::default()];
        let mut unreadable = None;
        loop {
            match self.autopilot_pass(&mut holds).await {
                Ok(()) => unreadable = None,
                // Said once per kind of failure, not at every poll.
                Err(e) if unreadable.as_ref() != Some(&e.message()) => {
                    tracing::warn!(class = self.class_name(), error = %e.message(), "autopilot: cannot read the thin pool");
                    unreadable = Some(e.message());
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = wake.notified() => {
                    // The pool or its VG changed: a refusal may not hold.
                    for h in &mut holds {
                        h.until = None;
                    }
                }
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// One look at the pool: grows each store past its threshold, unless
    /// that store's last attempt was refused and its hold has not passed.
    async fn autopilot_pass(&self, holds: &mut [Hold; 2]) -> Result<()> {
        let Some((_, st)) = self.pool_status().await? else {
            return Ok(());
        };
        // A failed or read-only pool needs a repair, not more room: its
        // condition says so already (`lvm::report::Problem`).
        if st.mode != "rw" && st.mode != "out_of_data_space" {
            return Ok(());
        }
        let a = &self.cfg.autopilot;
        for (i, store) in [Store::Data, Store::Metadata].into_iter().enumerate() {
            let (used, threshold) = match store {
                Store::Data => (st.data_percent(), a.data_threshold_percent),
                Store::Metadata => (st.metadata_percent(), a.metadata_threshold_percent),
            };
            let hold = &mut holds[i];
            if used < f64::from(threshold) {
                if self
                    .autopilot
                    .blocked
                    .lock()
                    .unwrap()
                    .remove(store.name())
                    .is_some()
                {
                    tracing::info!(
                        class = self.class_name(),
                        store = store.name(),
                        "autopilot: the thin pool is below its threshold again"
                    );
                }
                *hold = Hold::default();
                continue;
            }
            if hold.holds() {
                continue;
            }
            match self.grow_store(store).await {
                Ok(()) => {
                    *hold = Hold::default();
                    self.autopilot.blocked.lock().unwrap().remove(store.name());
                }
                Err(why) => {
                    self.autopilot.refusals.fetch_add(1, Ordering::Relaxed);
                    hold.refused();
                    let msg = format!(
                        "thin pool {} {} is {used:.1}% used and the autopilot cannot grow it: {why}",
                        self.lvm.lv_path(&self.lvm.pool),
                        store.name()
                    );
                    // Once per hold (a minute, then longer), not per poll.
                    tracing::warn!(class = self.class_name(), "autopilot: {msg}");
                    self.autopilot
                        .blocked
                        .lock()
                        .unwrap()
                        .insert(store.name(), msg);
                }
            }
        }
        Ok(())
    }

    /// Grows `store` by one step; `Err` says why it cannot.
    async fn grow_store(&self, store: Store) -> std::result::Result<(), String> {
        let report = self.lvm.fresh_report().await.map_err(|e| e.message())?;
        let pool = self.pool(&report).map_err(|e| e.message())?;
        let a = &self.cfg.autopilot;
        let extent = pool.vg_extent_size.max(1);
        let (size, limit, limit_key) = match store {
            Store::Data => (pool.size, a.data_limit, "autopilot.data_limit"),
            Store::Metadata => (
                pool.metadata_size,
                a.metadata_limit,
                "autopilot.metadata_limit",
            ),
        };
        let mut step = round_up(size * u64::from(a.step_percent) / 100, extent)
            .unwrap_or(extent)
            .max(extent);
        if limit > 0 {
            step = step.min(limit.saturating_sub(size) / extent * extent);
            if step == 0 {
                return Err(format!(
                    "its {} is at {limit_key} ({limit} bytes)",
                    store.name()
                ));
            }
        }
        // LVM grows its spare metadata LV with the pool's metadata.
        let copies = if store == Store::Metadata { 2 } else { 1 };
        let mut free = pool.vg_free;
        if free < step * copies {
            free = self
                .grow_backing(step * copies - free, extent)
                .await
                .map_err(|e| e.message())?
                .unwrap_or(free);
        }
        let step = step.min(free / copies / extent * extent);
        if step == 0 {
            return Err(format!(
                "volume group {} has no free extent{}",
                self.lvm.vg,
                self.backing_note()
            ));
        }
        let done = match store {
            Store::Data => grow::grow_data(&self.lvm, size + step).await,
            Store::Metadata => grow::grow_metadata(&self.lvm, size + step).await,
        };
        done.map_err(|e| e.message())?;
        let counter = match store {
            Store::Data => &self.autopilot.data_growths,
            Store::Metadata => &self.autopilot.metadata_growths,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            class = self.class_name(),
            pool = self.lvm.lv_path(&self.lvm.pool),
            store = store.name(),
            from = size,
            by = step,
            "autopilot: grew the thin pool"
        );
        Ok(())
    }

    /// Grows a loop-backed VG's file by at least `need` bytes (whole
    /// extents), within `backing_file_limit` and the host's free space;
    /// the VG's free bytes after it, or `None` when nothing could grow.
    async fn grow_backing(&self, need: u64, extent: u64) -> Result<Option<u64>> {
        let a = &self.cfg.autopilot;
        let Some(lp) = self
            .cfg
            .loop_pool
            .as_ref()
            .filter(|_| a.backing_file_limit > 0)
        else {
            return Ok(None);
        };
        // A growth of the file whose later steps did not run is finished
        // first: the VG may have the room already.
        if grow::finish_backing(&self.lvm, &lp.backing_file).await? {
            tracing::info!(class = self.class_name(), file = %lp.backing_file.display(),
                "autopilot: finished an earlier growth of the backing file");
            let report = self.lvm.fresh_report().await?;
            let free = self.pool(&report)?.vg_free;
            if free >= need {
                return Ok(Some(free));
            }
        }
        let (file, reserve) = (lp.backing_file.clone(), a.host_reserve);
        let (host, size) = self
            .tools
            .blocking("measure the backing file's room", move || {
                grow::backing_room(&file, reserve)
            })
            .await?;
        let want = round_up(need, extent).unwrap_or(need);
        let add = want
            .min(a.backing_file_limit.saturating_sub(size))
            .min(host / extent * extent);
        if add < extent {
            return Ok(None);
        }
        grow::grow_backing(&self.lvm, &lp.backing_file, size + add).await?;
        self.autopilot
            .backing_growths
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(class = self.class_name(), file = %lp.backing_file.display(), from = size,
            by = add, "autopilot: grew the loop-backed volume group");
        let report = self.lvm.fresh_report().await?;
        Ok(Some(self.pool(&report)?.vg_free))
    }

    /// Why a loop-backed VG's file did not grow, for a refusal.
    fn backing_note(&self) -> String {
        let a = &self.cfg.autopilot;
        match &self.cfg.loop_pool {
            None => String::new(),
            Some(_) if a.backing_file_limit == 0 => {
                " (its backing file does not grow: autopilot.backing_file_limit is 0)".into()
            }
            Some(lp) => format!(
                " and its backing file {} is at autopilot.backing_file_limit or its filesystem keeps autopilot.host_reserve free",
                lp.backing_file.display()
            ),
        }
    }

    /// Bytes the autopilot may still add to the pool's data: the VG's free
    /// space and what the backing file may still grow by, within
    /// `data_limit`; 0 when it is off.
    pub fn autopilot_room(&self, pool: &Lv) -> u64 {
        let a = &self.cfg.autopilot;
        if !a.enabled {
            return 0;
        }
        let mut room = pool.vg_free;
        if let Some(lp) = self
            .cfg
            .loop_pool
            .as_ref()
            .filter(|_| a.backing_file_limit > 0)
        {
            // A syscall or two (stat, statvfs): cheap enough for GetCapacity.
            if let Ok((host, size)) = grow::backing_room(&lp.backing_file, a.host_reserve) {
                room += a.backing_file_limit.saturating_sub(size).min(host);
            }
        }
        if a.data_limit > 0 {
            room = room.min(a.data_limit.saturating_sub(pool.size));
        }
        room
    }

    /// The autopilot's figures for a scrape; `None` when it is off.
    pub fn autopilot_figures(&self) -> Option<crate::metrics::AutopilotFigures> {
        if !self.cfg.autopilot.enabled {
            return None;
        }
        let s = &self.autopilot;
        Some(crate::metrics::AutopilotFigures {
            data_growths: s.data_growths.load(Ordering::Relaxed),
            metadata_growths: s.metadata_growths.load(Ordering::Relaxed),
            backing_growths: s.backing_growths.load(Ordering::Relaxed),
            refusals: s.refusals.load(Ordering::Relaxed),
            blocked: s.blocked().is_some(),
        })
    }
}

/// A thread that waits in DM_DEV_WAIT on the pool's thin-pool device and
/// wakes the autopilot each time its event counter moves. That device is
/// `<vg>-<pool>-tpool`, which exists while thin volumes of the pool are
/// active; while it does not (no volume active, so nothing writes), the
/// thread looks again every `poll`.
fn wait_for_events(vg: String, pool: String, wake: Arc<tokio::sync::Notify>, poll: Duration) {
    let dev = format!("{}-tpool", crate::lvm::lv_dm_name(&vg, &pool));
    let spawned = std::thread::Builder::new()
        .name("autopilot-events".into())
        .spawn(move || loop {
            let waited = crate::sys::dm_event_nr(&dev).and_then(|nr| match nr {
                Some(nr) => crate::sys::dm_wait_event(&dev, nr),
                None => Ok(false),
            });
            match waited {
                Ok(true) => wake.notify_one(),
                Ok(false) => std::thread::sleep(poll),
                Err(e) => {
                    tracing::debug!(error = %e, "autopilot: cannot wait for the pool's events");
                    std::thread::sleep(poll);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "autopilot: no event thread; reading the pool every poll_secs only");
    }
}
