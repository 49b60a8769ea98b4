//! A spinner with elapsed seconds on stderr while a call runs. On a
//! terminal it redraws one line and erases it at the end; asked for
//! (`--progress`) on anything else, it writes a line a second and one at
//! the end, so a log shows how long the call took.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const FRAMES: [char; 4] = ['|', '/', '-', '\\'];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Off,
    /// Redraw one line (a terminal).
    Spinner,
    /// One line per second, and one at the end.
    Lines,
}

impl Progress {
    pub fn choose(asked: bool, stderr_is_terminal: bool) -> Progress {
        match (stderr_is_terminal, asked) {
            (true, _) => Progress::Spinner,
            (false, true) => Progress::Lines,
            (false, false) => Progress::Off,
        }
    }

    pub fn for_stderr(asked: bool) -> Progress {
        Progress::choose(asked, std::io::stderr().is_terminal())
    }

    /// Runs `fut`, showing `label` and the time it has taken meanwhile.
    pub async fn run<F: Future>(self, label: &str, fut: F) -> F::Output {
        self.run_with(label, &std::sync::Mutex::new(String::new()), fut)
            .await
    }

    /// [`Progress::run`], with `detail` (which the caller may change
    /// meanwhile) after the label.
    pub async fn run_with<F: Future>(
        self,
        label: &str,
        detail: &std::sync::Mutex<String>,
        fut: F,
    ) -> F::Output {
        if self == Progress::Off {
            return fut.await;
        }
        let start = Instant::now();
        let period = match self {
            Progress::Spinner => Duration::from_millis(125),
            _ => Duration::from_secs(1),
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // The spinner's line is erased however this ends, also when the
        // call is dropped (`--timeout`).
        let _erase = Erase(self == Progress::Spinner);
        tokio::pin!(fut);
        let mut n = 0;
        let out = loop {
            tokio::select! {
                out = &mut fut => break out,
                _ = tick.tick() => {
                    n += 1;
                    let label = labelled(label, &detail.lock().unwrap());
                    self.draw(&line(&label, n, start.elapsed()));
                }
            }
        };
        if self == Progress::Lines {
            self.draw(&format!(
                "{label}: done in {:.1}s\n",
                start.elapsed().as_secs_f64()
            ));
        }
        out
    }

    fn draw(self, text: &str) {
        let text = match self {
            Progress::Spinner if !text.starts_with('\r') => format!("\r\x1b[2K{text}"),
            Progress::Lines if !text.ends_with('\n') => format!("{text}\n"),
            _ => text.to_string(),
        };
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(text.as_bytes());
        let _ = e.flush();
    }
}

/// Erases the spinner's line when dropped.
struct Erase(bool);

impl Drop for Erase {
    fn drop(&mut self) {
        if self.0 {
            Progress::Spinner.draw("\r\x1b[2K");
        }
    }
}

/// A label and what the caller says of its progress, if anything.
pub fn labelled(label: &str, detail: &str) -> String {
    match detail.is_empty() {
        true => label.to_string(),
        false => format!("{label}: {detail}"),
    }
}

/// One frame: `| reclaiming csi-x  3s`.
pub fn line(label: &str, frame: usize, elapsed: Duration) -> String {
    format!(
        "{} {label}  {}s",
        FRAMES[frame % FRAMES.len()],
        elapsed.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_on_a_terminal_or_when_asked() {
        assert_eq!(Progress::choose(false, true), Progress::Spinner);
        assert_eq!(Progress::choose(true, true), Progress::Spinner);
        assert_eq!(Progress::choose(true, false), Progress::Lines);
        assert_eq!(Progress::choose(false, false), Progress::Off);
    }

    #[test]
    fn frames_turn_and_count_seconds() {
        assert_eq!(
            line("reclaiming v", 0, Duration::ZERO),
            "| reclaiming v  0s"
        );
        assert_eq!(
            line("reclaiming v", 5, Duration::from_millis(2900)),
            "/ reclaiming v  2s"
        );
    }

    #[test]
    fn a_detail_follows_the_label() {
        assert_eq!(labelled("round 1", ""), "round 1");
        assert_eq!(
            labelled("round 1", "byte 5 of 10 (50 %)"),
            "round 1: byte 5 of 10 (50 %)"
        );
    }

    #[tokio::test]
    async fn returns_what_the_call_returns() {
        let out = Progress::Off.run("x", async { 7 }).await;
        assert_eq!(out, 7);
        let slow = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            "done"
        };
        assert_eq!(Progress::Lines.run("slow call", slow).await, "done");
    }
}
