//! What every service shares: the configuration, the node id, the LVM
//! layer and the in-flight guard.

use crate::config::Config;
use crate::guard::InFlight;
use crate::lvm::Lvm;

pub struct Driver {
    pub cfg: Config,
    pub node_id: String,
    pub lvm: Lvm,
    pub inflight: InFlight,
    /// Serialises "check capacity, then allocate", so two concurrent
    /// creates cannot both pass the overprovision check.
    pub alloc: tokio::sync::Mutex<()>,
}

impl Driver {
    pub fn new(cfg: Config, node_id: String) -> Driver {
        Driver {
            lvm: Lvm::new(&cfg),
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
