//! A thin pool's state as device-mapper reports it, with no LVM command:
//! the thin-pool target's status line (data and metadata blocks used and
//! total, its mode, what it does when full) and the device's event
//! counter, which the kernel raises when the pool passes a low water mark,
//! runs out of space or changes mode.

use crate::error::{Error, Result};
use crate::lvm::lv_dm_name;
use crate::sys;

/// What the thin-pool target's status line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    pub metadata_used: u64,
    pub metadata_total: u64,
    pub data_used: u64,
    pub data_total: u64,
    /// `rw`, `ro`, `out_of_data_space`, `Fail` or `Error`.
    pub mode: String,
    /// `error_if_no_space`: a full pool fails writes at once rather than
    /// queueing them (LVM's `--errorwhenfull y`).
    pub error_if_no_space: bool,
}

impl PoolStatus {
    pub fn data_percent(&self) -> f64 {
        percent(self.data_used, self.data_total)
    }

    pub fn metadata_percent(&self) -> f64 {
        percent(self.metadata_used, self.metadata_total)
    }
}

fn percent(used: u64, total: u64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    used as f64 * 100.0 / total as f64
}

/// Parses a thin-pool status line (the kernel's
/// `Documentation/admin-guide/device-mapper/thin-provisioning.rst`):
/// `<transaction id> <used meta>/<total meta> <used data>/<total data>
/// <held root> ro|rw|out_of_data_space [no_]discard_passdown
/// error|queue_if_no_space needs_check|- <metadata low water mark>`, or
/// `Fail`.
pub fn parse(line: &str) -> Result<PoolStatus> {
    let bad = || Error::Internal(format!("unexpected thin-pool status {line:?}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    // A pool that failed, or whose status cannot be read (`Error`), has
    // no counts to give.
    if let Some(&mode @ ("Fail" | "Error")) = words.first() {
        return Ok(PoolStatus {
            metadata_used: 0,
            metadata_total: 0,
            data_used: 0,
            data_total: 0,
            mode: mode.into(),
            error_if_no_space: false,
        });
    }
    let pair = |w: Option<&&str>| -> Result<(u64, u64)> {
        let (a, b) = w.ok_or_else(bad)?.split_once('/').ok_or_else(bad)?;
        Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
    };
    let (metadata_used, metadata_total) = pair(words.get(1))?;
    let (data_used, data_total) = pair(words.get(2))?;
    let mode = words.get(4).ok_or_else(bad)?.to_string();
    Ok(PoolStatus {
        metadata_used,
        metadata_total,
        data_used,
        data_total,
        mode,
        error_if_no_space: words.contains(&"error_if_no_space"),
    })
}

/// Pool `vg/pool`'s status and the name of the device-mapper device that
/// holds its thin-pool target (`<vg>-<pool>-tpool` while thin volumes use
/// it, else the pool LV's own); `None` when the pool is not active.
pub fn read(vg: &str, pool: &str) -> Result<Option<(String, PoolStatus)>> {
    let own = lv_dm_name(vg, pool);
    for name in [format!("{own}-tpool"), own] {
        let Some(targets) = sys::dm_table_status(sys::By::Name(&name))? else {
            continue;
        };
        if let Some(t) = targets.iter().find(|t| t.target_type == "thin-pool") {
            return Ok(Some((name, parse(&t.status)?)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_status_lines_are_read_as_the_kernel_writes_them() {
        let s =
            parse("0 193/1024 1800/2048 - rw no_discard_passdown queue_if_no_space - 768").unwrap();
        assert_eq!((s.data_used, s.data_total), (1800, 2048));
        assert_eq!((s.metadata_used, s.metadata_total), (193, 1024));
        assert_eq!(s.mode, "rw");
        assert!(!s.error_if_no_space);
        assert!((s.data_percent() - 87.890625).abs() < 1e-9);
        let s = parse("3 10/10 2048/2048 - out_of_data_space discard_passdown error_if_no_space needs_check 5")
            .unwrap();
        assert_eq!(s.mode, "out_of_data_space");
        assert!(s.error_if_no_space);
        assert_eq!(s.metadata_percent(), 100.0);
        assert_eq!(parse("Fail").unwrap().mode, "Fail");
        assert_eq!(parse("Error").unwrap().mode, "Error");
        for bad in ["", "0 x/1 1/2 - rw", "0 1/1 12 - rw", "0 1/1"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
