//! Why an LVM command failed, read from LVM's state rather than its
//! words: a failed write explained by the report read right after it, and
//! a missing volume group told by the list of VGs.

use super::report::{self, Report};
use super::{room, Lvm};
use crate::error::{Error, Result};

impl Lvm {
    /// Why an LVM write failed. LVM's exit code says only that it failed
    /// (5 for nearly everything), and its text is for people: the cause a
    /// CO must act on is read from LVM's state, read again right after
    /// (see [`explain`]). A read that fails says itself what is wrong
    /// when the VG is gone; otherwise the command's own error stands.
    pub(super) async fn explain(&self, err: Error, lv: Option<&str>) -> Error {
        if !matches!(err, Error::Command { .. }) {
            return err;
        }
        match self.fresh_report().await {
            Ok(report) => explain(&report, &self.vg, &self.pool, lv, err),
            Err(gone @ Error::VgMissing { .. }) => gone,
            Err(read) => {
                tracing::warn!(error = %read, "cannot read LVM's state after a failed write");
                err
            }
        }
    }

    /// Whether our volume group exists, from a list of every VG (which
    /// succeeds when there is none), never from a failure's text.
    pub async fn vg_exists(&self) -> Result<bool> {
        let out = self
            .query(
                "vgs",
                crate::argv!["--reportformat", "json", "-o", "vg_name"],
            )
            .await?;
        for row in report::rows(&out.stdout, "vg")? {
            if report::text(&row, "vg_name")? == self.vg {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// UNAVAILABLE: the configured volume group is not there.
pub(super) fn vg_missing(vg: &str, e: &Error) -> Error {
    Error::VgMissing {
        vg: vg.to_string(),
        detail: e.to_string(),
    }
}

/// The error of a failed write to LV `lv` (`None`: a write that names
/// none), given the report read right after it: a pool that cannot
/// allocate (out of data or metadata space: RESOURCE_EXHAUSTED; failed or
/// read-only: FAILED_PRECONDITION), a missing pool (UNAVAILABLE), or the LV
/// held open (FAILED_PRECONDITION); anything else keeps `err`.
pub fn explain(report: &Report, vg: &str, pool: &str, lv: Option<&str>, err: Error) -> Error {
    let Some(p) = report.find(pool).filter(|p| p.is_thin_pool()) else {
        return Error::Unavailable(format!("thin pool {vg}/{pool} does not exist ({err})"))
            .advise("create it, or fix thin_pool in the config");
    };
    if let Some(problem) = p.problem().or_else(|| room::at_lvm_limit(p)) {
        return problem.error(Some(&err));
    }
    if let Some(l) = lv.and_then(|n| report.find(n)) {
        if let Some(problem) = l.problem() {
            // An LV's own problems (failed, partial) are not about space:
            // FAILED_PRECONDITION.
            return problem.error(Some(&err));
        }
        if l.is_open() {
            return Error::FailedPrecondition(format!(
                "LV {vg}/{} is open (mounted, or held by a process or a device-mapper table) ({err})",
                l.name
            ))
            .advise("unmount or close it, then retry");
        }
    }
    err
}

#[cfg(test)]
mod tests {
    use super::super::testutil::script_lvm;
    use super::*;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    fn row(name: &str, attr: &str, pool: &str, health: &str, data: &str) -> String {
        format!(
            r#"{{"lv_name":"{name}","vg_name":"vg1","lv_attr":"{attr}","lv_size":"8388608","pool_lv":"{pool}","segtype":"x","data_percent":"{data}","metadata_percent":"1.00","lv_tags":"","lv_health_status":"{health}","lv_kernel_major":"-1","lv_kernel_minor":"-1","vg_extent_size":"4194304","vg_size":"16777216","vg_free":"0","chunk_size":"65536"}}"#
        )
    }

    fn report_of(rows: &[String]) -> Report {
        Report::parse(&format!(r#"{{"report":[{{"lv":[{}]}}]}}"#, rows.join(","))).unwrap()
    }

    fn failed(sub: &str) -> Error {
        Error::Command {
            program: "lvm".into(),
            argv: crate::argv![sub],
            code: Some(5),
            signal: None,
            stderr: "text that decides nothing".into(),
        }
    }

    /// A failed write is explained by the state read after it, and each
    /// cause gets its code; the command's own error is kept in the message.
    #[test]
    fn a_failed_write_is_explained_by_the_state_after_it() {
        use tonic::Code;
        let code = |r: &Report, lv: Option<&str>| {
            let e = explain(r, "vg1", "pool", lv, failed("lvcreate"));
            assert!(e.to_string().contains("lvm lvcreate failed"), "{e}");
            e.code()
        };
        let vol = |attr: &str| row("csi-a", attr, "pool", "", "1.00");
        let healthy = report_of(&[
            row("pool", "twi-aotz--", "", "", "10.00"),
            vol("Vwi-a-tz--"),
        ]);
        assert_eq!(code(&healthy, Some("csi-a")), Code::Internal);
        assert_eq!(code(&healthy, None), Code::Internal);
        let full = report_of(&[row("pool", "twi-aotzD-", "", "out_of_data", "100.00")]);
        assert_eq!(code(&full, Some("csi-new")), Code::ResourceExhausted);
        let e = explain(&full, "vg1", "pool", None, failed("lvcreate"));
        assert!(e.message().contains("extend it"), "says what to do: {e}");
        let meta_ro = report_of(&[row("pool", "twi-aotzM-", "", "metadata_read_only", "5.00")]);
        assert_eq!(code(&meta_ro, None), Code::FailedPrecondition);
        let failed_pool = report_of(&[row("pool", "twi-aotzF-", "", "failed", "5.00")]);
        assert_eq!(code(&failed_pool, None), Code::FailedPrecondition);
        // LVM's own limits, which no health flag shows: the pool's
        // metadata at 75 % of 4 MiB (the VM's refusal), and a VG metadata
        // area with 300 bytes left.
        let limits = |meta_percent: &str, mda_free: &str| {
            let pool = row("pool", "twi-aotz--", "", "", "10.00").replace(
                r#""metadata_percent":"1.00""#,
                &format!(
                    r#""metadata_percent":"{meta_percent}","lv_metadata_size":"4194304","vg_mda_size":"1044480","vg_mda_free":"{mda_free}""#
                ),
            );
            report_of(&[pool])
        };
        for (r, store) in [
            (limits("75.00", "500000"), "metadata is 75.0% used"),
            (limits("40.00", "300"), "metadata area is nearly full"),
        ] {
            let e = explain(&r, "vg1", "pool", Some("csi-new"), failed("lvcreate"));
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            assert!(e.message().contains(store), "{e}");
        }
        assert_eq!(code(&limits("74.00", "500000"), None), Code::Internal);
        let no_pool = report_of(&[row("other", "-wi-a-----", "", "", "")]);
        assert_eq!(code(&no_pool, None), Code::Unavailable);
        let open = report_of(&[
            row("pool", "twi-aotz--", "", "", "10.00"),
            vol("Vwi-aotz--"),
        ]);
        let e = explain(&open, "vg1", "pool", Some("csi-a"), failed("lvremove"));
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("unmount or close it"), "{e}");
        // Another error than a command's is never re-read.
        let timeout = Error::Timeout {
            program: "lvm".into(),
            argv: vec![],
            after: Duration::from_secs(1),
        };
        assert!(matches!(
            explain(&healthy, "vg1", "pool", None, timeout),
            Error::Timeout { .. }
        ));
    }

    /// A fake lvm whose `lvs` fails, and whose `vgs` lists the VGs named in
    /// the file `vgs` (one per line).
    fn fake_lvm_without_vg(dir: &Path, vgs: &[&str]) -> Arc<Lvm> {
        let rows: Vec<String> = vgs
            .iter()
            .map(|v| format!(r#"{{"vg_name":"{v}"}}"#))
            .collect();
        let body = format!(
            "case $1 in\n lvs) echo 'any words' >&2; exit 5 ;;\n vgs) echo '{{\"report\":[{{\"vg\":[{}]}}]}}' ;;\nesac\n",
            rows.join(",")
        );
        script_lvm(dir, &body, |_| {})
    }

    /// "VG not found" is decided by the list of VGs, not by lvs's words.
    #[tokio::test]
    async fn a_missing_vg_is_unavailable_and_an_lvs_failure_beside_it_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let gone = fake_lvm_without_vg(dir.path(), &["other"]);
        assert!(!gone.vg_exists().await.unwrap());
        let e = gone.fresh_report().await.unwrap_err();
        assert!(
            matches!(&e, Error::VgMissing { vg, .. } if vg == "vg1"),
            "{e:?}"
        );
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
        assert!(
            e.to_string().contains("volume group vg1 does not exist"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let there = fake_lvm_without_vg(dir.path(), &["other", "vg1"]);
        assert!(there.vg_exists().await.unwrap());
        let e = there.fresh_report().await.unwrap_err();
        assert!(matches!(e, Error::Command { code: Some(5), .. }), "{e:?}");
    }
}
