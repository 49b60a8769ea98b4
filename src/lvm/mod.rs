//! The LVM layer: every LVM command goes through [`Lvm::run`] (an argv, a
//! timeout, `LVM_SUPPRESS_FD_WARNINGS=1`, stderr in the error), and every
//! read goes through one cached `lvs` report of our volume group.
//!
//! The cache is kept current by applying our own writes to it
//! ([`report::Write`]); a failed write drops it. It is read again after
//! `report_max_age` so that changes made behind the driver's back are
//! seen, and readers that miss it share one `lvs` (single flight).

pub mod report;
pub mod room;
pub mod shell;
pub mod thin;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{self, Output};
use report::{Report, Write};

/// Every command reports times as seconds since the epoch, whatever the
/// node's lvm.conf says.
const REPORT_CONFIG: &str = "report { time_format = \"%s\" }";

/// Settings that let LVM work where no udevd runs (containers, our VM):
/// libdevmapper then creates /dev/mapper and /dev/VG/LV nodes itself.
const NO_UDEV_CONFIG: &str = "activation { udev_rules = 0 udev_sync = 0 } \
devices { obtain_device_list_from_udev = 0 }";

/// What the driver's writes add unless `lvm_metadata_archive` is set: no
/// copy of the VG's metadata in /etc/lvm/archive before each change.
/// lvm.conf's `backup/backup` (on by default: the current copy in
/// /etc/lvm/backup) is left as it is.
const NO_ARCHIVE_CONFIG: &str = "backup { archive = 0 }";

pub struct Lvm {
    binary: String,
    pub vg: String,
    pub pool: String,
    timeout: Duration,
    no_udev: bool,
    archive: bool,
    /// LVM's shells; commands they cannot take run on their own.
    shells: Arc<shell::Shells>,
    max_age: Duration,
    cache: Mutex<Cache>,
    /// Held while an `lvs` for the cache runs: readers that miss the cache
    /// wait here and take the report it read (single flight).
    refresh: tokio::sync::Mutex<()>,
    /// Bounds the LVM commands that change something and run at once.
    /// LVM serialises their commits on the VG lock; a second one can get
    /// through its start-up (in a shell: its parsing) meanwhile, and more
    /// would only wait, each an `lvm` process in memory.
    writers: tokio::sync::Semaphore,
    /// A pool holds one metadata snapshot at a time (`thin`).
    metadata_lock: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Cache {
    /// The report and when the `lvs` that read it started.
    report: Option<(Instant, Arc<Report>)>,
    /// Bumped when a write begins and when it ends.
    generation: u64,
    /// Our writes that ended, with the generation they ended at: a report
    /// read while they ran gets them applied again before it is kept
    /// (applying is idempotent), so reads that overlap writes still land.
    recent: std::collections::VecDeque<(u64, Write)>,
    /// The generation of the last write whose effect is unknown (failed,
    /// or not described): a read that overlapped it is not kept.
    unknown_since: u64,
    /// The generation of the last write dropped from `recent`.
    dropped_until: u64,
}

/// How many LVM commands that change something run at once.
const WRITERS: usize = 2;

/// How many ended writes [`Cache::recent`] keeps.
const RECENT_WRITES: usize = 256;

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
}

impl Lvm {
    pub fn new(cfg: &Config) -> Lvm {
        Lvm {
            binary: cfg.lvm_binary.clone(),
            vg: cfg.volume_group.clone(),
            pool: cfg.thin_pool.clone(),
            timeout: cfg.command_timeout(),
            no_udev: cfg.no_udev(),
            archive: cfg.lvm_metadata_archive,
            shells: Arc::new(shell::Shells::new(
                &cfg.lvm_binary,
                cfg.command_timeout(),
                cfg.lvm_shell,
            )),
            max_age: Duration::from_secs(cfg.report_max_age_secs),
            cache: Mutex::new(Cache::default()),
            refresh: tokio::sync::Mutex::new(()),
            writers: tokio::sync::Semaphore::new(WRITERS),
            metadata_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// `lvm <subcommand> [--config ...] args...`; a `write` (any command
    /// that changes something) also skips LVM's metadata archive unless
    /// `lvm_metadata_archive` asks for it. That overrides lvm.conf's
    /// `backup/archive` for the driver's writes only.
    pub fn argv(&self, subcommand: &str, args: Vec<String>, write: bool) -> Vec<String> {
        let mut config = REPORT_CONFIG.to_string();
        if self.no_udev {
            config = format!("{config} {NO_UDEV_CONFIG}");
        }
        if write && !self.archive {
            config = format!("{config} {NO_ARCHIVE_CONFIG}");
        }
        let mut argv = vec![subcommand.to_string(), "--config".into(), config];
        argv.extend(args);
        argv
    }

    /// Runs a read-only LVM command.
    pub async fn query(&self, subcommand: &str, args: Vec<String>) -> Result<Output> {
        self.run(subcommand, args, false).await
    }

    /// Runs `lvm` with [`Lvm::argv`], bounded by the command timeout: in
    /// one of LVM's shells, or on its own where they cannot take it.
    async fn run(&self, subcommand: &str, args: Vec<String>, write: bool) -> Result<Output> {
        let argv = self.argv(subcommand, args, write);
        if let Some(res) = self.shells.run(&argv).await {
            return res;
        }
        exec::run_with(
            &self.binary,
            &argv,
            &[("LVM_SUPPRESS_FD_WARNINGS", "1")],
            self.timeout,
            exec::Stop::Interrupt,
        )
        .await
    }

    /// Runs an LVM command that changes state, logged. The cached report
    /// is dropped: use [`Lvm::change_with`] where the change is known.
    pub async fn change(&self, subcommand: &str, args: Vec<String>) -> Result<Output> {
        self.change_with(subcommand, args, None).await
    }

    /// Runs an LVM command that changes state, logged, and applies `write`
    /// to the cached report once it succeeded; a failure drops the cache
    /// (what LVM did is then unknown). A read that overlapped the write is
    /// kept with the write applied again ([`Cache::catch_up`]), unless the
    /// write failed.
    async fn change_with(
        &self,
        subcommand: &str,
        args: Vec<String>,
        write: Option<Write>,
    ) -> Result<Output> {
        let _turn = self.writers.acquire().await;
        let started = self.change_begins();
        let lv = write.as_ref().map(|w| w.name().to_string());
        let res = self.run(subcommand, args.clone(), true).await;
        self.change_done(subcommand, &args, started, res.as_ref().map(drop), write);
        match res {
            // Writes to LVs are explained by the VG's state; a write that
            // makes the VG itself (pvcreate, vgcreate) has none to read.
            Err(e) if subcommand.starts_with("lv") => Err(self.explain(e, lv.as_deref()).await),
            other => other,
        }
    }

    /// Why an LVM write failed. LVM's exit code says only that it failed
    /// (5 for nearly everything), and its text is for people: the cause a
    /// CO must act on is read from LVM's state, read again right after
    /// (see [`explain`]). A read that fails says itself what is wrong
    /// when the VG is gone; otherwise the command's own error stands.
    async fn explain(&self, err: Error, lv: Option<&str>) -> Error {
        if !matches!(err, Error::Command { .. }) {
            return err;
        }
        match self.fresh_report().await {
            Ok(report) => explain(&report, &self.vg, &self.pool, lv, err),
            Err(gone) if gone.code() == tonic::Code::Unavailable => gone,
            Err(read) => {
                tracing::warn!(error = %read, "cannot read LVM's state after a failed write");
                err
            }
        }
    }

    /// Whether our volume group exists, from a list of every VG (which
    /// succeeds when there is none), never from a failure's text.
    pub async fn vg_exists(&self) -> Result<bool> {
        let out = self
            .query(
                "vgs",
                crate::argv!["--reportformat", "json", "-o", "vg_name"],
            )
            .await?;
        for row in report::rows(&out.stdout, "vg")? {
            if report::text(&row, "vg_name")? == self.vg {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Marks a change as running: reads that started before are not kept.
    fn change_begins(&self) -> Instant {
        self.cache.lock().unwrap().generation += 1;
        Instant::now()
    }

    /// Ends a change: logs it, and applies `write` to the cached report
    /// when it succeeded, or drops the cache when it failed.
    fn change_done(
        &self,
        subcommand: &str,
        args: &[String],
        started: Instant,
        res: std::result::Result<(), &Error>,
        write: Option<Write>,
    ) {
        let mut c = self.cache.lock().unwrap();
        c.generation += 1;
        match (res, write) {
            (Ok(()), Some(w)) => {
                if let Some((_, r)) = &mut c.report {
                    Arc::make_mut(r).apply(&w);
                }
                let g = c.generation;
                c.recent.push_back((g, w));
                while c.recent.len() > RECENT_WRITES {
                    if let Some((g, _)) = c.recent.pop_front() {
                        c.dropped_until = g;
                    }
                }
            }
            _ => {
                // Failed, or not described: what LVM did is unknown.
                c.report = None;
                c.unknown_since = c.generation;
            }
        }
        drop(c);
        match res {
            Ok(()) => tracing::info!(subcommand, ?args, elapsed = ?started.elapsed(), "lvm: done"),
            Err(e) => tracing::warn!(subcommand, ?args, error = %e, "lvm: failed"),
        }
    }

    pub fn invalidate(&self) {
        let mut c = self.cache.lock().unwrap();
        c.generation += 1;
        c.report = None;
        c.unknown_since = c.generation;
    }

    /// The report of our VG from the cache. A report older than
    /// `report_max_age` is still served (our own writes are in it), and
    /// one `lvs` is started in the background to catch up with changes
    /// made behind the driver's back; only an empty cache makes the caller
    /// wait. Decisions that must not rest on a cached view use
    /// [`Lvm::fresh_report`]. A `report_max_age` of 0 turns the cache off.
    pub async fn report(self: &Arc<Self>) -> Result<Arc<Report>> {
        if self.max_age.is_zero() {
            // No cache asked for: every read asks LVM.
            return self.fresh_report().await;
        }
        let cached = self.cache.lock().unwrap().report.clone();
        match cached {
            Some((at, r)) if at.elapsed() <= self.max_age => Ok(r),
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
        let cached = self.cache.lock().unwrap().report.clone();
        match cached {
            Some((_, r)) => Ok(r),
            None => self.read_since(None).await,
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
            let c = self.cache.lock().unwrap();
            if let Some((at, r)) = &c.report {
                if since.is_none_or(|s| *at >= s) {
                    return Ok(r.clone());
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
        let read = Report::parse(&out.stdout);
        // The text (half a MiB at 500 LVs) goes before the report is kept.
        drop(out);
        let read = read?;
        let (read, replaced) = {
            let mut c = self.cache.lock().unwrap();
            // Our writes that ended while lvs ran are applied to what it
            // read; one whose effect is unknown makes the read a one-off.
            match c.catch_up(read, generation) {
                Ok(current) => {
                    let current = Arc::new(current);
                    let replaced = c.report.replace((started, current.clone()));
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
        // The trim walks malloc's free lists and madvises free pages
        // (under a millisecond); it waits on no device, so it runs here,
        // not on a blocking thread (whose first malloc could open one more
        // arena).
        drop(replaced);
        crate::sys::release_free_memory();
        Ok(read)
    }

    pub fn lv_path(&self, lv: &str) -> String {
        format!("{}/{}", self.vg, lv)
    }

    pub fn dev_path(&self, lv: &str) -> String {
        format!("/dev/{}/{}", self.vg, lv)
    }

    /// Creates a thin LV with its tags in the same command, inactive: the
    /// node activates it when it stages the volume.
    pub async fn create_thin(
        &self,
        name: &str,
        size: u64,
        tags: &[String],
        read_ahead: Option<&str>,
    ) -> Result<()> {
        let mut args = crate::argv![
            "--type",
            "thin",
            "--virtualsize",
            format!("{size}b"),
            "--thinpool",
            self.lv_path(&self.pool),
            "--name",
            name,
            "--activate",
            "n",
            "--yes"
        ];
        add_tags(&mut args, tags);
        add_read_ahead(&mut args, read_ahead);
        args.push(self.vg.clone());
        let made = Write::CreatedThin {
            name: name.to_string(),
            pool: self.pool.clone(),
            size,
            tags: tags.to_vec(),
            read_ahead: read_ahead.map(str::to_string),
        };
        self.change_with("lvcreate", args, Some(made))
            .await
            .map(drop)
    }

    /// Creates a thin snapshot `name` of the thin LV `origin` with its tags,
    /// inactive: read-only with LVM's activation-skip flag for a snapshot,
    /// writable without the flag for a volume made from one (a restore or
    /// a clone). A thin snapshot has its origin's size.
    pub async fn create_snapshot(
        &self,
        name: &str,
        origin: &str,
        tags: &[String],
        writable: bool,
        read_ahead: Option<&str>,
    ) -> Result<()> {
        let mut args = crate::argv![
            "--snapshot",
            "--name",
            name,
            "--permission",
            if writable { "rw" } else { "r" },
            "--setactivationskip",
            if writable { "n" } else { "y" },
            "--activate",
            "n",
            "--yes"
        ];
        add_tags(&mut args, tags);
        add_read_ahead(&mut args, read_ahead);
        args.push(self.lv_path(origin));
        self.change("lvcreate", args).await.map(drop)
    }

    pub async fn remove(&self, name: &str) -> Result<()> {
        self.change_with(
            "lvremove",
            crate::argv!["--yes", self.lv_path(name)],
            Some(Write::Removed(name.to_string())),
        )
        .await
        .map(drop)
    }

    /// Removes the thin LV `name` of our pool if it carries `owner_tag`:
    /// the ownership check runs inside the same locked LVM command that
    /// removes, so nothing else can ever be removed. No such LV is success.
    pub async fn remove_owned(&self, name: &str, owner_tag: &str) -> Result<()> {
        let select = remove_selection(name, &self.pool, owner_tag)?;
        self.change_with(
            "lvremove",
            crate::argv!["--yes", "--select", select, self.vg.clone()],
            Some(Write::Removed(name.to_string())),
        )
        .await
        .map(drop)
    }

    pub async fn extend(&self, name: &str, size: u64) -> Result<()> {
        self.change_with(
            "lvextend",
            crate::argv!["--size", format!("{size}b"), self.lv_path(name)],
            Some(Write::Resized {
                name: name.to_string(),
                size,
            }),
        )
        .await
        .map(drop)
    }

    /// Activates an LV (`-K` so thin snapshots, which carry the
    /// activation-skip flag, activate too) and returns the device numbers
    /// the kernel gave it, read from device-mapper, not from another `lvs`.
    pub async fn activate(&self, name: &str) -> Result<(u32, u32)> {
        let args = crate::argv![
            "--activate",
            "y",
            "--ignoreactivationskip",
            self.lv_path(name)
        ];
        let _turn = self.writers.acquire().await;
        let started = self.change_begins();
        let res = self.run("lvchange", args.clone(), true).await;
        let kernel = match res {
            Ok(_) => self.kernel_numbers(name).await,
            Err(e) => Err(e),
        };
        let write = kernel.as_ref().ok().map(|k| Write::Activated {
            name: name.to_string(),
            kernel: *k,
        });
        // Logged and applied like every change; on failure the cache goes.
        self.change_done("lvchange", &args, started, kernel.as_ref().map(drop), write);
        match kernel {
            Ok(k) => Ok(k),
            Err(e) => Err(self.explain(e, Some(name)).await),
        }
    }

    /// The device numbers of the active LV `name`.
    async fn kernel_numbers(&self, name: &str) -> Result<(u32, u32)> {
        self.live_device(name).await?.ok_or_else(|| {
            Error::Internal(format!(
                "LVM activated {} but device-mapper shows no live device for it",
                self.lv_path(name)
            ))
        })
    }

    /// The device numbers of LV `name` if device-mapper has it live (one
    /// ioctl, no LVM command): whether it is active, whatever the cached
    /// report says.
    pub async fn live_device(&self, name: &str) -> Result<Option<(u32, u32)>> {
        let dm_name = lv_dm_name(&self.vg, name);
        crate::blocking::run("read an LV's device numbers", self.timeout, move || {
            Ok(crate::sys::dm_numbers(&dm_name)?)
        })
        .await
    }

    /// Removes tag `del` and adds tag `add` in one lvchange.
    pub async fn retag(&self, name: &str, del: Option<&str>, add: Option<&str>) -> Result<()> {
        let mut args = Vec::new();
        retag_args(&mut args, del, add);
        if args.is_empty() {
            return Ok(());
        }
        args.push(self.lv_path(name));
        let write = Write::Retagged {
            name: name.to_string(),
            del: del.map(str::to_string),
            add: add.map(str::to_string),
        };
        self.change_with("lvchange", args, Some(write))
            .await
            .map(drop)
    }

    /// Sets the LV's read-ahead (`auto` or sectors) and, in the same
    /// command, replaces tag `del` with `add` (each when given).
    pub async fn set_read_ahead(
        &self,
        name: &str,
        value: &str,
        del: Option<&str>,
        add: Option<&str>,
    ) -> Result<()> {
        let mut args = crate::argv!["--readahead", value];
        retag_args(&mut args, del, add);
        args.push(self.lv_path(name));
        self.change("lvchange", args).await.map(drop)
    }

    pub async fn deactivate(&self, name: &str) -> Result<()> {
        self.change_with(
            "lvchange",
            crate::argv!["--activate", "n", self.lv_path(name)],
            Some(Write::Deactivated(name.to_string())),
        )
        .await
        .map(drop)
    }
}

/// The device-mapper name LVM gives LV `lv` of VG `vg` (each `-` doubled,
/// then joined with `-`).
pub fn lv_dm_name(vg: &str, lv: &str) -> String {
    format!("{}-{}", vg.replace('-', "--"), lv.replace('-', "--"))
}

/// UNAVAILABLE: the configured volume group is not there.
fn vg_missing(vg: &str, e: &Error) -> Error {
    Error::Unavailable(format!("volume group {vg} does not exist on this node ({e})")).advise(
        "create it (vgcreate), configure [loop_pool] to let the driver build one, or fix volume_group in the config",
    )
}

/// The error of a failed write to LV `lv` (`None`: a write that names
/// none), given the report read right after it: a pool that cannot
/// allocate (out of data or metadata space: RESOURCE_EXHAUSTED; failed or
/// read-only: FAILED_PRECONDITION), a missing pool (UNAVAILABLE), or the LV
/// held open (FAILED_PRECONDITION); anything else keeps `err`.
pub fn explain(report: &Report, vg: &str, pool: &str, lv: Option<&str>, err: Error) -> Error {
    let Some(p) = report.find(pool).filter(|p| p.is_thin_pool()) else {
        return Error::Unavailable(format!("thin pool {vg}/{pool} does not exist ({err})"))
            .advise("create it, or fix thin_pool in the config");
    };
    if let Some(problem) = p.problem().or_else(|| room::at_lvm_limit(p)) {
        return problem.error(Some(&err));
    }
    if let Some(l) = lv.and_then(|n| report.find(n)) {
        if let Some(problem) = l.problem() {
            // An LV's own problems (failed, partial) are not about space:
            // FAILED_PRECONDITION.
            return problem.error(Some(&err));
        }
        if l.is_open() {
            return Error::FailedPrecondition(format!(
                "LV {vg}/{} is open (mounted, or held by a process or a device-mapper table) ({err})",
                l.name
            ))
            .advise("unmount or close it, then retry");
        }
    }
    err
}

/// `--addtag T` for each tag: tags are written by the command that makes
/// the LV.
fn add_tags(args: &mut Vec<String>, tags: &[String]) {
    for t in tags {
        args.push("--addtag".into());
        args.push(t.clone());
    }
}

/// `--deltag DEL --addtag ADD`, each when given.
fn retag_args(args: &mut Vec<String>, del: Option<&str>, add: Option<&str>) {
    if let Some(t) = del {
        args.extend(crate::argv!["--deltag", t]);
    }
    if let Some(t) = add {
        args.extend(crate::argv!["--addtag", t]);
    }
}

/// The `--select` of [`Lvm::remove_owned`]: this name, in this pool, with
/// this tag among its tags. Names and tags that could break out of the
/// quoted strings are refused (ours never do).
fn remove_selection(name: &str, pool: &str, tag: &str) -> Result<String> {
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+_.-/=!:&#".contains(c))
    };
    if !(plain(name) && plain(pool) && plain(tag)) {
        return Err(Error::Internal(format!(
            "cannot select LV {name:?} of pool {pool:?} by tag {tag:?}: unexpected characters"
        )));
    }
    Ok(format!(
        "lv_name=\"{name}\" && pool_lv=\"{pool}\" && lv_tags={{\"{tag}\"}}"
    ))
}

fn add_read_ahead(args: &mut Vec<String>, read_ahead: Option<&str>) {
    if let Some(r) = read_ahead {
        args.extend(crate::argv!["--readahead", r]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UdevMode;
    use std::path::{Path, PathBuf};

    fn lvm(udev: UdevMode) -> Lvm {
        let cfg = Config {
            udev,
            volume_group: "vg1".into(),
            ..Config::default()
        };
        Lvm::new(&cfg)
    }

    #[test]
    fn argv_adds_no_udev_settings_only_when_asked() {
        let a = lvm(UdevMode::Off).argv("lvs", crate::argv!["vg1"], false);
        assert_eq!(a[0], "lvs");
        assert_eq!(a[1], "--config");
        assert!(
            a[2].contains("udev_rules = 0") && a[2].contains("obtain_device_list_from_udev = 0")
        );
        assert!(a[2].contains(r#"time_format = "%s""#), "{}", a[2]);
        assert_eq!(a.last().unwrap(), "vg1");
        let on = lvm(UdevMode::On).argv("lvs", crate::argv!["vg1"], false);
        assert_eq!(on, vec!["lvs", "--config", REPORT_CONFIG, "vg1"]);
        assert!(!on[2].contains("udev"));
    }

    /// The subcommand and `--config` of each call a fake `lvm` got, for a
    /// removal, an extension and a report (its `lvs` prints no LV).
    async fn configs_passed(archive: bool, udev: UdevMode) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen");
        let body = format!(
            "echo \"$1 $3\" >> {seen}\n[ \"$1\" = lvs ] && echo '{{\"report\":[{{\"lv\":[]}}]}}'\nexit 0\n",
            seen = seen.display()
        );
        let lvm = script_lvm(dir.path(), &body, |c| {
            c.lvm_metadata_archive = archive;
            c.udev = udev;
        });
        lvm.remove_owned("csi-a", "tpcsi.owner=d").await.unwrap();
        lvm.extend("csi-a", 8 << 20).await.unwrap();
        lvm.fresh_report().await.unwrap();
        let seen = std::fs::read_to_string(&seen).unwrap();
        seen.lines().map(str::to_string).collect()
    }

    #[tokio::test]
    async fn writes_skip_the_metadata_archive_unless_configured() {
        let off = configs_passed(false, UdevMode::Off).await;
        assert_eq!(off.len(), 3, "{off:?}");
        for write in &off[..2] {
            assert!(write.ends_with(NO_ARCHIVE_CONFIG), "{write}");
            assert!(write.contains("udev_sync = 0"), "{write}");
        }
        assert!(off[2].starts_with("lvs "), "{off:?}");
        assert!(!off[2].contains("archive"), "a read: {}", off[2]);
        let on = configs_passed(true, UdevMode::On).await;
        assert_eq!(on.len(), 3, "{on:?}");
        assert!(on.iter().all(|c| !c.contains("archive")), "{on:?}");
    }

    /// An `Lvm` of VG `vg1` (udev on) whose binary is a shell script with
    /// `body`; `tweak` sets the rest of its config.
    fn script_lvm(dir: &Path, body: &str, tweak: impl FnOnce(&mut Config)) -> Arc<Lvm> {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("lvm");
        std::fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cfg = Config {
            lvm_binary: script.display().to_string(),
            udev: UdevMode::On,
            volume_group: "vg1".into(),
            // These fakes take one command per run; `fake_shell` speaks
            // the shell's protocol.
            lvm_shell: false,
            ..Config::default()
        };
        tweak(&mut cfg);
        Arc::new(Lvm::new(&cfg))
    }

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

    #[test]
    fn lv_dm_names_double_dashes() {
        assert_eq!(lv_dm_name("tpcsi-dev", "csi-a-1"), "tpcsi--dev-csi--a--1");
        assert_eq!(lv_dm_name("vg", "lv"), "vg-lv");
        assert_eq!(lv_dm_name("a-b", ""), "a--b-");
    }

    #[test]
    fn removal_selects_name_pool_and_owner_tag() {
        let s = remove_selection("csi-a-1", "pool", "tpcsi.owner=d.x").unwrap();
        assert_eq!(
            s,
            r#"lv_name="csi-a-1" && pool_lv="pool" && lv_tags={"tpcsi.owner=d.x"}"#
        );
        assert!(remove_selection("a\"b", "pool", "t").is_err());
        assert!(remove_selection("a", "pool", "t} || lv_name=x").is_err());
        assert!(remove_selection("", "pool", "t").is_err());
    }

    fn row(name: &str, attr: &str, pool: &str, health: &str, data: &str) -> String {
        format!(
            r#"{{"lv_name":"{name}","vg_name":"vg1","lv_attr":"{attr}","lv_size":"8388608","pool_lv":"{pool}","segtype":"x","data_percent":"{data}","metadata_percent":"1.00","lv_tags":"","lv_health_status":"{health}","lv_kernel_major":"-1","lv_kernel_minor":"-1","vg_extent_size":"4194304","vg_size":"16777216","vg_free":"0","chunk_size":"65536"}}"#
        )
    }

    fn report_of(rows: &[String]) -> Report {
        Report::parse(&format!(r#"{{"report":[{{"lv":[{}]}}]}}"#, rows.join(","))).unwrap()
    }

    fn failed(sub: &str) -> Error {
        Error::Command {
            program: "lvm".into(),
            argv: crate::argv![sub],
            code: Some(5),
            signal: None,
            stderr: "text that decides nothing".into(),
        }
    }

    /// A failed write is explained by the state read after it, and each
    /// cause gets its code; the command's own error is kept in the message.
    #[test]
    fn a_failed_write_is_explained_by_the_state_after_it() {
        use tonic::Code;
        let code = |r: &Report, lv: Option<&str>| {
            let e = explain(r, "vg1", "pool", lv, failed("lvcreate"));
            assert!(e.to_string().contains("lvm lvcreate failed"), "{e}");
            e.code()
        };
        let vol = |attr: &str| row("csi-a", attr, "pool", "", "1.00");
        let healthy = report_of(&[
            row("pool", "twi-aotz--", "", "", "10.00"),
            vol("Vwi-a-tz--"),
        ]);
        assert_eq!(code(&healthy, Some("csi-a")), Code::Internal);
        assert_eq!(code(&healthy, None), Code::Internal);
        let full = report_of(&[row("pool", "twi-aotzD-", "", "out_of_data", "100.00")]);
        assert_eq!(code(&full, Some("csi-new")), Code::ResourceExhausted);
        let e = explain(&full, "vg1", "pool", None, failed("lvcreate"));
        assert!(e.message().contains("extend it"), "says what to do: {e}");
        let meta_ro = report_of(&[row("pool", "twi-aotzM-", "", "metadata_read_only", "5.00")]);
        assert_eq!(code(&meta_ro, None), Code::FailedPrecondition);
        let failed_pool = report_of(&[row("pool", "twi-aotzF-", "", "failed", "5.00")]);
        assert_eq!(code(&failed_pool, None), Code::FailedPrecondition);
        // LVM's own limits, which no health flag shows: the pool's
        // metadata at 75 % of 4 MiB (the VM's refusal), and a VG metadata
        // area with 300 bytes left.
        let limits = |meta_percent: &str, mda_free: &str| {
            let pool = row("pool", "twi-aotz--", "", "", "10.00").replace(
                r#""metadata_percent":"1.00""#,
                &format!(
                    r#""metadata_percent":"{meta_percent}","lv_metadata_size":"4194304","vg_mda_size":"1044480","vg_mda_free":"{mda_free}""#
                ),
            );
            report_of(&[pool])
        };
        for (r, store) in [
            (limits("75.00", "500000"), "metadata is 75.0% used"),
            (limits("40.00", "300"), "metadata area is nearly full"),
        ] {
            let e = explain(&r, "vg1", "pool", Some("csi-new"), failed("lvcreate"));
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            assert!(e.message().contains(store), "{e}");
        }
        assert_eq!(code(&limits("74.00", "500000"), None), Code::Internal);
        let no_pool = report_of(&[row("other", "-wi-a-----", "", "", "")]);
        assert_eq!(code(&no_pool, None), Code::Unavailable);
        let open = report_of(&[
            row("pool", "twi-aotz--", "", "", "10.00"),
            vol("Vwi-aotz--"),
        ]);
        let e = explain(&open, "vg1", "pool", Some("csi-a"), failed("lvremove"));
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("unmount or close it"), "{e}");
        // Another error than a command's is never re-read.
        let timeout = Error::Timeout {
            program: "lvm".into(),
            argv: vec![],
            after: Duration::from_secs(1),
        };
        assert!(matches!(
            explain(&healthy, "vg1", "pool", None, timeout),
            Error::Timeout { .. }
        ));
    }

    /// A fake lvm whose `lvs` fails, and whose `vgs` lists the VGs named in
    /// the file `vgs` (one per line).
    fn fake_lvm_without_vg(dir: &Path, vgs: &[&str]) -> Arc<Lvm> {
        let rows: Vec<String> = vgs
            .iter()
            .map(|v| format!(r#"{{"vg_name":"{v}"}}"#))
            .collect();
        let body = format!(
            "case $1 in\n lvs) echo 'any words' >&2; exit 5 ;;\n vgs) echo '{{\"report\":[{{\"vg\":[{}]}}]}}' ;;\nesac\n",
            rows.join(",")
        );
        script_lvm(dir, &body, |_| {})
    }

    /// "VG not found" is decided by the list of VGs, not by lvs's words.
    #[tokio::test]
    async fn a_missing_vg_is_unavailable_and_an_lvs_failure_beside_it_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let gone = fake_lvm_without_vg(dir.path(), &["other"]);
        assert!(!gone.vg_exists().await.unwrap());
        let e = gone.fresh_report().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
        assert!(
            e.to_string().contains("volume group vg1 does not exist"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let there = fake_lvm_without_vg(dir.path(), &["other", "vg1"]);
        assert!(there.vg_exists().await.unwrap());
        let e = there.fresh_report().await.unwrap_err();
        assert!(matches!(e, Error::Command { code: Some(5), .. }), "{e:?}");
    }

    /// lvm itself missing: FAILED_PRECONDITION naming lvm2.
    #[tokio::test]
    async fn a_missing_lvm_binary_names_its_package() {
        let cfg = Config {
            lvm_binary: "/nonexistent/lvm".into(),
            ..Config::default()
        };
        let e = Arc::new(Lvm::new(&cfg)).fresh_report().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.to_string().contains("lvm2"), "{e}");
    }
}
