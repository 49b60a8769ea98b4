//! The cached `lvs` report of our volume group: served while fresh (or
//! stale, while one `lvs` catches up in the background), kept current by
//! our own writes ([`Cache::catch_up`]), and read once for every reader
//! that misses it (single flight).

use std::sync::Arc;
use std::time::Instant;

use super::explain::vg_missing;
use super::report::{self, Report, Write};
use super::Lvm;
use crate::error::{Error, Result};

#[derive(Default)]
pub(super) struct Cache {
    /// The report and when the `lvs` that read it started.
    pub(super) report: Option<(Instant, Arc<Report>)>,
    /// Bumped when a write begins and when it ends.
    pub(super) generation: u64,
    /// Our writes that ended, with the generation they ended at: a report
    /// read while they ran gets them applied again before it is kept
    /// (applying is idempotent), so reads that overlap writes still land.
    pub(super) recent: std::collections::VecDeque<(u64, Write)>,
    /// The generation of the last write whose effect is unknown (failed,
    /// or not described): a read that overlapped it is not kept.
    pub(super) unknown_since: u64,
    /// The generation of the last write dropped from `recent`.
    pub(super) dropped_until: u64,
    /// The generation up to which every ended write is in `report`. A
    /// write that ends while a caller still holds the report is applied
    /// when the cache is next read ([`Cache::cached`]), not at once:
    /// applying it to a report someone holds would copy every LV
    /// (`Arc::make_mut`), which on a dense node is work per LV that each
    /// create would pay.
    pub(super) applied: u64,
    /// How long the last `lvs` for the cache took, parse included.
    pub(super) last_read: std::time::Duration,
}

/// What [`Lvm::cached_report`] finds.
pub enum Cached {
    /// The report with every ended write in it, and for how much longer
    /// it is fresh.
    Report(Arc<Report>, std::time::Duration),
    /// A caller holds the report and ended writes wait to be applied.
    Held,
    /// No report (or no cache).
    Missing,
}

/// A background refresh waits at least this many times as long as the
/// last `lvs` took: catching up with outside changes takes at most a
/// tenth of the time, however many LVs the VG holds.
pub(super) const REFRESH_DUTY: u32 = 10;

/// ... but never longer than this: the last `lvs`'s time includes waits
/// for the VG lock behind other commands, and the metrics (pool fill
/// alerts) read the same report.
pub(super) const REFRESH_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// How many ended writes [`Cache::recent`] keeps.
pub(super) const RECENT_WRITES: usize = 256;

impl Cache {
    /// `report`, read by an `lvs` that began at generation `from`, with
    /// every write that ended since applied; `Err(report)`, as read, when
    /// a write whose effect is unknown ended meanwhile, or the log no
    /// longer reaches back that far (a one-off, not to be kept).
    fn catch_up(&self, mut report: Report, from: u64) -> std::result::Result<Report, Report> {
        if self.unknown_since > from || self.dropped_until > from {
            return Err(report);
        }
        for (_, w) in self.recent.iter().filter(|(g, _)| *g > from) {
            report.apply(w);
        }
        Ok(report)
    }

    /// Applies the ended writes the report does not hold yet: in place
    /// when nobody else holds it, or, with `copy`, on a copy of it (then
    /// the holders keep their view). Drops the report when a pending
    /// write is no longer in `recent`.
    pub(super) fn apply_pending(&mut self, copy: bool) {
        let Some(last) = self.pending() else {
            return;
        };
        if self.dropped_until > self.applied {
            self.report = None;
            return;
        }
        let Some((_, r)) = &mut self.report else {
            return;
        };
        if !copy && Arc::get_mut(r).is_none() {
            return;
        }
        // Copies only when shared (and `copy`).
        let report = Arc::make_mut(r);
        for (_, w) in self.recent.iter().filter(|(g, _)| *g > self.applied) {
            report.apply(w);
        }
        self.applied = last;
    }

    /// The generation of the last ended write not yet in the report.
    fn pending(&self) -> Option<u64> {
        self.recent
            .back()
            .map(|&(g, _)| g)
            .filter(|g| *g > self.applied)
    }

    /// The report with every ended write applied, and when its `lvs`
    /// began.
    fn cached(&mut self) -> Option<(Instant, Arc<Report>)> {
        self.apply_pending(true);
        self.report.clone()
    }

    /// How old the report may grow before a read starts a background
    /// refresh: `max_age`, or [`REFRESH_DUTY`] times the last `lvs` (at
    /// most [`REFRESH_WAIT_MAX`]) when that is longer. At 6,000 LVs under
    /// TCG one `lvs` took 3 s of CPU: every 10 s that was a third of a CPU
    /// taken from the calls it serves, for changes made outside the
    /// driver (its own writes are in the report already).
    fn refresh_after(&self, max_age: std::time::Duration) -> std::time::Duration {
        max_age.max((self.last_read * REFRESH_DUTY).min(REFRESH_WAIT_MAX))
    }
}

impl Lvm {
    pub fn invalidate(&self) {
        let mut c = self.cache.lock().unwrap();
        c.generation += 1;
        c.report = None;
        c.unknown_since = c.generation;
        drop(c);
        self.changes.bump();
    }

    /// The report of our VG from the cache. A report older than
    /// `report_max_age` (or [`REFRESH_DUTY`] times the last `lvs`, at most
    /// [`REFRESH_WAIT_MAX`], if longer) is still served (our own writes are in it), and one `lvs`
    /// is started in the background to catch up with changes made behind
    /// the driver's back; only an empty cache makes the caller wait.
    /// Decisions that must not rest on a cached view use
    /// [`Lvm::fresh_report`]. A `report_max_age` of 0 turns the cache off.
    pub async fn report(self: &Arc<Self>) -> Result<Arc<Report>> {
        if self.max_age.is_zero() {
            // No cache asked for: every read asks LVM.
            return self.fresh_report().await;
        }
        let (cached, age) = {
            let mut c = self.cache.lock().unwrap();
            (c.cached(), c.refresh_after(self.max_age))
        };
        match cached {
            Some((at, r)) if at.elapsed() <= age => Ok(r),
            Some((_, r)) => {
                self.refresh_in_background();
                Ok(r)
            }
            None => self.read_since(None).await,
        }
    }

    /// The report as the driver knows it: the last `lvs` plus our own
    /// writes since, whatever its age; LVM is read only when there is
    /// none. Calls that change something decide on it: they neither wait
    /// for nor start a refresh, whose `lvs` would hold the VG lock their
    /// own command needs. A refusal that rests on it (a full pool) is
    /// checked again on [`Lvm::fresh_report`].
    pub async fn known(&self) -> Result<Arc<Report>> {
        if self.max_age.is_zero() {
            return self.fresh_report().await;
        }
        let cached = self.cache.lock().unwrap().cached();
        match cached {
            Some((_, r)) => Ok(r),
            None => self.read_since(None).await,
        }
    }

    /// The cached report, our writes applied, without asking LVM, and for
    /// how much longer [`Lvm::report`] serves it without starting a
    /// refresh. Never copies the report: while a caller holds it with
    /// writes not yet applied, [`Cached::Held`] (ask again once it is let
    /// go); with no report, or no cache (`report_max_age` 0),
    /// [`Cached::Missing`].
    pub fn cached_report(&self) -> Cached {
        if self.max_age.is_zero() {
            return Cached::Missing;
        }
        let mut c = self.cache.lock().unwrap();
        let fresh = c.refresh_after(self.max_age);
        c.apply_pending(false);
        if c.pending().is_some() && c.report.is_some() {
            return Cached::Held;
        }
        match &c.report {
            Some((at, r)) => Cached::Report(r.clone(), fresh.saturating_sub(at.elapsed())),
            None => Cached::Missing,
        }
    }

    /// Starts one `lvs` for the cache unless one runs already. A failure
    /// drops the cache, so the next reader waits for LVM and sees the
    /// error.
    fn refresh_in_background(self: &Arc<Self>) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.clone();
        handle.spawn(async move {
            let Ok(one) = me.refresh.try_lock() else {
                return;
            };
            if let Err(e) = me.read_locked().await {
                tracing::warn!(error = %e, "background lvs failed; the cached report is dropped");
                me.invalidate();
            }
            drop(one);
        });
    }

    /// A report read after this call began; used before decisions that
    /// must not rest on a cached view. Callers that arrive while an `lvs`
    /// runs share the next one.
    pub async fn fresh_report(&self) -> Result<Arc<Report>> {
        self.read_since(Some(Instant::now())).await
    }

    /// A report read since `since`, with our writes since applied: one
    /// `lvs` serves every reader that asks from the same moment on.
    pub async fn report_since(&self, since: Instant) -> Result<Arc<Report>> {
        self.read_since(Some(since)).await
    }

    /// Single flight: waits for an `lvs` already running, and takes its
    /// report if that `lvs` started after `since` (any report when
    /// `None`); otherwise runs one.
    async fn read_since(&self, since: Option<Instant>) -> Result<Arc<Report>> {
        let _one = self.refresh.lock().await;
        {
            let mut c = self.cache.lock().unwrap();
            if let Some((at, r)) = c.cached() {
                if since.is_none_or(|s| at >= s) {
                    return Ok(r);
                }
            }
        }
        self.read_locked().await
    }

    /// Runs `lvs` (the caller holds `refresh`) and keeps the report, with
    /// our writes that ended meanwhile applied again; not when one of
    /// unknown effect ended meanwhile.
    async fn read_locked(&self) -> Result<Arc<Report>> {
        let (generation, started) = (self.cache.lock().unwrap().generation, Instant::now());
        let out = match self.query("lvs", report::lvs_args(&self.vg)).await {
            Ok(out) => out,
            // Whether the VG is there is asked, not read from the text.
            Err(e @ Error::Command { .. }) => {
                return Err(match self.vg_exists().await {
                    Ok(false) => vg_missing(&self.vg, &e),
                    _ => e,
                })
            }
            Err(e) => return Err(e),
        };
        // Parsed on a blocking thread: at 6,000 LVs the text is 6 MiB and
        // its parse took a runtime worker for a fifth of a second under
        // TCG, which every call that worker held waited out (ListVolumes
        // at 5,000 volumes was a third slower while a refresh ran). The
        // text (half a MiB at 500 LVs) goes there too, before the report
        // is kept.
        let read = crate::blocking::run("parse the lvs report", self.timeout, move || {
            Report::parse(&out.stdout)
        })
        .await?;
        let took = started.elapsed();
        let (read, replaced) = {
            let mut c = self.cache.lock().unwrap();
            // Our writes that ended while lvs ran are applied to what it
            // read; one whose effect is unknown makes the read a one-off.
            match c.catch_up(read, generation) {
                Ok(current) => {
                    let current = Arc::new(current);
                    c.last_read = took;
                    let replaced = c.report.replace((started, current.clone()));
                    // Every write that ended is in it now.
                    c.applied = c.generation;
                    self.changes.bump();
                    (current, replaced)
                }
                Err(read) => (Arc::new(read), None),
            }
        };
        // The report it replaced goes outside the lock (unless a reader
        // still holds it), and then what reading and parsing freed goes
        // back to the kernel: each refresh runs on whichever thread is
        // free, and glibc kept what it freed in that thread's arena, so an
        // idle driver's RSS stepped up with every refresh (`sys::heap`).
        // Both on a blocking thread, as the parse: freeing thousands of
        // LVs and the trim's walk of every arena's free lists are work per
        // LV, which the runtime's workers should not wait out. The trim
        // covers every arena, the parse's thread's too. Not awaited: the
        // caller (and every reader waiting on this single flight) has its
        // report now.
        let timeout = self.timeout;
        tokio::spawn(async move {
            let released =
                crate::blocking::run("release the replaced report", timeout, move || {
                    drop(replaced);
                    crate::sys::release_free_memory();
                    Ok(())
                })
                .await;
            if let Err(e) = released {
                tracing::debug!(error = %e, "the replaced report was not released in time");
            }
        });
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::script_lvm;
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    /// A fake `lvm` that logs each subcommand to a file; its `lvs` waits
    /// while a file `hold` exists, sleeps `delay`, prints a report of one
    /// thin pool and logs `lvs-done`; its `lvremove` fails.
    fn fake_lvm(dir: &Path, delay: &str, max_age: u64) -> (Arc<Lvm>, PathBuf) {
        let calls = dir.join("calls");
        let pool = r#"{"lv_name":"pool","vg_name":"vg1","lv_attr":"twi-aotz--","lv_size":"8388608","pool_lv":"","segtype":"thin-pool","data_percent":"1.00","metadata_percent":"1.00","lv_tags":"","lv_health_status":"","lv_kernel_major":"253","lv_kernel_minor":"1","vg_extent_size":"4194304","vg_size":"16777216","vg_free":"0","chunk_size":"65536"}"#;
        let body = format!(
            "echo \"$1\" >> {calls}\ncase $1 in\n lvs) while [ -e {hold} ]; do sleep 0.02; done; sleep {delay}; echo '{{\"report\":[{{\"lv\":[{pool}]}}]}}'; echo lvs-done >> {calls} ;;\n lvremove) exit 5 ;;\nesac\n",
            calls = calls.display(),
            hold = dir.join("hold").display()
        );
        let lvm = script_lvm(dir, &body, |c| {
            c.thin_pool = "pool".into();
            c.report_max_age_secs = max_age;
        });
        (lvm, calls)
    }

    fn count(calls: &Path, sub: &str) -> usize {
        std::fs::read_to_string(calls)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == sub)
            .count()
    }

    #[tokio::test]
    async fn cache_serves_until_invalidated() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0", 3600);
        let lvs = || count(&calls, "lvs");
        lvm.report().await.unwrap();
        lvm.report().await.unwrap();
        assert_eq!(lvs(), 1, "second read must come from the cache");
        lvm.invalidate();
        lvm.report().await.unwrap();
        assert_eq!(lvs(), 2);
        lvm.fresh_report().await.unwrap();
        assert_eq!(lvs(), 3);
        lvm.report().await.unwrap();
        assert_eq!(lvs(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn readers_that_miss_share_one_lvs() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "1", 3600);
        let readers: Vec<_> = (0..8)
            .map(|i| {
                let lvm = lvm.clone();
                tokio::spawn(async move {
                    if i % 2 == 0 {
                        lvm.report().await.map(drop)
                    } else {
                        lvm.fresh_report().await.map(drop)
                    }
                })
            })
            .collect();
        for r in readers {
            r.await.unwrap().unwrap();
        }
        // Fresh readers that arrived while the first lvs ran need one
        // started after them: at most one more.
        let n = count(&calls, "lvs");
        assert!((1..=2).contains(&n), "{n} lvs for 8 concurrent readers");
    }

    /// A caller that holds the report across its own writes (a create
    /// decides on it, then writes) keeps its view, and the cache does not
    /// copy every LV to apply the writes: they land in the same report
    /// once it is let go, and a report still held at the next read is
    /// copied then, with every write in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_report_held_across_writes_is_not_copied_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0", 3600);
        let held = lvm.known().await.unwrap();
        let at = Arc::as_ptr(&held);
        lvm.create_thin("csi-a", 4 << 20, &[], None).await.unwrap();
        lvm.extend("csi-a", 8 << 20).await.unwrap();
        assert!(held.find("csi-a").is_none(), "the holder's view stays");
        drop(held);
        let r = lvm.known().await.unwrap();
        assert_eq!(Arc::as_ptr(&r), at, "applied in place, not to a copy");
        assert_eq!(r.find("csi-a").unwrap().size, 8 << 20);
        // Still held at the next read: that reader gets a copy with both
        // writes, the holder keeps its view.
        lvm.create_thin("csi-b", 4 << 20, &[], None).await.unwrap();
        lvm.extend("csi-b", 12 << 20).await.unwrap();
        let now = lvm.report().await.unwrap();
        assert_ne!(Arc::as_ptr(&now), at);
        assert_eq!(now.find("csi-b").unwrap().size, 12 << 20);
        assert!(r.find("csi-b").is_none());
        assert_eq!(count(&calls, "lvs"), 1, "no lvs after our own writes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn our_writes_keep_the_cache_current_and_a_failure_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0", 3600);
        lvm.report().await.unwrap();
        lvm.create_thin("csi-a", 4 << 20, &["tpcsi.owner=x".into()], None)
            .await
            .unwrap();
        lvm.extend("csi-a", 8 << 20).await.unwrap();
        let r = lvm.report().await.unwrap();
        assert_eq!(count(&calls, "lvs"), 1, "no lvs after our own writes");
        assert_eq!(r.find("csi-a").unwrap().size, 8 << 20);
        assert_eq!(r.thin_volumes("pool").count(), 1);
        // The fake lvremove fails: what LVM did is unknown, so the next
        // read asks LVM again.
        assert!(lvm.remove_owned("csi-a", "tpcsi.owner=x").await.is_err());
        let r = lvm.report().await.unwrap();
        assert_eq!(count(&calls, "lvs"), 2);
        assert!(r.find("csi-a").is_none(), "LVM's view, not ours");
    }

    /// An `lvs` that takes 0.2 s is not repeated in the background more
    /// often than every 2 s, though `report_max_age_secs` is 1.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_lvs_is_refreshed_at_most_a_tenth_of_the_time() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0.2", 1);
        let first = Instant::now();
        lvm.report().await.unwrap();
        assert_eq!(count(&calls, "lvs"), 1);
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(&calls, "lvs") < 2 {
            assert!(Instant::now() < deadline, "no background refresh in 30 s");
            lvm.report().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let after = first.elapsed();
        assert!(
            after >= Duration::from_secs(2),
            "refreshed after {after:?}: sooner than 10 times the lvs's 0.2 s"
        );
    }

    /// The wait is capped: a slow `lvs` (or one that waited for the VG
    /// lock) never holds the next refresh back past a minute.
    #[test]
    fn the_refresh_wait_is_capped() {
        let mut c = Cache::default();
        let age = Duration::from_secs(10);
        assert_eq!(c.refresh_after(age), age);
        c.last_read = Duration::from_millis(300);
        assert_eq!(c.refresh_after(age), age);
        c.last_read = Duration::from_secs(3);
        assert_eq!(c.refresh_after(age), Duration::from_secs(30));
        c.last_read = Duration::from_secs(120);
        assert_eq!(c.refresh_after(age), REFRESH_WAIT_MAX);
        assert_eq!(
            c.refresh_after(Duration::from_secs(300)),
            Duration::from_secs(300)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_report_is_served_while_one_lvs_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0", 1);
        lvm.report().await.unwrap();
        assert_eq!(count(&calls, "lvs-done"), 1);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // From now on lvs does not finish until `hold` is gone.
        let hold = dir.path().join("hold");
        std::fs::write(&hold, "").unwrap();
        for _ in 0..5 {
            lvm.report().await.unwrap();
        }
        assert_eq!(
            count(&calls, "lvs-done"),
            1,
            "stale reads were answered while lvs could not finish"
        );
        std::fs::remove_file(&hold).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(&calls, "lvs-done") < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            count(&calls, "lvs"),
            2,
            "one background lvs for five stale reads"
        );
        assert_eq!(count(&calls, "lvs-done"), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_that_overlaps_our_write_is_kept_with_the_write_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0", 3600);
        let hold = dir.path().join("hold");
        std::fs::write(&hold, "").unwrap();
        let reader = {
            let lvm = lvm.clone();
            tokio::spawn(async move { lvm.fresh_report().await })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(&calls, "lvs") < 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The write ends while lvs (which does not show it) still runs.
        lvm.create_thin("csi-a", 4 << 20, &[], None).await.unwrap();
        std::fs::remove_file(&hold).unwrap();
        let read = reader.await.unwrap().unwrap();
        assert!(
            read.find("csi-a").is_some(),
            "the write is applied to the read"
        );
        let r = lvm.report().await.unwrap();
        assert!(r.find("csi-a").is_some());
        assert_eq!(count(&calls, "lvs"), 1, "the overlapping read was kept");
    }

    /// What a read that began at generation `from` becomes: our writes
    /// that ended since are applied; a write of unknown effect, or a log
    /// that lost writes, makes it a one-off.
    #[test]
    fn a_read_catches_up_only_with_writes_it_can_replay() {
        let created = |n: &str| Write::CreatedThin {
            name: n.into(),
            pool: "pool".into(),
            size: 1 << 20,
            tags: vec![],
            read_ahead: None,
        };
        let pool = r#"{"lv_name":"pool","vg_name":"vg1","lv_attr":"twi-aotz--","lv_size":"8388608","pool_lv":"","segtype":"thin-pool","data_percent":"1.00","metadata_percent":"1.00","lv_tags":"","lv_health_status":"","lv_kernel_major":"253","lv_kernel_minor":"1","vg_extent_size":"4194304","vg_size":"16777216","vg_free":"0","chunk_size":"65536"}"#;
        let read = Report::parse(&format!(r#"{{"report":[{{"lv":[{pool}]}}]}}"#)).unwrap();
        let mut c = Cache {
            generation: 4,
            ..Cache::default()
        };
        c.recent.push_back((2, created("before")));
        c.recent.push_back((4, created("during")));
        let r = c.catch_up(read.clone(), 3).unwrap();
        assert!(
            r.find("during").is_some(),
            "a write that ended after the read began"
        );
        assert!(
            r.find("before").is_none(),
            "the read itself shows what ended before it"
        );
        c.unknown_since = 4;
        assert!(
            c.catch_up(read.clone(), 3).is_err(),
            "a failure during the read"
        );
        assert!(
            c.catch_up(read.clone(), 4).is_ok(),
            "a failure before the read"
        );
        c.unknown_since = 0;
        c.dropped_until = 4;
        assert!(
            c.catch_up(read, 3).is_err(),
            "writes the log no longer holds"
        );
    }

    #[tokio::test]
    async fn max_age_zero_reads_lvm_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let (lvm, calls) = fake_lvm(dir.path(), "0", 0);
        for _ in 0..3 {
            lvm.report().await.unwrap();
        }
        assert_eq!(count(&calls, "lvs"), 3);
    }
}
