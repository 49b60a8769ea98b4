//! Start-up of the thin pool. With `[loop_pool]` configured and the volume
//! group absent, the driver builds it on a loop device over a sparse file:
//! file, loop device, PV, VG, thin pool. Every step first looks for what an
//! earlier run left, so a restart reuses the same file, loop device and VG
//! and never makes a second of any.

pub mod grow;
pub mod loopdev;
pub mod status;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::config::{Autopilot, Config, LoopPool};
use crate::error::{Error, Result};
use crate::lvm::report::{report_args, rows, text};
use crate::lvm::{room, Lvm};
use crate::naming::TAG_OWNER;
use crate::sys::{self, SparseFile};

/// Makes sure the configured VG and thin pool exist and the pool is active.
pub async fn ensure(cfg: &Config, lvm: &Lvm) -> Result<()> {
    let owner_tag = format!("{TAG_OWNER}{}", cfg.driver_name);
    // The report first: on a dense node each LVM command reads the whole
    // VG, and the list of VGs is needed only when the report fails (the
    // scale bench times a start's commands).
    let report = match lvm.fresh_report().await {
        Ok(report) => {
            if let Some(lp) = &cfg.loop_pool {
                // The VG is there; keep its loop device attached for next time.
                loop_device(lp, &cfg.autopilot)?;
            }
            report
        }
        // Told apart by the list of VGs the failed read already asked
        // for (`Lvm::fresh_report`), not asked again.
        Err(missing @ Error::VgMissing { .. }) => {
            // Without a [loop_pool] there is nothing to build it from: the
            // error says what to do.
            let Some(lp) = &cfg.loop_pool else {
                return Err(missing);
            };
            build_vg_on_loop(
                lp,
                &cfg.autopilot,
                lvm,
                &owner_tag,
                cfg.metadata_reserve_lvs,
            )
            .await?;
            lvm.fresh_report().await?
        }
        Err(e) => return Err(e),
    };
    match report.find(&lvm.pool) {
        Some(p) if p.is_thin_pool() => {
            if !p.is_active() {
                repair_half_active(lvm).await?;
            }
        }
        Some(_) => {
            return Err(Error::FailedPrecondition(format!(
                "{} exists but is not a thin pool",
                lvm.lv_path(&lvm.pool)
            )))
        }
        None if vg_tags(lvm).await?.contains(&owner_tag) => create_pool(cfg, lvm).await?,
        None => {
            return Err(Error::Unavailable(format!(
                "thin pool {} does not exist, and volume group {} was not built by this driver",
                lvm.lv_path(&lvm.pool),
                lvm.vg
            )))
        }
    }
    Ok(())
}

/// The thin pool of a VG this driver built: `pool_percent` of it for
/// data, in `chunk_size` chunks, zeroing, with a metadata LV sized for
/// `max_lvs` (and the reserve) as far as the VG has room beside the data
/// for it and LVM's spare copy (`room::pool_metadata_for`).
async fn create_pool(cfg: &Config, lvm: &Lvm) -> Result<()> {
    let (pct, asked, chunk) = cfg.loop_pool.as_ref().map_or((80, None, 64 << 10), |lp| {
        (lp.pool_percent, lp.max_lvs, lp.chunk_size)
    });
    let max_lvs = asked.unwrap_or(crate::config::DEFAULT_MAX_LVS);
    let (vg_size, extent) = vg_size(lvm).await?;
    let extents = vg_size / extent.max(1);
    let data = extents * u64::from(pct) / 100 * extent;
    // Half of what is left beside the data, less an extent for LVM's
    // rounding, may go to the metadata and its spare: the rest stays free
    // to grow either later.
    let room = vg_size.saturating_sub(data + extent) / 2;
    let lvs = max_lvs + cfg.metadata_reserve_lvs;
    let metadata = room::pool_metadata_for(lvs, data, chunk, extent, room);
    let holds = room::lvs_in(metadata, data, chunk);
    lvm.change(
        "lvcreate",
        crate::argv![
            "--type",
            "thin-pool",
            "--zero",
            "y",
            "--chunksize",
            format!("{chunk}b"),
            "--poolmetadatasize",
            format!("{metadata}b"),
            "--extents",
            format!("{pct}%VG"),
            "--name",
            lvm.pool.as_str(),
            lvm.vg.as_str()
        ],
    )
    .await?;
    tracing::info!(
        pool = lvm.lv_path(&lvm.pool),
        pct,
        chunk,
        metadata,
        holds,
        "created thin pool; its metadata holds {holds} LVs"
    );
    if holds < lvs && asked.is_some() {
        tracing::warn!(
            asked = lvs,
            holds,
            "the volume group has no room for the pool metadata max_lvs asks for; \
             a bigger loop_pool.size or a smaller pool_percent gives it more"
        );
    }
    Ok(())
}

/// The VG's size and extent size.
async fn vg_size(lvm: &Lvm) -> Result<(u64, u64)> {
    let out = lvm
        .query("vgs", report_args("vg_size,vg_extent_size", &lvm.vg))
        .await?;
    let row = rows(&out.stdout, "vg")?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Internal(format!("vgs printed no row for {}", lvm.vg)))?;
    let n = |k: &str| -> Result<u64> {
        text(&row, k)?
            .parse()
            .map_err(|_| Error::Internal(format!("vgs field {k} is not a byte count")))
    };
    Ok((n("vg_size")?, n("vg_extent_size")?))
}

/// Refuses a thin pool that does not zero new chunks unless the config
/// accepts it on purpose (`allow_unzeroed_pool`).
pub async fn check_zeroing(cfg: &Config, lvm: &Lvm) -> Result<()> {
    // Right after `ensure`'s fresh report: that one serves (a report is an
    // `lvs` of every LV, on the way to a driver that answers).
    let report = lvm.known().await?;
    let Some(pool) = report.find(&lvm.pool) else {
        return Ok(());
    };
    if pool.zeroes_new_chunks() {
        return Ok(());
    }
    if cfg.allow_unzeroed_pool {
        tracing::warn!(pool = lvm.lv_path(&lvm.pool),
            "thin pool does not zero new chunks; accepted by allow_unzeroed_pool: new volumes may show deleted volumes' data");
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "thin pool {} does not zero new chunks (lv_attr {}): a new volume could show a deleted volume's data",
        lvm.lv_path(&lvm.pool),
        pool.attr,
    ))
    .advise(format!(
        "turn zeroing on (lvchange --zero y {}), or set allow_unzeroed_pool = true to accept it",
        lvm.lv_path(&lvm.pool)
    )))
}

/// Brings an inactive thin pool back. An LVM command stopped mid-way (a
/// killed `lvcreate`) can leave the pool's hidden components (`_tmeta`,
/// `_tdata`) active while the pool itself is not, and LVM then refuses to
/// activate the pool ("prohibited while ... _tmeta is active"). Those
/// components are deactivated first; then the pool is activated. Both
/// steps are logged. Returns what was found half active.
pub async fn repair_half_active(lvm: &Lvm) -> Result<Vec<String>> {
    let out = lvm
        .query(
            "lvs",
            crate::argv![
                "-a",
                "--reportformat",
                "json",
                "-o",
                "lv_name,lv_attr",
                lvm.vg.as_str()
            ],
        )
        .await?;
    let mut lvs = Vec::new();
    for row in rows(&out.stdout, "lv")? {
        lvs.push((text(&row, "lv_name")?, text(&row, "lv_attr")?));
    }
    let Some(components) = half_active_components(&lvm.pool, &lvs) else {
        return Ok(Vec::new());
    };
    for c in &components {
        tracing::warn!(pool = lvm.lv_path(&lvm.pool), component = lvm.lv_path(c),
            "thin pool component is active while the pool is not (an LVM command was stopped mid-way); deactivating it");
        lvm.change("lvchange", crate::argv!["--activate", "n", lvm.lv_path(c)])
            .await?;
    }
    lvm.activate(&lvm.pool).await?;
    tracing::info!(pool = lvm.lv_path(&lvm.pool), repaired = ?components, "activated thin pool");
    Ok(components)
}

/// From `lvs -a` rows (name, attr): `None` when the pool is active (or
/// absent), else the pool's components that are active on their own.
fn half_active_components(pool: &str, lvs: &[(String, String)]) -> Option<Vec<String>> {
    let active = |attr: &str| attr.chars().nth(4) == Some('a');
    let (_, pool_attr) = lvs.iter().find(|(n, _)| n == pool)?;
    if active(pool_attr) {
        return None;
    }
    Some(
        lvs.iter()
            .map(|(n, a)| (n.trim_start_matches('[').trim_end_matches(']'), a))
            .filter(|(n, a)| {
                (*n == format!("{pool}_tmeta") || *n == format!("{pool}_tdata")) && active(a)
            })
            .map(|(n, _)| n.to_string())
            .collect(),
    )
}

async fn vg_tags(lvm: &Lvm) -> Result<Vec<String>> {
    let out = lvm
        .query(
            "vgs",
            crate::argv!["--reportformat", "json", "-o", "vg_tags", lvm.vg.as_str()],
        )
        .await?;
    let mut tags = Vec::new();
    for row in rows(&out.stdout, "vg")? {
        tags.extend(
            text(&row, "vg_tags")?
                .split(',')
                .filter(|t| !t.is_empty())
                .map(String::from),
        );
    }
    Ok(tags)
}

/// What an existing backing file's length is, against its configured
/// size and how far the class's autopilot may grow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileSize {
    Configured,
    /// Longer, within `backing_file_limit` of an autopilot that is on: a
    /// size the driver itself reached, expected.
    GrownByAutopilot,
    /// Shorter, or longer than this driver would have made it.
    Other,
}

fn file_size(len: u64, configured: u64, autopilot: &Autopilot) -> FileSize {
    if len == configured {
        FileSize::Configured
    } else if len > configured && autopilot.enabled && len <= autopilot.backing_file_limit {
        FileSize::GrownByAutopilot
    } else {
        FileSize::Other
    }
}

/// The loop device over the backing file: the one already attached, or a
/// new one. Creates the sparse file first if it is missing.
fn loop_device(lp: &LoopPool, autopilot: &Autopilot) -> Result<(std::path::PathBuf, bool)> {
    let created = match sys::create_sparse_file(&lp.backing_file, lp.size)? {
        SparseFile::Created => {
            tracing::info!(file = %lp.backing_file.display(), size = lp.size, "created sparse backing file");
            true
        }
        SparseFile::Existed { len } => {
            let file = lp.backing_file.display();
            match file_size(len, lp.size, autopilot) {
                FileSize::Configured => {}
                FileSize::GrownByAutopilot => tracing::info!(%file, len, configured = lp.size,
                    limit = autopilot.backing_file_limit,
                    "backing file is as the autopilot grew it; keeping it"),
                FileSize::Other => tracing::warn!(%file, len, configured = lp.size,
                    "backing file exists with another size; keeping it as it is"),
            }
            false
        }
    };
    if let Some(dev) = loopdev::find_loop_for_file(&lp.backing_file)? {
        tracing::info!(file = %lp.backing_file.display(), dev = %dev.display(), "reusing attached loop device");
        return Ok((dev, created));
    }
    let dev = loopdev::attach_loop(&lp.backing_file)?;
    tracing::info!(file = %lp.backing_file.display(), dev = %dev.display(), "attached loop device");
    Ok((dev, created))
}

/// The VG a device belongs to: `None` when it is not a PV, `Some("")` for
/// a PV in no VG. Every PV is listed (a list succeeds when there is none)
/// and compared by device number, so a device that is no PV is never told
/// from a failure's text.
async fn pv_vg(lvm: &Lvm, dev: &Path) -> Result<Option<String>> {
    let out = lvm
        .query(
            "pvs",
            crate::argv!["--reportformat", "json", "-o", "pv_name,vg_name"],
        )
        .await?;
    let rdev = |p: &Path| std::fs::metadata(p).ok().map(|m| m.rdev());
    let Some(want) = rdev(dev) else {
        return Err(Error::Internal(format!(
            "cannot stat {}, the loop device just attached",
            dev.display()
        )));
    };
    for row in rows(&out.stdout, "pv")? {
        if rdev(Path::new(&text(&row, "pv_name")?)) == Some(want) {
            return Ok(Some(text(&row, "vg_name")?));
        }
    }
    Ok(None)
}

async fn build_vg_on_loop(
    lp: &LoopPool,
    autopilot: &Autopilot,
    lvm: &Lvm,
    owner_tag: &str,
    reserve: u64,
) -> Result<()> {
    let (dev, created) = loop_device(lp, autopilot)?;
    let dev_s = dev.display().to_string();
    match pv_vg(lvm, &dev).await? {
        Some(vg) if vg == lvm.vg => {
            // After a reboot: the loop device was gone, so was the VG on it.
            tracing::info!(
                vg,
                dev = dev_s,
                "volume group is back on its re-attached loop device"
            );
            return Ok(());
        }
        Some(vg) if !vg.is_empty() => {
            return Err(Error::FailedPrecondition(format!(
                "{dev_s} (over {}) already belongs to volume group {vg}, not {}",
                lp.backing_file.display(),
                lvm.vg
            )))
        }
        Some(_) => tracing::info!(dev = dev_s, "reusing physical volume"),
        None => {
            // Only a file we made, or one that holds no data at all, may
            // become a PV: never overwrite an image someone pointed us at.
            let meta = std::fs::metadata(&lp.backing_file)
                .map_err(|e| Error::io(format!("stat {}", lp.backing_file.display()), e))?;
            if !created && meta.blocks() > 0 {
                return Err(Error::FailedPrecondition(format!(
                    "{} already holds data and is not an LVM physical volume; refusing to overwrite it",
                    lp.backing_file.display()
                )));
            }
            // A metadata area for max_lvs LVs (room::mda_size_for): it
            // cannot grow once made. No --yes: pvcreate then refuses to
            // wipe any signature it finds.
            let max_lvs = lp.max_lvs.unwrap_or(crate::config::DEFAULT_MAX_LVS);
            let mda = room::mda_size_for(max_lvs + reserve, lp.size);
            lvm.change(
                "pvcreate",
                crate::argv!["--metadatasize", format!("{mda}b"), dev_s.as_str()],
            )
            .await?;
            tracing::info!(
                dev = dev_s,
                metadata_area = mda,
                holds = room::lvs_in_mda(mda),
                "created physical volume"
            );
        }
    }
    lvm.change(
        "vgcreate",
        crate::argv!["--addtag", owner_tag, lvm.vg.as_str(), dev_s.as_str()],
    )
    .await?;
    tracing::info!(vg = lvm.vg, dev = dev_s, "created volume group");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file the autopilot grew (longer, within its limit) is expected,
    /// not a warning; one shorter than configured, or longer than the
    /// autopilot may make it, or with the autopilot off, is.
    #[test]
    fn a_backing_file_the_autopilot_grew_is_its_expected_size() {
        let mib = 1 << 20;
        let on = Autopilot {
            enabled: true,
            backing_file_limit: 320 * mib,
            ..Autopilot::default()
        };
        let off = Autopilot {
            enabled: false,
            ..on.clone()
        };
        assert_eq!(file_size(64 * mib, 64 * mib, &on), FileSize::Configured);
        assert_eq!(
            file_size(160 * mib, 64 * mib, &on),
            FileSize::GrownByAutopilot
        );
        assert_eq!(
            file_size(320 * mib, 64 * mib, &on),
            FileSize::GrownByAutopilot
        );
        assert_eq!(file_size(321 * mib, 64 * mib, &on), FileSize::Other);
        assert_eq!(file_size(32 * mib, 64 * mib, &on), FileSize::Other);
        assert_eq!(file_size(160 * mib, 64 * mib, &off), FileSize::Other);
    }

    fn rows(r: &[(&str, &str)]) -> Vec<(String, String)> {
        r.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn half_active_pools_are_recognised() {
        // Healthy: the pool is active, nothing to do.
        let ok = rows(&[
            ("pool", "twi-aotz--"),
            ("[pool_tmeta]", "ewi-ao----"),
            ("[pool_tdata]", "Twi-ao----"),
        ]);
        assert_eq!(half_active_components("pool", &ok), None);
        // What a killed lvcreate left: components active, pool not.
        let half = rows(&[
            ("pool", "twi---tz--"),
            ("[pool_tmeta]", "ewi-a-----"),
            ("[pool_tdata]", "Twi-------"),
            ("[lvol0_pmspare]", "ewi-------"),
        ]);
        assert_eq!(
            half_active_components("pool", &half),
            Some(vec!["pool_tmeta".to_string()])
        );
        // Inactive and clean: only the pool needs activating.
        let off = rows(&[("pool", "twi---tz--"), ("[pool_tmeta]", "ewi-------")]);
        assert_eq!(half_active_components("pool", &off), Some(vec![]));
        assert_eq!(half_active_components("other", &off), None);
    }
}
