//! Staging and target paths: which ones the node service accepts, and how
//! an accepted path is pinned to the real directory it names.
//!
//! Two steps, so that bad input is refused before anything is looked at:
//!
//! 1. [`check`] (pure, in the gRPC layer): the path is absolute, has no
//!    `..` component, no NUL, and lies strictly under one of the configured
//!    `allowed_roots`, compared component by component (so
//!    `/var/lib/kubelet-evil` is not under `/var/lib/kubelet`). `.` and
//!    repeated slashes are normalized away.
//! 2. [`resolve`] (touches the filesystem): the parent directory is
//!    canonicalized, so a symlink planted in a parent cannot carry a mount
//!    out of the allowed roots, and the last component itself must not be a
//!    symlink. The result is the path the kernel will show in mountinfo.
//! 3. [`beneath`] (at the act): what the node layer does to a path
//!    (mount, bind, umount, mkdir, mknod, unlink, remount) goes through
//!    descriptors opened from its allowed root by `sys::beneath`
//!    (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so a symlink
//!    swapped in after step 2 is refused, never followed out of the root.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// Longest path accepted (Linux PATH_MAX). CSI lets paths exceed its
/// general 128-byte limit.
pub const MAX_PATH: usize = 4096;

fn invalid<T>(msg: String) -> Result<T> {
    Err(Error::InvalidArgument(msg))
}

/// Checks a path from a request and returns it normalized. `field` names
/// the request field in errors.
pub fn check(field: &str, value: &str, roots: &[PathBuf]) -> Result<PathBuf> {
    if value.is_empty() {
        return invalid(format!("{field} is required"));
    }
    if value.len() > MAX_PATH {
        return invalid(format!(
            "{field} is {} bytes; the limit is {MAX_PATH}",
            value.len()
        ));
    }
    if value.contains('\0') {
        return invalid(format!("{field} contains a NUL byte"));
    }
    let path = Path::new(value);
    if !path.is_absolute() {
        return invalid(format!("{field} {value:?} is not an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return invalid(format!(
            "{field} {value:?} contains '..'; paths must be given without it"
        ));
    }
    let normalized: PathBuf = path.components().collect();
    if !roots.iter().any(|r| strictly_under(&normalized, r)) {
        return invalid(format!(
            "{field} {value:?} is outside the allowed roots {:?} (config key allowed_roots)",
            roots
        ));
    }
    Ok(normalized)
}

/// True when `path` lies below `root` (not equal to it). Both must be
/// normalized; the comparison is by whole components.
pub fn strictly_under(path: &Path, root: &Path) -> bool {
    path != root && path.starts_with(root)
}

/// What [`resolve`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The parent exists; this is the canonical parent joined with the last
    /// component. The path itself may or may not exist.
    At(PathBuf),
    /// The parent directory does not exist, so neither does the path.
    ParentMissing,
}

/// Pins a path that passed [`check`] to the directory it really is in. See
/// the module documentation.
pub fn resolve(path: &Path, roots: &[PathBuf]) -> Result<Resolved> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return invalid(format!("{} has no parent directory", path.display()));
    };
    let parent = match std::fs::canonicalize(parent) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Resolved::ParentMissing),
        Err(e) => return Err(Error::io(format!("resolve {}", parent.display()), e)),
    };
    let real = parent.join(name);
    let canonical_roots: Vec<PathBuf> = roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    if !canonical_roots.iter().any(|r| strictly_under(&real, r)) {
        return invalid(format!(
            "{} resolves to {}, outside the allowed roots {:?}",
            path.display(),
            real.display(),
            roots
        ));
    }
    match std::fs::symlink_metadata(&real) {
        Ok(m) if m.file_type().is_symlink() => invalid(format!(
            "{} is a symbolic link; the driver does not follow links at staging or target paths",
            real.display()
        )),
        _ => Ok(Resolved::At(real)),
    }
}

/// The canonical allowed root that `path` (a [`resolve`]d path) lies
/// strictly under.
pub fn root_of(path: &Path, roots: &[PathBuf]) -> Result<PathBuf> {
    roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .find(|r| strictly_under(path, r))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} is outside the allowed roots {roots:?}",
                path.display()
            ))
        })
}

/// Runs `act` on `path` pinned beneath its allowed root (see
/// `sys::beneath`): whatever it does goes through descriptors opened
/// from the root, never through a symlink.
pub fn beneath<T>(
    path: &Path,
    roots: &[PathBuf],
    act: impl FnOnce(crate::sys::Under) -> crate::sys::Result<T>,
) -> Result<T> {
    let root = root_of(path, roots)?;
    act(crate::sys::Under { root: &root, path }).map_err(|e| match e.errno() {
        // The kernel refused a symlink, or a way out of the root: the
        // path changed after it was checked.
        nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV => Error::FailedPrecondition(format!(
            "{} (or a directory above it) is a symbolic link or leads out of {} since it was checked; \
             the driver follows no link there ({e})",
            path.display(),
            root.display()
        ))
        .advise("replace the link with a plain directory, then retry"),
        _ => e.into(),
    })
}

/// A short, stable name for a path (hex of its hash), for names that must
/// not carry the path itself (device-mapper names).
pub fn digest(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(path.as_os_str().as_bytes());
    crate::naming::hex(&d[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> Vec<PathBuf> {
        vec![PathBuf::from("/var/lib/kubelet"), PathBuf::from("/srv/t")]
    }

    #[test]
    fn accepts_paths_under_a_root_and_normalizes_them() {
        let p = check("target_path", "/var/lib/kubelet/pods/x/mount", &roots()).unwrap();
        assert_eq!(p, PathBuf::from("/var/lib/kubelet/pods/x/mount"));
        let p = check("target_path", "/srv/t//a/./b/", &roots()).unwrap();
        assert_eq!(p, PathBuf::from("/srv/t/a/b"));
        // Dots inside names are ordinary names.
        let p = check("t", "/srv/t/pvc.1/..data", &roots()).unwrap();
        assert_eq!(p, PathBuf::from("/srv/t/pvc.1/..data"));
    }

    #[test]
    fn refuses_what_could_escape_or_is_malformed() {
        let bad = [
            ("", "is required"),
            ("relative/path", "not an absolute path"),
            ("./srv/t/x", "not an absolute path"),
            ("/srv/t/../../etc", "contains '..'"),
            ("/srv/t/x/..", "contains '..'"),
            ("/var/lib/kubelet-evil/x", "outside the allowed roots"),
            ("/var/lib/kubelet", "outside the allowed roots"),
            ("/var/lib/kubelet/", "outside the allowed roots"),
            ("/etc", "outside the allowed roots"),
            ("/", "outside the allowed roots"),
            ("/srv/t/a\0b", "NUL"),
        ];
        for (value, why) in bad {
            let e = check("staging_target_path", value, &roots()).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{value:?}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains(why), "{value:?}: {msg}");
            if !value.is_empty() {
                assert!(msg.contains("staging_target_path"), "{msg}");
            }
        }
        let long = format!("/srv/t/{}", "x".repeat(MAX_PATH));
        assert!(check("t", &long, &roots()).is_err());
    }

    #[test]
    fn resolve_follows_parent_links_but_stays_inside_roots() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("inner-link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("real/last-link")).unwrap();
        let roots = vec![root.clone()];
        let canon_root = std::fs::canonicalize(&root).unwrap();

        assert_eq!(
            resolve(&root.join("real/target"), &roots).unwrap(),
            Resolved::At(canon_root.join("real/target"))
        );
        assert_eq!(
            resolve(&root.join("inner-link/target"), &roots).unwrap(),
            Resolved::At(canon_root.join("real/target"))
        );
        let e = resolve(&root.join("escape/target"), &roots).unwrap_err();
        assert!(e.to_string().contains("outside the allowed roots"), "{e}");
        let e = resolve(&root.join("real/last-link"), &roots).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(
            resolve(&root.join("missing/target"), &roots).unwrap(),
            Resolved::ParentMissing
        );
    }

    #[test]
    fn digests_are_short_and_stable() {
        let a = digest(Path::new("/a"));
        assert_eq!(a.len(), 16);
        assert_eq!(a, digest(Path::new("/a")));
        assert_ne!(a, digest(Path::new("/b")));
    }

    /// A symlink met at the act (after the check) is FAILED_PRECONDITION
    /// saying what to do; other errors keep their own kind.
    #[test]
    fn a_symlink_met_at_the_act_says_what_to_do() {
        let root = tempfile::tempdir().unwrap();
        let r = std::fs::canonicalize(root.path()).unwrap();
        std::os::unix::fs::symlink("/etc", r.join("l")).unwrap();
        let roots = vec![r.clone()];
        let e = beneath(&r.join("l"), &roots, |at| {
            at.open(nix::fcntl::OFlag::O_PATH).map(drop)
        })
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(
            e.message()
                .contains("replace the link with a plain directory"),
            "{e}"
        );
        let e = beneath(&r.join("missing"), &roots, |at| {
            at.open(nix::fcntl::OFlag::O_PATH).map(drop)
        })
        .unwrap_err();
        assert!(matches!(&e, Error::Sys(s) if s.is_not_found()), "{e}");
        let e = beneath(Path::new("/etc/passwd"), &roots, |_| Ok(())).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    }
}
