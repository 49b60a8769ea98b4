//! The conformance suite's tables (`tests/lvm/conformance/mod.rs`) against
//! the suite itself: every csi-sanity spec and every row of the CSI-Addons
//! error tables has a row, and every rule a row names exists: the test
//! function is there, and the words quoted from the rule stand in its body.
//! Native and quick; the rules themselves run in the VM
//! (`scripts/test.sh vm conformance::`).
//!
//! Run: `cargo test --test conformance_table`

use std::collections::BTreeSet;
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// One row of a table: its id (`S12`, `A3`), its cells, and the rule it
/// names (`file::function`, quoted words).
struct Row {
    id: String,
    cells: Vec<String>,
    path: String,
    words: String,
}

/// The rows of the module docs whose id starts with `prefix`.
fn rows(doc: &str, prefix: char) -> Vec<Row> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("//! | "))
        .filter(|l| l.starts_with(prefix) && l[1..].starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_end_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect();
            let rule = cells.last().cloned().unwrap_or_default();
            // `path::function` `words`
            let parts: Vec<&str> = rule.split('`').collect();
            assert!(
                parts.len() == 5 && parts[2] == " " && parts[0].is_empty() && parts[4].is_empty(),
                "row {l:?}: the rule cell must be `file::function` `words`, not {rule:?}"
            );
            Row {
                id: cells[0].clone(),
                cells,
                path: parts[1].to_string(),
                words: parts[3].to_string(),
            }
        })
        .collect()
}

/// The body of `fn name` in `src`, up to the `}` at the indentation of its
/// `fn` line, and whether a test attribute stands right above it.
fn body(src: &str, name: &str) -> Option<(String, bool)> {
    let lines: Vec<&str> = src.lines().collect();
    let heads = [format!("fn {name}("), format!("fn {name}<")];
    let at = lines.iter().position(|l| {
        let t = l
            .trim_start()
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("async ");
        heads.iter().any(|h| t.starts_with(h.as_str()))
    })?;
    let indent = &lines[at][..lines[at].len() - lines[at].trim_start().len()];
    let close = format!("{indent}}}");
    let end = (at + 1..lines.len()).find(|&i| lines[i] == close)?;
    let test = at > 0 && lines[at - 1].trim_start().starts_with("#[tokio::test");
    Some((lines[at..=end].join("\n"), test))
}

/// Every broken reference among `rows`.
fn broken(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let Some((file, func)) = r.path.rsplit_once("::") else {
            out.push(format!("{}: {:?} is not file::function", r.id, r.path));
            continue;
        };
        let rel = format!("tests/lvm/{}.rs", file.replace("::", "/"));
        let Ok(src) = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(&rel))
        else {
            out.push(format!("{}: no file {rel}", r.id));
            continue;
        };
        match body(&src, func) {
            None => out.push(format!("{}: no fn {func} in {rel}", r.id)),
            Some((b, test)) => {
                // A rule lives in a test, or in the one place every rule
                // passes through (`Rules::code`).
                if !test && func != "code" {
                    out.push(format!("{}: {rel}::{func} is not a #[tokio::test]", r.id));
                }
                if !b.contains(&r.words) {
                    out.push(format!(
                        "{}: the words {:?} are not in {rel}::{func}",
                        r.id, r.words
                    ));
                }
            }
        }
    }
    out
}

fn doc() -> String {
    read("tests/lvm/conformance/mod.rs")
}

#[test]
fn every_csi_sanity_spec_has_a_row() {
    let rows = rows(&doc(), 'S');
    // csi-test v5.6.0 `pkg/sanity`: 62 + 1 pending in controller.go, 27 in
    // node.go, 3 in identity.go, 6 in groupcontroller.go.
    assert_eq!(
        rows.len(),
        99,
        "csi-sanity has 99 specs (98 and one pending)"
    );
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.id, format!("S{}", i + 1), "rows are numbered in order");
        assert_eq!(r.cells.len(), 4, "{}: # | spec | with us | rule", r.id);
    }
    let names: BTreeSet<&str> = rows.iter().map(|r| r.cells[1].as_str()).collect();
    assert_eq!(names.len(), rows.len(), "a spec is named twice");
    for (prefix, count) in [
        ("Controller Service [Controller Server] ", 36),
        ("ListSnapshots [Controller Server] ", 7),
        ("GetSnapshot [Controller Server] ", 3),
        ("DeleteSnapshot [Controller Server] ", 3),
        ("CreateSnapshot [Controller Server] ", 5),
        ("ExpandVolume [Controller Server] ", 3),
        ("ModifyVolume [Controller Server] ", 6),
        ("Node Service ", 27),
        ("Identity Service ", 3),
        ("GroupController Service ", 6),
    ] {
        let n = names.iter().filter(|s| s.starts_with(prefix)).count();
        assert_eq!(n, count, "specs under {prefix:?}");
    }
}

#[test]
fn every_csi_addons_error_row_has_a_row() {
    let rows = rows(&doc(), 'A');
    // The error tables of csi-addons-reclaimspace.md (ControllerReclaimSpace,
    // NodeReclaimSpace), csi-addons-healer.md (NodeHealer) and
    // EncryptionKeyRotate's.
    let reclaim = [
        "Missing required field",
        "Volume does not exist",
        "Operation pending for volume",
        "Not authenticated",
        "Error is Unknown",
    ];
    let mut want: BTreeSet<(String, String)> = BTreeSet::new();
    for rpc in ["ControllerReclaimSpace", "NodeReclaimSpace"] {
        for c in reclaim {
            want.insert((rpc.into(), c.into()));
        }
    }
    for c in reclaim.iter().chain(["Call not implemented"].iter()) {
        want.insert(("NodeHealer".into(), c.to_string()));
    }
    // encryptionkeyrotation/README.md of csi-addons/spec: the same five.
    for c in reclaim {
        want.insert(("EncryptionKeyRotate".into(), c.to_string()));
    }
    let got: BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| (r.cells[2].clone(), r.cells[3].clone()))
        .collect();
    assert_eq!(
        got, want,
        "one row per (RPC, condition) of the error tables"
    );
    assert_eq!(rows.len(), want.len(), "a row is there twice");
}

#[test]
fn every_rule_named_in_the_tables_exists() {
    let doc = doc();
    let mut all = rows(&doc, 'S');
    all.extend(rows(&doc, 'A'));
    assert!(all.len() > 100, "{} rows", all.len());
    let bad = broken(&all);
    assert!(
        bad.is_empty(),
        "rules that do not exist:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn a_missing_rule_is_found() {
    // The check itself: a function that is not there, and words that are
    // not in the function, are both reported.
    let row = |path: &str, words: &str| Row {
        id: "X1".into(),
        cells: vec![],
        path: path.into(),
        words: words.into(),
    };
    let bad = broken(&[
        row("conformance::sanity::no_such_test", "x"),
        row(
            "conformance::sanity::sanity_controller_get_capabilities",
            "words no rule has",
        ),
        row(
            "conformance::sanity::sanity_controller_get_capabilities",
            "GetSnapshot: not served",
        ),
    ]);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].contains("no fn no_such_test"), "{bad:?}");
    assert!(bad[1].contains("words no rule has"), "{bad:?}");
}
