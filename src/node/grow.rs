//! Online growth of a mounted filesystem to the size of its device.

use std::path::Path;

use crate::error::{Error, Result};
use crate::node::{Device, Tools};
use crate::sys;

/// Grows the filesystem of `dev` mounted at `mountpoint` to the size of
/// the device, online. Already full size is a no-op.
///
/// ext4: `resize2fs <device>`. xfs: the grow ioctls on a descriptor of
/// `mountpoint` checked to be the root of a mount of `dev`
/// ([`sys::open_mount_root`]), not `xfs_growfs <mountpoint>`, which would
/// look the path up again and grow whatever filesystem is there by then.
pub async fn grow(tools: &Tools, fs_type: &str, dev: &Device, mountpoint: &Path) -> Result<()> {
    match fs_type {
        "ext4" => {
            tools
                .run("resize2fs", &[dev.path.to_string_lossy().into_owned()])
                .await?;
            tracing::info!(device = %dev.path.display(), mountpoint = %mountpoint.display(), fs_type, "grew filesystem");
            Ok(())
        }
        "xfs" => {
            let (d, at) = (dev.clone(), mountpoint.to_path_buf());
            tools
                .blocking("grow the xfs filesystem", move || grow_xfs(&d, &at))
                .await
        }
        other => Err(Error::InvalidArgument(format!(
            "cannot grow a {other} filesystem"
        ))),
    }
}

/// The xfs half of [`grow`], blocking.
pub fn grow_xfs(dev: &Device, mountpoint: &Path) -> Result<()> {
    let root = sys::open_mount_root(mountpoint, dev.numbers())?;
    let bytes = sys::block_size_bytes(&dev.path)?;
    let before = sys::xfs::geometry(&root, mountpoint)?;
    let Some(newblocks) = xfs_grow_to(&before, bytes).map_err(|why| {
        Error::FailedPrecondition(format!(
            "cannot grow the xfs filesystem of volume {} at {}: {why}",
            dev.volume_id,
            mountpoint.display()
        ))
    })?
    else {
        tracing::info!(volume = dev.volume_id, mountpoint = %mountpoint.display(),
            blocks = before.datablocks, "xfs filesystem already spans its device");
        return Ok(());
    };
    sys::xfs::grow_data(&root, mountpoint, newblocks, before.imaxpct)?;
    let after = sys::xfs::geometry(&root, mountpoint)?;
    tracing::info!(volume = dev.volume_id, device = %dev.path.display(), mountpoint = %mountpoint.display(),
        blocksize = before.blocksize, old_blocks = before.datablocks, new_blocks = after.datablocks,
        "grew xfs filesystem");
    Ok(())
}

/// The block count to grow an xfs filesystem of geometry `geo` to on a
/// device of `device_bytes`: `None` when it spans the device already
/// (whole blocks), an error when the device is smaller than the
/// filesystem (growing to that would ask the kernel to shrink it).
pub fn xfs_grow_to(geo: &sys::xfs::Geometry, device_bytes: u64) -> Result<Option<u64>, String> {
    if geo.blocksize == 0 {
        return Err("the kernel reported a block size of 0".into());
    }
    let fits = device_bytes / u64::from(geo.blocksize);
    match fits.cmp(&geo.datablocks) {
        std::cmp::Ordering::Equal => Ok(None),
        std::cmp::Ordering::Greater => Ok(Some(fits)),
        std::cmp::Ordering::Less => Err(format!(
            "the device holds {fits} blocks of {} bytes, fewer than the filesystem's {}",
            geo.blocksize, geo.datablocks
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xfs_grows_to_whole_blocks_of_the_device_and_never_shrinks() {
        let geo = sys::xfs::Geometry {
            blocksize: 4096,
            datablocks: 1000,
            imaxpct: 25,
        };
        assert_eq!(xfs_grow_to(&geo, 1000 * 4096), Ok(None));
        // A tail shorter than a block is not a block.
        assert_eq!(xfs_grow_to(&geo, 1000 * 4096 + 4095), Ok(None));
        assert_eq!(xfs_grow_to(&geo, 2000 * 4096 + 512), Ok(Some(2000)));
        let e = xfs_grow_to(&geo, 999 * 4096).unwrap_err();
        assert!(e.contains("999") && e.contains("1000"), "{e}");
        let zero = sys::xfs::Geometry {
            blocksize: 0,
            ..geo
        };
        assert!(xfs_grow_to(&zero, 1 << 30).is_err());
    }
}
