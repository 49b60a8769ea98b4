//! One error type for the whole driver, and the single place where it is
//! mapped to a gRPC status. Lower layers say *what* went wrong; this module
//! decides which CSI error code a CO sees, and what the caller or operator
//! can do about it ([`Error::remedy`]).
//!
//! Every status message has two parts: what was wrong (the error's
//! `Display`: the field, value, volume or path involved, never a secret),
//! then [`REMEDY`] and what to do. The remedy comes from the variant (one
//! per code for the variants that carry a message), unless the place that
//! built the error knows better and said so with [`Error::advise`].

use std::borrow::Cow;
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
    /// A secret the call carries does not open what it must (an encrypted
    /// volume's passphrase).
    #[error("{0}")]
    Unauthenticated(String),
    /// A required piece of the system (the VG, the thin pool) is not usable.
    #[error("{0}")]
    Unavailable(String),
    /// The configured volume group is not on this node, as the list of
    /// every VG says (`Lvm::vg_exists`); `detail` is the read that failed.
    /// UNAVAILABLE, and the one failure start-up builds a loop-backed VG on.
    #[error("volume group {vg} does not exist on this node ({detail})")]
    VgMissing { vg: String, detail: String },
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
    #[error("{program} is not installed on this node (not found in PATH; the {package} package brings it)")]
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
    #[error("{what} did not finish within {after:?}; it goes on in the background")]
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
    /// The caller may not do this (a peer node plugin reading a snapshot
    /// without a live grant).
    #[error("{0}")]
    PermissionDenied(String),
    /// Data did not arrive as it was sent: a copy's range or whole digest
    /// did not match its source's (`volume/fill.rs`).
    #[error("{0}")]
    DataLoss(String),
    /// `error`, with what to do about it said by the place that built it,
    /// where that knows better than the variant's own remedy. Its code is
    /// `error`'s.
    #[error("{error}")]
    Advised {
        error: Box<Error>,
        remedy: Cow<'static, str>,
    },
}

impl From<crate::sys::SysError> for Error {
    fn from(e: crate::sys::SysError) -> Self {
        match e.kind() {
            SysErrorKind::NotTheMount => Error::NotTheMount(e),
            _ => Error::Sys(e),
        }
    }
}
/// What to do when a mount point, once opened, was not the volume's mount
/// (see `sys::mountroot`): nothing was done through it.
const MOUNT_ADVICE: &str = "unmount what was mounted or linked over the path after the driver \
looked it up (or unstage and stage the volume again), then retry";

/// What separates the two parts of every status message: what was wrong,
/// then what to do about it.
pub const REMEDY: &str = ". What to do: ";

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

    /// The same error, with `remedy` as what to do about it instead of
    /// its variant's own advice.
    pub fn advise(self, remedy: impl Into<Cow<'static, str>>) -> Self {
        let error = match self {
            Error::Advised { error, .. } => error,
            other => Box::new(other),
        };
        Error::Advised {
            error,
            remedy: remedy.into(),
        }
    }

    /// What the caller or operator can do about this error: one clause,
    /// starting with what to do. Every variant has one (no wildcard arm:
    /// a new variant must say its own).
    pub fn remedy(&self) -> Cow<'static, str> {
        let fixed = |s: &'static str| Cow::Borrowed(s);
        match self {
            Error::Advised { remedy, .. } => remedy.clone(),
            Error::InvalidArgument(_) => fixed(
                "correct the request field named above and send the call again; the same request fails the same way",
            ),
            Error::NotFound(_) => fixed(
                "check the id or path named above: it does not exist (a volume or snapshot may have been deleted); retrying the same request will not find it",
            ),
            Error::AlreadyExists(_) => fixed(
                "repeat the first call's parameters to get the existing one, or use another name or path for different parameters",
            ),
            Error::FailedPrecondition(_) => fixed(
                "bring the volume or node into the state the call needs (see the condition above), then retry",
            ),
            Error::ResourceExhausted(_) => fixed(
                "free space in the thin pool (delete volumes or snapshots, run ReclaimSpace) or extend it (lvextend), then retry",
            ),
            Error::Aborted(_) => fixed(
                "retry with backoff: another call on this volume is in progress and ends on its own",
            ),
            Error::DeadlineExceeded(_) => fixed(
                "retry: the call is idempotent and a retry finds the work done or finishes it",
            ),
            Error::OutOfRange(_) => fixed("ask for a value within the range named above"),
            Error::Unimplemented(_) => fixed(
                "do not call it: this driver does not offer it and does not advertise it",
            ),
            Error::Unauthenticated(_) => fixed(
                "pass the volume's passphrase (the one it was formatted or last rotated with) in the secret's \"passphrase\" key, then retry",
            ),
            Error::Unavailable(_) => fixed(
                "check the volume group and thin pool on this node (vgs, lvs) and the driver's config, then retry",
            ),
            Error::VgMissing { .. } => fixed(
                "create it (vgcreate), configure [loop_pool] to let the driver build one, or fix volume_group in the config",
            ),
            Error::MissingTool { package, .. } => Cow::Owned(format!(
                "install the {package} package in the driver's image (or on the node), then retry"
            )),
            Error::Timeout { .. } => fixed(
                "retry: the command was stopped at a safe point and the call is idempotent; if it keeps timing out, raise command_timeout_secs or look at the node's load and LVM",
            ),
            Error::Stalled { .. } => fixed(
                "retry later: this volume stays busy (ABORTED) until the step returns, then a retry finds its result",
            ),
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => fixed(
                "run the node plugin as root in a privileged container, as the shipped manifests do",
            ),
            Error::NotTheMount(_) => fixed(MOUNT_ADVICE),
            Error::PermissionDenied(_) => fixed(
                "let the controller ask the source node for a grant (Transfer.Grant) and pass its token; grants live in the source node plugin's memory, so one restart ends them all",
            ),
            Error::DataLoss(_) => fixed(
                "retry: the partial copy was removed and the retry copies again from the start; if it fails again, check the link and both nodes' memory and disks",
            ),
            Error::Sys(e) if e.kind() == SysErrorKind::Busy => fixed(
                "stop what holds the device or mount (unmount it, close it), then retry",
            ),
            Error::Command { .. } | Error::Io { .. } | Error::Sys(_) | Error::Internal(_) => {
                fixed(INTERNAL_HINT)
            }
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Error::Advised { error, .. } => error.code(),
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Aborted(_) => Code::Aborted,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::Unavailable(_) | Error::VgMissing { .. } => Code::Unavailable,
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
            Error::DataLoss(_) => Code::DataLoss,
            Error::PermissionDenied(_) => Code::PermissionDenied,
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

impl Error {
    /// The status message: what was wrong, [`REMEDY`], what to do.
    pub fn message(&self) -> String {
        let what = self.to_string();
        let what = what.trim_end().trim_end_matches('.');
        format!("{what}{REMEDY}{}", self.remedy())
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        Status::new(e.code(), e.message())
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
            let remedy = err.remedy();
            let status: Status = err.into();
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), format!("x{REMEDY}{remedy}"));
        }
        // An unexplained failure still says what to do.
        assert!(Error::Internal("x".into()).remedy().contains("retry"));
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
        .with_detail("found a filesystem of device 7:3 there, not of 253:4");
        let e: Error = sys.into();
        assert!(matches!(e, Error::NotTheMount(_)), "{e:?}");
        let s: Status = e.into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            format!("/k/globalmount: found a filesystem of device 7:3 there, not of 253:4{REMEDY}{MOUNT_ADVICE}")
        );
    }
    /// The two parts of a status message, or why it lacks them. A remedy
    /// clause is concrete: the message holds [`REMEDY`] once, with a
    /// non-empty "what" before it and, after it, a clause of at least
    /// three words starting with a lower-case word (an imperative such as
    /// "retry", "set", "install") that does not just repeat the "what".
    fn remedy_clause(message: &str) -> std::result::Result<(&str, &str), String> {
        let parts: Vec<&str> = message.split(REMEDY).collect();
        let [what, todo] = parts[..] else {
            return Err(format!("{message:?}: not one {REMEDY:?}"));
        };
        if what.trim().is_empty() {
            return Err(format!("{message:?}: says nothing about what was wrong"));
        }
        if todo.split_whitespace().count() < 3 {
            return Err(format!("{message:?}: remedy {todo:?} is not a clause"));
        }
        if !todo.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(format!(
                "{message:?}: remedy {todo:?} does not start with a word"
            ));
        }
        if what.contains(todo) {
            return Err(format!("{message:?}: remedy repeats what was wrong"));
        }
        Ok((what, todo))
    }

    /// One error of every variant of [`Error`].
    fn one_of_each() -> Vec<Error> {
        let io = |kind| std::io::Error::from(kind);
        vec![
            Error::InvalidArgument("name is required".into()),
            Error::NotFound("volume \"csi-x\" does not exist".into()),
            Error::AlreadyExists("volume \"a\" exists with other parameters".into()),
            Error::FailedPrecondition("volume csi-x is not staged".into()),
            Error::ResourceExhausted("thin pool vg/pool can hand out 0 more bytes".into()),
            Error::Aborted("an operation on volume csi-x is already in progress".into()),
            Error::DeadlineExceeded("the members stayed frozen too long".into()),
            Error::OutOfRange("limit_bytes 1 is below the minimum".into()),
            Error::Unimplemented("a raw block volume in use".into()),
            Error::Unauthenticated("the passphrase opens no key slot of /dev/vg/lv".into()),
            Error::Unavailable("thin pool vg/pool not found".into()),
            Error::VgMissing {
                vg: "vg1".into(),
                detail: "lvm lvs failed (exit code 5)".into(),
            },
            cmd("  boom"),
            Error::MissingTool {
                program: "mkfs.xfs".into(),
                package: "xfsprogs".into(),
            },
            Error::Timeout {
                program: "lvm".into(),
                argv: vec!["lvcreate".into()],
                after: Duration::from_secs(60),
            },
            Error::Stalled {
                what: "umount /t".into(),
                after: Duration::from_secs(60),
            },
            Error::io("read /s/volumes", io(std::io::ErrorKind::NotFound)),
            Error::io("open /dev/x", io(std::io::ErrorKind::PermissionDenied)),
            crate::sys::SysError::new(
                "umount2",
                std::path::Path::new("/t"),
                nix::errno::Errno::EBUSY,
            )
            .into(),
            crate::sys::SysError::new("mount", std::path::Path::new("/t"), nix::errno::Errno::EIO)
                .into(),
            Error::Internal("encode node record: x".into()),
            crate::sys::SysError::new(
                "open mount root",
                std::path::Path::new("/t"),
                nix::errno::Errno::EXDEV,
            )
            .with_kind(SysErrorKind::NotTheMount)
            .with_detail("found a directory inside the filesystem of device 253:4 there")
            .into(),
            Error::NotFound("snapshot \"snap-x\" does not exist".into())
                .advise("check the snapshot id: it may have been deleted"),
            Error::PermissionDenied("no live grant of snapshot snap-x for this peer".into()),
            Error::DataLoss("range 0+4096 does not match its hash".into()),
        ]
    }

    /// The variant names of [`Error`], read from this file's enum.
    fn variant_names() -> Vec<String> {
        let src = include_str!("error.rs");
        let body = &src[src.find("pub enum Error {").unwrap()..];
        let body = &body[..body.find("\n}\n").unwrap()];
        body.lines()
            .filter_map(|l| l.strip_prefix("    "))
            .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
            .map(|l| {
                l.split(|c: char| !c.is_ascii_alphanumeric())
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    fn name_of(e: &Error) -> String {
        format!("{e:?}")
            .split(|c: char| !c.is_ascii_alphanumeric())
            .next()
            .unwrap()
            .to_string()
    }

    /// Every variant, through the one mapping to a status, says what was
    /// wrong and what to do. A variant added to `Error` without a sample
    /// here fails (names read from the enum); `Error::remedy` has no
    /// wildcard arm, so a new variant must say its own remedy to compile.
    #[test]
    fn every_variant_says_what_was_wrong_and_what_to_do() {
        let samples = one_of_each();
        let sampled: Vec<String> = samples.iter().map(name_of).collect();
        let names = variant_names();
        assert!(names.len() >= 18, "{names:?}");
        for n in &names {
            assert!(
                sampled.contains(n),
                "variant {n} has no sample in one_of_each"
            );
        }
        for e in samples {
            let (code, debug) = (e.code(), format!("{e:?}"));
            let status: Status = e.into();
            assert_eq!(status.code(), code, "{debug}");
            if let Err(why) = remedy_clause(status.message()) {
                panic!("{debug}: {why}");
            }
        }
    }

    /// The check itself refuses what it must.
    #[test]
    fn a_message_without_a_remedy_fails_the_check() {
        assert!(remedy_clause("volume_capability is required").is_err());
        assert!(remedy_clause(&format!("{REMEDY}retry it later")).is_err());
        assert!(remedy_clause(&format!("x{REMEDY}retry")).is_err());
        assert!(remedy_clause(&format!("x{REMEDY}Retry it later")).is_err());
        assert!(remedy_clause(&format!("x{REMEDY}a{REMEDY}b c d")).is_err());
        let m = Error::InvalidArgument("x".into()).advise("").message();
        assert!(remedy_clause(&m).is_err());
        assert_eq!(
            remedy_clause(&format!("x{REMEDY}retry it later")),
            Ok(("x", "retry it later"))
        );
    }

    /// Errors built where the driver builds them, for a representative
    /// set of requests, carry the remedy their place knows.
    #[test]
    fn errors_of_real_requests_say_what_to_do() {
        use crate::grpc::validate;
        let never = |_: &str| false;
        let guard = crate::guard::InFlight::default();
        let _held = guard.try_hold("csi-v", "delete").unwrap();
        let cases: Vec<(Error, &str, &str)> = vec![
            (
                validate::full_capability(None, "ext4").unwrap_err(),
                "volume_capability is required",
                "set volume_capability",
            ),
            (
                validate::page(0, "bogus", never, &crate::naming::NodeIds::new("n", false))
                    .unwrap_err(),
                "\"bogus\"",
                "empty starting_token",
            ),
            (
                guard.try_hold("csi-v", "expand").err().unwrap(),
                "csi-v",
                "retry",
            ),
            (
                validate::required_string("name", "").unwrap_err(),
                "name",
                "correct the request field",
            ),
            (
                validate::known_volume(None, "csi-gone").unwrap_err(),
                "csi-gone",
                "deleted",
            ),
        ];
        for (e, names, todo) in cases {
            let m = e.message();
            let (what, remedy) = remedy_clause(&m).unwrap_or_else(|why| panic!("{why}"));
            assert!(what.contains(names), "{m:?} names {names:?}");
            assert!(remedy.contains(todo), "{m:?} says {todo:?}");
        }
    }
}
