//! The LVM layer: every LVM command goes through [`Lvm::run`] (an argv, a
//! timeout, `LVM_SUPPRESS_FD_WARNINGS=1`, stderr in the error), and every
//! read goes through one cached `lvs` report of our volume group.
//!
//! The cache is kept current by applying our own writes to it
//! ([`report::Write`]); a failed write drops it. It is read again after
//! `report_max_age` so that changes made behind the driver's back are
//! seen, and readers that miss it share one `lvs` (single flight).

mod cache;
pub use cache::Cached;
mod commands;
pub mod explain;
pub mod report;
pub mod room;
pub mod shell;
#[cfg(test)]
mod testutil;
pub mod thin;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{self, Output};
use cache::{Cache, RECENT_WRITES};
use report::Write;

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
    /// Bumped when the cached report changes.
    pub changes: Changes,
}

/// How many LVM commands that change something run at once.
const WRITERS: usize = 2;

/// A node's change counter: bumped whenever what GetCapacity answers from
/// may have changed (a report kept or dropped, a write of ours ended, a
/// reservation taken or released), shared by every device class of the
/// node. The cluster's controller keeps the node's capacity from a stream
/// of these (`grpc::cluster`) and reads the counter in the header of every
/// answer (`channel::GENERATION_HEADER`), so it never answers from a
/// state older than a change it has seen.
///
/// It starts at the process's start time in microseconds since the
/// epoch, so a restarted node counts on from above what it counted
/// before (unless it changed more than a million times a second).
#[derive(Clone, Debug)]
pub struct Changes(Arc<tokio::sync::watch::Sender<u64>>);

impl Default for Changes {
    fn default() -> Changes {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        Changes(Arc::new(tokio::sync::watch::Sender::new(start)))
    }
}

impl Changes {
    /// Counts one change and wakes the watchers.
    pub fn bump(&self) {
        self.0.send_modify(|g| *g += 1);
    }

    /// The counter now.
    pub fn now(&self) -> u64 {
        *self.0.borrow()
    }

    /// A receiver that wakes at the next change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl Lvm {
    pub fn new(cfg: &Config) -> Lvm {
        Lvm::counting(cfg, Changes::default())
    }

    /// An `Lvm` whose report changes count in `changes` (the node's).
    pub fn counting(cfg: &Config, changes: Changes) -> Lvm {
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
            changes,
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
                let g = c.generation;
                c.recent.push_back((g, w));
                // In place now unless a caller holds the report (it often
                // does, across its own write): then at the next read.
                c.apply_pending(false);
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
        self.changes.bump();
        match res {
            Ok(()) => tracing::info!(subcommand, ?args, elapsed = ?started.elapsed(), "lvm: done"),
            Err(e) => tracing::warn!(subcommand, ?args, error = %e, "lvm: failed"),
        }
    }

    pub fn lv_path(&self, lv: &str) -> String {
        format!("{}/{}", self.vg, lv)
    }

    pub fn dev_path(&self, lv: &str) -> String {
        format!("/dev/{}/{}", self.vg, lv)
    }
}

/// The device-mapper name LVM gives LV `lv` of VG `vg` (each `-` doubled,
/// then joined with `-`).
pub fn lv_dm_name(vg: &str, lv: &str) -> String {
    format!("{}-{}", vg.replace('-', "--"), lv.replace('-', "--"))
}

#[cfg(test)]
mod tests {
    use super::testutil::script_lvm;
    use super::*;
    use crate::config::UdevMode;

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

    #[test]
    fn lv_dm_names_double_dashes() {
        assert_eq!(lv_dm_name("tpcsi-dev", "csi-a-1"), "tpcsi--dev-csi--a--1");
        assert_eq!(lv_dm_name("vg", "lv"), "vg-lv");
        assert_eq!(lv_dm_name("a-b", ""), "a--b-");
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
