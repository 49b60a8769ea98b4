//! Parser and queries for `/proc/self/mountinfo`.
//!
//! The mount table is the ground truth for "is this volume staged / published
//! already?", so the node service asks this module instead of trusting its own
//! bookkeeping. The format is described in proc(5) ("/proc/pid/mountinfo"); one
//! line per mount:
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2) (3)   (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)
//! ```
//!
//! The numbered fields are:
//!
//! 1. mount id;
//! 2. parent mount id;
//! 3. `major:minor` of the filesystem's device;
//! 4. root: the directory *inside* that filesystem which is mounted (not `/`
//!    for a bind mount of a subdirectory);
//! 5. mount point;
//! 6. per-mount options;
//! 7. zero or more optional fields (`shared:N`, `master:N`,
//!    `propagate_from:N`, `unbindable`);
//! 8. a lone `-`;
//! 9. filesystem type;
//! 10. mount source (a device path, or any string such as `proc`, `tmpfs`,
//!     possibly empty);
//! 11. superblock options.
//!
//! Fields are separated by exactly one space. The kernel escapes space, tab,
//! newline and backslash inside fields as three-digit octal (`\040`, `\011`,
//! `\012`, `\134`), so splitting on `' '` is exact and one line is one mount even
//! when a path contains a newline. Paths are arbitrary bytes, so the file is
//! parsed as bytes and paths are kept as [`PathBuf`]/[`OsString`].
//!
//! Path arguments of the queries are normalized lexically (`.`, `..` and
//! duplicate slashes removed); symlinks are *not* resolved here. Callers that
//! may receive symlinked paths should canonicalize before asking.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

/// Where the mount table of the calling process lives.
pub const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";

/// Failure to read or understand a mountinfo file.
#[derive(Debug, thiserror::Error)]
pub enum MountInfoError {
    /// The file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file that was read.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A line does not follow the proc(5) format.
    #[error("mountinfo line {line}: {reason}: {text:?}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
        /// The offending line (lossily decoded).
        text: String,
    },
}

/// One line of mountinfo: one mount in the calling process's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Unique id of the mount (may be reused after unmount).
    pub mount_id: u32,
    /// Id of the parent mount; for stacked mounts, the mount underneath.
    pub parent_id: u32,
    /// Major number of the device holding the filesystem (`st_dev`).
    pub major: u32,
    /// Minor number of the device holding the filesystem.
    pub minor: u32,
    /// Directory inside the filesystem that forms the root of this mount.
    /// `/` for an ordinary mount, `/sub/dir` for a bind mount of a subdirectory.
    pub root: PathBuf,
    /// Where the mount is attached, relative to the process's root.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`, `relatime`, ...).
    pub mount_options: Vec<String>,
    /// Optional propagation fields (`shared:1`, `master:2`, ...), possibly none.
    pub optional_fields: Vec<String>,
    /// Filesystem type, e.g. `ext4`, `xfs`, `fuse.sshfs`.
    pub fs_type: String,
    /// Mount source: device path or a free-form string (`proc`, `tmpfs`, empty).
    pub source: OsString,
    /// Superblock options, shared by every mount of the same filesystem.
    pub super_options: Vec<String>,
}

impl Mount {
    /// `(major, minor)` of the filesystem's device.
    pub fn device(&self) -> (u32, u32) {
        (self.major, self.minor)
    }

    /// True when writes through this mount fail: either the mount itself is
    /// read-only (`ro` per-mount option, e.g. a read-only bind) or the whole
    /// filesystem is (`ro` super option, e.g. ext4 after `errors=remount-ro`
    /// kicked in; the per-mount flag then still says `rw`).
    pub fn is_read_only(&self) -> bool {
        self.mount_option("ro").is_some() || self.super_option("ro").is_some()
    }

    /// Looks up a superblock option. Returns `Some(value)` for `name=value`,
    /// `Some("")` for a bare flag `name`, `None` when absent.
    pub fn super_option(&self, name: &str) -> Option<&str> {
        find_option(&self.super_options, name)
    }

    /// Looks up a per-mount option, same conventions as [`Mount::super_option`].
    pub fn mount_option(&self, name: &str) -> Option<&str> {
        find_option(&self.mount_options, name)
    }

    /// Value of an optional field such as `shared:12` (`optional_field("shared")
    /// == Some("12")`); `Some("")` for a bare tag like `unbindable`.
    pub fn optional_field(&self, tag: &str) -> Option<&str> {
        self.optional_fields
            .iter()
            .find_map(|f| match f.split_once(':') {
                Some((t, v)) if t == tag => Some(v),
                None if f == tag => Some(""),
                _ => None,
            })
    }
}

fn find_option<'a>(options: &'a [String], name: &str) -> Option<&'a str> {
    options.iter().find_map(|o| match o.split_once('=') {
        Some((k, v)) if k == name => Some(v),
        None if o == name => Some(""),
        _ => None,
    })
}

/// A parsed mount table, in the order the kernel listed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountInfo {
    mounts: Vec<Mount>,
}

impl MountInfo {
    /// Reads and parses `/proc/self/mountinfo`.
    ///
    /// The kernel produces the file in chunks; if mounts change while it is
    /// read, a line may be missed or repeated. Re-read if exactness matters.
    pub fn read() -> Result<Self, MountInfoError> {
        Self::read_from(Path::new(SELF_MOUNTINFO))
    }

    /// Reads and parses another mountinfo file, e.g. `/proc/1/mountinfo` to see
    /// the host's namespace from a container that shares PID 1's view.
    pub fn read_from(path: &Path) -> Result<Self, MountInfoError> {
        let bytes = std::fs::read(path).map_err(|source| MountInfoError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let info = Self::parse_bytes(&bytes)?;
        tracing::debug!(path = %path.display(), mounts = info.mounts.len(), "read mount table");
        Ok(info)
    }

    /// Parses mountinfo text.
    pub fn parse(text: &str) -> Result<Self, MountInfoError> {
        Self::parse_bytes(text.as_bytes())
    }

    /// Parses mountinfo content given as raw bytes (paths need not be UTF-8).
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, MountInfoError> {
        let mut mounts = Vec::new();
        for (index, line) in bytes.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let mount = parse_line(line).map_err(|reason| MountInfoError::Parse {
                line: index + 1,
                reason,
                text: String::from_utf8_lossy(line).into_owned(),
            })?;
            mounts.push(mount);
        }
        Ok(MountInfo { mounts })
    }

    /// All mounts, in kernel order.
    pub fn mounts(&self) -> &[Mount] {
        &self.mounts
    }

    /// Every mount attached at `path`, bottom first and the visible (top-most)
    /// one last. More than one means mounts are stacked on that directory;
    /// each stacked mount's parent is the one underneath it.
    pub fn mounts_at(&self, path: &Path) -> Vec<&Mount> {
        let wanted = normalize(path);
        let here: Vec<&Mount> = self
            .mounts
            .iter()
            .filter(|m| normalize(&m.mount_point) == wanted)
            .collect();
        order_stack(here)
    }

    /// The mount currently visible at `path`, if `path` is a mount point.
    pub fn top_mount_at(&self, path: &Path) -> Option<&Mount> {
        self.mounts_at(path).pop()
    }

    /// True when something is mounted exactly at `path`.
    pub fn is_mount_point(&self, path: &Path) -> bool {
        let wanted = normalize(path);
        self.mounts
            .iter()
            .any(|m| normalize(&m.mount_point) == wanted)
    }

    /// Every mount (including bind mounts) of the filesystem on device
    /// `major:minor`, in kernel order.
    pub fn mounts_of_device(&self, major: u32, minor: u32) -> Vec<&Mount> {
        self.mounts
            .iter()
            .filter(|m| m.major == major && m.minor == minor)
            .collect()
    }
}

/// Orders mounts that share a mount point by following parent links from the
/// bottom one upward. Anything not on the chain (should not happen) is kept in
/// kernel order at the end.
fn order_stack(mut pending: Vec<&Mount>) -> Vec<&Mount> {
    if pending.len() < 2 {
        return pending;
    }
    let mut ordered: Vec<&Mount> = Vec::with_capacity(pending.len());
    let bottom = pending
        .iter()
        .position(|m| {
            m.parent_id == m.mount_id || !pending.iter().any(|o| o.mount_id == m.parent_id)
        })
        .unwrap_or(0);
    ordered.push(pending.remove(bottom));
    while let Some(next) = pending.iter().position(|m| {
        let below = ordered[ordered.len() - 1];
        m.parent_id == below.mount_id && m.mount_id != below.mount_id
    }) {
        ordered.push(pending.remove(next));
    }
    ordered.extend(pending);
    ordered
}

fn parse_line(line: &[u8]) -> Result<Mount, String> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if fields.len() < 10 {
        return Err(format!(
            "expected at least 10 fields, found {}",
            fields.len()
        ));
    }
    let separator = fields[6..]
        .iter()
        .position(|f| *f == b"-")
        .map(|p| p + 6)
        .ok_or_else(|| "missing \"-\" separator".to_string())?;
    let tail = &fields[separator + 1..];
    if tail.len() != 3 {
        return Err(format!(
            "expected 3 fields after \"-\", found {}",
            tail.len()
        ));
    }

    let (major, minor) = {
        let text = ascii(fields[2], "major:minor")?;
        let (major, minor) = text
            .split_once(':')
            .ok_or_else(|| format!("bad major:minor {text:?}"))?;
        (number(major, "major")?, number(minor, "minor")?)
    };

    Ok(Mount {
        mount_id: number(ascii(fields[0], "mount id")?, "mount id")?,
        parent_id: number(ascii(fields[1], "parent id")?, "parent id")?,
        major,
        minor,
        root: PathBuf::from(OsString::from_vec(unescape(fields[3]))),
        mount_point: PathBuf::from(OsString::from_vec(unescape(fields[4]))),
        mount_options: options(fields[5]),
        optional_fields: fields[6..separator]
            .iter()
            .map(|f| lossy(&unescape(f)))
            .collect(),
        fs_type: lossy(&unescape(tail[0])),
        source: OsString::from_vec(unescape(tail[1])),
        super_options: options(tail[2]),
    })
}

fn ascii<'a>(field: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(field).map_err(|_| format!("{what} is not text"))
}

fn number(text: &str, what: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("{what} {text:?} is not a number"))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Splits a comma-separated option list. Splitting happens before unescaping
/// because a comma inside a value is written as `\054` by the kernel.
fn options(field: &[u8]) -> Vec<String> {
    if field.is_empty() {
        return Vec::new();
    }
    field
        .split(|&b| b == b',')
        .map(|o| lossy(&unescape(o)))
        .collect()
}

/// Decodes the kernel's `\ooo` octal escapes. A backslash not followed by three
/// octal digits is kept as is.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            if let Some(digits) = field.get(i + 1..i + 4) {
                if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                    let value = digits
                        .iter()
                        .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                    // `\400`..`\777` do not fit a byte; keep them literally.
                    if let Ok(byte) = u8::try_from(value) {
                        out.push(byte);
                        i += 4;
                        continue;
                    }
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// Lexical normalization: makes the path absolute (relative paths are taken
/// from the current directory), drops `.` and empty components, and lets `..`
/// remove the previous component (never above `/`). No symlinks are followed.
pub fn normalize(path: &Path) -> PathBuf {
    let absolute;
    let path = if path.is_absolute() {
        path
    } else {
        absolute = std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path);
        &absolute
    };
    let mut parts: Vec<&OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut out = PathBuf::from("/");
    for part in parts {
        out.push(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// A node's table: root fs, pool filesystem on a loop device, a CSI
    /// publish that bind-mounts a subdirectory of it read-only, and odd paths.
    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 ro,errors=remount-ro
29 27 7:0 / /srv/pool rw,relatime shared:12 - ext4 /dev/loop0 rw
412 29 7:0 /volumes/pvc-1 /var/lib/kubelet/pods/abc/volumes/kubernetes.io~csi/pvc-1/mount ro,relatime shared:12 master:2 propagate_from:3 - ext4 /dev/loop0 rw
97 27 253:3 / /var/lib/data rw,noatime shared:50 - xfs /dev/mapper/vg0-data rw,attr2,inode64,logbufs=8,logbsize=32k,sunit=128,swidth=256,noquota
98 27 0:45 / /mnt/my\\040dir\\012with\\011odd\\134name rw,nosuid unbindable - tmpfs my\\040src rw,size=1024k
";

    fn sample() -> MountInfo {
        MountInfo::parse(SAMPLE).expect("sample parses")
    }

    fn at<'a>(info: &'a MountInfo, path: &str) -> &'a Mount {
        info.top_mount_at(Path::new(path))
            .unwrap_or_else(|| panic!("nothing mounted at {path}"))
    }

    #[test]
    fn parses_every_field_of_a_plain_line_without_optional_fields() {
        let info = sample();
        let proc_ = at(&info, "/proc");
        assert_eq!(proc_.mount_id, 22);
        assert_eq!(proc_.parent_id, 27);
        assert_eq!(proc_.device(), (0, 21));
        assert_eq!(proc_.root, Path::new("/"));
        assert_eq!(proc_.mount_options, ["rw", "relatime"]);
        assert!(proc_.optional_fields.is_empty());
        assert_eq!(proc_.fs_type, "proc");
        assert_eq!(proc_.source, "proc");
        assert_eq!(proc_.super_options, ["rw"]);
        assert!(!proc_.is_read_only());
    }

    #[test]
    fn bind_mount_of_a_subdirectory_keeps_its_root() {
        let info = sample();
        let publish = at(
            &info,
            "/var/lib/kubelet/pods/abc/volumes/kubernetes.io~csi/pvc-1/mount",
        );
        assert_eq!(publish.root, Path::new("/volumes/pvc-1"));
        assert_eq!(publish.device(), (7, 0));
        assert_eq!(publish.parent_id, 29);
        assert!(
            publish.is_read_only(),
            "per-mount ro makes the bind read-only"
        );

        let pool = at(&info, "/srv/pool");
        assert_eq!(pool.root, Path::new("/"));
        assert!(!pool.is_read_only());

        let both: Vec<u32> = info
            .mounts_of_device(7, 0)
            .iter()
            .map(|m| m.mount_id)
            .collect();
        assert_eq!(both, [29, 412]);
        assert!(info.mounts_of_device(7, 1).is_empty());
    }

    #[test]
    fn several_optional_fields_are_kept_in_order() {
        let info = sample();
        let publish = &info.mounts()[3];
        assert_eq!(
            publish.optional_fields,
            ["shared:12", "master:2", "propagate_from:3"]
        );
        assert_eq!(publish.optional_field("shared"), Some("12"));
        assert_eq!(publish.optional_field("master"), Some("2"));
        assert_eq!(publish.optional_field("propagate_from"), Some("3"));
        assert_eq!(publish.optional_field("unbindable"), None);
        // The fields after "-" were not confused with optional fields.
        assert_eq!(publish.fs_type, "ext4");
        assert_eq!(publish.source, "/dev/loop0");
    }

    #[test]
    fn xfs_super_options_with_values() {
        let info = sample();
        let data = at(&info, "/var/lib/data");
        assert_eq!(data.fs_type, "xfs");
        assert_eq!(data.device(), (253, 3));
        assert_eq!(data.source, "/dev/mapper/vg0-data");
        assert_eq!(data.super_option("logbsize"), Some("32k"));
        assert_eq!(data.super_option("swidth"), Some("256"));
        assert_eq!(data.super_option("inode64"), Some(""));
        assert_eq!(data.super_option("noquota"), Some(""));
        assert_eq!(data.super_option("logbuf"), None, "no prefix matching");
        assert_eq!(data.mount_option("noatime"), Some(""));
        assert!(!data.is_read_only());
    }

    #[test]
    fn ext4_remounted_read_only_by_errors_policy_is_read_only() {
        let info = sample();
        let root = at(&info, "/");
        // Per-mount flag still says rw; only the superblock went ro.
        assert_eq!(root.mount_option("rw"), Some(""));
        assert_eq!(root.mount_option("ro"), None);
        assert_eq!(root.super_option("ro"), Some(""));
        assert_eq!(root.super_option("errors"), Some("remount-ro"));
        assert!(root.is_read_only());
    }

    #[test]
    fn octal_escapes_are_decoded_in_paths_and_source() {
        let info = sample();
        let odd = &info.mounts()[5];
        assert_eq!(
            odd.mount_point.as_os_str().as_bytes(),
            b"/mnt/my dir\nwith\todd\\name"
        );
        assert_eq!(odd.source, "my src");
        assert_eq!(odd.optional_fields, ["unbindable"]);
        assert_eq!(odd.optional_field("unbindable"), Some(""));
        assert!(info.is_mount_point(Path::new("/mnt/my dir\nwith\todd\\name")));
        assert!(!info.is_mount_point(Path::new("/mnt/my dir")));
    }

    #[test]
    fn queries_normalize_paths_lexically() {
        let info = sample();
        assert!(info.is_mount_point(Path::new("/srv/pool/")));
        assert!(info.is_mount_point(Path::new("/srv//pool")));
        assert!(info.is_mount_point(Path::new("/srv/./x/../pool")));
        assert!(info.is_mount_point(Path::new("/../srv/pool")));
        assert!(!info.is_mount_point(Path::new("/srv")));
        assert!(!info.is_mount_point(Path::new("/srv/pool/sub")));
        assert_eq!(normalize(Path::new("/a/b/../../..")), Path::new("/"));
    }

    #[test]
    fn stacked_mounts_are_ordered_bottom_to_top() {
        // Listed out of stacking order on purpose: 60 sits on 50, 70 on 60.
        let text = "\
27 1 8:1 / / rw - ext4 /dev/sda1 rw
70 60 0:52 / /stack rw - tmpfs third rw
50 27 0:50 / /stack rw - tmpfs first rw
60 50 0:51 / /stack ro - tmpfs second rw
";
        let info = MountInfo::parse(text).unwrap();
        let ids: Vec<u32> = info
            .mounts_at(Path::new("/stack"))
            .iter()
            .map(|m| m.mount_id)
            .collect();
        assert_eq!(ids, [50, 60, 70]);
        assert_eq!(
            info.top_mount_at(Path::new("/stack")).unwrap().source,
            "third"
        );
        assert!(info.mounts_at(Path::new("/nothing")).is_empty());
        assert!(info.top_mount_at(Path::new("/nothing")).is_none());
    }

    #[test]
    fn empty_source_field_is_allowed() {
        // `mount -t tmpfs "" /x` shows as two spaces between type and options.
        let info = MountInfo::parse("80 27 0:60 / /x rw - tmpfs  rw\n").unwrap();
        let x = &info.mounts()[0];
        assert_eq!(x.source, "");
        assert_eq!(x.fs_type, "tmpfs");
        assert_eq!(x.super_options, ["rw"]);
    }

    #[test]
    fn escaped_comma_stays_inside_one_option() {
        let info =
            MountInfo::parse("81 27 0:61 / /y rw - fuse.x src rw,subtype=a\\054b,user_id=0\n")
                .unwrap();
        let y = &info.mounts()[0];
        assert_eq!(y.super_options, ["rw", "subtype=a,b", "user_id=0"]);
        assert_eq!(y.fs_type, "fuse.x");
    }

    #[test]
    fn non_utf8_paths_survive() {
        let mut line = b"82 27 0:62 / /z".to_vec();
        line.push(0xff);
        line.extend_from_slice(b" rw - tmpfs tmpfs rw\n");
        let info = MountInfo::parse_bytes(&line).unwrap();
        assert_eq!(
            info.mounts()[0].mount_point.as_os_str().as_bytes(),
            b"/z\xff"
        );
    }

    #[test]
    fn unescape_edge_cases() {
        assert_eq!(unescape(b"a\\040b"), b"a b");
        assert_eq!(unescape(b"\\134\\134"), b"\\\\");
        assert_eq!(unescape(b"trailing\\04"), b"trailing\\04");
        assert_eq!(unescape(b"not\\09octal"), b"not\\09octal");
        assert_eq!(unescape(b"big\\777"), b"big\\777");
        assert_eq!(unescape(b"\\"), b"\\");
    }

    #[test]
    fn malformed_lines_are_rejected_with_line_number() {
        let cases = [
            "22 27 0:21 / /proc rw,relatime proc proc rw", // no separator
            "22 27 0:21 / /proc rw - proc proc",           // too few fields
            "22 27 0:21 / /proc rw - proc proc rw extra",  // too many after "-"
            "x 27 0:21 / /proc rw - proc proc rw",         // bad id
            "22 27 021 / /proc rw - proc proc rw",         // bad major:minor
            "22 27 0:z / /proc rw - proc proc rw",         // bad minor
        ];
        for case in cases {
            let text = format!("27 1 8:1 / / rw - ext4 /dev/sda1 rw\n{case}\n");
            match MountInfo::parse(&text) {
                Err(MountInfoError::Parse { line, .. }) => assert_eq!(line, 2, "{case}"),
                other => panic!("{case:?} was accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn empty_input_is_an_empty_table() {
        assert!(MountInfo::parse("").unwrap().mounts().is_empty());
        assert!(MountInfo::parse("\n").unwrap().mounts().is_empty());
    }

    #[test]
    fn reads_the_live_table() {
        let info = MountInfo::read().expect("/proc/self/mountinfo is readable");
        assert!(info.is_mount_point(Path::new("/")), "{info:?}");
        assert!(info.is_mount_point(Path::new("/proc")));
    }
}
