//! Static checks of what deploy/kubernetes installs. Nothing here needs a
//! container engine, a cluster or root. `kubectl kustomize` (kubectl's own
//! kustomize v5; the tests fail when kubectl is missing) renders the base,
//! every overlay, and each of those with every combination of the
//! components; the rendered documents are parsed (a small YAML subset
//! parser below, enough for these manifests) and checked against each
//! other, against the repository, against the driver's own configuration
//! parser and against the capabilities the driver advertises. The
//! Dockerfile, .dockerignore, the Kubernetes schemas and the sidecar flags
//! are checked with real parsers by scripts/check_packaging.py.
//!
//! Run: `cargo test --test deploy` (`-- --nocapture` prints the number of
//! objects each render holds).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use thinpool_csi::config::{parse_endpoint, Config, UdevMode};
use thinpool_csi::proto::csi::v1::controller_service_capability::rpc::Type as Ctrl;
use thinpool_csi::proto::csi::v1::node_service_capability::rpc::Type as NodeCap;
use thinpool_csi::proto::identity::capability::service::Type as AddonsService;
use thinpool_csi::proto::identity::capability::Type as AddonsCap;

// ---------------------------------------------------------------------------
// What the packaging must contain.

/// A sidecar container of the node DaemonSet.
struct Sidecar {
    repo: &'static str,
    /// The component that adds it; None: the base runs it.
    component: Option<&'static str>,
    /// The flags (with their values) of its per-node mode, which also needs
    /// env NODE_NAME from spec.nodeName; empty: the release it pins has none.
    per_node: &'static [(&'static str, &'static str)],
}

const REGISTRAR: &str = "registry.k8s.io/sig-storage/csi-node-driver-registrar";
const LIVENESS: &str = "registry.k8s.io/sig-storage/livenessprobe";
const PROVISIONER: &str = "registry.k8s.io/sig-storage/csi-provisioner";
const ATTACHER: &str = "registry.k8s.io/sig-storage/csi-attacher";
const RESIZER: &str = "registry.k8s.io/sig-storage/csi-resizer";
const SNAPSHOTTER: &str = "registry.k8s.io/sig-storage/csi-snapshotter";
const CSI_ADDONS: &str = "quay.io/csiaddons/k8s-sidecar";
/// Sidecars no deployment here may run: the snapshot-metadata sidecar has
/// one address per driver, so it cannot reach the node that holds a
/// snapshot (SnapshotMetadata is socket-only, deploy/kubernetes/README.md).
const NEVER: &[&str] = &["registry.k8s.io/sig-storage/csi-snapshot-metadata"];

/// Every sidecar, with where it comes from and its per-node mode
/// (read from each sidecar's source: deploy/kubernetes/README.md, "Sidecars").
const SIDECARS: &[Sidecar] = &[
    // Per node by nature: it registers its own node's socket.
    Sidecar {
        repo: REGISTRAR,
        component: None,
        per_node: &[],
    },
    Sidecar {
        repo: LIVENESS,
        component: None,
        per_node: &[],
    },
    Sidecar {
        repo: PROVISIONER,
        component: None,
        per_node: &[("--node-deployment", "true")],
    },
    // external-attacher and external-resizer have no per-node mode.
    Sidecar {
        repo: ATTACHER,
        component: None,
        per_node: &[],
    },
    Sidecar {
        repo: RESIZER,
        component: None,
        per_node: &[],
    },
    Sidecar {
        repo: SNAPSHOTTER,
        component: Some("snapshots"),
        per_node: &[("--node-deployment", "true")],
    },
    // Per node through --node-id=$(NODE_NAME) (checked below).
    Sidecar {
        repo: CSI_ADDONS,
        component: Some("csi-addons"),
        per_node: &[],
    },
];
/// Images without a digest: no public manifest pinning this release was
/// found where the deployment was written
/// (deploy/kubernetes/components/csi-addons/kustomization.yaml).
const UNPINNED: &[&str] = &[CSI_ADDONS];
/// The driver's own image (built from the Dockerfile), tagged with the
/// crate version.
const DRIVER_IMAGE: &str = "thinpool-csi";
/// Kinds that need another project's CRDs: only components may render them.
const CRD_KINDS: &[&str] = &[
    "VolumeSnapshotClass",
    "VolumeSnapshot",
    "VolumeGroupSnapshotClass",
    "PodMonitor",
    "PrometheusRule",
    "ReclaimSpaceCronJob",
    "SnapshotMetadataService",
];
/// What each component must render, besides its container.
const COMPONENT_KINDS: &[(&str, &[&str])] = &[
    ("snapshots", &["VolumeSnapshotClass"]),
    ("csi-addons", &[]),
    ("monitoring", &["PodMonitor", "PrometheusRule"]),
];
/// The label that takes the plugin off a node for maintenance
/// (deploy/kubernetes/README.md, "Maintenance").
const MAINTENANCE_LABEL: &str = "thinpool.csi.storage.dev/maintenance";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Collects failures so one run reports all of them.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.0.push(msg());
        }
    }
    fn push(&mut self, msg: String) {
        self.0.push(msg);
    }
    fn finish(self, what: &str) {
        if !self.0.is_empty() {
            let mut s = format!("{what}: {} problem(s):\n", self.0.len());
            for p in &self.0 {
                let _ = writeln!(s, "  - {p}");
            }
            panic!("{s}");
        }
    }
}

// ---------------------------------------------------------------------------
// A YAML subset: block mappings and sequences, plain/quoted scalars (also
// over several lines, as kustomize writes long strings), flow sequences and
// mappings of scalars, literal/folded block scalars, comments and `---`
// document separators. Anything else is an error naming the line.

#[derive(Debug, Clone, PartialEq)]
enum Y {
    Map(Vec<(String, Y)>),
    Seq(Vec<Y>),
    Str(String),
    Null,
}

impl Y {
    fn get(&self, key: &str) -> Option<&Y> {
        match self {
            Y::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn path(&self, keys: &[&str]) -> Option<&Y> {
        keys.iter().try_fold(self, |y, k| y.get(k))
    }
    fn str(&self) -> Option<&str> {
        match self {
            Y::Str(s) => Some(s),
            _ => None,
        }
    }
    fn s(&self, keys: &[&str]) -> Option<&str> {
        self.path(keys).and_then(Y::str)
    }
    fn seq(&self, keys: &[&str]) -> &[Y] {
        match self.path(keys) {
            Some(Y::Seq(v)) => v,
            _ => &[],
        }
    }
    fn strs(&self, keys: &[&str]) -> Vec<String> {
        self.seq(keys)
            .iter()
            .filter_map(|y| y.str().map(str::to_string))
            .collect()
    }
}

struct Line {
    no: usize,
    indent: usize,
    raw: String,
}

struct Parser<'a> {
    file: &'a str,
    lines: Vec<Line>,
    i: usize,
}

/// The line without a trailing comment (a `#` at the start or after a
/// blank, outside quotes), trimmed.
fn strip_comment(s: &str) -> String {
    let (mut sq, mut dq, mut prev_blank) = (false, false, true);
    let mut prev = '\0';
    for (i, c) in s.char_indices() {
        match c {
            '\'' if !dq => sq = !sq,
            '"' if !sq && prev != '\\' => dq = !dq,
            '#' if !sq && !dq && prev_blank => return s[..i].trim().to_string(),
            _ => {}
        }
        prev_blank = c == ' ' || c == '\t';
        prev = c;
    }
    s.trim().to_string()
}

/// Splits `key: value` (or `key:`) at the first `: `/final `:` outside
/// quotes. None for a line that is not a mapping entry.
fn split_key(s: &str) -> Option<(String, String)> {
    let (mut sq, mut dq) = (false, false);
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'\'' if !dq => sq = !sq,
            b'"' if !sq => dq = !dq,
            b':' if !sq && !dq && (i + 1 == b.len() || b[i + 1] == b' ') => {
                let key = unquote(s[..i].trim()).ok()?;
                return Some((key, s[i + 1..].trim().to_string()));
            }
            _ => {}
        }
    }
    None
}

fn unquote(s: &str) -> Result<String, String> {
    if let Some(inner) = s.strip_prefix('"') {
        let inner = inner
            .strip_suffix('"')
            .ok_or_else(|| format!("unterminated string {s}"))?;
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(c @ ('"' | '\\' | '/')) => out.push(c),
                    other => return Err(format!("unsupported escape \\{other:?} in {s}")),
                }
            } else {
                out.push(c);
            }
        }
        Ok(out)
    } else if let Some(inner) = s.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or_else(|| format!("unterminated string {s}"))?;
        Ok(inner.replace("''", "'"))
    } else {
        Ok(s.to_string())
    }
}

/// Splits a flow collection's inside at top-level commas.
fn split_flow(s: &str) -> Vec<String> {
    let (mut sq, mut dq, mut depth) = (false, false, 0i32);
    let mut parts = vec![String::new()];
    for c in s.chars() {
        match c {
            '\'' if !dq => sq = !sq,
            '"' if !sq => dq = !dq,
            '[' | '{' if !sq && !dq => depth += 1,
            ']' | '}' if !sq && !dq => depth -= 1,
            ',' if !sq && !dq && depth == 0 => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().unwrap().push(c);
    }
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Whether `s` opens a quoted scalar that its line does not close.
fn quote_open(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some('\'') => {
            let rest: Vec<char> = chars.collect();
            let mut i = 0;
            while i < rest.len() {
                if rest[i] == '\'' {
                    if rest.get(i + 1) == Some(&'\'') {
                        i += 2;
                        continue;
                    }
                    return false;
                }
                i += 1;
            }
            true
        }
        Some('"') => {
            let mut escaped = false;
            for c in chars {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => return false,
                    _ => escaped = false,
                }
            }
            true
        }
        _ => false,
    }
}

/// Joins the next line of a scalar written over several lines: a line
/// break folds into a space, except after a `\` in a double-quoted one.
fn fold_into(text: &mut String, line: &str) {
    if text.starts_with('"') && text.ends_with('\\') {
        text.pop();
    } else {
        text.push(' ');
    }
    text.push_str(line.trim());
}

fn scalar(s: &str) -> Result<Y, String> {
    let s = s.trim();
    if s.starts_with('&') || s.starts_with('*') || s.starts_with('!') {
        return Err(format!("anchors, aliases and tags are not supported: {s}"));
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("unterminated flow sequence {s}"))?;
        return split_flow(inner)
            .iter()
            .map(|p| scalar(p))
            .collect::<Result<_, _>>()
            .map(Y::Seq);
    }
    if let Some(inner) = s.strip_prefix('{') {
        let inner = inner
            .strip_suffix('}')
            .ok_or_else(|| format!("unterminated flow mapping {s}"))?;
        let mut m = Vec::new();
        for p in split_flow(inner) {
            let (k, v) = split_key(&p).ok_or_else(|| format!("bad flow mapping entry {p}"))?;
            m.push((k, scalar(&v)?));
        }
        return Ok(Y::Map(m));
    }
    if s.is_empty() || s == "~" || s == "null" {
        return Ok(Y::Null);
    }
    unquote(s).map(Y::Str)
}

impl<'a> Parser<'a> {
    fn err(&self, no: usize, msg: impl std::fmt::Display) -> String {
        format!("{}:{no}: {msg}", self.file)
    }

    /// Index of the next line with content (not blank, not only a
    /// comment), skipping the others.
    fn next_content(&mut self) -> Option<usize> {
        while self.i < self.lines.len() {
            if !strip_comment(&self.lines[self.i].raw).is_empty() {
                return Some(self.i);
            }
            self.i += 1;
        }
        None
    }

    fn node(&mut self, indent: usize) -> Result<Y, String> {
        let Some(i) = self.next_content() else {
            return Ok(Y::Null);
        };
        let l = &self.lines[i];
        if l.indent < indent {
            return Ok(Y::Null);
        }
        let text = strip_comment(&l.raw);
        if text == "-" || text.starts_with("- ") {
            self.seq(l.indent)
        } else if split_key(&text).is_some() {
            self.map(l.indent)
        } else {
            self.i += 1;
            scalar(&text).map_err(|e| self.err(self.lines[i].no, e))
        }
    }

    fn block_scalar(&mut self, parent: usize, folded: bool, keep_last: bool) -> String {
        let mut body: Vec<&str> = Vec::new();
        let mut indent = None;
        while self.i < self.lines.len() {
            let l = &self.lines[self.i];
            let blank = l.raw.trim().is_empty();
            if !blank && l.indent <= parent {
                break;
            }
            if !blank && indent.is_none() {
                indent = Some(l.indent);
            }
            body.push(&l.raw);
            self.i += 1;
        }
        let cut = indent.unwrap_or(0);
        let mut lines: Vec<String> = body
            .iter()
            .map(|r| r.get(cut..).unwrap_or("").to_string())
            .collect();
        while lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        let mut text = if folded {
            lines.join(" ")
        } else {
            lines.join("\n")
        };
        if keep_last {
            text.push('\n');
        }
        text
    }

    fn value(&mut self, indent: usize, rest: &str, no: usize) -> Result<Y, String> {
        match rest {
            "|" | "|-" | ">" | ">-" => {
                self.i += 1;
                Ok(Y::Str(self.block_scalar(
                    indent,
                    rest.starts_with('>'),
                    !rest.ends_with('-'),
                )))
            }
            "" => {
                self.i += 1;
                match self.next_content() {
                    Some(j) if self.lines[j].indent > indent => self.node(indent + 1),
                    // A sequence may sit at its key's indentation.
                    Some(j)
                        if self.lines[j].indent == indent && {
                            let t = strip_comment(&self.lines[j].raw);
                            t == "-" || t.starts_with("- ")
                        } =>
                    {
                        self.seq(indent)
                    }
                    _ => Ok(Y::Null),
                }
            }
            _ => {
                self.i += 1;
                let text = self.continued(indent, rest);
                scalar(&text).map_err(|e| self.err(no, e))
            }
        }
    }

    /// A flow scalar that started on the line just read (`first`, after
    /// `key:` or `-` at `indent`), with the lines that continue it: to
    /// its closing quote, or (plain) every line indented deeper.
    fn continued(&mut self, indent: usize, first: &str) -> String {
        let mut text = first.to_string();
        if quote_open(&text) {
            while self.i < self.lines.len() && quote_open(&text) {
                let raw = self.lines[self.i].raw.clone();
                fold_into(&mut text, &raw);
                self.i += 1;
            }
            // A comment after the closing quote.
            text = strip_comment(&text);
        } else if !text.starts_with(['[', '{', '\'', '"']) {
            while let Some(j) = self.next_content() {
                if self.lines[j].indent <= indent {
                    break;
                }
                let line = strip_comment(&self.lines[j].raw);
                if split_key(&line).is_some() || line.starts_with("- ") {
                    // Structure, not text: left for the caller to refuse.
                    break;
                }
                fold_into(&mut text, &line);
                self.i += 1;
            }
        }
        text
    }

    fn map(&mut self, indent: usize) -> Result<Y, String> {
        let mut m: Vec<(String, Y)> = Vec::new();
        while let Some(i) = self.next_content() {
            let (no, ind) = (self.lines[i].no, self.lines[i].indent);
            if ind < indent {
                break;
            }
            if ind > indent {
                return Err(self.err(no, "unexpected indentation"));
            }
            let text = strip_comment(&self.lines[i].raw);
            if text.starts_with("- ") || text == "-" {
                break;
            }
            let (k, rest) = split_key(&text)
                .ok_or_else(|| self.err(no, format!("expected `key: value`, got {text:?}")))?;
            if m.iter().any(|(mk, _)| *mk == k) {
                return Err(self.err(no, format!("duplicate key {k:?}")));
            }
            let v = self.value(indent, &rest, no)?;
            m.push((k, v));
        }
        Ok(Y::Map(m))
    }

    fn seq(&mut self, indent: usize) -> Result<Y, String> {
        let mut v = Vec::new();
        while let Some(i) = self.next_content() {
            let (no, ind) = (self.lines[i].no, self.lines[i].indent);
            let text = strip_comment(&self.lines[i].raw);
            if ind != indent || !(text == "-" || text.starts_with("- ")) {
                if ind > indent {
                    return Err(self.err(no, "unexpected indentation"));
                }
                break;
            }
            let rest = text[1..].trim_start();
            if rest.is_empty() {
                self.i += 1;
                v.push(self.node(indent + 1)?);
            } else if split_key(rest).is_some() && !rest.starts_with('[') && !rest.starts_with('{')
            {
                // `- key: value ...`: a mapping whose first entry shares the
                // dash's line; its entries are indented like `key`.
                let raw = &self.lines[i].raw;
                let offset = raw.len() - raw[ind + 1..].trim_start().len();
                let l = &mut self.lines[i];
                l.raw = l.raw[offset..].to_string();
                l.indent = offset;
                v.push(self.map(offset)?);
            } else {
                let rest = rest.to_string();
                self.i += 1;
                let text = self.continued(indent, &rest);
                v.push(scalar(&text).map_err(|e| self.err(no, e))?);
            }
        }
        Ok(Y::Seq(v))
    }
}

/// Parses every document of a YAML file; empty documents are dropped.
fn parse_yaml(file: &str, text: &str) -> Result<Vec<Y>, String> {
    let mut docs = Vec::new();
    let mut chunk: Vec<Line> = Vec::new();
    let mut flush = |chunk: &mut Vec<Line>| -> Result<(), String> {
        let mut p = Parser {
            file,
            lines: std::mem::take(chunk),
            i: 0,
        };
        let y = p.node(0)?;
        if let Some(i) = p.next_content() {
            return Err(p.err(p.lines[i].no, "text after the end of the document"));
        }
        if y != Y::Null {
            docs.push(y);
        }
        Ok(())
    };
    for (n, raw) in text.lines().enumerate() {
        if raw.contains('\t') && !raw.trim_start().starts_with('#') {
            return Err(format!("{file}:{}: tab character", n + 1));
        }
        if raw.trim_end() == "---" {
            flush(&mut chunk)?;
            continue;
        }
        chunk.push(Line {
            no: n + 1,
            indent: raw.len() - raw.trim_start().len(),
            raw: raw.to_string(),
        });
    }
    flush(&mut chunk)?;
    Ok(docs)
}

#[test]
fn yaml_subset_parser() {
    let docs = parse_yaml(
        "t.yaml",
        "# c\na: 1\nb:\n  - x\n  - y: z\n    w: [\"p\", q]\nc: |\n  l1\n  # kept\n\n  l2\n---\n---\nd: {}\ne:\n- k: 'it''s' # c\n",
    )
    .unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].s(&["a"]), Some("1"));
    assert_eq!(docs[0].seq(&["b"])[0], Y::Str("x".into()));
    assert_eq!(docs[0].seq(&["b"])[1].strs(&["w"]), vec!["p", "q"]);
    assert_eq!(docs[0].s(&["c"]), Some("l1\n# kept\n\nl2\n"));
    assert_eq!(docs[1].get("d"), Some(&Y::Map(vec![])));
    assert_eq!(docs[1].seq(&["e"])[0].s(&["k"]), Some("it's"));
    // Long strings as kustomize writes them: plain and quoted, folded over
    // lines indented deeper than their key.
    let docs = parse_yaml(
        "t.yaml",
        "a: one two\n  three\nb: 'it''s\n  long'\nc:\n- \"x \\\n  y\" # c\n- p\n  q\nd: 1\n",
    )
    .unwrap();
    assert_eq!(docs[0].s(&["a"]), Some("one two three"));
    assert_eq!(docs[0].s(&["b"]), Some("it's long"));
    assert_eq!(docs[0].strs(&["c"]), ["x y", "p q"]);
    assert_eq!(docs[0].s(&["d"]), Some("1"));
    assert!(parse_yaml("t", "a: 1\n  b: 2\n").is_err());
    assert!(parse_yaml("t", "a:\n  b: 2\n   c: 3\n").is_err());
    assert!(parse_yaml("t", "a: &x 1\n").is_err());
    assert!(parse_yaml("t", "a: 1\na: 2\n").is_err());
}

// ---------------------------------------------------------------------------
// The sources and the renders.

struct Doc {
    /// The file (relative to deploy/kubernetes) or the render it came from.
    file: String,
    y: Y,
}

impl Doc {
    fn kind(&self) -> &str {
        self.y.s(&["kind"]).unwrap_or("")
    }
    fn name(&self) -> &str {
        self.y.s(&["metadata", "name"]).unwrap_or("")
    }
    fn ns(&self) -> &str {
        self.y.s(&["metadata", "namespace"]).unwrap_or("")
    }
    fn at(&self) -> String {
        format!("[{}] {}/{}", self.file, self.kind(), self.name())
    }
}

const DEPLOY: &str = "deploy/kubernetes";

/// The YAML files under `dir`, sorted; a symlinked directory is not
/// followed.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            yaml_files(&p, out);
        } else if meta.is_file()
            && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        {
            out.push(p);
        }
    }
}

/// Every document of every YAML source file under deploy/kubernetes, with
/// its file (relative to deploy/kubernetes).
fn source_docs() -> Vec<Doc> {
    let base = root().join(DEPLOY);
    let mut files = Vec::new();
    yaml_files(&base, &mut files);
    assert!(!files.is_empty(), "no YAML files under {DEPLOY}");
    let mut docs = Vec::new();
    let mut errors = Problems::default();
    for f in files {
        let rel = f.strip_prefix(&base).unwrap().display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        match parse_yaml(&rel, &text) {
            Ok(ys) => docs.extend(ys.into_iter().map(|y| Doc {
                file: rel.clone(),
                y,
            })),
            Err(e) => errors.push(format!("{DEPLOY}/{e}")),
        }
    }
    errors.finish("YAML that does not parse");
    docs
}

/// The one document of a source file.
fn source_doc(rel: &str) -> Y {
    let text = read(&format!("{DEPLOY}/{rel}"));
    let mut docs = parse_yaml(rel, &text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(docs.len(), 1, "{DEPLOY}/{rel}: one document expected");
    docs.remove(0)
}

/// The kubelet directory, from its one place (base/settings.yaml).
fn kubelet_dir() -> String {
    source_doc("base/settings.yaml")
        .s(&["data", "kubeletDir"])
        .expect("base/settings.yaml has no data.kubeletDir")
        .to_string()
}

/// Directories under deploy/kubernetes/`sub` that hold a kustomization.
fn kustomize_dirs(sub: &str) -> Vec<PathBuf> {
    let dir = root().join(DEPLOY).join(sub);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").is_file())
        .collect();
    out.sort();
    out
}

/// kubectl from PATH; a test that renders fails without it.
fn kubectl() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "kubectl is not installed: these tests render deploy/kubernetes with \
                 `kubectl kustomize` (kustomize v5); install kubectl and run them again"
            )
        })
}

/// `to` relative to the directory `from` (both absolute): kustomize takes
/// relative paths only.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (f, t): (Vec<Component>, Vec<Component>) =
        (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

/// What `kubectl kustomize dir` renders.
fn kustomize(dir: &Path) -> String {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kubectl's output is UTF-8")
}

/// One render: the base or an overlay, with some components.
struct Render {
    /// `overlays/plain + snapshots + monitoring`.
    name: String,
    components: Vec<String>,
    docs: Vec<Doc>,
}

impl Render {
    fn has(&self, component: &str) -> bool {
        self.components.iter().any(|c| c == component)
    }
    fn one(&self, kind: &str) -> &Doc {
        let found: Vec<&Doc> = self.docs.iter().filter(|d| d.kind() == kind).collect();
        assert_eq!(
            found.len(),
            1,
            "[{}]: expected exactly one {kind}, found {}",
            self.name,
            found.len()
        );
        found[0]
    }
    fn all<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Doc> {
        self.docs.iter().filter(move |d| d.kind() == kind)
    }
}

/// Every render, made once: the base and every overlay, each alone and
/// with every combination of the components (a temporary kustomization
/// naming the overlay and the components, as an operator's would).
fn renders() -> &'static [Render] {
    static RENDERS: OnceLock<Vec<Render>> = OnceLock::new();
    RENDERS.get_or_init(|| {
        let deploy = root().join(DEPLOY).canonicalize().unwrap();
        let mut targets = vec![deploy.join("base")];
        targets.extend(kustomize_dirs("overlays"));
        let components = kustomize_dirs("components");
        assert!(targets.len() > 1, "{DEPLOY}/overlays holds no overlay");
        assert!(!components.is_empty(), "{DEPLOY}/components holds no component");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("deploy-renders-{}", std::process::id()));
        let mut out = Vec::new();
        for t in &targets {
            let t = t.canonicalize().unwrap();
            for mask in 0..(1u32 << components.len()) {
                let comps: Vec<&PathBuf> = components
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, c)| c)
                    .collect();
                let names: Vec<String> = comps
                    .iter()
                    .map(|c| c.file_name().unwrap().to_str().unwrap().to_string())
                    .collect();
                let name = std::iter::once(t.strip_prefix(&deploy).unwrap().display().to_string())
                    .chain(names.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(" + ");
                let text = if comps.is_empty() {
                    kustomize(&t)
                } else {
                    let dir = tmp.join(format!("r{}", out.len()));
                    std::fs::create_dir_all(&dir).unwrap();
                    let dir = dir.canonicalize().unwrap();
                    let mut k = String::from(
                        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
                    );
                    let _ = writeln!(k, "  - {}", relative(&dir, &t).display());
                    k.push_str("components:\n");
                    for c in &comps {
                        let c = c.canonicalize().unwrap();
                        let _ = writeln!(k, "  - {}", relative(&dir, &c).display());
                    }
                    std::fs::write(dir.join("kustomization.yaml"), k).unwrap();
                    kustomize(&dir)
                };
                let docs = parse_yaml(&name, &text)
                    .unwrap_or_else(|e| panic!("the render does not parse: {e}"))
                    .into_iter()
                    .map(|y| Doc {
                        file: name.clone(),
                        y,
                    })
                    .collect();
                out.push(Render {
                    name,
                    components: names,
                    docs,
                });
            }
        }
        let _ = std::fs::remove_dir_all(&tmp);
        out
    })
}

fn pod_spec(ds: &Doc) -> &Y {
    ds.y.path(&["spec", "template", "spec"])
        .unwrap_or_else(|| panic!("{}: no spec.template.spec", ds.at()))
}

fn containers(ds: &Doc) -> &[Y] {
    pod_spec(ds).seq(&["containers"])
}

/// The repository of `repo[:tag][@digest]`.
fn image_repo(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

/// The tag of `repo[:tag][@digest]`, "" without one.
fn image_tag(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((_, tag)) if !tag.contains('/') => tag,
        _ => "",
    }
}

fn find_container<'a>(ds: &'a Doc, repo: &str) -> Option<&'a Y> {
    containers(ds)
        .iter()
        .find(|c| c.s(&["image"]).map(image_repo) == Some(repo))
}

fn container_by_image<'a>(ds: &'a Doc, repo: &str) -> &'a Y {
    find_container(ds, repo).unwrap_or_else(|| panic!("{}: no container runs {repo}", ds.at()))
}

fn driver_container(ds: &Doc) -> &Y {
    container_by_image(ds, DRIVER_IMAGE)
}

fn pod_volume<'a>(ds: &'a Doc, name: &str) -> &'a Y {
    pod_spec(ds)
        .seq(&["volumes"])
        .iter()
        .find(|v| v.s(&["name"]) == Some(name))
        .unwrap_or_else(|| panic!("{}: no pod volume {name:?}", ds.at()))
}

/// The mount of `c` whose mountPath is `path`, with its volume's host path.
fn mount_at<'a>(ds: &'a Doc, c: &'a Y, path: &str) -> Option<(&'a Y, Option<&'a str>)> {
    c.seq(&["volumeMounts"])
        .iter()
        .find(|m| m.s(&["mountPath"]).map(|p| p.trim_end_matches('/')) == Some(path))
        .map(|m| {
            let host = pod_volume(ds, m.s(&["name"]).unwrap()).s(&["hostPath", "path"]);
            (m, host)
        })
}

/// A socket address as a path: `unix:///p` and `/p` are the same socket.
fn socket_path(addr: &str) -> String {
    addr.strip_prefix("unix://").unwrap_or(addr).to_string()
}

/// `--flag=value` of a container's args, with `$(VAR)` expanded from the
/// container's literal env values (as the kubelet expands them).
fn flag(c: &Y, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    c.seq(&["args"])
        .iter()
        .filter_map(Y::str)
        .find_map(|a| a.strip_prefix(prefix.as_str()))
        .map(|v| expand(c, v))
}

/// A container's env var: its literal value, or `fieldRef:<path>`.
fn env(c: &Y, name: &str) -> Option<String> {
    c.seq(&["env"])
        .iter()
        .find(|e| e.s(&["name"]) == Some(name))
        .map(|e| {
            e.s(&["value"])
                .map(str::to_string)
                .or_else(|| {
                    e.s(&["valueFrom", "fieldRef", "fieldPath"])
                        .map(|f| format!("fieldRef:{f}"))
                })
                .unwrap_or_default()
        })
}

/// `s` with every `$(VAR)` whose env value is literal replaced by it.
fn expand(c: &Y, s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find(')').map(|e| start + e) else {
            break;
        };
        let var = &rest[start + 2..end];
        match env(c, var) {
            Some(v) if !v.starts_with("fieldRef:") => out.push_str(&v),
            _ => out.push_str(&rest[start..=end]),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn cname(c: &Y) -> &str {
    c.s(&["name"]).unwrap_or("?")
}

/// The port number a probe's `port` names in container `c` (a number, or
/// the name of one of its ports).
fn probe_port(c: &Y, probe: &str) -> Option<u16> {
    let port = c.s(&[probe, "httpGet", "port"])?;
    port.parse().ok().or_else(|| {
        c.seq(&["ports"])
            .iter()
            .find(|p| p.s(&["name"]) == Some(port))
            .and_then(|p| p.s(&["containerPort"]))
            .and_then(|p| p.parse().ok())
    })
}

/// The port of an `--http-endpoint=[host]:port` flag.
fn endpoint_port(c: &Y) -> Option<u16> {
    flag(c, "--http-endpoint")?.rsplit_once(':')?.1.parse().ok()
}

fn crate_version() -> String {
    read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_string())
        .expect("Cargo.toml has a version")
}

/// The driver configuration of the ConfigMap, through the driver's own
/// parser, with the file name the DaemonSet passes to --config.
fn configmap_config(r: &Render, ds: &Doc) -> (Config, String) {
    let driver = driver_container(ds);
    let args = driver.strs(&["args"]);
    let path = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("{}: the driver has no `--config FILE` args", ds.at()))
        .clone();
    let (dir, key) = path.rsplit_once('/').unwrap();
    let mount = driver
        .seq(&["volumeMounts"])
        .iter()
        .find(|m| m.s(&["mountPath"]) == Some(dir))
        .unwrap_or_else(|| panic!("{}: nothing is mounted at {dir} (--config {path})", ds.at()));
    let vol = pod_volume(ds, mount.s(&["name"]).unwrap());
    let cm_name = vol
        .s(&["configMap", "name"])
        .unwrap_or_else(|| panic!("{}: {dir} is not a ConfigMap volume", ds.at()));
    let cm = r
        .all("ConfigMap")
        .find(|d| d.name() == cm_name && d.ns() == ds.ns())
        .unwrap_or_else(|| {
            panic!(
                "[{}]: ConfigMap {}/{cm_name} is not rendered",
                r.name,
                ds.ns()
            )
        });
    let text =
        cm.y.s(&["data", key])
            .unwrap_or_else(|| panic!("{}: no data key {key:?}", cm.at()));
    let cfg = Config::parse(text)
        .unwrap_or_else(|e| panic!("{}: the driver refuses {key}: {e}", cm.at()));
    (cfg, path)
}

// ---------------------------------------------------------------------------
// The checks.

#[test]
fn sources_parse_and_every_file_is_used() {
    let docs = source_docs();
    let mut p = Problems::default();
    let deploy = root().join(DEPLOY);
    // Every file of the base, an overlay or a component is something its
    // kustomization names (a resource or a patch), kind's cluster config,
    // or documentation; and what a kustomization names exists.
    let mut dirs = vec![deploy.join("base")];
    dirs.extend(kustomize_dirs("overlays"));
    dirs.extend(kustomize_dirs("components"));
    for dir in &dirs {
        let rel = dir.strip_prefix(&deploy).unwrap().display().to_string();
        let k = source_doc(&format!("{rel}/kustomization.yaml"));
        let want_kind = if rel.starts_with("components/") {
            "Component"
        } else {
            "Kustomization"
        };
        p.check(k.s(&["kind"]) == Some(want_kind), || {
            format!("{DEPLOY}/{rel}/kustomization.yaml must be a {want_kind}")
        });
        let mut named: BTreeSet<String> = k.strs(&["resources"]).into_iter().collect();
        named.extend(
            k.seq(&["patches"])
                .iter()
                .filter_map(|x| x.s(&["path"]).map(str::to_string)),
        );
        for n in &named {
            p.check(dir.join(n).exists(), || {
                format!("{DEPLOY}/{rel}/kustomization.yaml names {n}, which does not exist")
            });
        }
        for e in std::fs::read_dir(dir).unwrap() {
            let f = e.unwrap().file_name().to_str().unwrap().to_string();
            let ok = f == "kustomization.yaml"
                || f == "kind-config.yaml"
                || f.ends_with(".md")
                || f.ends_with(".json")
                || named.contains(&f);
            p.check(ok, || {
                format!(
                    "{DEPLOY}/{rel}/{f} is named by no kustomization (examples go to examples/)"
                )
            });
        }
        // An overlay stands on the base, a sibling: never inside it.
        if rel.starts_with("overlays/") {
            p.check(named.contains("../../base"), || {
                format!("{DEPLOY}/{rel}: an overlay's resources must name ../../base")
            });
        }
    }
    // Only these directories hold YAML; examples/ is not installed.
    for d in &docs {
        let top = d.file.split('/').next().unwrap_or("");
        p.check(
            ["base", "overlays", "components", "examples"].contains(&top),
            || {
                format!(
                    "{DEPLOY}/{}: YAML outside base/, overlays/, components/ and examples/",
                    d.file
                )
            },
        );
        if !["Kustomization", "Component", "Cluster"].contains(&d.kind()) {
            p.check(
                d.y.s(&["apiVersion"]).is_some() && !d.kind().is_empty() && !d.name().is_empty(),
                || {
                    format!(
                        "{}: a document needs apiVersion, kind and metadata.name",
                        d.file
                    )
                },
            );
        }
    }
    p.finish("sources");
}

#[test]
fn renders_hold_what_their_components_bring_and_nothing_needing_crds_else() {
    let mut p = Problems::default();
    for r in renders() {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &r.docs {
            *kinds.entry(d.kind()).or_default() += 1;
        }
        println!(
            "{}: {} objects ({})",
            r.name,
            r.docs.len(),
            kinds
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for d in &r.docs {
            // The base and the overlays install on a cluster without the
            // snapshot, CSI-Addons or Prometheus CRDs.
            let from_component = COMPONENT_KINDS
                .iter()
                .any(|(c, ks)| r.has(c) && ks.contains(&d.kind()));
            p.check(!CRD_KINDS.contains(&d.kind()) || from_component, || {
                format!(
                    "{}: needs another project's CRD, and no component of this render brings it",
                    d.at()
                )
            });
            p.check(
                d.y.s(&[
                    "metadata",
                    "annotations",
                    "config.kubernetes.io/local-config",
                ])
                .is_none(),
                || format!("{}: a local-config object must not be rendered", d.at()),
            );
        }
        for (c, ks) in COMPONENT_KINDS {
            for k in *ks {
                p.check(!r.has(c) || kinds.contains_key(k), || {
                    format!("[{}]: the {c} component renders no {k}", r.name)
                });
            }
        }
        p.check(kinds.get("DaemonSet") == Some(&1), || {
            format!("[{}]: one DaemonSet expected", r.name)
        });
    }
    p.finish("renders");
}

#[test]
fn csidriver_storageclass_and_snapshotclass_name_the_driver() {
    let defaults = Config::load(&root().join("config/defaults.toml")).unwrap();
    let mut p = Problems::default();
    for r in renders() {
        let ds = r.one("DaemonSet");
        let (cfg, _) = configmap_config(r, ds);
        p.check(cfg.driver_name == defaults.driver_name, || {
            format!(
                "[{}]: the ConfigMap's driver_name {:?} differs from config/defaults.toml's {:?}",
                r.name, cfg.driver_name, defaults.driver_name
            )
        });
        let d = r.one("CSIDriver");
        p.check(d.name() == cfg.driver_name, || {
            format!(
                "{}: the CSIDriver must be named after driver_name {:?}",
                d.at(),
                cfg.driver_name
            )
        });
        for (key, want) in [("podInfoOnMount", "false"), ("fsGroupPolicy", "File")] {
            let got = d.y.s(&["spec", key]);
            p.check(got == Some(want), || {
                format!("{}: spec.{key} must be {want}, is {got:?}", d.at())
            });
        }
        let modes = d.y.strs(&["spec", "volumeLifecycleModes"]);
        p.check(modes == ["Persistent"], || {
            format!(
                "{}: spec.volumeLifecycleModes must be [Persistent], is {modes:?}",
                d.at()
            )
        });
        let sc = r.one("StorageClass");
        p.check(sc.y.s(&["provisioner"]) == Some(&cfg.driver_name), || {
            format!("{}: provisioner must be {:?}", sc.at(), cfg.driver_name)
        });
        p.check(
            sc.y.s(&["volumeBindingMode"]) == Some("WaitForFirstConsumer"),
            || format!("{}: volumeBindingMode must be WaitForFirstConsumer (the volume lives on the pod's node)", sc.at()),
        );
        storage_class_options(sc, &mut p);
        for vsc in r.all("VolumeSnapshotClass") {
            p.check(vsc.y.s(&["driver"]) == Some(&cfg.driver_name), || {
                format!("{}: driver must be {:?}", vsc.at(), cfg.driver_name)
            });
        }
    }
    // The examples' StorageClasses pass the driver's checks too.
    for sc in source_docs()
        .iter()
        .filter(|d| d.file.starts_with("examples/") && d.kind() == "StorageClass")
    {
        storage_class_options(sc, &mut p);
    }
    // The examples name classes a render installs.
    let all: Vec<&Doc> = renders().iter().flat_map(|r| &r.docs).collect();
    for d in source_docs()
        .iter()
        .filter(|d| d.file.starts_with("examples/"))
    {
        for (field, kind) in [
            ("storageClassName", "StorageClass"),
            ("volumeSnapshotClassName", "VolumeSnapshotClass"),
        ] {
            if let Some(name) = d.y.s(&["spec", field]) {
                p.check(
                    all.iter().any(|s| s.kind() == kind && s.name() == name),
                    || format!("{}: {kind} {name:?} is installed by no render", d.at()),
                );
            }
        }
    }
    p.finish("CSIDriver, StorageClass, VolumeSnapshotClass");
}

/// A StorageClass's parameters are ones the driver takes (its own keys,
/// or the sidecars' `csi.storage.k8s.io/` ones), and its `mkfsOptions` and
/// `mountOptions` are on the driver's allow-lists for its fstype.
fn storage_class_options(sc: &Doc, p: &mut Problems) {
    let fs =
        sc.y.s(&["parameters", "csi.storage.k8s.io/fstype"])
            .unwrap_or("ext4");
    if let Some(Y::Map(params)) = sc.y.get("parameters") {
        for (k, v) in params {
            // The driver's own keys: the tagged ones, `encrypted`, and the
            // I/O limits (kept as mutable parameters).
            let known = thinpool_csi::grpc::validate::PARAMETERS
                .iter()
                .any(|(key, _)| key == k)
                || k == thinpool_csi::grpc::validate::ENCRYPTED
                || thinpool_csi::node::cgroup::KEYS
                    .iter()
                    .any(|(key, _)| key == k);
            p.check(known || k.starts_with("csi.storage.k8s.io/"), || {
                format!("{}: the driver refuses the parameter {k:?}", sc.at())
            });
            if k == thinpool_csi::grpc::validate::MKFS_OPTIONS {
                let text = match v {
                    Y::Str(t) => t.as_str(),
                    _ => "",
                };
                if let Err(why) = thinpool_csi::fs_options::mkfs_options(fs, text) {
                    p.push(format!("{}: mkfsOptions: {why}", sc.at()));
                }
            }
        }
    }
    for w in sc.y.strs(&["mountOptions"]) {
        if let Err(why) = thinpool_csi::fs_options::mount_word(fs, &w) {
            p.push(format!("{}: mountOptions: {why}", sc.at()));
        }
    }
}

#[test]
fn node_daemonset_in_every_render() {
    let kubelet = kubelet_dir();
    let version = crate_version();
    let mut p = Problems::default();
    for r in renders() {
        node_daemonset(r, &kubelet, &version, &mut p);
    }
    p.finish("node DaemonSet");
}

/// One render's node DaemonSet, as every rule of `node_daemonset` reads it.
struct NodeDs<'a> {
    r: &'a Render,
    ds: &'a Doc,
    /// The driver's configuration, from the ConfigMap.
    cfg: Config,
    /// The file the driver's `--config` names.
    config_path: String,
    /// `[render] DaemonSet/name`: where a problem is.
    at: String,
    kubelet: &'a str,
    driver: &'a Y,
}

impl NodeDs<'_> {
    /// The CSI socket, from the driver container's CSI_ENDPOINT.
    fn csi_sock(&self) -> PathBuf {
        let at = &self.at;
        let csi_endpoint = env(self.driver, "CSI_ENDPOINT").unwrap_or_default();
        parse_endpoint(&csi_endpoint)
            .unwrap_or_else(|e| panic!("{at}: CSI_ENDPOINT {csi_endpoint:?}: {e}"))
    }
    /// The CSI-Addons socket, from the config's csi_addons_endpoint.
    fn addons_sock(&self) -> PathBuf {
        parse_endpoint(&self.cfg.csi_addons_endpoint).unwrap_or_else(|e| {
            panic!(
                "csi_addons_endpoint {:?}: {e}",
                self.cfg.csi_addons_endpoint
            )
        })
    }
    /// The kubelet's plugin directory for this driver: the host side of
    /// every container's socket directory.
    fn plugin_dir(&self) -> String {
        format!("{}/plugins/{}", self.kubelet, self.cfg.driver_name)
    }
}

/// Every rule of one render's node DaemonSet, in turn.
fn node_daemonset(r: &Render, kubelet: &str, version: &str, p: &mut Problems) {
    let ds = r.one("DaemonSet");
    let (cfg, config_path) = configmap_config(r, ds);
    let nds = NodeDs {
        r,
        ds,
        cfg,
        config_path,
        at: ds.at(),
        kubelet,
        driver: driver_container(ds),
    };
    image_rules(&nds, version, p);
    host_path_rules(&nds, p);
    state_dir_rules(&nds, p);
    driver_env_rules(&nds, p);
    socket_dir_rules(&nds, p);
    registrar_rules(&nds, p);
    health_rules(&nds, p);
    per_node_rules(&nds, p);
    scheduling_rules(&nds, p);
}

/// Images: the driver and the sidecars of the base and of this render's
/// components, nothing else, all pinned; the driver's is the crate
/// version, privileged, and the pod's default container.
fn image_rules(nds: &NodeDs, version: &str, p: &mut Problems) {
    let (r, ds, at) = (nds.r, nds.ds, &nds.at);
    let images: Vec<&str> = containers(ds)
        .iter()
        .map(|c| c.s(&["image"]).unwrap_or(""))
        .collect();
    let repos: BTreeSet<&str> = images.iter().map(|i| image_repo(i)).collect();
    let want: BTreeSet<&str> = SIDECARS
        .iter()
        .filter(|s| s.component.is_none_or(|c| r.has(c)))
        .map(|s| s.repo)
        .chain([DRIVER_IMAGE])
        .collect();
    p.check(repos == want && images.len() == want.len(), || {
        format!("{at}: containers must run exactly {want:?}, run {images:?}")
    });
    for img in &images {
        let tag = image_tag(img);
        p.check(
            image_repo(img) == DRIVER_IMAGE
                || tag.starts_with('v') && tag[1..].split('.').count() == 3,
            || format!("{at}: image {img:?} must be pinned to a vX.Y.Z release tag"),
        );
        p.check(!NEVER.contains(&image_repo(img)), || {
            format!("{at}: {img} cannot work per node (socket-only, README.md)")
        });
    }
    // Pinned by digest: every image but the driver's own (its digest
    // exists only once an operator pushes it) and UNPINNED.
    for img in images
        .iter()
        .filter(|i| image_repo(i) != DRIVER_IMAGE && !UNPINNED.contains(&image_repo(i)))
    {
        let digest = img.split_once("@sha256:").map(|(_, d)| d);
        p.check(
            digest.is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())),
            || format!("{at}: image {img:?} must be pinned by digest (@sha256:<64 hex>)"),
        );
    }
    let driver_image = format!("{DRIVER_IMAGE}:{version}");
    p.check(images.contains(&driver_image.as_str()), || {
        format!("{at}: the driver image must be {driver_image} (the crate version)")
    });
    p.check(
        nds.driver.s(&["securityContext", "privileged"]) == Some("true"),
        || format!("{at}: the driver container must be privileged"),
    );
    p.check(
        ds.y.s(&[
            "spec",
            "template",
            "metadata",
            "annotations",
            "kubectl.kubernetes.io/default-container",
        ]) == Some("thinpool-csi"),
        || format!("{at}: kubectl logs/exec must default to the driver container (kubectl.kubernetes.io/default-container)"),
    );
}

/// Host paths the driver needs, and how they are mounted (the host's
/// cgroup hierarchy among them, where cgroup_root says, for I/O limits).
/// /dev is never Bidirectional: LVM's nodes are files in the host's
/// devtmpfs, and what the runtime mounts under the container's /dev must
/// not reach the host; only the privileged driver uses Bidirectional.
fn host_path_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, driver, at, kubelet) = (nds.ds, nds.driver, &nds.at, nds.kubelet);
    for (path, propagation, read_only) in [
        (kubelet, Some("Bidirectional"), false),
        ("/dev", Some("HostToContainer"), false),
        ("/sys", None, false),
        ("/lib/modules", None, true),
        ("/run/lvm", None, false),
        ("/run/lock/lvm", None, false),
        ("/etc/lvm", None, false),
    ] {
        match mount_at(ds, driver, path) {
            None => p.push(format!("{at}: the driver does not mount {path}")),
            Some((m, host)) => {
                p.check(host == Some(path), || {
                    format!("{at}: {path} in the driver must be the host's {path}, is {host:?}")
                });
                p.check(m.s(&["mountPropagation"]) == propagation, || {
                    format!(
                        "{at}: {path} needs mountPropagation {propagation:?}, has {:?}",
                        m.s(&["mountPropagation"])
                    )
                });
                let ro = m.s(&["readOnly"]) == Some("true");
                p.check(ro == read_only, || {
                    format!("{at}: {path} readOnly must be {read_only}")
                });
            }
        }
    }
    let cgroup_root = nds.cfg.cgroup_root.display().to_string();
    match mount_at(ds, driver, &cgroup_root) {
        None => p.push(format!(
            "{at}: the driver does not mount the host's /sys/fs/cgroup at cgroup_root {cgroup_root}"
        )),
        Some((_, host)) => p.check(host == Some("/sys/fs/cgroup"), || {
            format!(
                "{at}: cgroup_root {cgroup_root} must be the host's /sys/fs/cgroup, is {host:?}"
            )
        }),
    }
    for c in containers(ds) {
        for m in c.seq(&["volumeMounts"]) {
            let bidi = m.s(&["mountPropagation"]) == Some("Bidirectional");
            if !bidi {
                continue;
            }
            p.check(std::ptr::eq(c, driver), || {
                format!(
                    "{at}: only the privileged driver may use Bidirectional ({})",
                    cname(c)
                )
            });
            let host = pod_volume(ds, m.s(&["name"]).unwrap_or("")).s(&["hostPath", "path"]);
            let dev = |x: Option<&str>| x.is_some_and(|x| x == "/dev" || x.starts_with("/dev/"));
            p.check(!dev(m.s(&["mountPath"])) && !dev(host), || {
                format!("{at}: {} mounts /dev Bidirectional", cname(c))
            });
        }
    }
}

/// state_dir is on the host, at the same path (it must survive restarts);
/// allowed_roots is the kubelet directory; udev is off (no udevd runs in
/// the container).
fn state_dir_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, cfg, at, kubelet) = (nds.ds, &nds.cfg, &nds.at, nds.kubelet);
    let state_mount = nds
        .driver
        .seq(&["volumeMounts"])
        .iter()
        .filter_map(|m| {
            let mp = m.s(&["mountPath"])?;
            cfg.state_dir.starts_with(mp).then_some((m, mp))
        })
        .max_by_key(|(_, mp)| mp.len());
    match state_mount {
        None => p.push(format!(
            "{at}: state_dir {} is not on a mounted volume (it must survive restarts)",
            cfg.state_dir.display()
        )),
        Some((m, mp)) => {
            let host = pod_volume(ds, m.s(&["name"]).unwrap()).s(&["hostPath", "path"]);
            p.check(host == Some(mp) && mp != "/" && mp != kubelet, || {
                format!(
                    "{at}: state_dir {} must be on its own hostPath at the same path, is {mp} from {host:?}",
                    cfg.state_dir.display()
                )
            });
        }
    }
    p.check(cfg.allowed_roots == [PathBuf::from(kubelet)], || {
        format!(
            "{at}: allowed_roots must be the kubelet directory [{kubelet:?}] (base/settings.yaml), is {:?}",
            cfg.allowed_roots
        )
    });
    p.check(cfg.udev == UdevMode::Off, || {
        format!("{at}: the ConfigMap must say udev = \"off\": no udevd runs in the container")
    });
}

/// The driver's arguments and environment: its node id from
/// spec.nodeName, CSI_ENDPOINT the config's endpoint, and what tpcsi in
/// the container needs to find the CSI-Addons socket and the metrics
/// endpoint; an absolute --config.
fn driver_env_rules(nds: &NodeDs, p: &mut Problems) {
    let (driver, cfg, at) = (nds.driver, &nds.cfg, &nds.at);
    let args = driver.strs(&["args"]);
    p.check(
        args.windows(2)
            .any(|w| w[0] == "--node-id" && w[1] == "$(NODE_NAME)"),
        || format!("{at}: the driver needs `--node-id $(NODE_NAME)`, has {args:?}"),
    );
    p.check(
        env(driver, "NODE_NAME") == Some("fieldRef:spec.nodeName".into()),
        || format!("{at}: the driver needs env NODE_NAME from spec.nodeName"),
    );
    let csi_endpoint = env(driver, "CSI_ENDPOINT").unwrap_or_default();
    let csi_sock = nds.csi_sock();
    p.check(
        parse_endpoint(&cfg.endpoint).ok().as_deref() == Some(csi_sock.as_path()),
        || {
            format!(
                "{at}: the ConfigMap's endpoint {:?} and CSI_ENDPOINT {csi_endpoint:?} disagree",
                cfg.endpoint
            )
        },
    );
    // tpcsi in the container (the readiness probe, `kubectl exec ... tpcsi
    // probe`) finds the CSI-Addons socket through CSI_ADDONS_ENDPOINT.
    let tpcsi_addons = env(driver, "CSI_ADDONS_ENDPOINT").unwrap_or_default();
    p.check(
        socket_path(&tpcsi_addons) == socket_path(&cfg.csi_addons_endpoint),
        || {
            format!(
                "{at}: the driver container needs CSI_ADDONS_ENDPOINT={} (csi_addons_endpoint), has {tpcsi_addons:?}",
                cfg.csi_addons_endpoint
            )
        },
    );
    // ... and the metrics endpoint (`tpcsi capacity`) through
    // METRICS_ADDRESS: the config's port, on loopback.
    let tpcsi_metrics = env(driver, "METRICS_ADDRESS").unwrap_or_default();
    let port = |a: &str| a.rsplit_once(':').map(|(_, p)| p.to_string());
    p.check(
        !cfg.metrics_address.is_empty()
            && tpcsi_metrics.starts_with("127.0.0.1:")
            && port(&tpcsi_metrics) == port(&cfg.metrics_address),
        || {
            format!(
                "{at}: the driver container needs METRICS_ADDRESS=127.0.0.1:<port of metrics_address {:?}>, has {tpcsi_metrics:?}",
                cfg.metrics_address
            )
        },
    );
    let config_path = &nds.config_path;
    p.check(config_path.starts_with('/'), || {
        format!("{at}: --config {config_path} must be absolute")
    });
}

/// The socket directory: the kubelet's plugin dir for this driver, the
/// same for every container (each sidecar's address flag in it), with the
/// CSI-Addons socket in it too; every container's own rules; container
/// ports unique in the pod (one network namespace).
fn socket_dir_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, at) = (nds.ds, &nds.at);
    let csi_sock = nds.csi_sock();
    let addons_sock = nds.addons_sock();
    let sock_dir = csi_sock.parent().unwrap().to_str().unwrap().to_string();
    let plugin_dir = nds.plugin_dir();
    for c in containers(ds) {
        match mount_at(ds, c, &sock_dir) {
            None => p.push(format!(
                "{at}: {} does not mount the socket directory {sock_dir}",
                cname(c)
            )),
            Some((_, host)) => p.check(host == Some(plugin_dir.as_str()), || {
                format!(
                    "{at}: {sock_dir} of {} must be the host's {plugin_dir}, is {host:?}",
                    cname(c)
                )
            }),
        }
        if !std::ptr::eq(c, nds.driver) {
            let want = if image_repo(c.s(&["image"]).unwrap_or("")) == CSI_ADDONS {
                ("--csi-addons-address", nds.cfg.csi_addons_endpoint.clone())
            } else {
                ("--csi-address", csi_sock.display().to_string())
            };
            let got = flag(c, want.0);
            p.check(
                got.as_deref().map(socket_path) == Some(socket_path(&want.1)),
                || {
                    format!(
                        "{at}: {} needs {}={}, has {got:?}",
                        cname(c),
                        want.0,
                        want.1
                    )
                },
            );
        }
        container_rules(nds, c, p);
    }
    p.check(addons_sock.parent() == csi_sock.parent(), || {
        format!(
            "csi_addons_endpoint {} must be in the shared socket directory {sock_dir}",
            addons_sock.display()
        )
    });
    let mut ports = BTreeMap::new();
    for c in containers(ds) {
        for port in c.seq(&["ports"]) {
            let n = port.s(&["containerPort"]).unwrap_or("");
            if let Some(other) = ports.insert(n.to_string(), cname(c)) {
                p.push(format!(
                    "{at}: port {n} is claimed by {other} and {}",
                    cname(c)
                ));
            }
        }
    }
}

/// Each container on its own: every $(VAR) in its args is defined in its
/// env, every mount has a volume, and it has its sizes
/// (base/resources.yaml, or next to a component's container).
fn container_rules(nds: &NodeDs, c: &Y, p: &mut Problems) {
    let (ds, at) = (nds.ds, &nds.at);
    for a in c.strs(&["args"]) {
        let mut rest = a.as_str();
        while let Some(start) = rest.find("$(") {
            let end = rest[start..]
                .find(')')
                .map(|e| start + e)
                .unwrap_or(rest.len());
            let var = &rest[start + 2..end];
            p.check(env(c, var).is_some(), || {
                format!(
                    "{at}: {} uses $({var}) without defining it in env",
                    cname(c)
                )
            });
            rest = &rest[end..];
        }
    }
    for m in c.seq(&["volumeMounts"]) {
        let n = m.s(&["name"]).unwrap_or("");
        p.check(
            pod_spec(ds)
                .seq(&["volumes"])
                .iter()
                .any(|v| v.s(&["name"]) == Some(n)),
            || format!("{at}: {} mounts undefined volume {n:?}", cname(c)),
        );
    }
    for (path, what) in [
        (&["resources", "requests", "cpu"][..], "a CPU request"),
        (&["resources", "requests", "memory"][..], "a memory request"),
        (&["resources", "limits", "memory"][..], "a memory limit"),
    ] {
        p.check(c.s(path).is_some(), || {
            format!("{at}: {} has no {what}", cname(c))
        });
    }
}

/// node-driver-registrar tells the kubelet the host path of the socket,
/// and mounts the kubelet's plugins_registry at /registration.
fn registrar_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, at, kubelet) = (nds.ds, &nds.at, nds.kubelet);
    let plugin_dir = nds.plugin_dir();
    let reg = container_by_image(ds, REGISTRAR);
    let want_reg = format!(
        "{plugin_dir}/{}",
        nds.csi_sock().file_name().unwrap().to_str().unwrap()
    );
    let got_reg = flag(reg, "--kubelet-registration-path");
    p.check(got_reg.as_deref() == Some(want_reg.as_str()), || {
        format!("{at}: node-driver-registrar needs --kubelet-registration-path={want_reg}, has {got_reg:?}")
    });
    match mount_at(ds, reg, "/registration") {
        Some((_, host)) => p.check(
            host == Some(format!("{kubelet}/plugins_registry").as_str()),
            || format!("{at}: /registration must be the host's {kubelet}/plugins_registry, is {host:?}"),
        ),
        None => p.push(format!("{at}: node-driver-registrar does not mount /registration")),
    }
}

/// Health. The liveness-probe sidecar serves the driver's liveness (it
/// calls Probe) on a port of its own, not the metrics port; the registrar
/// serves its own /healthz; readiness is `tpcsi probe`.
fn health_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, driver, at) = (nds.ds, nds.driver, &nds.at);
    let metrics_port: Option<u16> = nds
        .cfg
        .metrics_address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok());
    let live = container_by_image(ds, LIVENESS);
    let live_port = endpoint_port(live);
    p.check(live_port.is_some() && flag(live, "--health-port").is_none(), || {
        format!("{at}: livenessprobe needs --http-endpoint=:PORT (not --health-port, whose default is 9808)")
    });
    p.check(live_port.is_some() && live_port != metrics_port, || {
        format!("{at}: livenessprobe's port {live_port:?} collides with the driver's metrics ({metrics_port:?})")
    });
    for probe in ["livenessProbe", "startupProbe"] {
        let port = probe_port(driver, probe);
        p.check(port.is_some() && port == live_port, || {
            format!(
                "{at}: the driver's {probe} must GET the livenessprobe's /healthz (port {live_port:?}), gets {port:?}"
            )
        });
    }
    let ready = driver.strs(&["readinessProbe", "exec", "command"]);
    p.check(
        ready
            .first()
            .is_some_and(|c| c.rsplit('/').next() == Some("tpcsi"))
            && ready.iter().any(|a| a == "probe"),
        || format!("{at}: the driver's readinessProbe must exec `tpcsi probe`, is {ready:?}"),
    );
    // One device class down must not make the pod unready while the
    // default one serves (src/bin/tpcsi/probe.rs says why).
    p.check(
        ready
            .iter()
            .position(|a| a == "probe")
            .is_some_and(|at| ready[at..].iter().any(|a| a == "--tolerate-other-classes")),
        || format!("{at}: the driver's readinessProbe must pass --tolerate-other-classes, is {ready:?}"),
    );
    let reg = container_by_image(ds, REGISTRAR);
    let reg_port = endpoint_port(reg);
    let reg_probe = probe_port(reg, "livenessProbe");
    p.check(reg_port.is_some() && reg_probe == reg_port, || {
        format!(
            "{at}: node-driver-registrar needs --http-endpoint=:PORT and a livenessProbe on it, has {reg_port:?} and {reg_probe:?}"
        )
    });
}

/// Per-node mode: the flags and NODE_NAME on every sidecar that has one;
/// distributed provisioning with capacity tracking; no per-node sidecar
/// elects one leader for the cluster; csi-addons has the driver's node
/// id and its staging path under the kubelet directory.
fn per_node_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, at, kubelet) = (nds.ds, &nds.at, nds.kubelet);
    for s in SIDECARS.iter().filter(|s| !s.per_node.is_empty()) {
        let Some(c) = find_container(ds, s.repo) else {
            continue;
        };
        for (f, v) in s.per_node {
            let got = flag(c, f);
            p.check(got.as_deref() == Some(*v), || {
                format!(
                    "{at}: {} needs {f}={v} (per-node mode), has {got:?}",
                    cname(c)
                )
            });
        }
        p.check(
            env(c, "NODE_NAME") == Some("fieldRef:spec.nodeName".into()),
            || {
                format!(
                    "{at}: {} needs env NODE_NAME from spec.nodeName (per-node mode)",
                    cname(c)
                )
            },
        );
    }
    provisioner_rules(nds, p);
    for c in containers(ds) {
        let repo = image_repo(c.s(&["image"]).unwrap_or(""));
        if repo == CSI_ADDONS || repo == DRIVER_IMAGE {
            continue;
        }
        let elects = c
            .strs(&["args"])
            .iter()
            .any(|a| a == "--leader-election" || a == "--leader-election=true");
        p.check(!elects, || {
            format!(
                "{at}: {} must not use leader election: it serves its node only",
                cname(c)
            )
        });
    }
    if let Some(addons) = find_container(ds, CSI_ADDONS) {
        p.check(
            addons.strs(&["args"]).iter().any(|a| a == "--node-id=$(NODE_NAME)")
                && env(addons, "NODE_NAME") == Some("fieldRef:spec.nodeName".into()),
            || format!("{at}: csi-addons needs --node-id=$(NODE_NAME) from spec.nodeName, the driver's node id"),
        );
        let staging = flag(addons, "--stagingpath").unwrap_or_default();
        p.check(
            staging == format!("{kubelet}/plugins/kubernetes.io/csi/"),
            || format!("{at}: csi-addons --stagingpath {staging:?} must be {kubelet}/plugins/kubernetes.io/csi/"),
        );
        for f in ["--controller-port", "--pod", "--namespace", "--pod-uid"] {
            p.check(flag(addons, f).is_some(), || {
                format!("{at}: csi-addons needs {f} (the CSI-Addons controller connects to it)")
            });
        }
    }
}

/// Distributed provisioning with capacity tracking: csi-provisioner's
/// flags, and the env its capacity owner reference needs.
fn provisioner_rules(nds: &NodeDs, p: &mut Problems) {
    let at = &nds.at;
    let prov = container_by_image(nds.ds, PROVISIONER);
    for (f, v) in [
        ("--enable-capacity", Some("true")),
        // The pod owns its node's CSIStorageCapacity objects, so they go
        // with it (base/node.yaml says why).
        ("--capacity-ownerref-level", Some("0")),
        ("--strict-topology", Some("true")),
    ] {
        let got = flag(prov, f);
        p.check(
            got.is_some() && (v.is_none() || got.as_deref() == v),
            || {
                format!(
                    "{at}: csi-provisioner needs {f}{}",
                    v.map(|v| format!("={v}")).unwrap_or_default()
                )
            },
        );
    }
    for (var, field) in [
        ("NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        p.check(env(prov, var) == Some(format!("fieldRef:{field}")), || {
            format!("{at}: csi-provisioner needs env {var} from {field}")
        });
    }
}

/// Operator settings: a priority class that is rendered (or a system
/// one), every taint tolerated, and a node affinity that the maintenance
/// label turns off in every term.
fn scheduling_rules(nds: &NodeDs, p: &mut Problems) {
    let (r, at) = (nds.r, &nds.at);
    let spec = pod_spec(nds.ds);
    let prio = spec.s(&["priorityClassName"]).unwrap_or("");
    p.check(
        prio.starts_with("system-") || r.all("PriorityClass").any(|d| d.name() == prio),
        || format!("{at}: priorityClassName {prio:?} is neither rendered nor a system class"),
    );
    p.check(
        spec.seq(&["tolerations"])
            .iter()
            .any(|t| t.s(&["operator"]) == Some("Exists") && t.get("key").is_none()),
        || format!("{at}: the plugin must tolerate every taint (it unmounts the volumes of pods on tainted nodes)"),
    );
    let terms = spec.seq(&[
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    ]);
    p.check(
        !terms.is_empty()
            && terms.iter().all(|t| {
                t.seq(&["matchExpressions"]).iter().any(|e| {
                    e.s(&["key"]) == Some(MAINTENANCE_LABEL)
                        && e.s(&["operator"]) == Some("DoesNotExist")
                })
            }),
        || format!("{at}: every node affinity term must exclude nodes labelled {MAINTENANCE_LABEL} (the maintenance recipe)"),
    );
}

/// (namespace, name) of a ServiceAccount.
type ServiceAccountKey = (String, String);
/// (apiGroup, resource, verb, namespace of a RoleBinding or "" for cluster-wide).
type Grant = (String, String, String, String);

#[test]
fn service_accounts_and_rbac_in_every_render() {
    let mut p = Problems::default();
    for r in renders() {
        rbac(r, &mut p);
    }
    p.finish("ServiceAccounts and RBAC");
}

/// The rules each ServiceAccount of a render is granted.
fn grants(r: &Render, p: &mut Problems) -> BTreeMap<ServiceAccountKey, BTreeSet<Grant>> {
    let docs = &r.docs;
    let sas: BTreeSet<(&str, &str)> = r
        .all("ServiceAccount")
        .map(|d| (d.ns(), d.name()))
        .collect();
    let roles: BTreeSet<(&str, &str, &str)> = docs
        .iter()
        .filter(|d| d.kind() == "Role" || d.kind() == "ClusterRole")
        .map(|d| (d.kind(), d.ns(), d.name()))
        .collect();
    let mut granted: BTreeMap<ServiceAccountKey, BTreeSet<Grant>> = BTreeMap::new();
    for b in docs
        .iter()
        .filter(|d| d.kind() == "RoleBinding" || d.kind() == "ClusterRoleBinding")
    {
        let kind = b.y.s(&["roleRef", "kind"]).unwrap_or("");
        let name = b.y.s(&["roleRef", "name"]).unwrap_or("");
        let ns = if kind == "Role" { b.ns() } else { "" };
        let ok_kind = kind == "ClusterRole" || (kind == "Role" && b.kind() == "RoleBinding");
        p.check(ok_kind && roles.contains(&(kind, ns, name)), || {
            format!("{}: roleRef {kind}/{name} is not rendered", b.at())
        });
        let role = docs
            .iter()
            .find(|d| d.kind() == kind && d.ns() == ns && d.name() == name);
        for s in b.y.seq(&["subjects"]) {
            let (sk, sn) = (s.s(&["kind"]).unwrap_or(""), s.s(&["name"]).unwrap_or(""));
            let sns = s.s(&["namespace"]).unwrap_or(b.ns());
            p.check(sk == "ServiceAccount" && sas.contains(&(sns, sn)), || {
                format!(
                    "{}: subject {sk} {sns}/{sn} is not a rendered ServiceAccount",
                    b.at()
                )
            });
            let Some(role) = role else { continue };
            let scope = if b.kind() == "RoleBinding" {
                b.ns()
            } else {
                ""
            };
            let set = granted
                .entry((sns.to_string(), sn.to_string()))
                .or_default();
            for rule in role.y.seq(&["rules"]) {
                for g in rule.strs(&["apiGroups"]) {
                    for res in rule.strs(&["resources"]) {
                        for v in rule.strs(&["verbs"]) {
                            set.insert((g.clone(), res.clone(), v, scope.to_string()));
                        }
                    }
                }
            }
        }
    }
    granted
}

/// One thing a sidecar needs granted: (who needs it, apiGroup, resource,
/// verbs, whether a grant in the DaemonSet's own namespace will do).
type Need = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    bool,
);

/// What each sidecar cannot work without, by its image.
const SIDECAR_NEEDS: &[(&str, &[Need])] = &[
    (
        PROVISIONER,
        &[
            (
                "csi-provisioner",
                "",
                "persistentvolumes",
                &["create", "delete", "watch", "patch"],
                false,
            ),
            (
                "csi-provisioner",
                "",
                "persistentvolumeclaims",
                &["update", "watch"],
                false,
            ),
            (
                "csi-provisioner",
                "storage.k8s.io",
                "storageclasses",
                &["list", "watch"],
                false,
            ),
            (
                "csi-provisioner",
                "storage.k8s.io",
                "volumeattachments",
                &["list", "watch"],
                false,
            ),
            (
                "csi-provisioner (capacity)",
                "storage.k8s.io",
                "csistoragecapacities",
                &["create", "update", "delete", "list", "watch"],
                true,
            ),
            (
                "csi-provisioner (capacity owner)",
                "",
                "pods",
                &["get"],
                true,
            ),
            (
                "csi-provisioner (restore)",
                "snapshot.storage.k8s.io",
                "volumesnapshots",
                &["get", "update"],
                false,
            ),
            (
                "csi-provisioner (VolumeAttributesClass)",
                "storage.k8s.io",
                "volumeattributesclasses",
                &["get"],
                false,
            ),
            (
                "csi-provisioner (events)",
                "",
                "events",
                &["create", "patch"],
                false,
            ),
        ],
    ),
    (
        ATTACHER,
        &[
            (
                "csi-attacher",
                "storage.k8s.io",
                "volumeattachments",
                &["watch", "patch"],
                false,
            ),
            (
                "csi-attacher",
                "storage.k8s.io",
                "volumeattachments/status",
                &["patch"],
                false,
            ),
            (
                "csi-attacher",
                "",
                "persistentvolumes",
                &["watch", "patch"],
                false,
            ),
            (
                "csi-attacher",
                "storage.k8s.io",
                "csinodes",
                &["get", "list", "watch"],
                false,
            ),
        ],
    ),
    (
        RESIZER,
        &[
            (
                "csi-resizer",
                "",
                "persistentvolumeclaims/status",
                &["patch"],
                false,
            ),
            (
                "csi-resizer",
                "",
                "persistentvolumes",
                &["patch", "watch"],
                false,
            ),
            (
                "csi-resizer (in use)",
                "",
                "pods",
                &["list", "watch"],
                false,
            ),
            (
                "csi-resizer",
                "storage.k8s.io",
                "volumeattributesclasses",
                &["list", "watch"],
                false,
            ),
        ],
    ),
    (
        SNAPSHOTTER,
        &[
            (
                "csi-snapshotter",
                "snapshot.storage.k8s.io",
                "volumesnapshotcontents",
                &["watch", "update", "patch"],
                false,
            ),
            (
                "csi-snapshotter",
                "snapshot.storage.k8s.io",
                "volumesnapshotcontents/status",
                &["update", "patch"],
                false,
            ),
            (
                "csi-snapshotter",
                "snapshot.storage.k8s.io",
                "volumesnapshotclasses",
                &["get", "list", "watch"],
                false,
            ),
        ],
    ),
    (
        CSI_ADDONS,
        &[
            (
                "csi-addons",
                "csiaddons.openshift.io",
                "csiaddonsnodes",
                &["create", "get", "update", "watch", "delete"],
                true,
            ),
            (
                "csi-addons (leader election)",
                "coordination.k8s.io",
                "leases",
                &["get", "create", "update"],
                true,
            ),
            (
                "csi-addons (auth)",
                "authentication.k8s.io",
                "tokenreviews",
                &["create"],
                false,
            ),
            (
                "csi-addons (key rotation: the PV's node-stage Secret)",
                "",
                "secrets",
                &["get"],
                true,
            ),
            (
                "csi-addons (reclaim)",
                "",
                "persistentvolumes",
                &["get"],
                false,
            ),
        ],
    ),
];

/// Every rule of one render's ServiceAccounts and RBAC, in turn.
fn rbac(r: &Render, p: &mut Problems) {
    namespace_rules(r, p);
    let ds = r.one("DaemonSet");
    let sa = pod_spec(ds).s(&["serviceAccountName"]).unwrap_or("default");
    p.check(
        r.all("ServiceAccount")
            .any(|d| d.ns() == ds.ns() && d.name() == sa),
        || {
            format!(
                "{}: ServiceAccount {}/{sa} is not rendered",
                ds.at(),
                ds.ns()
            )
        },
    );
    let granted = grants(r, p);
    sidecar_needs_rules(r, ds, sa, &granted, p);
    least_privilege_rules(r, ds, &granted, p);
}

/// Cluster-scoped kinds have no namespace; every other object is in a
/// rendered Namespace.
fn namespace_rules(r: &Render, p: &mut Problems) {
    let docs = &r.docs;
    let namespaces: BTreeSet<&str> = r.all("Namespace").map(|d| d.name()).collect();
    let cluster_scoped = [
        "Namespace",
        "CSIDriver",
        "ClusterRole",
        "ClusterRoleBinding",
        "StorageClass",
        "VolumeSnapshotClass",
        "PriorityClass",
    ];
    for d in docs {
        if cluster_scoped.contains(&d.kind()) {
            p.check(d.ns().is_empty(), || {
                format!("{}: cluster-scoped, has a namespace", d.at())
            });
        } else {
            p.check(namespaces.contains(d.ns()), || {
                format!("{}: namespace {:?} is not rendered", d.at(), d.ns())
            });
        }
    }
}

/// What each sidecar this render runs cannot work without
/// ([`SIDECAR_NEEDS`]) is granted to the DaemonSet's ServiceAccount `sa`,
/// cluster-wide or (where a namespaced grant will do) in its namespace.
fn sidecar_needs_rules(
    r: &Render,
    ds: &Doc,
    sa: &str,
    granted: &BTreeMap<ServiceAccountKey, BTreeSet<Grant>>,
    p: &mut Problems,
) {
    let rules = granted
        .get(&(ds.ns().to_string(), sa.to_string()))
        .cloned()
        .unwrap_or_default();
    let has = |group: &str, resource: &str, verb: &str, namespaced: bool| {
        rules.iter().any(|(g, res, v, scope)| {
            g == group
                && res == resource
                && v == verb
                && (scope.is_empty() || (namespaced && scope == ds.ns()))
        })
    };
    for (repo, list) in SIDECAR_NEEDS {
        if find_container(ds, repo).is_none() {
            continue;
        }
        for (who, group, resource, verbs, namespaced) in *list {
            for v in *verbs {
                p.check(has(group, resource, v, *namespaced), || {
                    format!(
                        "[{}] ServiceAccount {}/{sa}: {who} needs `{v}` on {resource} ({})",
                        r.name,
                        ds.ns(),
                        if group.is_empty() { "core" } else { group }
                    )
                });
            }
        }
    }
}

/// Least privilege: what no sidecar here uses is granted to nobody.
fn least_privilege_rules(
    r: &Render,
    ds: &Doc,
    granted: &BTreeMap<ServiceAccountKey, BTreeSet<Grant>>,
    p: &mut Problems,
) {
    for (sa_key, set) in granted {
        for (g, res, v, ns) in set {
            let what = format!(
                "[{}] {}/{}: `{v}` on {res} ({g})",
                r.name, sa_key.0, sa_key.1
            );
            p.check(g != "*" && res != "*" && v != "*", || {
                format!("{what}: no wildcards")
            });
            // Only csi-addons reads a Secret (the encrypted class's
            // node-stage Secret, for key rotation): `get`, in the driver's
            // namespace, where the example keeps it; nothing lists them.
            p.check(
                res != "secrets"
                    || (v == "get"
                        && sa_key.0 == ds.ns()
                        && ns == ds.ns()
                        && find_container(ds, CSI_ADDONS).is_some()),
                || {
                    format!(
                        "{what}: secrets only for csi-addons' key rotation: `get` in {}",
                        ds.ns()
                    )
                },
            );
            p.check(!(g == "apps" && res == "daemonsets"), || {
                format!("{what}: the provisioner's capacity owner is its pod, read by name; no DaemonSet")
            });
            p.check(res != "nodes", || {
                format!("{what}: per-node sidecars read no Node (the provisioner builds its own from NodeGetInfo)")
            });
            p.check(!(res == "events" && (v == "list" || v == "watch")), || {
                format!("{what}: events are only written")
            });
            p.check(g != "groupsnapshot.storage.k8s.io", || {
                format!("{what}: group snapshots are socket-only")
            });
            p.check(res != "leases" || find_container(ds, CSI_ADDONS).is_some(), || {
                format!("{what}: no leases without the csi-addons sidecar (the others elect no leader)")
            });
            p.check(
                res != "csinodes" || find_container(ds, ATTACHER).is_some(),
                || format!("{what}: only the attacher reads CSINodes"),
            );
        }
    }
}

/// The plugin capabilities identity.rs advertises, by their proto names
/// (`ControllerService`, ...): read from its source, where
/// GetPluginCapabilities builds them inline.
fn plugin_capabilities() -> BTreeSet<String> {
    let src = read("src/grpc/identity.rs");
    let mut out = BTreeSet::new();
    for marker in ["service::Type::", "volume_expansion::Type::"] {
        let mut rest = src.as_str();
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if marker.starts_with("volume") {
                out.insert(format!("VolumeExpansion{name}"));
            } else {
                out.insert(name);
            }
        }
    }
    assert!(
        out.contains("ControllerService"),
        "no plugin capability found in src/grpc/identity.rs: {out:?}"
    );
    out
}

/// One render, as the rules of `capabilities_agree_with_the_sidecars`
/// read it: what it runs, and what the driver advertises with its config.
struct RenderCaps<'a> {
    r: &'a Render,
    ds: &'a Doc,
    /// `[render] DaemonSet/name`: where a problem is.
    at: String,
    /// The controller capabilities the driver advertises with the
    /// rendered config.
    ctrl: Vec<Ctrl>,
    /// The plugin capabilities ([`plugin_capabilities`]).
    plugin: &'a BTreeSet<String>,
    csidriver: &'a Doc,
}

impl RenderCaps<'_> {
    /// Whether the DaemonSet runs the image `repo`.
    fn runs(&self, repo: &str) -> bool {
        find_container(self.ds, repo).is_some()
    }
    /// Whether the CSIDriver's spec.`k` is true.
    fn spec(&self, k: &str) -> bool {
        self.csidriver.y.s(&["spec", k]) == Some("true")
    }
}

#[test]
fn capabilities_agree_with_the_sidecars() {
    let plugin = plugin_capabilities();
    // The driver's CSI-Addons identity: CONTROLLER_SERVICE makes the
    // csi-addons sidecar take part in a leader election.
    let addons_controller =
        thinpool_csi::grpc::addons::capabilities(thinpool_csi::grpc::addons::Sides::Both)
            .iter()
            .any(|c| {
                matches!(&c.r#type, Some(AddonsCap::Service(s))
                if s.r#type == AddonsService::ControllerService as i32)
            });
    let readme = read(&format!("{DEPLOY}/README.md"));
    let mut p = Problems::default();
    let mut snapshotter_somewhere = false;
    for r in renders() {
        let ds = r.one("DaemonSet");
        let (cfg, _) = configmap_config(r, ds);
        let rc = RenderCaps {
            r,
            ds,
            at: ds.at(),
            ctrl: thinpool_csi::grpc::controller::capabilities(cfg.controller_expansion),
            plugin: &plugin,
            csidriver: r.one("CSIDriver"),
        };
        controller_sidecar_rules(&rc, &mut p);
        expansion_rules(&rc, &mut p);
        snapshotter_somewhere |= rc.runs(SNAPSHOTTER);
        snapshot_rules(&rc, &mut p);
        csi_addons_rules(&rc, addons_controller, &mut p);
    }
    p.check(
        !thinpool_csi::grpc::controller::CAPABILITIES.contains(&Ctrl::CreateDeleteSnapshot)
            || snapshotter_somewhere,
        || "CREATE_DELETE_SNAPSHOT is advertised, and no render runs csi-snapshotter".to_string(),
    );
    if plugin.contains("GroupControllerService") {
        p.check(
            readme.contains("Group snapshots") && readme.contains("socket-only"),
            || {
                "deploy/kubernetes/README.md must say that group snapshots are socket-only, and why"
                    .to_string()
            },
        );
    }
    if plugin.contains("SnapshotMetadataService") {
        p.check(
            readme.contains("SnapshotMetadata") && readme.contains("socket-only"),
            || {
                "deploy/kubernetes/README.md must say that SnapshotMetadata is socket-only, and why"
                    .to_string()
            },
        );
    }
    p.finish("capabilities against the sidecars");
}

/// The controller sidecars against the controller capabilities: every
/// one needs CONTROLLER_SERVICE; the provisioner runs exactly when
/// CREATE_DELETE_VOLUME is advertised, and per node it needs topology;
/// the attacher exactly with PUBLISH_UNPUBLISH_VOLUME and attachRequired,
/// and never with LIST_VOLUMES_PUBLISHED_NODES; GET_CAPACITY exactly with
/// --enable-capacity and storageCapacity.
fn controller_sidecar_rules(rc: &RenderCaps, p: &mut Problems) {
    let (ctrl, plugin, at) = (&rc.ctrl, rc.plugin, &rc.at);
    // Every controller sidecar needs CONTROLLER_SERVICE (the resizer and
    // the provisioner exit without it).
    for repo in [PROVISIONER, ATTACHER, RESIZER, SNAPSHOTTER] {
        p.check(
            !rc.runs(repo) || plugin.contains("ControllerService"),
            || format!("{at}: {repo} runs, the driver advertises no CONTROLLER_SERVICE"),
        );
    }
    // CreateVolume/DeleteVolume: the provisioner, per node, which needs
    // topology to find its own volumes.
    p.check(
        ctrl.contains(&Ctrl::CreateDeleteVolume) == rc.runs(PROVISIONER),
        || {
            format!(
                "{at}: CREATE_DELETE_VOLUME advertised {} but csi-provisioner runs {}",
                ctrl.contains(&Ctrl::CreateDeleteVolume),
                rc.runs(PROVISIONER)
            )
        },
    );
    p.check(plugin.contains("VolumeAccessibilityConstraints"), || {
        format!("{at}: --node-deployment needs VOLUME_ACCESSIBILITY_CONSTRAINTS (each node deletes only what its topology holds)")
    });
    // ControllerPublish: the attacher, and attachRequired.
    let publish = ctrl.contains(&Ctrl::PublishUnpublishVolume);
    p.check(publish == rc.runs(ATTACHER) && publish == rc.spec("attachRequired"), || {
        format!(
            "{at}: PUBLISH_UNPUBLISH_VOLUME advertised {publish}, csi-attacher runs {}, CSIDriver attachRequired {}",
            rc.runs(ATTACHER),
            rc.spec("attachRequired")
        )
    });
    // The attacher has no per-node mode: with LIST_VOLUMES_PUBLISHED_NODES
    // every node's instance would reconcile every VolumeAttachment
    // against its own volumes.
    p.check(!ctrl.contains(&Ctrl::ListVolumesPublishedNodes) || !rc.runs(ATTACHER), || {
        format!("{at}: LIST_VOLUMES_PUBLISHED_NODES with a per-node attacher would detach other nodes' volumes in its reconciler")
    });
    // GetCapacity: capacity tracking on, storageCapacity on.
    let capacity = ctrl.contains(&Ctrl::GetCapacity);
    let enabled = flag(container_by_image(rc.ds, PROVISIONER), "--enable-capacity").as_deref()
        == Some("true");
    p.check(capacity == enabled && capacity == rc.spec("storageCapacity"), || {
        format!("{at}: GET_CAPACITY advertised {capacity}, --enable-capacity {enabled}, CSIDriver storageCapacity {}", rc.spec("storageCapacity"))
    });
}

/// Expansion: the resizer (the trivial resizer when only the node
/// expands) runs exactly when something expands or modifies, never with
/// controller expansion (it has no per-node mode); controller expansion
/// needs the plugin's VolumeExpansion; the class allows expansion exactly
/// when the driver expands.
fn expansion_rules(rc: &RenderCaps, p: &mut Problems) {
    let (ctrl, plugin, at) = (&rc.ctrl, rc.plugin, &rc.at);
    let node = thinpool_csi::grpc::node::CAPABILITIES;
    let ctrl_expand = ctrl.contains(&Ctrl::ExpandVolume);
    // external-resizer has no per-node mode: with one on every node,
    // controller expansion must be off (the others' NOT_FOUND would
    // mark the claim infeasible), and the node grows the LV.
    p.check(!(rc.runs(RESIZER) && ctrl_expand), || {
        format!("{at}: csi-resizer runs on every node, so controller_expansion must be false in the config (deploy/kubernetes/README.md, \"Sidecars in a per-node deployment\")")
    });
    let node_expand = node.contains(&NodeCap::ExpandVolume);
    let modify = ctrl.contains(&Ctrl::ModifyVolume);
    p.check(rc.runs(RESIZER) == (ctrl_expand || node_expand || modify), || {
        format!("{at}: csi-resizer runs {} but controller EXPAND_VOLUME {ctrl_expand}, node EXPAND_VOLUME {node_expand}, MODIFY_VOLUME {modify}", rc.runs(RESIZER))
    });
    p.check(
        !ctrl_expand || plugin.iter().any(|c| c.starts_with("VolumeExpansion")),
        || {
            format!(
                "{at}: controller EXPAND_VOLUME without the plugin's VolumeExpansion capability"
            )
        },
    );
    let sc = rc.r.one("StorageClass");
    let allows = sc.y.s(&["allowVolumeExpansion"]) == Some("true");
    p.check(allows == (ctrl_expand || node_expand), || {
        format!("{}: allowVolumeExpansion {allows}, but the driver expands: controller {ctrl_expand}, node {node_expand}", sc.at())
    });
}

/// Snapshots: the snapshotter only where the driver cuts them, and a
/// VolumeSnapshotClass only where a snapshotter runs. Group snapshots and
/// SnapshotMetadata are socket-only: nothing wires them (a per-node
/// snapshotter never sees a group's contents, and the snapshot-metadata
/// sidecar has one address per driver).
fn snapshot_rules(rc: &RenderCaps, p: &mut Problems) {
    let (r, at) = (rc.r, &rc.at);
    let snaps = rc.ctrl.contains(&Ctrl::CreateDeleteSnapshot);
    p.check(!rc.runs(SNAPSHOTTER) || snaps, || {
        format!("{at}: csi-snapshotter runs, the driver advertises no CREATE_DELETE_SNAPSHOT")
    });
    p.check(
        r.all("VolumeSnapshotClass").next().is_none() || rc.runs(SNAPSHOTTER),
        || {
            format!(
                "[{}]: a VolumeSnapshotClass without a csi-snapshotter",
                r.name
            )
        },
    );
    if let Some(c) = find_container(rc.ds, SNAPSHOTTER) {
        let gates = flag(c, "--feature-gates").unwrap_or_default();
        p.check(!gates.contains("CSIVolumeGroupSnapshot=true"), || {
            format!("{at}: group snapshots are socket-only; the per-node csi-snapshotter cannot serve them")
        });
    }
    p.check(r.all("VolumeGroupSnapshotClass").next().is_none(), || {
        format!(
            "[{}]: a VolumeGroupSnapshotClass, but group snapshots are socket-only",
            r.name
        )
    });
    p.check(
        r.all("SnapshotMetadataService").next().is_none() && NEVER.iter().all(|n| !rc.runs(n)),
        || format!("[{}]: SnapshotMetadata is socket-only", r.name),
    );
}

/// CSI-Addons: the sidecar talks to the driver's CSI-Addons socket; a
/// driver that is its own controller there (`addons_controller`) elects a
/// leader on a lease, which the render must grant.
fn csi_addons_rules(rc: &RenderCaps, addons_controller: bool, p: &mut Problems) {
    let (r, at) = (rc.r, &rc.at);
    if rc.runs(CSI_ADDONS) {
        let (cfg, _) = configmap_config(r, rc.ds);
        p.check(!cfg.csi_addons_endpoint.is_empty(), || {
            format!("{at}: csi-addons runs, the driver serves no CSI-Addons socket")
        });
        let leases = grants(r, &mut Problems::default())
            .values()
            .flatten()
            .any(|(g, res, v, _)| g == "coordination.k8s.io" && res == "leases" && v == "update");
        p.check(!addons_controller || leases, || {
            format!(
                "[{}]: the driver's CSI-Addons identity is a controller: csi-addons needs leases",
                r.name
            )
        });
    }
}
