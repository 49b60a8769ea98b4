//! The one way this driver runs an external program: an argv (never a shell
//! string), a timeout, stdin closed, and stderr captured into the error.
//!
//! A command is stopped only by its own timeout, never because the caller
//! went away: the child is not killed when the future is dropped (tokio
//! reaps it), and mutations run as tasks that outlive their caller anyway
//! (`crate::volume::Volumes::detached`). Past its timeout a command is
//! stopped as its [`Stop`] says: LVM gets SIGINT, at which it stops at a
//! safe point, and is waited for; it never gets SIGKILL, which can leave a
//! thin pool half active. The same signal reaches a child whose driver was killed
//! (`PR_SET_PDEATHSIG`), so no orphan races a restarted driver.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::error::{Error, Result};

/// What a finished command printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// How a command is stopped once its timeout has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: for tools whose half-done work the driver can redo (mkfs,
    /// blkid, dmsetup queries).
    Kill,
    /// SIGINT, then wait for the program to finish on its own (LVM).
    Interrupt,
}

/// How often a command that ignores SIGINT is logged while it is waited for.
pub const INTERRUPT_NAG: Duration = Duration::from_secs(30);

/// Runs `program args...` with `env` added to the environment, killing it
/// after `timeout`. A non-zero exit is an [`Error::Command`].
pub async fn run(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<Output> {
    run_with(program, args, env, timeout, Stop::Kill).await
}

/// [`run`], stopping the program the way `stop` says at its timeout.
pub async fn run_with(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
    stop: Stop,
) -> Result<Output> {
    finish(
        command(program, args, env, stop),
        program,
        args,
        timeout,
        stop,
    )
    .await
}

/// The fds a program run by [`run_with_input`] reads its inputs from: the
/// first on stdin, the second on fd 3 (`/dev/fd/3`).
pub const INPUT_FDS: [i32; 2] = [0, COPROCESS_FD];

/// [`run`] with secrets or other data for the program on pipes, never on
/// its command line, in its environment or in a file: `inputs[0]` on its
/// stdin, `inputs[1]` (if given) on fd 3. Each input is written whole into
/// its pipe before the program starts (at most a pipe's buffer, 64 KiB),
/// and the pipe is closed behind it, so the program reads it to its end.
pub async fn run_with_input(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
    inputs: &[&[u8]],
) -> Result<Output> {
    use std::os::fd::{AsRawFd, OwnedFd};
    if inputs.len() > INPUT_FDS.len() || inputs.iter().any(|i| i.len() > MAX_INPUT) {
        return Err(Error::Internal(format!(
            "{program}: at most {} inputs of at most {MAX_INPUT} bytes each",
            INPUT_FDS.len()
        )));
    }
    let io = |e: nix::errno::Errno| Error::io(format!("cannot start {program}"), e.into());
    let mut reads: Vec<OwnedFd> = Vec::new();
    for input in inputs {
        let (read, write): (OwnedFd, OwnedFd) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io)?;
        let mut left: &[u8] = input;
        while !left.is_empty() {
            let n = nix::unistd::write(&write, left).map_err(io)?;
            left = &left[n..];
        }
        // Closed: the program reads the input, then end of file.
        drop(write);
        reads.push(read);
    }
    let mut cmd = command(program, args, env, Stop::Kill);
    let mut reads = reads.into_iter();
    if let Some(stdin) = reads.next() {
        cmd.stdin(Stdio::from(stdin));
    }
    if let Some(extra) = reads.next() {
        as_fd3(&mut cmd, extra.as_raw_fd());
        // Kept open until the program has started (the parent's copy is
        // closed when `extra` drops, after the spawn in `finish`).
        let out = finish(cmd, program, args, timeout, Stop::Kill).await;
        drop(extra);
        return out;
    }
    finish(cmd, program, args, timeout, Stop::Kill).await
}

/// Gives the child of `cmd` the descriptor `raw` as its fd 3
/// ([`COPROCESS_FD`]), without FD_CLOEXEC.
fn as_fd3(cmd: &mut Command, raw: std::os::fd::RawFd) {
    // SAFETY: the closure runs in the child between fork and exec and
    // only makes the fcntl or dup2 system call, both async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep FD_CLOEXEC: clear it instead.
            let res = if raw == COPROCESS_FD {
                libc::fcntl(raw, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, COPROCESS_FD)
            };
            if res < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The largest input [`run_with_input`] passes (a pipe's default buffer).
pub const MAX_INPUT: usize = 64 << 10;

/// Spawns `cmd` and waits for it as [`run_with`] says.
async fn finish(
    mut cmd: Command,
    program: &str,
    args: &[String],
    timeout: Duration,
    stop: Stop,
) -> Result<Output> {
    let started = Instant::now();
    let child = cmd.spawn().map_err(|e| spawn_error(program, e))?;
    let pid = child.id();
    let mut waiting = Box::pin(child.wait_with_output());
    let out = match tokio::time::timeout(timeout, &mut waiting).await {
        Ok(res) => res.map_err(|e| Error::io(format!("waiting for {program}"), e))?,
        Err(_) => {
            let timed_out = Error::Timeout {
                program: program.to_string(),
                argv: args.to_vec(),
                after: timeout,
            };
            let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
                return Err(timed_out);
            };
            let pid = nix::unistd::Pid::from_raw(pid);
            match stop {
                Stop::Kill => {
                    // The child is still ours to reap (the wait future holds
                    // it), so the pid cannot have been reused.
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    let _ = waiting.await;
                    tracing::warn!(program, ?args, ?timeout, "command timed out, killed");
                }
                Stop::Interrupt => {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
                    tracing::warn!(
                        program,
                        ?args,
                        ?timeout,
                        "command timed out, interrupted; waiting for it to stop"
                    );
                    loop {
                        match tokio::time::timeout(INTERRUPT_NAG, &mut waiting).await {
                            Ok(res) => {
                                let status = res.map(|o| o.status.to_string());
                                tracing::warn!(program, ?args, ?status, elapsed = ?started.elapsed(), "interrupted command stopped");
                                break;
                            }
                            Err(_) => {
                                tracing::warn!(program, ?args, elapsed = ?started.elapsed(), "interrupted command still running; still waiting")
                            }
                        }
                    }
                }
            }
            return Err(timed_out);
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    tracing::debug!(program, ?args, status = %out.status, elapsed = ?started.elapsed(), "command finished");
    if !out.status.success() {
        return Err(failed(program, args, out.status, &stderr));
    }
    Ok(Output { stdout, stderr })
}

/// The error of a command that ended with `status` (not a success): its
/// exit code or signal stay numbers.
fn failed(program: &str, args: &[String], status: std::process::ExitStatus, stderr: &str) -> Error {
    use std::os::unix::process::ExitStatusExt;
    Error::Command {
        program: program.to_string(),
        argv: args.to_vec(),
        code: status.code(),
        signal: status.signal(),
        stderr: stderr.trim().to_string(),
    }
}

/// Why `program` did not start. ENOENT here means the program itself is
/// missing (the command has no other path): FAILED_PRECONDITION, with the
/// package that brings it.
fn spawn_error(program: &str, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        return Error::MissingTool {
            program: program.to_string(),
            package: package_of(program).to_string(),
        };
    }
    Error::io(format!("cannot start {program}"), e)
}

/// The Debian package (the same name on most distributions) that installs
/// a program the driver runs.
pub fn package_of(program: &str) -> &'static str {
    let name = program.rsplit('/').next().unwrap_or(program);
    match name {
        "lvm" => "lvm2",
        "dmsetup" => "dmsetup",
        "cryptsetup" => "cryptsetup-bin",
        "blkid" | "losetup" | "wipefs" | "blkdiscard" | "fstrim" => "util-linux",
        "thin_dump" | "thin_delta" | "thin_check" | "thin_repair" | "pdata_tools" => {
            "thin-provisioning-tools"
        }
        n if n.starts_with("mkfs.ext")
            || n.starts_with("fsck.ext")
            || ["mke2fs", "e2fsck", "resize2fs", "tune2fs", "dumpe2fs"].contains(&n) =>
        {
            "e2fsprogs"
        }
        n if n.starts_with("xfs_") || n == "mkfs.xfs" || n == "fsck.xfs" => "xfsprogs",
        _ => "that provides it",
    }
}

/// The command for `program args...`: `env` added, stdin closed, stdout
/// and stderr piped, never killed because its handle is dropped, and
/// stopped as `stop` says if the driver itself dies.
fn command(program: &str, args: &[String], env: &[(&str, &str)], stop: Stop) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // If the driver itself dies (kill -9), its children must not run on
    // beside a restarted driver: they get the signal their Stop says
    // (LVM: SIGINT, a safe stop; others: SIGKILL, their work is redone).
    let on_parent_death = match stop {
        Stop::Kill => nix::sys::signal::Signal::SIGKILL,
        Stop::Interrupt => nix::sys::signal::Signal::SIGINT,
    };
    // A driver that died between the fork and the prctl sends no signal:
    // the child sees another parent then, and does not run the program.
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes the sigaction, prctl and getppid system calls, which are
    // async-signal-safe, and builds an error without allocating.
    unsafe {
        cmd.pre_exec(move || {
            // SIGINT is how a command past its timeout is stopped. A driver
            // started with SIGINT ignored (`nohup`, a background job of a
            // script) would pass that on through exec, and LVM would never
            // stop: the child starts with the default disposition.
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGINT,
                nix::sys::signal::SigHandler::SigDfl,
            )
            .map_err(std::io::Error::from)?;
            nix::sys::prctl::set_pdeathsig(on_parent_death).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd
}

/// A long-running program the driver talks to: its stdin, stdout and
/// stderr piped, plus the read end of a pipe whose write end it has as fd
/// 3 (the fd number goes to it in an environment variable the caller
/// names). It is stopped as `stop` says if the driver dies, and is never
/// killed because its handle is dropped: closing its stdin ends it.
pub struct Coprocess {
    pub child: tokio::process::Child,
    pub stdin: tokio::process::ChildStdin,
    pub stdout: tokio::process::ChildStdout,
    pub stderr: tokio::process::ChildStderr,
    pub extra: tokio::net::unix::pipe::Receiver,
}

/// The fd number a [`Coprocess`] writes its extra output to.
pub const COPROCESS_FD: i32 = 3;

impl Coprocess {
    /// Sends the program SIGINT (LVM stops at a safe point).
    pub fn interrupt(&self) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGINT,
            );
        }
    }

    /// Appends to `into` what the program's stderr holds right now,
    /// without waiting (a read of the pipe until it is empty).
    pub fn read_stderr_now(&self, into: &mut Vec<u8>) {
        use std::os::fd::AsFd;
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = nix::unistd::read(self.stderr.as_fd(), &mut buf) {
            into.extend_from_slice(&buf[..n]);
        }
    }

    pub fn spawn(program: &str, env: &[(&str, &str)], stop: Stop) -> Result<Coprocess> {
        use std::os::fd::{AsRawFd, OwnedFd};
        let io = |e: nix::errno::Errno| Error::io(format!("cannot start {program}"), e.into());
        // The write end stays blocking: a full pipe makes the program wait
        // for the driver, never lose output.
        let (read, write): (OwnedFd, OwnedFd) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io)?;
        let mut cmd = command(program, &[], env, stop);
        cmd.stdin(Stdio::piped());
        as_fd3(&mut cmd, write.as_raw_fd());
        let mut child = cmd.spawn().map_err(|e| spawn_error(program, e))?;
        drop(write);
        let extra = tokio::net::unix::pipe::Receiver::from_owned_fd(read)
            .map_err(|e| Error::io(format!("cannot read the output of {program}"), e))?;
        Ok(Coprocess {
            stdin: child.stdin.take().expect("stdin is piped"),
            stdout: child.stdout.take().expect("stdout is piped"),
            stderr: child.stderr.take().expect("stderr is piped"),
            child,
            extra,
        })
    }
}

/// The stdout of a running read-only program, line by line as it is
/// printed, so a long output is never held whole. The whole run is bounded
/// by its timeout. [`Lines::finish`] reaps the program (killing it when
/// the caller stopped reading early: it changes nothing) and turns a
/// non-zero exit into an [`Error::Command`] with its stderr. Dropped
/// unfinished, the program is killed.
pub struct Lines {
    program: String,
    args: Vec<String>,
    timeout: Duration,
    deadline: tokio::time::Instant,
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    errors: tokio::task::JoinHandle<String>,
    ended: bool,
}

impl Lines {
    pub fn spawn(program: &str, args: &[String], timeout: Duration) -> Result<Lines> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
        let mut cmd = command(program, args, &[], Stop::Kill);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| spawn_error(program, e))?;
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let errors = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        let lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        Ok(Lines {
            program: program.to_string(),
            args: args.to_vec(),
            timeout,
            deadline: tokio::time::Instant::now() + timeout,
            child,
            lines,
            errors,
            ended: false,
        })
    }

    /// The next line; `None` at the end of the output.
    pub async fn next(&mut self) -> Result<Option<String>> {
        match tokio::time::timeout_at(self.deadline, self.lines.next_line()).await {
            Err(_) => {
                let _ = self.child.kill().await;
                tracing::warn!(program = self.program, args = ?self.args, timeout = ?self.timeout, "command timed out, killed");
                Err(Error::Timeout {
                    program: self.program.clone(),
                    argv: self.args.clone(),
                    after: self.timeout,
                })
            }
            Ok(Err(e)) => Err(Error::io(
                format!("reading the output of {}", self.program),
                e,
            )),
            Ok(Ok(line)) => {
                self.ended = line.is_none();
                Ok(line)
            }
        }
    }

    /// Reaps the program; see the type's documentation.
    pub async fn finish(mut self) -> Result<()> {
        if !self.ended {
            let _ = self.child.kill().await;
        }
        let status = self
            .child
            .wait()
            .await
            .map_err(|e| Error::io(format!("waiting for {}", self.program), e))?;
        let stderr = (&mut self.errors).await.unwrap_or_default();
        if self.ended && !status.success() {
            return Err(failed(&self.program, &self.args, status, &stderr));
        }
        Ok(())
    }
}

/// Turns string literals and owned strings into an argv.
#[macro_export]
macro_rules! argv {
    ($($a:expr),* $(,)?) => { vec![$(::std::string::String::from($a)),*] };
}

#[cfg(test)]
#[allow(clippy::useless_vec)] // argv! builds the Vec the API takes
mod tests {
    use super::*;

    #[tokio::test]
    async fn captures_stdout_and_passes_args_verbatim() {
        let out = run(
            "printf",
            &argv!["%s|%s", "a b", "$(touch /tmp/never); ;"],
            &[],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(out.stdout, "a b|$(touch /tmp/never); ;");
    }

    #[tokio::test]
    async fn lines_stream_and_an_early_stop_kills_the_program() {
        let mut out =
            Lines::spawn("sh", &argv!["-c", "echo a; echo b"], Duration::from_secs(5)).unwrap();
        assert_eq!(out.next().await.unwrap().as_deref(), Some("a"));
        assert_eq!(out.next().await.unwrap().as_deref(), Some("b"));
        assert_eq!(out.next().await.unwrap(), None);
        out.finish().await.unwrap();
        // Stopping early ends an endless program.
        let started = Instant::now();
        let mut endless = Lines::spawn("yes", &argv!["x"], Duration::from_secs(30)).unwrap();
        assert_eq!(endless.next().await.unwrap().as_deref(), Some("x"));
        endless.finish().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        let mut bad = Lines::spawn(
            "sh",
            &argv!["-c", "echo half; echo bad >&2; exit 2"],
            Duration::from_secs(5),
        )
        .unwrap();
        while bad.next().await.unwrap().is_some() {}
        let e = bad.finish().await.unwrap_err();
        assert!(
            matches!(&e, Error::Command { stderr, .. } if stderr == "bad"),
            "{e}"
        );
        let mut slow = Lines::spawn("sleep", &argv!["5"], Duration::from_millis(100)).unwrap();
        let e = slow.next().await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }

    #[tokio::test]
    async fn non_zero_exit_carries_stderr() {
        let err = run(
            "sh",
            &argv!["-c", "echo nope >&2; exit 3"],
            &[],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        match err {
            Error::Command {
                code,
                signal,
                stderr,
                ..
            } => {
                assert_eq!((code, signal), (Some(3), None));
                assert_eq!(stderr, "nope");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn timeout_kills_the_child() {
        let started = Instant::now();
        let err = run("sleep", &argv!["30"], &[], Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// LVM's stop: SIGINT, and the program is waited for until it ends on
    /// its own (here it traps SIGINT, writes a file, and exits).
    #[tokio::test]
    async fn interrupt_waits_for_the_program_to_finish() {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("done");
        let script = format!(
            "trap 'sleep 0.3; echo clean > {}; exit 7' INT; while :; do sleep 0.05; done",
            done.display()
        );
        let err = run_with(
            "sh",
            &argv!["-c", script],
            &[],
            Duration::from_millis(200),
            Stop::Interrupt,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
        assert_eq!(std::fs::read_to_string(&done).unwrap().trim(), "clean");
    }

    /// A driver started with SIGINT ignored does not pass that on: the
    /// child can be stopped with SIGINT (its trap runs).
    #[tokio::test]
    async fn children_start_with_sigint_at_its_default() {
        use nix::sys::signal::{signal, SigHandler, Signal};
        // SAFETY: only the disposition changes; no handler runs.
        let before = unsafe { signal(Signal::SIGINT, SigHandler::SigIgn) }.unwrap();
        let res = run(
            "sh",
            &[
                "-c".into(),
                "trap 'exit 3' INT; kill -INT $$; sleep 2; exit 0".into(),
            ],
            &[],
            Duration::from_secs(20),
        )
        .await;
        // SAFETY: as above, back to what it was.
        unsafe { signal(Signal::SIGINT, before) }.unwrap();
        match res {
            Err(Error::Command { code, .. }) => assert_eq!(code, Some(3)),
            other => panic!("the child's SIGINT trap did not run: {other:?}"),
        }
    }

    /// A caller that goes away does not stop the command.
    #[tokio::test]
    async fn dropping_the_caller_does_not_kill_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("done");
        let script = format!("sleep 0.4; echo ran > {}", done.display());
        let args = argv!["-c", script];
        let fut = run("sh", &args, &[], Duration::from_secs(10));
        assert!(tokio::time::timeout(Duration::from_millis(100), fut)
            .await
            .is_err());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done.exists() {
            assert!(
                Instant::now() < deadline,
                "the command was killed with its caller"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn env_is_passed() {
        let out = run(
            "sh",
            &argv!["-c", "printf %s \"$X_TEST\""],
            &[("X_TEST", "42")],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(out.stdout, "42");
    }

    /// ENOENT from spawn is a missing tool, named with its package;
    /// another spawn failure stays an I/O error.
    #[tokio::test]
    async fn a_missing_program_is_a_missing_tool_with_its_package() {
        let err = run("/nonexistent/mkfs.xfs", &[], &[], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::MissingTool { program, package }
                if program == "/nonexistent/mkfs.xfs" && package == "xfsprogs"),
            "{err:?}"
        );
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        let lines = Lines::spawn("no-such-tool-here", &[], Duration::from_secs(1));
        assert!(matches!(lines, Err(Error::MissingTool { .. })));
        // A file that is not executable: not a missing tool.
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        let err = run(plain.to_str().unwrap(), &[], &[], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        assert_eq!(package_of("/usr/sbin/lvm"), "lvm2");
        assert_eq!(package_of("mkfs.ext4"), "e2fsprogs");
        assert_eq!(package_of("thin_delta"), "thin-provisioning-tools");
        assert_eq!(package_of("blkid"), "util-linux");
    }

    /// A command killed by a signal has a signal and no exit code.
    #[tokio::test]
    async fn a_killed_command_keeps_its_signal() {
        let err = run(
            "sh",
            &argv!["-c", "kill -9 $$"],
            &[],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Command {
                    code: None,
                    signal: Some(9),
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
