//! End-to-end tests against the real kernel: loop devices, ext4, mounts.
//! They need root, `mkfs.ext4` and loop support, and fail (never skip)
//! without them.
use super::*;
use crate::mountinfo::MountInfo;
use crate::pool::loopdev::*;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const POOL_SIZE: u64 = 256 * MIB;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "sys root tests drive loop devices, mknod and mount(2): run them as root \
             (euid is {euid}); they fail rather than skip"
    );
}

type Step = Box<dyn FnOnce() -> Result<()>>;

/// Undo steps run in reverse order on drop, including when a test panics.
/// Errors saying "already undone" are ignored, others are printed.
struct Cleanup {
    steps: Vec<(String, Step)>,
}

impl Cleanup {
    fn new() -> Self {
        Cleanup { steps: Vec::new() }
    }

    fn defer(&mut self, what: impl Into<String>, step: impl FnOnce() -> Result<()> + 'static) {
        self.steps.push((what.into(), Box::new(step)));
    }

    fn unmount_later(&mut self, target: &Path) {
        let target = target.to_path_buf();
        self.defer(format!("unmount {}", target.display()), move || {
            unmount(&target)
        });
    }

    /// Detaches whatever loop device still backs `backing` at the end.
    /// Never by device number: once a test has detached its device,
    /// the number is free, and a test running in parallel may already
    /// have attached its own file there.
    fn detach_later(&mut self, backing: &Path) {
        let backing = backing.to_path_buf();
        self.defer(
            format!("detach {}", backing.display()),
            move || match find_loop_for_file(&backing)? {
                Some(dev) => detach_loop(&dev),
                None => Ok(()),
            },
        );
    }

    /// A fresh directory under the temp dir, removed at the end unless
    /// something is still mounted inside it.
    fn scratch_dir(&mut self, name: &str) -> PathBuf {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "syscheck-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        let d = dir.clone();
        self.defer(format!("remove {}", dir.display()), move || {
            let still_mounted = MountInfo::read()
                .map(|info| info.mounts().iter().any(|m| m.mount_point.starts_with(&d)))
                .unwrap_or(true);
            if still_mounted {
                eprintln!(
                    "cleanup: leaving {} in place, something is still mounted in it",
                    d.display()
                );
                return Ok(());
            }
            std::fs::remove_dir_all(&d).map_err(|e| SysError::io("remove_dir_all", &d, e))
        });
        dir
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        while let Some((what, step)) = self.steps.pop() {
            match step() {
                Ok(()) => {}
                Err(e) if e.is_not_mounted() || e.is_not_attached() || e.is_not_found() => {}
                Err(e) => eprintln!("cleanup: {what}: {e}"),
            }
        }
    }
}

fn mkfs_ext4(dev: &Path) {
    mkfs("mkfs.ext4", "e2fsprogs", &["-q", "-F"], dev);
}

/// mkfs.xfs of `size` bytes (less than the device), no discard.
fn mkfs_xfs(dev: &Path, size: u64) {
    mkfs(
        "mkfs.xfs",
        "xfsprogs",
        &["-q", "-f", "-K", "-d", &format!("size={size}")],
        dev,
    );
}

fn mkfs(program: &str, package: &str, args: &[&str], dev: &Path) {
    let path = format!(
        "{}:/usr/sbin:/sbin",
        std::env::var("PATH").unwrap_or_default()
    );
    let status = Command::new(program)
        .env("PATH", path)
        .args(args)
        .arg(dev)
        .status()
        .unwrap_or_else(|e| panic!("{program} must be installed ({package}): {e}"));
    assert!(
        status.success(),
        "{program} {} failed: {status}",
        dev.display()
    );
}

fn allocated_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).expect("stat").blocks() * 512
}

fn wait_until_detached(backing: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while find_loop_for_file(backing)
        .expect("scan loop devices")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "{} still attached after detach",
            backing.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ext4 on a loop device that the later steps of
/// `loop_ext4_lifecycle` work on.
struct Ext4OnLoop {
    /// The test's scratch directory.
    dir: PathBuf,
    /// The loop device's backing file.
    backing: PathBuf,
    dev: PathBuf,
    /// The loop device's (major, minor).
    numbers: (u32, u32),
    /// Where the ext4 is mounted.
    mnt: PathBuf,
}

#[test]
fn loop_ext4_lifecycle() {
    require_root();
    let mut cleanup = Cleanup::new();
    let dir = cleanup.scratch_dir("lifecycle");

    let backing = dir.join("pools/pool.img");
    sparse_backing_file_rules(&backing);

    let dev = attach_loop(&backing).expect("attach_loop");
    cleanup.detach_later(&backing);
    let numbers = attached_loop_rules(&dir, &backing, &dev);

    // Filesystem, mounted nosuid,nodev with an fs option.
    mkfs_ext4(&dev);
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    mount_fs(
        &dev,
        &mnt,
        "ext4",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("errors=remount-ro"),
    )
    .expect("mount ext4");
    cleanup.unmount_later(&mnt);
    let fs = Ext4OnLoop {
        dir,
        backing,
        dev,
        numbers,
        mnt,
    };

    mounted_ext4_rules(&fs);
    in_use_device_refusal_rules(&fs);
    fitrim_rules(&fs);
    freeze_and_thaw_rules(&fs);
    let link = freeze_acts_on_the_mount_root_only(&fs);
    // A symlink at an unmount's target is never followed to the mount it
    // points at.
    assert!(unmount(&link).unwrap_err().is_not_mounted());
    assert!(MountInfo::read().unwrap().top_mount_at(&fs.mnt).is_some());
    freezes_left_by_a_killed_driver_rules(&fs);
    let ro = read_only_bind_rules(&mut cleanup, &fs);
    block_node_rules(&fs);
    unmount_rules(&fs, &ro);
    discard_rules(&fs);

    // Detach. The device number is free again the moment this returns,
    // and a test running in parallel may attach it: nothing here may
    // touch `dev` after this (an O_EXCL open of it would make that
    // test's exclusive open fail with EBUSY). The backing file tells.
    detach_loop(&fs.dev).expect("detach");
    wait_until_detached(&fs.backing);
}

/// A sparse backing file is made; a second call leaves it alone.
fn sparse_backing_file_rules(backing: &Path) {
    assert_eq!(
        create_sparse_file(backing, POOL_SIZE).unwrap(),
        SparseFile::Created
    );
    assert_eq!(
        create_sparse_file(backing, 2 * POOL_SIZE).unwrap(),
        SparseFile::Existed { len: POOL_SIZE }
    );
    assert_eq!(std::fs::metadata(backing).unwrap().len(), POOL_SIZE);
    assert!(allocated_bytes(backing) < MIB, "backing file is not sparse");
}

/// The attached loop device `dev` is found again by its backing file's
/// path, also through a detour; it survives our exit, is writable, backs
/// that file and has its size; unused so far. Its (major, minor).
fn attached_loop_rules(dir: &Path, backing: &Path, dev: &Path) -> (u32, u32) {
    let dev = dev.to_path_buf();
    assert_eq!(find_loop_for_file(backing).unwrap(), Some(dev.clone()));
    assert_eq!(
        find_loop_for_file(&dir.join("pools/./../pools/pool.img")).unwrap(),
        Some(dev.clone())
    );
    let status = loop_status(&dev).unwrap();
    assert_eq!(
        status.flags & LO_FLAGS_AUTOCLEAR,
        0,
        "must survive our exit"
    );
    assert_eq!(status.flags & LO_FLAGS_READ_ONLY, 0);
    assert_eq!(
        status.backing_inode,
        std::fs::metadata(backing).unwrap().ino()
    );
    assert_eq!(block_size_bytes(&dev).unwrap(), POOL_SIZE);
    let (major, minor) = device_numbers(&dev)
        .unwrap()
        .expect("loop is a block device");
    assert!(is_block_device_unused(&dev).unwrap());
    (major, minor)
}

/// mountinfo shows the ext4 mount as made: the device, type, source,
/// root, the fs option and nosuid, read-write, and only once.
fn mounted_ext4_rules(fs: &Ext4OnLoop) {
    let (dev, mnt, (major, minor)) = (&fs.dev, &fs.mnt, fs.numbers);
    let info = MountInfo::read().unwrap();
    let mounted = info.top_mount_at(mnt).expect("mountinfo shows the mount");
    assert_eq!(mounted.device(), (major, minor));
    assert_eq!(mounted.fs_type, "ext4");
    assert_eq!(mounted.source, dev.as_os_str());
    assert_eq!(mounted.root, Path::new("/"));
    assert_eq!(mounted.super_option("errors"), Some("remount-ro"));
    assert!(mounted.mount_option("nosuid").is_some());
    assert!(!mounted.is_read_only());
    assert_eq!(info.mounts_of_device(major, minor).len(), 1);
}

/// In use now: every exclusive operation on the device must refuse.
fn in_use_device_refusal_rules(fs: &Ext4OnLoop) {
    let (dev, backing) = (&fs.dev, &fs.backing);
    assert!(!is_block_device_unused(dev).unwrap());
    assert!(open_exclusive(dev).unwrap_err().is_busy());
    assert!(discard_range(dev, 0, MIB).unwrap_err().is_busy());
    assert!(detach_loop(dev).unwrap_err().is_busy());
    assert_eq!(
        find_loop_for_file(backing).unwrap(),
        Some(dev.clone()),
        "still attached"
    );
}

/// A file written and deleted is trimmed by FITRIM; the reclaim trim
/// checks the mount root too: another device's numbers are refused
/// before anything is synced or trimmed.
fn fitrim_rules(fs: &Ext4OnLoop) {
    let (dir, mnt, (major, minor)) = (&fs.dir, &fs.mnt, fs.numbers);
    let data = dir.join("mnt/data.bin");
    std::fs::write(&data, vec![0x5a_u8; 16 * MIB as usize]).unwrap();
    File::open(&data).unwrap().sync_all().unwrap();
    std::fs::remove_file(&data).unwrap();
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let root = open_mount_root(mnt, (major, minor)).expect("open the mount root");
    let trimmed = fitrim(&root, mnt, 0, u64::MAX, 0).expect("FITRIM");
    drop(root);
    let e = crate::node::reclaim::trim_filesystem(
        mnt,
        (major, minor + 1),
        "ext4",
        POOL_SIZE,
        &crate::node::reclaim::Stop::never(),
    )
    .unwrap_err();
    assert!(matches!(e, crate::error::Error::NotTheMount(_)), "{e}");
    eprintln!("FITRIM trimmed {trimmed} bytes");
    assert!(trimmed > 0, "FITRIM reported nothing trimmed");
}

/// Freeze: a second freeze is EBUSY; a write waits for the thaw; a second
/// thaw reports the filesystem was not frozen.
fn freeze_and_thaw_rules(fs: &Ext4OnLoop) {
    let (mnt, numbers) = (&fs.mnt, fs.numbers);
    freeze::freeze(mnt, numbers).expect("FIFREEZE");
    assert!(freeze::freeze(mnt, numbers).is_err(), "frozen twice");
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mnt.join("during-freeze");
    let writer = std::thread::spawn(move || {
        std::fs::write(&path, b"x").unwrap();
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "a write went through a frozen filesystem"
    );
    assert!(freeze::thaw(mnt, numbers).unwrap(), "it was frozen");
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the write finishes after the thaw");
    writer.join().unwrap();
    assert!(!freeze::thaw(mnt, numbers).unwrap(), "not frozen any more");
}

/// A freeze acts only on the root of a mount of the expected device:
/// another device's numbers, a directory inside the filesystem, a symlink
/// to the mount and another filesystem mounted over the path are refused,
/// and nothing is frozen. A freeze is thawed through the descriptor it
/// went through, also when another filesystem was mounted over the path
/// meanwhile. The symlink to the mount, left for the next step.
fn freeze_acts_on_the_mount_root_only(fs: &Ext4OnLoop) -> PathBuf {
    let (dir, mnt, numbers) = (&fs.dir, &fs.mnt, fs.numbers);
    let (major, minor) = numbers;
    std::fs::create_dir(mnt.join("inside")).unwrap();
    let link = dir.join("link-to-mnt");
    std::os::unix::fs::symlink(mnt, &link).unwrap();
    for (path, device, found) in [
        (mnt, (major, minor + 1), "found a filesystem of device"),
        (&mnt.join("inside"), numbers, "not the root of a mount"),
        (&link, numbers, "symbolic link"),
    ] {
        let e = freeze::freeze(path, device).unwrap_err();
        assert_eq!(
            e.kind(),
            SysErrorKind::NotTheMount,
            "{}: {e}",
            path.display()
        );
        let status: tonic::Status = crate::error::Error::from(e).into();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains(found), "{status:?}");
    }
    mount_fs(Path::new("none"), mnt, "tmpfs", MsFlags::empty(), None).expect("tmpfs over mnt");
    let e = freeze::freeze(mnt, numbers).unwrap_err();
    assert_eq!(e.kind(), SysErrorKind::NotTheMount, "{e}");
    assert!(
        e.to_string().contains("found a filesystem of device"),
        "{e}"
    );
    unmount(mnt).expect("unmount the tmpfs");
    assert!(!freeze::thaw(mnt, numbers).unwrap(), "nothing was frozen");

    freeze::freeze(mnt, numbers).expect("FIFREEZE");
    mount_fs(Path::new("none"), mnt, "tmpfs", MsFlags::empty(), None).expect("tmpfs over mnt");
    assert!(
        freeze::thaw(mnt, numbers).unwrap(),
        "thawed under the tmpfs"
    );
    unmount(mnt).expect("unmount the tmpfs");
    assert!(!freeze::thaw(mnt, numbers).unwrap(), "not frozen any more");
    link
}

/// A freeze recorded by a driver that was then killed is thawed at the
/// next start, and its record goes; so is a record of an earlier version
/// (bare paths) where the path is a mount, with the device mounted there.
/// A recorded path that is no mount point any more (a reboot), or a mount
/// of another device now, is not thawed: FITHAW would reach another
/// filesystem.
fn freezes_left_by_a_killed_driver_rules(fs: &Ext4OnLoop) {
    let (dir, mnt, numbers) = (&fs.dir, &fs.mnt, fs.numbers);
    let (major, minor) = numbers;
    let records = dir.join("frozen");
    let at = crate::node::freeze::MountOf {
        path: mnt.clone(),
        device: numbers,
    };
    crate::node::freeze::freeze_recorded(&records.join("group-1"), std::slice::from_ref(&at))
        .unwrap();
    assert!(
        freeze::freeze(mnt, numbers).is_err(),
        "frozen by the record's freeze"
    );
    assert_eq!(
        crate::node::freeze::thaw_left_frozen(&records).unwrap(),
        std::slice::from_ref(&at)
    );
    assert!(!freeze::thaw(mnt, numbers).unwrap(), "thawed at start-up");
    assert_eq!(std::fs::read_dir(&records).unwrap().count(), 0);
    assert!(crate::node::freeze::thaw_left_frozen(&records)
        .unwrap()
        .is_empty());
    freeze::freeze(mnt, numbers).unwrap();
    crate::node::durable::write_atomic(
        &records.join("group-0"),
        serde_json::to_string(&[mnt]).unwrap().as_bytes(),
    )
    .unwrap();
    assert_eq!(
        crate::node::freeze::thaw_left_frozen(&records).unwrap(),
        std::slice::from_ref(&at)
    );
    assert!(!freeze::thaw(mnt, numbers).unwrap(), "thawed at start-up");
    let plain = dir.join("plain");
    std::fs::create_dir(&plain).unwrap();
    crate::node::durable::write_atomic(
        &records.join("group-2"),
        serde_json::to_string(&[&plain]).unwrap().as_bytes(),
    )
    .unwrap();
    let other = crate::node::freeze::MountOf {
        path: mnt.clone(),
        device: (major, minor + 1),
    };
    crate::node::durable::write_atomic(
        &records.join("group-3"),
        serde_json::to_string(&[&other]).unwrap().as_bytes(),
    )
    .unwrap();
    assert!(crate::node::freeze::thaw_left_frozen(&records)
        .unwrap()
        .is_empty());
    assert_eq!(std::fs::read_dir(&records).unwrap().count(), 0);
}

/// A read-only bind of a subdirectory refuses writes and shows what the
/// source holds, which stays writable; mountinfo shows it read-only, of
/// the subdirectory, with nosuid and nodev kept, and the mount under it
/// still read-write. The bind's mount point.
fn read_only_bind_rules(cleanup: &mut Cleanup, fs: &Ext4OnLoop) -> PathBuf {
    let (dir, mnt, (major, minor)) = (&fs.dir, &fs.mnt, fs.numbers);
    let sub = mnt.join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("hello"), b"hi").unwrap();
    let ro = dir.join("ro-bind");
    std::fs::create_dir(&ro).unwrap();
    bind_mount(&sub, &ro, true).expect("read-only bind");
    cleanup.unmount_later(&ro);

    let err = std::fs::write(ro.join("nope"), b"x").unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "write through ro bind: {err}"
    );
    assert_eq!(std::fs::read(ro.join("hello")).unwrap(), b"hi");
    std::fs::write(sub.join("still-writable"), b"y").expect("source stays writable");
    assert_eq!(std::fs::read(ro.join("still-writable")).unwrap(), b"y");

    let info = MountInfo::read().unwrap();
    let bind = info.top_mount_at(&ro).expect("mountinfo shows the bind");
    assert_eq!(bind.root, Path::new("/sub"));
    assert_eq!(bind.device(), (major, minor));
    assert!(bind.is_read_only());
    assert!(
        bind.mount_option("nosuid").is_some(),
        "nosuid kept: {bind:?}"
    );
    assert!(bind.mount_option("nodev").is_some(), "nodev kept: {bind:?}");
    assert!(!info.top_mount_at(mnt).unwrap().is_read_only());
    assert_eq!(info.mounts_of_device(major, minor).len(), 2);
    ro
}

/// Our own device node for the loop device: exactly the mode asked,
/// whatever the umask, set through the checked node and never through a
/// symlink; it reads the device (ext4's superblock magic); the same node
/// again is fine, another device's at its path is EEXIST.
fn block_node_rules(fs: &Ext4OnLoop) {
    let (dir, (major, minor)) = (&fs.dir, fs.numbers);
    let node = dir.join("node");
    make_block_node(&node, major, minor, 0o660).expect("mknod");
    assert_eq!(
        std::fs::metadata(&node).unwrap().permissions().mode() & 0o7777,
        0o660,
        "exactly the mode asked, whatever the umask"
    );
    let link = dir.join("node-link");
    std::os::unix::fs::symlink(&node, &link).unwrap();
    let err = super::devnode::set_node_mode(&link, major, minor, 0o666).unwrap_err();
    assert_eq!(err.errno(), Errno::EEXIST);
    assert_eq!(
        std::fs::metadata(&node).unwrap().permissions().mode() & 0o7777,
        0o660
    );
    assert_eq!(device_numbers(&node).unwrap(), Some((major, minor)));
    assert_eq!(block_size_bytes(&node).unwrap(), POOL_SIZE);
    let mut magic = [0u8; 2];
    File::open(&node)
        .unwrap()
        .read_exact_at(&mut magic, 1080)
        .unwrap();
    assert_eq!(
        magic,
        [0x53, 0xef],
        "ext4 superblock magic through the new node"
    );
    make_block_node(&node, major, minor, 0o600).expect("same node again is fine");
    let err = make_block_node(&node, major, minor + 1, 0o600).unwrap_err();
    assert_eq!(err.errno(), Errno::EEXIST);
}

/// Unmount everything (the bind at `ro`, then the ext4); repeated or
/// bogus unmounts are told apart, and the device is unused again.
fn unmount_rules(fs: &Ext4OnLoop, ro: &Path) {
    let (dir, dev, mnt, (major, minor)) = (&fs.dir, &fs.dev, &fs.mnt, fs.numbers);
    unmount(ro).unwrap();
    unmount(mnt).unwrap();
    assert!(unmount(mnt).unwrap_err().is_not_mounted());
    assert!(unmount(&dir.join("missing")).unwrap_err().is_not_found());
    let info = MountInfo::read().unwrap();
    assert!(!info.is_mount_point(mnt));
    assert!(info.mounts_of_device(major, minor).is_empty());
    assert!(is_block_device_unused(dev).unwrap());
}

/// Discarding a region that holds data: the backing file loses the
/// blocks and the region reads back as zeros.
fn discard_rules(fs: &Ext4OnLoop) {
    let (dev, backing) = (&fs.dev, &fs.backing);
    let (offset, len) = (160 * MIB, 8 * MIB);
    let raw = OpenOptions::new().read(true).write(true).open(dev).unwrap();
    raw.write_all_at(&vec![0xab_u8; len as usize], offset)
        .unwrap();
    raw.sync_all().unwrap();
    let before = allocated_bytes(backing);
    discard_range(dev, offset, len).expect("BLKDISCARD");
    let after = allocated_bytes(backing);
    eprintln!("backing file allocation: {before} bytes before discard, {after} after");
    assert!(
        before >= after + len,
        "allocation should drop by {len}: before {before}, after {after}"
    );
    let mut back = vec![0xff_u8; len as usize];
    raw.read_exact_at(&mut back, offset).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "discarded range reads as zeros"
    );
    drop(raw);
}

#[test]
fn a_second_lock_holder_is_refused_until_the_first_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lock");
    let first = lock_file(&path).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap().trim(),
        std::process::id().to_string()
    );
    let e = lock_file(&path).unwrap_err();
    assert!(e.is_busy(), "{e}");
    drop(first);
    lock_file(&path).unwrap();
}

#[test]
fn legacy_attach_with_long_path() {
    require_root();
    let mut cleanup = Cleanup::new();
    let dir = cleanup.scratch_dir("legacy");
    let deep = dir.join("a-directory-name-long-enough-to-overflow-lo-file-name-by-itself");
    let backing = deep.join("pool.img");
    assert!(backing.as_os_str().len() > 63);
    assert_eq!(
        create_sparse_file(&backing, 64 * MIB).unwrap(),
        SparseFile::Created
    );

    let dev = attach_loop_with(&backing, AttachMethod::SetFd).expect("LOOP_SET_FD path");
    cleanup.detach_later(&backing);
    let status = loop_status(&dev).unwrap();
    assert_eq!(status.flags & LO_FLAGS_AUTOCLEAR, 0);
    assert_eq!(
        status.file_name.as_os_str().as_bytes(),
        &backing.as_os_str().as_bytes()[..63],
        "name cut to 63 bytes"
    );
    assert_eq!(block_size_bytes(&dev).unwrap(), 64 * MIB);
    // sysfs has the full path even though lo_file_name is cut.
    assert_eq!(find_loop_for_file(&backing).unwrap(), Some(dev.clone()));

    detach_loop(&dev).unwrap();
    wait_until_detached(&backing);
}

#[test]
fn deleted_backing_file_does_not_match() {
    require_root();
    let mut cleanup = Cleanup::new();
    let dir = cleanup.scratch_dir("deleted");
    let backing = dir.join("pool.img");
    create_sparse_file(&backing, 16 * MIB).unwrap();
    let dev = attach_loop(&backing).unwrap();
    cleanup.detach_later(&backing);

    std::fs::remove_file(&backing).unwrap();
    assert!(find_loop_for_file(&backing).unwrap_err().is_not_found());
    let sysfs = std::fs::read_to_string(format!(
        "/sys/block/{}/loop/backing_file",
        dev.file_name().unwrap().to_str().unwrap()
    ))
    .unwrap();
    assert!(sysfs.trim_end().ends_with(" (deleted)"), "{sysfs:?}");

    // A new file under the same name is not what the device backs.
    create_sparse_file(&backing, 16 * MIB).unwrap();
    assert_eq!(find_loop_for_file(&backing).unwrap(), None);

    detach_loop(&dev).unwrap();
}

/// Several attachers at once are handed the same free device by
/// LOOP_CTL_GET_FREE; the losers get EBUSY and must move on to another.
#[test]
fn concurrent_attaches_get_distinct_devices() {
    require_root();
    const ATTACHERS: usize = 6;
    let mut cleanup = Cleanup::new();
    let dir = cleanup.scratch_dir("concurrent");
    let files: Vec<PathBuf> = (0..ATTACHERS)
        .map(|i| {
            let f = dir.join(format!("pool-{i}.img"));
            create_sparse_file(&f, 8 * MIB).unwrap();
            f
        })
        .collect();

    let barrier = std::sync::Arc::new(std::sync::Barrier::new(ATTACHERS));
    let handles: Vec<_> = files
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, f)| {
            let barrier = barrier.clone();
            // Half use each method so both retry paths get exercised.
            let method = if i % 2 == 0 {
                AttachMethod::Configure
            } else {
                AttachMethod::SetFd
            };
            std::thread::spawn(move || {
                barrier.wait();
                attach_loop_with(&f, method)
            })
        })
        .collect();
    let results: Vec<Result<PathBuf>> = handles
        .into_iter()
        .map(|h| h.join().expect("attacher panicked"))
        .collect();
    for file in &files {
        cleanup.detach_later(file);
    }
    let devs: Vec<PathBuf> = results.into_iter().map(|r| r.expect("attach")).collect();

    let mut unique = devs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        ATTACHERS,
        "devices handed out twice: {devs:?}"
    );
    for (file, dev) in files.iter().zip(&devs) {
        assert_eq!(find_loop_for_file(file).unwrap().as_ref(), Some(dev));
    }
    for dev in &devs {
        detach_loop(dev).unwrap();
    }
}

#[test]
fn missing_loop_nodes_are_created() {
    require_root();
    let mut cleanup = Cleanup::new();
    let dev_dir = cleanup.scratch_dir("devdir");
    let sys_block = Path::new(SYS_BLOCK);

    // loop0 exists in sysfs: its numbers come from /sys/block/loop0/dev.
    let expected = std::fs::read_to_string("/sys/block/loop0/dev")
        .expect("the loop driver is loaded and loop0 exists");
    let node = ensure_loop_node(sys_block, &dev_dir, 0).unwrap();
    assert_eq!(node, dev_dir.join("loop0"));
    let (major, minor) = device_numbers(&node).unwrap().unwrap();
    assert_eq!(format!("{major}:{minor}"), expected.trim());
    assert_eq!(ensure_loop_node(sys_block, &dev_dir, 0).unwrap(), node);

    // Unknown to sysfs: falls back to 7:N.
    let node = ensure_loop_node(sys_block, &dev_dir, 4000).unwrap();
    assert_eq!(device_numbers(&node).unwrap(), Some((LOOP_MAJOR, 4000)));
}

/// What a tree holds, as (relative path, kind, device numbers): compared
/// before and after to show nothing outside the root was touched.
fn tree(dir: &Path) -> Vec<(PathBuf, String, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let kind = format!("{:?}", m.file_type());
            if m.is_dir() {
                todo.push(p.clone());
            }
            out.push((p.strip_prefix(dir).unwrap().to_path_buf(), kind, m.rdev()));
        }
    }
    out.sort();
    out
}

fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    MountInfo::read()
        .unwrap()
        .mounts()
        .iter()
        .map(|m| m.mount_point.clone())
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// A path checked while it was plain, then swapped for a symlink before
/// the driver acts (a parent, or the path itself): every act through
/// `beneath` is refused, and outside the root nothing is mounted, made,
/// unmounted or removed.
#[test]
fn a_symlink_swapped_in_after_the_check_is_refused() {
    require_root();
    let root_dir = tempfile::tempdir().unwrap();
    let outside_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let outside = std::fs::canonicalize(outside_dir.path()).unwrap();
    let roots = vec![root.clone()];
    let mut cleanup = Cleanup::new();

    // Outside: a directory and a node an attacker wants reached, and a
    // mount the driver must never unmount.
    std::fs::create_dir_all(outside.join("t")).unwrap();
    std::fs::write(outside.join("t/keep"), "keep").unwrap();
    std::fs::create_dir(outside.join("m")).unwrap();
    mount_fs(
        Path::new("tmpfs"),
        &outside.join("m"),
        "tmpfs",
        MsFlags::empty(),
        None,
    )
    .unwrap();
    cleanup.unmount_later(&outside.join("m"));

    // Inside: the staging source, a plain pod directory.
    let staging = root.join("staging");
    std::fs::create_dir(&staging).unwrap();
    mount_fs(
        Path::new("tmpfs"),
        &staging,
        "tmpfs",
        MsFlags::empty(),
        None,
    )
    .unwrap();
    cleanup.unmount_later(&staging);
    std::fs::create_dir_all(root.join("pod/t")).unwrap();
    let target = root.join("pod/t");

    // The check passes while the path is plain.
    assert_eq!(
        crate::node::paths::resolve(&target, &roots).unwrap(),
        crate::node::paths::Resolved::At(target.clone())
    );
    let before = tree(&outside);
    let mounts_before = mounts_under(&outside);

    acts_under_a_parent_swapped_for_a_symlink_are_refused(&root, &outside, &target, &staging);
    acts_on_a_path_swapped_for_a_symlink_are_refused(&root, &outside, &target, &staging);

    assert_eq!(tree(&outside), before, "nothing outside the root changed");
    assert_eq!(
        mounts_under(&outside),
        mounts_before,
        "no mount outside came or went"
    );

    the_same_acts_on_plain_paths_work(&root, &target, &staging);
    drop(cleanup);
}

/// `what`, which `r` answered, was refused as a path through a symlink
/// (ELOOP, EXDEV or ENOTDIR).
fn refused(what: &str, r: Result<()>) {
    let e = r.expect_err(what);
    assert!(
        [Errno::ELOOP, Errno::EXDEV, Errno::ENOTDIR].contains(&e.errno()),
        "{what}: {e}"
    );
}

/// Once the parent of `target` (under `root`) is swapped for a symlink to
/// `outside`, every act beneath the root through it is refused: bind,
/// read-only bind, mount, mknod, unlink, mkdir, umount, remount.
fn acts_under_a_parent_swapped_for_a_symlink_are_refused(
    root: &Path,
    outside: &Path,
    target: &Path,
    staging: &Path,
) {
    std::fs::rename(root.join("pod"), root.join("pod.old")).unwrap();
    std::os::unix::fs::symlink(outside, root.join("pod")).unwrap();
    let at = Under { root, path: target };
    let source = Under {
        root,
        path: staging,
    };
    refused("bind", bind_mount_beneath(source, at, false));
    refused("read-only bind", bind_mount_beneath(source, at, true));
    refused(
        "mount",
        mount_fs_beneath(Path::new("tmpfs"), at, "tmpfs", MsFlags::empty(), None),
    );
    refused("mknod", make_block_node_beneath(at, 7, 0, 0o600));
    let node = root.join("pod/keep");
    refused("unlink", remove_beneath(Under { root, path: &node }, false));
    refused(
        "mkdir",
        mkdir_beneath(
            Under {
                root,
                path: &root.join("pod/new"),
            },
            0o750,
        )
        .map(drop),
    );
    let m = root.join("pod/m");
    refused("umount", unmount_beneath(Under { root, path: &m }));
    refused(
        "remount",
        remount_flags_beneath(Under { root, path: &m }, MsFlags::MS_RDONLY),
    );
}

/// With the parent back, once `target` itself is swapped for a symlink to
/// a directory and to a mount in `outside`, bind, mount and umount
/// through it are refused.
fn acts_on_a_path_swapped_for_a_symlink_are_refused(
    root: &Path,
    outside: &Path,
    target: &Path,
    staging: &Path,
) {
    let at = Under { root, path: target };
    let source = Under {
        root,
        path: staging,
    };
    std::fs::remove_file(root.join("pod")).unwrap();
    std::fs::rename(root.join("pod.old"), root.join("pod")).unwrap();
    std::fs::remove_dir(target).unwrap();
    std::os::unix::fs::symlink(outside.join("t"), target).unwrap();
    refused("bind onto a symlink", bind_mount_beneath(source, at, false));
    refused(
        "mount onto a symlink",
        mount_fs_beneath(Path::new("tmpfs"), at, "tmpfs", MsFlags::empty(), None),
    );
    std::fs::remove_file(target).unwrap();
    std::os::unix::fs::symlink(outside.join("m"), target).unwrap();
    refused("umount through a symlink", unmount_beneath(at));
}

/// The same acts on plain paths work: a bind lands, read-only, and goes;
/// a node is made beneath the root, with exactly the mode asked.
fn the_same_acts_on_plain_paths_work(root: &Path, target: &Path, staging: &Path) {
    let at = Under { root, path: target };
    let source = Under {
        root,
        path: staging,
    };
    std::fs::remove_file(target).unwrap();
    assert!(mkdir_beneath(at, 0o750).unwrap());
    bind_mount_beneath(source, at, true).unwrap();
    let info = MountInfo::read().unwrap();
    let top = info.top_mount_at(target).expect("bound");
    assert!(top.mount_option("ro").is_some(), "read-only bind");
    unmount_beneath(at).unwrap();
    assert!(MountInfo::read().unwrap().top_mount_at(target).is_none());
    remove_beneath(at, true).unwrap();
    assert!(!target.exists());
    let dev = root.join("pod/dev");
    make_block_node_beneath(Under { root, path: &dev }, 7, 0, 0o640).unwrap();
    let meta = std::fs::symlink_metadata(&dev).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    assert_eq!(split_dev(meta.rdev()), (7, 0));
}

/// NodeExpandVolume's xfs grow acts through a descriptor checked to be the
/// root of a mount of the volume's device: another filesystem mounted over
/// the path, a symlink to the mount, a directory inside it and another
/// device's numbers are refused and grow nothing; the real mount grows to
/// the device's size, and a second grow is a no-op.
#[test]
fn xfs_grows_through_the_checked_mount_root_only() {
    require_root();
    let mut cleanup = Cleanup::new();
    let dir = cleanup.scratch_dir("xfs-grow");
    let backing = dir.join("xfs.img");
    create_sparse_file(&backing, 512 * MIB).unwrap();
    let loopdev = attach_loop(&backing).expect("attach_loop");
    cleanup.detach_later(&backing);
    let (major, minor) = device_numbers(&loopdev).unwrap().unwrap();
    mkfs_xfs(&loopdev, 320 * MIB);
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    mount_fs(&loopdev, &mnt, "xfs", MsFlags::empty(), None).expect("mount xfs");
    cleanup.unmount_later(&mnt);
    std::fs::create_dir(mnt.join("inside")).unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&mnt, &link).unwrap();

    let blocks = || {
        let fd = open_mount_root(&mnt, (major, minor)).unwrap();
        xfs::geometry(&fd, &mnt).unwrap()
    };
    let before = blocks();
    assert_eq!(before.blocksize, 4096);
    assert_eq!(before.datablocks * 4096, 320 * MIB);
    let dev = |minor| crate::node::Device {
        volume_id: "csi-xfs-test".into(),
        path: loopdev.clone(),
        major,
        minor,
    };
    let refused = |path: &Path, minor: u32| {
        let e = crate::node::grow::grow_xfs(&dev(minor), path).unwrap_err();
        let status: tonic::Status = e.into();
        status
    };
    for (path, m) in [
        (&mnt, minor + 1),
        (&mnt.join("inside"), minor),
        (&link, minor),
    ] {
        let s = refused(path, m);
        assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
        assert!(
            s.message()
                .contains("unmount what was mounted or linked over the path"),
            "{s:?}"
        );
    }
    mount_fs(Path::new("none"), &mnt, "tmpfs", MsFlags::empty(), None).expect("tmpfs over mnt");
    let s = refused(&mnt, minor);
    unmount(&mnt).expect("unmount the tmpfs");
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    assert_eq!(blocks(), before, "a refused grow grew nothing");

    crate::node::grow::grow_xfs(&dev(minor), &mnt).expect("grow");
    let after = blocks();
    assert_eq!(
        after.datablocks * 4096,
        512 * MIB,
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.imaxpct, before.imaxpct);
    crate::node::grow::grow_xfs(&dev(minor), &mnt).expect("a second grow is a no-op");
    assert_eq!(blocks(), after);
}
