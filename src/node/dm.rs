//! Device-mapper, for what LVM does not offer the node:
//!
//! - **Mapped sectors of a thin volume** (its DM_TABLE_STATUS): exact, where
//!   the Data% of `lvs` is rounded to 0.01 % (one written chunk of a
//!   100 GiB volume still shows 0.00). The format guard relies on it.
//! - **Read-only overlays** for read-only raw block publishes. A device
//!   node with mode 0400, or a read-only bind mount of a device node, does
//!   not stop root from writing: the kernel checks neither for device
//!   files. A device-mapper `linear` device created `--readonly` over the
//!   LV does: the kernel fails every write to it with EPERM. Each
//!   read-only publish gets its own overlay, named after the volume and a
//!   hash of the target path, so the LV itself stays writable for
//!   read-write publishes. The overlay holds the LV open, so LVM cannot
//!   deactivate the LV under it.
//!
//! Devices are found again through sysfs (`/sys/dev/block/M:m/dm/name`,
//! `slaves/`, `holders/`, `ro`), so no state is kept.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::node::Tools;

/// Name prefix of the overlays this driver creates; nothing else is ever
/// removed by the node service.
pub const OVERLAY_PREFIX: &str = "tpcsi-ro-";

const SYS_DEV_BLOCK: &str = "/sys/dev/block";

/// The overlay name for one read-only publish of `volume_id` at `target`.
/// Stable, so a retried publish finds the overlay a failed one left.
pub fn overlay_name(volume_id: &str, target: &Path) -> String {
    format!(
        "{OVERLAY_PREFIX}{volume_id}-{}",
        crate::node::paths::digest(target)
    )
}

/// Parses the status of a thin device's one target (`<mapped sectors>
/// <highest mapped sector|->`, or `Fail`): its mapped sectors.
pub fn parse_thin_status(target: &crate::sys::TargetStatus) -> Result<u64> {
    let fields: Vec<&str> = target.status.split_whitespace().collect();
    match (target.target_type.as_str(), fields.as_slice()) {
        ("thin", ["Fail", ..]) => Err(Error::FailedPrecondition(
            "the thin volume is marked Fail by the kernel: check the thin pool (dmesg, lvs -a)"
                .into(),
        )),
        ("thin", [mapped, ..]) => mapped.parse().map_err(|_| {
            Error::Internal(format!(
                "thin status: bad mapped sector count in {:?}",
                target.status
            ))
        }),
        _ => Err(Error::Internal(format!(
            "not a thin device: {} target with status {:?}",
            target.target_type, target.status
        ))),
    }
}

/// How many sectors of the pool the active thin volume `major:minor` maps
/// (DM_TABLE_STATUS: no `dmsetup` process).
pub async fn thin_mapped_sectors(tools: &Tools, major: u32, minor: u32) -> Result<u64> {
    let targets = tools
        .blocking("read a thin volume's mapped sectors", move || {
            Ok(crate::sys::dm_table_status(crate::sys::By::Numbers(
                major, minor,
            ))?)
        })
        .await?
        .ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "device {major}:{minor} is not active in device-mapper"
            ))
        })?;
    match targets.as_slice() {
        [one] => parse_thin_status(one),
        more => Err(Error::Internal(format!(
            "device {major}:{minor} has {} targets, not one thin target",
            more.len()
        ))),
    }
}

fn sys_dir(major: u32, minor: u32) -> PathBuf {
    Path::new(SYS_DEV_BLOCK).join(format!("{major}:{minor}"))
}

/// True when the kernel has a block device `major:minor`.
pub fn device_exists(major: u32, minor: u32) -> bool {
    sys_dir(major, minor).exists()
}

/// The kernel's name for a block device (`dm-4`).
pub fn kernel_name(major: u32, minor: u32) -> Option<String> {
    let link = std::fs::read_link(sys_dir(major, minor)).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// The device-mapper name of `major:minor`, if it is a dm device.
pub fn dm_name(major: u32, minor: u32) -> Option<String> {
    std::fs::read_to_string(sys_dir(major, minor).join("dm/name"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn list(dir: PathBuf) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn numbers_of(kernel_name: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(format!("/sys/class/block/{kernel_name}/dev")).ok()?;
    let (ma, mi) = text.trim().split_once(':')?;
    Some((ma.parse().ok()?, mi.parse().ok()?))
}

/// If `dev` is one of our read-only overlays stacked on the LV `lv`, its
/// name.
pub fn overlay_on(dev: (u32, u32), lv: (u32, u32)) -> Option<String> {
    let name = dm_name(dev.0, dev.1)?;
    (name.starts_with(OVERLAY_PREFIX) && stacked_on(dev, lv)).then_some(name)
}

/// True when the dm device `dev` maps the device `lower` and nothing else
/// (its one slave in sysfs).
pub fn stacked_on(dev: (u32, u32), lower: (u32, u32)) -> bool {
    kernel_name(lower.0, lower.1).is_some_and(|k| list(sys_dir(dev.0, dev.1).join("slaves")) == [k])
}

/// Our overlays currently stacked on the LV `lv`: (name, numbers).
pub fn overlays_of(lv: (u32, u32)) -> Vec<(String, (u32, u32))> {
    list(sys_dir(lv.0, lv.1).join("holders"))
        .iter()
        .filter_map(|k| numbers_of(k))
        .filter_map(|n| overlay_on(n, lv).map(|name| (name, n)))
        .collect()
}

/// True when the block device `dev` takes discards (its queue's
/// `discard_max_bytes` is not 0: a crypt mapping opened without
/// `--allow-discards` shows 0).
pub fn passes_discards(dev: (u32, u32)) -> bool {
    std::fs::read_to_string(sys_dir(dev.0, dev.1).join("queue/discard_max_bytes"))
        .is_ok_and(|s| s.trim().parse::<u64>().is_ok_and(|n| n > 0))
}

/// True when the kernel refuses writes to `major:minor`.
pub fn is_read_only(major: u32, minor: u32) -> bool {
    std::fs::read_to_string(sys_dir(major, minor).join("ro")).is_ok_and(|s| s.trim() == "1")
}

/// Every overlay of this driver stacked on an LV of VG `vg`, with the
/// device-mapper name of that LV. Overlays over another VG's LVs (another
/// driver instance on this node) are not listed.
pub fn overlays_in_vg(vg: &str) -> Vec<(String, String)> {
    stacked_in_vg(vg, OVERLAY_PREFIX)
}

/// Every device of this driver whose name starts with `prefix` (its
/// read-only overlays, its crypt mappings) stacked on an LV of VG `vg`,
/// with the device-mapper name of that LV.
pub fn stacked_in_vg(vg: &str, prefix: &str) -> Vec<(String, String)> {
    let vg_prefix = crate::lvm::lv_dm_name(vg, "");
    list(PathBuf::from("/sys/block"))
        .iter()
        .filter(|k| k.starts_with("dm-"))
        .filter_map(|k| numbers_of(k))
        .filter_map(|n| {
            let name = dm_name(n.0, n.1).filter(|name| name.starts_with(prefix))?;
            let slaves = list(sys_dir(n.0, n.1).join("slaves"));
            let [slave] = slaves.as_slice() else {
                return None;
            };
            let lv = std::fs::read_to_string(format!("/sys/block/{slave}/dm/name")).ok()?;
            let lv = lv.trim().to_string();
            lv.starts_with(&vg_prefix).then_some((name, lv))
        })
        .collect()
}

/// The volume id an overlay name was made from (see [`overlay_name`]).
pub fn overlay_volume(name: &str) -> Option<&str> {
    name.strip_prefix(OVERLAY_PREFIX)?
        .rsplit_once('-')
        .map(|(id, _)| id)
}

/// Our overlays that exist without a table (a `dmsetup create` stopped
/// between its create and its load), by name.
pub async fn tableless_overlays(tools: &Tools) -> Result<Vec<String>> {
    tableless(tools, OVERLAY_PREFIX).await
}

/// Our devices named with `prefix` that exist without a table (a
/// `dmsetup create` or `cryptsetup open` stopped between its create and
/// its load), by name.
pub async fn tableless(tools: &Tools, prefix: &str) -> Result<Vec<String>> {
    let prefix = prefix.to_string();
    tools
        .blocking("look for table-less devices", move || {
            let mut found = Vec::new();
            for n in crate::sys::dm_names()? {
                if n.starts_with(&prefix) && crate::sys::dm_has_table(&n)? == Some(false) {
                    found.push(n);
                }
            }
            Ok(found)
        })
        .await
}

/// The numbers of the dm device called `name`, if it exists.
pub fn find_by_name(name: &str) -> Option<(u32, u32)> {
    list(PathBuf::from("/sys/block"))
        .iter()
        .filter(|k| k.starts_with("dm-"))
        .filter_map(|k| numbers_of(k))
        .find(|n| dm_name(n.0, n.1).as_deref() == Some(name))
}

pub(crate) fn udev_args(tools: &Tools) -> Vec<String> {
    if tools.no_udev {
        // Without udev, libdevmapper must not wait for it, and makes the
        // /dev/mapper node itself.
        crate::argv!["--noudevsync", "--noudevrules"]
    } else {
        Vec::new()
    }
}

fn linear_table(lv: (u32, u32), sectors: u64) -> String {
    format!("0 {sectors} linear {}:{} 0", lv.0, lv.1)
}

/// Creates (or finds, when a retried publish made it already) the
/// read-only overlay `name` over the LV `lv` of `sectors` 512-byte
/// sectors, and returns its device numbers. An existing device of that
/// name that is not a read-only overlay of this LV is this driver's own
/// debris (the name is made from the volume and the target, and only this
/// driver makes it): it is replaced when nothing holds it open, and
/// refused, with what to do, while something does.
pub async fn ensure_overlay(
    tools: &Tools,
    name: &str,
    lv: (u32, u32),
    sectors: u64,
) -> Result<(u32, u32)> {
    enum Found {
        Reusable((u32, u32)),
        TableLess,
        Other,
        Nothing,
    }
    let nm = name.to_string();
    let found = tools
        .blocking("look for an overlay", move || {
            Ok(match find_by_name(&nm) {
                Some(n) if overlay_on(n, lv).is_some() && is_read_only(n.0, n.1) => {
                    Found::Reusable(n)
                }
                Some(_) => Found::Other,
                // A device with no table is in no sysfs listing.
                None => match crate::sys::dm_has_table(&nm)? {
                    None => Found::Nothing,
                    Some(false) => Found::TableLess,
                    Some(true) => Found::Other,
                },
            })
        })
        .await?;
    match found {
        Found::Reusable(n) => {
            tracing::info!(name, "read-only overlay already exists; reusing it");
            return Ok(n);
        }
        Found::Other => replace_leftover(tools, name, lv).await?,
        Found::TableLess => {
            // Our name, no table: an earlier create of this very overlay
            // was stopped half-way. It maps nothing, so it goes.
            remove_overlay(tools, name).await?;
            tracing::warn!(
                name,
                "removed a table-less overlay an interrupted create left"
            );
        }
        Found::Nothing => {}
    }
    let mut args = crate::argv![
        "create",
        name,
        "--readonly",
        "--table",
        linear_table(lv, sectors)
    ];
    args.extend(udev_args(tools));
    tools.run("dmsetup", &args).await?;
    let nm = name.to_string();
    let n = tools
        .blocking("find the new overlay", move || Ok(find_by_name(&nm)))
        .await?
        .ok_or_else(|| {
            Error::Internal(format!("dmsetup created {name} but sysfs does not show it"))
        })?;
    tracing::info!(name, lv = ?lv, overlay = ?n, sectors, "created read-only overlay");
    Ok(n)
}

/// What a device-mapper device called `name` is now: its numbers, open
/// count, target types and the kernel names it maps (for the log and the
/// error of [`replace_leftover`]).
fn describe(name: &str) -> (Option<(u32, u32)>, Option<u32>, String) {
    let numbers = find_by_name(name);
    let open = numbers.and_then(|n| crate::sys::dm_open_count(n.0, n.1).ok());
    let targets = match crate::sys::dm_table_status(crate::sys::By::Name(name)) {
        Ok(Some(t)) if t.is_empty() => "no table".to_string(),
        Ok(Some(t)) => t
            .iter()
            .map(|t| t.target_type.as_str())
            .collect::<Vec<_>>()
            .join(","),
        Ok(None) => "gone".to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let maps = numbers
        .map(|n| list(sys_dir(n.0, n.1).join("slaves")).join(","))
        .unwrap_or_default();
    let what = format!(
        "table: {targets}; maps: [{maps}]; {}",
        if numbers.is_some_and(|n| is_read_only(n.0, n.1)) {
            "read-only"
        } else {
            "writable"
        }
    );
    (numbers, open, what)
}

/// Removes the device called `name` (ours: the overlay name of this very
/// publish) that is not a read-only overlay of the LV `lv`: what a node
/// reboot simulated by hand, a re-activation that gave the LV new numbers,
/// or `dmsetup remove --force` of an overlay a process held open (an
/// `error` table left in place) leaves behind. Refused while something
/// holds it open: that opener sees the old device, and only it can let go.
async fn replace_leftover(tools: &Tools, name: &str, lv: (u32, u32)) -> Result<()> {
    let nm = name.to_string();
    let (numbers, open, what) = tools
        .blocking("look at a leftover overlay", move || Ok(describe(&nm)))
        .await?;
    if let Some(n @ 1..) = open {
        tracing::warn!(name, ?numbers, open_count = n, found = what, lv = ?lv,
            "a leftover device of this driver's overlay name is held open; not replaced");
        let dev = numbers.map_or_else(String::new, |(ma, mi)| format!(" ({ma}:{mi})"));
        return Err(Error::FailedPrecondition(format!(
            "device-mapper device {name}{dev}, this driver's read-only overlay name for this publish, is left over from an earlier device ({what}; not a read-only overlay of the volume's LV {}:{}) and is held open {n} time(s), so it cannot be replaced",
            lv.0, lv.1
        ))
        .advise(format!(
            "stop what holds it open (a process: `fuser -v /dev/mapper/{name}`; a loop device: `losetup -j` on the old device node; a mount), then retry: the driver replaces it"
        )));
    }
    remove_overlay(tools, name).await?;
    tracing::warn!(name, ?numbers, found = what, lv = ?lv,
        "removed a leftover device of this driver's overlay name that was not a read-only overlay of the LV; creating it anew");
    Ok(())
}

/// Removes one of our overlays. Fails (FAILED_PRECONDITION, "busy") while
/// something still has it open.
pub async fn remove_overlay(tools: &Tools, name: &str) -> Result<()> {
    if !name.starts_with(OVERLAY_PREFIX) {
        return Err(Error::Internal(format!(
            "refusing to remove {name}: not an overlay of this driver"
        )));
    }
    // --retry: an LVM command anywhere on the node scans every block
    // device and holds ours open for a moment; dmsetup retries through it.
    let mut args = crate::argv!["remove", "--retry", name];
    args.extend(udev_args(tools));
    if let Err(e) = tools.run("dmsetup", &args).await {
        let nm = name.to_string();
        let open_count = tools
            .blocking("read an overlay's open count", move || {
                Ok(find_by_name(&nm).and_then(|n| crate::sys::dm_open_count(n.0, n.1).ok()))
            })
            .await
            .ok()
            .flatten();
        tracing::warn!(name, ?open_count, error = %e, "could not remove read-only overlay");
        // Why is read from the device, not from dmsetup's words.
        return Err(match open_count {
            Some(n) if n > 0 => Error::FailedPrecondition(format!(
                "read-only overlay {name} is held open {n} time(s) (a process or mount uses the published device): close it, then retry ({e})"
            )),
            _ => e,
        });
    }
    tracing::info!(name, "removed read-only overlay");
    Ok(())
}

/// Removes the device `name` (the overlay name of one publish) for an
/// unpublish of that publish. A device of that name that something still
/// holds open fails the unpublish while it maps the volume's LV `lv` (a
/// pod still reads the volume through it); one that maps nothing of the LV
/// any more (a leftover: an `error` table, or old numbers) serves nothing
/// of the volume, so it is removed deferred (the kernel removes it when its
/// last opener closes) and the unpublish goes on: an opener outside the
/// driver that never lets go no longer holds the pod's teardown for ever.
pub async fn remove_for_unpublish(tools: &Tools, name: &str, lv: Option<(u32, u32)>) -> Result<()> {
    let Err(e) = remove_overlay(tools, name).await else {
        return Ok(());
    };
    let nm = name.to_string();
    let (numbers, open, what, maps_lv) = tools
        .blocking("look at an overlay that stays", move || {
            let (numbers, open, what) = describe(&nm);
            let maps_lv = match (numbers, lv) {
                (Some(n), Some(lv)) => kernel_name(lv.0, lv.1)
                    .is_some_and(|k| list(sys_dir(n.0, n.1).join("slaves")).contains(&k)),
                _ => false,
            };
            Ok((numbers, open, what, maps_lv))
        })
        .await?;
    if maps_lv || open.is_none_or(|n| n == 0) {
        return Err(e);
    }
    let mut args = crate::argv!["remove", "--deferred", name];
    args.extend(udev_args(tools));
    tools.run("dmsetup", &args).await?;
    tracing::warn!(name, ?numbers, open_count = open, found = what, lv = ?lv,
        "a leftover device of this driver's overlay name that maps nothing of the LV is held open; its removal is deferred until its last opener closes");
    Ok(())
}

/// Grows an overlay to `sectors` after its LV grew (stays read-only).
pub async fn resize_overlay(tools: &Tools, name: &str, lv: (u32, u32), sectors: u64) -> Result<()> {
    let mut reload = crate::argv![
        "reload",
        name,
        "--readonly",
        "--table",
        linear_table(lv, sectors)
    ];
    reload.extend(udev_args(tools));
    tools.run("dmsetup", &reload).await?;
    let mut resume = crate::argv!["resume", name];
    resume.extend(udev_args(tools));
    tools.run("dmsetup", &resume).await?;
    tracing::info!(name, sectors, "resized read-only overlay");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_status_lines() {
        let t = |ty: &str, status: &str| crate::sys::TargetStatus {
            start: 0,
            length: 819200,
            target_type: ty.into(),
            status: status.into(),
        };
        assert_eq!(parse_thin_status(&t("thin", "0 -")).unwrap(), 0);
        assert_eq!(parse_thin_status(&t("thin", "384 13183")).unwrap(), 384);
        assert!(matches!(
            parse_thin_status(&t("thin", "Fail")),
            Err(Error::FailedPrecondition(_))
        ));
        assert!(parse_thin_status(&t("linear", "")).is_err());
        assert!(parse_thin_status(&t("thin", "")).is_err());
        assert!(parse_thin_status(&t("thin", "x 1")).is_err());
    }

    #[test]
    fn overlay_names_give_back_their_volume() {
        let id = crate::naming::lv_name_for("pvc-1");
        let name = overlay_name(&id, Path::new("/var/lib/kubelet/a"));
        assert_eq!(overlay_volume(&name), Some(id.as_str()));
        assert_eq!(overlay_volume("other-device"), None);
    }

    #[test]
    fn overlay_names_are_stable_and_fit_device_mapper() {
        let id = crate::naming::lv_name_for(&"x".repeat(128));
        let a = overlay_name(&id, Path::new("/var/lib/kubelet/a"));
        assert_eq!(a, overlay_name(&id, Path::new("/var/lib/kubelet/a")));
        assert_ne!(a, overlay_name(&id, Path::new("/var/lib/kubelet/b")));
        assert!(a.starts_with(OVERLAY_PREFIX));
        assert!(a.len() < 128, "DM_NAME_LEN is 128: {a}");
    }
}
