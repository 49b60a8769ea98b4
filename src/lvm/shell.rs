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

use serde::Deserialize;
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

/// How long a failed command's messages (`lastlog`, no device read) may take.
const LASTLOG_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Whether a shell that failed to start would fail again.
enum Lasting {
    Yes,
    No,
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
        if !takes(argv) {
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
            Err((e, Lasting::Yes)) => {
                self.state.lock().unwrap().off = true;
                tracing::warn!(error = %e, "LVM's shell cannot be used; each LVM command runs on its own from now on");
                None
            }
            Err((e, Lasting::No)) => {
                tracing::warn!(error = %e, "an LVM shell did not start; this command runs on its own");
                None
            }
        }
    }

    /// Starts a shell and checks that it answers in JSON (`version`). A
    /// failure says whether the next start would fail the same way (no
    /// lvm, or lvm exits before it takes a command: no such profile).
    async fn start(&self) -> std::result::Result<Shell, (Error, Lasting)> {
        let fd = COPROCESS_FD.to_string();
        let process = Coprocess::spawn(
            &self.binary,
            &[
                ("LVM_REPORT_FD", fd.as_str()),
                ("LVM_COMMAND_PROFILE", PROFILE),
                ("LVM_SUPPRESS_FD_WARNINGS", "1"),
                // A long-lived lvm must not stop when its log grows.
                ("LVM_LOG_FILE_MAX_LINES", "0"),
                // Bytes pass the line editor as they are; `line` sends
                // ASCII only.
                ("LC_ALL", "C"),
            ],
            Stop::Interrupt,
        )
        .map_err(|e| {
            let lasting = if matches!(e, Error::MissingTool { .. }) {
                Lasting::Yes
            } else {
                Lasting::No
            };
            (e, lasting)
        })?;
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
            Ended::Broken(Err(e @ Error::Timeout { .. })) => {
                shell.close();
                Err((e, Lasting::No))
            }
            Ended::Done(Err(e)) | Ended::Broken(Err(e)) => {
                shell.close();
                Err((e, Lasting::Yes))
            }
            Ended::Broken(Ok(_)) | Ended::NotSent => {
                shell.close();
                let e = Error::Internal(format!("{} exited before it took a command", self.binary));
                Err((e, Lasting::Yes))
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
        let subcommand = argv.first().map(String::as_str).unwrap_or_default();
        match status(&answer.doc) {
            Some((name, 1)) if name == subcommand => Ended::Done(Ok(Output {
                stdout: answer.text,
                stderr: answer.stderr,
            })),
            Some((name, code)) if name == subcommand => {
                let messages = self.last_errors(binary, timeout).await;
                let stderr = [
                    answer.stderr.trim(),
                    messages.as_deref().unwrap_or("").trim(),
                ]
                .into_iter()
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
                .join("\n");
                let failed = Err(Error::Command {
                    program: binary.to_string(),
                    argv: argv.to_vec(),
                    code: Some(code),
                    signal: None,
                    stderr,
                });
                match messages {
                    Some(_) => Ended::Done(failed),
                    // `lastlog` went unanswered: the shell is out of step.
                    None => Ended::Broken(failed),
                }
            }
            _ => Ended::Broken(Err(Error::Internal(format!(
                "LVM's shell gave no status for {argv:?}: {}",
                answer.text
            )))),
        }
    }

    /// The error messages of the last command (`lastlog`), within a short
    /// bound of their own; `None` when the shell did not answer in full.
    async fn last_errors(&mut self, binary: &str, timeout: Duration) -> Option<String> {
        let argv = vec!["lastlog".to_string()];
        self.process.stdin.write_all(b"lastlog\n").await.ok()?;
        let answer = self
            .answer(binary, &argv, timeout.min(LASTLOG_TIMEOUT))
            .await
            .ok()?;
        (!answer.interrupted).then(|| errors(&answer.doc))
    }

    /// Reads until the shell's JSON document for the command is complete,
    /// keeping stdout and stderr drained meanwhile (before the report: LVM
    /// writes its stderr before the document, so none is left for the
    /// next command). Past `timeout` the shell gets SIGINT, and its command
    /// is waited for. A shell that exits is an error.
    async fn answer(&mut self, binary: &str, argv: &[String], timeout: Duration) -> Result<Answer> {
        let started = Instant::now();
        let (mut report, mut out, mut err) = (Vec::new(), Vec::new(), Vec::new());
        let (mut out_open, mut err_open) = (true, true);
        let mut interrupted = false;
        let mut wake = tokio::time::Instant::now() + timeout;
        let p = &mut self.process;
        loop {
            tokio::select! {
                biased;
                n = p.stderr.read_buf(&mut err), if err_open => {
                    err_open = matches!(n, Ok(k) if k > 0);
                }
                n = p.stdout.read_buf(&mut out), if out_open => {
                    // Nothing is read from stdout: the profile sends all to
                    // the report. It is drained so that lvm never blocks.
                    out_open = matches!(n, Ok(k) if k > 0);
                    out.clear();
                }
                n = p.extra.read_buf(&mut report) => {
                    let n = n.map_err(|e| Error::io(format!("reading {binary}'s report"), e))?;
                    if n == 0 {
                        return Err(exited(binary, argv, p, &mut err).await);
                    }
                    if let Some(doc) = complete(&report) {
                        p.read_stderr_now(&mut err);
                        return Ok(Answer {
                            doc,
                            text: String::from_utf8(report)
                                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                            stderr: String::from_utf8_lossy(&err).into_owned(),
                            interrupted,
                        });
                    }
                }
                // A shell that exits while a program it ran keeps the report
                // pipe open: its exit ends the wait all the same.
                _ = p.child.wait() => {
                    return Err(exited(binary, argv, p, &mut err).await);
                }
                _ = tokio::time::sleep_until(wake) => {
                    wake = tokio::time::Instant::now() + INTERRUPT_NAG;
                    if interrupted {
                        tracing::warn!(?argv, elapsed = ?started.elapsed(), "interrupted lvm shell command still running; still waiting");
                        continue;
                    }
                    interrupted = true;
                    p.interrupt();
                    tracing::warn!(?argv, ?timeout, "lvm shell command timed out, interrupted; waiting for it to stop");
                }
            }
        }
    }
}

/// The log of the JSON document in `report` once the document is
/// complete. The report part (a whole `lvs`) is checked and skipped, not
/// kept: the caller parses it once, from the text.
fn complete(report: &[u8]) -> Option<Doc> {
    if !report.ends_with(b"}\n") {
        return None;
    }
    serde_json::from_slice(report).ok()
}

/// What the driver reads of a shell's document: its log.
#[derive(Debug, Default, Deserialize)]
struct Doc {
    #[serde(default)]
    log: Vec<Entry>,
}

/// One line of LVM's command log (every value is a string in its JSON).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Entry {
    log_type: String,
    log_context: String,
    log_object_name: String,
    log_message: String,
    log_ret_code: String,
}

struct Answer {
    doc: Doc,
    text: String,
    stderr: String,
    interrupted: bool,
}

/// The error of a shell that exited before it answered: what the command
/// did is unknown, like that of a command that died.
async fn exited(binary: &str, argv: &[String], p: &mut Coprocess, err: &mut Vec<u8>) -> Error {
    use std::os::unix::process::ExitStatusExt;
    let status = tokio::time::timeout(Duration::from_secs(5), p.child.wait()).await;
    p.read_stderr_now(err);
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

/// The command's status in its log: the command it is for, and LVM's
/// return code (1 is success, anything else is the exit code `lvm` would
/// have had).
fn status(doc: &Doc) -> Option<(String, i32)> {
    let entry = doc.log.iter().rev().find(|e| e.log_context == "shell")?;
    if entry.log_object_name.is_empty() {
        return None;
    }
    let code = entry.log_ret_code.parse().ok()?;
    Some((entry.log_object_name.clone(), code))
}

/// The error messages of a log, one per line.
fn errors(doc: &Doc) -> String {
    doc.log
        .iter()
        .filter(|e| e.log_type == "error")
        .map(|e| e.log_message.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether a shell takes `argv`: a report, or a change that cannot stop
/// to ask a question. A question would read the shell's stdin (an exec'd
/// lvm reads /dev/null and is told no at once), so `lvcreate` and
/// `lvremove` go only with `--yes`, and `pvcreate`, `vgcreate` and the
/// like (one-off, at start-up) always run on their own. `lvchange` as the
/// driver runs it (activation, tags, read-ahead) asks nothing.
fn takes(argv: &[String]) -> bool {
    match argv.first().map(String::as_str) {
        Some("lvs" | "vgs" | "pvs" | "lvchange") => true,
        Some("lvcreate" | "lvremove") => argv.iter().any(|a| a == "--yes"),
        _ => false,
    }
}

/// `argv` as one line of LVM's shell, which splits on white space and
/// takes an argument that starts with `'` or `"` up to the same quote,
/// with no escapes. `None` for what that cannot carry: an argument with
/// both quotes, a line break or another control character (the line
/// editor acts on those), a byte that is not ASCII (the line editor
/// decodes by locale), or too many arguments.
pub fn line(argv: &[String]) -> Option<String> {
    // LVM's shell takes at most 64 words and drops the rest.
    const MAX_ARGS: usize = 63;
    if argv.is_empty() || argv.len() > MAX_ARGS {
        return None;
    }
    let mut words = Vec::with_capacity(argv.len());
    for a in argv {
        if !a.is_ascii() || a.chars().any(|c| c.is_ascii_control()) {
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
        assert!(line(&v(&["lvs", "caf\u{e9}"])).is_none());
        assert!(line(&[]).is_none());
        // Only what cannot stop to ask a question goes to a shell.
        assert!(takes(&v(&["lvs", "vg1"])));
        assert!(takes(&v(&["lvchange", "--activate", "n", "vg1/a"])));
        assert!(takes(&v(&["lvremove", "--yes", "vg1/a"])));
        assert!(!takes(&v(&["lvremove", "vg1/a"])));
        assert!(!takes(&v(&["lvcreate", "--type", "thin-pool", "vg1"])));
        assert!(!takes(&v(&["pvcreate", "/dev/loop0"])));
        assert!(!takes(&v(&["lvextend", "--size", "8b", "vg1/a"])));
        assert!(line(&vec!["x".to_string(); 64]).is_none());
    }

    /// Shells of a fake `lvm` that speaks the shell's protocol in sh and
    /// logs each line it reads; a 1 s timeout. `lvs` answers a report,
    /// `lvremove` fails, `lvchange` takes 2 s (and logs the SIGINT it
    /// gets), and anything else makes it exit mid-command.
    fn fake_shell(dir: &std::path::Path, start: &str) -> (Arc<Shells>, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let log = dir.join("lines");
        let body = format!(
            r#"#!/bin/sh
{start}
[ "$LVM_COMMAND_PROFILE" = lvmdbusd ] || exit 5
trap 'echo INT >> {log}' INT
st() {{ echo "{{\"log\":[{{\"log_type\":\"status\",\"log_context\":\"shell\",\"log_object_name\":\"$1\",\"log_ret_code\":\"$2\"}}]}}" >&$LVM_REPORT_FD; }}
while IFS= read -r line; do
  echo "$line" >> {log}
  case "$line" in
    version) st version 1 ;;
    lvs*) echo '{{"report":[{{"lv":[]}}],"log":[{{"log_type":"status","log_context":"shell","log_object_name":"lvs","log_ret_code":"1"}}]}}' >&$LVM_REPORT_FD ;;
    lvremove*) echo 'partial' >&2; st lvremove 5 ;;
    lastlog) echo '{{"log":[{{"log_type":"error","log_context":"processing","log_message":"LV vg1/x not found","log_ret_code":"0"}}]}}' >&$LVM_REPORT_FD ;;
    lvchange*) sleep 2; st lvchange 1 ;;
    pvs*) st lvs 1 ;;
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
        let doc: Doc = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(status(&doc), Some(("lvs".to_string(), 1)));
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
            .run(&v(&["lvcreate", "--yes", "vg1"]))
            .await
            .expect("the shell takes it")
            .unwrap_err();
        assert!(matches!(e, Error::Command { code: Some(9), .. }), "{e:?}");
        assert_eq!(shells.idle(), 0, "a dead shell is not kept");
        shells.run(&v(&["lvs"])).await.unwrap().unwrap();
        // An answer for another command: the shell is out of step.
        let e = shells.run(&v(&["pvs"])).await.unwrap().unwrap_err();
        assert!(matches!(e, Error::Internal(_)), "{e:?}");
        assert_eq!(shells.idle(), 0, "a shell out of step is not kept");
        shells.run(&v(&["lvs"])).await.unwrap().unwrap();
        let starts = lines(&log).iter().filter(|l| *l == "version").count();
        assert_eq!(
            starts, 3,
            "each command after a broken shell gets a new one"
        );
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
        let doc: Doc = serde_json::from_str(
            r#"{"log":[{"log_type":"error","log_context":"processing","log_message":"VG x not found","log_ret_code":"0"},
                       {"log_type":"status","log_context":"processing","log_message":"failure","log_ret_code":"5"},
                       {"log_type":"status","log_context":"shell","log_object_name":"lvs","log_message":"failure","log_ret_code":"5"}]}"#,
        )
        .unwrap();
        assert_eq!(status(&doc), Some(("lvs".to_string(), 5)));
        assert_eq!(errors(&doc), "VG x not found");
        let ok: Doc = serde_json::from_str(
            r#"{"report":[{"lv":[]}],"log":[{"log_type":"status","log_context":"shell","log_object_name":"lvs","log_ret_code":"1"}]}"#,
        )
        .unwrap();
        assert_eq!(status(&ok), Some(("lvs".to_string(), 1)));
        let unnamed: Doc = serde_json::from_str(
            r#"{"log":[{"log_type":"status","log_context":"shell","log_ret_code":"1"}]}"#,
        )
        .unwrap();
        assert_eq!(status(&unnamed), None, "no command named");
        let none: Doc = serde_json::from_str(r#"{"report":[{"lv":[]}]}"#).unwrap();
        assert_eq!(status(&none), None);
    }
}
