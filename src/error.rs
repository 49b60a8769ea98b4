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
    /// An external command exited non-zero.
    #[error("{program} failed ({status}): {stderr}")]
    Command {
        program: String,
        argv: Vec<String>,
        status: String,
        stderr: String,
    },
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
    Sys(#[from] crate::sys::SysError),
    #[error("{0}")]
    Internal(String),
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
            Error::Command { stderr, .. } => command_code(stderr),
            Error::Io { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => Code::NotFound,
                std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
                _ => Code::Internal,
            },
            Error::Sys(e) => match e.kind() {
                SysErrorKind::NotFound => Code::NotFound,
                SysErrorKind::Busy => Code::FailedPrecondition,
                _ => Code::Internal,
            },
            Error::Internal(_) => Code::Internal,
        }
    }
}

/// Classifies a failed command by what it printed. LVM has no structured
/// error codes, so the few conditions a CO must react to differently are
/// recognised here, and nowhere else.
fn command_code(stderr: &str) -> Code {
    let s = stderr.to_ascii_lowercase();
    if s.contains("insufficient free space")
        || s.contains("insufficient suitable")
        || s.contains("out of data space")
        || s.contains("thin pool") && s.contains("full")
    {
        Code::ResourceExhausted
    } else if s.contains("in use") || s.contains("is open") || s.contains("device or resource busy")
    {
        Code::FailedPrecondition
    } else {
        Code::Internal
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(stderr: &str) -> Error {
        Error::Command {
            program: "lvm".into(),
            argv: vec!["lvcreate".into()],
            status: "exit status: 5".into(),
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
            assert_eq!(status.message(), "x");
        }
    }

    #[test]
    fn lvm_stderr_is_classified() {
        assert_eq!(
            cmd("  Insufficient free space: 100 extents needed, but only 3 available").code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            cmd("  Logical volume vg/lv contains a filesystem in use.").code(),
            Code::FailedPrecondition
        );
        assert_eq!(
            cmd("  Volume group \"x\" has insufficient metadata").code(),
            Code::Internal
        );
    }

    #[test]
    fn command_errors_keep_stderr_and_timeouts_are_deadline_exceeded() {
        let s: Status = cmd("boom").into();
        assert!(s.message().contains("lvm failed"));
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

    #[test]
    fn io_not_found_is_not_found() {
        let e = Error::io(
            "open /x",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(e.code(), Code::NotFound);
        assert!(e.to_string().starts_with("open /x: "));
    }
}
