//! Prometheus text exposition format (version 0.0.4), written by hand:
//! `# HELP` and `# TYPE` once per family, then its samples; label values
//! and help text escaped; histograms as cumulative `_bucket` series ending
//! in `le="+Inf"`, with `_sum` and `_count`.

use std::fmt::Write;

/// The `Content-Type` of this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Observations sorted into buckets with fixed upper bounds (seconds for
/// latencies); the last count is for values above every bound (`+Inf`).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; one more than `bounds`.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += value;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A label set: names are fixed identifiers, values are escaped.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// One exposition being written.
#[derive(Default)]
pub struct Text {
    out: String,
}

impl Text {
    /// Starts a metric family: its help and type lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of the current family.
    pub fn sample(&mut self, name: &str, labels: Labels, value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", number(value));
    }

    /// A histogram's series for one label set: cumulative buckets, then
    /// `_sum` and `_count`.
    pub fn histogram(&mut self, name: &str, labels: Labels, h: &Histogram) {
        let mut cumulative = 0;
        for (i, c) in h.counts.iter().enumerate() {
            cumulative += c;
            let le = h.bounds.get(i).map_or("+Inf".to_string(), |b| number(*b));
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }

    fn labels(&mut self, labels: Labels, le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let all = labels.iter().copied().chain(le.map(|v| ("le", v)));
        for (i, (k, v)) in all.enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
        }
        self.out.push('}');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A label value: backslash, double quote and line feed are escaped.
/// The samples of an exposition, by series (`name{labels}`): its
/// `series value` lines.
pub fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

pub fn escape_label(v: &str) -> String {
    escape(v, true)
}

/// Help text: backslash and line feed are escaped.
fn escape_help(v: &str) -> String {
    escape(v, false)
}

fn escape(v: &str, quote: bool) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '"' if quote => s.push_str("\\\""),
            c => s.push(c),
        }
    }
    s
}

/// A sample value as Prometheus reads it: integers without a fraction,
/// `+Inf`, `-Inf`, `NaN`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Rust prints the shortest text that reads back as the same f64.
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        let mut t = Text::default();
        t.family("m", Kind::Gauge, "a \\ help\nline with \"quotes\"");
        t.sample("m", &[("path", "C:\\dir\n\"q\"")], 1.0);
        let s = t.finish();
        assert_eq!(
            s,
            "# HELP m a \\\\ help\\nline with \"quotes\"\n# TYPE m gauge\n\
             m{path=\"C:\\\\dir\\n\\\"q\\\"\"} 1\n"
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(1e21), "1000000000000000000000");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(12.55), "12.55");
    }

    #[test]
    fn samples_without_and_with_labels() {
        let mut t = Text::default();
        t.family("c_total", Kind::Counter, "calls");
        t.sample("c_total", &[], 7.0);
        t.sample("c_total", &[("a", "1"), ("b", "2")], 0.0);
        assert_eq!(
            t.finish(),
            "# HELP c_total calls\n# TYPE c_total counter\nc_total 7\nc_total{a=\"1\",b=\"2\"} 0\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        static BOUNDS: &[f64] = &[0.25, 1.0, 10.0];
        let mut h = Histogram::new(BOUNDS);
        // 0.25 lies on a bound: `le` means less than or equal.
        for v in [0.125, 0.25, 0.5, 3.0, 3.0, 99.0] {
            h.observe(v);
        }
        assert_eq!(h.count(), 6);
        let mut t = Text::default();
        t.family("d_seconds", Kind::Histogram, "latency");
        t.histogram("d_seconds", &[("method", "Probe")], &h);
        let s = t.finish();
        let expected = "# HELP d_seconds latency\n# TYPE d_seconds histogram\n\
            d_seconds_bucket{method=\"Probe\",le=\"0.25\"} 2\n\
            d_seconds_bucket{method=\"Probe\",le=\"1\"} 3\n\
            d_seconds_bucket{method=\"Probe\",le=\"10\"} 5\n\
            d_seconds_bucket{method=\"Probe\",le=\"+Inf\"} 6\n\
            d_seconds_sum{method=\"Probe\"} 105.875\n\
            d_seconds_count{method=\"Probe\"} 6\n";
        assert_eq!(s, expected);
        // An empty histogram still shows every bucket, at 0.
        let mut t = Text::default();
        t.histogram("e", &[], &Histogram::new(BOUNDS));
        let s = t.finish();
        assert!(s.contains("e_bucket{le=\"+Inf\"} 0\n"), "{s}");
        assert!(s.ends_with("e_sum 0\ne_count 0\n"), "{s}");
        assert_eq!(s.lines().count(), 6);
    }
}
