//! Test helpers shared by the LVM layer's unit tests.

use std::path::Path;
use std::sync::Arc;

use super::Lvm;
use crate::config::{Config, UdevMode};

/// An `Lvm` of VG `vg1` (udev on) whose binary is a shell script with
/// `body`; `tweak` sets the rest of its config.
pub(super) fn script_lvm(dir: &Path, body: &str, tweak: impl FnOnce(&mut Config)) -> Arc<Lvm> {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("lvm");
    std::fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = Config {
        lvm_binary: script.display().to_string(),
        udev: UdevMode::On,
        volume_group: "vg1".into(),
        // These fakes take one command per run; `fake_shell` speaks
        // the shell's protocol.
        lvm_shell: false,
        ..Config::default()
    };
    tweak(&mut cfg);
    Arc::new(Lvm::new(&cfg))
}
