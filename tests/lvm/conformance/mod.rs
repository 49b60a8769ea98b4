//! Our own conformance suite, organised by RPC: each submodule holds the
//! rules of one service, checked against the real binary. A test runs a
//! table of cases on one driver and reports every broken rule by name,
//! with the words of `csi-spec.md` it breaks, instead of stopping at the
//! first.

mod controller;
mod group;
mod identity;
mod metadata;
mod node;

use std::fmt::Display;

use thinpool_csi::error::REMEDY;
use tonic::{Code, Response, Status};

/// A status message in the driver's shape: what was wrong, [`REMEDY`],
/// then a clause of at least three words saying what to do.
fn remedied(message: &str) -> bool {
    match message.split_once(REMEDY) {
        Some((what, todo)) => !what.trim().is_empty() && todo.split_whitespace().count() >= 3,
        None => false,
    }
}

/// The spec's Error Scheme, quoted by every required-field rule.
pub const MISSING: &str =
    "Error Scheme: \"Missing required field: 3 INVALID_ARGUMENT\" (the whole request is checked before any look-up)";
/// The spec's Size Limits table.
pub const SIZE: &str = "Size Limits: \"128 bytes string\"";
/// The path fields' override of the size limit.
pub const PATH_MIN: &str = "\"SP MUST accept a max path length of at least 128 bytes\"";

/// The rule that `field` of `rpc` is REQUIRED.
pub fn required(rpc: &str, field: &str) -> String {
    format!("{rpc}: {field} is REQUIRED; without it → INVALID_ARGUMENT [{MISSING}]")
}

/// The rules checked by one test and the ones broken.
pub struct Rules {
    what: &'static str,
    checked: usize,
    broken: Vec<String>,
}

impl Rules {
    pub fn new(what: &'static str) -> Rules {
        Rules {
            what,
            checked: 0,
            broken: Vec::new(),
        }
    }

    /// `rule` holds when the reply carries `want`; an error must also
    /// carry a message and no details (Error Scheme). Returns the reply
    /// when it is OK.
    pub fn code<T>(
        &mut self,
        rule: &str,
        got: Result<Response<T>, Status>,
        want: Code,
    ) -> Option<T> {
        self.checked += 1;
        match got {
            Ok(r) => {
                if want != Code::Ok {
                    self.broken
                        .push(format!("{rule}\n      got OK, want {want:?}"));
                }
                Some(r.into_inner())
            }
            Err(s) => {
                if s.code() != want {
                    self.broken.push(format!(
                        "{rule}\n      got {:?} ({}), want {want:?}",
                        s.code(),
                        s.message()
                    ));
                } else if s.message().is_empty() || !s.details().is_empty() {
                    self.broken.push(format!(
                        "{rule}\n      {want:?} must carry a message and no details [Error Scheme: \"The status message MUST contain a human readable description\", \"The status details MUST be empty\"]"
                    ));
                } else if !remedied(s.message()) {
                    self.broken.push(format!(
                        "{rule}\n      {want:?} message {:?} must say what was wrong, then {REMEDY:?} and what to do [ours: issue 11, typed errors]",
                        s.message()
                    ));
                }
                None
            }
        }
    }

    /// `rule` holds when the call succeeds; returns the reply.
    pub fn ok<T>(&mut self, rule: &str, got: Result<Response<T>, Status>) -> Option<T> {
        self.code(rule, got, Code::Ok)
    }

    /// `rule` holds when `holds` is true; `detail` says what was seen.
    pub fn check(&mut self, rule: &str, holds: bool, detail: impl Display) {
        self.checked += 1;
        if !holds {
            self.broken.push(format!("{rule}\n      {detail}"));
        }
    }

    /// Panics listing every broken rule; prints the count either way.
    pub fn finish(self) {
        eprintln!(
            "conformance {}: {} rules checked, {} broken",
            self.what,
            self.checked,
            self.broken.len()
        );
        assert!(
            self.broken.is_empty(),
            "conformance {}: {} of {} rules broken:\n  - {}",
            self.what,
            self.broken.len(),
            self.checked,
            self.broken.join("\n  - ")
        );
    }
}
