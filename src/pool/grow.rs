//! Growing a thin pool: its data (`lvextend -L +N`), its metadata
//! (`lvextend --poolmetadatasize +N`, which grows LVM's spare copy too),
//! the file, loop device and PV under a loop-backed VG, and the pool's
//! behaviour when full (`lvchange --errorwhenfull`). Each step is one
//! command or syscall, logged; the decisions are the autopilot's
//! (`volume::autopilot`).

use std::path::Path;

use crate::error::{Error, Result};
use crate::lvm::Lvm;
use crate::pool::loopdev;
use crate::sys;

/// Adds `by` bytes (a whole number of extents) to the pool's data.
pub async fn grow_data(lvm: &Lvm, by: u64) -> Result<()> {
    lvm.change(
        "lvextend",
        crate::argv!["--size", format!("+{by}b"), lvm.lv_path(&lvm.pool)],
    )
    .await
    .map(drop)
}

/// Adds `by` bytes to the pool's metadata (and LVM's spare metadata LV,
/// which follows it: the VG needs twice `by` free).
pub async fn grow_metadata(lvm: &Lvm, by: u64) -> Result<()> {
    lvm.change(
        "lvextend",
        crate::argv![
            "--poolmetadatasize",
            format!("+{by}b"),
            lvm.lv_path(&lvm.pool)
        ],
    )
    .await
    .map(drop)
}

/// Sets what the pool does when its data is full: fail writes (`true`)
/// or queue them.
pub async fn set_error_when_full(lvm: &Lvm, error: bool) -> Result<()> {
    lvm.change(
        "lvchange",
        crate::argv![
            "--errorwhenfull",
            if error { "y" } else { "n" },
            lvm.lv_path(&lvm.pool)
        ],
    )
    .await
    .map(drop)
}

/// What the host filesystem of `file` can still give it, keeping
/// `reserve` free, and the file's size now.
pub fn backing_room(file: &Path, reserve: u64) -> Result<(u64, u64)> {
    let size = std::fs::metadata(file)
        .map_err(|e| Error::from(sys::SysError::io("stat", file, e)))?
        .len();
    let dir = file.parent().unwrap_or(Path::new("/"));
    let st =
        sys::mount::statvfs(dir).map_err(|e| Error::from(sys::SysError::new("statvfs", dir, e)))?;
    // statvfs's counts are libc aliases: u64 here, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    Ok((free.saturating_sub(reserve), size))
}

/// Grows the backing file of a loop-backed VG to `to` bytes, then its
/// loop device and its PV, so the VG gains the difference. Each step
/// leaves what a retry finishes: a longer file is taken up by the next
/// LOOP_SET_CAPACITY and `pvresize`.
pub async fn grow_backing(lvm: &Lvm, file: &Path, to: u64) -> Result<()> {
    let f = file.to_path_buf();
    let dev = tokio::task::spawn_blocking(move || -> Result<std::path::PathBuf> {
        sys::grow_file(&f, to)?;
        let dev = loopdev::find_loop_for_file(&f)?.ok_or_else(|| {
            Error::Unavailable(format!("no loop device is attached to {}", f.display()))
        })?;
        loopdev::loop_set_capacity(&dev)?;
        Ok(dev)
    })
    .await
    .map_err(|e| Error::Internal(format!("grow the backing file: {e}")))??;
    lvm.change("pvresize", crate::argv![dev.display().to_string()])
        .await
        .map(drop)
}
