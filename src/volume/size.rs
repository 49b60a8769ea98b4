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

/// The LUKS2 header cryptsetup writes at the start of an encrypted
/// volume (its default metadata and key-slot areas): the filesystem or
/// raw device inside is this much smaller than the LV.
pub const LUKS2_HEADER_BYTES: u64 = 16 << 20;

/// The least an encrypted volume holds inside its header.
pub const LUKS2_MIN_PAYLOAD: u64 = 16 << 20;

/// `size`, raised to what the volume's filesystem (xfs) and encryption
/// (its header and some room inside) need, unless limit_bytes forbids it
/// (OUT_OF_RANGE).
pub fn fs_minimum(
    access: Option<&Access>,
    encrypted: bool,
    size: u64,
    range: Option<&SizeRange>,
    extent: u64,
) -> Result<u64> {
    let fs_min = match access {
        Some(Access::Mount { fs_type }) if fs_type == "xfs" => XFS_MIN_BYTES,
        _ => 0,
    };
    let (min, why) = match encrypted {
        true => (
            fs_min.max(LUKS2_MIN_PAYLOAD) + LUKS2_HEADER_BYTES,
            "an encrypted volume (its LUKS2 header and the room inside)",
        ),
        false => (fs_min, "xfs"),
    };
    if size >= min {
        return Ok(size);
    }
    let raised = round_up(min, extent).unwrap_or(min);
    match range.map(|r| r.limit) {
        Some(limit) if limit > 0 && raised > limit => Err(Error::OutOfRange(format!(
            "{why} needs at least {min} bytes, but limit_bytes is {limit}"
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
        assert_eq!(fs_minimum(Some(&ext4), false, e, None, e).unwrap(), e);
        assert_eq!(
            fs_minimum(Some(&Access::Block), false, e, None, e).unwrap(),
            e
        );
        let raised = fs_minimum(Some(&xfs), false, e, None, e).unwrap();
        assert!(raised >= XFS_MIN_BYTES && raised % e == 0 && raised - XFS_MIN_BYTES < e);
        assert_eq!(
            fs_minimum(Some(&xfs), false, 1 << 30, None, e).unwrap(),
            1 << 30
        );
        assert!(matches!(
            fs_minimum(Some(&xfs), false, e, Some(&r(1, 100 << 20)), e),
            Err(Error::OutOfRange(_))
        ));
        // Encryption adds its header, and some room inside it.
        let min = LUKS2_HEADER_BYTES + LUKS2_MIN_PAYLOAD;
        assert_eq!(fs_minimum(Some(&ext4), true, e, None, e).unwrap(), min);
        assert_eq!(
            fs_minimum(Some(&Access::Block), true, 64 << 20, None, e).unwrap(),
            64 << 20
        );
        let xfs_enc = fs_minimum(Some(&xfs), true, e, None, e).unwrap();
        assert!(xfs_enc >= XFS_MIN_BYTES + LUKS2_HEADER_BYTES, "{xfs_enc}");
        let e2 = fs_minimum(Some(&ext4), true, e, Some(&r(1, 24 << 20)), e).unwrap_err();
        assert!(e2.to_string().contains("encrypted"), "{e2}");
    }
}
