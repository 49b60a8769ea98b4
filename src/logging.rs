//! Logging: `tracing` to stderr, as human-readable lines or as one JSON
//! object a line (`log_format`, `--log-format`), at the level `RUST_LOG`
//! says (default info).

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

pub use crate::config::LogFormat;

/// A subscriber that writes `format` to `writer`, filtered by `filter`
/// (`RUST_LOG` syntax); text is coloured only when `ansi`.
pub fn subscriber<W>(
    format: LogFormat,
    filter: &str,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        // Fields at the top level next to timestamp, level, target and
        // message, as log collectors index them.
        LogFormat::Json => Box::new(
            builder
                .with_ansi(false)
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Installs the process-wide subscriber: stderr (coloured only on a
/// terminal), `RUST_LOG` or info.
pub fn init(format: LogFormat) {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let filter = if EnvFilter::try_new(&filter).is_ok() {
        filter
    } else {
        eprintln!("thinpool-csi: RUST_LOG={filter:?} does not parse; logging at info");
        "info".into()
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ =
        tracing::subscriber::set_global_default(subscriber(format, &filter, std::io::stderr, ansi));
}

/// Log output captured in memory, for tests.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'w> MakeWriter<'w> for Captured {
    type Writer = Captured;
    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emit() {
        tracing::info!(target: "thinpool_csi::rpc", service = "csi.v1.Identity", method = "Probe",
            volume_id = "csi-a-0123456789abcdef", code = "OK", duration_ms = 1.5, "rpc");
        tracing::debug!("hidden at info");
    }

    #[test]
    fn json_lines_carry_every_field_at_the_top_level() {
        let out = Captured::default();
        tracing::subscriber::with_default(
            subscriber(LogFormat::Json, "info", out.clone(), false),
            emit,
        );
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON object");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "thinpool_csi::rpc");
        assert_eq!(v["message"], "rpc");
        assert_eq!(v["method"], "Probe");
        assert_eq!(v["volume_id"], "csi-a-0123456789abcdef");
        assert_eq!(v["code"], "OK");
        assert_eq!(v["duration_ms"], 1.5);
        assert!(v["timestamp"].as_str().is_some_and(|t| !t.is_empty()));
    }

    #[test]
    fn text_lines_are_for_people() {
        let out = Captured::default();
        tracing::subscriber::with_default(
            subscriber(LogFormat::Text, "info", out.clone(), false),
            emit,
        );
        let text = out.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());
        for part in [
            " INFO ",
            "thinpool_csi::rpc",
            "rpc",
            "method=\"Probe\"",
            "duration_ms=1.5",
        ] {
            assert!(text.contains(part), "{part:?} missing in {text}");
        }
    }
}
