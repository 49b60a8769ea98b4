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

/// Grows the pool's data to `to` bytes (a whole number of extents): an
/// absolute size, so a growth someone else made meanwhile is not added to.
pub async fn grow_data(lvm: &Lvm, to: u64) -> Result<()> {
    lvm.change(
        "lvextend",
        crate::argv!["--size", format!("{to}b"), lvm.lv_path(&lvm.pool)],
    )
    .await
    .map(drop)
}

/// Grows the pool's metadata to `to` bytes (LVM's spare metadata LV
/// follows it: the VG needs the growth twice).
pub async fn grow_metadata(lvm: &Lvm, to: u64) -> Result<()> {
    lvm.change(
        "lvextend",
        crate::argv![
            "--poolmetadatasize",
            format!("{to}b"),
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
/// `reserve` free once the file is written whole: the holes it has already
/// count against the free space, since the pool will write into them. And
/// the file's size now.
pub fn backing_room(file: &Path, reserve: u64) -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(file).map_err(|e| Error::from(sys::SysError::io("stat", file, e)))?;
    let (size, allocated) = (meta.len(), meta.blocks() * 512);
    let dir = file.parent().unwrap_or(Path::new("/"));
    let st =
        sys::mount::statvfs(dir).map_err(|e| Error::from(sys::SysError::new("statvfs", dir, e)))?;
    // statvfs's counts are libc aliases: u64 here, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let holes = size.saturating_sub(allocated);
    Ok((free.saturating_sub(reserve).saturating_sub(holes), size))
}

/// Makes the loop device and the PV over `file` take the file's whole
/// size: `true` when they were short of it (a growth of the file whose
/// later steps did not run: the driver stopped, or a step failed).
pub async fn finish_backing(lvm: &Lvm, file: &Path) -> Result<bool> {
    let f = file.to_path_buf();
    let short = tokio::task::spawn_blocking(move || -> Result<Option<std::path::PathBuf>> {
        let len = std::fs::metadata(&f)
            .map_err(|e| Error::from(sys::SysError::io("stat", &f, e)))?
            .len();
        let dev = loopdev::find_loop_for_file(&f)?.ok_or_else(|| {
            Error::Unavailable(format!("no loop device is attached to {}", f.display()))
        })?;
        if sys::block_size_bytes(&dev)? >= len {
            return Ok(None);
        }
        loopdev::loop_set_capacity(&dev)?;
        Ok(Some(dev))
    })
    .await
    .map_err(|e| Error::Internal(format!("finish the backing file's growth: {e}")))??;
    let Some(dev) = short else {
        return Ok(false);
    };
    lvm.change("pvresize", crate::argv![dev.display().to_string()])
        .await?;
    Ok(true)
}

/// Grows the backing file of a loop-backed VG to `to` bytes, then its
/// loop device and its PV ([`finish_backing`]), so the VG gains the
/// difference. A step that does not run is finished by the next call.
pub async fn grow_backing(lvm: &Lvm, file: &Path, to: u64) -> Result<()> {
    let f = file.to_path_buf();
    tokio::task::spawn_blocking(move || sys::grow_file(&f, to))
        .await
        .map_err(|e| Error::Internal(format!("grow the backing file: {e}")))??;
    finish_backing(lvm, file).await.map(drop)
}
