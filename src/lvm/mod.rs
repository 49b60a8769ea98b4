//! The LVM layer: every LVM command goes through [`Lvm::run`] (an argv, a
//! timeout, `LVM_SUPPRESS_FD_WARNINGS=1`, stderr in the error), and every
//! read goes through one cached `lvs` report of our volume group.
//!
//! The cache is invalidated by our own writes, and refreshed after
//! `report_max_age` so that Data% written by workloads is seen.

pub mod report;
pub mod thin;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{self, Output};
use report::Report;

/// Every command reports times as seconds since the epoch, whatever the
/// node's lvm.conf says.
const REPORT_CONFIG: &str = "report { time_format = \"%s\" }";

/// Settings that let LVM work where no udevd runs (containers, our VM):
/// libdevmapper then creates /dev/mapper and /dev/VG/LV nodes itself.
const NO_UDEV_CONFIG: &str = "activation { udev_rules = 0 udev_sync = 0 } \
devices { obtain_device_list_from_udev = 0 }";

pub struct Lvm {
    binary: String,
    pub vg: String,
    pub pool: String,
    timeout: Duration,
    no_udev: bool,
    max_age: Duration,
    cache: Mutex<Cache>,
    /// A pool holds one metadata snapshot at a time (`thin`).
    metadata_lock: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Cache {
    report: Option<(Instant, Arc<Report>)>,
    /// Bumped by every write, so a report read while a write ran is not
    /// stored as current.
    generation: u64,
}

impl Lvm {
    pub fn new(cfg: &Config) -> Lvm {
        Lvm {
            binary: cfg.lvm_binary.clone(),
            vg: cfg.volume_group.clone(),
            pool: cfg.thin_pool.clone(),
            timeout: cfg.command_timeout(),
            no_udev: cfg.no_udev(),
            max_age: Duration::from_secs(cfg.report_max_age_secs),
            cache: Mutex::new(Cache::default()),
            metadata_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// `lvm <subcommand> [--config ...] args...`.
    pub fn argv(&self, subcommand: &str, args: Vec<String>) -> Vec<String> {
        let config = if self.no_udev {
            format!("{REPORT_CONFIG} {NO_UDEV_CONFIG}")
        } else {
            REPORT_CONFIG.to_string()
        };
        let mut argv = vec![subcommand.to_string(), "--config".into(), config];
        argv.extend(args);
        argv
    }

    /// Runs a read-only LVM command.
    pub async fn query(&self, subcommand: &str, args: Vec<String>) -> Result<Output> {
        let argv = self.argv(subcommand, args);
        exec::run_with(
            &self.binary,
            &argv,
            &[("LVM_SUPPRESS_FD_WARNINGS", "1")],
            self.timeout,
            exec::Stop::Interrupt,
        )
        .await
    }

    /// Runs an LVM command that changes state: logged, and the cached
    /// report is dropped before and after.
    pub async fn change(&self, subcommand: &str, args: Vec<String>) -> Result<Output> {
        self.invalidate();
        let started = Instant::now();
        let res = self.query(subcommand, args.clone()).await;
        self.invalidate();
        match &res {
            Ok(_) => tracing::info!(subcommand, ?args, elapsed = ?started.elapsed(), "lvm: done"),
            Err(e) => tracing::warn!(subcommand, ?args, error = %e, "lvm: failed"),
        }
        res
    }

    pub fn invalidate(&self) {
        let mut c = self.cache.lock().unwrap();
        c.generation += 1;
        c.report = None;
    }

    /// The report of our VG, from the cache when it is fresh enough.
    pub async fn report(&self) -> Result<Arc<Report>> {
        {
            let c = self.cache.lock().unwrap();
            if let Some((at, r)) = &c.report {
                if at.elapsed() <= self.max_age {
                    return Ok(r.clone());
                }
            }
        }
        self.fresh_report().await
    }

    /// Always asks LVM; used before destructive decisions.
    pub async fn fresh_report(&self) -> Result<Arc<Report>> {
        let generation = self.cache.lock().unwrap().generation;
        let out = self
            .query("lvs", report::lvs_args(&self.vg))
            .await
            .map_err(|e| match e {
                Error::Command { stderr, .. } if stderr.contains("not found") => {
                    Error::Unavailable(format!("volume group {} not found: {stderr}", self.vg))
                }
                other => other,
            })?;
        let report = Arc::new(Report::parse(&out.stdout)?);
        let mut c = self.cache.lock().unwrap();
        if c.generation == generation {
            c.report = Some((Instant::now(), report.clone()));
        }
        Ok(report)
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
        self.change("lvcreate", args).await.map(drop)
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
        self.change("lvremove", crate::argv!["--yes", self.lv_path(name)])
            .await
            .map(drop)
    }

    pub async fn extend(&self, name: &str, size: u64) -> Result<()> {
        self.change(
            "lvextend",
            crate::argv!["--size", format!("{size}b"), self.lv_path(name)],
        )
        .await
        .map(drop)
    }

    /// Activates an LV (`-K` so thin snapshots, which carry the
    /// activation-skip flag, activate too).
    pub async fn activate(&self, name: &str) -> Result<()> {
        self.change(
            "lvchange",
            crate::argv![
                "--activate",
                "y",
                "--ignoreactivationskip",
                self.lv_path(name)
            ],
        )
        .await
        .map(drop)
    }

    /// Removes tag `del` and adds tag `add` in one lvchange.
    pub async fn retag(&self, name: &str, del: Option<&str>, add: Option<&str>) -> Result<()> {
        let mut args = Vec::new();
        retag_args(&mut args, del, add);
        if args.is_empty() {
            return Ok(());
        }
        args.push(self.lv_path(name));
        self.change("lvchange", args).await.map(drop)
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
        self.change(
            "lvchange",
            crate::argv!["--activate", "n", self.lv_path(name)],
        )
        .await
        .map(drop)
    }
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

fn add_read_ahead(args: &mut Vec<String>, read_ahead: Option<&str>) {
    if let Some(r) = read_ahead {
        args.extend(crate::argv!["--readahead", r]);
    }
}

#[cfg(test)]
mod tests {
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
        let a = lvm(UdevMode::Off).argv("lvs", crate::argv!["vg1"]);
        assert_eq!(a[0], "lvs");
        assert_eq!(a[1], "--config");
        assert!(
            a[2].contains("udev_rules = 0") && a[2].contains("obtain_device_list_from_udev = 0")
        );
        assert!(a[2].contains(r#"time_format = "%s""#), "{}", a[2]);
        assert_eq!(a.last().unwrap(), "vg1");
        let on = lvm(UdevMode::On).argv("lvs", crate::argv!["vg1"]);
        assert_eq!(on, vec!["lvs", "--config", REPORT_CONFIG, "vg1"]);
        assert!(!on[2].contains("udev"));
    }

    #[tokio::test]
    async fn cache_serves_until_invalidated() {
        // A fake `lvm` that counts its calls in a file and prints a report.
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let script = dir.path().join("lvm");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho x >> {}\necho '{{\"report\":[{{\"lv\":[]}}]}}'\n",
                count.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = Config {
            lvm_binary: script.display().to_string(),
            udev: UdevMode::On,
            report_max_age_secs: 3600,
            ..Config::default()
        };
        let lvm = Lvm::new(&cfg);
        let calls = || std::fs::read_to_string(&count).unwrap().lines().count();
        lvm.report().await.unwrap();
        lvm.report().await.unwrap();
        assert_eq!(calls(), 1, "second read must come from the cache");
        lvm.invalidate();
        lvm.report().await.unwrap();
        assert_eq!(calls(), 2);
        lvm.fresh_report().await.unwrap();
        assert_eq!(calls(), 3);
        lvm.report().await.unwrap();
        assert_eq!(calls(), 3);
    }
}
