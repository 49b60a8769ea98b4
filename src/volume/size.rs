//! Sizes: how a requested range becomes an LV size.

use super::request::SizeRange;
use crate::error::{Error, Result};
use crate::lvm::report::round_up;
use crate::naming::Access;

/// The size to allocate for a capacity range: at least `required`,
/// rounded up to whole extents, at most `limit`; `default` when the range
/// is empty.
pub fn size(range: Option<&SizeRange>, extent: u64, default: u64) -> Result<u64> {
    let SizeRange { required, limit } = range.copied().unwrap_or_default();
    if limit > 0 && required > limit {
        return Err(Error::InvalidArgument(format!(
            "required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    let want = match (required, limit) {
        (0, 0) => default,
        (0, l) => default.min(l),
        (r, _) => r,
    };
    let rounded = round_up(want, extent)
        .filter(|s| *s <= i64::MAX as u64)
        .ok_or_else(|| Error::OutOfRange(format!("{want} bytes is larger than any volume")))?;
    if limit > 0 && rounded > limit {
        // Rounding up broke the limit; the largest whole-extent size under
        // the limit may still satisfy required_bytes.
        let down = limit / extent.max(1) * extent.max(1);
        if down >= required.max(1) {
            return Ok(down);
        }
        return Err(Error::OutOfRange(format!(
            "no whole number of {extent}-byte extents lies between required_bytes {required} and limit_bytes {limit}"
        )));
    }
    Ok(rounded)
}

/// mkfs.xfs (5.19 and later) refuses filesystems under 300 MiB: its
/// "Filesystem must be larger than 300MB" counts in MiB (6.1 refused
/// 288 MiB and took 300 MiB, exactly). A thin volume costs only what is
/// written, so an xfs volume is raised to that minimum, unless
/// limit_bytes forbids it (OUT_OF_RANGE).
pub const XFS_MIN_BYTES: u64 = 300 * 1024 * 1024;

pub fn fs_minimum(
    access: Option<&Access>,
    size: u64,
    range: Option<&SizeRange>,
    extent: u64,
) -> Result<u64> {
    let min = match access {
        Some(Access::Mount { fs_type }) if fs_type == "xfs" => XFS_MIN_BYTES,
        _ => return Ok(size),
    };
    if size >= min {
        return Ok(size);
    }
    let raised = round_up(min, extent).unwrap_or(min);
    match range.map(|r| r.limit) {
        Some(limit) if limit > 0 && raised > limit => Err(Error::OutOfRange(format!(
            "xfs needs at least {min} bytes, but limit_bytes is {limit}"
        ))),
        _ => Ok(raised),
    }
}

/// True when a volume of size `have` satisfies the range.
pub fn size_fits(range: Option<&SizeRange>, have: u64) -> bool {
    let SizeRange { required, limit } = range.copied().unwrap_or_default();
    have >= required && (limit == 0 || have <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(required: u64, limit: u64) -> SizeRange {
        SizeRange { required, limit }
    }

    #[test]
    fn sizes_round_to_extents_within_limits() {
        let e = 4u64 << 20;
        assert_eq!(size(None, e, 1 << 30).unwrap(), 1 << 30);
        assert_eq!(size(Some(&r(1, 0)), e, 1 << 30).unwrap(), e);
        assert_eq!(size(Some(&r(0, 10 << 20)), e, 1 << 30).unwrap(), 8 << 20);
        assert_eq!(
            size(Some(&r(5 << 20, 10 << 20)), e, 1 << 30).unwrap(),
            8 << 20
        );
        assert!(matches!(
            size(Some(&r(5 << 20, 6 << 20)), e, 0),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(
            size(Some(&r(10, 5)), e, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            size(Some(&r(i64::MAX as u64, 0)), e, 0),
            Err(Error::OutOfRange(_))
        ));
        assert!(size_fits(Some(&r(5, 0)), 8));
        assert!(!size_fits(Some(&r(9, 0)), 8));
        assert!(!size_fits(Some(&r(1, 4)), 8));
        assert!(size_fits(None, 8));
    }

    #[test]
    fn xfs_volumes_are_raised_to_its_minimum() {
        let xfs = Access::Mount {
            fs_type: "xfs".into(),
        };
        let ext4 = Access::Mount {
            fs_type: "ext4".into(),
        };
        let e = 4 << 20;
        assert_eq!(fs_minimum(Some(&ext4), e, None, e).unwrap(), e);
        assert_eq!(fs_minimum(Some(&Access::Block), e, None, e).unwrap(), e);
        let raised = fs_minimum(Some(&xfs), e, None, e).unwrap();
        assert!(raised >= XFS_MIN_BYTES && raised % e == 0 && raised - XFS_MIN_BYTES < e);
        assert_eq!(fs_minimum(Some(&xfs), 1 << 30, None, e).unwrap(), 1 << 30);
        assert!(matches!(
            fs_minimum(Some(&xfs), e, Some(&r(1, 100 << 20)), e),
            Err(Error::OutOfRange(_))
        ));
    }
}
