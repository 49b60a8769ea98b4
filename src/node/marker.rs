//! Formatting markers: one small file per volume, under `state_dir`, that
//! means one thing: a format the driver began on a blank volume has not
//! finished. It is written before the first write of the format (mkfs; for
//! an encrypted volume, `luksFormat`) and removed once the last one exited
//! 0 (mkfs of the filesystem inside; for raw block, LUKS2 alone). So a
//! marker that a stage finds before it writes anything was left by an
//! earlier call that was cut: that, and only that, is logged as
//! [`UNFINISHED`] (see `mounts::stage`, `volume::crypt`). Written with
//! fsync of the file and its directory, so it survives a crash or a reboot.

use std::path::Path;

use crate::error::{Error, Result};
use crate::node::durable;

/// The warning a stage logs when it finds a marker an earlier call left.
pub const UNFINISHED: &str = "a format this driver began did not finish; formatting again";

/// True when the marker exists.
pub fn exists(marker: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(marker) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(format!("stat {}", marker.display()), e)),
    }
}

/// Creates the marker (and its directory) durably.
pub fn write(marker: &Path, volume_id: &str) -> Result<()> {
    durable::write_atomic(marker, volume_id.as_bytes())?;
    tracing::info!(marker = %marker.display(), volume = volume_id, "formatting marker written");
    Ok(())
}

/// Removes the marker durably; a missing one is fine.
pub fn remove(marker: &Path) -> Result<()> {
    if durable::remove(marker)? {
        tracing::info!(marker = %marker.display(), "formatting marker removed");
    }
    Ok(())
}
