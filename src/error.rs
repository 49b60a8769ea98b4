//! One error type for the whole driver, and the single place where it is
//! mapped to a gRPC status. Lower layers say *what* went wrong; this module
//! decides which CSI error code a CO sees.

use std::time::Duration;

use tonic::{Code, Status};

use crate::sys::SysErrorKind;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is malformed: the caller must fix it.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is well formed but the system is not in a state to serve it.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// Another operation on the same object is in flight; retry later.
    #[error("{0}")]
    Aborted(String),
    /// An operation ran past a bound of its own and was undone.
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Unimplemented(String),
    /// A required piece of the system (the VG, the thin pool) is not usable.
    #[error("{0}")]
    Unavailable(String),
    /// An external command exited non-zero (`code`) or was killed by a
    /// signal (`signal`). What it means is decided by its caller, from the
    /// code or from state read again, never from `stderr`, which is kept
    /// for the person reading the message.
    #[error("{} failed ({}): {stderr}", command_name(program, argv), ended(*code, *signal))]
    Command {
        program: String,
        argv: Vec<String>,
        code: Option<i32>,
        signal: Option<i32>,
        stderr: String,
    },
    /// A program the driver needs is not installed (spawning it gave
    /// ENOENT): FAILED_PRECONDITION, naming the package that brings it.
    #[error("{program} is not installed on this node (not found in PATH): install the {package} package in the driver's image (or on the node), then retry")]
    MissingTool { program: String, package: String },
    /// An external command ran past its timeout and was stopped (see `exec::Stop`).
    #[error("{program} timed out after {after:?} and was stopped")]
    Timeout {
        program: String,
        argv: Vec<String>,
        after: Duration,
    },
    /// A blocking step (mount, umount, an ioctl) did not finish within its
    /// bound (see `crate::blocking`); it goes on in the background.
    #[error("{what} did not finish within {after:?}; it goes on in the background, retry later")]
    Stalled { what: String, after: Duration },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A privileged syscall failed (see `crate::sys`).
    #[error(transparent)]
    Sys(crate::sys::SysError),
    /// A mount point was, once opened, not the root of a mount of the
    /// volume's device (`sys::mountroot`): nothing was done through it.
    /// The detail says what was found there and what to do.
    #[error("{}: {}", .0.path().display(), .0.detail().unwrap_or("not the mount of the volume's device"))]
    NotTheMount(crate::sys::SysError),
    #[error("{0}")]
    Internal(String),
}

impl From<crate::sys::SysError> for Error {
    fn from(e: crate::sys::SysError) -> Self {
        match e.kind() {
            SysErrorKind::NotTheMount => Error::NotTheMount(e),
            _ => Error::Sys(e),
        }
    }
}

impl Error {
    /// A blocking step that ran past its bound and may still finish.
    pub fn is_stalled(&self) -> bool {
        matches!(self, Error::Stalled { .. })
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Aborted(_) => Code::Aborted,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Timeout { .. } | Error::Stalled { .. } => Code::DeadlineExceeded,
            // A failed command the layer that ran it did not explain
            // (see `Lvm::explain`): the driver does not know why.
            Error::Command { .. } => Code::Internal,
            Error::MissingTool { .. } | Error::NotTheMount(_) => Code::FailedPrecondition,
            // A file or path the driver itself uses is missing: not the
            // volume, snapshot or path the request named (those are
            // `Error::NotFound`, decided where they are looked up).
            Error::Io { source, .. } => match source.kind() {
                std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
                _ => Code::Internal,
            },
            Error::Sys(e) => match e.kind() {
                SysErrorKind::Busy => Code::FailedPrecondition,
                _ => Code::Internal,
            },
            Error::Internal(_) => Code::Internal,
        }
    }
}

/// `lvm lvcreate` for LVM (whose first argument is the subcommand), the
/// program alone for the rest.
fn command_name(program: &str, argv: &[String]) -> String {
    match argv.first() {
        Some(sub) if !sub.starts_with('-') && program.ends_with("lvm") => {
            format!("{program} {sub}")
        }
        _ => program.to_string(),
    }
}

/// How a command ended, for its message.
fn ended(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "no exit code".into(),
    }
}

/// What to do about a failure the driver could not name: said once, here,
/// for every INTERNAL answer.
const INTERNAL_HINT: &str = "the driver could not tell why; retry, and if it persists read the driver's log on this node (it has the full command line and context)";

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let code = e.code();
        let message = if code == Code::Internal {
            format!("{e} ({INTERNAL_HINT})")
        } else {
            e.to_string()
        };
        Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(stderr: &str) -> Error {
        Error::Command {
            program: "lvm".into(),
            argv: vec!["lvcreate".into()],
            code: Some(5),
            signal: None,
            stderr: stderr.into(),
        }
    }

    #[test]
    fn simple_variants_map_to_their_codes() {
        let cases = [
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::NotFound("x".into()), Code::NotFound),
            (Error::AlreadyExists("x".into()), Code::AlreadyExists),
            (
                Error::FailedPrecondition("x".into()),
                Code::FailedPrecondition,
            ),
            (
                Error::ResourceExhausted("x".into()),
                Code::ResourceExhausted,
            ),
            (Error::Aborted("x".into()), Code::Aborted),
            (Error::OutOfRange("x".into()), Code::OutOfRange),
            (Error::Unimplemented("x".into()), Code::Unimplemented),
            (Error::Unavailable("x".into()), Code::Unavailable),
            (Error::Internal("x".into()), Code::Internal),
        ];
        for (err, code) in cases {
            let status: Status = err.into();
            assert_eq!(status.code(), code);
            if code == Code::Internal {
                // An unexplained failure still says what to do.
                assert!(status.message().starts_with("x (") && status.message().contains("retry"));
            } else {
                assert_eq!(status.message(), "x");
            }
        }
    }

    /// What a command printed decides nothing: an unexplained failure is
    /// INTERNAL whatever its text (the LVM layer explains the ones a CO
    /// must tell apart, from state; see `lvm::explain`).
    #[test]
    fn a_command_failure_is_internal_whatever_it_printed() {
        for text in [
            "  Insufficient free space: 100 extents needed, but only 3 available",
            "  Logical volume vg/lv contains a filesystem in use.",
            "  Volume group \"x\" not found",
        ] {
            assert_eq!(cmd(text).code(), Code::Internal, "{text}");
        }
        let killed = Error::Command {
            program: "blkid".into(),
            argv: vec!["-p".into()],
            code: None,
            signal: Some(9),
            stderr: String::new(),
        };
        assert_eq!(killed.code(), Code::Internal);
        assert!(
            killed
                .to_string()
                .starts_with("blkid failed (killed by signal 9)"),
            "{killed}"
        );
        assert!(cmd("x")
            .to_string()
            .starts_with("lvm lvcreate failed (exit code 5): x"));
    }

    #[test]
    fn a_missing_tool_is_failed_precondition_and_names_its_package() {
        let s: Status = Error::MissingTool {
            program: "mkfs.xfs".into(),
            package: "xfsprogs".into(),
        }
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(
            s.message().contains("mkfs.xfs")
                && s.message().contains("install the xfsprogs package"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn command_errors_keep_stderr_and_timeouts_are_deadline_exceeded() {
        let s: Status = cmd("boom").into();
        assert!(s.message().contains("lvm lvcreate failed"));
        assert!(s.message().contains("boom"));
        let t: Status = Error::Timeout {
            program: "mkfs.ext4".into(),
            argv: vec![],
            after: Duration::from_secs(3),
        }
        .into();
        assert_eq!(t.code(), Code::DeadlineExceeded);
        assert!(t.message().contains("mkfs.ext4 timed out"));
    }

    /// ENOENT of a file the driver uses is not the NOT_FOUND of a
    /// volume: that one is decided where the volume or path is looked up.
    #[test]
    fn a_missing_file_of_the_drivers_own_is_not_not_found() {
        let e = Error::io(
            "open /x",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(e.code(), Code::Internal);
        assert!(e.to_string().starts_with("open /x: "));
        let denied = Error::io(
            "open /y",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert_eq!(denied.code(), Code::PermissionDenied);
        let sys: Error = crate::sys::SysError::new(
            "umount2",
            std::path::Path::new("/t"),
            nix::errno::Errno::ENOENT,
        )
        .into();
        assert_eq!(sys.code(), Code::Internal);
        let busy: Error = crate::sys::SysError::new(
            "umount2",
            std::path::Path::new("/t"),
            nix::errno::Errno::EBUSY,
        )
        .into();
        assert_eq!(busy.code(), Code::FailedPrecondition);
    }

    /// A mount point that is not the volume's mount is a precondition the
    /// CO or an admin must restore; the message says what was found.
    #[test]
    fn a_path_that_is_not_the_volumes_mount_is_failed_precondition() {
        let sys = crate::sys::SysError::new(
            "open mount root",
            std::path::Path::new("/k/globalmount"),
            nix::errno::Errno::EXDEV,
        )
        .with_kind(SysErrorKind::NotTheMount)
        .with_detail("found a filesystem of device 7:3 there, not of 253:4: unmount it");
        let e: Error = sys.into();
        assert!(matches!(e, Error::NotTheMount(_)), "{e:?}");
        let s: Status = e.into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            "/k/globalmount: found a filesystem of device 7:3 there, not of 253:4: unmount it"
        );
    }
}
