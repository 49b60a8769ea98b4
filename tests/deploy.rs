//! Static checks of the Kubernetes manifests in deploy/kubernetes. Nothing
//! here needs a container engine, a cluster or root: the files are parsed
//! (a small YAML subset parser below, enough for these manifests) and
//! checked against each other, against the repository and against the
//! driver's own configuration parser. The Dockerfile, .dockerignore, the
//! Kubernetes schemas and the sidecar flags are checked with real parsers
//! by scripts/check_packaging.py.
//!
//! Run: `cargo test --test deploy`

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use thinpool_csi::config::{parse_endpoint, Config, UdevMode};

// ---------------------------------------------------------------------------
// What the packaging must contain.

/// Every container of the node DaemonSet, by image repository.
const SIDECAR_IMAGES: &[&str] = &[
    "registry.k8s.io/sig-storage/csi-node-driver-registrar",
    "registry.k8s.io/sig-storage/csi-provisioner",
    "registry.k8s.io/sig-storage/csi-attacher",
    "registry.k8s.io/sig-storage/csi-resizer",
    "registry.k8s.io/sig-storage/csi-snapshotter",
    "quay.io/csiaddons/k8s-sidecar",
];
/// The driver's own image (built from the Dockerfile), tagged with the
/// crate version.
const DRIVER_IMAGE: &str = "thinpool-csi";
/// Where the kubelet keeps plugins, pods and registrations.
const KUBELET_DIR: &str = "/var/lib/kubelet";

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
// A YAML subset: block mappings and sequences, plain/quoted scalars, flow
// sequences and mappings of scalars, literal/folded block scalars, comments
// and `---` document separators. Anything else is an error naming the line.

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
                scalar(rest).map_err(|e| self.err(no, e))
            }
        }
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
                self.i += 1;
                v.push(scalar(rest).map_err(|e| self.err(no, e))?);
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
    assert!(parse_yaml("t", "a: 1\n  b: 2\n").is_err());
    assert!(parse_yaml("t", "a: &x 1\n").is_err());
    assert!(parse_yaml("t", "a: 1\na: 2\n").is_err());
}

// ---------------------------------------------------------------------------
// The manifests.

struct Doc {
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
        format!("{} {}/{}", self.file, self.kind(), self.name())
    }
}

const DEPLOY: &str = "deploy/kubernetes";

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// Every document of every YAML file under deploy/kubernetes, with the
/// file it came from (relative to deploy/kubernetes).
fn all_docs() -> Vec<Doc> {
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

/// The documents kustomization.yaml installs.
fn installed_docs() -> Vec<Doc> {
    let listed = kustomize_resources();
    all_docs()
        .into_iter()
        .filter(|d| listed.contains(&d.file))
        .collect()
}

fn kustomize_resources() -> Vec<String> {
    let text = read(&format!("{DEPLOY}/kustomization.yaml"));
    let docs = parse_yaml("kustomization.yaml", &text).unwrap();
    assert_eq!(docs.len(), 1, "kustomization.yaml: one document expected");
    docs[0].strs(&["resources"])
}

fn one<'a>(docs: &'a [Doc], kind: &str) -> &'a Doc {
    let found: Vec<&Doc> = docs.iter().filter(|d| d.kind() == kind).collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind} in {DEPLOY}/kustomization.yaml's resources, found {}",
        found.len()
    );
    found[0]
}

/// The driver configuration of the ConfigMap, through the driver's own
/// parser, with the file name the DaemonSet passes to --config.
fn configmap_config(docs: &[Doc], ds: &Doc) -> (Config, String) {
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
    let cm = docs
        .iter()
        .find(|d| d.kind() == "ConfigMap" && d.name() == cm_name && d.ns() == ds.ns())
        .unwrap_or_else(|| panic!("ConfigMap {}/{cm_name} is not installed", ds.ns()));
    let text =
        cm.y.s(&["data", key])
            .unwrap_or_else(|| panic!("{}: no data key {key:?}", cm.at()));
    let cfg = Config::parse(text)
        .unwrap_or_else(|e| panic!("{}: the driver refuses {key}: {e}", cm.at()));
    (cfg, path)
}

fn pod_spec(ds: &Doc) -> &Y {
    ds.y.path(&["spec", "template", "spec"])
        .unwrap_or_else(|| panic!("{}: no spec.template.spec", ds.at()))
}

fn containers(ds: &Doc) -> &[Y] {
    pod_spec(ds).seq(&["containers"])
}

fn image_repo(image: &str) -> &str {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

fn container_by_image<'a>(ds: &'a Doc, repo: &str) -> &'a Y {
    containers(ds)
        .iter()
        .find(|c| c.s(&["image"]).map(image_repo) == Some(repo))
        .unwrap_or_else(|| panic!("{}: no container runs {repo}", ds.at()))
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

/// `--flag=value` of a container's args.
fn flag<'a>(c: &'a Y, name: &str) -> Option<&'a str> {
    let prefix = format!("{name}=");
    c.seq(&["args"])
        .iter()
        .filter_map(Y::str)
        .find_map(|a| a.strip_prefix(prefix.as_str()))
}

fn cname(c: &Y) -> &str {
    c.s(&["name"]).unwrap_or("?")
}

fn crate_version() -> String {
    read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_string())
        .expect("Cargo.toml has a version")
}

#[test]
fn manifests_parse_and_are_all_installed() {
    let docs = all_docs();
    let mut p = Problems::default();
    let listed = kustomize_resources();
    let base = root().join(DEPLOY);
    for r in &listed {
        p.check(base.join(r).is_file(), || {
            format!("kustomization.yaml lists {r}, which does not exist in {DEPLOY}")
        });
    }
    let files: BTreeSet<&str> = docs.iter().map(|d| d.file.as_str()).collect();
    for f in files {
        let top_level = !f.contains('/');
        p.check(
            !top_level || f == "kustomization.yaml" || listed.iter().any(|r| r == f),
            || format!("{DEPLOY}/{f} is not listed in kustomization.yaml's resources (move examples to examples/)"),
        );
    }
    // Kustomizations and kind's cluster config are no API objects.
    for d in docs
        .iter()
        .filter(|d| d.kind() != "Kustomization" && d.kind() != "Cluster")
    {
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
    p.finish("manifests");
}

#[test]
fn csidriver_storageclass_and_snapshotclass_name_the_driver() {
    let docs = installed_docs();
    let ds = one(&docs, "DaemonSet");
    let (cfg, _) = configmap_config(&docs, ds);
    let defaults = Config::load(&root().join("config/defaults.toml")).unwrap();
    let mut p = Problems::default();
    p.check(cfg.driver_name == defaults.driver_name, || {
        format!(
            "the ConfigMap's driver_name {:?} differs from config/defaults.toml's {:?}",
            cfg.driver_name, defaults.driver_name
        )
    });
    let d = one(&docs, "CSIDriver");
    p.check(d.name() == cfg.driver_name, || {
        format!(
            "{}: the CSIDriver must be named after driver_name {:?}",
            d.at(),
            cfg.driver_name
        )
    });
    for (key, want) in [
        ("attachRequired", "true"),
        ("podInfoOnMount", "false"),
        ("storageCapacity", "true"),
        ("fsGroupPolicy", "File"),
    ] {
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

    let sc = one(&docs, "StorageClass");
    p.check(sc.y.s(&["provisioner"]) == Some(&cfg.driver_name), || {
        format!("{}: provisioner must be {:?}", sc.at(), cfg.driver_name)
    });
    p.check(
        sc.y.s(&["volumeBindingMode"]) == Some("WaitForFirstConsumer"),
        || format!("{}: volumeBindingMode must be WaitForFirstConsumer (the volume lives on the pod's node)", sc.at()),
    );
    p.check(sc.y.s(&["allowVolumeExpansion"]) == Some("true"), || {
        format!("{}: allowVolumeExpansion must be true", sc.at())
    });
    if let Some(Y::Map(params)) = sc.y.get("parameters") {
        for (k, _) in params {
            p.check(
                k.starts_with("csi.storage.k8s.io/") || k == "volumeGroup" || k == "thinPool",
                || format!("{}: the driver refuses the parameter {k:?}", sc.at()),
            );
        }
    }
    let vsc = one(&docs, "VolumeSnapshotClass");
    p.check(vsc.y.s(&["driver"]) == Some(&cfg.driver_name), || {
        format!("{}: driver must be {:?}", vsc.at(), cfg.driver_name)
    });
    for d in all_docs() {
        if let Some(sc_name) = d.y.s(&["spec", "storageClassName"]) {
            p.check(
                docs.iter()
                    .any(|s| s.kind() == "StorageClass" && s.name() == sc_name),
                || format!("{}: StorageClass {sc_name:?} is not installed", d.at()),
            );
        }
    }
    p.finish("CSIDriver, StorageClass, VolumeSnapshotClass");
}

#[test]
fn node_daemonset_runs_the_driver_and_every_sidecar() {
    let docs = installed_docs();
    let ds = one(&docs, "DaemonSet");
    let (cfg, config_path) = configmap_config(&docs, ds);
    let mut p = Problems::default();

    // Images: the driver and the six sidecars, nothing else, all pinned.
    let images: Vec<&str> = containers(ds)
        .iter()
        .map(|c| c.s(&["image"]).unwrap_or(""))
        .collect();
    let repos: BTreeSet<&str> = images.iter().map(|i| image_repo(i)).collect();
    let want: BTreeSet<&str> = SIDECAR_IMAGES
        .iter()
        .copied()
        .chain([DRIVER_IMAGE])
        .collect();
    p.check(repos == want && images.len() == want.len(), || {
        format!(
            "{}: containers must run exactly {want:?}, run {images:?}",
            ds.at()
        )
    });
    for img in &images {
        let tag = img.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        p.check(
            tag.starts_with('v') && tag[1..].split('.').count() == 3
                || image_repo(img) == DRIVER_IMAGE,
            || {
                format!(
                    "{}: image {img:?} must be pinned to a vX.Y.Z release tag",
                    ds.at()
                )
            },
        );
    }
    let version = crate_version();
    let driver_image = format!("{DRIVER_IMAGE}:{version}");
    p.check(images.contains(&driver_image.as_str()), || {
        format!(
            "{}: the driver image must be {driver_image} (the crate version)",
            ds.at()
        )
    });

    let driver = driver_container(ds);
    p.check(
        driver.s(&["securityContext", "privileged"]) == Some("true"),
        || format!("{}: the driver container must be privileged", ds.at()),
    );

    // Host paths the driver needs, and how they are mounted.
    for (path, propagation, read_only) in [
        (KUBELET_DIR, Some("Bidirectional"), false),
        ("/dev", Some("Bidirectional"), false),
        ("/sys", None, false),
        ("/lib/modules", None, true),
        ("/run/lvm", None, false),
        ("/run/lock/lvm", None, false),
        ("/etc/lvm", None, false),
    ] {
        match mount_at(ds, driver, path) {
            None => p.push(format!("{}: the driver does not mount {path}", ds.at())),
            Some((m, host)) => {
                p.check(host == Some(path), || {
                    format!(
                        "{}: {path} in the driver must be the host's {path}, is {host:?}",
                        ds.at()
                    )
                });
                p.check(m.s(&["mountPropagation"]) == propagation, || {
                    format!(
                        "{}: {path} needs mountPropagation {propagation:?}, has {:?}",
                        ds.at(),
                        m.s(&["mountPropagation"])
                    )
                });
                let ro = m.s(&["readOnly"]) == Some("true");
                p.check(ro == read_only, || {
                    format!("{}: {path} readOnly must be {read_only}", ds.at())
                });
            }
        }
    }
    // Mounts that are not Bidirectional must not be nested under one that
    // is, or the propagation would be lost; and only the driver may use
    // Bidirectional (it needs privilege).
    for c in containers(ds) {
        for m in c.seq(&["volumeMounts"]) {
            if m.s(&["mountPropagation"]) == Some("Bidirectional") {
                p.check(std::ptr::eq(c, driver), || {
                    format!(
                        "{}: only the privileged driver may use Bidirectional ({})",
                        ds.at(),
                        cname(c)
                    )
                });
            }
        }
    }

    // state_dir is on the host, at the same path (it must survive).
    let state_mount = driver
        .seq(&["volumeMounts"])
        .iter()
        .filter_map(|m| {
            let mp = m.s(&["mountPath"])?;
            cfg.state_dir.starts_with(mp).then_some((m, mp))
        })
        .max_by_key(|(_, mp)| mp.len());
    match state_mount {
        None => p.push(format!(
            "{}: state_dir {} is not on a mounted volume (it must survive restarts)",
            ds.at(),
            cfg.state_dir.display()
        )),
        Some((m, mp)) => {
            let host = pod_volume(ds, m.s(&["name"]).unwrap()).s(&["hostPath", "path"]);
            p.check(host == Some(mp) && mp != "/" && mp != KUBELET_DIR, || {
                format!(
                    "{}: state_dir {} must be on its own hostPath at the same path, is {mp} from {host:?}",
                    ds.at(),
                    cfg.state_dir.display()
                )
            });
        }
    }
    p.check(
        cfg.allowed_roots
            .iter()
            .any(|r| r == Path::new(KUBELET_DIR)),
        || {
            format!(
                "allowed_roots must contain {KUBELET_DIR}: {:?}",
                cfg.allowed_roots
            )
        },
    );
    p.check(cfg.udev == UdevMode::Off, || {
        "the ConfigMap must say udev = \"off\": no udevd runs in the container".to_string()
    });

    // The driver's arguments and environment.
    let args = driver.strs(&["args"]);
    p.check(
        args.windows(2)
            .any(|w| w[0] == "--node-id" && w[1] == "$(NODE_NAME)"),
        || {
            format!(
                "{}: the driver needs `--node-id $(NODE_NAME)`, has {args:?}",
                ds.at()
            )
        },
    );
    let env = |c: &Y, name: &str| -> Option<String> {
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
    };
    let csi_endpoint = env(driver, "CSI_ENDPOINT").unwrap_or_default();
    let csi_sock = parse_endpoint(&csi_endpoint)
        .unwrap_or_else(|e| panic!("{}: CSI_ENDPOINT {csi_endpoint:?}: {e}", ds.at()));
    let addons_sock = parse_endpoint(&cfg.csi_addons_endpoint)
        .unwrap_or_else(|e| panic!("csi_addons_endpoint {:?}: {e}", cfg.csi_addons_endpoint));
    p.check(
        parse_endpoint(&cfg.endpoint).ok().as_deref() == Some(csi_sock.as_path()),
        || {
            format!(
                "the ConfigMap's endpoint {:?} and CSI_ENDPOINT {csi_endpoint:?} disagree",
                cfg.endpoint
            )
        },
    );
    p.check(config_path.starts_with('/'), || {
        format!("--config {config_path} must be absolute")
    });

    // The socket directory: the kubelet's plugin dir for this driver, the
    // same for every container.
    let sock_dir = csi_sock.parent().unwrap().to_str().unwrap().to_string();
    let plugin_dir = format!("{KUBELET_DIR}/plugins/{}", cfg.driver_name);
    for c in containers(ds) {
        match mount_at(ds, c, &sock_dir) {
            None => p.push(format!(
                "{}: {} does not mount the socket directory {sock_dir}",
                ds.at(),
                cname(c)
            )),
            Some((_, host)) => p.check(host == Some(plugin_dir.as_str()), || {
                format!(
                    "{}: {sock_dir} of {} must be the host's {plugin_dir}, is {host:?}",
                    ds.at(),
                    cname(c)
                )
            }),
        }
        if !std::ptr::eq(c, driver) {
            let want = if image_repo(c.s(&["image"]).unwrap_or("")) == SIDECAR_IMAGES[5] {
                ("--csi-addons-address", cfg.csi_addons_endpoint.clone())
            } else {
                ("--csi-address", csi_sock.display().to_string())
            };
            let got = flag(c, want.0);
            p.check(got.map(socket_path) == Some(socket_path(&want.1)), || {
                format!(
                    "{}: {} needs {}={}, has {got:?}",
                    ds.at(),
                    cname(c),
                    want.0,
                    want.1
                )
            });
        }
        // Every $(VAR) in args is defined in the container's env.
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
                        "{}: {} uses $({var}) without defining it in env",
                        ds.at(),
                        cname(c)
                    )
                });
                rest = &rest[end..];
            }
        }
        // Every mount has a volume.
        for m in c.seq(&["volumeMounts"]) {
            let n = m.s(&["name"]).unwrap_or("");
            p.check(
                pod_spec(ds)
                    .seq(&["volumes"])
                    .iter()
                    .any(|v| v.s(&["name"]) == Some(n)),
                || format!("{}: {} mounts undefined volume {n:?}", ds.at(), cname(c)),
            );
        }
    }
    p.check(addons_sock.parent() == csi_sock.parent(), || {
        format!(
            "csi_addons_endpoint {} must be in the shared socket directory {sock_dir}",
            addons_sock.display()
        )
    });

    // node-driver-registrar tells the kubelet the host path of the socket.
    let reg = container_by_image(ds, SIDECAR_IMAGES[0]);
    let want_reg = format!(
        "{plugin_dir}/{}",
        csi_sock.file_name().unwrap().to_str().unwrap()
    );
    p.check(
        flag(reg, "--kubelet-registration-path") == Some(want_reg.as_str()),
        || {
            format!(
                "{}: node-driver-registrar needs --kubelet-registration-path={want_reg}",
                ds.at()
            )
        },
    );
    match mount_at(ds, reg, "/registration") {
        Some((_, host)) => p.check(
            host == Some(format!("{KUBELET_DIR}/plugins_registry").as_str()),
            || {
                format!(
                    "{}: /registration must be the host's {KUBELET_DIR}/plugins_registry",
                    ds.at()
                )
            },
        ),
        None => p.push(format!(
            "{}: node-driver-registrar does not mount /registration",
            ds.at()
        )),
    }

    // Distributed provisioning with capacity tracking.
    let prov = container_by_image(ds, SIDECAR_IMAGES[1]);
    for (f, v) in [
        ("--node-deployment", Some("true")),
        ("--enable-capacity", Some("true")),
        ("--capacity-ownerref-level", None),
    ] {
        let got = flag(prov, f);
        p.check(got.is_some() && (v.is_none() || got == v), || {
            format!(
                "{}: csi-provisioner needs {f}{}",
                ds.at(),
                v.map(|v| format!("={v}")).unwrap_or_default()
            )
        });
    }
    for (var, field) in [
        ("NODE_NAME", "spec.nodeName"),
        ("NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        p.check(env(prov, var) == Some(format!("fieldRef:{field}")), || {
            format!("{}: csi-provisioner needs env {var} from {field}", ds.at())
        });
    }
    // Distributed snapshotting.
    let snap = container_by_image(ds, SIDECAR_IMAGES[4]);
    p.check(flag(snap, "--node-deployment") == Some("true"), || {
        format!("{}: csi-snapshotter needs --node-deployment=true", ds.at())
    });
    p.check(
        env(snap, "NODE_NAME") == Some("fieldRef:spec.nodeName".into()),
        || {
            format!(
                "{}: csi-snapshotter needs env NODE_NAME from spec.nodeName",
                ds.at()
            )
        },
    );
    // Per-node sidecars must not elect one leader for the cluster.
    for repo in &SIDECAR_IMAGES[..5] {
        let c = container_by_image(ds, repo);
        let elects = c
            .strs(&["args"])
            .iter()
            .any(|a| a == "--leader-election" || a == "--leader-election=true");
        p.check(!elects, || {
            format!(
                "{}: {} must not use leader election: it serves its node only",
                ds.at(),
                cname(c)
            )
        });
    }
    // csi-addons: same node id as the driver; staging path under the
    // kubelet directory.
    let addons = container_by_image(ds, SIDECAR_IMAGES[5]);
    p.check(flag(addons, "--node-id") == Some("$(NODE_NAME)"), || {
        format!(
            "{}: csi-addons needs --node-id=$(NODE_NAME), the driver's node id",
            ds.at()
        )
    });
    let staging = flag(addons, "--stagingpath").unwrap_or("");
    p.check(
        Path::new(staging).starts_with(KUBELET_DIR) && !staging.contains(".."),
        || {
            format!(
                "{}: csi-addons --stagingpath {staging:?} must be under {KUBELET_DIR}",
                ds.at()
            )
        },
    );
    for f in ["--controller-port", "--pod", "--namespace", "--pod-uid"] {
        p.check(flag(addons, f).is_some(), || {
            format!(
                "{}: csi-addons needs {f} (the CSI-Addons controller connects to it)",
                ds.at()
            )
        });
    }
    p.finish("node DaemonSet");
}

/// (namespace, name) of a ServiceAccount.
type ServiceAccountKey = (String, String);
/// (apiGroup, resource, verb, namespace of a RoleBinding or "" for cluster-wide).
type Grant = (String, String, String, String);

#[test]
fn service_accounts_and_rbac_are_consistent() {
    let docs = installed_docs();
    let mut p = Problems::default();
    let namespaces: BTreeSet<&str> = docs
        .iter()
        .filter(|d| d.kind() == "Namespace")
        .map(|d| d.name())
        .collect();
    let cluster_scoped = [
        "Namespace",
        "CSIDriver",
        "ClusterRole",
        "ClusterRoleBinding",
        "StorageClass",
        "VolumeSnapshotClass",
    ];
    for d in &docs {
        if cluster_scoped.contains(&d.kind()) {
            p.check(d.ns().is_empty(), || {
                format!("{}: cluster-scoped, has a namespace", d.at())
            });
        } else {
            p.check(namespaces.contains(d.ns()), || {
                format!("{}: namespace {:?} is not installed", d.at(), d.ns())
            });
        }
    }
    let sas: BTreeSet<(&str, &str)> = docs
        .iter()
        .filter(|d| d.kind() == "ServiceAccount")
        .map(|d| (d.ns(), d.name()))
        .collect();
    for d in docs.iter().filter(|d| d.kind() == "DaemonSet") {
        let sa = pod_spec(d).s(&["serviceAccountName"]).unwrap_or("default");
        p.check(sas.contains(&(d.ns(), sa)), || {
            format!(
                "{}: ServiceAccount {}/{sa} is not installed",
                d.at(),
                d.ns()
            )
        });
    }
    // Every binding names an installed role and service account.
    let roles: BTreeSet<(&str, &str, &str)> = docs
        .iter()
        .filter(|d| d.kind() == "Role" || d.kind() == "ClusterRole")
        .map(|d| (d.kind(), d.ns(), d.name()))
        .collect();
    // Rules each ServiceAccount gets: (apiGroup, resource, verb, namespace or "").
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
            format!("{}: roleRef {kind}/{name} is not installed", b.at())
        });
        let role = docs
            .iter()
            .find(|d| d.kind() == kind && d.ns() == ns && d.name() == name);
        for s in b.y.seq(&["subjects"]) {
            let (sk, sn) = (s.s(&["kind"]).unwrap_or(""), s.s(&["name"]).unwrap_or(""));
            let sns = s.s(&["namespace"]).unwrap_or(b.ns());
            p.check(sk == "ServiceAccount" && sas.contains(&(sns, sn)), || {
                format!(
                    "{}: subject {sk} {sns}/{sn} is not an installed ServiceAccount",
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
                    for r in rule.strs(&["resources"]) {
                        for v in rule.strs(&["verbs"]) {
                            set.insert((g.clone(), r.clone(), v, scope.to_string()));
                        }
                    }
                }
            }
        }
    }
    // Spot checks of what each sidecar cannot work without.
    let ds = one(&docs, "DaemonSet");
    let sa = pod_spec(ds).s(&["serviceAccountName"]).unwrap_or("default");
    let rules = granted
        .get(&(ds.ns().to_string(), sa.to_string()))
        .cloned()
        .unwrap_or_default();
    let has = |group: &str, resource: &str, verb: &str, namespaced: bool| {
        rules.iter().any(|(g, r, v, scope)| {
            g == group
                && r == resource
                && v == verb
                && (scope.is_empty() || (namespaced && scope == ds.ns()))
        })
    };
    for (who, group, resource, verbs, namespaced) in [
        (
            "csi-provisioner",
            "",
            "persistentvolumes",
            &["create", "delete", "watch"][..],
            false,
        ),
        (
            "csi-provisioner",
            "",
            "persistentvolumeclaims",
            &["update", "watch"][..],
            false,
        ),
        (
            "csi-provisioner",
            "storage.k8s.io",
            "storageclasses",
            &["list", "watch"][..],
            false,
        ),
        (
            "csi-provisioner",
            "storage.k8s.io",
            "csinodes",
            &["get", "list", "watch"][..],
            false,
        ),
        (
            "csi-provisioner",
            "",
            "nodes",
            &["get", "list", "watch"][..],
            false,
        ),
        (
            "csi-provisioner (capacity)",
            "storage.k8s.io",
            "csistoragecapacities",
            &["create", "update", "delete", "list", "watch"][..],
            true,
        ),
        (
            "csi-provisioner (capacity owner)",
            "",
            "pods",
            &["get"][..],
            true,
        ),
        (
            "csi-provisioner (restore)",
            "snapshot.storage.k8s.io",
            "volumesnapshots",
            &["get"][..],
            false,
        ),
        (
            "csi-attacher",
            "storage.k8s.io",
            "volumeattachments",
            &["watch", "patch"][..],
            false,
        ),
        (
            "csi-attacher",
            "storage.k8s.io",
            "volumeattachments/status",
            &["patch"][..],
            false,
        ),
        (
            "csi-attacher",
            "",
            "persistentvolumes",
            &["watch", "patch"][..],
            false,
        ),
        (
            "csi-resizer",
            "",
            "persistentvolumeclaims/status",
            &["patch"][..],
            false,
        ),
        (
            "csi-resizer",
            "",
            "persistentvolumes",
            &["patch"][..],
            false,
        ),
        (
            "csi-snapshotter",
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents",
            &["watch", "update", "patch"][..],
            false,
        ),
        (
            "csi-snapshotter",
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents/status",
            &["update"][..],
            false,
        ),
        (
            "csi-snapshotter",
            "snapshot.storage.k8s.io",
            "volumesnapshotclasses",
            &["get"][..],
            false,
        ),
        (
            "csi-addons",
            "csiaddons.openshift.io",
            "csiaddonsnodes",
            &["create", "get", "update", "watch", "delete"][..],
            true,
        ),
        (
            "csi-addons (leader election)",
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"][..],
            true,
        ),
        (
            "csi-addons (auth)",
            "authentication.k8s.io",
            "tokenreviews",
            &["create"][..],
            false,
        ),
        (
            "csi-addons (reclaim)",
            "",
            "persistentvolumes",
            &["get"][..],
            false,
        ),
        (
            "sidecars (events)",
            "",
            "events",
            &["create", "patch"][..],
            false,
        ),
    ] {
        for v in verbs {
            p.check(has(group, resource, v, namespaced), || {
                format!(
                    "ServiceAccount {}/{sa}: {who} needs `{v}` on {resource} ({})",
                    ds.ns(),
                    if group.is_empty() { "core" } else { group }
                )
            });
        }
    }
    p.finish("ServiceAccounts and RBAC");
}
