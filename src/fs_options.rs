//! The mkfs and mount options a device class or a StorageClass may set:
//! an allow-list per filesystem, each value checked for its shape. No
//! option reaches mkfs or mount(2) unless this module accepted it; every
//! refusal names the option and says why.
//!
//! mkfs options are written as one string of words separated by spaces
//! (`-b 4096 -O ^has_journal`), the way a StorageClass parameter carries
//! them; each option is its own word and its value the next one. What the
//! driver sets itself (`-q`, ext4's `-E nodiscard,...`, xfs's `-K`) and
//! anything that forces, reads host files or writes elsewhere (`-F`, `-f`,
//! `-d`, `-p`, `-c`, `-S`, `-n`, `-N` of xfs) is not on the lists.

use std::collections::BTreeSet;

use crate::sys::MsFlags;

/// What a value must look like.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// A decimal integer in `[min, max]`.
    Uint(u64, u64),
    /// A power of two in `[min, max]`.
    Pow2(u64, u64),
    /// A byte count: digits, then at most one of `k`, `m`, `g` (either case).
    Size,
    /// `0` or `1`.
    Bool,
    OneOf(&'static [&'static str]),
    /// 1 to n letters, digits, `_`, `.`, `-`.
    Label(usize),
    /// A percentage from 0 to 50, with at most one decimal point.
    Percent,
    /// `uid:gid`, both decimal.
    Owner,
    /// A comma list of these feature names, each may be `^`-prefixed (off).
    Features(&'static [&'static str]),
    /// A comma list of `key=value`, each key once, each value its shape.
    Sub(&'static [(&'static str, Shape)]),
}

use Shape::*;

const U32: u64 = u32::MAX as u64;

const EXT4_FEATURES: &[&str] = &[
    "64bit",
    "casefold",
    "dir_index",
    "dir_nlink",
    "ea_inode",
    "encrypt",
    "extent",
    "extents",
    "extra_isize",
    "filetype",
    "flex_bg",
    "has_journal",
    "huge_file",
    "inline_data",
    "large_dir",
    "large_file",
    "metadata_csum",
    "metadata_csum_seed",
    "orphan_file",
    "project",
    "quota",
    "resize_inode",
    "sparse_super",
    "sparse_super2",
    "stable_inodes",
    "uninit_bg",
    "verity",
];

/// mke2fs(8)'s options a volume may be made with.
const EXT4_MKFS: &[(&str, Option<Shape>)] = &[
    ("-b", Some(Pow2(1024, 65536))),
    ("-e", Some(OneOf(&["continue", "remount-ro"]))),
    (
        "-E",
        Some(Sub(&[
            ("stride", Uint(1, U32)),
            ("stripe_width", Uint(1, U32)),
            ("stripe-width", Uint(1, U32)),
            ("root_owner", Owner),
            ("encoding", OneOf(&["utf8", "utf8-12.1"])),
        ])),
    ),
    ("-G", Some(Pow2(1, 1 << 20))),
    ("-i", Some(Uint(1024, 1 << 26))),
    ("-I", Some(Pow2(128, 4096))),
    ("-j", None),
    ("-J", Some(Sub(&[("size", Uint(1, 10240))]))),
    ("-L", Some(Label(16))),
    ("-m", Some(Percent)),
    ("-N", Some(Uint(1, U32))),
    ("-O", Some(Features(EXT4_FEATURES))),
    (
        "-T",
        Some(OneOf(&[
            "default",
            "small",
            "big",
            "huge",
            "news",
            "largefile",
            "largefile4",
        ])),
    ),
];

/// mkfs.xfs(8)'s options a volume may be made with.
const XFS_MKFS: &[(&str, Option<Shape>)] = &[
    ("-b", Some(Sub(&[("size", Pow2(512, 65536))]))),
    (
        "-d",
        Some(Sub(&[
            ("agcount", Uint(1, U32)),
            ("agsize", Size),
            ("su", Size),
            ("sw", Uint(1, U32)),
            ("sunit", Uint(0, U32)),
            ("swidth", Uint(0, U32)),
        ])),
    ),
    (
        "-i",
        Some(Sub(&[
            ("size", Pow2(256, 2048)),
            ("maxpct", Uint(0, 100)),
            ("sparse", Bool),
            ("align", Bool),
        ])),
    ),
    (
        "-l",
        Some(Sub(&[
            ("size", Size),
            ("lazy-count", Bool),
            ("su", Size),
            ("sunit", Uint(0, U32)),
        ])),
    ),
    ("-L", Some(Label(12))),
    (
        "-m",
        Some(Sub(&[
            ("crc", Bool),
            ("finobt", Bool),
            ("reflink", Bool),
            ("rmapbt", Bool),
            ("bigtime", Bool),
            ("inobtcount", Bool),
        ])),
    ),
    (
        "-n",
        Some(Sub(&[("size", Pow2(512, 65536)), ("ftype", Bool)])),
    ),
    ("-s", Some(Sub(&[("size", Pow2(512, 32768))]))),
];

/// ext4's own mount options (the generic ones, `ro`, `noatime`, ..., are
/// `node::mount_options`'): no `errors=panic`, no `norecovery`.
const EXT4_MOUNT: &[(&str, Option<Shape>)] = &[
    ("acl", None),
    ("auto_da_alloc", None),
    ("barrier", Some(Bool)),
    ("block_validity", None),
    ("bsdgroups", None),
    ("commit", Some(Uint(0, 3600))),
    ("data", Some(OneOf(&["journal", "ordered", "writeback"]))),
    ("delalloc", None),
    ("dioread_lock", None),
    ("dioread_nolock", None),
    ("discard", None),
    ("errors", Some(OneOf(&["continue", "remount-ro"]))),
    ("grpid", None),
    ("grpquota", None),
    ("i_version", None),
    ("init_itable", Some(Uint(0, 1000))),
    ("inode_readahead_blks", Some(Pow2(1, 1 << 30))),
    ("journal_async_commit", None),
    ("journal_checksum", None),
    ("journal_ioprio", Some(Uint(0, 7))),
    ("max_batch_time", Some(Uint(0, U32))),
    ("min_batch_time", Some(Uint(0, U32))),
    ("noacl", None),
    ("noauto_da_alloc", None),
    ("nobarrier", None),
    ("noblock_validity", None),
    ("nodelalloc", None),
    ("nodiscard", None),
    ("nogrpid", None),
    ("noinit_itable", None),
    ("nojournal_checksum", None),
    ("nombcache", None),
    ("noquota", None),
    ("prefetch_block_bitmaps", None),
    ("prjquota", None),
    ("quota", None),
    ("resgid", Some(Uint(0, U32))),
    ("resuid", Some(Uint(0, U32))),
    ("stripe", Some(Uint(0, U32))),
    ("sysvgroups", None),
    ("user_xattr", None),
    ("usrquota", None),
];

/// xfs's own mount options; `nouuid` is always set (see
/// `node::mount_options`).
const XFS_MOUNT: &[(&str, Option<Shape>)] = &[
    ("allocsize", Some(Size)),
    ("bsdgroups", None),
    ("discard", None),
    ("filestreams", None),
    ("gqnoenforce", None),
    ("gquota", None),
    ("grpid", None),
    ("grpquota", None),
    ("ikeep", None),
    ("inode32", None),
    ("inode64", None),
    ("largeio", None),
    ("logbsize", Some(Size)),
    ("logbufs", Some(Uint(2, 8))),
    ("noalign", None),
    ("nodiscard", None),
    ("nogrpid", None),
    ("noikeep", None),
    ("nolargeio", None),
    ("noquota", None),
    ("nouuid", None),
    ("pqnoenforce", None),
    ("pquota", None),
    ("prjquota", None),
    ("qnoenforce", None),
    ("quota", None),
    ("sunit", Some(Uint(0, U32))),
    ("swalloc", None),
    ("swidth", Some(Uint(0, U32))),
    ("sysvgroups", None),
    ("uqnoenforce", None),
    ("uquota", None),
    ("usrquota", None),
    ("wsync", None),
];

fn mkfs_list(fs: &str) -> Result<&'static [(&'static str, Option<Shape>)], String> {
    match fs {
        "ext4" => Ok(EXT4_MKFS),
        "xfs" => Ok(XFS_MKFS),
        other => Err(format!("fs_type {other:?} takes no mkfs options")),
    }
}

fn mount_list(fs: &str) -> Result<&'static [(&'static str, Option<Shape>)], String> {
    match fs {
        "ext4" => Ok(EXT4_MOUNT),
        "xfs" => Ok(XFS_MOUNT),
        other => Err(format!("fs_type {other:?} takes no mount options")),
    }
}

/// The mkfs options allowed for `fs` and, for a `Sub` or `Features`
/// value, the names within it (for the docs' check).
pub fn allowed_mkfs_words(fs: &str) -> Vec<&'static str> {
    mkfs_list(fs).map(listed_words).unwrap_or_default()
}

/// The filesystem's own mount options allowed for `fs`.
pub fn allowed_mount_words(fs: &str) -> Vec<&'static str> {
    mount_list(fs).map(listed_words).unwrap_or_default()
}

fn listed_words(list: &'static [(&'static str, Option<Shape>)]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for (name, shape) in list {
        out.push(*name);
        match shape {
            Some(Sub(keys)) => out.extend(keys.iter().map(|(k, _)| *k)),
            Some(Features(f)) | Some(OneOf(f)) => out.extend(f.iter().copied()),
            _ => {}
        }
    }
    out
}

fn names(list: &[(&str, Option<Shape>)]) -> String {
    list.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" ")
}

/// mkfs options as checked: each option with its value (`None` for a
/// flag), in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MkfsOptions(Vec<(String, Option<String>)>);

impl MkfsOptions {
    /// The words as written back (one space between), for a tag or a log.
    pub fn text(&self) -> String {
        let mut words: Vec<&str> = Vec::new();
        for (opt, value) in &self.0 {
            words.push(opt);
            words.extend(value.as_deref());
        }
        words.join(" ")
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each option with its value (`None` for a flag).
    pub fn pairs(&self) -> Vec<(&str, Option<&str>)> {
        self.0
            .iter()
            .map(|(o, v)| (o.as_str(), v.as_deref()))
            .collect()
    }
}

/// Checks `text` as mkfs options for `fs`: each option on its list, given
/// once, its value of its shape. `Err` names the first option refused.
pub fn mkfs_options(fs: &str, text: &str) -> Result<MkfsOptions, String> {
    let list = mkfs_list(fs)?;
    let mut words = text.split_ascii_whitespace();
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    while let Some(opt) = words.next() {
        let Some((_, shape)) = list.iter().find(|(n, _)| *n == opt) else {
            return Err(format!(
                "mkfs option {opt:?} is not allowed for {fs} (allowed: {})",
                names(list)
            ));
        };
        if !seen.insert(opt) {
            return Err(format!("mkfs option {opt:?} is given twice"));
        }
        let value = match shape {
            None => None,
            Some(shape) => {
                let value = words
                    .next()
                    .ok_or_else(|| format!("mkfs option {opt:?} needs a value"))?;
                check(shape, value).map_err(|why| format!("mkfs option {opt} {value:?}: {why}"))?;
                Some(value.to_string())
            }
        };
        out.push((opt.to_string(), value));
    }
    Ok(MkfsOptions(out))
}

/// Words of mount(8) that only steer mount(8) or fstab; they mean nothing
/// to the kernel and are dropped.
const IGNORED: &[&str] = &["defaults", "auto", "noauto", "nofail", "_netdev"];

/// Words that would change *how* the mount is made (bind, move,
/// propagation) rather than set an option; refused.
const OPERATIONS: &[&str] = &[
    "bind",
    "rbind",
    "move",
    "remount",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "private",
    "rprivate",
    "unbindable",
    "runbindable",
];

/// Generic option words and the `MS_*` bit each sets (`true`) or clears.
const GENERIC: &[(&str, MsFlags, bool)] = &[
    ("ro", MsFlags::MS_RDONLY, true),
    ("rw", MsFlags::MS_RDONLY, false),
    ("nosuid", MsFlags::MS_NOSUID, true),
    ("suid", MsFlags::MS_NOSUID, false),
    ("nodev", MsFlags::MS_NODEV, true),
    ("dev", MsFlags::MS_NODEV, false),
    ("noexec", MsFlags::MS_NOEXEC, true),
    ("exec", MsFlags::MS_NOEXEC, false),
    ("sync", MsFlags::MS_SYNCHRONOUS, true),
    ("async", MsFlags::MS_SYNCHRONOUS, false),
    ("dirsync", MsFlags::MS_DIRSYNC, true),
    ("noatime", MsFlags::MS_NOATIME, true),
    ("atime", MsFlags::MS_NOATIME, false),
    ("nodiratime", MsFlags::MS_NODIRATIME, true),
    ("diratime", MsFlags::MS_NODIRATIME, false),
    ("relatime", MsFlags::MS_RELATIME, true),
    ("norelatime", MsFlags::MS_RELATIME, false),
    ("strictatime", MsFlags::MS_STRICTATIME, true),
    ("nostrictatime", MsFlags::MS_STRICTATIME, false),
    ("lazytime", MsFlags::MS_LAZYTIME, true),
    ("nolazytime", MsFlags::MS_LAZYTIME, false),
    ("silent", MsFlags::MS_SILENT, true),
    ("loud", MsFlags::MS_SILENT, false),
];

/// What a mount option word is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountWord {
    /// Steers mount(8) or fstab only; dropped.
    Ignored,
    /// A generic option: the `MS_*` bit it sets (`true`) or clears.
    Generic(MsFlags, bool),
    /// The filesystem's own option, passed in mount(2)'s data.
    Own,
}

/// Whether `word` would change how a mount is made (`bind`, `remount`,
/// propagation): never a mount option.
pub fn is_operation(word: &str) -> bool {
    OPERATIONS.contains(&word)
}

/// Checks one mount option word for `fs`: a generic word, or one of the
/// filesystem's own ([`mount_option`]). Words that change how a mount is
/// made (`bind`, `remount`, propagation) are refused.
pub fn mount_word(fs: &str, word: &str) -> Result<MountWord, String> {
    if IGNORED.contains(&word) {
        return Ok(MountWord::Ignored);
    }
    if OPERATIONS.contains(&word) {
        return Err(format!(
            "mount flag {word:?} changes how a mount is made, it is not a mount option"
        ));
    }
    if let Some((_, bit, set)) = GENERIC.iter().find(|(name, _, _)| *name == word) {
        return Ok(MountWord::Generic(*bit, *set));
    }
    mount_option(fs, word).map(|()| MountWord::Own)
}

/// A filesystem's own mount option (not a generic one): on `fs`'s list,
/// with a value (`key=value`) exactly when it takes one, of its shape.
pub fn mount_option(fs: &str, word: &str) -> Result<(), String> {
    let list = mount_list(fs)?;
    let (key, value) = match word.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (word, None),
    };
    let Some((_, shape)) = list.iter().find(|(n, _)| *n == key) else {
        return Err(format!(
            "mount option {word:?} is not allowed for {fs} (allowed, besides the generic ones: {})",
            names(list)
        ));
    };
    match (shape, value) {
        (None, None) => Ok(()),
        (Some(shape), Some(v)) => {
            check(shape, v).map_err(|why| format!("mount option {word:?}: {why}"))
        }
        // `barrier` alone is ext4's `barrier=1`.
        (Some(Bool), None) => Ok(()),
        (Some(_), None) => Err(format!("mount option {word:?} needs a value ({key}=...)")),
        (None, Some(_)) => Err(format!("mount option {key:?} takes no value")),
    }
}

/// The key of a mount option (`data` of `data=journal`), so a later
/// option of the same key can replace an earlier one.
pub fn mount_option_key(word: &str) -> &str {
    word.split_once('=').map_or(word, |(k, _)| k)
}

fn check(shape: &Shape, v: &str) -> Result<(), String> {
    let uint = |v: &str| -> Result<u64, String> {
        if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err("not a decimal number".into());
        }
        v.parse().map_err(|_| "number too large".to_string())
    };
    match *shape {
        Uint(min, max) => {
            let n = uint(v)?;
            if !(min..=max).contains(&n) {
                return Err(format!("must be between {min} and {max}"));
            }
        }
        Pow2(min, max) => {
            let n = uint(v)?;
            if !(min..=max).contains(&n) || !n.is_power_of_two() {
                return Err(format!("must be a power of two between {min} and {max}"));
            }
        }
        Size => {
            let digits = v.strip_suffix(['k', 'm', 'g', 'K', 'M', 'G']).unwrap_or(v);
            uint(digits).map_err(|_| "must be a byte count (digits, then k, m or g)")?;
        }
        Bool => {
            if v != "0" && v != "1" {
                return Err("must be 0 or 1".into());
            }
        }
        OneOf(values) => {
            if !values.contains(&v) {
                return Err(format!("must be one of {values:?}"));
            }
        }
        Label(max) => {
            let ok = !v.is_empty()
                && v.len() <= max
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok {
                return Err(format!(
                    "must be 1 to {max} letters, digits, '_', '.' or '-'"
                ));
            }
        }
        Percent => {
            let (whole, frac) = v.split_once('.').unwrap_or((v, "0"));
            uint(whole)?;
            uint(frac)?;
            let n: f64 = v.parse().map_err(|_| "not a number".to_string())?;
            if !(0.0..=50.0).contains(&n) {
                return Err("must be between 0 and 50".into());
            }
        }
        Owner => {
            let (u, g) = v.split_once(':').ok_or("must be uid:gid")?;
            let (u, g) = (uint(u)?, uint(g)?);
            if u > U32 || g > U32 {
                return Err("uid and gid must fit 32 bits".into());
            }
        }
        Features(known) => {
            for f in v.split(',') {
                if !known.contains(&f.strip_prefix('^').unwrap_or(f)) {
                    return Err(format!("feature {f:?} is not one of {known:?}"));
                }
            }
        }
        Sub(keys) => {
            let mut seen = BTreeSet::new();
            for part in v.split(',') {
                let (k, val) = part
                    .split_once('=')
                    .ok_or_else(|| format!("{part:?} is not key=value"))?;
                let Some((_, shape)) = keys.iter().find(|(n, _)| *n == k) else {
                    let known: Vec<&str> = keys.iter().map(|(n, _)| *n).collect();
                    return Err(format!("{k:?} is not one of {known:?}"));
                };
                if !seen.insert(k) {
                    return Err(format!("{k:?} is given twice"));
                }
                check(shape, val).map_err(|why| format!("{k}={val:?}: {why}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_mkfs_options_pass_in_order() {
        let o = mkfs_options(
            "ext4",
            " -b 4096  -O ^has_journal,metadata_csum -m 0.5 -L data_1 ",
        )
        .unwrap();
        assert_eq!(
            o.text(),
            "-b 4096 -O ^has_journal,metadata_csum -m 0.5 -L data_1"
        );
        assert_eq!(
            o.pairs(),
            vec![
                ("-b", Some("4096")),
                ("-O", Some("^has_journal,metadata_csum")),
                ("-m", Some("0.5")),
                ("-L", Some("data_1"))
            ]
        );
        let o = mkfs_options("ext4", "-j -E stride=16,root_owner=1000:1000 -T news").unwrap();
        assert_eq!(o.pairs()[0], ("-j", None));
        let o = mkfs_options("xfs", "-m reflink=0,crc=1 -d su=64k,sw=4 -L db").unwrap();
        assert_eq!(o.text(), "-m reflink=0,crc=1 -d su=64k,sw=4 -L db");
        assert!(mkfs_options("ext4", "").unwrap().is_empty());
    }

    #[test]
    fn hostile_or_foreign_mkfs_options_are_refused_by_name() {
        for (fs, text, named) in [
            ("ext4", "-O ^has_journal; rm", "^has_journal;"),
            ("ext4", "-O ^has_journal ; rm -rf /", "\";\""),
            ("ext4", "--", "\"--\""),
            ("ext4", "-F", "\"-F\""),
            ("ext4", "-b4096", "\"-b4096\""),
            ("ext4", "-b 3000", "power of two"),
            ("ext4", "-b", "needs a value"),
            ("ext4", "-b 1024 -b 4096", "twice"),
            ("ext4", "-d /etc", "\"-d\""),
            ("ext4", "-S", "\"-S\""),
            ("ext4", "-E nodiscard", "nodiscard"),
            ("ext4", "-O mmp", "mmp"),
            ("ext4", "-m 51", "between 0 and 50"),
            ("ext4", "-m 1e1", "decimal"),
            ("ext4", "-L $(id)", "letters"),
            ("ext4", "-L seventeen_chars_x", "1 to 16"),
            ("ext4", "-E root_owner=0", "uid:gid"),
            ("xfs", "-E stride=1", "\"-E\""),
            ("ext4", "-m reflink=0", "decimal"),
            ("xfs", "-O ^has_journal", "\"-O\""),
            ("xfs", "-f", "\"-f\""),
            ("xfs", "-K", "\"-K\""),
            ("xfs", "-p /etc/passwd", "\"-p\""),
            ("xfs", "-m crc=2", "0 or 1"),
            ("xfs", "-m crc=1,crc=0", "twice"),
            ("xfs", "-d file=1", "\"file\""),
            ("xfs", "-d su=64x", "byte count"),
            ("btrfs", "-b 4096", "btrfs"),
        ] {
            let err = mkfs_options(fs, text).unwrap_err();
            assert!(err.contains(named), "{fs} {text:?}: {err}");
        }
    }

    #[test]
    fn mount_options_are_listed_per_filesystem_with_value_shapes() {
        for (fs, word) in [
            ("ext4", "data=journal"),
            ("ext4", "commit=30"),
            ("ext4", "barrier"),
            ("ext4", "barrier=0"),
            ("ext4", "discard"),
            ("xfs", "allocsize=1m"),
            ("xfs", "logbufs=8"),
            ("xfs", "nouuid"),
        ] {
            assert_eq!(mount_option(fs, word), Ok(()), "{fs} {word}");
        }
        for (fs, word, named) in [
            ("ext4", "errors=panic", "must be one of"),
            ("ext4", "norecovery", "not allowed"),
            ("ext4", "data", "needs a value"),
            ("ext4", "discard=1", "takes no value"),
            ("ext4", "commit=x", "decimal"),
            ("ext4", "allocsize=1m", "not allowed for ext4"),
            ("xfs", "data=journal", "not allowed for xfs"),
            ("xfs", "logbufs=9", "between 2 and 8"),
            ("xfs", "nouuid=1", "takes no value"),
        ] {
            let err = mount_option(fs, word).unwrap_err();
            assert!(err.contains(named), "{fs} {word}: {err}");
        }
        assert_eq!(mount_option_key("data=journal"), "data");
        assert_eq!(mount_option_key("discard"), "discard");
    }
}
