//! Files created once and never touched again (sparse backing files),
//! and the single-instance lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl;

use super::{Result, SysError, SysErrorKind};

/// What [`create_sparse_file`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseFile {
    /// The file was created with the requested size.
    Created,
    /// A regular file was already there; it was left untouched. Its current
    /// size is reported so the caller can decide whether that is acceptable.
    Existed {
        /// Current size in bytes.
        len: u64,
    },
}

/// Creates `path` (and its parent directories) as a sparse file of `size`
/// bytes, mode 0600, durably (file and directory are fsynced). Never touches
/// an existing file: if one is there, its size is returned instead.
pub fn create_sparse_file(path: &Path, size: u64) -> Result<SparseFile> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| SysError::io("mkdir", parent, e))?;
    }
    let file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::metadata(path).map_err(|e| SysError::io("stat", path, e))?;
            if !meta.is_file() {
                return Err(SysError::new("create", path, Errno::EEXIST)
                    .with_detail("exists and is not a regular file"));
            }
            tracing::debug!(path = %path.display(), len = meta.len(), "sparse file already exists");
            return Ok(SparseFile::Existed { len: meta.len() });
        }
        Err(e) => return Err(SysError::io("create", path, e)),
    };
    let finish = || -> io::Result<()> {
        file.set_len(size)?;
        file.sync_all()?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(())
    };
    if let Err(e) = finish() {
        // Do not leave a short file behind that a retry would mistake for a
        // finished one.
        let _ = std::fs::remove_file(path);
        return Err(SysError::io("set_len", path, e));
    }
    tracing::info!(path = %path.display(), size, "created sparse file");
    Ok(SparseFile::Created)
}

/// Grows the regular file `path` to `size` bytes (sparse: no block is
/// written) and syncs it; a file already that large is left alone.
pub fn grow_file(path: &Path, size: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| SysError::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| SysError::io("stat", path, e))?
        .len();
    if len >= size {
        return Ok(());
    }
    file.set_len(size)
        .and_then(|()| file.sync_all())
        .map_err(|e| SysError::io("set_len", path, e))?;
    tracing::info!(path = %path.display(), from = len, to = size, "grew sparse file");
    Ok(())
}

/// An exclusive `flock` on a lock file, held until dropped (or the
/// process dies: the kernel drops it then, so a killed driver never leaves
/// a stale lock).
#[derive(Debug)]
pub struct FileLock {
    _lock: fcntl::Flock<File>,
}

/// Takes an exclusive, non-blocking `flock` on `path` (created with mode
/// 0600 when missing) and writes the caller's pid into it. Fails with
/// [`SysErrorKind::Busy`] while another process holds it.
pub fn lock_file(path: &Path) -> Result<FileLock> {
    use std::io::Write;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| SysError::io("open", path, e))?;
    let mut lock =
        fcntl::Flock::lock(file, fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            let err = SysError::new("flock", path, e);
            if e == Errno::EWOULDBLOCK {
                err.with_kind(SysErrorKind::Busy)
            } else {
                err
            }
        })?;
    let pid = std::process::id();
    lock.set_len(0)
        .and_then(|_| writeln!(&mut *lock, "{pid}"))
        .map_err(|e| SysError::io("write", path, e))?;
    tracing::info!(path = %path.display(), pid, "took the single-instance lock");
    Ok(FileLock { _lock: lock })
}
