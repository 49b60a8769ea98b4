//! The LVM suite: runs inside the VM (`scripts/test.sh vm`) against the real
//! binary over its unix socket.

#[path = "../common/mod.rs"]
mod common;
mod fixtures;
mod harness;

mod addons;
mod autopilot;
mod classes;
mod cli;
mod cluster;
mod cluster_rig;
mod concurrency;
mod conformance;
mod controller;
mod encryption;
mod formatting;
mod full_pool;
mod group;
mod iolimits;
mod kubelet;
mod metadata;
mod metrics;
mod node;
mod properties;
mod resilience;
mod room;
mod sidecars;
mod snapshot;

/// Printed once per run, so CI output shows where the suite ran.
#[test]
fn environment() {
    harness::require_lvm();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let version = harness::lvm(&["version"]);
    eprintln!(
        "LVM suite: kernel {} {}",
        kernel.trim(),
        version.lines().next().unwrap_or("")
    );
    assert!(version.contains("LVM version"));
}
