//! Paths opened beneath a root, never through a symlink: the one check a
//! staging or target path gets before the driver acts on it, done by the
//! kernel at open time, so that a symlink swapped in after any earlier
//! look cannot carry a mount, a node or a chmod out of the root.
//!
//! [`open_beneath`] opens `path` relative to its root's descriptor with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`;
//! where the kernel lacks openat2 (ENOSYS, before 5.6) it walks the path
//! one component at a time with `openat(O_PATH | O_NOFOLLOW)`, refusing a
//! symlink, `..` and anything but a directory on the way. Callers then act
//! on the descriptor: mount onto [`fd_path`] of an `O_PATH` descriptor,
//! [`make_block_node_beneath`] with mknodat relative to the parent's
//! descriptor. Both refuse with `ELOOP` (a symlink) or `EXDEV` (outside
//! the root).

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, Mode, SFlag};

use super::{split_dev, Result, SysError};

/// The `/proc/self/fd/N` link of `fd`: a path the kernel resolves to
/// exactly the inode `fd` holds (mount(2) and chmod(2) take it).
pub fn fd_path(fd: &impl AsFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
}

/// Opens `path`, which must lie strictly under `root`, with `flags`
/// (`O_NOFOLLOW` and `O_CLOEXEC` are always added), through no symlink and
/// no `..`; see the module documentation. `root` itself is opened as the
/// kernel resolves it (it comes from the config).
pub fn open_beneath(root: &Path, path: &Path, flags: OFlag) -> Result<OwnedFd> {
    let rel = relative(root, path)?;
    let dir = super::open("open(root)", root, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
    open_at(&dir, rel, path, flags)
}

/// [`open_beneath`] relative to an open directory.
fn open_at(dir: &OwnedFd, rel: &Path, shown: &Path, flags: OFlag) -> Result<OwnedFd> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    match fcntl::openat2(dir, rel, how) {
        Ok(fd) => refuse_symlink(fd, shown),
        // ENOSYS: a kernel before 5.6; EPERM: a seccomp profile that
        // predates openat2 (older container runtimes answer so).
        Err(Errno::ENOSYS | Errno::EPERM) => walk(dir, rel, shown, flags),
        Err(e) => Err(SysError::new(
            "openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)",
            shown,
            e,
        )),
    }
}

/// `path` relative to `root`, with `..` refused and `.` dropped.
fn relative<'a>(root: &Path, path: &'a Path) -> Result<&'a Path> {
    let rel = path
        .strip_prefix(root)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .ok_or_else(|| {
            SysError::new("open beneath", path, Errno::EXDEV)
                .with_detail(format!("not under {}", root.display()))
        })?;
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(SysError::new("open beneath", path, Errno::EXDEV)
            .with_detail("'..' or an absolute part".to_string()));
    }
    Ok(rel)
}

/// The fallback: one component at a time, each opened `O_PATH |
/// O_NOFOLLOW` relative to the one before, each but the last a directory.
fn walk(dir: &OwnedFd, rel: &Path, shown: &Path, flags: OFlag) -> Result<OwnedFd> {
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(SysError::new("open beneath", shown, Errno::EXDEV));
    };
    let mut at: Option<OwnedFd> = None;
    for name in parents {
        let base = at.as_ref().unwrap_or(dir);
        let next = fcntl::openat(
            base,
            *name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| SysError::new("openat(O_PATH|O_NOFOLLOW)", shown, e))?;
        let st = stat::fstat(&next).map_err(|e| SysError::new("fstat", shown, e))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFLNK {
            return Err(
                SysError::new("openat(O_PATH|O_NOFOLLOW)", shown, Errno::ELOOP)
                    .with_detail(format!("{} is a symbolic link", name.to_string_lossy())),
            );
        }
        if kind != SFlag::S_IFDIR {
            return Err(SysError::new(
                "openat(O_PATH|O_NOFOLLOW)",
                shown,
                Errno::ENOTDIR,
            ));
        }
        at = Some(next);
    }
    let base = at.as_ref().unwrap_or(dir);
    let fd = fcntl::openat(base, *last, flags, Mode::empty())
        .map_err(|e| SysError::new("openat(O_NOFOLLOW)", shown, e))?;
    refuse_symlink(fd, shown)
}

/// `O_PATH | O_NOFOLLOW` opens a symlink itself rather than failing:
/// such a descriptor is refused here.
fn refuse_symlink(fd: OwnedFd, shown: &Path) -> Result<OwnedFd> {
    let st = stat::fstat(&fd).map_err(|e| SysError::new("fstat", shown, e))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
        return Err(SysError::new("open beneath", shown, Errno::ELOOP)
            .with_detail("the path is a symbolic link".to_string()));
    }
    Ok(fd)
}

/// A path strictly under an allowed root, both as the kernel shows them
/// (the root canonical).
#[derive(Debug, Clone, Copy)]
pub struct Under<'a> {
    pub root: &'a Path,
    pub path: &'a Path,
}

impl Under<'_> {
    /// [`open_beneath`] of this path.
    pub fn open(&self, flags: OFlag) -> Result<OwnedFd> {
        open_beneath(self.root, self.path, flags)
    }

    /// The parent directory, opened beneath the root (the root itself
    /// when it is the parent), and the last component.
    fn parent(&self) -> Result<(OwnedFd, &OsStr)> {
        let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Err(SysError::new("open beneath", self.path, Errno::EINVAL));
        };
        let dirs = OFlag::O_PATH | OFlag::O_DIRECTORY;
        let dir = if parent == self.root {
            super::open("open(root)", self.root, dirs)?
        } else {
            open_beneath(self.root, parent, dirs)?
        };
        Ok((dir, name))
    }
}

/// Mounts filesystem `source` on the directory `target`, opened beneath
/// its root first: the mount lands on that directory whatever is swapped
/// in at its path.
pub fn mount_fs_beneath(
    source: &Path,
    target: Under,
    fstype: &str,
    flags: super::MsFlags,
    data: Option<&str>,
) -> Result<()> {
    let at = target.open(OFlag::O_PATH | OFlag::O_DIRECTORY)?;
    super::mount_fs(source, &fd_path(&at), fstype, flags, data)
        .map_err(|e| e.with_detail(format!("target {}", target.path.display())))
}

/// Bind-mounts the directory `source` on the directory `target`, each
/// opened beneath its root; read-only done as [`super::bind_mount`] does,
/// on the bind itself (opened again beneath the root: it is on top now).
pub fn bind_mount_beneath(source: Under, target: Under, readonly: bool) -> Result<()> {
    let dirs = OFlag::O_PATH | OFlag::O_DIRECTORY;
    let src = source.open(dirs)?;
    let at = target.open(dirs)?;
    let (parent, name) = target.parent()?;
    super::mount::bind(&fd_path(&src), &fd_path(&at)).map_err(|e| {
        e.with_detail(format!(
            "{} on {}",
            source.path.display(),
            target.path.display()
        ))
    })?;
    if readonly {
        let top = match target.open(dirs) {
            Ok(top) => top,
            Err(e) => {
                tracing::error!(target = %target.path.display(), error = %e, "cannot open the bind just made to make it read-only; it stays writable");
                return Err(e);
            }
        };
        let via = fd_path(&top);
        let sealed = super::mount::seal_readonly(&via, target.path, || Ok(()));
        if let Err(e) = sealed {
            // Undone through the parent: the descriptor of the bind
            // itself would keep it busy.
            drop(top);
            if let Err(undo) = unmount_at(&parent, name, target.path) {
                tracing::error!(target = %target.path.display(), error = %undo, "could not undo writable bind mount after failed read-only remount");
            }
            return Err(e);
        }
    }
    tracing::info!(source = %source.path.display(), target = %target.path.display(), readonly, "bind-mounted");
    Ok(())
}

/// Unmounts the mount on top of `target`: umount2(UMOUNT_NOFOLLOW) of the
/// last component relative to its parent, opened beneath the root (a
/// descriptor of the mount itself would keep it busy). A symlink at
/// `target` is refused first (ELOOP), and never followed.
pub fn unmount_beneath(target: Under) -> Result<()> {
    drop(target.open(OFlag::O_PATH)?);
    let (dir, name) = target.parent()?;
    unmount_at(&dir, name, target.path)
}

/// umount2(UMOUNT_NOFOLLOW) of `name` in the directory `dir` holds.
fn unmount_at(dir: &OwnedFd, name: &OsStr, shown: &Path) -> Result<()> {
    super::unmount(&fd_path(dir).join(name))
        .map_err(|e| e.with_detail(format!("target {}", shown.display())))
}

/// What `target` is (kind, device numbers: `lstat`, never through a
/// symlink), and an `O_PATH` descriptor of it (of the mount on top, when
/// one is), both from one open beneath the root.
pub fn stat_beneath(target: Under) -> Result<(OwnedFd, stat::FileStat)> {
    let fd = target.open(OFlag::O_PATH)?;
    let st = stat::fstat(&fd).map_err(|e| SysError::new("fstat", target.path, e))?;
    Ok((fd, st))
}

/// Sets the per-mount flags of the mount on top of `target` (see
/// [`super::remount_flags`]), found by opening `target` beneath its root.
pub fn remount_flags_beneath(target: Under, flags: super::MsFlags) -> Result<()> {
    let top = target.open(OFlag::O_PATH)?;
    super::remount_flags(&fd_path(&top), flags)
        .map_err(|e| e.with_detail(format!("target {}", target.path.display())))
}

/// Removes `target` (an empty directory when `dir`, else a file or node)
/// with unlinkat relative to its parent, opened beneath the root.
pub fn remove_beneath(target: Under, dir: bool) -> Result<()> {
    let (parent, name) = target.parent()?;
    let how = if dir {
        nix::unistd::UnlinkatFlags::RemoveDir
    } else {
        nix::unistd::UnlinkatFlags::NoRemoveDir
    };
    nix::unistd::unlinkat(&parent, name, how)
        .map_err(|e| SysError::new("unlinkat", target.path, e))?;
    tracing::info!(path = %target.path.display(), dir, "removed");
    Ok(())
}

/// Creates the directory `target` (mode `mode`) with mkdirat relative to
/// its parent, opened beneath the root. `false` when it existed.
pub fn mkdir_beneath(target: Under, mode: u32) -> Result<bool> {
    let (dir, name) = target.parent()?;
    match stat::mkdirat(&dir, name, Mode::from_bits_truncate(mode & 0o7777)) {
        Ok(()) => {
            tracing::info!(path = %target.path.display(), "created directory");
            Ok(true)
        }
        Err(Errno::EEXIST) => Ok(false),
        Err(e) => Err(SysError::new("mkdirat", target.path, e)),
    }
}

/// Creates the block node `target` for `major:minor` with mode exactly
/// `mode`: mknodat relative to its parent, opened beneath the root
/// through no symlink, then the mode set through an
/// `O_PATH | O_NOFOLLOW` descriptor of the node checked to be that device.
/// A node already there for the same device is success; anything else
/// there is `EEXIST`.
pub fn make_block_node_beneath(target: Under, major: u32, minor: u32, mode: u32) -> Result<()> {
    let path = target.path;
    let (dir, name) = target.parent()?;
    let perm = Mode::from_bits_truncate(mode & 0o7777);
    let dev = stat::makedev(u64::from(major), u64::from(minor));
    let made = match stat::mknodat(&dir, name, SFlag::S_IFBLK, perm, dev) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(SysError::new("mknodat", path, e)),
    };
    let node = fcntl::openat(
        &dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SysError::new("openat(O_PATH|O_NOFOLLOW)", path, e))?;
    let st = stat::fstat(&node).map_err(|e| SysError::new("fstat", path, e))?;
    let is_block = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFBLK;
    if !is_block || split_dev(st.st_rdev) != (major, minor) {
        return Err(
            SysError::new("mknodat", path, Errno::EEXIST).with_detail(if made {
                "replaced by something else before its mode was set".to_string()
            } else {
                "something else is there".to_string()
            }),
        );
    }
    if !made {
        tracing::debug!(path = %path.display(), major, minor, "block node already present");
        return Ok(());
    }
    // fchmod does not take an O_PATH descriptor; its /proc link names
    // exactly the inode checked above.
    std::fs::set_permissions(
        fd_path(&node),
        std::fs::Permissions::from_mode(mode & 0o7777),
    )
    .map_err(|e| SysError::io("chmod", path, e))?;
    tracing::info!(path = %path.display(), major, minor, mode = format_args!("{:o}", mode & 0o7777), "created block device node");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_parts_refuse_dotdot_and_other_roots() {
        let root = Path::new("/srv/t");
        assert_eq!(
            relative(root, Path::new("/srv/t/a/b")).unwrap(),
            Path::new("a/b")
        );
        assert_eq!(
            relative(root, Path::new("/srv/t/a/../b"))
                .unwrap_err()
                .errno(),
            Errno::EXDEV
        );
        assert_eq!(
            relative(root, Path::new("/srv/t")).unwrap_err().errno(),
            Errno::EXDEV
        );
        assert_eq!(
            relative(root, Path::new("/srv/tt/a")).unwrap_err().errno(),
            Errno::EXDEV
        );
    }

    /// Both ways (openat2 and the walk) refuse a symlinked parent, a
    /// symlink at the end, and `..`, and open what is plainly there.
    #[test]
    fn symlinks_and_dotdot_are_refused_by_openat2_and_by_the_walk() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("a/last")).unwrap();
        let dir = super::super::open("open(root)", r, OFlag::O_PATH | OFlag::O_DIRECTORY).unwrap();
        let path_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        for way in ["openat2", "walk"] {
            let open = |rel: &str| {
                let shown = r.join(rel);
                match way {
                    "openat2" => open_at(&dir, Path::new(rel), &shown, path_flags),
                    _ => walk(&dir, Path::new(rel), &shown, path_flags | OFlag::O_NOFOLLOW),
                }
            };
            assert!(open("a/b").is_ok(), "{way}");
            for bad in ["link/x", "a/last", "link"] {
                let e = open(bad).unwrap_err();
                assert!(
                    [Errno::ELOOP, Errno::ENOTDIR, Errno::EXDEV].contains(&e.errno()),
                    "{way} {bad}: {e}"
                );
            }
        }
        let e = open_beneath(r, &r.join("a/../link"), path_flags).unwrap_err();
        assert_eq!(e.errno(), Errno::EXDEV, "{e}");
        assert!(open_beneath(r, &r.join("a/b"), path_flags).is_ok());
    }
}
