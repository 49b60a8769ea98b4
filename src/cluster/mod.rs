//! The cluster's controller (docs/cluster.md): no LVM, no host path, no
//! state a restart loses. It answers each controller call by forwarding
//! it, over the internal channel (mutual TLS, `crate::channel` on the
//! node), to the node plugin that holds the object the call names, and
//! passes the node's answer back unchanged: ids carry their node's key
//! (`naming::NodeIds`), which the node minted.
//!
//! - [`nodes`]: the node plugins the controller knows, by node key, and a
//!   lazily connected channel to each; [`discovery`] lists them from the
//!   Kubernetes API (the node plugin pods), or the config lists them.
//! - [`route`]: the node of an id: its key, or for an id minted before the
//!   cluster, the node that answers for it (asked once, then kept).
//! - [`forward`]: each controller call, sent to its node; the listings and
//!   GetCapacity, which span nodes.

pub mod capacity;
pub mod config;
pub mod discovery;
pub mod forward;
pub mod nodes;
pub mod route;

pub use config::ControllerConfig;
pub use forward::Cluster;
