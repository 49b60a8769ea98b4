//! LVM's own shell: `lvm` started once, reading commands on its stdin, so
//! that a command skips LVM's start-up (about half of an `lvcreate` in the
//! VM). With lvm2's `lvmdbusd` command profile every command ends with a
//! JSON document on the report fd (`LVM_REPORT_FD`): the command's report
//! (an `lvs`), and a log whose last entry is the command's status. A
//! failed command's messages come from `lastlog`, asked right after.
//!
//! The rules of [`crate::exec`] hold here too: a command is stopped only
//! by its timeout, with SIGINT, and waited for; a caller that goes away
//! leaves the command running to its end (each call is a task of its own,
//! which owns the shell meanwhile); a driver that dies sends the shell
//! SIGINT and closes its stdin. A shell that was interrupted, or whose
//! answer could not be read, is closed. One that does not start (no such
//! profile: lvm exits at once) turns the shells off: every command then
//! runs on its own, as before.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::exec::{Coprocess, Output, Stop, COPROCESS_FD, INTERRUPT_NAG};

/// The command profile lvm2 ships for lvmdbusd, which uses the shell the
/// same way: JSON reports, and the command log with each command's status.
/// Arguments on the command line (`--units`, `--config`) still win.
const PROFILE: &str = "lvmdbusd";

/// Shells kept waiting for work; more run while more commands do.
const MAX_IDLE: usize = 3;

/// A shell left idle this long is closed: an idle driver keeps none.
const IDLE: Duration = Duration::from_secs(30);

pub struct Shells {
    binary: String,
    timeout: Duration,
    state: Mutex<State>,
}

struct State {
    idle: Vec<Shell>,
    /// Set when a shell could not start: commands then run on their own.
    off: bool,
}

struct Shell {
    process: Coprocess,
    last_used: Instant,
}

/// How a command sent to a shell ended.
enum Ended {
    /// It ran to its end; the shell can take the next one.
    Done(Result<Output>),
    /// Its answer, but the shell takes no more (interrupted, exited, or
    /// its answer unreadable).
    Broken(Result<Output>),
    /// It never reached the shell (the shell had gone): nothing ran.
    NotSent,
}

impl Shells {
    pub fn new(binary: &str, timeout: Duration, enabled: bool) -> Shells {
        Shells {
            binary: binary.to_string(),
            timeout,
            state: Mutex::new(State {
                idle: Vec::new(),
                off: !enabled,
            }),
        }
    }

    /// Runs `argv` (the subcommand first) in a shell; `None` when the
    /// shells are off or `argv` cannot be written as one shell line: the
    /// caller runs the command on its own then.
    pub async fn run(self: &Arc<Self>, argv: &[String]) -> Option<Result<Output>> {
        if self.state.lock().unwrap().off {
            return None;
        }
        let line = line(argv)?;
        let me = self.clone();
        let argv = argv.to_vec();
        // A task of its own: a caller that goes away never leaves a shell
        // in the middle of a command.
        match tokio::spawn(async move { me.run_line(&argv, &line).await }).await {
            Ok(res) => res,
            Err(e) => Some(Err(Error::Internal(format!(
                "the task that ran an LVM command failed: {e}"
            )))),
        }
    }

    async fn run_line(self: &Arc<Self>, argv: &[String], line: &str) -> Option<Result<Output>> {
        // A shell that went while idle is noticed when the line is written;
        // the command then goes to a new one.
        for _ in 0..2 {
            let mut shell = self.take().await?;
            match shell.call(&self.binary, argv, line, self.timeout).await {
                Ended::Done(res) => {
                    self.put_back(shell);
                    return Some(res);
                }
                Ended::Broken(res) => {
                    shell.close();
                    return Some(res);
                }
                Ended::NotSent => shell.close(),
            }
        }
        None
    }

    /// An idle shell, or a new one; `None` when the shells are off.
    async fn take(&self) -> Option<Shell> {
        loop {
            let shell = {
                let mut state = self.state.lock().unwrap();
                if state.off {
                    return None;
                }
                state.idle.pop()
            };
            match shell {
                Some(mut s) => {
                    if s.alive() {
                        return Some(s);
                    }
                    s.close();
                }
                None => break,
            }
        }
        match self.start().await {
            Ok(shell) => Some(shell),
            Err(e) => {
                self.state.lock().unwrap().off = true;
                tracing::warn!(error = %e, "LVM's shell cannot be used; each LVM command runs on its own");
                None
            }
        }
    }

    /// Starts a shell and checks that it answers in JSON (`version`).
    async fn start(&self) -> Result<Shell> {
        let fd = COPROCESS_FD.to_string();
        let process = Coprocess::spawn(
            &self.binary,
            &[
                ("LVM_REPORT_FD", fd.as_str()),
                ("LVM_COMMAND_PROFILE", PROFILE),
                ("LVM_SUPPRESS_FD_WARNINGS", "1"),
                // A long-lived lvm must not stop when its log grows.
                ("LVM_LOG_FILE_MAX_LINES", "0"),
            ],
            Stop::Interrupt,
        )?;
        let pid = process.child.id();
        let mut shell = Shell {
            process,
            last_used: Instant::now(),
        };
        let version = vec!["version".to_string()];
        match shell
            .call(&self.binary, &version, "version", self.timeout)
            .await
        {
            Ended::Done(Ok(_)) => {
                tracing::info!(pid, profile = PROFILE, "lvm shell started");
                Ok(shell)
            }
            Ended::Done(Err(e)) | Ended::Broken(Err(e)) => {
                shell.close();
                Err(e)
            }
            Ended::Broken(Ok(_)) | Ended::NotSent => {
                shell.close();
                Err(Error::Internal(format!(
                    "{} exited before it took a command",
                    self.binary
                )))
            }
        }
    }

    /// Keeps `shell` for the next command (up to [`MAX_IDLE`]), and closes
    /// it once it has been idle for [`IDLE`].
    fn put_back(self: &Arc<Self>, mut shell: Shell) {
        shell.last_used = Instant::now();
        let extra = {
            let mut state = self.state.lock().unwrap();
            if state.idle.len() < MAX_IDLE {
                state.idle.push(shell);
                None
            } else {
                Some(shell)
            }
        };
        if let Some(s) = extra {
            s.close();
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(IDLE).await;
            me.close_idle(IDLE);
        });
    }

    /// Closes the shells idle for `idle` or longer.
    fn close_idle(&self, idle: Duration) {
        let expired: Vec<Shell> = {
            let mut state = self.state.lock().unwrap();
            let (old, keep) = std::mem::take(&mut state.idle)
                .into_iter()
                .partition(|s| s.last_used.elapsed() >= idle);
            state.idle = keep;
            old
        };
        for s in expired {
            s.close();
        }
    }

    /// How many shells wait for work.
    pub fn idle(&self) -> usize {
        self.state.lock().unwrap().idle.len()
    }
}

impl Shell {
    fn alive(&mut self) -> bool {
        matches!(self.process.child.try_wait(), Ok(None))
    }

    /// Ends the shell: its stdin closes, it exits, and it is reaped.
    fn close(self) {
        let Shell { process, .. } = self;
        let Coprocess {
            mut child, stdin, ..
        } = process;
        drop(stdin);
        let pid = child.id();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let status = child.wait().await;
                tracing::debug!(pid, ?status, "lvm shell closed");
            });
        }
    }

    /// Sends `line` (`argv` as one shell line) and reads its answer.
    async fn call(
        &mut self,
        binary: &str,
        argv: &[String],
        line: &str,
        timeout: Duration,
    ) -> Ended {
        let mut text = line.to_string();
        text.push('\n');
        let sent = async {
            self.process.stdin.write_all(text.as_bytes()).await?;
            self.process.stdin.flush().await
        };
        if sent.await.is_err() {
            return Ended::NotSent;
        }
        let started = Instant::now();
        let answer = match self.answer(binary, argv, timeout).await {
            Ok(a) => a,
            Err(e) => return Ended::Broken(Err(e)),
        };
        tracing::debug!(?argv, elapsed = ?started.elapsed(), "lvm shell: command finished");
        if answer.interrupted {
            return Ended::Broken(Err(Error::Timeout {
                program: binary.to_string(),
                argv: argv.to_vec(),
                after: timeout,
            }));
        }
        match status(&answer.doc) {
            Some(1) => Ended::Done(Ok(Output {
                stdout: answer.text,
                stderr: answer.stderr,
            })),
            Some(code) => {
                let messages = self.last_errors(binary, timeout).await;
                let stderr = [answer.stderr.trim(), messages.trim()]
                    .into_iter()
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n");
                Ended::Done(Err(Error::Command {
                    program: binary.to_string(),
                    argv: argv.to_vec(),
                    code: Some(code),
                    signal: None,
                    stderr,
                }))
            }
            None => Ended::Broken(Err(Error::Internal(format!(
                "LVM's shell gave no status for {argv:?}: {}",
                answer.text
            )))),
        }
    }

    /// The error messages of the last command (`lastlog`); empty if they
    /// cannot be read.
    async fn last_errors(&mut self, binary: &str, timeout: Duration) -> String {
        let argv = vec!["lastlog".to_string()];
        if self.process.stdin.write_all(b"lastlog\n").await.is_err() {
            return String::new();
        }
        match self.answer(binary, &argv, timeout).await {
            Ok(a) => errors(&a.doc),
            Err(_) => String::new(),
        }
    }

    /// Reads until the shell's JSON document for the command is complete,
    /// keeping stdout and stderr drained meanwhile. Past `timeout` the
    /// shell gets SIGINT, and its command is waited for.
    async fn answer(&mut self, binary: &str, argv: &[String], timeout: Duration) -> Result<Answer> {
        let started = Instant::now();
        let (mut report, mut out, mut err) = (Vec::new(), Vec::new(), Vec::new());
        let (mut out_open, mut err_open) = (true, true);
        let mut interrupted = false;
        let mut wake = tokio::time::Instant::now() + timeout;
        let p = &mut self.process;
        loop {
            tokio::select! {
                n = p.extra.read_buf(&mut report) => {
                    let n = n.map_err(|e| Error::io(format!("reading {binary}'s report"), e))?;
                    if n == 0 {
                        return Err(exited(binary, argv, &mut p.child, &err).await);
                    }
                    if report.ends_with(b"}\n") {
                        if let Ok(doc) = serde_json::from_slice::<Value>(&report) {
                            return Ok(Answer {
                                doc,
                                text: String::from_utf8_lossy(&report).into_owned(),
                                stderr: String::from_utf8_lossy(&err).into_owned(),
                                interrupted,
                            });
                        }
                    }
                }
                n = p.stdout.read_buf(&mut out), if out_open => {
                    // Nothing is read from stdout: the profile sends all to
                    // the report. It is drained so that lvm never blocks.
                    out_open = matches!(n, Ok(k) if k > 0);
                    out.clear();
                }
                n = p.stderr.read_buf(&mut err), if err_open => {
                    err_open = matches!(n, Ok(k) if k > 0);
                }
                _ = tokio::time::sleep_until(wake) => {
                    wake = tokio::time::Instant::now() + INTERRUPT_NAG;
                    if interrupted {
                        tracing::warn!(?argv, elapsed = ?started.elapsed(), "interrupted lvm shell command still running; still waiting");
                        continue;
                    }
                    interrupted = true;
                    if let Some(pid) = p.child.id().and_then(|p| i32::try_from(p).ok()) {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGINT,
                        );
                    }
                    tracing::warn!(?argv, ?timeout, "lvm shell command timed out, interrupted; waiting for it to stop");
                }
            }
        }
    }
}

struct Answer {
    doc: Value,
    text: String,
    stderr: String,
    interrupted: bool,
}

/// The error of a shell that exited before it answered: what the command
/// did is unknown, like that of a command that died.
async fn exited(
    binary: &str,
    argv: &[String],
    child: &mut tokio::process::Child,
    err: &[u8],
) -> Error {
    use std::os::unix::process::ExitStatusExt;
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    let (code, signal) = match status {
        Ok(Ok(s)) => (s.code(), s.signal()),
        _ => (None, None),
    };
    Error::Command {
        program: binary.to_string(),
        argv: argv.to_vec(),
        code,
        signal,
        stderr: String::from_utf8_lossy(err).trim().to_string(),
    }
}

/// The command's status in its log: LVM's return code (1 is success,
/// anything else is the exit code `lvm` would have had).
fn status(doc: &Value) -> Option<i32> {
    doc.get("log")?
        .as_array()?
        .iter()
        .rev()
        .find(|e| e.get("log_context").and_then(Value::as_str) == Some("shell"))?
        .get("log_ret_code")?
        .as_str()?
        .parse()
        .ok()
}

/// The error messages of a log, one per line.
fn errors(doc: &Value) -> String {
    let Some(log) = doc.get("log").and_then(Value::as_array) else {
        return String::new();
    };
    log.iter()
        .filter(|e| e.get("log_type").and_then(Value::as_str) == Some("error"))
        .filter_map(|e| e.get("log_message").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `argv` as one line of LVM's shell, which splits on white space and
/// takes an argument that starts with `'` or `"` up to the same quote,
/// with no escapes. `None` for what that cannot carry: an argument with
/// both quotes, a line break or another control character (the line
/// editor acts on those), or too many arguments.
pub fn line(argv: &[String]) -> Option<String> {
    // LVM's shell takes at most 64 words and drops the rest.
    const MAX_ARGS: usize = 63;
    if argv.is_empty() || argv.len() > MAX_ARGS {
        return None;
    }
    let mut words = Vec::with_capacity(argv.len());
    for a in argv {
        if a.chars().any(char::is_control) {
            return None;
        }
        let plain = !a.is_empty()
            && !a.starts_with(['\'', '"', '#'])
            && !a.chars().any(char::is_whitespace);
        if plain {
            words.push(a.clone());
        } else if !a.contains('\'') {
            words.push(format!("'{a}'"));
        } else if !a.contains('"') {
            words.push(format!("\"{a}\""));
        } else {
            return None;
        }
    }
    Some(words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_line_quotes_what_lvm_would_split_and_refuses_what_it_cannot_carry() {
        assert_eq!(
            line(&v(&[
                "lvs",
                "--config",
                "report { time_format = \"%s\" }",
                "vg"
            ]))
            .unwrap(),
            "lvs --config 'report { time_format = \"%s\" }' vg"
        );
        // A quote inside a word is plain text to LVM.
        assert_eq!(line(&v(&["lvs", "it's"])).unwrap(), "lvs it's");
        assert_eq!(line(&v(&["lvs", "it's x"])).unwrap(), "lvs \"it's x\"");
        assert_eq!(line(&v(&["lvs", "'x"])).unwrap(), "lvs \"'x\"");
        assert_eq!(line(&v(&["lvs", ""])).unwrap(), "lvs ''");
        assert_eq!(line(&v(&["lvs", "#x"])).unwrap(), "lvs '#x'");
        assert_eq!(line(&v(&["lvs", "a#b"])).unwrap(), "lvs a#b");
        assert_eq!(line(&v(&["lvs", "\"x"])).unwrap(), "lvs '\"x'");
        assert!(line(&v(&["lvs", "both ' and \""])).is_none());
        assert!(line(&v(&["lvs", "a\nb"])).is_none());
        assert!(line(&v(&["lvs", "a\tb"])).is_none());
        assert!(line(&[]).is_none());
        assert!(line(&vec!["x".to_string(); 64]).is_none());
    }

    /// Shells of a fake `lvm` that speaks the shell's protocol in sh and
    /// logs each line it reads; a 1 s timeout. `lvs` answers a report,
    /// `lvremove` fails, `lvchange` takes 2 s (and logs the SIGINT it
    /// gets), and anything else makes it exit mid-command.
    fn fake_shell(dir: &std::path::Path, start: &str) -> (Arc<Shells>, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let log = dir.join("lines");
        let ok = r#"{"log":[{"log_type":"status","log_context":"shell","log_ret_code":"1"}]}"#;
        let body = format!(
            r#"#!/bin/sh
{start}
[ "$LVM_COMMAND_PROFILE" = lvmdbusd ] || exit 5
trap 'echo INT >> {log}' INT
while IFS= read -r line; do
  echo "$line" >> {log}
  case "$line" in
    version) echo '{ok}' >&$LVM_REPORT_FD ;;
    lvs*) echo '{{"report":[{{"lv":[]}}],"log":[{{"log_type":"status","log_context":"shell","log_ret_code":"1"}}]}}' >&$LVM_REPORT_FD ;;
    lvremove*) echo 'partial' >&2; echo '{{"log":[{{"log_type":"status","log_context":"shell","log_ret_code":"5"}}]}}' >&$LVM_REPORT_FD ;;
    lastlog) echo '{{"log":[{{"log_type":"error","log_context":"processing","log_message":"LV vg1/x not found","log_ret_code":"0"}}]}}' >&$LVM_REPORT_FD ;;
    lvchange*) sleep 2; echo '{ok}' >&$LVM_REPORT_FD ;;
    *) exit 9 ;;
  esac
done
"#,
            log = log.display()
        );
        let script = dir.join("lvm");
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let shells = Shells::new(&script.display().to_string(), Duration::from_secs(1), true);
        (Arc::new(shells), log)
    }

    fn lines(log: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    #[tokio::test]
    async fn one_shell_runs_command_after_command_each_with_its_own_status() {
        let dir = tempfile::tempdir().unwrap();
        let (shells, log) = fake_shell(dir.path(), "");
        let out = shells
            .run(&v(&["lvs", "--config", "a b", "vg1"]))
            .await
            .expect("the shell takes it")
            .unwrap();
        assert!(status(&serde_json::from_str(&out.stdout).unwrap()) == Some(1));
        assert!(out.stdout.contains("\"report\""), "{}", out.stdout);
        let e = shells
            .run(&v(&["lvremove", "--yes", "vg1/x"]))
            .await
            .expect("the shell takes it")
            .unwrap_err();
        match &e {
            Error::Command { code, stderr, .. } => {
                assert_eq!(*code, Some(5));
                assert!(stderr.contains("LV vg1/x not found"), "{stderr}");
                assert!(stderr.contains("partial"), "{stderr}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            lines(&log),
            [
                "version",
                "lvs --config 'a b' vg1",
                "lvremove --yes vg1/x",
                "lastlog"
            ]
        );
        assert_eq!(shells.idle(), 1, "the shell waits for the next command");
        shells.close_idle(Duration::ZERO);
        assert_eq!(shells.idle(), 0);
    }

    #[tokio::test]
    async fn a_shell_that_dies_mid_command_fails_that_command_only() {
        let dir = tempfile::tempdir().unwrap();
        let (shells, log) = fake_shell(dir.path(), "");
        let e = shells
            .run(&v(&["lvextend", "vg1/x"]))
            .await
            .expect("the shell takes it")
            .unwrap_err();
        assert!(matches!(e, Error::Command { code: Some(9), .. }), "{e:?}");
        assert_eq!(shells.idle(), 0, "a dead shell is not kept");
        shells.run(&v(&["lvs"])).await.unwrap().unwrap();
        let starts = lines(&log).iter().filter(|l| *l == "version").count();
        assert_eq!(starts, 2, "the next command gets a new shell");
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_gets_sigint_and_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let (shells, log) = fake_shell(dir.path(), "");
        let started = Instant::now();
        let e = shells
            .run(&v(&["lvchange", "-an", "vg1/x"]))
            .await
            .expect("the shell takes it")
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "answered before the command ended: {:?}",
            started.elapsed()
        );
        assert!(
            lines(&log).contains(&"INT".to_string()),
            "{:?}",
            lines(&log)
        );
        assert_eq!(shells.idle(), 0, "an interrupted shell is not kept");
    }

    #[tokio::test]
    async fn a_shell_that_cannot_start_turns_the_shells_off() {
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let (shells, _) = fake_shell(
            dir.path(),
            &format!("echo x >> {}; exit 5", started.display()),
        );
        assert!(shells.run(&v(&["lvs"])).await.is_none());
        assert!(shells.run(&v(&["lvs"])).await.is_none());
        assert_eq!(lines(&started).len(), 1, "started again after it failed");
        let off = Shells::new("/nonexistent/lvm", Duration::from_secs(1), false);
        assert!(Arc::new(off).run(&v(&["lvs"])).await.is_none());
    }

    #[test]
    fn the_status_is_the_shell_entry_of_the_log() {
        let doc: Value = serde_json::from_str(
            r#"{"log":[{"log_type":"error","log_context":"processing","log_message":"VG x not found","log_ret_code":"0"},
                       {"log_type":"status","log_context":"processing","log_message":"failure","log_ret_code":"5"},
                       {"log_type":"status","log_context":"shell","log_message":"failure","log_ret_code":"5"}]}"#,
        )
        .unwrap();
        assert_eq!(status(&doc), Some(5));
        assert_eq!(errors(&doc), "VG x not found");
        let ok: Value = serde_json::from_str(
            r#"{"report":[{"lv":[]}],"log":[{"log_type":"status","log_context":"shell","log_ret_code":"1"}]}"#,
        )
        .unwrap();
        assert_eq!(status(&ok), Some(1));
        let none: Value = serde_json::from_str(r#"{"report":[{"lv":[]}]}"#).unwrap();
        assert_eq!(status(&none), None);
    }
}
