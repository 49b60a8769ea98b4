//! Unit tests of the syscall wrappers that need no root.
use super::*;

use std::mem;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::sys::block::FstrimRange;
use crate::sys::dm::DmIoctl;

/// Request codes fit in 32 bits; compare them as such whatever the
/// target's request type is (`c_ulong` on glibc, `c_int` on musl).
fn code(request: Request) -> u32 {
    request as u32
}

#[test]
fn request_codes_and_layouts_match_the_c_headers() {
    assert_eq!(code(block::ioctl::BLKGETSIZE64), 0x8008_1272);
    assert_eq!(code(block::ioctl::BLKDISCARD), 0x1277);
    assert_eq!(code(block::ioctl::FITRIM), 0xc018_5879);
    assert_eq!(code(dm::ioctl::DM_DEV_STATUS), 0xc138_fd07);
    assert_eq!(code(freeze::ioctl::FIFREEZE), 0xc004_5877);
    assert_eq!(code(freeze::ioctl::FITHAW), 0xc004_5878);
    assert_eq!(mem::size_of::<DmIoctl>(), 312);
    assert_eq!(mem::size_of::<FstrimRange>(), 24);
    assert_eq!(code(xfs::ioctl::XFS_IOC_FSGEOMETRY_V1), 0x8070_5864);
    assert_eq!(code(xfs::ioctl::XFS_IOC_FSGROWFSDATA), 0x4010_586e);
    assert_eq!(mem::size_of::<xfs::GeomV1>(), 112);
    assert_eq!(mem::size_of::<xfs::GrowfsData>(), 16);
}

#[test]
fn errors_carry_operation_path_errno_and_kind() {
    let err = SysError::new("umount2", Path::new("/mnt/x"), Errno::EINVAL)
        .with_kind(SysErrorKind::NotMounted);
    assert!(err.is_not_mounted());
    assert_eq!(err.op(), "umount2");
    assert_eq!(err.path(), Path::new("/mnt/x"));
    assert_eq!(err.errno(), Errno::EINVAL);
    assert_eq!(err.to_string(), "umount2 /mnt/x: Invalid argument");

    let err = SysError::new("mount", Path::new("/m"), Errno::ENOENT).with_detail("source /dev/x");
    assert!(err.is_not_found());
    assert_eq!(
        err.to_string(),
        "mount /m: No such file or directory (source /dev/x)"
    );

    assert!(SysError::new("open(O_EXCL)", Path::new("/dev/loop0"), Errno::EBUSY).is_busy());
    assert_eq!(
        SysError::new("x", Path::new("/"), Errno::EPERM).kind(),
        SysErrorKind::Other
    );

    let io = SysError::io(
        "read",
        Path::new("/f"),
        io::Error::from_raw_os_error(libc::EBUSY),
    );
    assert!(io.is_busy());
    let io = SysError::io("read", Path::new("/f"), io::Error::other("boom"));
    assert_eq!(io.errno(), Errno::EIO);
    assert_eq!(io.detail(), Some("boom"));
}

#[test]
fn block_device_checks_reject_regular_files() {
    let this = Path::new(file!())
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let err = is_block_device_unused(&this).unwrap_err();
    assert_eq!(err.errno(), Errno::ENOTBLK);
    assert_eq!(device_numbers(&this).unwrap(), None);
    assert!(device_numbers(Path::new("/nonexistent/dev"))
        .unwrap_err()
        .is_not_found());
}

#[test]
fn sparse_file_is_created_once_and_never_touched_again() {
    let dir = std::env::temp_dir().join(format!("syscheck-sparse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("nested/dirs/pool.img");

    assert_eq!(
        create_sparse_file(&path, 1 << 30).unwrap(),
        SparseFile::Created
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(meta.blocks() * 512 < 1 << 20, "1 GiB file should be sparse");

    std::fs::write(&path, b"user data").unwrap();
    assert_eq!(
        create_sparse_file(&path, 1 << 30).unwrap(),
        SparseFile::Existed { len: 9 }
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"user data");

    let err = create_sparse_file(&dir, 10).unwrap_err();
    assert_eq!(err.errno(), Errno::EEXIST);
    std::fs::remove_dir_all(&dir).unwrap();
}
