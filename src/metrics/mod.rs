//! Prometheus metrics: what the driver counts as it serves calls
//! ([`Metrics`]: per-RPC counts, errors by gRPC code, latency histograms,
//! reclaimed bytes), and what a scrape reads from the cached `lvs` report
//! (pool size, Data%, Metadata%, free space, volume and snapshot counts),
//! which the volume layer hands to [`render`] as a [`Scrape`]: this module
//! knows reports and counters, not the driver.
//!
//! Counting costs an uncontended mutex per RPC; everything else is done
//! only when somebody scrapes (`http` serves `/metrics` when
//! `metrics_address` is set), and a scrape reads the pool from
//! `Lvm::report`, which runs `lvs` at most once per `report_max_age_secs`
//! and not at all while the cached report is current.

pub mod http;
pub mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use text::{Histogram, Kind, Text};
use tonic::Code;

use crate::lvm::report::Lv;
use crate::lvm::room::Room;

/// Upper bounds of the RPC latency buckets, in seconds: from Probe's
/// milliseconds to LVM commands under load and long reclaims.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Distinct (service, method) pairs kept; calls beyond are counted under
/// `other`, so no client can grow the exposition without bound.
const MAX_METHODS: usize = 128;

/// Every metric name this driver exports, with its type and help text.
pub const NAMES: &[(&str, Kind, &str)] = &[
    (POOL_UP, Kind::Gauge, "1 when the last LVM report shows the thin pool, 0 when it could not be read or the pool is missing."),
    (POOL_SIZE, Kind::Gauge, "Size of the thin pool's data, in bytes."),
    (POOL_DATA, Kind::Gauge, "Data% of the thin pool: share of its data space in use (0-100)."),
    (POOL_META, Kind::Gauge, "Metadata% of the thin pool: share of its metadata space in use (0-100). A pool whose metadata fills needs an offline repair."),
    (POOL_PHYS_FREE, Kind::Gauge, "Bytes the thin pool can still hold physically, at its current Data%."),
    (POOL_VIRT_FREE, Kind::Gauge, "Overprovisioned headroom: overprovision_ratio x pool size - sum of the virtual sizes handed out, in bytes (GetCapacity's maximum_volume_size while the pool is usable)."),
    (POOL_USABLE, Kind::Gauge, "1 when the pool accepts new allocations, 0 while it is full, failed or its metadata is read-only or full, or no new LV fits in its metadata or the VG's metadata area."),
    (POOL_META_SIZE, Kind::Gauge, "Size of the thin pool's metadata LV, in bytes."),
    (VG_MDA_SIZE, Kind::Gauge, "Size of the volume group's metadata area (the smallest of its PVs'), in bytes."),
    (VG_MDA_FREE, Kind::Gauge, "What is left of the half of the VG's metadata area that LVM can use (it keeps two copies), in bytes (vg_mda_free)."),
    (LVS_LEFT, Kind::Gauge, "Volumes and snapshots that still fit before LVM refuses one, by store: pool (the thin pool's metadata) or vg (the VG's metadata area); the driver stops metadata_reserve_lvs earlier."),
    (VOLUMES, Kind::Gauge, "Volumes of this driver in the pool, as ListVolumes counts them."),
    (SNAPSHOTS, Kind::Gauge, "Snapshots of this driver in the pool, as ListSnapshots counts them."),
    (AUTOPILOT_GROWTHS, Kind::Counter, "Growths the thin-pool autopilot made, by store: data, metadata (the pool's) or backing_file (a loop-backed VG's file, loop device and PV)."),
    (AUTOPILOT_REFUSALS, Kind::Counter, "Times the thin-pool autopilot had to grow the pool and could not (VG or host full, or at a limit)."),
    (AUTOPILOT_BLOCKED, Kind::Gauge, "1 while the pool is past an autopilot threshold and the autopilot cannot grow it; the volumes' conditions say why."),
    (RPC_REQUESTS, Kind::Counter, "gRPC calls served, by service and method."),
    (RPC_ERRORS, Kind::Counter, "gRPC calls that ended in an error, by service, method and gRPC code."),
    (RPC_DURATION, Kind::Histogram, "Duration of gRPC calls, by service and method, in seconds."),
    (RECLAIMED, Kind::Counter, "Bytes given back to the pool by ReclaimSpace (usage before minus usage after, summed)."),
    (CHANNEL_REFUSED, Kind::Counter, "Connections to the internal channel (cluster.listen) refused in the mutual TLS handshake (no client certificate, one the cluster CA did not sign, plain text, or no handshake in time), and calls of a peer node plugin refused for being anything but a granted snapshot read."),
    (COPY_BYTES, Kind::Counter, "Bytes a copy from another node wrote into this node's volumes, each range after its hash matched (docs/moving.md)."),
    (COPIES_FILLING, Kind::Gauge, "Copies from another node this node is filling now."),
    (IO_UNENFORCED, Kind::Counter, "Times a volume's I/O limits could not be set in a pod's cgroup (no cgroup v2, no io controller, no pod cgroup); the volume is served and its condition says so."),
];

pub const POOL_UP: &str = "thinpool_csi_pool_up";
pub const POOL_SIZE: &str = "thinpool_csi_pool_size_bytes";
pub const POOL_DATA: &str = "thinpool_csi_pool_data_percent";
pub const POOL_META: &str = "thinpool_csi_pool_metadata_percent";
pub const POOL_PHYS_FREE: &str = "thinpool_csi_pool_physical_free_bytes";
pub const POOL_VIRT_FREE: &str = "thinpool_csi_pool_overprovisioned_free_bytes";
pub const POOL_USABLE: &str = "thinpool_csi_pool_usable";
pub const POOL_META_SIZE: &str = "thinpool_csi_pool_metadata_size_bytes";
pub const VG_MDA_SIZE: &str = "thinpool_csi_vg_metadata_area_size_bytes";
pub const VG_MDA_FREE: &str = "thinpool_csi_vg_metadata_area_free_bytes";
pub const LVS_LEFT: &str = "thinpool_csi_metadata_lvs_left";
pub const VOLUMES: &str = "thinpool_csi_volumes";
pub const SNAPSHOTS: &str = "thinpool_csi_snapshots";
pub const AUTOPILOT_GROWTHS: &str = "thinpool_csi_autopilot_growths_total";
pub const AUTOPILOT_REFUSALS: &str = "thinpool_csi_autopilot_refusals_total";
pub const AUTOPILOT_BLOCKED: &str = "thinpool_csi_autopilot_blocked";
pub const RPC_REQUESTS: &str = "thinpool_csi_rpc_requests_total";
pub const RPC_ERRORS: &str = "thinpool_csi_rpc_errors_total";
pub const RPC_DURATION: &str = "thinpool_csi_rpc_duration_seconds";
pub const RECLAIMED: &str = "thinpool_csi_reclaimed_bytes_total";
pub const IO_UNENFORCED: &str = "thinpool_csi_io_limits_unenforced_total";
pub const CHANNEL_REFUSED: &str = "thinpool_csi_channel_refused_total";
pub const COPY_BYTES: &str = "thinpool_csi_copy_bytes_total";
pub const COPIES_FILLING: &str = "thinpool_csi_copies_filling";

/// What the driver counts while it serves.
#[derive(Default)]
pub struct Metrics {
    rpcs: Mutex<BTreeMap<(String, String), MethodStats>>,
    reclaimed: AtomicU64,
    io_unenforced: AtomicU64,
    channel_refused: AtomicU64,
    copy_bytes: AtomicU64,
    copies_filling: AtomicU64,
}

struct MethodStats {
    requests: u64,
    errors: BTreeMap<&'static str, u64>,
    latency: Histogram,
}

impl Metrics {
    /// One finished gRPC call.
    pub fn rpc(&self, service: &str, method: &str, code: Code, elapsed: Duration) {
        let mut rpcs = self.rpcs.lock().unwrap();
        let mut key = (service.to_string(), method.to_string());
        if !rpcs.contains_key(&key) && rpcs.len() >= MAX_METHODS {
            key = ("other".into(), "other".into());
        }
        let s = rpcs.entry(key).or_insert_with(|| MethodStats {
            requests: 0,
            errors: BTreeMap::new(),
            latency: Histogram::new(LATENCY_BOUNDS),
        });
        s.requests += 1;
        if code != Code::Ok {
            *s.errors.entry(code_name(code)).or_default() += 1;
        }
        s.latency.observe(elapsed.as_secs_f64());
    }

    /// A ReclaimSpace that took the volume's usage from `pre` to `post`.
    pub fn reclaimed(&self, pre: u64, post: u64) {
        self.reclaimed
            .fetch_add(pre.saturating_sub(post), Ordering::Relaxed);
    }

    /// A volume's I/O limits that could not be set.
    pub fn io_limits_unenforced(&self) {
        self.io_unenforced.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection to the internal channel refused in its handshake.
    pub fn channel_refused(&self) {
        self.channel_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// `bytes` of a copy from another node written, checked.
    pub fn copied(&self, bytes: u64) {
        self.copy_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// One more copy being filled, until the guard is dropped.
    pub fn filling(self: &std::sync::Arc<Self>) -> Filling {
        self.copies_filling.fetch_add(1, Ordering::Relaxed);
        Filling(self.clone())
    }

    /// The counters, in the text format.
    pub(crate) fn write(&self, t: &mut Text) {
        let rpcs = self.rpcs.lock().unwrap();
        family(t, RPC_REQUESTS);
        for ((svc, m), s) in rpcs.iter() {
            t.sample(
                RPC_REQUESTS,
                &[("service", svc), ("method", m)],
                s.requests as f64,
            );
        }
        family(t, RPC_ERRORS);
        for ((svc, m), s) in rpcs.iter() {
            for (code, n) in &s.errors {
                t.sample(
                    RPC_ERRORS,
                    &[("service", svc), ("method", m), ("code", code)],
                    *n as f64,
                );
            }
        }
        family(t, RPC_DURATION);
        for ((svc, m), s) in rpcs.iter() {
            t.histogram(RPC_DURATION, &[("service", svc), ("method", m)], &s.latency);
        }
        for (name, counter) in [
            (RECLAIMED, &self.reclaimed),
            (IO_UNENFORCED, &self.io_unenforced),
            (CHANNEL_REFUSED, &self.channel_refused),
            (COPY_BYTES, &self.copy_bytes),
            (COPIES_FILLING, &self.copies_filling),
        ] {
            family(t, name);
            t.sample(name, &[], counter.load(Ordering::Relaxed) as f64);
        }
    }
}

/// A copy being filled ([`Metrics::filling`]), counted while it lives.
pub struct Filling(std::sync::Arc<Metrics>);

impl Drop for Filling {
    fn drop(&mut self) {
        self.0.copies_filling.fetch_sub(1, Ordering::Relaxed);
    }
}

fn family(t: &mut Text, name: &str) {
    let (_, kind, help) = NAMES
        .iter()
        .find(|(n, _, _)| *n == name)
        .expect("every metric is listed in NAMES");
    t.family(name, *kind, help);
}

/// A pool as a scrape shows it, read by the volume layer from its cached
/// report (`Volumes::scrape`, `Classes::exposition`).
pub struct PoolFigures<'a> {
    pub lv: &'a Lv,
    /// Bytes the pool can still hold physically, at its current Data%.
    pub physical_free: u64,
    /// overprovision_ratio x pool size - virtual sizes handed out.
    pub virtual_headroom: u64,
    /// Whether the pool takes new allocations.
    pub usable: bool,
    pub room: Option<Room>,
}

/// What one scrape shows of a device class: `None` for a report that
/// could not be read; `pool: None` for a report without a usable pool.
pub struct Scrape<'a> {
    pub pool: Option<PoolFigures<'a>>,
    pub volumes: usize,
    pub snapshots: usize,
    /// `None` when the class's autopilot is off.
    pub autopilot: Option<AutopilotFigures>,
}

/// What the thin-pool autopilot of a class did (`volume::autopilot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutopilotFigures {
    pub data_growths: u64,
    pub metadata_growths: u64,
    pub backing_growths: u64,
    pub refusals: u64,
    pub blocked: bool,
}

/// One sample: its family, its labels, its value.
type Sample = (&'static str, Vec<(&'static str, String)>, f64);

/// The samples of device class `class`, each labelled with it. Figures
/// LVM did not report (an inactive pool's Data%, a metadata area it did
/// not size) are left out, not reported as 0.
fn class_samples(class: &str, scrape: Option<&Scrape>, out: &mut Vec<Sample>) {
    let mut add = |name: &'static str, store: Option<&str>, v: f64| {
        let mut labels = vec![("class", class.to_string())];
        labels.extend(store.map(|s| ("store", s.to_string())));
        out.push((name, labels, v));
    };
    let Some(s) = scrape else {
        add(POOL_UP, None, 0.0);
        return;
    };
    match &s.pool {
        Some(p) => {
            add(POOL_UP, None, 1.0);
            add(POOL_SIZE, None, p.lv.size as f64);
            if let Some(pct) = p.lv.data_percent {
                add(POOL_DATA, None, pct);
            }
            if let Some(pct) = p.lv.metadata_percent {
                add(POOL_META, None, pct);
            }
            add(POOL_PHYS_FREE, None, p.physical_free as f64);
            add(POOL_VIRT_FREE, None, p.virtual_headroom as f64);
            add(POOL_USABLE, None, if p.usable { 1.0 } else { 0.0 });
            if p.lv.metadata_size > 0 {
                add(POOL_META_SIZE, None, p.lv.metadata_size as f64);
            }
            if p.lv.vg_mda_size > 0 {
                add(VG_MDA_SIZE, None, p.lv.vg_mda_size as f64);
                add(VG_MDA_FREE, None, p.lv.vg_mda_free as f64);
            }
            if let Some(room) = &p.room {
                for (store, n) in [("pool", room.pool_lvs_left()), ("vg", room.vg_lvs_left())] {
                    if let Some(n) = n {
                        add(LVS_LEFT, Some(store), n as f64);
                    }
                }
            }
        }
        None => add(POOL_UP, None, 0.0),
    }
    add(VOLUMES, None, s.volumes as f64);
    add(SNAPSHOTS, None, s.snapshots as f64);
    if let Some(a) = &s.autopilot {
        for (store, n) in [
            ("data", a.data_growths),
            ("metadata", a.metadata_growths),
            ("backing_file", a.backing_growths),
        ] {
            add(AUTOPILOT_GROWTHS, Some(store), n as f64);
        }
        add(AUTOPILOT_REFUSALS, None, a.refusals as f64);
        add(AUTOPILOT_BLOCKED, None, if a.blocked { 1.0 } else { 0.0 });
    }
}

/// The whole exposition: each device class's pool and contents (labelled
/// `class`), then the counters.
pub fn render(classes: &[(&str, Option<Scrape>)], counters: &Metrics) -> String {
    let mut samples = Vec::new();
    for (class, scrape) in classes {
        class_samples(class, scrape.as_ref(), &mut samples);
    }
    let mut t = Text::default();
    for (name, _, _) in NAMES {
        let mut first = true;
        for (_, labels, v) in samples.iter().filter(|s| s.0 == *name) {
            if std::mem::take(&mut first) {
                family(&mut t, name);
            }
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            t.sample(name, &labels, *v);
        }
    }
    counters.write(&mut t);
    t.finish()
}

/// The canonical upper-case name of a gRPC code (`NOT_FOUND`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_counts_errors_and_latency() {
        let m = Metrics::default();
        let ms = Duration::from_millis;
        m.rpc("csi.v1.Controller", "DeleteVolume", Code::Ok, ms(3));
        m.rpc("csi.v1.Controller", "DeleteVolume", Code::NotFound, ms(40));
        m.rpc("csi.v1.Controller", "DeleteVolume", Code::NotFound, ms(700));
        m.rpc("csi.v1.Identity", "Probe", Code::Ok, ms(1));
        m.reclaimed(10 << 20, 4 << 20);
        // Usage that grew meanwhile reclaimed nothing; it never subtracts.
        m.reclaimed(1 << 20, 2 << 20);
        let mut t = Text::default();
        m.write(&mut t);
        let s = t.finish();
        let del = r#"service="csi.v1.Controller",method="DeleteVolume""#;
        for line in [
            format!("thinpool_csi_rpc_requests_total{{{del}}} 3"),
            r#"thinpool_csi_rpc_requests_total{service="csi.v1.Identity",method="Probe"} 1"#
                .to_string(),
            format!("thinpool_csi_rpc_errors_total{{{del},code=\"NOT_FOUND\"}} 2"),
            format!("thinpool_csi_rpc_duration_seconds_bucket{{{del},le=\"0.005\"}} 1"),
            format!("thinpool_csi_rpc_duration_seconds_bucket{{{del},le=\"0.05\"}} 2"),
            format!("thinpool_csi_rpc_duration_seconds_bucket{{{del},le=\"1\"}} 3"),
            format!("thinpool_csi_rpc_duration_seconds_bucket{{{del},le=\"+Inf\"}} 3"),
            format!("thinpool_csi_rpc_duration_seconds_count{{{del}}} 3"),
            "thinpool_csi_reclaimed_bytes_total 6291456".to_string(),
        ] {
            assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
        }
        // OK is no error; a method without errors has no error series.
        assert!(!s.contains("code=\"OK\""), "{s}");
        assert!(!s.contains("errors_total{service=\"csi.v1.Identity\""));
        // Each family's HELP and TYPE come once.
        assert_eq!(
            s.matches("# TYPE thinpool_csi_rpc_duration_seconds histogram")
                .count(),
            1
        );
    }

    #[test]
    fn copies_count_their_bytes_and_are_counted_while_they_fill() {
        let m = std::sync::Arc::new(Metrics::default());
        let value = |m: &Metrics, name: &str| {
            render(&[], m)
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let a = m.filling();
        let b = m.filling();
        m.copied(1000);
        m.copied(24);
        assert_eq!(value(&m, COPIES_FILLING), 2.0);
        assert_eq!(value(&m, COPY_BYTES), 1024.0);
        drop(a);
        drop(b);
        assert_eq!(
            value(&m, COPIES_FILLING),
            0.0,
            "a copy that ends is no longer counted"
        );
    }

    #[test]
    fn methods_are_bounded() {
        let m = Metrics::default();
        for i in 0..MAX_METHODS + 10 {
            m.rpc("x", &format!("M{i}"), Code::Unimplemented, Duration::ZERO);
        }
        let n = m.rpcs.lock().unwrap().len();
        assert_eq!(n, MAX_METHODS + 1);
        let mut t = Text::default();
        m.write(&mut t);
        assert!(t
            .finish()
            .contains(r#"thinpool_csi_rpc_requests_total{service="other",method="other"} 10"#));
    }

    /// A class whose autopilot is on shows its growths by store, its
    /// refusals and whether it is blocked; one whose autopilot is off
    /// shows none of these.
    #[test]
    fn the_autopilot_figures_are_per_class_and_only_when_on() {
        let m = Metrics::default();
        let on = Scrape {
            pool: None,
            volumes: 0,
            snapshots: 0,
            autopilot: Some(AutopilotFigures {
                data_growths: 3,
                metadata_growths: 1,
                backing_growths: 2,
                refusals: 4,
                blocked: true,
            }),
        };
        let off = Scrape {
            autopilot: None,
            ..Scrape {
                pool: None,
                volumes: 0,
                snapshots: 0,
                autopilot: None,
            }
        };
        let s = render(&[("fast", Some(on)), ("default", Some(off))], &m);
        for line in [
            "thinpool_csi_autopilot_growths_total{class=\"fast\",store=\"data\"} 3",
            "thinpool_csi_autopilot_growths_total{class=\"fast\",store=\"backing_file\"} 2",
            "thinpool_csi_autopilot_refusals_total{class=\"fast\"} 4",
            "thinpool_csi_autopilot_blocked{class=\"fast\"} 1",
        ] {
            assert!(s.contains(line), "{line} missing:\n{s}");
        }
        assert!(!s.contains("autopilot_blocked{class=\"default\"}"), "{s}");
    }

    /// Without an LVM report a scrape still answers: pool_up 0 and the
    /// counters, no pool figures; each class has its own series.
    #[test]
    fn a_scrape_without_lvm_reports_the_pool_down() {
        let m = Metrics::default();
        m.rpc("csi.v1.Identity", "Probe", Code::Ok, Duration::ZERO);
        let empty = || Scrape {
            pool: None,
            volumes: 0,
            snapshots: 3,
            autopilot: None,
        };
        let s = render(&[("default", None), ("fast", Some(empty()))], &m);
        assert!(
            s.contains("\nthinpool_csi_pool_up{class=\"default\"} 0\n"),
            "{s}"
        );
        assert!(
            s.contains("\nthinpool_csi_pool_up{class=\"fast\"} 0\n"),
            "{s}"
        );
        assert!(
            s.contains("\nthinpool_csi_snapshots{class=\"fast\"} 3\n"),
            "{s}"
        );
        assert!(!s.contains("snapshots{class=\"default\"}"), "{s}");
        assert_eq!(
            s.matches("# TYPE thinpool_csi_pool_up gauge").count(),
            1,
            "{s}"
        );
        assert!(!s.contains(POOL_SIZE), "{s}");
        assert!(s.contains("thinpool_csi_rpc_requests_total{"), "{s}");
    }

    /// The shipped alert rules and dashboard use only metrics this driver
    /// exports (histograms with their `_bucket`, `_sum`, `_count`).
    #[test]
    fn deploy_files_name_exported_metrics() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let known = |name: &str| {
            NAMES.iter().any(|(n, kind, _)| {
                name == *n
                    || (*kind == Kind::Histogram
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| name == format!("{n}{suffix}")))
            })
        };
        for f in [
            "deploy/kubernetes/components/monitoring/prometheus-rules.yaml",
            "deploy/kubernetes/components/monitoring/grafana-dashboard.json",
        ] {
            let text = std::fs::read_to_string(root.join(f)).unwrap();
            let used: Vec<&str> = text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("thinpool_csi_"))
                .collect();
            assert!(!used.is_empty(), "{f} names no metric");
            for name in &used {
                assert!(
                    known(name),
                    "{f} uses {name}, which the driver does not export"
                );
            }
            // Both Data% and Metadata% are watched.
            for name in [POOL_DATA, POOL_META] {
                assert!(used.contains(&name), "{f} does not use {name}");
            }
        }
        let dash: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                root.join("deploy/kubernetes/components/monitoring/grafana-dashboard.json"),
            )
            .unwrap(),
        )
        .expect("the dashboard is JSON");
        assert!(dash["panels"].as_array().is_some_and(|p| !p.is_empty()));
    }
}
