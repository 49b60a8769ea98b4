//! Driver configuration: a TOML file with documented defaults
//! (`config/defaults.toml`), overridden for the socket by `CSI_ENDPOINT`.
//! Unknown keys and bad values stop start-up with an error naming the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::naming;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// CSI driver name, domain style (`GetPluginInfo.name`).
    pub driver_name: String,
    /// Node id reported by NodeGetInfo and used in topology; empty = hostname.
    pub node_id: String,
    /// Listen address (`unix:///path`). `CSI_ENDPOINT` and `--endpoint` win.
    pub endpoint: String,
    pub volume_group: String,
    pub thin_pool: String,
    /// Sum of virtual sizes may reach this multiple of the pool's data size.
    pub overprovision_ratio: f64,
    pub default_fs_type: String,
    /// mkfs options per filesystem for new volumes (`fs_options`' lists); a
    /// StorageClass's `mkfsOptions` replaces them.
    pub mkfs_options: PerFs<String>,
    /// Mount options per filesystem, before the CO's mount flags.
    pub mount_options: PerFs<Vec<String>>,
    /// Size of a volume whose CreateVolume gives no capacity range.
    #[serde(deserialize_with = "de_size")]
    pub default_volume_size: u64,
    /// Timeout for any external command (lvm, mkfs, ...), in seconds.
    pub command_timeout_secs: u64,
    /// How long a cached LVM report may serve reads before it is refreshed.
    /// Our own writes invalidate it at once.
    pub report_max_age_secs: u64,
    /// `lvm` binary to run.
    pub lvm_binary: String,
    /// Whether LVM may rely on udev: "auto" (use it when udevd runs),
    /// "on" or "off" (create /dev nodes itself, as in containers).
    pub udev: UdevMode,
    /// Loop-backed pool built when the volume group is absent.
    pub loop_pool: Option<LoopPool>,
    /// Listen address of the CSI-Addons services (Identity, ReclaimSpace,
    /// NodeHealer), for the csi-addons sidecar; empty disables them.
    pub csi_addons_endpoint: String,
    /// Where the node's cgroup v2 hierarchy is mounted: per-volume I/O
    /// limits go to the `io.max` of the pod cgroups under it.
    pub cgroup_root: PathBuf,
    /// Driver-owned, persistent directory: the node records, formatting
    /// markers, the single-instance lock and private reclaim mounts.
    pub state_dir: PathBuf,
    /// Bound on one ReclaimSpace call's trim or zero-run scan, in seconds.
    pub reclaim_timeout_secs: u64,
    /// ControllerReclaimSpace on a raw block volume discards runs of this
    /// many bytes that read back as zeroes (rounded up to the pool's chunk).
    #[serde(deserialize_with = "de_size")]
    pub reclaim_zero_run: u64,
    /// Absolute directories under which the node service accepts staging
    /// and target paths; anything else is refused before it is touched.
    pub allowed_roots: Vec<PathBuf>,
    /// Accept a thin pool that does not zero new chunks (made with `-Zn`):
    /// a new raw block volume on it can show a deleted volume's data.
    pub allow_unzeroed_pool: bool,
    /// Let LVM archive the VG's metadata before each of the driver's
    /// changes (its `backup/archive`). Off by default: see docs/performance.md.
    pub lvm_metadata_archive: bool,
    /// Send LVM commands to long-lived `lvm` shells (`src/lvm/shell.rs`)
    /// instead of starting `lvm` for each. See docs/performance.md.
    pub lvm_shell: bool,
    /// Advertise and serve ControllerExpandVolume. False: the controller
    /// capability EXPAND_VOLUME is not advertised, ControllerExpandVolume
    /// is UNIMPLEMENTED, and NodeExpandVolume grows the LV itself (the
    /// per-node Kubernetes deployment; see deploy/kubernetes/README.md).
    pub controller_expansion: bool,
    /// Grows the thin pool's data and metadata before they fill (see
    /// [`Autopilot`]); off unless enabled.
    pub autopilot: Autopilot,
    /// `true`: a full pool fails writes at once (`lvchange
    /// --errorwhenfull y`); `false`: it queues them for up to dm-thin's 60 s
    /// (LVM's default, which gives the autopilot time to grow the pool).
    /// Unset: the pool is left as it is.
    pub error_when_full: Option<bool>,
    /// LUKS2 encryption of the class's volumes (see [`Encryption`]).
    pub encryption: Encryption,
    /// LVs (volumes and snapshots) kept spare in the pool's metadata and
    /// the VG's metadata area: creates are refused this many short of
    /// LVM's own refusal (`lvm::room`).
    pub metadata_reserve_lvs: u64,
    /// `host:port` (an IP address, not a name) on which Prometheus metrics
    /// are served at `/metrics` over plain HTTP; empty: no endpoint.
    pub metrics_address: String,
    /// Log lines as human-readable text or as JSON objects, one a line.
    /// `--log-format` wins.
    pub log_format: LogFormat,
    /// More thin pools, each a device class a StorageClass picks with the
    /// `deviceClass` parameter. The top-level pool keys are the class
    /// named [`naming::DEFAULT_CLASS`].
    pub device_classes: Vec<DeviceClass>,
    /// The class of a CreateVolume or GetCapacity that names none.
    pub default_device_class: String,
    /// The internal channel on which the cluster's controller forwards
    /// calls to this node (docs/cluster.md); off unless `listen` is set.
    pub cluster: Cluster,
}

/// The internal channel: TCP with mutual TLS (`src/channel.rs`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cluster {
    /// `IP:port` to listen on; empty: no channel.
    pub listen: String,
    /// This node's certificate chain (PEM), for server authentication.
    pub tls_cert: PathBuf,
    /// Its private key (PEM).
    pub tls_key: PathBuf,
    /// The CA (PEM) whose client certificates are let through: the
    /// controller's.
    pub client_ca: PathBuf,
    /// The nodes' CA (PEM): other node plugins whose client certificates
    /// it signed may read a snapshot granted to them (`Transfer.Read`
    /// alone, docs/moving.md); empty: only the controller gets through.
    pub peer_ca: PathBuf,
    /// The most `Transfer.Read` reads per second on this node, in MiB,
    /// all transfers together (docs/moving.md); 0: no cap.
    pub transfer_mib_per_sec: u64,
}

/// One more thin pool: the top-level per-pool keys, each defaulting to the
/// top-level value except the pool's own (`volume_group`, `loop_pool`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceClass {
    pub name: String,
    pub volume_group: String,
    #[serde(default = "default_thin_pool")]
    pub thin_pool: String,
    pub overprovision_ratio: Option<f64>,
    pub default_fs_type: Option<String>,
    pub mkfs_options: Option<PerFs<String>>,
    pub mount_options: Option<PerFs<Vec<String>>>,
    pub loop_pool: Option<LoopPool>,
    pub allow_unzeroed_pool: Option<bool>,
    pub metadata_reserve_lvs: Option<u64>,
    pub autopilot: Option<Autopilot>,
    pub error_when_full: Option<bool>,
    pub encryption: Option<Encryption>,
}

/// One value per filesystem this driver makes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PerFs<T> {
    pub ext4: T,
    pub xfs: T,
}

impl<T> PerFs<T> {
    /// The value for `fs`; `None` for a filesystem this driver does not make.
    pub fn get(&self, fs: &str) -> Option<&T> {
        match fs {
            "ext4" => Some(&self.ext4),
            "xfs" => Some(&self.xfs),
            _ => None,
        }
    }
}

/// The thin-pool autopilot of one class: it reads the pool's use from
/// device-mapper (no LVM command while nothing needs doing) and grows its
/// data or metadata by a step when use passes a threshold, from the VG's
/// free space, growing a loop-backed pool's file, loop device and PV
/// first where the VG has none.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Autopilot {
    pub enabled: bool,
    /// Grow the data when this much of it is used (percent).
    pub data_threshold_percent: u8,
    /// Grow the metadata when this much of it is used (percent).
    pub metadata_threshold_percent: u8,
    /// Each growth adds this share of the current size (percent), at
    /// least one extent.
    pub step_percent: u8,
    /// The data never grows past this size; 0: as far as the VG allows.
    #[serde(deserialize_with = "de_size")]
    pub data_limit: u64,
    /// The metadata never grows past this size (LVM's own bound is a
    /// little under 16 GiB).
    #[serde(deserialize_with = "de_size")]
    pub metadata_limit: u64,
    /// A loop-backed pool's file may grow up to this size; 0: it never grows.
    #[serde(deserialize_with = "de_size")]
    pub backing_file_limit: u64,
    /// Free space the file's host filesystem keeps after a growth.
    #[serde(deserialize_with = "de_size")]
    pub host_reserve: u64,
    /// How often the pool's status is read when no device-mapper event
    /// came (seconds).
    pub poll_secs: u64,
}

impl Default for Autopilot {
    fn default() -> Self {
        Autopilot {
            enabled: false,
            data_threshold_percent: 80,
            metadata_threshold_percent: 70,
            step_percent: 20,
            data_limit: 0,
            metadata_limit: 15 << 30,
            backing_file_limit: 0,
            host_reserve: 1 << 30,
            poll_secs: 2,
        }
    }
}

/// LUKS2 encryption (dm-crypt, `cryptsetup`) of a class's volumes. The
/// passphrase comes with each NodeStageVolume, in its secrets
/// (`node::crypt::PASSPHRASE_KEY`); the driver keeps no key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Encryption {
    /// New volumes of the class are encrypted unless their StorageClass
    /// says `encrypted: "false"` (a StorageClass's `encrypted: "true"`
    /// encrypts in any class).
    pub enabled: bool,
    /// Let discards through the open mapping (`--allow-discards`), so
    /// ReclaimSpace gives freed blocks back: an observer of the LV then
    /// sees which blocks are free. Off: ReclaimSpace trims nothing.
    pub allow_discards: bool,
    /// Key derivation of new key slots.
    pub pbkdf: Pbkdf,
    /// Memory cost of argon2 (KiB); 0: cryptsetup's choice (up to 1 GiB,
    /// needed again at each open).
    pub pbkdf_memory_kib: u32,
    /// Time cryptsetup aims an unlock at (ms); 0: its default (2000).
    pub iter_time_ms: u32,
    /// Fixed iterations instead of timing them (argon2: at least 4,
    /// pbkdf2: at least 1000); 0: timed (`iter_time_ms`).
    pub pbkdf_iterations: u32,
}

impl Default for Encryption {
    fn default() -> Self {
        Encryption {
            enabled: false,
            allow_discards: false,
            pbkdf: Pbkdf::Argon2id,
            pbkdf_memory_kib: 256 << 10,
            iter_time_ms: 0,
            pbkdf_iterations: 0,
        }
    }
}

/// A LUKS2 key-derivation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pbkdf {
    Argon2id,
    Argon2i,
    Pbkdf2,
}

impl Pbkdf {
    pub fn as_str(self) -> &'static str {
        match self {
            Pbkdf::Argon2id => "argon2id",
            Pbkdf::Argon2i => "argon2i",
            Pbkdf::Pbkdf2 => "pbkdf2",
        }
    }
}

fn default_thin_pool() -> String {
    "pool".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopPool {
    /// Sparse backing file; created when missing.
    pub backing_file: PathBuf,
    /// Apparent size of the backing file.
    #[serde(deserialize_with = "de_size")]
    pub size: u64,
    /// Percentage of the volume group the thin pool's data takes.
    #[serde(default = "default_pool_percent")]
    pub pool_percent: u8,
    /// Volumes and snapshots the built VG and pool are sized for: the VG
    /// metadata area and the pool's metadata LV (`lvm::room`). Unset:
    /// [`DEFAULT_MAX_LVS`] as far as the file allows, without a warning.
    pub max_lvs: Option<u64>,
    /// The thin pool's chunk: its allocation and copy-on-write unit.
    #[serde(default = "default_chunk_size", deserialize_with = "de_size")]
    pub chunk_size: u64,
}

fn default_pool_percent() -> u8 {
    80
}

/// What a pool the driver builds is sized for when `max_lvs` is unset.
pub const DEFAULT_MAX_LVS: u64 = 12_000;

fn default_chunk_size() -> u64 {
    64 << 10
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "log format must be \"text\" or \"json\", got {other:?}"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UdevMode {
    Auto,
    On,
    Off,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            driver_name: "thinpool.csi.storage.dev".into(),
            node_id: String::new(),
            endpoint: "unix:///run/thinpool-csi/csi.sock".into(),
            volume_group: "thinpool-csi".into(),
            thin_pool: "pool".into(),
            overprovision_ratio: 4.0,
            default_fs_type: "ext4".into(),
            mkfs_options: PerFs::default(),
            mount_options: PerFs::default(),
            default_volume_size: 1 << 30,
            command_timeout_secs: 120,
            report_max_age_secs: 10,
            lvm_binary: "lvm".into(),
            udev: UdevMode::Auto,
            loop_pool: None,
            allowed_roots: vec![PathBuf::from("/var/lib/kubelet")],
            csi_addons_endpoint: "unix:///run/thinpool-csi/csi-addons.sock".into(),
            state_dir: PathBuf::from("/var/lib/thinpool-csi/state"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            reclaim_timeout_secs: 600,
            reclaim_zero_run: 64 << 10,
            allow_unzeroed_pool: false,
            lvm_metadata_archive: false,
            lvm_shell: true,
            controller_expansion: true,
            metadata_reserve_lvs: 64,
            autopilot: Autopilot::default(),
            error_when_full: None,
            encryption: Encryption::default(),
            metrics_address: String::new(),
            cluster: Cluster::default(),
            log_format: LogFormat::Text,
            device_classes: Vec::new(),
            default_device_class: naming::DEFAULT_CLASS.into(),
        }
    }
}

pub const FS_TYPES: &[&str] = &["ext4", "xfs"];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("config key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            source: Box::new(source),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        naming::validate_driver_name(&self.driver_name).map_err(|r| invalid("driver_name", r))?;
        if !self.node_id.is_empty() {
            naming::validate_node_id(&self.node_id).map_err(|r| invalid("node_id", r))?;
        }
        self.validate_pool()?;
        if self.default_volume_size == 0 {
            return Err(invalid("default_volume_size", "must be > 0"));
        }
        if self.command_timeout_secs == 0 || self.command_timeout_secs > 3600 {
            return Err(invalid(
                "command_timeout_secs",
                "must be between 1 and 3600",
            ));
        }
        parse_endpoint(&self.endpoint).map_err(|r| invalid("endpoint", r))?;
        if !self.csi_addons_endpoint.is_empty() {
            let addons = parse_endpoint(&self.csi_addons_endpoint)
                .map_err(|r| invalid("csi_addons_endpoint", r))?;
            if parse_endpoint(&self.endpoint).ok() == Some(addons) {
                return Err(invalid("csi_addons_endpoint", "must differ from endpoint"));
            }
        }
        if !self.cgroup_root.is_absolute() {
            return Err(invalid("cgroup_root", "must be an absolute path"));
        }
        if !self.state_dir.is_absolute() {
            return Err(invalid("state_dir", "must be an absolute path"));
        }
        if self.reclaim_timeout_secs == 0 || self.reclaim_timeout_secs > 86400 {
            return Err(invalid(
                "reclaim_timeout_secs",
                "must be between 1 and 86400",
            ));
        }
        if self.reclaim_zero_run == 0 || self.reclaim_zero_run % 512 != 0 {
            return Err(invalid(
                "reclaim_zero_run",
                "must be a positive multiple of 512 bytes",
            ));
        }
        if self.lvm_binary.is_empty() {
            return Err(invalid("lvm_binary", "must not be empty"));
        }
        self.metrics_socket_addr()
            .map_err(|r| invalid("metrics_address", r))?;
        self.validate_cluster()?;
        validate_allowed_roots(&self.allowed_roots).map_err(|r| invalid("allowed_roots", r))?;
        self.validate_classes()?;
        Ok(())
    }

    /// The keys of one pool (the top-level one, or a device class's as
    /// [`Config::classes`] spells it out).
    fn validate_pool(&self) -> Result<(), ConfigError> {
        naming::validate_lvm_name(&self.volume_group).map_err(|r| invalid("volume_group", r))?;
        naming::validate_lvm_name(&self.thin_pool).map_err(|r| invalid("thin_pool", r))?;
        if !(self.overprovision_ratio.is_finite() && self.overprovision_ratio >= 1.0) {
            return Err(invalid(
                "overprovision_ratio",
                format!("must be a number >= 1.0, got {}", self.overprovision_ratio),
            ));
        }
        if !FS_TYPES.contains(&self.default_fs_type.as_str()) {
            return Err(invalid(
                "default_fs_type",
                format!(
                    "must be one of {FS_TYPES:?}, got {:?}",
                    self.default_fs_type
                ),
            ));
        }
        for fs in FS_TYPES {
            let text = self.mkfs_options.get(fs).map_or("", String::as_str);
            crate::fs_options::mkfs_options(fs, text)
                .map_err(|r| invalid("mkfs_options", format!("{fs}: {r}")))?;
            for word in self.mount_options.get(fs).into_iter().flatten() {
                crate::fs_options::mount_word(fs, word)
                    .map_err(|r| invalid("mount_options", format!("{fs}: {r}")))?;
            }
        }
        self.validate_autopilot()?;
        self.validate_encryption()?;
        if let Some(lp) = &self.loop_pool {
            if !lp.backing_file.is_absolute() {
                return Err(invalid(
                    "loop_pool.backing_file",
                    "must be an absolute path",
                ));
            }
            if lp.size < MIN_LOOP_SIZE {
                return Err(invalid(
                    "loop_pool.size",
                    format!("must be at least {MIN_LOOP_SIZE} bytes, got {}", lp.size),
                ));
            }
            if !(10..=95).contains(&lp.pool_percent) {
                return Err(invalid(
                    "loop_pool.pool_percent",
                    "must be between 10 and 95",
                ));
            }
            if lp.max_lvs.is_some_and(|n| !(1..=1_000_000).contains(&n)) {
                return Err(invalid(
                    "loop_pool.max_lvs",
                    "must be between 1 and 1000000",
                ));
            }
            // dm-thin's bounds: 64 KiB to 1 GiB, a multiple of 64 KiB.
            let chunk = lp.chunk_size;
            if !(64 << 10..=1 << 30).contains(&chunk) || chunk % (64 << 10) != 0 {
                return Err(invalid(
                    "loop_pool.chunk_size",
                    format!(
                        "must be a multiple of 64KiB between 64KiB and 1GiB, got {chunk} bytes"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_encryption(&self) -> Result<(), ConfigError> {
        let e = &self.encryption;
        let least = match e.pbkdf {
            Pbkdf::Pbkdf2 => 1000,
            _ => 4,
        };
        if e.pbkdf_iterations != 0 && e.pbkdf_iterations < least {
            return Err(invalid(
                "encryption.pbkdf_iterations",
                format!("must be 0 or at least {least} for {}", e.pbkdf.as_str()),
            ));
        }
        if e.pbkdf_memory_kib != 0 && !(32..=4 << 20).contains(&e.pbkdf_memory_kib) {
            return Err(invalid(
                "encryption.pbkdf_memory_kib",
                "must be 0 or between 32 and 4194304 (KiB)",
            ));
        }
        Ok(())
    }

    fn validate_autopilot(&self) -> Result<(), ConfigError> {
        let a = &self.autopilot;
        for (key, v) in [
            ("autopilot.data_threshold_percent", a.data_threshold_percent),
            (
                "autopilot.metadata_threshold_percent",
                a.metadata_threshold_percent,
            ),
        ] {
            if !(10..=95).contains(&v) {
                return Err(invalid(key, format!("must be between 10 and 95, got {v}")));
            }
        }
        if !(1..=100).contains(&a.step_percent) {
            return Err(invalid(
                "autopilot.step_percent",
                format!("must be between 1 and 100, got {}", a.step_percent),
            ));
        }
        if !(1..=60).contains(&a.poll_secs) {
            return Err(invalid(
                "autopilot.poll_secs",
                format!("must be between 1 and 60, got {}", a.poll_secs),
            ));
        }
        if a.metadata_limit < (2 << 20) {
            return Err(invalid(
                "autopilot.metadata_limit",
                "must be at least 2MiB (LVM's smallest pool metadata)",
            ));
        }
        if a.backing_file_limit > 0 {
            match &self.loop_pool {
                None => {
                    return Err(invalid(
                        "autopilot.backing_file_limit",
                        "needs a loop_pool: only a loop-backed pool has a file to grow",
                    ))
                }
                Some(lp) if a.backing_file_limit < lp.size => {
                    return Err(invalid(
                        "autopilot.backing_file_limit",
                        format!(
                            "must be 0 or at least loop_pool.size ({} bytes), got {}",
                            lp.size, a.backing_file_limit
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Each device class as the whole config its pool is served with:
    /// the default class first (`None`, the top-level keys), then each of
    /// `device_classes` by name, its keys over the top-level ones.
    pub fn classes(&self) -> Vec<(Option<String>, Config)> {
        let base = Config {
            device_classes: Vec::new(),
            ..self.clone()
        };
        let mut out = vec![(None, base.clone())];
        let mut named: Vec<&DeviceClass> = self.device_classes.iter().collect();
        named.sort_by(|a, b| a.name.cmp(&b.name));
        for c in named {
            let cfg = Config {
                volume_group: c.volume_group.clone(),
                thin_pool: c.thin_pool.clone(),
                overprovision_ratio: c.overprovision_ratio.unwrap_or(base.overprovision_ratio),
                default_fs_type: c
                    .default_fs_type
                    .clone()
                    .unwrap_or_else(|| base.default_fs_type.clone()),
                mkfs_options: c
                    .mkfs_options
                    .clone()
                    .unwrap_or_else(|| base.mkfs_options.clone()),
                mount_options: c
                    .mount_options
                    .clone()
                    .unwrap_or_else(|| base.mount_options.clone()),
                loop_pool: c.loop_pool.clone(),
                allow_unzeroed_pool: c.allow_unzeroed_pool.unwrap_or(base.allow_unzeroed_pool),
                metadata_reserve_lvs: c.metadata_reserve_lvs.unwrap_or(base.metadata_reserve_lvs),
                // The top-level table, but its backing_file_limit is the
                // top-level loop file's, as loop_pool is not inherited.
                autopilot: c.autopilot.clone().unwrap_or_else(|| Autopilot {
                    backing_file_limit: 0,
                    ..base.autopilot.clone()
                }),
                error_when_full: c.error_when_full.or(base.error_when_full),
                encryption: c
                    .encryption
                    .clone()
                    .unwrap_or_else(|| base.encryption.clone()),
                ..base.clone()
            };
            out.push((Some(c.name.clone()), cfg));
        }
        out
    }

    /// Class names are unique and well formed, each class's pool keys
    /// pass the top-level checks, no two classes share a thin pool or a
    /// loop file, and the default class is one of them.
    fn validate_classes(&self) -> Result<(), ConfigError> {
        let mut names = vec![naming::DEFAULT_CLASS.to_string()];
        for c in &self.device_classes {
            naming::validate_class_name(&c.name).map_err(|r| invalid("device_classes.name", r))?;
            if names.contains(&c.name) {
                return Err(invalid(
                    "device_classes.name",
                    format!(
                        "{:?} is used twice (\"{}\" is the top-level pool's class)",
                        c.name,
                        naming::DEFAULT_CLASS
                    ),
                ));
            }
            names.push(c.name.clone());
        }
        if !names.contains(&self.default_device_class) {
            return Err(invalid(
                "default_device_class",
                format!(
                    "{:?} is not a device class here (classes: {names:?})",
                    self.default_device_class
                ),
            ));
        }
        let classes = self.classes();
        let mut pools = Vec::new();
        let mut files = Vec::new();
        for (name, cfg) in &classes {
            let class = name.as_deref().unwrap_or(naming::DEFAULT_CLASS);
            if name.is_some() {
                cfg.validate_pool().map_err(|e| match e {
                    ConfigError::Invalid { key, reason } => ConfigError::Invalid {
                        key,
                        reason: format!("in device class {class:?}: {reason}"),
                    },
                    other => other,
                })?;
            }
            let pool = (cfg.volume_group.clone(), cfg.thin_pool.clone());
            if pools.contains(&pool) {
                return Err(invalid(
                    "device_classes.thin_pool",
                    format!(
                        "class {class:?} names thin pool {}/{}, which another class serves",
                        pool.0, pool.1
                    ),
                ));
            }
            pools.push(pool);
            let built = |c: &Config| c.loop_pool.is_some();
            if let Some((other, _)) = classes.iter().find(|(n, c)| {
                n != name && c.volume_group == cfg.volume_group && (built(c) || built(cfg))
            }) {
                return Err(invalid(
                    "device_classes.volume_group",
                    format!(
                        "classes {class:?} and {:?} share volume group {}, which a loop_pool builds: give each built pool a volume group of its own",
                        other.as_deref().unwrap_or(naming::DEFAULT_CLASS),
                        cfg.volume_group
                    ),
                ));
            }
            if let Some(lp) = &cfg.loop_pool {
                if files.contains(&lp.backing_file) {
                    return Err(invalid(
                        "device_classes.loop_pool.backing_file",
                        format!(
                            "class {class:?} names {}, which another class's loop pool uses",
                            lp.backing_file.display()
                        ),
                    ));
                }
                files.push(lp.backing_file.clone());
            }
        }
        Ok(())
    }

    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if self
            .cluster_listen_addr()
            .map_err(|r| invalid("cluster.listen", r))?
            .is_none()
        {
            return Ok(());
        }
        for (key, path) in [
            ("cluster.tls_cert", &c.tls_cert),
            ("cluster.tls_key", &c.tls_key),
            ("cluster.client_ca", &c.client_ca),
        ] {
            if !path.is_absolute() {
                return Err(invalid(
                    key,
                    "must be an absolute path when cluster.listen is set: the channel takes no unauthenticated caller",
                ));
            }
        }
        if !c.peer_ca.as_os_str().is_empty() && !c.peer_ca.is_absolute() {
            return Err(invalid(
                "cluster.peer_ca",
                "must be an absolute path, or empty",
            ));
        }
        Ok(())
    }

    /// Where the internal channel listens; `None` when it is off.
    pub fn cluster_listen_addr(&self) -> Result<Option<std::net::SocketAddr>, String> {
        match self.cluster.listen.as_str() {
            "" => Ok(None),
            a => a.parse().map(Some).map_err(|_| {
                format!("must be an IP address and port such as \"0.0.0.0:9443\", got {a:?}")
            }),
        }
    }

    /// Where the metrics endpoint listens; `None` when it is off.
    pub fn metrics_socket_addr(&self) -> Result<Option<std::net::SocketAddr>, String> {
        if self.metrics_address.is_empty() {
            return Ok(None);
        }
        self.metrics_address
            .parse::<std::net::SocketAddr>()
            .map(Some)
            .map_err(|_| {
                format!(
                    "must be an IP address and port such as \"127.0.0.1:9808\" or \"[::]:9808\", got {:?}",
                    self.metrics_address
                )
            })
    }

    pub fn command_timeout(&self) -> Duration {
        Duration::from_secs(self.command_timeout_secs)
    }

    pub fn reclaim_timeout(&self) -> Duration {
        Duration::from_secs(self.reclaim_timeout_secs)
    }

    /// Whether LVM and device-mapper tools must run without udev (create
    /// /dev nodes themselves, not wait for udev events).
    pub fn no_udev(&self) -> bool {
        match self.udev {
            UdevMode::On => false,
            UdevMode::Off => true,
            UdevMode::Auto => !Path::new("/run/udev/control").exists(),
        }
    }

    /// The topology key this driver reports; its value is the node id.
    pub fn topology_key(&self) -> String {
        topology_key(&self.driver_name)
    }
}

/// The topology key of driver `driver_name` (the node plugins' and the
/// cluster controller's alike); its value is the node id.
pub fn topology_key(driver_name: &str) -> String {
    format!("topology.{driver_name}/node")
}

/// Each root must be absolute and free of `.`/`..` components, so that a
/// prefix check on normalized paths means what it says.
fn validate_allowed_roots(roots: &[PathBuf]) -> Result<(), String> {
    use std::path::Component;
    if roots.is_empty() {
        return Err("must name at least one directory (e.g. [\"/var/lib/kubelet\"])".into());
    }
    for root in roots {
        let text = root.to_string_lossy();
        if !root.is_absolute() {
            return Err(format!("{text:?} is not an absolute path"));
        }
        let clean = root
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !clean || text.contains("/./") || text.ends_with("/.") {
            return Err(format!("{text:?} must not contain '.' or '..' components"));
        }
    }
    Ok(())
}

/// Smallest loop-backed pool: room for LVM metadata, the pool's metadata
/// and spare, and a few volumes.
pub const MIN_LOOP_SIZE: u64 = 32 << 20;

/// Turns `unix:///path`, `unix:/path` or `/path` into the socket path.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, String> {
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else {
        endpoint
    };
    if !path.starts_with('/') {
        return Err(format!(
            "must be unix:///absolute/path (CSI serves only unix sockets), got {endpoint:?}"
        ));
    }
    Ok(PathBuf::from(path))
}

/// Sizes are bytes as an integer, or a string with a binary suffix
/// (`"512MiB"`, `"2GiB"`, `"1TiB"`, `"4096"`; Kubernetes' `"512Mi"`, `"2Gi"`
/// too). Every suffix is a power of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (expected e.g. 4096, \"512MiB\", \"2GiB\")"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "Ki" | "K" => 1 << 10,
        "MiB" | "Mi" | "M" => 1 << 20,
        "GiB" | "Gi" | "G" => 1 << 30,
        "TiB" | "Ti" | "T" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(i64),
        Str(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(i) if i >= 0 => Ok(i as u64),
        Raw::Int(i) => Err(serde::de::Error::custom(format!(
            "size must not be negative, got {i}"
        ))),
        Raw::Str(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.volume_group, "thinpool-csi");
        assert_eq!(c.default_fs_type, "ext4");
        assert!(c.loop_pool.is_none());
        assert_eq!(c.topology_key(), "topology.thinpool.csi.storage.dev/node");
    }

    #[test]
    fn shipped_configs_parse() {
        for f in ["config/defaults.toml", "config/dev.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(f);
            Config::load(&path).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
        let dev =
            Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/dev.toml")).unwrap();
        assert!(
            dev.loop_pool.is_some(),
            "dev.toml must use a loop-backed pool"
        );
    }

    #[test]
    fn device_classes_inherit_the_top_level_keys_they_do_not_set() {
        let c = Config::parse(
            r#"
overprovision_ratio = 3.0
default_fs_type = "xfs"
default_device_class = "fast"
[[device_classes]]
name = "slow"
volume_group = "hdd"
overprovision_ratio = 1.5
[[device_classes]]
name = "fast"
volume_group = "nvme"
thin_pool = "tp"
default_fs_type = "ext4"
loop_pool = { backing_file = "/var/lib/x/fast.img", size = "1GiB" }
"#,
        )
        .unwrap();
        let classes = c.classes();
        let names: Vec<Option<&str>> = classes.iter().map(|(n, _)| n.as_deref()).collect();
        assert_eq!(names, [None, Some("fast"), Some("slow")]);
        let (_, default) = &classes[0];
        assert_eq!(
            (default.volume_group.as_str(), default.thin_pool.as_str()),
            ("thinpool-csi", "pool")
        );
        assert!(default.device_classes.is_empty());
        let (_, fast) = &classes[1];
        assert_eq!(
            (fast.volume_group.as_str(), fast.thin_pool.as_str()),
            ("nvme", "tp")
        );
        assert_eq!(fast.overprovision_ratio, 3.0);
        assert_eq!(fast.default_fs_type, "ext4");
        assert!(fast.loop_pool.is_some());
        let (_, slow) = &classes[2];
        assert_eq!(
            (slow.thin_pool.as_str(), slow.overprovision_ratio),
            ("pool", 1.5)
        );
        assert_eq!(slow.default_fs_type, "xfs");
        assert!(slow.loop_pool.is_none());
        // Options are per class, the top level's where a class sets none.
        let c = Config::parse(
            r#"
mkfs_options = { ext4 = "-m 0" }
mount_options = { xfs = ["allocsize=1m"] }
[[device_classes]]
name = "db"
volume_group = "nvme"
mkfs_options = { xfs = "-m reflink=0" }
[[device_classes]]
name = "logs"
volume_group = "hdd"
"#,
        )
        .unwrap();
        let classes = c.classes();
        let (_, db) = &classes[1];
        assert_eq!(
            (db.mkfs_options.ext4.as_str(), db.mkfs_options.xfs.as_str()),
            ("", "-m reflink=0")
        );
        assert_eq!(db.mount_options.get("xfs").unwrap(), &["allocsize=1m"]);
        let (_, logs) = &classes[2];
        assert_eq!(logs.mkfs_options.get("ext4").unwrap(), "-m 0");
        assert_eq!(logs.mkfs_options.get("btrfs"), None);
        // One config without classes is one class.
        assert_eq!(Config::parse("").unwrap().classes().len(), 1);
    }

    #[test]
    fn bad_device_classes_are_named() {
        let class = |extra: &str| {
            format!("[[device_classes]]\nname = \"fast\"\nvolume_group = \"nvme\"\n{extra}")
        };
        for (text, key, says) in [
            (
                class("").replace("fast", "Fast"),
                "device_classes.name",
                "not a device class name",
            ),
            (
                class("").replace("\"fast\"", "\"default\""),
                "device_classes.name",
                "used twice",
            ),
            (
                format!("{}{}", class(""), class("")),
                "device_classes.name",
                "used twice",
            ),
            (
                format!("default_device_class = \"slow\"\n{}", class("")),
                "default_device_class",
                "not a device class here",
            ),
            (
                class("").replace("nvme", "thinpool-csi"),
                "device_classes.thin_pool",
                "another class serves",
            ),
            (
                class("overprovision_ratio = 0.5"),
                "overprovision_ratio",
                "in device class \"fast\"",
            ),
            (
                class("default_fs_type = \"btrfs\""),
                "default_fs_type",
                "in device class",
            ),
            (
                class("").replace("nvme", "vg/x"),
                "volume_group",
                "not a valid LVM name",
            ),
            (
                format!(
                    "loop_pool = {{ backing_file = \"/a.img\", size = \"1GiB\" }}\n{}",
                    class("loop_pool = { backing_file = \"/a.img\", size = \"1GiB\" }")
                ),
                "device_classes.loop_pool.backing_file",
                "another class's loop pool",
            ),
            (
                format!(
                    "loop_pool = {{ backing_file = \"/a.img\", size = \"1GiB\" }}\n{}",
                    class("thin_pool = \"p2\"").replace("nvme", "thinpool-csi")
                ),
                "device_classes.volume_group",
                "share volume group",
            ),
            (class("mkfs = 1"), "", "unknown field"),
            (
                class("mkfs_options = { ext4 = \"-O ^has_journal; rm\" }"),
                "mkfs_options",
                "\"^has_journal;\"",
            ),
            (
                class("mkfs_options = { btrfs = \"-b 4096\" }"),
                "",
                "unknown field `btrfs`",
            ),
            (
                class("mount_options = { xfs = [\"data=journal\"] }"),
                "mount_options",
                "xfs: mount option \"data=journal\" is not allowed",
            ),
            (
                class("mount_options = { ext4 = [\"bind\"] }"),
                "mount_options",
                "changes how a mount is made",
            ),
        ] {
            let e = Config::parse(&text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{text}\n=> {e}");
        }
    }

    #[test]
    fn autopilot_keys_are_checked_and_per_class() {
        let c = Config::parse(
            "error_when_full = false\n\
             [autopilot]\nenabled = true\nstep_percent = 50\ndata_limit = \"2GiB\"\n\
             [[device_classes]]\nname = \"fast\"\nvolume_group = \"nvme\"\n\
             autopilot = { enabled = false }\nerror_when_full = true\n",
        )
        .unwrap();
        let classes = c.classes();
        let (_, base) = &classes[0];
        assert!(base.autopilot.enabled);
        assert_eq!(base.autopilot.step_percent, 50);
        assert_eq!(base.autopilot.data_limit, 2 << 30);
        assert_eq!(base.autopilot.data_threshold_percent, 80);
        assert_eq!(base.error_when_full, Some(false));
        let (_, fast) = &classes[1];
        assert!(!fast.autopilot.enabled);
        assert_eq!(
            fast.autopilot.step_percent, 20,
            "a class's table replaces the top level's whole"
        );
        assert_eq!(fast.error_when_full, Some(true));
        // A class that sets no autopilot takes the top level's, but not its
        // loop file's limit.
        let c = Config::parse(
            "[autopilot]\nenabled = true\nbacking_file_limit = \"2GiB\"\n\
             [loop_pool]\nbacking_file = \"/x.img\"\nsize = \"1GiB\"\n\
             [[device_classes]]\nname = \"fast\"\nvolume_group = \"nvme\"\n",
        )
        .unwrap();
        let (_, fast) = &c.classes()[1];
        assert!(fast.autopilot.enabled);
        assert_eq!(fast.autopilot.backing_file_limit, 0);
        assert_eq!(Config::parse("").unwrap().error_when_full, None);
        for (text, key) in [
            ("[autopilot]\ndata_threshold_percent = 99", "autopilot.data_threshold_percent"),
            ("[autopilot]\nmetadata_threshold_percent = 5", "autopilot.metadata_threshold_percent"),
            ("[autopilot]\nstep_percent = 0", "autopilot.step_percent"),
            ("[autopilot]\npoll_secs = 0", "autopilot.poll_secs"),
            ("[autopilot]\nmetadata_limit = 1024", "autopilot.metadata_limit"),
            ("[autopilot]\nbacking_file_limit = \"1GiB\"", "needs a loop_pool"),
            (
                "[autopilot]\nbacking_file_limit = \"64MiB\"\n[loop_pool]\nbacking_file = \"/x.img\"\nsize = \"128MiB\"",
                "at least loop_pool.size",
            ),
            ("[autopilot]\nenable = true", "unknown field `enable`"),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse("volume_grup = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("volume_grup"), "{e}");
        let e = Config::parse("[loop_pool]\nbacking_file = \"/x\"\nsize = 1\nsizee = 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sizee"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("overprovision_ratio = 0.5", "overprovision_ratio"),
            ("overprovision_ratio = nan", "overprovision_ratio"),
            ("default_fs_type = \"btrfs\"", "default_fs_type"),
            ("volume_group = \"../etc\"", "volume_group"),
            ("thin_pool = \"\"", "thin_pool"),
            ("driver_name = \"Not A Domain\"", "driver_name"),
            ("endpoint = \"tcp://1.2.3.4:5\"", "endpoint"),
            ("command_timeout_secs = 0", "command_timeout_secs"),
            ("udev = \"maybe\"", "udev"),
            ("csi_addons_endpoint = \"tcp://x\"", "csi_addons_endpoint"),
            (
                "csi_addons_endpoint = \"unix:///run/thinpool-csi/csi.sock\"",
                "csi_addons_endpoint",
            ),
            ("state_dir = \"run\"", "state_dir"),
            ("reclaim_zero_run = 1000", "reclaim_zero_run"),
            ("reclaim_timeout_secs = 0", "reclaim_timeout_secs"),
            ("default_volume_size = \"12XB\"", "default_volume_size"),
            ("default_volume_size = -1", "default_volume_size"),
            (
                "[loop_pool]\nbacking_file = \"rel/path\"\nsize = \"1GiB\"",
                "loop_pool.backing_file",
            ),
            (
                "[loop_pool]\nbacking_file = \"/x\"\nsize = \"1MiB\"",
                "loop_pool.size",
            ),
            (
                "[loop_pool]\nbacking_file = \"/x\"\nsize = \"1GiB\"\nmax_lvs = 0",
                "loop_pool.max_lvs",
            ),
            (
                "[loop_pool]\nbacking_file = \"/x\"\nsize = \"1GiB\"\nchunk_size = \"96KiB\"",
                "loop_pool.chunk_size",
            ),
            (
                "[loop_pool]\nbacking_file = \"/x\"\nsize = \"1GiB\"\nchunk_size = \"2GiB\"",
                "loop_pool.chunk_size",
            ),
            ("allowed_roots = []", "allowed_roots"),
            ("allowed_roots = [\"var/lib/kubelet\"]", "allowed_roots"),
            ("allowed_roots = [\"/var/lib/../etc\"]", "allowed_roots"),
            ("allowed_roots = [\"/var/./lib\"]", "allowed_roots"),
            ("metrics_address = \"localhost:9808\"", "metrics_address"),
            ("metrics_address = \"127.0.0.1\"", "metrics_address"),
            ("metrics_address = \"127.0.0.1:99999\"", "metrics_address"),
            ("log_format = \"yaml\"", "log_format"),
            ("[cluster]\nlisten = \"node-1:9443\"", "cluster.listen"),
            ("[cluster]\nlisten = \"0.0.0.0\"", "cluster.listen"),
            ("[cluster]\nlisten = \"0.0.0.0:9443\"", "cluster.tls_cert"),
            (
                "[cluster]\nlisten = \"0.0.0.0:9443\"\ntls_cert = \"/c\"\ntls_key = \"k\"\nclient_ca = \"/a\"",
                "cluster.tls_key",
            ),
            (
                "[cluster]\nlisten = \"0.0.0.0:9443\"\ntls_cert = \"/c\"\ntls_key = \"/k\"",
                "cluster.client_ca",
            ),
            ("[cluster]\nport = 9443", "port"),
        ];
        for (text, key) in cases {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?} gave {e:?}, expected key {key}");
        }
    }

    #[test]
    fn the_channel_is_off_unless_listen_is_set() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.cluster_listen_addr(), Ok(None));
        let c = Config::parse(
            "[cluster]\nlisten = \"0.0.0.0:9443\"\ntls_cert = \"/c\"\ntls_key = \"/k\"\nclient_ca = \"/a\"",
        )
        .unwrap();
        assert_eq!(
            c.cluster_listen_addr(),
            Ok(Some("0.0.0.0:9443".parse().unwrap()))
        );
        assert_eq!(c.cluster.client_ca, PathBuf::from("/a"));
    }

    #[test]
    fn metrics_and_log_format() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.metrics_socket_addr(), Ok(None));
        assert_eq!(c.log_format, LogFormat::Text);
        let c =
            Config::parse("metrics_address = \"127.0.0.1:9808\"\nlog_format = \"json\"").unwrap();
        assert_eq!(
            c.metrics_socket_addr().unwrap(),
            Some("127.0.0.1:9808".parse().unwrap())
        );
        assert_eq!(c.log_format, LogFormat::Json);
        let c = Config::parse("metrics_address = \"[::]:0\"").unwrap();
        assert!(c.metrics_socket_addr().unwrap().unwrap().is_ipv6());
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert!("JSON".parse::<LogFormat>().is_err());
    }

    #[test]
    fn allowed_roots() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.allowed_roots, vec![PathBuf::from("/var/lib/kubelet")]);
        let c = Config::parse("allowed_roots = [\"/var/lib/kubelet\", \"/tmp/t\"]").unwrap();
        assert_eq!(c.allowed_roots.len(), 2);
        let e = Config::parse("allowed_roots = [\"/ok\", \"../up\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("allowed_roots") && e.contains("../up"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_size("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_size("64Ki").unwrap(), 64 << 10);
        assert_eq!(parse_size("3Ti").unwrap(), 3 << 40);
        assert_eq!(parse_size(" 7 ").unwrap(), 7);
        assert!(parse_size("1gi").is_err());
        assert!(parse_size("1Gib").is_err());
        assert!(parse_size("-1Gi").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        let c = Config::parse("default_volume_size = \"64MiB\"").unwrap();
        assert_eq!(c.default_volume_size, 64 << 20);
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("unix:///run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        assert_eq!(
            parse_endpoint("unix:/run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        assert_eq!(
            parse_endpoint("/run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        assert!(parse_endpoint("unix://relative").is_err());
        assert!(parse_endpoint("tcp://127.0.0.1:1").is_err());
    }
}
