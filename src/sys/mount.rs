//! Mounts: filesystem mounts, bind mounts (read-only done right), and
//! unmounts.

use std::path::Path;

use nix::errno::Errno;
use nix::mount::{self as nix_mount, MntFlags};
use nix::sys::statvfs::{self, FsFlags};

pub use nix::mount::MsFlags;

use super::{Result, SysError, SysErrorKind};

/// Mounts filesystem `source` (a block device path) of type `fstype` on
/// `target` with `flags` and filesystem-specific `data` (e.g.
/// `"discard,errors=remount-ro"`).
pub fn mount_fs(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    nix_mount::mount(Some(source), target, Some(fstype), flags, data).map_err(|e| {
        SysError::new("mount", target, e).with_detail(format!(
            "source {}, type {fstype}, flags {flags:?}, data {data:?}",
            source.display()
        ))
    })?;
    tracing::info!(source = %source.display(), target = %target.display(), fstype, ?flags, data, "mounted filesystem");
    Ok(())
}

/// statvfs(2) of the filesystem holding `path`; the errno stays whole (a
/// shut-down xfs answers EIO).
pub fn statvfs(path: &Path) -> std::result::Result<statvfs::Statvfs, nix::errno::Errno> {
    statvfs::statvfs(path)
}

/// Bind-mounts `source` (a directory or file) on `target`, non-recursively.
///
/// The kernel ignores `MS_RDONLY` on the initial bind, so a read-only bind
/// takes a second call, `MS_REMOUNT | MS_BIND | MS_RDONLY`, which changes only
/// this mount (not the source). That remount replaces all per-mount flags, so
/// `nosuid`/`nodev`/`noexec` inherited from the source are read back with
/// statvfs and passed again (atime flags the kernel keeps by itself). If the
/// remount fails, the writable bind is unmounted again before returning.
pub fn bind_mount(source: &Path, target: &Path, readonly: bool) -> Result<()> {
    bind(source, target)?;
    if readonly {
        seal_readonly(target, target, || {
            nix_mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW)
        })?;
    }
    tracing::info!(source = %source.display(), target = %target.display(), readonly, "bind-mounted");
    Ok(())
}

/// `mount(source, target, MS_BIND)`: a writable bind, non-recursive.
pub(super) fn bind(source: &Path, target: &Path) -> Result<()> {
    nix_mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        SysError::new("mount(MS_BIND)", target, e)
            .with_detail(format!("source {}", source.display()))
    })
}

/// Makes the bind mount on top of `top` read-only, keeping the
/// `nosuid`/`nodev`/`noexec` it inherited (see [`bind_mount`]); on failure
/// the bind is undone with `undo`. `shown` names the target in errors.
pub(super) fn seal_readonly(
    top: &Path,
    shown: &Path,
    undo: impl FnOnce() -> nix::Result<()>,
) -> Result<()> {
    let remount = || -> Result<()> {
        let kept = self::statvfs(top)
            .map_err(|e| SysError::new("statvfs", shown, e))?
            .flags();
        let mut flags = MsFlags::MS_RDONLY;
        for (st, ms) in [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        ] {
            if kept.contains(st) {
                flags |= ms;
            }
        }
        remount_flags(top, flags)
    };
    if let Err(e) = remount() {
        if let Err(failed) = undo() {
            tracing::error!(target = %shown.display(), error = %failed, "could not undo writable bind mount after failed read-only remount");
        }
        return Err(e);
    }
    Ok(())
}

/// Sets the per-mount flags of the mount on top of `target` to `flags`
/// (`MS_RDONLY`, `MS_NOSUID`, `MS_NODEV`, `MS_NOEXEC`), with
/// `MS_REMOUNT | MS_BIND`: only this mount changes, not its filesystem or
/// other mounts of it. Flags not given are cleared.
pub fn remount_flags(target: &Path, flags: MsFlags) -> Result<()> {
    nix_mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags,
        None::<&str>,
    )
    .map_err(|e| {
        SysError::new("mount(MS_REMOUNT|MS_BIND)", target, e).with_detail(format!("{flags:?}"))
    })?;
    tracing::info!(target = %target.display(), ?flags, "set per-mount flags");
    Ok(())
}

/// Unmounts the mount on top of `target` (`umount2` with
/// `UMOUNT_NOFOLLOW`, so a symlink swapped in at `target` is never
/// followed to another mount; no lazy detach: a busy mount fails with
/// [`SysErrorKind::Busy`] instead of lingering).
///
/// Fails with [`SysErrorKind::NotMounted`] if `target` exists but is not a
/// mount point (`EINVAL`), and with [`SysErrorKind::NotFound`] if it does not
/// exist; callers that want idempotent unmounts treat both as done.
pub fn unmount(target: &Path) -> Result<()> {
    nix_mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW).map_err(|e| {
        let err = SysError::new("umount2", target, e);
        if e == Errno::EINVAL {
            err.with_kind(SysErrorKind::NotMounted)
        } else {
            err
        }
    })?;
    tracing::info!(target = %target.display(), "unmounted");
    Ok(())
}
