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

use thinpool_csi::cluster::ControllerConfig;
use thinpool_csi::config::{parse_endpoint, Config, UdevMode};
use thinpool_csi::proto::csi::v1::controller_service_capability::rpc::Type as Ctrl;
use thinpool_csi::proto::csi::v1::node_service_capability::rpc::Type as NodeCap;
use thinpool_csi::proto::identity::capability::service::Type as AddonsService;
use thinpool_csi::proto::identity::capability::Type as AddonsCap;

// ---------------------------------------------------------------------------
// What the packaging must contain.

/// Where a sidecar runs: the node DaemonSet, the controller Deployment,
/// or both (deploy/kubernetes/README.md, "Sidecars and the controller").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Node,
    Controller,
    Both,
}

impl Place {
    fn runs_on(self, side: Place) -> bool {
        self == Place::Both || self == side
    }
}

/// A sidecar container.
struct Sidecar {
    repo: &'static str,
    /// The component that adds it; None: the base runs it.
    component: Option<&'static str>,
    place: Place,
}

const REGISTRAR: &str = "registry.k8s.io/sig-storage/csi-node-driver-registrar";
const LIVENESS: &str = "registry.k8s.io/sig-storage/livenessprobe";
const PROVISIONER: &str = "registry.k8s.io/sig-storage/csi-provisioner";
const ATTACHER: &str = "registry.k8s.io/sig-storage/csi-attacher";
const RESIZER: &str = "registry.k8s.io/sig-storage/csi-resizer";
const SNAPSHOTTER: &str = "registry.k8s.io/sig-storage/csi-snapshotter";
const SNAPSHOT_METADATA: &str = "registry.k8s.io/sig-storage/csi-snapshot-metadata";
const CSI_ADDONS: &str = "quay.io/csiaddons/k8s-sidecar";

/// Every sidecar, with where it comes from and where it runs (read from
/// each sidecar's source: deploy/kubernetes/README.md, "Sidecars").
const SIDECARS: &[Sidecar] = &[
    // Per node by nature: it registers its own node's socket.
    Sidecar {
        repo: REGISTRAR,
        component: None,
        place: Place::Node,
    },
    // The node driver's liveness, and the controller's.
    Sidecar {
        repo: LIVENESS,
        component: None,
        place: Place::Both,
    },
    // The central sidecars: one elected instance calls the controller,
    // which forwards to the node of the object.
    Sidecar {
        repo: PROVISIONER,
        component: None,
        place: Place::Controller,
    },
    Sidecar {
        repo: ATTACHER,
        component: None,
        place: Place::Controller,
    },
    Sidecar {
        repo: RESIZER,
        component: None,
        place: Place::Controller,
    },
    Sidecar {
        repo: SNAPSHOTTER,
        component: Some("snapshots"),
        place: Place::Controller,
    },
    Sidecar {
        repo: SNAPSHOT_METADATA,
        component: Some("snapshot-metadata"),
        place: Place::Controller,
    },
    // Node calls on the node (by the VolumeAttachment's node), controller
    // calls on the lease holder: the controller.
    Sidecar {
        repo: CSI_ADDONS,
        component: Some("csi-addons"),
        place: Place::Both,
    },
];
/// The central sidecars that elect one leader among the replicas.
const ELECTING: &[&str] = &[PROVISIONER, ATTACHER, RESIZER, SNAPSHOTTER];
/// Images without a digest: no digest of their release could be checked
/// where the deployment was written (deploy/kubernetes/README.md,
/// "Operator settings", names both; each component's kustomization.yaml
/// says how to add one).
const UNPINNED: &[&str] = &[CSI_ADDONS, SNAPSHOT_METADATA];
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
    (
        "snapshots",
        &["VolumeSnapshotClass", "VolumeGroupSnapshotClass"],
    ),
    ("csi-addons", &[]),
    ("snapshot-metadata", &["Service"]),
    ("monitoring", &["PodMonitor", "PrometheusRule"]),
];
/// The names the channel's Secrets have (scripts/cluster-tls.sh).
const NODE_TLS: &str = "thinpool-csi-node-tls";
const CONTROLLER_TLS: &str = "thinpool-csi-controller-tls";
const SNAPSHOT_METADATA_TLS: &str = "thinpool-csi-snapshot-metadata-tls";
/// The ServiceAccounts of the two workloads.
const NODE_SA: &str = "thinpool-csi-node";
const CONTROLLER_SA: &str = "thinpool-csi-controller";
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
    let (cm, key, text, path) = config_file(r, ds);
    let cfg = Config::parse(text)
        .unwrap_or_else(|e| panic!("{}: the driver refuses {key}: {e}", cm.at()));
    (cfg, path)
}

/// The file the driver container of `pod` names with `--config`: the
/// ConfigMap mounted at its directory, its key, its text, and the path.
fn config_file<'a>(r: &'a Render, pod: &Doc) -> (&'a Doc, String, &'a str, String) {
    let driver = driver_container(pod);
    let args = driver.strs(&["args"]);
    let path = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("{}: the driver has no `--config FILE` args", pod.at()))
        .clone();
    let (dir, key) = path.rsplit_once('/').unwrap();
    let mount = driver
        .seq(&["volumeMounts"])
        .iter()
        .find(|m| m.s(&["mountPath"]) == Some(dir))
        .unwrap_or_else(|| {
            panic!(
                "{}: nothing is mounted at {dir} (--config {path})",
                pod.at()
            )
        });
    let vol = pod_volume(pod, mount.s(&["name"]).unwrap());
    let cm_name = vol
        .s(&["configMap", "name"])
        .unwrap_or_else(|| panic!("{}: {dir} is not a ConfigMap volume", pod.at()));
    let cm = r
        .all("ConfigMap")
        .find(|d| d.name() == cm_name && d.ns() == pod.ns())
        .unwrap_or_else(|| {
            panic!(
                "[{}]: ConfigMap {}/{cm_name} is not rendered",
                r.name,
                pod.ns()
            )
        });
    let text =
        cm.y.s(&["data", key])
            .unwrap_or_else(|| panic!("{}: no data key {key:?}", cm.at()));
    (cm, key.to_string(), text, path)
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
        p.check(
            kinds.get("DaemonSet") == Some(&1) && kinds.get("Deployment") == Some(&1),
            || format!("[{}]: one DaemonSet and one Deployment expected", r.name),
        );
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
    node_sidecar_rules(&nds, p);
    port_name_rules(ds, p);
    scheduling_rules(&nds, p);
}

/// Images: the driver and the sidecars of the base and of this render's
/// components, nothing else, all pinned; the driver's is the crate
/// version, privileged, and the pod's default container.
fn image_rules(nds: &NodeDs, version: &str, p: &mut Problems) {
    pinned_images(nds.r, nds.ds, Place::Node, version, p);
    let at = &nds.at;
    p.check(
        nds.driver.s(&["securityContext", "privileged"]) == Some("true"),
        || format!("{at}: the driver container must be privileged"),
    );
}

/// The images of `pod` (the `side` workload): exactly the driver and the
/// sidecars that run there in this render, each pinned to a release tag
/// and by digest (but [`UNPINNED`] and the driver's own), the driver's the
/// crate version; `kubectl logs/exec` default to the driver.
fn pinned_images(r: &Render, pod: &Doc, side: Place, version: &str, p: &mut Problems) {
    let at = pod.at();
    let images: Vec<&str> = containers(pod)
        .iter()
        .map(|c| c.s(&["image"]).unwrap_or(""))
        .collect();
    let repos: BTreeSet<&str> = images.iter().map(|i| image_repo(i)).collect();
    let want: BTreeSet<&str> = SIDECARS
        .iter()
        .filter(|s| s.place.runs_on(side) && s.component.is_none_or(|c| r.has(c)))
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
        pod.y.s(&[
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
        container_rules(ds, c, p);
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
fn container_rules(ds: &Doc, c: &Y, p: &mut Problems) {
    let at = &ds.at();
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

/// The node's sidecars serve their own node: none elects a leader;
/// csi-addons has the driver's node id (the Kubernetes node name, which a
/// VolumeAttachment names) and its staging path under the kubelet
/// directory. The driver serves the controller's channel: `[cluster]` on
/// its `cluster` port, its certificate and key from the nodes' Secret
/// and, of the controller's, the CA alone; controller expansion on, as
/// the controller's.
fn node_sidecar_rules(nds: &NodeDs, p: &mut Problems) {
    let (ds, at, kubelet) = (nds.ds, &nds.at, nds.kubelet);
    for c in containers(ds) {
        let repo = image_repo(c.s(&["image"]).unwrap_or(""));
        if repo == CSI_ADDONS || repo == DRIVER_IMAGE {
            continue;
        }
        p.check(!elects(c), || {
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
            || format!("{at}: csi-addons needs --node-id=$(NODE_NAME) from spec.nodeName, the node a VolumeAttachment names"),
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
    let cluster = &nds.cfg.cluster;
    let listen_port = cluster.listen.rsplit_once(':').map(|(_, p)| p.to_string());
    let named = named_port(nds.driver, "cluster");
    p.check(listen_port.is_some() && listen_port == named, || {
        format!(
            "{at}: [cluster] listen {:?} must be the driver's port named `cluster` ({named:?})",
            cluster.listen
        )
    });
    for (file, secret, key) in [
        (&cluster.tls_cert, NODE_TLS, "tls.crt"),
        (&cluster.tls_key, NODE_TLS, "tls.key"),
        (&cluster.client_ca, CONTROLLER_TLS, "ca.crt"),
        // Peers: the nodes' CA, for restores pulled from another node.
        (&cluster.peer_ca, NODE_TLS, "ca.crt"),
    ] {
        tls_file_rule(ds, nds.driver, file, secret, key, p);
    }
    no_foreign_key_rule(ds, nds.driver, NODE_TLS, p);
    p.check(nds.cfg.controller_expansion, || {
        format!("{at}: controller_expansion must be on (an unstaged volume grows through the controller)")
    });
}

/// Whether container `c` elects a leader.
fn elects(c: &Y) -> bool {
    c.strs(&["args"])
        .iter()
        .any(|a| a == "--leader-election" || a == "--leader-election=true")
}

/// The containerPort of `c`'s port named `name`.
fn named_port(c: &Y, name: &str) -> Option<String> {
    c.seq(&["ports"])
        .iter()
        .find(|p| p.s(&["name"]) == Some(name))
        .and_then(|p| p.s(&["containerPort"]))
        .map(str::to_string)
}

/// The (Secret, key) that file `path` of container `c` comes from: a
/// mount of its directory, whose volume is a Secret or projects Secrets.
fn secret_file(pod: &Doc, c: &Y, path: &str) -> Option<(String, String)> {
    let (dir, name) = path.rsplit_once('/')?;
    let m = c
        .seq(&["volumeMounts"])
        .iter()
        .find(|m| m.s(&["mountPath"]).map(|p| p.trim_end_matches('/')) == Some(dir))?;
    let vol = pod_volume(pod, m.s(&["name"])?);
    let sources: Vec<&Y> = match vol.s(&["secret", "secretName"]) {
        Some(_) => vec![vol],
        None => vol.seq(&["projected", "sources"]).iter().collect(),
    };
    for src in sources {
        let (secret, items) = match src.s(&["secret", "secretName"]) {
            Some(n) => (n, src.seq(&["secret", "items"])),
            None => (src.s(&["secret", "name"])?, src.seq(&["secret", "items"])),
        };
        if items.is_empty() {
            // A whole Secret: each key is a file of its name.
            if ["tls.crt", "tls.key", "ca.crt"].contains(&name) {
                return Some((secret.to_string(), name.to_string()));
            }
        }
        for it in items {
            if it.s(&["path"]) == Some(name) {
                return Some((secret.to_string(), it.s(&["key"])?.to_string()));
            }
        }
    }
    None
}

/// `path` (a TLS file a config names) is `key` of Secret `secret`.
fn tls_file_rule(
    pod: &Doc,
    c: &Y,
    path: &std::path::Path,
    secret: &str,
    key: &str,
    p: &mut Problems,
) {
    let got = secret_file(pod, c, &path.display().to_string());
    p.check(got == Some((secret.to_string(), key.to_string())), || {
        format!(
            "{}: {} must be {key} of Secret {secret}, is {got:?}",
            pod.at(),
            path.display()
        )
    });
}

/// Of the other side's Secret (not `own`), `c` may mount `ca.crt` alone:
/// never its key or certificate.
fn no_foreign_key_rule(pod: &Doc, c: &Y, own: &str, p: &mut Problems) {
    for m in c.seq(&["volumeMounts"]) {
        let vol = pod_volume(pod, m.s(&["name"]).unwrap_or(""));
        for src in vol.seq(&["projected", "sources"]) {
            let Some(secret) = src.s(&["secret", "name"]) else {
                continue;
            };
            if secret == own {
                continue;
            }
            let keys: Vec<&str> = src
                .seq(&["secret", "items"])
                .iter()
                .filter_map(|i| i.s(&["key"]))
                .collect();
            p.check(keys == ["ca.crt"], || {
                format!(
                    "{}: {} may take ca.crt alone of Secret {secret}, takes {keys:?}",
                    pod.at(),
                    cname(c)
                )
            });
        }
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

#[test]
fn controller_deployment_in_every_render() {
    let version = crate_version();
    let mut p = Problems::default();
    for r in renders() {
        controller_deployment(r, &version, &mut p);
    }
    p.finish("controller Deployment");
}

/// The controller's configuration of the ConfigMap its `--config` names,
/// through the controller's own parser.
fn controller_config(r: &Render, dep: &Doc) -> ControllerConfig {
    let args = driver_container(dep).strs(&["args"]);
    assert!(
        args.first().map(String::as_str) == Some("controller"),
        "{}: the driver container must run `controller`, runs {args:?}",
        dep.at()
    );
    let (cm, key, text, _) = config_file(r, dep);
    // One file per call: the tests run side by side.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("controller-{}-{n}-{key}", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let cfg = ControllerConfig::load(&file)
        .unwrap_or_else(|e| panic!("{}: the controller refuses {key}: {e}", cm.at()));
    let _ = std::fs::remove_file(&file);
    cfg
}

/// The labels of a workload's pods.
fn pod_labels(d: &Doc) -> BTreeMap<String, String> {
    string_map(d, &["spec", "template", "metadata", "labels"])
}

/// The string map at `path` of `d` (labels, a selector).
fn string_map(d: &Doc, path: &[&str]) -> BTreeMap<String, String> {
    match d.y.path(path) {
        Some(Y::Map(m)) => m
            .iter()
            .filter_map(|(k, v)| match v {
                Y::Str(v) => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// Whether `k=v,k2=v2` selects pods labelled `labels`.
fn selects(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty()
        && selector.split(',').all(|term| {
            term.split_once('=')
                .is_some_and(|(k, v)| labels.get(k.trim()).map(String::as_str) == Some(v.trim()))
        })
}

/// Every rule of one render's controller Deployment.
fn controller_deployment(r: &Render, version: &str, p: &mut Problems) {
    let dep = r.one("Deployment");
    let ds = r.one("DaemonSet");
    let at = dep.at();
    pinned_images(r, dep, Place::Controller, version, p);
    let spec = pod_spec(dep);
    p.check(dep.y.s(&["spec", "replicas"]) == Some("2"), || {
        format!("{at}: two replicas (the sidecars elect the active one)")
    });
    p.check(
        spec.s(&["serviceAccountName"]) == Some(CONTROLLER_SA),
        || format!("{at}: serviceAccountName must be {CONTROLLER_SA}"),
    );
    // Unprivileged: no host path, no host network, no root, nothing
    // writable but its emptyDir.
    for v in spec.seq(&["volumes"]) {
        p.check(v.get("hostPath").is_none(), || {
            format!("{at}: volume {:?} is a host path", v.s(&["name"]))
        });
    }
    p.check(spec.s(&["hostNetwork"]) != Some("true"), || {
        format!("{at}: no host network")
    });
    p.check(
        spec.s(&["securityContext", "runAsNonRoot"]) == Some("true"),
        || format!("{at}: the pod must run as non-root"),
    );
    for c in containers(dep) {
        let sc = |k: &str| c.s(&["securityContext", k]);
        p.check(
            sc("privileged") != Some("true")
                && sc("allowPrivilegeEscalation") == Some("false")
                && sc("readOnlyRootFilesystem") == Some("true")
                && c.strs(&["securityContext", "capabilities", "drop"]) == ["ALL"],
            || {
                format!(
                    "{at}: {} must be unprivileged (no escalation, read-only root, no capability)",
                    cname(c)
                )
            },
        );
        container_rules(dep, c, p);
    }
    // The config, through the controller's parser, agrees with the node's.
    let cfg = controller_config(r, dep);
    let (node_cfg, _) = configmap_config(r, ds);
    p.check(
        cfg.driver_name == node_cfg.driver_name && r.one("CSIDriver").name() == cfg.driver_name,
        || {
            format!(
                "{at}: driver_name {:?} must be the node's and the CSIDriver's",
                cfg.driver_name
            )
        },
    );
    p.check(
        cfg.controller_expansion == node_cfg.controller_expansion,
        || format!("{at}: controller_expansion must be the node plugins'"),
    );
    let driver = driver_container(dep);
    for (file, secret, key) in [
        (&cfg.tls_cert, CONTROLLER_TLS, "tls.crt"),
        (&cfg.tls_key, CONTROLLER_TLS, "tls.key"),
        (&cfg.nodes_ca, NODE_TLS, "ca.crt"),
    ] {
        tls_file_rule(dep, driver, file, secret, key, p);
    }
    no_foreign_key_rule(dep, driver, CONTROLLER_TLS, p);
    // The certificate every node presents names node_server_name.
    let script = read("scripts/cluster-tls.sh");
    p.check(
        script.contains(&format!("subjectAltName=DNS:{}\\n", cfg.node_server_name)),
        || format!("{at}: node_server_name {:?} is not the DNS name scripts/cluster-tls.sh gives the nodes", cfg.node_server_name),
    );
    // Discovery: the node plugin pods, on the port of their channel.
    match &cfg.discovery {
        None => p.push(format!(
            "{at}: the controller must find the node plugins ([discovery])"
        )),
        Some(d) => {
            p.check(selects(&d.label_selector, &pod_labels(ds)), || {
                format!(
                    "{at}: discovery.label_selector {:?} must select the node plugin pods",
                    d.label_selector
                )
            });
            p.check(!selects(&d.label_selector, &pod_labels(dep)), || {
                format!(
                    "{at}: discovery.label_selector {:?} also selects the controller's pods",
                    d.label_selector
                )
            });
            let listen = node_cfg
                .cluster
                .listen
                .rsplit_once(':')
                .map(|(_, p)| p.to_string());
            p.check(listen == Some(d.port.to_string()), || {
                format!(
                    "{at}: discovery.port {} must be the nodes' [cluster] listen port {listen:?}",
                    d.port
                )
            });
        }
    }
    p.check(
        env(driver, "POD_NAMESPACE") == Some("fieldRef:metadata.namespace".into()),
        || format!("{at}: the controller needs POD_NAMESPACE (discovery lists its own namespace)"),
    );
    // Sockets: one emptyDir, every sidecar's address in it.
    let csi_sock = parse_endpoint(&env(driver, "CSI_ENDPOINT").unwrap_or_default())
        .unwrap_or_else(|e| panic!("{at}: CSI_ENDPOINT: {e}"));
    p.check(
        parse_endpoint(&cfg.endpoint).ok() == Some(csi_sock.clone()),
        || format!("{at}: CSI_ENDPOINT and the config's endpoint disagree"),
    );
    let sock_dir = csi_sock.parent().unwrap().to_str().unwrap().to_string();
    for c in containers(dep) {
        let m = c
            .seq(&["volumeMounts"])
            .iter()
            .find(|m| m.s(&["mountPath"]) == Some(sock_dir.as_str()));
        let empty = m.is_some_and(|m| {
            pod_volume(dep, m.s(&["name"]).unwrap())
                .get("emptyDir")
                .is_some()
        });
        p.check(empty, || {
            format!("{at}: {} must mount the emptyDir {sock_dir}", cname(c))
        });
        if std::ptr::eq(c, driver) {
            continue;
        }
        let (flag_name, want) = if image_repo(c.s(&["image"]).unwrap_or("")) == CSI_ADDONS {
            ("--csi-addons-address", cfg.csi_addons_endpoint.clone())
        } else {
            ("--csi-address", csi_sock.display().to_string())
        };
        let got = flag(c, flag_name);
        p.check(
            !want.is_empty() && got.as_deref().map(socket_path) == Some(socket_path(&want)),
            || format!("{at}: {} needs {flag_name}={want}, has {got:?}", cname(c)),
        );
    }
    // Leader election, each with its own health endpoint.
    let mut ports = BTreeMap::new();
    for c in containers(dep) {
        for port in c.seq(&["ports"]) {
            let n = port.s(&["containerPort"]).unwrap_or("").to_string();
            if let Some(other) = ports.insert(n.clone(), cname(c).to_string()) {
                p.push(format!(
                    "{at}: port {n} is claimed by {other} and {}",
                    cname(c)
                ));
            }
        }
        let repo = image_repo(c.s(&["image"]).unwrap_or(""));
        if ELECTING.contains(&repo) {
            p.check(
                elects(c)
                    && flag(c, "--leader-election-namespace").as_deref() == Some("$(NAMESPACE)")
                    && env(c, "NAMESPACE") == Some("fieldRef:metadata.namespace".into()),
                || format!("{at}: {} must elect a leader in its namespace (--leader-election, --leader-election-namespace=$(NAMESPACE) from metadata.namespace)", cname(c)),
            );
            let port = endpoint_port(c);
            p.check(
                port.is_some()
                    && probe_port(c, "livenessProbe") == port
                    && c.s(&["livenessProbe", "httpGet", "path"]) == Some("/healthz/leader-election"),
                || format!("{at}: {} needs --http-endpoint and a livenessProbe on its /healthz/leader-election", cname(c)),
            );
        } else if repo != CSI_ADDONS {
            p.check(!elects(c), || {
                format!("{at}: {} elects no leader", cname(c))
            });
        }
        p.check(flag(c, "--node-deployment").is_none(), || {
            format!("{at}: {} is central: no --node-deployment", cname(c))
        });
    }
    controller_sidecar_flags(r, dep, ds, p);
    port_name_rules(dep, p);
    // One user for every container: the sidecars write to the sockets the
    // controller makes, which only their owner may write to.
    let uid = spec.s(&["securityContext", "runAsUser"]);
    p.check(uid.is_some_and(|u| u != "0"), || {
        format!("{at}: the pod needs one non-root runAsUser for every container")
    });
    for c in containers(dep) {
        let own = c.s(&["securityContext", "runAsUser"]);
        p.check(own.is_none() || own == uid, || {
            format!("{at}: {} runs as {own:?}, not the pod's {uid:?}: it could not use the controller's sockets", cname(c))
        });
    }
    // The controller's liveness: the pod's own livenessprobe.
    let live = container_by_image(dep, LIVENESS);
    let live_port = endpoint_port(live);
    p.check(
        live_port.is_some() && probe_port(driver, "livenessProbe") == live_port,
        || format!("{at}: the controller's livenessProbe must GET its livenessprobe's /healthz ({live_port:?})"),
    );
}

/// Container port names are IANA service names (the API server refuses a
/// pod with another): at most 15 of `[a-z0-9-]`, a letter among them, no
/// `-` at either end or twice in a row; every probe's named port is one
/// of its container's.
fn port_name_rules(pod: &Doc, p: &mut Problems) {
    let at = pod.at();
    for c in containers(pod) {
        for port in c.seq(&["ports"]) {
            let n = port.s(&["name"]).unwrap_or("");
            p.check(is_port_name(n), || {
                format!(
                    "{at}: {} port name {n:?} is no IANA service name (at most 15 of a-z, 0-9, -)",
                    cname(c)
                )
            });
        }
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            if let Some(named) = c
                .s(&[probe, "httpGet", "port"])
                .filter(|n| n.parse::<u16>().is_err())
            {
                p.check(named_port(c, named).is_some(), || {
                    format!(
                        "{at}: {}'s {probe} names port {named:?}, which it does not have",
                        cname(c)
                    )
                });
            }
        }
    }
}

fn is_port_name(n: &str) -> bool {
    (1..=15).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && n.bytes().any(|b| b.is_ascii_lowercase())
        && !n.starts_with('-')
        && !n.ends_with('-')
        && !n.contains("--")
}

/// The central sidecars' own flags: strict topology and capacity owned by
/// the Deployment; the resizer without a pod informer; group snapshots;
/// csi-addons never named after a node; csi-snapshot-metadata behind its
/// Service with its certificate.
fn controller_sidecar_flags(r: &Render, dep: &Doc, ds: &Doc, p: &mut Problems) {
    let at = dep.at();
    let prov = container_by_image(dep, PROVISIONER);
    for (f, v) in [
        ("--enable-capacity", "true"),
        // pod, ReplicaSet, Deployment: the objects outlive a replica.
        ("--capacity-ownerref-level", "2"),
        ("--strict-topology", "true"),
    ] {
        let got = flag(prov, f);
        p.check(got.as_deref() == Some(v), || {
            format!("{at}: csi-provisioner needs {f}={v}, has {got:?}")
        });
    }
    for (var, field) in [
        ("NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        p.check(env(prov, var) == Some(format!("fieldRef:{field}")), || {
            format!("{at}: csi-provisioner needs env {var} from {field}")
        });
    }
    let resizer = container_by_image(dep, RESIZER);
    p.check(flag(resizer, "--handle-volume-inuse-error").as_deref() == Some("false"), || {
        format!("{at}: csi-resizer needs --handle-volume-inuse-error=false (volumes grow in use; no pod informer)")
    });
    if let Some(snap) = find_container(dep, SNAPSHOTTER) {
        let gates = flag(snap, "--feature-gates").unwrap_or_default();
        p.check(gates.contains("CSIVolumeGroupSnapshot=true"), || {
            format!("{at}: csi-snapshotter needs --feature-gates=CSIVolumeGroupSnapshot=true")
        });
    }
    if let Some(addons) = find_container(dep, CSI_ADDONS) {
        p.check(
            flag(addons, "--node-id").as_deref() == Some("$(POD_NAME)")
                && env(addons, "POD_NAME") == Some("fieldRef:metadata.name".into())
                && flag(addons, "--stagingpath").is_none()
                && flag(addons, "--leader-election-namespace").as_deref() == Some("$(POD_NAMESPACE)"),
            || format!("{at}: the controller's csi-addons needs --node-id=$(POD_NAME) (never a node's name: no node call may reach it), --leader-election-namespace=$(POD_NAMESPACE), no --stagingpath"),
        );
    }
    if let Some(meta) = find_container(dep, SNAPSHOT_METADATA) {
        for (f, key) in [("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")] {
            let path = flag(meta, f).unwrap_or_default();
            tls_file_rule(dep, meta, Path::new(&path), SNAPSHOT_METADATA_TLS, key, p);
        }
        let svc = r.all("Service").next();
        match svc {
            None => p.push(format!(
                "[{}]: csi-snapshot-metadata runs, and no Service reaches it",
                r.name
            )),
            Some(svc) => {
                let sel = string_map(svc, &["spec", "selector"]);
                let matches = |labels: &BTreeMap<String, String>| {
                    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
                };
                p.check(
                    matches(&pod_labels(dep)) && !matches(&pod_labels(ds)),
                    || {
                        format!(
                            "{}: its selector must pick the controller's pods alone",
                            svc.at()
                        )
                    },
                );
                let target = svc
                    .y
                    .seq(&["spec", "ports"])
                    .first()
                    .and_then(|p| p.s(&["targetPort"]))
                    .unwrap_or("");
                let target = named_port(meta, target).unwrap_or_else(|| target.to_string());
                p.check(flag(meta, "--port") == Some(target.clone()), || {
                    format!(
                        "{}: targetPort {target} must be csi-snapshot-metadata's --port",
                        svc.at()
                    )
                });
            }
        }
    }
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

/// One thing a container needs granted: (apiGroup, resources, verbs,
/// whether a grant in the workload's own namespace will do).
type Need = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    bool,
);

const LEASES: Need = (
    "coordination.k8s.io",
    &["leases"],
    &["get", "create", "update"],
    true,
);

/// What each container needs, and nothing more, by its image and where it
/// runs (read from each sidecar's source at its pinned release:
/// deploy/kubernetes/base/rbac-*.yaml and the components' say where).
/// The node's driver, registrar and livenessprobe need nothing.
const NEEDS: &[(&str, Place, &[Need])] = &[
    (
        // The controller itself: the node plugin pods, and a Node's fate.
        DRIVER_IMAGE,
        Place::Controller,
        &[
            ("", &["pods"], &["list"], true),
            ("", &["nodes"], &["get"], false),
        ],
    ),
    (
        PROVISIONER,
        Place::Controller,
        &[
            (
                "",
                &["persistentvolumes"],
                &["get", "list", "watch", "create", "patch", "delete"],
                false,
            ),
            (
                "",
                &["persistentvolumeclaims"],
                &["get", "list", "watch", "update"],
                false,
            ),
            (
                "storage.k8s.io",
                &["storageclasses"],
                &["get", "list", "watch"],
                false,
            ),
            ("", &["events"], &["create", "patch"], false),
            // Topology: each node's segment, from its CSINode.
            ("", &["nodes"], &["get", "list", "watch"], false),
            (
                "storage.k8s.io",
                &["csinodes"],
                &["get", "list", "watch"],
                false,
            ),
            (
                "snapshot.storage.k8s.io",
                &["volumesnapshots"],
                &["get", "list", "watch", "update"],
                false,
            ),
            (
                "snapshot.storage.k8s.io",
                &["volumesnapshotcontents"],
                &["get", "list"],
                false,
            ),
            (
                "storage.k8s.io",
                &["volumeattributesclasses"],
                &["get"],
                false,
            ),
            (
                "storage.k8s.io",
                &["csistoragecapacities"],
                &["list", "watch", "create", "update", "delete"],
                true,
            ),
            // The capacity owner: pod, then its ReplicaSet.
            ("", &["pods"], &["get"], true),
            ("apps", &["replicasets"], &["get"], true),
            LEASES,
        ],
    ),
    (
        // The trivial handler: no ControllerPublish, no finalizers.
        ATTACHER,
        Place::Controller,
        &[
            ("", &["persistentvolumes"], &["get", "list", "watch"], false),
            (
                "storage.k8s.io",
                &["volumeattachments"],
                &["get", "list", "watch"],
                false,
            ),
            (
                "storage.k8s.io",
                &["volumeattachments/status"],
                &["patch"],
                false,
            ),
            LEASES,
        ],
    ),
    (
        RESIZER,
        Place::Controller,
        &[
            (
                "",
                &["persistentvolumes"],
                &["get", "list", "watch", "patch"],
                false,
            ),
            (
                "",
                &["persistentvolumeclaims"],
                &["get", "list", "watch"],
                false,
            ),
            ("", &["persistentvolumeclaims/status"], &["patch"], false),
            ("", &["events"], &["create", "patch"], false),
            (
                "storage.k8s.io",
                &["volumeattributesclasses"],
                &["get", "list", "watch"],
                false,
            ),
            LEASES,
        ],
    ),
    (
        SNAPSHOTTER,
        Place::Controller,
        &[
            ("", &["events"], &["create", "patch"], false),
            (
                "snapshot.storage.k8s.io",
                &["volumesnapshotclasses"],
                &["get", "list", "watch"],
                false,
            ),
            (
                "snapshot.storage.k8s.io",
                &["volumesnapshotcontents"],
                &["get", "list", "watch", "update", "patch"],
                false,
            ),
            (
                "snapshot.storage.k8s.io",
                &["volumesnapshotcontents/status"],
                &["update", "patch"],
                false,
            ),
            (
                "groupsnapshot.storage.k8s.io",
                &["volumegroupsnapshotclasses"],
                &["get", "list", "watch"],
                false,
            ),
            (
                "groupsnapshot.storage.k8s.io",
                &["volumegroupsnapshotcontents"],
                &["get", "list", "watch", "update", "patch"],
                false,
            ),
            (
                "groupsnapshot.storage.k8s.io",
                &["volumegroupsnapshotcontents/status"],
                &["update", "patch"],
                false,
            ),
            LEASES,
        ],
    ),
    (
        SNAPSHOT_METADATA,
        Place::Controller,
        &[
            (
                "cbt.storage.k8s.io",
                &["snapshotmetadataservices"],
                &["get"],
                false,
            ),
            (
                "authentication.k8s.io",
                &["tokenreviews"],
                &["create"],
                false,
            ),
            (
                "authorization.k8s.io",
                &["subjectaccessreviews"],
                &["create"],
                false,
            ),
            (
                "snapshot.storage.k8s.io",
                &[
                    "volumesnapshots",
                    "volumesnapshotcontents",
                    "volumesnapshotclasses",
                ],
                &["get", "list"],
                false,
            ),
        ],
    ),
    (
        CSI_ADDONS,
        Place::Both,
        &[
            (
                "csiaddons.openshift.io",
                &["csiaddonsnodes"],
                &["get", "create", "update", "watch"],
                true,
            ),
            ("", &["pods"], &["get"], true),
            (
                "authentication.k8s.io",
                &["tokenreviews"],
                &["create"],
                false,
            ),
            ("", &["persistentvolumes"], &["get"], false),
            // The node-stage Secret (key rotation; passed on by
            // ControllerReclaimSpace), by name.
            ("", &["secrets"], &["get"], true),
        ],
    ),
    (
        // The controller's own: its ReplicaSet (the CSIAddonsNode's name)
        // and the lease among the replicas.
        CSI_ADDONS,
        Place::Controller,
        &[("apps", &["replicasets"], &["get"], true), LEASES],
    ),
];

/// Every rule of one render's ServiceAccounts and RBAC, in turn.
fn rbac(r: &Render, p: &mut Problems) {
    namespace_rules(r, p);
    let granted = grants(r, p);
    for (pod, side, want_sa) in [
        (r.one("DaemonSet"), Place::Node, NODE_SA),
        (r.one("Deployment"), Place::Controller, CONTROLLER_SA),
    ] {
        let sa = pod_spec(pod)
            .s(&["serviceAccountName"])
            .unwrap_or("default");
        p.check(sa == want_sa, || {
            format!(
                "{}: serviceAccountName must be {want_sa}, is {sa}",
                pod.at()
            )
        });
        p.check(
            r.all("ServiceAccount")
                .any(|d| d.ns() == pod.ns() && d.name() == sa),
            || {
                format!(
                    "{}: ServiceAccount {}/{sa} is not rendered",
                    pod.at(),
                    pod.ns()
                )
            },
        );
        let rules = granted
            .get(&(pod.ns().to_string(), sa.to_string()))
            .cloned()
            .unwrap_or_default();
        exactly_what_is_needed(r, pod, side, sa, &rules, p);
    }
    // No account but these two is granted anything; the backup tool's
    // ClusterRole (bound by its operator) writes nothing but its token.
    for sa_key in granted.keys() {
        p.check(
            [NODE_SA, CONTROLLER_SA].contains(&sa_key.1.as_str()),
            || {
                format!(
                    "[{}]: ServiceAccount {}/{} is granted rules",
                    r.name, sa_key.0, sa_key.1
                )
            },
        );
    }
    for role in r
        .all("ClusterRole")
        .filter(|d| d.name().ends_with("-client"))
    {
        for rule in role.y.seq(&["rules"]) {
            let res = rule.strs(&["resources"]);
            for v in rule.strs(&["verbs"]) {
                p.check(
                    ["get", "list", "watch"].contains(&v.as_str())
                        || (v == "create" && res == ["serviceaccounts/token"]),
                    || {
                        format!(
                            "{}: a client role may only read, and mint its token ({v} on {res:?})",
                            role.at()
                        )
                    },
                );
            }
        }
    }
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
        "VolumeGroupSnapshotClass",
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

/// Least privilege, both ways: what each container of `pod` needs
/// ([`NEEDS`]) is granted to its ServiceAccount `sa` (cluster-wide, or in
/// its namespace where that will do), and nothing else is: no grant that
/// no container of that pod needs, none cluster-wide where the namespace
/// would do, no wildcard; a Secret only by name.
fn exactly_what_is_needed(
    r: &Render,
    pod: &Doc,
    side: Place,
    sa: &str,
    rules: &BTreeSet<Grant>,
    p: &mut Problems,
) {
    let ns = pod.ns();
    let needs: Vec<&Need> = NEEDS
        .iter()
        .filter(|(repo, place, _)| place.runs_on(side) && find_container(pod, repo).is_some())
        .flat_map(|(_, _, list)| list.iter())
        .collect();
    for (group, resources, verbs, namespaced) in &needs {
        for res in *resources {
            for v in *verbs {
                let ok = rules.iter().any(|(g, rr, vv, scope)| {
                    g == group
                        && rr == res
                        && vv == v
                        && (scope.is_empty() || (*namespaced && scope == ns))
                });
                p.check(ok, || {
                    format!(
                        "[{}] ServiceAccount {ns}/{sa}: needs `{v}` on {res} ({})",
                        r.name,
                        if group.is_empty() { "core" } else { group }
                    )
                });
            }
        }
    }
    for (g, res, v, scope) in rules {
        let what = format!(
            "[{}] {ns}/{sa}: `{v}` on {res} ({g}) {}",
            r.name,
            if scope.is_empty() {
                "cluster-wide"
            } else {
                "in its namespace"
            }
        );
        p.check(g != "*" && res != "*" && v != "*", || {
            format!("{what}: no wildcards")
        });
        let covering: Vec<&&Need> = needs
            .iter()
            .filter(|(gg, rr, vv, _)| {
                gg == g && rr.contains(&res.as_str()) && vv.contains(&v.as_str())
            })
            .collect();
        p.check(!covering.is_empty(), || {
            format!("{what}: no container of {} needs it", pod.at())
        });
        p.check(
            !scope.is_empty() || covering.iter().any(|n| !n.3) || covering.is_empty(),
            || format!("{what}: a grant in the namespace would do"),
        );
    }
    // Secrets: by name, in the namespace (rbac-csi-addons.yaml).
    for role in r.all("Role") {
        for rule in role.y.seq(&["rules"]) {
            if rule.strs(&["resources"]).iter().any(|x| x == "secrets") {
                p.check(
                    !rule.strs(&["resourceNames"]).is_empty() && rule.strs(&["verbs"]) == ["get"],
                    || format!("{}: Secrets only `get`, by name", role.at()),
                );
            }
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
    dep: &'a Doc,
    /// `[render] Deployment/name`: where a problem is.
    at: String,
    /// The controller capabilities the driver (and the controller, which
    /// advertises the same) advertises with the rendered config.
    ctrl: Vec<Ctrl>,
    /// The plugin capabilities ([`plugin_capabilities`]).
    plugin: &'a BTreeSet<String>,
    csidriver: &'a Doc,
}

impl RenderCaps<'_> {
    /// Whether either workload runs the image `repo`.
    fn runs(&self, repo: &str) -> bool {
        find_container(self.dep, repo).is_some() || find_container(self.ds, repo).is_some()
    }
    /// Whether the CSIDriver's spec.`k` is true.
    fn spec(&self, k: &str) -> bool {
        self.csidriver.y.s(&["spec", k]) == Some("true")
    }
}

/// Whether the CSI-Addons identity of `sides` names CONTROLLER_SERVICE.
fn addons_controller(sides: thinpool_csi::grpc::addons::Sides) -> bool {
    thinpool_csi::grpc::addons::capabilities(sides)
        .iter()
        .any(|c| {
            matches!(&c.r#type, Some(AddonsCap::Service(s))
                if s.r#type == AddonsService::ControllerService as i32)
        })
}

#[test]
fn capabilities_agree_with_the_sidecars() {
    use thinpool_csi::grpc::addons::Sides;
    let plugin = plugin_capabilities();
    // The controller's CSI-Addons identity names CONTROLLER_SERVICE (the
    // csi-addons lease is its); a node of a cluster's does not.
    assert!(addons_controller(Sides::Controller) && !addons_controller(Sides::Node));
    let readme = read(&format!("{DEPLOY}/README.md"));
    let mut p = Problems::default();
    let mut snapshotter_somewhere = false;
    for r in renders() {
        let (ds, dep) = (r.one("DaemonSet"), r.one("Deployment"));
        let (cfg, _) = configmap_config(r, ds);
        let rc = RenderCaps {
            r,
            ds,
            dep,
            at: dep.at(),
            ctrl: thinpool_csi::grpc::controller::capabilities(cfg.controller_expansion),
            plugin: &plugin,
            csidriver: r.one("CSIDriver"),
        };
        controller_sidecar_rules(&rc, &mut p);
        expansion_rules(&rc, &mut p);
        snapshotter_somewhere |= rc.runs(SNAPSHOTTER);
        snapshot_rules(&rc, &mut p);
        csi_addons_rules(&rc, &cfg, &mut p);
    }
    p.check(
        !thinpool_csi::grpc::controller::CAPABILITIES.contains(&Ctrl::CreateDeleteSnapshot)
            || snapshotter_somewhere,
        || "CREATE_DELETE_SNAPSHOT is advertised, and no render runs csi-snapshotter".to_string(),
    );
    // The per-node design's limits are gone from the README, and the
    // images without a digest are named there.
    for gone in ["## Known limits", "Socket-only", "socket-only"] {
        p.check(!readme.contains(gone), || {
            format!("deploy/kubernetes/README.md still says {gone:?}")
        });
    }
    for repo in UNPINNED {
        p.check(readme.contains(repo), || {
            format!(
                "deploy/kubernetes/README.md must name {repo} among the images pinned by tag only"
            )
        });
    }
    p.finish("capabilities against the sidecars");
}

/// The controller sidecars against the controller capabilities: every
/// one needs CONTROLLER_SERVICE; the provisioner runs exactly when
/// CREATE_DELETE_VOLUME is advertised, with topology (strict: the pod's
/// node); the attacher always, with attachRequired (CSI-Addons finds a
/// volume's node in the VolumeAttachment), and never with
/// LIST_VOLUMES_PUBLISHED_NODES without ControllerPublish; GET_CAPACITY
/// exactly with --enable-capacity and storageCapacity.
fn controller_sidecar_rules(rc: &RenderCaps, p: &mut Problems) {
    let (ctrl, plugin, at) = (&rc.ctrl, rc.plugin, &rc.at);
    for repo in [PROVISIONER, ATTACHER, RESIZER, SNAPSHOTTER] {
        p.check(
            !rc.runs(repo) || plugin.contains("ControllerService"),
            || format!("{at}: {repo} runs, the driver advertises no CONTROLLER_SERVICE"),
        );
    }
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
        format!("{at}: strict topology needs VOLUME_ACCESSIBILITY_CONSTRAINTS (the controller forwards CreateVolume to the node its topology names)")
    });
    p.check(rc.runs(ATTACHER) && rc.spec("attachRequired"), || {
        format!("{at}: csi-attacher must run and CSIDriver attachRequired be true: CSI-Addons finds a volume's node in its VolumeAttachment")
    });
    let publish = ctrl.contains(&Ctrl::PublishUnpublishVolume);
    p.check(
        publish || !ctrl.contains(&Ctrl::ListVolumesPublishedNodes),
        || format!("{at}: LIST_VOLUMES_PUBLISHED_NODES without PUBLISH_UNPUBLISH_VOLUME"),
    );
    let capacity = ctrl.contains(&Ctrl::GetCapacity);
    let enabled = find_container(rc.dep, PROVISIONER)
        .and_then(|c| flag(c, "--enable-capacity"))
        .as_deref()
        == Some("true");
    p.check(capacity == enabled && capacity == rc.spec("storageCapacity"), || {
        format!("{at}: GET_CAPACITY advertised {capacity}, --enable-capacity {enabled}, CSIDriver storageCapacity {}", rc.spec("storageCapacity"))
    });
}

/// Expansion: the resizer runs exactly when something expands or
/// modifies; controller expansion is on (an unstaged volume grows through
/// the controller) and needs the plugin's VolumeExpansion; the class
/// allows expansion exactly when the driver expands.
fn expansion_rules(rc: &RenderCaps, p: &mut Problems) {
    let (ctrl, plugin, at) = (&rc.ctrl, rc.plugin, &rc.at);
    let node = thinpool_csi::grpc::node::CAPABILITIES;
    let ctrl_expand = ctrl.contains(&Ctrl::ExpandVolume);
    p.check(ctrl_expand, || {
        format!("{at}: controller EXPAND_VOLUME must be advertised: the central resizer grows unstaged volumes through the controller")
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

/// Snapshots: the snapshotter only where the driver cuts them; a
/// VolumeSnapshotClass exactly with a snapshotter; a
/// VolumeGroupSnapshotClass exactly with one that has the group gate, for
/// a driver with the GroupController; csi-snapshot-metadata only for a
/// driver and controller that serve SnapshotMetadata. The
/// SnapshotMetadataService is scripts/cluster-tls.sh's, never rendered.
fn snapshot_rules(rc: &RenderCaps, p: &mut Problems) {
    let (r, at) = (rc.r, &rc.at);
    let snaps = rc.ctrl.contains(&Ctrl::CreateDeleteSnapshot);
    p.check(!rc.runs(SNAPSHOTTER) || snaps, || {
        format!("{at}: csi-snapshotter runs, the driver advertises no CREATE_DELETE_SNAPSHOT")
    });
    p.check(
        r.all("VolumeSnapshotClass").next().is_some() == rc.runs(SNAPSHOTTER),
        || {
            format!(
                "[{}]: a VolumeSnapshotClass exactly where csi-snapshotter runs",
                r.name
            )
        },
    );
    let groups = find_container(rc.dep, SNAPSHOTTER)
        .and_then(|c| flag(c, "--feature-gates"))
        .is_some_and(|g| g.contains("CSIVolumeGroupSnapshot=true"));
    p.check(
        r.all("VolumeGroupSnapshotClass").next().is_some() == groups
            && (!groups || rc.plugin.contains("GroupControllerService")),
        || format!("[{}]: a VolumeGroupSnapshotClass exactly where csi-snapshotter has the group gate, for a driver with GROUP_CONTROLLER_SERVICE", r.name),
    );
    if rc.runs(SNAPSHOT_METADATA) {
        let cfg = controller_config(r, rc.dep);
        p.check(
            rc.plugin.contains("SnapshotMetadataService") && cfg.snapshot_metadata,
            || format!("{at}: csi-snapshot-metadata runs, and the driver or the controller does not serve SnapshotMetadata"),
        );
    }
    p.check(r.all("SnapshotMetadataService").next().is_none(), || {
        format!("[{}]: the SnapshotMetadataService carries a CA made at install time: scripts/cluster-tls.sh writes it", r.name)
    });
}

/// CSI-Addons: each csi-addons sidecar talks to a CSI-Addons socket its
/// workload serves.
fn csi_addons_rules(rc: &RenderCaps, node_cfg: &Config, p: &mut Problems) {
    let at = &rc.at;
    if find_container(rc.ds, CSI_ADDONS).is_some() {
        p.check(!node_cfg.csi_addons_endpoint.is_empty(), || {
            format!("{at}: csi-addons runs on the node, which serves no CSI-Addons socket")
        });
    }
    if find_container(rc.dep, CSI_ADDONS).is_some() {
        let cfg = controller_config(rc.r, rc.dep);
        p.check(!cfg.csi_addons_endpoint.is_empty(), || {
            format!("{at}: csi-addons runs in the controller, which serves no CSI-Addons socket")
        });
    }
}

/// scripts/cluster-tls.sh makes what the renders mount: the two channel
/// Secrets with the keys the pods take, the snapshot-metadata sidecar's,
/// and the SnapshotMetadataService named after the driver, whose address
/// is the rendered Service's.
#[test]
fn the_certificate_script_makes_what_the_pods_mount() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(root().join("scripts/cluster-tls.sh"))
        .arg(&dir)
        .args(["--days", "2"])
        .output()
        .expect("scripts/cluster-tls.sh runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secrets = parse_yaml(
        "secrets.yaml",
        &std::fs::read_to_string(dir.join("secrets.yaml")).unwrap(),
    )
    .unwrap();
    let meta = parse_yaml(
        "snapshot-metadata.yaml",
        &std::fs::read_to_string(dir.join("snapshot-metadata.yaml")).unwrap(),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut p = Problems::default();
    // (Secret, keys) the script writes.
    let made: BTreeMap<String, BTreeSet<String>> = secrets
        .iter()
        .chain(&meta)
        .filter(|y| y.s(&["kind"]) == Some("Secret"))
        .map(|y| {
            let keys = match y.get("data") {
                Some(Y::Map(m)) => m.iter().map(|(k, _)| k.clone()).collect(),
                _ => BTreeSet::new(),
            };
            (y.s(&["metadata", "name"]).unwrap_or("").to_string(), keys)
        })
        .collect();
    for r in renders() {
        let ns = r.one("Namespace").name();
        for pod in [r.one("DaemonSet"), r.one("Deployment")] {
            for v in pod_spec(pod).seq(&["volumes"]) {
                let mut used: Vec<(&str, Vec<String>)> = Vec::new();
                if let Some(n) = v.s(&["secret", "secretName"]) {
                    used.push((n, vec!["tls.crt".into(), "tls.key".into()]));
                }
                for src in v.seq(&["projected", "sources"]) {
                    if let Some(n) = src.s(&["secret", "name"]) {
                        let keys = src
                            .seq(&["secret", "items"])
                            .iter()
                            .filter_map(|i| i.s(&["key"]).map(str::to_string))
                            .collect();
                        used.push((n, keys));
                    }
                }
                for (name, keys) in used {
                    let got = made.get(name);
                    p.check(got.is_some_and(|k| keys.iter().all(|x| k.contains(x))), || {
                        format!("{}: mounts {keys:?} of Secret {name}, which scripts/cluster-tls.sh makes as {got:?}", pod.at())
                    });
                }
            }
        }
        let svc = r.all("Service").next();
        let sms = meta
            .iter()
            .find(|y| y.s(&["kind"]) == Some("SnapshotMetadataService"));
        match (svc, sms) {
            (Some(svc), Some(sms)) => {
                let port = svc
                    .y
                    .seq(&["spec", "ports"])
                    .first()
                    .and_then(|p| p.s(&["port"]))
                    .unwrap_or("");
                let want = format!("{}.{ns}:{port}", svc.name());
                p.check(sms.s(&["spec", "address"]) == Some(want.as_str()), || {
                    format!(
                        "the script's SnapshotMetadataService address {:?} must be {want}",
                        sms.s(&["spec", "address"])
                    )
                });
                p.check(
                    sms.s(&["metadata", "name"]) == Some(r.one("CSIDriver").name()),
                    || "the SnapshotMetadataService must be named after the driver".to_string(),
                );
                p.check(
                    sms.s(&["spec", "audience"]).is_some_and(|a| !a.is_empty()),
                    || "the SnapshotMetadataService needs an audience".to_string(),
                );
            }
            (None, _) => {}
            (Some(_), None) => {
                p.push("scripts/cluster-tls.sh writes no SnapshotMetadataService".into())
            }
        }
    }
    p.finish("scripts/cluster-tls.sh against the renders");
}
