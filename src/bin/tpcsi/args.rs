//! The command line: clap's derive parser, with a size parser (`1Gi`,
//! `512MiB`, bytes) shared with the driver's config and a `KEY=VALUE` parser.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use thinpool_csi::proto::csi::v1::volume_capability::access_mode::Mode;

/// Talks to a running thinpool-csi driver over its CSI and CSI-Addons unix
/// sockets: volumes, snapshots, node staging and publishing, reclaim, heal.
#[derive(Debug, Parser)]
#[command(name = "tpcsi", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

pub const EXIT_CODES: &str =
    "Exit status: 0 success; 1 a local error (bad config file, bad input); \
2 a usage error; 3 the socket cannot be reached; 4 no answer within --timeout; 5 (probe) a device \
class other than the default one takes no new volume while the default one does; 10 + the gRPC code when the driver \
answers an error (13 INVALID_ARGUMENT, 15 NOT_FOUND, 16 ALREADY_EXISTS, \
19 FAILED_PRECONDITION, 20 ABORTED, 22 UNIMPLEMENTED, ...).";

#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// CSI socket [default: $CSI_ENDPOINT, else the config's `endpoint`,
    /// else unix:///run/thinpool-csi/csi.sock]
    #[arg(long, global = true, value_name = "unix:///PATH")]
    pub endpoint: Option<String>,
    /// CSI-Addons socket [default: $CSI_ADDONS_ENDPOINT, else the config's
    /// `csi_addons_endpoint`, else unix:///run/thinpool-csi/csi-addons.sock]
    #[arg(long, global = true, value_name = "unix:///PATH")]
    pub addons_endpoint: Option<String>,
    /// The driver's metrics endpoint, for `capacity`'s metadata figures
    /// [default: $METRICS_ADDRESS, else the config's `metrics_address`]
    #[arg(long, global = true, value_name = "IP:PORT")]
    pub metrics_address: Option<String>,
    /// The driver's config file, to take both sockets from
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON on stdout instead of a table (errors too)
    #[arg(long, global = true)]
    pub json: bool,
    /// Show a spinner with elapsed seconds on stderr even when stderr is not
    /// a terminal (it is shown on a terminal anyway)
    #[arg(long, global = true)]
    pub progress: bool,
    /// Give up after this many seconds, exit status 4 (the driver finishes
    /// what it started anyway; running the command again finds the result)
    #[arg(long, global = true, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Probe the driver on both sockets, then ask GetCapacity of every
    /// device class whether a new volume fits: exit 0 only when all hold;
    /// the default class's failure keeps its code, another class's is 5
    Probe(ProbeArgs),
    /// Plugin name, version, manifest, capabilities and node info
    Info,
    /// Capacity of the pool (GetCapacity), and both metadata stores from
    /// the driver's metrics
    Capacity(CapacityArgs),
    /// Create a volume
    Create(CreateArgs),
    /// List every volume (all pages)
    List(ClassFilter),
    /// Show one volume (ControllerGetVolume)
    Get {
        /// Volume id (csi-...)
        volume_id: String,
    },
    /// Grow a volume; with --path, grow its filesystem on this node too
    Expand(ExpandArgs),
    /// Delete a volume
    Delete {
        /// Volume id (csi-...)
        volume_id: String,
    },
    /// Snapshots: create, list, delete
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Move a volume to another node through the cluster's controller:
    /// rounds of snapshots copied while its workload runs (each by what
    /// changed), then --final once it is stopped (docs/moving.md)
    Move(MoveArgs),
    /// Stage a volume on this node at a staging directory (NodeStageVolume)
    Stage(StageArgs),
    /// Unstage a volume (NodeUnstageVolume)
    Unstage {
        /// Volume id (csi-...)
        volume_id: String,
        /// The staging directory it was staged at
        staging_path: String,
    },
    /// Publish a staged volume at a target path (NodePublishVolume)
    Publish(PublishArgs),
    /// Unpublish a volume from a target path (NodeUnpublishVolume)
    Unpublish {
        /// Volume id (csi-...)
        volume_id: String,
        /// The target path it was published at
        target_path: String,
    },
    /// Usage and condition of a staged or published volume (NodeGetVolumeStats)
    Stats {
        /// Volume id (csi-...)
        volume_id: String,
        /// A path the volume is published or staged at
        volume_path: String,
        /// Its staging directory
        #[arg(long, value_name = "PATH")]
        staging: Option<String>,
    },
    /// Give unused blocks back to the pool (CSI-Addons ReclaimSpace)
    Reclaim(ReclaimArgs),
    /// Check a volume on this node and repair what is safe (CSI-Addons NodeHealer)
    Heal(HealArgs),
    /// Replace an encrypted volume's passphrase (CSI-Addons EncryptionKeyRotate)
    RotateKey(RotateKeyArgs),
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Create a snapshot of a volume
    Create {
        /// Snapshot name (as a CO would give it; the id is derived from it)
        name: String,
        /// Source volume id (csi-...)
        #[arg(long, value_name = "VOLUME_ID")]
        volume: String,
    },
    /// List snapshots (all pages)
    List {
        /// Only snapshots of this volume
        #[arg(long, value_name = "VOLUME_ID")]
        volume: Option<String>,
        /// Only this snapshot
        #[arg(long, value_name = "SNAPSHOT_ID")]
        id: Option<String>,
        #[command(flatten)]
        filter: ClassFilter,
    },
    /// Delete a snapshot
    Delete {
        /// Snapshot id (snap-...)
        snapshot_id: String,
    },
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Exit as the default device class's pool says even when another
    /// class takes no new volume (it is still shown): the pod's readiness,
    /// which one class down must not fail while the default one serves
    #[arg(long)]
    pub tolerate_other_classes: bool,
}

/// A listing's device class: the id's prefix (`fast.csi-…`), none for
/// `default`. Filtered here: ListVolumes and ListSnapshots take no class.
#[derive(Debug, Args, Default, Clone)]
pub struct ClassFilter {
    /// Only those of this device class (`default`: the top-level pool's)
    #[arg(long, value_name = "NAME", value_parser = parse_class)]
    pub class: Option<String>,
}

/// How a volume is consumed: a filesystem (`--fs`) or a raw block device.
#[derive(Debug, Args, Default, Clone)]
pub struct AccessArgs {
    /// Filesystem volume of this type (ext4, xfs)
    #[arg(long, value_name = "TYPE", conflicts_with = "block")]
    pub fs: Option<String>,
    /// Raw block volume
    #[arg(long)]
    pub block: bool,
    /// Access mode
    #[arg(long, value_enum, default_value_t = AccessMode::SingleNodeWriter)]
    pub mode: AccessMode,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Volume name (as a CO would give it; the id is derived from it)
    pub name: String,
    /// Required size, e.g. 1Gi, 512Mi, 4096 [default: the driver's default_volume_size]
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Largest size the driver may round up to
    #[arg(long, value_parser = parse_size)]
    pub limit: Option<u64>,
    #[command(flatten)]
    pub access: AccessArgs,
    /// Creation parameter (repeatable), as a StorageClass's: deviceClass,
    /// encrypted=true, mkfsOptions, I/O limits, volumeGroup and thinPool
    /// (which must match the class) and the CO's metadata keys
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub params: Vec<(String, String)>,
    /// Mutable parameter (ControllerModifyVolume's), e.g. readAheadSectors=256
    #[arg(long = "mutable", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub mutable: Vec<(String, String)>,
    /// Restore from this snapshot
    #[arg(long, value_name = "SNAPSHOT_ID", conflicts_with = "from_volume")]
    pub from_snapshot: Option<String>,
    /// Clone this volume
    #[arg(long, value_name = "VOLUME_ID")]
    pub from_volume: Option<String>,
    /// The node to make it on (its topology, as the provisioner sends the
    /// pod's node): needed through the cluster's controller
    #[arg(long, value_name = "NODE_ID")]
    pub on_node: Option<String>,
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The volume to move (its id)
    pub volume_id: String,
    /// The node to move it to
    #[arg(long, value_name = "NODE_ID")]
    pub to: String,
    /// The new volume's name (as a CO would give it, e.g. the new PV's)
    #[arg(long)]
    pub name: String,
    /// --fs/--block: the volume's own access when neither is given
    #[command(flatten)]
    pub access: AccessArgs,
    /// Creation parameter (repeatable), as the volume was created with
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub params: Vec<(String, String)>,
    /// The snapshot the copy on the target holds, as the run before
    /// printed: only what changed since it is copied
    #[arg(long, value_name = "SNAPSHOT_ID")]
    pub base: Option<String>,
    /// Resume a round that failed: copy this snapshot (as printed) rather
    /// than take a new one
    #[arg(long, value_name = "SNAPSHOT_ID")]
    pub snapshot: Option<String>,
    /// The last round (the workload is stopped): the copy becomes the volume
    #[arg(long = "final")]
    pub r#final: bool,
    /// At most this many rounds while the workload runs
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// With --final: write the new volume's PersistentVolume (named
    /// --name, pinned to --to) and the claim bound to it, as YAML for
    /// `kubectl apply -f`, to this file
    #[arg(long, value_name = "FILE", requires_all = ["final", "claim", "storage_class"])]
    pub manifest: Option<std::path::PathBuf>,
    /// The claim the manifest binds to the new volume: NAMESPACE/NAME
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "manifest")]
    pub claim: Option<String>,
    /// The claim's StorageClass, for the manifest
    #[arg(long, value_name = "CLASS", requires = "manifest")]
    pub storage_class: Option<String>,
    /// The Secret the old PV names in csi.nodeStageSecretRef (an
    /// encrypted volume's passphrase), for the manifest: NAMESPACE/NAME
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "manifest")]
    pub node_stage_secret: Option<String>,
    /// A mount option the old PV has (its class's mountOptions), for the
    /// manifest (repeatable)
    #[arg(long = "mount-option", value_name = "OPTION", requires = "manifest")]
    pub mount_options: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CapacityArgs {
    #[command(flatten)]
    pub access: AccessArgs,
    /// Creation parameter, as CreateVolume would get it (repeatable)
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub params: Vec<(String, String)>,
}

#[derive(Debug, Args)]
pub struct ExpandArgs {
    /// Volume id (csi-...)
    pub volume_id: String,
    /// New required size, e.g. 2Gi
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Largest size the driver may round up to
    #[arg(long, value_parser = parse_size)]
    pub limit: Option<u64>,
    /// Where the volume is published or staged on this node: grow its
    /// filesystem there too (NodeExpandVolume) when the driver asks for it
    #[arg(long, value_name = "PATH")]
    pub path: Option<String>,
    /// Its staging directory (with --path)
    #[arg(long, value_name = "PATH", requires = "path")]
    pub staging: Option<String>,
}

#[derive(Debug, Args)]
pub struct NodeAccessArgs {
    #[command(flatten)]
    pub access: AccessArgs,
    /// Mount flag (repeatable), e.g. noatime
    #[arg(long = "mount-flag", value_name = "FLAG")]
    pub mount_flags: Vec<String>,
}

const OWN_ACCESS: &str = "Without --fs or --block, the volume's own access type is used \
(ControllerGetVolume: the fsType in its context; none means block).";

#[derive(Debug, Args)]
#[command(after_help = OWN_ACCESS)]
pub struct StageArgs {
    /// Volume id (csi-...)
    pub volume_id: String,
    /// Staging directory (it must exist, under the driver's allowed_roots)
    pub staging_path: String,
    /// An encrypted volume's passphrase: the file's bytes exactly ("-":
    /// standard input); sent as the secret "passphrase", never on a
    /// command line
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<String>,
    #[command(flatten)]
    pub node: NodeAccessArgs,
}

#[derive(Debug, Args)]
#[command(after_help = OWN_ACCESS)]
pub struct PublishArgs {
    /// Volume id (csi-...)
    pub volume_id: String,
    /// Target path (its parent must exist; the driver creates it)
    pub target_path: String,
    /// The staging directory the volume is staged at
    #[arg(long, value_name = "PATH")]
    pub staging: String,
    /// Publish read-only
    #[arg(long)]
    pub readonly: bool,
    #[command(flatten)]
    pub node: NodeAccessArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Without --node: ControllerReclaimSpace, for a volume nothing uses \
(not staged). With --node: NodeReclaimSpace of a staged filesystem (give --path or --staging)."
)]
pub struct ReclaimArgs {
    /// Volume id (csi-...)
    pub volume_id: String,
    /// Reclaim on this node (the volume is staged here)
    #[arg(long)]
    pub node: bool,
    /// A path the volume is published at (with --node)
    #[arg(long, value_name = "PATH", requires = "node")]
    pub path: Option<String>,
    /// Its staging directory (with --node)
    #[arg(long, value_name = "PATH", requires = "node")]
    pub staging: Option<String>,
}

#[derive(Debug, Args)]
pub struct RotateKeyArgs {
    /// Volume id (csi-...)
    pub volume_id: String,
    /// The current passphrase (file, "-": standard input)
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: String,
    /// The new passphrase (file, "-": standard input)
    #[arg(long, value_name = "FILE")]
    pub new_passphrase_file: String,
}

#[derive(Debug, Args)]
pub struct HealArgs {
    /// Volume id (csi-...)
    pub volume_id: String,
    /// A path the volume is published at
    #[arg(long, value_name = "PATH")]
    pub path: String,
    /// Its staging directory
    #[arg(long, value_name = "PATH")]
    pub staging: Option<String>,
    #[command(flatten)]
    pub access: AccessArgs,
}

/// CSI access modes, by their lower-case kebab names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum AccessMode {
    #[default]
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
}

impl From<AccessMode> for Mode {
    fn from(m: AccessMode) -> Mode {
        match m {
            AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
            AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            AccessMode::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
            AccessMode::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
            AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        }
    }
}

/// A size as the driver's config reads it (`1Gi`, `512MiB`, `4096`), and
/// not 0: the driver is the judge of everything else.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match thinpool_csi::config::parse_size(s)? {
        0 => Err("a size must not be 0".into()),
        n if n > i64::MAX as u64 => Err(format!("{s:?} is larger than CSI can carry")),
        n => Ok(n),
    }
}

/// A device class name, as the driver's config takes it.
pub fn parse_class(s: &str) -> Result<String, String> {
    thinpool_csi::naming::validate_class_name(s).map(|()| s.to_string())
}

/// `KEY=VALUE`, the key not empty; the value may hold `=`.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("tpcsi").chain(args.iter().copied()))
    }

    #[test]
    fn a_move_s_manifest_needs_final_a_claim_and_a_class() {
        let base = ["move", "v", "--to", "node-3", "--name", "pv-new"];
        let with = |extra: &[&str]| parse(&[&base[..], extra].concat());
        let manifest = [
            "--manifest",
            "m.yaml",
            "--claim",
            "a/b",
            "--storage-class",
            "sc",
        ];
        let ok = with(&[&["--final"][..], &manifest].concat());
        let Command::Move(m) = ok.unwrap().command else {
            panic!("not move")
        };
        assert_eq!(m.manifest.as_deref(), Some(std::path::Path::new("m.yaml")));
        assert_eq!(
            (m.claim.as_deref(), m.storage_class.as_deref()),
            (Some("a/b"), Some("sc"))
        );
        for bad in [
            &manifest[..],
            &["--final", "--manifest", "m.yaml", "--storage-class", "sc"],
            &["--final", "--manifest", "m.yaml", "--claim", "a/b"],
            &["--final", "--claim", "a/b"],
        ] {
            assert!(with(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse_as_the_config_does() {
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").unwrap_err().contains("0"));
        assert!(parse_size("0Gi").is_err());
        assert!(parse_size("1.5Gi").is_err());
        assert!(parse_size("1GB").is_err());
        assert!(parse_size("8191Pi").is_err());
        assert!(parse_size("8388608Ti").unwrap_err().contains("larger"));
        assert_eq!(parse_size("8388607Ti"), Ok(8388607 << 40));
    }

    #[test]
    fn key_values() {
        assert_eq!(
            parse_key_value("readAheadSectors=256"),
            Ok(("readAheadSectors".into(), "256".into()))
        );
        assert_eq!(parse_key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_key_value("a="), Ok(("a".into(), String::new())));
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("novalue").is_err());
    }

    #[test]
    fn create_takes_sizes_and_access() {
        let cli = parse(&[
            "create",
            "pvc-1",
            "--size",
            "1Gi",
            "--limit",
            "2Gi",
            "--fs",
            "xfs",
            "--param",
            "volumeGroup=vg",
            "--mode",
            "single-node-reader-only",
            "--json",
        ])
        .unwrap();
        assert!(cli.global.json);
        let Command::Create(c) = cli.command else {
            panic!("not create: {:?}", cli.command)
        };
        assert_eq!(c.name, "pvc-1");
        assert_eq!(c.size, Some(1 << 30));
        assert_eq!(c.limit, Some(2 << 30));
        assert_eq!(c.access.fs.as_deref(), Some("xfs"));
        assert!(!c.access.block);
        assert_eq!(c.access.mode, AccessMode::SingleNodeReaderOnly);
        assert_eq!(c.params, vec![("volumeGroup".into(), "vg".into())]);
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        use clap::error::ErrorKind;
        let kind = |args: &[&str]| parse(args).unwrap_err().kind();
        assert_eq!(
            kind(&["create", "v", "--size", "1GB"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            kind(&["create", "v", "--fs", "ext4", "--block"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind(&["create", "v", "--from-snapshot", "s", "--from-volume", "v"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(kind(&["expand", "v"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            kind(&["reclaim", "v", "--path", "/x"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            kind(&["create", "v", "--mode", "everyone"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(kind(&["frobnicate"]), ErrorKind::InvalidSubcommand);
        assert_eq!(
            kind(&["--timeout", "0", "list"]),
            ErrorKind::ValueValidation
        );
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = parse(&[
            "--endpoint",
            "unix:///tmp/a.sock",
            "list",
            "--json",
            "--addons-endpoint",
            "unix:///tmp/b.sock",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::List(ClassFilter { class: None })
        ));
        assert!(cli.global.json);
        assert_eq!(cli.global.endpoint.as_deref(), Some("unix:///tmp/a.sock"));
        assert_eq!(
            cli.global.addons_endpoint.as_deref(),
            Some("unix:///tmp/b.sock")
        );
    }

    #[test]
    fn node_commands() {
        let cli = parse(&[
            "publish",
            "csi-a-0123456789abcdef",
            "/k/pods/p/vol",
            "--staging",
            "/k/staging/a",
            "--readonly",
            "--mount-flag",
            "noatime",
        ])
        .unwrap();
        let Command::Publish(p) = cli.command else {
            panic!("not publish")
        };
        assert!(p.readonly);
        assert_eq!(p.staging, "/k/staging/a");
        assert_eq!(p.node.mount_flags, vec!["noatime".to_string()]);
        assert!(p.node.access.fs.is_none() && !p.node.access.block);
        let cli = parse(&["reclaim", "v", "--node", "--staging", "/k/s"]).unwrap();
        let Command::Reclaim(r) = cli.command else {
            panic!("not reclaim")
        };
        assert!(r.node);
        assert_eq!(r.staging.as_deref(), Some("/k/s"));
        let cli = parse(&["snapshot", "list", "--volume", "csi-x"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Snapshot(SnapshotCommand::List { volume: Some(ref v), id: None, .. }) if v == "csi-x"
        ));
    }

    #[test]
    fn listings_and_probe_take_their_flags() {
        use clap::error::ErrorKind;
        let cli = parse(&["list", "--class", "fast"]).unwrap();
        assert!(
            matches!(cli.command, Command::List(ClassFilter { class: Some(ref c) }) if c == "fast")
        );
        let cli = parse(&["snapshot", "list", "--class", "default"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Snapshot(SnapshotCommand::List { filter: ClassFilter { class: Some(ref c) }, .. }) if c == "default"
        ));
        // Not a class name: a usage error, before any call.
        let kind = |args: &[&str]| parse(args).unwrap_err().kind();
        assert_eq!(
            kind(&["list", "--class", "Fast"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(kind(&["list", "--class", ""]), ErrorKind::ValueValidation);
        let cli = parse(&["probe"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Probe(ProbeArgs {
                tolerate_other_classes: false
            })
        ));
        let cli = parse(&["probe", "--tolerate-other-classes"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Probe(ProbeArgs {
                tolerate_other_classes: true
            })
        ));
    }
}
