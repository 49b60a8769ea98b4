//! thinpool-csi: a CSI driver whose volumes are thin LVs of one LVM thin
//! pool. See ARCHITECTURE.md for the map of the code.

pub mod blocking;
pub mod channel;
pub mod cluster;
pub mod config;
pub mod error;
pub mod exec;
pub mod fs_options;
pub mod grpc;
pub mod guard;
pub mod logging;
pub mod lvm;
pub mod metrics;
pub mod mountinfo;
pub mod naming;
pub mod node;
pub mod pool;
pub mod proto;
pub mod socket;
pub mod sys;
pub mod volume;
