//! The thin-pool autopilot of one device class (`[autopilot]` in its
//! config): it grows the pool before a writer sees ENOSPC.
//!
//! It watches the pool without LVM: device-mapper's status of the
//! thin-pool target (`pool::status`), read every `poll_secs` and at once
//! when the device's event counter moves (a thread waits in DM_DEV_WAIT,
//! as dmeventd does; the kernel raises the counter when the pool passes a
//! low water mark, runs out of space or changes mode; LVM's table sets
//! no low water mark unless `thin_pool_autoextend_threshold` is below 100,
//! and that setting also makes `lvcreate` refuse thin volumes above it, so
//! the driver leaves it: the events it gets are the pool filling up and
//! its table changing). So an idle node runs no LVM command.
//!
//! Each read also measures how fast each store filled since the previous
//! one. A store grows when its use passes its threshold, or earlier when,
//! at that rate, it would fill before a growth started at the next read
//! could land ([`plan`]). The growth is `step_percent` of its size, or
//! more when the rate needs it: enough that the writer stays below the
//! threshold while this growth runs, and that room for another poll and
//! growth is left beyond it, timed by the last growth's own duration. It
//! comes from the VG's free space, growing a loop-backed VG's file, loop
//! device and PV first where the VG has too little (`pool::grow`), within
//! the limits; a rate-sized step the VG cannot give whole takes what the
//! VG has first when that covers `step_percent` (one `lvextend`, for the
//! writer is waiting). After a rate-sized growth the file grows at once
//! by what another growth as large would need, so the next one is one
//! `lvextend` too; its time is not the growth's (the writer had its room
//! already). Then the pool is read again at once. When it cannot, it says
//! why once (log, metric, the volumes' conditions, `tpcsi capacity`) and
//! tries again a minute later; the
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

/// How long a growth is taken to last before one was timed (an `lvs` and
/// an `lvextend`, more with the backing file: about 0.5 s on hardware,
/// seconds under emulation).
const FIRST_GROWTH: Duration = Duration::from_secs(2);
/// The least a growth is taken to last, however fast the last one was.
const MIN_GROWTH: Duration = Duration::from_millis(500);
/// Reads closer together than this do not measure a rate: the earlier
/// one's rate stands (an event just after a poll).
const MIN_RATE_WINDOW: Duration = Duration::from_millis(200);
/// How much the rate's needs are padded: writers speed up, growths slow
/// down when the host is busy.
const RATE_MARGIN: f64 = 1.5;

/// A rate-sized growth is at most this many `step_percent` steps: a rate
/// read from two status reads can be a burst (a writeback flush, queued
/// writes let go after a growth), and a pool never shrinks, so one misread
/// may not take the whole VG. 16 steps of the default 20 % is 3.2 times
/// the pool; the rate is read again after the growth.
const RATE_STEP_CAP: u64 = 16;

/// What the autopilot knows of one store's filling, in any one unit
/// (pool blocks): its size, its use, and how fast it filled since the
/// previous read (units a second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fill {
    pub size: u64,
    pub used: u64,
    pub rate: f64,
}

/// The settings and timings a growth is planned with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub threshold_percent: u8,
    pub step_percent: u8,
    /// How long until the next read when no event comes (`poll_secs`).
    pub poll: Duration,
    /// How long a growth takes ([`growth_estimate`]).
    pub growth: Duration,
}

/// Why a growth has the size it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SizedBy {
    /// `step_percent` of the size covers the writer.
    Step,
    /// The fill rate needs more than `step_percent`.
    Rate,
}

impl SizedBy {
    fn name(self) -> &'static str {
        match self {
            SizedBy::Step => "step_percent",
            SizedBy::Rate => "fill rate",
        }
    }
}

/// Whether a store should grow now, and by how many units (before whole
/// extents, the limits and the VG's room), and why that many.
///
/// It is due when its use has reached the threshold, or when at its rate
/// it would fill before a growth started at the next read lands (the
/// writer's `runway`: rate × (poll + growth), with a margin). The growth
/// is the larger of `step_percent` of the size and what the rate needs:
/// what the writer adds while this growth runs (`landed`), then a runway
/// more, and that `landed` stays below the threshold. At least one unit.
pub(crate) fn plan(f: Fill, p: &Policy) -> Option<(u64, SizedBy)> {
    let rate = if f.rate.is_finite() {
        f.rate.max(0.0)
    } else {
        0.0
    };
    let threshold = f64::from(p.threshold_percent.clamp(1, 100)) / 100.0;
    let (size, used) = (f.size as f64, f.used as f64);
    let runway = rate * (p.poll + p.growth).as_secs_f64() * RATE_MARGIN;
    let over = used >= size * threshold;
    if !over && used + runway < size {
        return None;
    }
    let fixed = (f.size.saturating_mul(u64::from(p.step_percent)) / 100).max(1);
    let landed = used + rate * p.growth.as_secs_f64() * RATE_MARGIN;
    let target = (landed + runway).max(landed / threshold);
    let by_rate = (target - size).max(0.0).ceil();
    let cap = fixed.saturating_mul(RATE_STEP_CAP);
    // A rate beyond u64 is no rate to size by.
    if by_rate > fixed as f64 && by_rate < u64::MAX as f64 {
        Some(((by_rate as u64).min(cap), SizedBy::Rate))
    } else {
        Some((fixed, SizedBy::Step))
    }
}

/// How long the next growth is taken to last: the last growth's own
/// duration, at least [`MIN_GROWTH`]; [`FIRST_GROWTH`] before one.
pub(crate) fn growth_estimate(last: Option<Duration>) -> Duration {
    last.map_or(FIRST_GROWTH, |d| d.max(MIN_GROWTH))
}

/// The fill rate (units a second) from the previous read's use to this
/// one's, `elapsed` apart; `None` when they are too close to say
/// ([`MIN_RATE_WINDOW`]: the earlier rate stands). Use that fell
/// (discards) is no filling. While the pool `blocked` writes (out of data
/// space) its use cannot rise, so the earlier rate stands if higher.
pub(crate) fn fill_rate(
    before: u64,
    now: u64,
    elapsed: Duration,
    earlier: f64,
    blocked: bool,
) -> Option<f64> {
    if elapsed < MIN_RATE_WINDOW {
        return None;
    }
    let rate = now.saturating_sub(before) as f64 / elapsed.as_secs_f64();
    Some(if blocked { rate.max(earlier) } else { rate })
}

/// One store's filling as the autopilot last read it.
#[derive(Default)]
struct Watch {
    /// The last read that measured a rate: when, and the use then.
    last: Option<(Instant, u64)>,
    rate: f64,
    /// The last growth's duration.
    growth: Option<Duration>,
}

impl Watch {
    /// Takes a read of `used` units at `now`; the rate it measures.
    fn read(&mut self, now: Instant, used: u64, blocked: bool) -> f64 {
        match self.last {
            None => self.last = Some((now, used)),
            Some((t, before)) => {
                if let Some(r) = fill_rate(before, used, now - t, self.rate, blocked) {
                    self.rate = r;
                    self.last = Some((now, used));
                }
            }
        }
        self.rate
    }
}

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

/// A growth as [`plan`] sized it: `units` of the store's `total` (the
/// status's units), why, and the rate (units a second) and growth
/// duration it was sized for.
#[derive(Debug, Clone, Copy)]
struct Sizing {
    units: u64,
    total: u64,
    sized_by: SizedBy,
    rate: f64,
    growth: Duration,
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
        let mut watches = [Watch::default(), Watch::default()];
        let mut unreadable = None;
        loop {
            match self.autopilot_pass(&mut holds, &mut watches).await {
                // A store grew: read again at once, so a fast writer's next
                // need is seen without waiting for a poll.
                Ok(true) => {
                    unreadable = None;
                    continue;
                }
                Ok(false) => unreadable = None,
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

    /// One look at the pool: grows each store [`plan`] says is due,
    /// unless that store's last attempt was refused and its hold has not
    /// passed. `true` when a store grew.
    async fn autopilot_pass(
        &self,
        holds: &mut [Hold; 2],
        watches: &mut [Watch; 2],
    ) -> Result<bool> {
        let Some((_, st)) = self.pool_status().await? else {
            return Ok(false);
        };
        let now = Instant::now();
        // A failed or read-only pool needs a repair, not more room: its
        // condition says so already (`lvm::report::Problem`).
        if st.mode != "rw" && st.mode != "out_of_data_space" {
            return Ok(false);
        }
        let blocked = st.mode == "out_of_data_space";
        let a = &self.cfg.autopilot;
        let mut grew = false;
        for (i, store) in [Store::Data, Store::Metadata].into_iter().enumerate() {
            let (used_pct, threshold, used, total) = match store {
                Store::Data => (
                    st.data_percent(),
                    a.data_threshold_percent,
                    st.data_used,
                    st.data_total,
                ),
                Store::Metadata => (
                    st.metadata_percent(),
                    a.metadata_threshold_percent,
                    st.metadata_used,
                    st.metadata_total,
                ),
            };
            let watch = &mut watches[i];
            let rate = watch.read(now, used, blocked);
            let policy = Policy {
                threshold_percent: threshold,
                step_percent: a.step_percent,
                poll: Duration::from_secs(a.poll_secs),
                growth: growth_estimate(watch.growth),
            };
            let fill = Fill {
                size: total,
                used,
                rate,
            };
            let hold = &mut holds[i];
            let Some((units, sized_by)) = plan(fill, &policy) else {
                // Nothing due. Only a store below its threshold clears the
                // condition a refusal set, and the retry hold stays until
                // it expires: a bursty writer's rate falls to nothing
                // between bursts, and each burst must not cost a fresh
                // `lvs` and a warning.
                if used_pct >= f64::from(threshold) {
                    continue;
                }
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
                continue;
            };
            if hold.holds() {
                continue;
            }
            let sizing = Sizing {
                units,
                total,
                sized_by,
                rate,
                growth: policy.growth,
            };
            match self.grow_store(store, sizing).await {
                Ok(took) => {
                    watch.growth = Some(took);
                    grew = true;
                    *hold = Hold::default();
                    self.autopilot.blocked.lock().unwrap().remove(store.name());
                }
                Err(why) => {
                    self.autopilot.refusals.fetch_add(1, Ordering::Relaxed);
                    hold.refused();
                    let msg = format!(
                        "thin pool {} {} is {used_pct:.1}% used and the autopilot cannot grow it: {why}",
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
        Ok(grew)
    }

    /// Grows `store` by the step [`plan`] sized (`sizing`, in the status's
    /// units), in whole extents, within the limits and the VG's room; how
    /// long the growth took until the store had its room (what a writer
    /// waited), or why it cannot.
    async fn grow_store(
        &self,
        store: Store,
        sizing: Sizing,
    ) -> std::result::Result<Duration, String> {
        let started = Instant::now();
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
        // The plan's units (pool blocks) to bytes of the store LVM reports.
        let bytes = (u128::from(sizing.units) * u128::from(size) / u128::from(sizing.total.max(1)))
            .min(u128::from(u64::MAX)) as u64;
        let mut step = round_up(bytes, extent).unwrap_or(extent).max(extent);
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
        // A step the rate sized past what the VG has now, where what it has
        // covers `step_percent`: that much at once (one `lvextend`), for
        // the writer is waiting; the next pass, at once, grows the file for
        // the rest.
        let fixed = round_up(size * u64::from(a.step_percent) / 100, extent)
            .unwrap_or(extent)
            .max(extent);
        let at_hand = free / copies / extent * extent;
        if free < step * copies && !(sizing.sized_by == SizedBy::Rate && at_hand >= fixed) {
            free = self
                .grow_backing(step * copies - free, extent)
                .await
                .map_err(|e| e.message())?
                .unwrap_or(free);
        }
        let wanted = step;
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
        let took = started.elapsed();
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
            sized_by = sizing.sized_by.name(),
            rate_mib_s = format!(
                "{:.1}",
                sizing.rate * (size as f64 / sizing.total.max(1) as f64) / (1 << 20) as f64
            ),
            growth_secs = format!("{:.2}", sizing.growth.as_secs_f64()),
            took_secs = format!("{:.2}", took.as_secs_f64()),
            "autopilot: grew the thin pool"
        );
        // Within the store's limit: no file grows for a growth that
        // `data_limit` / `metadata_limit` will not allow.
        let wanted = match limit {
            0 => wanted,
            limit => wanted.min(limit.saturating_sub(size + step) / extent * extent),
        };
        // A writer the rate sized for: while it has the room just added,
        // make the VG ready for another growth as large as this one
        // wanted, so that one is a single `lvextend` (a backing file's
        // growth costs several commands more).
        if sizing.sized_by == SizedBy::Rate && wanted > 0 {
            let left = free.saturating_sub(step * copies);
            if left < wanted * copies {
                if let Err(e) = self.grow_backing(wanted * copies - left, extent).await {
                    tracing::warn!(class = self.class_name(), error = %e.message(),
                        "autopilot: cannot grow the backing file ahead of the next growth");
                }
            }
        }
        Ok(took)
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
    /// Whether the autopilot's room depends on the host's free space (it
    /// may grow the loop-backed VG's file): then it is read at each ask,
    /// not from the LVM report.
    pub fn room_rests_on_host(&self) -> bool {
        let a = &self.cfg.autopilot;
        a.enabled && a.backing_file_limit > 0 && self.cfg.loop_pool.is_some()
    }

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
            .filter(|_| self.room_rests_on_host())
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

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    /// The measured pool of issue 33 (threshold 60 %, step 50 %, poll 1 s)
    /// with a growth that takes `growth`.
    fn policy(growth: Duration) -> Policy {
        Policy {
            threshold_percent: 60,
            step_percent: 50,
            poll: SEC,
            growth,
        }
    }

    #[test]
    fn an_idle_store_below_its_threshold_does_not_grow() {
        let f = Fill {
            size: 60,
            used: 35,
            rate: 0.0,
        };
        assert_eq!(plan(f, &policy(2 * SEC)), None);
    }

    #[test]
    fn a_slow_writer_past_the_threshold_gets_the_fixed_step() {
        let f = Fill {
            size: 100,
            used: 61,
            rate: 1.0,
        };
        assert_eq!(plan(f, &policy(2 * SEC)), Some((50, SizedBy::Step)));
        // No writer at all: the same step (a store filled while unread).
        let f = Fill { rate: 0.0, ..f };
        assert_eq!(plan(f, &policy(2 * SEC)), Some((50, SizedBy::Step)));
    }

    #[test]
    fn a_fast_writer_grows_the_store_before_its_threshold_by_what_its_rate_needs() {
        // 24 units/s into 60, 20 used: it would fill before a growth
        // started at the next read (1 s) lands (2 s later).
        let f = Fill {
            size: 60,
            used: 20,
            rate: 24.0,
        };
        // landed = 20 + 24 × 2 × 1.5 = 92; runway = 24 × 3 × 1.5 = 108;
        // target = max(92 + 108, 92 / 0.6) = 200: 140 more.
        assert_eq!(plan(f, &policy(2 * SEC)), Some((140, SizedBy::Rate)));
        // The same writer into a store it cannot fill that soon: nothing.
        let big = Fill {
            size: 10_000,
            used: 100,
            rate: 24.0,
        };
        assert_eq!(plan(big, &policy(2 * SEC)), None);
    }

    #[test]
    fn a_slower_growth_makes_a_larger_step_for_the_same_rate() {
        let f = Fill {
            size: 100,
            used: 70,
            rate: 10.0,
        };
        let (fast, _) = plan(f, &policy(SEC)).unwrap();
        let (slow, by) = plan(f, &policy(4 * SEC)).unwrap();
        assert_eq!(by, SizedBy::Rate);
        assert!(slow > fast, "{slow} <= {fast}");
        // After a growth at the rate-sized step, the writer stays below the
        // threshold while the growth runs.
        let landed = 70.0 + 10.0 * 4.0 * RATE_MARGIN;
        assert!(landed <= (100 + slow) as f64 * 0.6);
    }

    /// A burst read as a huge rate grows the store by at most
    /// [`RATE_STEP_CAP`] fixed steps, however fast it looked.
    #[test]
    fn a_burst_read_as_a_huge_rate_grows_by_a_bounded_step() {
        let f = Fill {
            size: 100,
            used: 50,
            rate: 1e12,
        };
        assert_eq!(
            plan(f, &policy(2 * SEC)),
            Some((50 * RATE_STEP_CAP, SizedBy::Rate))
        );
    }

    #[test]
    fn a_full_tiny_store_grows_by_at_least_one_unit() {
        let f = Fill {
            size: 1,
            used: 1,
            rate: 0.0,
        };
        assert_eq!(plan(f, &policy(2 * SEC)), Some((1, SizedBy::Step)));
    }

    #[test]
    fn a_nonsense_rate_falls_back_to_the_fixed_step() {
        for rate in [f64::NAN, f64::INFINITY, -5.0] {
            let f = Fill {
                size: 100,
                used: 80,
                rate,
            };
            assert_eq!(
                plan(f, &policy(2 * SEC)),
                Some((50, SizedBy::Step)),
                "{rate}"
            );
        }
    }

    #[test]
    fn the_growth_estimate_is_the_last_growth_with_a_floor() {
        assert_eq!(growth_estimate(None), FIRST_GROWTH);
        assert_eq!(growth_estimate(Some(3 * SEC)), 3 * SEC);
        assert_eq!(growth_estimate(Some(Duration::from_millis(10))), MIN_GROWTH);
    }

    #[test]
    fn the_fill_rate_is_use_gained_over_time() {
        assert_eq!(fill_rate(10, 40, 2 * SEC, 0.0, false), Some(15.0));
        // Discards are no filling.
        assert_eq!(fill_rate(40, 10, 2 * SEC, 7.0, false), Some(0.0));
        // Too close to the last read: the earlier rate stands.
        assert_eq!(
            fill_rate(10, 40, Duration::from_millis(50), 7.0, false),
            None
        );
        // A pool out of space holds its writers: the earlier rate stands if
        // higher.
        assert_eq!(fill_rate(60, 60, SEC, 24.0, true), Some(24.0));
        assert_eq!(fill_rate(50, 80, SEC, 24.0, true), Some(30.0));
    }
}
