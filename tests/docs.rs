//! README.md and docs/ checked against the code: the configuration
//! reference (docs/configuration.md) names every key the driver's
//! configuration parser accepts (with the default `config/defaults.toml`
//! documents), and the commands of README.md and docs/*.md work as written
//! for root on a machine without `sudo`.
//!
//! The keys come from the parser itself: serde's derive hands every
//! struct's field names to `Deserializer::deserialize_struct`, and
//! [`FieldNames`] records them, so a key added to `src/config.rs` and not to
//! README fails here.
//!
//! Run: `cargo test --test docs`

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::{DeserializeOwned, Visitor};
use thinpool_csi::config::{Autopilot, Cluster, Config, DeviceClass, Encryption, LoopPool};

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// A deserializer that only records the field names of the struct asked
/// for, then stops.
struct FieldNames<'a>(&'a mut Vec<&'static str>);

#[derive(Debug)]
struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field names recorded")
    }
}

impl std::error::Error for Stop {}

impl serde::de::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> serde::Deserializer<'de> for FieldNames<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Stop> {
        self.0.extend_from_slice(fields);
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// The keys `T`'s derived `Deserialize` accepts.
fn keys_of<T: DeserializeOwned>() -> Vec<&'static str> {
    let mut v = Vec::new();
    let _ = T::deserialize(FieldNames(&mut v));
    assert!(
        !v.is_empty(),
        "no field names recorded for {}",
        std::any::type_name::<T>()
    );
    v
}

/// Every configuration key, as README writes it: `key` at the top level,
/// `loop_pool.key` inside the `[loop_pool]` table.
fn config_keys() -> Vec<String> {
    let mut keys: Vec<String> = keys_of::<Config>().iter().map(|k| k.to_string()).collect();
    keys.extend(
        keys_of::<LoopPool>()
            .iter()
            .map(|k| format!("loop_pool.{k}")),
    );
    keys.extend(
        keys_of::<Autopilot>()
            .iter()
            .map(|k| format!("autopilot.{k}")),
    );
    keys.extend(
        keys_of::<Encryption>()
            .iter()
            .map(|k| format!("encryption.{k}")),
    );
    keys.extend(keys_of::<Cluster>().iter().map(|k| format!("cluster.{k}")));
    keys.extend(
        keys_of::<DeviceClass>()
            .iter()
            .map(|k| format!("device_classes.{k}")),
    );
    keys
}

/// `key = value` lines of config/defaults.toml, commented-out ones (the
/// optional `[loop_pool]` table) included, with their table prefix.
fn documented_defaults() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut table = String::new();
    for line in read("config/defaults.toml").lines() {
        let l = line.trim().trim_start_matches('#').trim();
        if let Some(t) = l.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            // `[table]`, or `[[array]]` of tables.
            table = format!("{}.", t.trim_matches(|c| c == '[' || c == ']'));
        } else if let Some((k, v)) = l.split_once(" = ") {
            if k.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                let v = v.split(" #").next().unwrap().trim();
                out.insert(format!("{table}{k}"), v.to_string());
            }
        }
    }
    out
}

/// Where the configuration reference lives.
const REFERENCE: &str = "docs/configuration.md";

/// The rows of the configuration reference: first cell (a key in
/// backquotes) -> the other cells.
fn reference_rows() -> BTreeMap<String, Vec<String>> {
    let readme = read(REFERENCE);
    let start = readme
        .find("\n## Configuration")
        .expect("docs/configuration.md has no `## Configuration` section");
    let section = &readme[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let mut rows = BTreeMap::new();
    for line in section[..end].lines() {
        let cells: Vec<String> = line
            .trim()
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect();
        if !line.trim_start().starts_with('|') || cells.len() < 3 {
            continue;
        }
        if let Some(key) = cells[0].strip_prefix('`').and_then(|k| k.strip_suffix('`')) {
            rows.insert(key.to_string(), cells[1..].to_vec());
        }
    }
    rows
}

#[test]
fn field_names_come_from_the_parser() {
    // The recorder itself: known fields are there, in the parser's names.
    let keys = config_keys();
    for k in [
        "driver_name",
        "allowed_roots",
        "loop_pool",
        "loop_pool.backing_file",
    ] {
        assert!(keys.iter().any(|x| x == k), "{k} missing from {keys:?}");
    }
    // And a parse of every recorded key (with a valid value from
    // defaults.toml) is accepted by the real parser, so the names are the
    // ones it reads.
    let defaults = documented_defaults();
    let top: Vec<String> = keys
        .iter()
        .filter(|k| {
            !k.contains('.')
                && !["loop_pool", "autopilot", "encryption", "cluster"].contains(&k.as_str())
        })
        .map(|k| {
            let v = defaults
                .get(k)
                .unwrap_or_else(|| panic!("config/defaults.toml does not document {k}"));
            format!("{k} = {v}")
        })
        .collect();
    Config::parse(&top.join("\n")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn readme_configuration_reference_has_every_key_with_its_default() {
    let keys = config_keys();
    let defaults = documented_defaults();
    let rows = reference_rows();
    let mut problems = Vec::new();
    for k in &keys {
        // Tables: their keys are documented one by one.
        if !["loop_pool", "autopilot", "encryption", "cluster"].contains(&k.as_str())
            && !defaults.contains_key(k)
        {
            problems.push(format!(
                "config/defaults.toml does not document `{k}` (its default and what it does)"
            ));
        }
        match rows.get(k) {
            None => problems.push(format!(
                "docs/configuration.md's configuration reference has no row `| \\`{k}\\` | default | what it does |`"
            )),
            Some(cells) => {
                if let Some(v) = defaults.get(k) {
                    if !cells[0].contains(v.as_str()) {
                        problems.push(format!(
                            "docs/configuration.md: `{k}` default cell {:?} does not show defaults.toml's {v}",
                            cells[0]
                        ));
                    }
                }
                if cells.last().is_none_or(|c| c.len() < 10) {
                    problems.push(format!("docs/configuration.md: `{k}` needs a description"));
                }
            }
        }
    }
    for k in defaults.keys() {
        if !keys.contains(k) {
            problems.push(format!(
                "config/defaults.toml documents `{k}`, which the parser does not accept"
            ));
        }
    }
    for k in rows.keys() {
        if !keys.contains(k) {
            problems.push(format!(
                "docs/configuration.md's configuration reference lists `{k}`, which the parser does not accept"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// README.md and every page under docs/, as (name, text).
fn pages() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_string(), read("README.md"))];
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("docs/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    assert!(names.iter().any(|n| n == "configuration.md"), "{names:?}");
    for n in names {
        let rel = format!("docs/{n}");
        let text = read(&rel);
        out.push((rel, text));
    }
    out
}

#[test]
fn readme_commands_run_as_root_without_sudo() {
    let mut problems = Vec::new();
    for (page, readme) in pages() {
        // Indented or fenced command lines.
        for (no, line) in readme.lines().enumerate() {
            let cmd = line.trim_start();
            let is_code = line.starts_with("    ") || line.starts_with('\t');
            if !is_code {
                continue;
            }
            if cmd.split_whitespace().any(|w| w == "sudo") {
                problems.push(format!(
                    "{page}:{}: `{cmd}`: these machines have no sudo; the commands run as root",
                    no + 1
                ));
            }
        }
        // Every script a page names exists and is executable.
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        for word in readme.split(|c: char| c.is_whitespace() || "`()[],;:".contains(c)) {
            if let Some(rest) = word.strip_prefix("scripts/") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                    .collect();
                let name = name.trim_end_matches('.');
                let p = root.join("scripts").join(name);
                let exec = std::fs::metadata(&p)
                    .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                    .unwrap_or(false);
                if !exec && !name.is_empty() && !name.ends_with(".txt") && !name.ends_with(".py") {
                    problems.push(format!(
                        "{page} names scripts/{name}, which is missing or not executable"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// docs/configuration.md's table of mkfs and mount options names every
/// option (and sub-option, feature, choice) `fs_options` allows.
#[test]
fn every_allowed_fs_option_is_documented() {
    let page = read("docs/configuration.md");
    let section = page
        .split("## mkfs and mount options")
        .nth(1)
        .expect("docs/configuration.md has a section on mkfs and mount options");
    let mut missing = Vec::new();
    for fs in ["ext4", "xfs"] {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| {fs} |")))
            .unwrap_or_else(|| panic!("no table row for {fs}"));
        let words = thinpool_csi::fs_options::allowed_mkfs_words(fs)
            .into_iter()
            .chain(thinpool_csi::fs_options::allowed_mount_words(fs));
        for w in words {
            if !row.contains(&format!("`{w}`")) && !row.contains(&format!("`{w}=")) {
                missing.push(format!("{fs}: {w}"));
            }
        }
    }
    assert!(missing.is_empty(), "not documented: {missing:?}");
}

/// The services of the protos `build.rs` compiles, each with its file and
/// its RPCs, read from the `.proto` text (comments left out).
fn proto_services() -> Vec<(String, String, Vec<String>)> {
    let build = read("build.rs");
    let files: Vec<&str> = build.split('"').filter(|s| s.ends_with(".proto")).collect();
    assert!(files.len() >= 5, "build.rs compiles {files:?}");
    let mut services = Vec::new();
    for file in files {
        let text: String = read(&format!("proto/{file}"))
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let spaced: String = text
            .chars()
            .flat_map(|c| match c {
                '(' | ')' | '{' | '}' | ';' => vec![' ', c, ' '],
                _ => vec![c],
            })
            .collect();
        let words: Vec<&str> = spaced.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            // A declaration is `service Name {` or `rpc Name (`, not a
            // field of that name (`Service service = 1;`).
            match (*w, words.get(i + 2).copied()) {
                ("service", Some("{")) => {
                    services.push((file.to_string(), words[i + 1].to_string(), Vec::new()))
                }
                ("rpc", Some("(")) => services
                    .last_mut()
                    .unwrap_or_else(|| panic!("{file}: an rpc outside a service"))
                    .2
                    .push(words[i + 1].to_string()),
                _ => {}
            }
        }
    }
    services
}

/// `word` in `text` as a whole word (not inside a longer name).
fn names(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Every RPC the driver serves is named in docs/behaviour.md ("what each
/// CSI and CSI-Addons call does"), every CSI-Addons proto in its CSI-Addons
/// section, and every CSI-Addons service in docs/configuration.md's
/// `csi_addons_endpoint` row; the services of the driver's own protos
/// (`proto/thinpool/`, the internal channel's) are named with their RPCs
/// in docs/cluster.md instead. The RPCs come from the protos `build.rs`
/// compiles, each of whose services `src/grpc/mod.rs` serves.
#[test]
fn docs_name_every_served_rpc() {
    let services = proto_services();
    let serve = read("src/grpc/mod.rs");
    let behaviour = read("docs/behaviour.md");
    let addons_section = behaviour
        .split("## CSI-Addons")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/behaviour.md has a CSI-Addons section");
    let config = read("docs/configuration.md");
    let addons_row = config
        .lines()
        .find(|l| l.starts_with("| `csi_addons_endpoint` |"))
        .expect("docs/configuration.md has a csi_addons_endpoint row");
    let cluster = read("docs/cluster.md");
    let mut missing = Vec::new();
    let mut rpcs = 0;
    let mut internal = 0;
    for (file, service, calls) in &services {
        if !names(&serve, &format!("{service}Server")) {
            missing.push(format!(
                "{file}: service {service} is not served in src/grpc/mod.rs"
            ));
        }
        if file.starts_with("thinpool/") {
            internal += 1;
            for rpc in calls {
                if !cluster.contains(&format!("`{service}.{rpc}`")) {
                    missing.push(format!("docs/cluster.md: `{service}.{rpc}`"));
                }
            }
            continue;
        }
        for rpc in calls {
            rpcs += 1;
            if !names(&behaviour, rpc) {
                missing.push(format!("docs/behaviour.md: {service}.{rpc}"));
            }
        }
        let Some(dir) = file.strip_suffix(".proto").and_then(|f| f.split_once('/')) else {
            continue;
        };
        if file.starts_with("github.com/") {
            continue;
        }
        if !addons_section.contains(&format!("proto/{}", dir.0)) {
            missing.push(format!(
                "docs/behaviour.md's CSI-Addons section: proto/{}",
                dir.0
            ));
        }
        let short = service
            .strip_suffix("Controller")
            .or_else(|| service.strip_suffix("Node"))
            .unwrap_or(service);
        if !addons_row.contains(short) {
            missing.push(format!(
                "docs/configuration.md's csi_addons_endpoint row: {short}"
            ));
        }
    }
    assert!(
        rpcs >= 35,
        "only {rpcs} RPCs read from the protos: {services:?}"
    );
    assert!(internal >= 1, "no internal service read: {services:?}");
    assert!(missing.is_empty(), "not named:\n{}", missing.join("\n"));
}
