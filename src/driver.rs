//! What every service shares: the configuration, the node id, the LVM
//! layer, the node layer's tools, the node records and the in-flight guard.

use crate::config::Config;
use crate::guard::InFlight;
use crate::lvm::Lvm;
use crate::metrics::Metrics;
use crate::node::record::Records;
use crate::node::Tools;

pub struct Driver {
    pub cfg: Config,
    pub node_id: String,
    pub lvm: std::sync::Arc<Lvm>,
    pub tools: Tools,
    /// The node records under `state_dir` (`node::record`).
    pub records: Records,
    pub inflight: InFlight,
    /// Serialises "check capacity, then allocate", so two concurrent
    /// creates cannot both pass the overprovision check.
    pub alloc: tokio::sync::Mutex<()>,
    /// Virtual sizes of new volumes whose `lvcreate` runs (checked under
    /// `alloc`, then made outside it, so creates overlap): counted by
    /// `Driver::capacity` until the report shows the LV.
    pub reserved: crate::volume::Reservations,
    /// Whether thin-provisioning-tools run here (set at start-up): the
    /// SnapshotMetadata service is advertised and served only then.
    pub thin_tools: std::sync::atomic::AtomicBool,
    /// Per-RPC counts and latencies, reclaimed bytes (`crate::metrics`).
    pub metrics: std::sync::Arc<Metrics>,
}

impl Driver {
    pub fn new(cfg: Config, node_id: String) -> Driver {
        Driver {
            lvm: std::sync::Arc::new(Lvm::new(&cfg)),
            tools: Tools::new(&cfg),
            records: Records::new(&cfg.state_dir),
            cfg,
            node_id,
            inflight: InFlight::default(),
            alloc: tokio::sync::Mutex::new(()),
            reserved: Default::default(),
            thin_tools: std::sync::atomic::AtomicBool::new(false),
            metrics: Default::default(),
        }
    }

    /// Whether the SnapshotMetadata service can work on this node.
    pub fn serves_metadata(&self) -> bool {
        self.thin_tools.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn topology_key(&self) -> String {
        self.cfg.topology_key()
    }
}
