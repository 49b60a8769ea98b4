//! The one way this driver runs an external program: an argv (never a shell
//! string), a timeout after which the child is killed, stdin closed, and
//! stderr captured into the error.

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

/// Runs `program args...` with `env` added to the environment, killing it
/// after `timeout`. A non-zero exit is an [`Error::Command`].
pub async fn run(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<Output> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("cannot start {program}"), e))?;
    let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(res) => res.map_err(|e| Error::io(format!("waiting for {program}"), e))?,
        Err(_) => {
            // Dropping the future drops the child, and kill_on_drop kills it.
            tracing::warn!(program, ?args, ?timeout, "command timed out, killed");
            return Err(Error::Timeout {
                program: program.to_string(),
                argv: args.to_vec(),
                after: timeout,
            });
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    tracing::debug!(program, ?args, status = %out.status, elapsed = ?started.elapsed(), "command finished");
    if !out.status.success() {
        return Err(Error::Command {
            program: program.to_string(),
            argv: args.to_vec(),
            status: out.status.to_string(),
            stderr: stderr.trim().to_string(),
        });
    }
    Ok(Output { stdout, stderr })
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
            Error::Command { status, stderr, .. } => {
                assert!(status.contains('3'), "{status}");
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

    #[tokio::test]
    async fn missing_program_is_an_io_error() {
        let err = run("/nonexistent/prog", &[], &[], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
    }
}
