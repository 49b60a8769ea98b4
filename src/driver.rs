//! What every service shares: the configuration, the node id, the LVM
//! layer, the node layer's tools, the node records and the in-flight guard.

use crate::config::Config;
use crate::guard::InFlight;
use crate::lvm::Lvm;
use crate::node::record::Records;
use crate::node::Tools;

pub struct Driver {
    pub cfg: Config,
    pub node_id: String,
    pub lvm: Lvm,
    pub tools: Tools,
    /// The node records under `state_dir` (`node::record`).
    pub records: Records,
    pub inflight: InFlight,
    /// Serialises "check capacity, then allocate", so two concurrent
    /// creates cannot both pass the overprovision check.
    pub alloc: tokio::sync::Mutex<()>,
}

impl Driver {
    pub fn new(cfg: Config, node_id: String) -> Driver {
        Driver {
            lvm: Lvm::new(&cfg),
            tools: Tools::new(&cfg),
            records: Records::new(&cfg.state_dir),
            cfg,
            node_id,
            inflight: InFlight::default(),
            alloc: tokio::sync::Mutex::new(()),
        }
    }

    pub fn topology_key(&self) -> String {
        self.cfg.topology_key()
    }
}
