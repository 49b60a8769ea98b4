//! What is on a device before it is staged, and whether it may be
//! formatted.
//!
//! `blkid -p -o export DEV` probes the device itself (no cache) for every
//! signature libblkid knows: filesystems, LVM PVs, RAID members, partition
//! tables, swap, LUKS. Its exit code says 0 = something found, 2 = nothing
//! found, 8 = several signatures disagree (ambivalent).
//!
//! "Nothing found" is not "empty": a device full of data in no known format
//! probes the same as a fresh one. Thin volumes let us tell the two apart
//! exactly: a thin LV that was never written maps no blocks of the pool,
//! and device-mapper's status of it says how many sectors it maps. So a device is
//! formatted only when blkid finds no signature *and* the volume maps zero
//! sectors; anything else is refused and left as it is.

use std::path::Path;

use crate::error::{Error, Result};
use crate::node::Tools;

/// What blkid found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// No signature at all.
    None,
    /// A filesystem of this type (`TYPE=`, with `USAGE=filesystem` or no
    /// usage given).
    Filesystem(String),
    /// Something that is not a filesystem we could mount: a partition
    /// table, an LVM PV, a RAID member, swap, crypto, ...; the text says
    /// what, for the error message.
    Other(String),
    /// Several signatures that contradict each other.
    Ambivalent,
}

/// Parses `blkid -p -o export` output (exit code 0).
pub fn parse(export: &str) -> Signature {
    let mut ty = None;
    let mut usage = None;
    let mut pttype = None;
    for line in export.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "TYPE" => ty = Some(value.to_string()),
            "USAGE" => usage = Some(value.to_string()),
            "PTTYPE" => pttype = Some(value.to_string()),
            _ => {}
        }
    }
    match (ty, usage, pttype) {
        (Some(t), _, _) if t.is_empty() => Signature::Other("an empty TYPE".into()),
        (Some(t), Some(u), _) if u != "filesystem" => Signature::Other(format!("{t} ({u})")),
        (Some(t), _, _) => Signature::Filesystem(t),
        (None, _, Some(pt)) => Signature::Other(format!("a {pt} partition table")),
        (None, Some(u), None) => Signature::Other(format!("a signature with usage {u}")),
        (None, None, None) => Signature::Other("an unnamed signature".into()),
    }
}

/// Probes `dev` with blkid.
pub async fn probe(tools: &Tools, dev: &Path) -> Result<Signature> {
    let args = crate::argv!["-p", "-o", "export", dev.to_string_lossy()];
    match tools.run("blkid", &args).await {
        Ok(out) => Ok(parse(&out.stdout)),
        Err(e) => signature_of_exit(e),
    }
}

/// What a non-zero exit of `blkid -p` says: 2 is nothing found, 8 is
/// contradicting signatures; anything else is a failure.
fn signature_of_exit(e: Error) -> Result<Signature> {
    match e {
        Error::Command { code: Some(2), .. } => Ok(Signature::None),
        Error::Command { code: Some(8), .. } => Ok(Signature::Ambivalent),
        e => Err(e),
    }
}

/// What staging does with a device, given what is on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Fresh: make the filesystem, then mount.
    Format,
    /// Already holds the requested filesystem: mount it as it is.
    Mount,
    /// Leave it alone; the text says why (FAILED_PRECONDITION).
    Refuse(String),
}

/// The decision table for a mount-access stage. `mapped_sectors` is how
/// much of the pool the thin volume maps (see the module documentation).
pub fn plan(found: &Signature, wanted_fs: &str, mapped_sectors: u64) -> Plan {
    match found {
        Signature::Filesystem(fs) if fs == wanted_fs => Plan::Mount,
        Signature::Filesystem(fs) => Plan::Refuse(format!(
            "the volume holds a {fs} filesystem, not the requested {wanted_fs}; it is neither formatted nor mounted"
        )),
        Signature::Other(what) => Plan::Refuse(format!(
            "the volume holds {what}, not a {wanted_fs} filesystem; it is neither formatted nor mounted"
        )),
        Signature::Ambivalent => Plan::Refuse(
            "blkid finds several contradicting signatures on the volume; it is neither formatted nor mounted (inspect it with `wipefs`)".into(),
        ),
        Signature::None if mapped_sectors > 0 => Plan::Refuse(format!(
            "the volume holds {} bytes of data but no signature blkid recognises; refusing to format it",
            mapped_sectors * 512
        )),
        Signature::None => Plan::Format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blkid_export_output() {
        let ext4 = "DEVNAME=/dev/vx/big\nUUID=a970\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n";
        assert_eq!(parse(ext4), Signature::Filesystem("ext4".into()));
        let xfs = "DEVNAME=/dev/vx/bigx\nUUID=a2f1\nBLOCK_SIZE=512\nTYPE=xfs\nUSAGE=filesystem\n";
        assert_eq!(parse(xfs), Signature::Filesystem("xfs".into()));
        let pv = "DEVNAME=/dev/x\nUUID=abc\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n";
        assert_eq!(parse(pv), Signature::Other("LVM2_member (raid)".into()));
        let gpt = "DEVNAME=/dev/x\nPTUUID=1234\nPTTYPE=gpt\n";
        assert_eq!(parse(gpt), Signature::Other("a gpt partition table".into()));
        let swap = "DEVNAME=/dev/x\nTYPE=swap\nUSAGE=other\n";
        assert_eq!(parse(swap), Signature::Other("swap (other)".into()));
        let luks = "TYPE=crypto_LUKS\nUSAGE=crypto\n";
        assert!(matches!(parse(luks), Signature::Other(_)));
        assert!(matches!(parse("DEVNAME=/dev/x\n"), Signature::Other(_)));
        // Older blkid prints no USAGE for some filesystems.
        assert_eq!(parse("TYPE=ext4\n"), Signature::Filesystem("ext4".into()));
    }

    /// blkid's exit code, kept a number, decides; its text never does.
    #[test]
    fn blkid_exit_codes_decide_the_signature() {
        let exit = |code: Option<i32>, signal: Option<i32>| Error::Command {
            program: "blkid".into(),
            argv: vec![],
            code,
            signal,
            stderr: "whatever it printed".into(),
        };
        assert_eq!(
            signature_of_exit(exit(Some(2), None)).unwrap(),
            Signature::None
        );
        assert_eq!(
            signature_of_exit(exit(Some(8), None)).unwrap(),
            Signature::Ambivalent
        );
        assert!(signature_of_exit(exit(Some(4), None)).is_err());
        assert!(signature_of_exit(exit(None, Some(2))).is_err());
        let missing = Error::MissingTool {
            program: "blkid".into(),
            package: "util-linux".into(),
        };
        assert!(matches!(
            signature_of_exit(missing),
            Err(Error::MissingTool { .. })
        ));
    }

    #[test]
    fn only_an_unwritten_device_without_signature_is_formatted() {
        let ext4 = Signature::Filesystem("ext4".into());
        assert_eq!(plan(&Signature::None, "ext4", 0), Plan::Format);
        assert_eq!(plan(&ext4, "ext4", 1000), Plan::Mount);
        for (found, mapped) in [
            (Signature::None, 1),
            (ext4.clone(), 0),
            (Signature::Other("LVM2_member (raid)".into()), 0),
            (Signature::Ambivalent, 0),
        ] {
            match plan(&found, "xfs", mapped) {
                Plan::Refuse(why) => {
                    assert!(why.contains("neither") || why.contains("refusing"), "{why}")
                }
                other => panic!("{found:?}/{mapped}: {other:?}"),
            }
        }
        match plan(&ext4, "xfs", 8) {
            Plan::Refuse(why) => assert!(why.contains("ext4") && why.contains("xfs"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
