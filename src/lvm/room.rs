//! How many more LVs fit before LVM itself refuses one: the thin pool's
//! metadata LV and the VG's metadata area, each counted as capacity.
//!
//! Figures measured in the VM (lvm2 2.03.16, kernel 6.1; docs/capacity.md):
//! - **Pool metadata.** Each thin device, empty or a snapshot, takes one
//!   4 KiB metadata block and a share of inner B-tree nodes (a 4 MiB
//!   metadata LV went from 10.84 % with no thin volume to 72.75 % with
//!   625: 0.099 %, 4,155 bytes, each). LVM refuses a new thin
//!   volume or snapshot once the metadata LV has less free than the smaller
//!   of 25 % of it and 4 MiB (`thin_pool_metadata_min_threshold` in lvm2's
//!   `thin_manip.c`): at 75.00 % of 4 MiB, with 648 volumes.
//! - **VG metadata area.** LVM writes the VG's metadata text beside the
//!   previous copy in a circular buffer, so the text may take half the
//!   area; `vg_mda_free` reports what is left of that half (1 MiB area:
//!   519,168 bytes free in an empty VG). Each thin LV took 528 bytes of it
//!   with a 61-character name and 151 characters of tags, so about 316
//!   bytes plus its name and tags. At 0 LVM fails a change that adds text
//!   with "Metadata too large for circular buffer".
//!
//! The driver stops `reserve` LVs short of either limit, so that creates
//! already running, and the estimate's error, never reach LVM's refusal.

use super::report::{Condition, Lv, Problem};

/// Metadata a thin device takes in its pool: one 4 KiB block and its share
/// of the B-tree's inner nodes (measured 4,155 bytes), with a margin.
pub const THIN_DEVICE_BYTES: u64 = 4200;

/// VG metadata text of one LV besides its name and tags (measured 316;
/// a snapshot adds its origin), with a margin.
pub const LV_TEXT_BYTES: u64 = 360;

/// The free space LVM keeps in a pool's metadata LV: below it, no new thin
/// volume or snapshot is made.
pub fn lvm_metadata_floor(metadata_size: u64) -> u64 {
    (metadata_size / 4).min(4 << 20)
}

/// VG metadata text one LV with this name and these tags takes.
pub fn lv_text_bytes(name: &str, tags: &[String]) -> u64 {
    LV_TEXT_BYTES + name.len() as u64 + tags.iter().map(|t| t.len() as u64 + 4).sum::<u64>()
}

/// Room left in both metadata stores, from one report, with what was made
/// since that report was read counted in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Room {
    /// Size of the pool's metadata LV, and what is used of it (estimated).
    pub pool_metadata_size: u64,
    pub pool_metadata_used: u64,
    /// The VG's metadata area size and what is left of its usable half
    /// (estimated); both 0 when LVM did not report them.
    pub vg_mda_size: u64,
    pub vg_mda_free: u64,
    /// VG metadata text per LV, for the estimate.
    pub lv_text: u64,
}

/// Which metadata stops the next LV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    Pool,
    Vg,
}

impl Room {
    /// `metadata_percent` and `metadata_size` of the pool and the VG's
    /// `vg_mda_size`/`vg_mda_free` as LVM reported them, and `made_since`
    /// LVs the report does not count yet.
    pub fn estimate(
        metadata_size: u64,
        metadata_percent: f64,
        vg_mda_size: u64,
        vg_mda_free: u64,
        lv_text: u64,
        made_since: u64,
    ) -> Room {
        let used = (metadata_size as f64 * metadata_percent.clamp(0.0, 100.0) / 100.0).ceil()
            as u64
            + made_since * THIN_DEVICE_BYTES;
        Room {
            pool_metadata_size: metadata_size,
            pool_metadata_used: used.min(metadata_size),
            vg_mda_size,
            vg_mda_free: vg_mda_free.saturating_sub(made_since * lv_text),
            lv_text,
        }
    }

    /// Thin devices the pool's metadata takes before LVM refuses one;
    /// `None` when LVM did not report the metadata LV's size.
    pub fn pool_lvs_left(&self) -> Option<u64> {
        let limit = self
            .pool_metadata_size
            .saturating_sub(lvm_metadata_floor(self.pool_metadata_size));
        (self.pool_metadata_size > 0)
            .then(|| limit.saturating_sub(self.pool_metadata_used) / THIN_DEVICE_BYTES)
    }

    /// LVs the VG's metadata area takes before LVM refuses a new one;
    /// `None` when LVM did not report the area.
    pub fn vg_lvs_left(&self) -> Option<u64> {
        (self.vg_mda_size > 0).then(|| self.vg_mda_free / self.lv_text.max(1))
    }

    /// The store that cannot take `new` more LVs and still keep `reserve`
    /// spare, the pool's first.
    pub fn short_of(&self, new: u64, reserve: u64) -> Option<Short> {
        let need = new + reserve;
        let short = |left: Option<u64>| left.is_some_and(|l| l < need);
        if short(self.pool_lvs_left()) {
            Some(Short::Pool)
        } else if short(self.vg_lvs_left()) {
            Some(Short::Vg)
        } else {
            None
        }
    }

    /// The pool's metadata in use, in percent.
    pub fn pool_metadata_percent(&self) -> f64 {
        if self.pool_metadata_size == 0 {
            return 0.0;
        }
        self.pool_metadata_used as f64 * 100.0 / self.pool_metadata_size as f64
    }

    /// The pool's metadata use, as a refusal of the VG's area shows it
    /// beside its own figure.
    fn pool_figure(&self, vg: &str, pool: &str) -> String {
        if self.pool_metadata_size == 0 {
            return format!("LVM did not report {vg}/{pool}'s metadata size");
        }
        format!(
            "the pool's metadata is {:.1}% used ({} of {})",
            self.pool_metadata_percent(),
            mib(self.pool_metadata_used),
            mib(self.pool_metadata_size),
        )
    }

    /// The VG's metadata area, as a refusal of the pool's metadata shows
    /// it beside its own figure.
    fn vg_figure(&self, vg: &str) -> String {
        if self.vg_mda_size == 0 {
            return format!("LVM did not report {vg}'s metadata area");
        }
        format!(
            "the VG's metadata area has {} bytes left of the {} LVM can use",
            self.vg_mda_free,
            self.vg_mda_size / 2,
        )
    }

    /// Why no new LV may be made because `short` ran out: what is full,
    /// and what to do. Its error is RESOURCE_EXHAUSTED.
    pub fn problem(&self, short: Short, vg: &str, pool: &str, reserve: u64) -> Problem {
        match short {
            Short::Pool => Problem {
                condition: Condition::MetadataShort,
                what: format!(
                    "thin pool {vg}/{pool}'s metadata is {:.1}% used ({} of {}): LVM refuses a \
                     new thin volume or snapshot with less than {} free, and this driver keeps \
                     room for {reserve} more (4 KiB each); {}",
                    self.pool_metadata_percent(),
                    mib(self.pool_metadata_used),
                    mib(self.pool_metadata_size),
                    mib(lvm_metadata_floor(self.pool_metadata_size)),
                    self.vg_figure(vg),
                ),
                remedy: format!(
                    "grow the pool's metadata (lvextend --poolmetadatasize +{} {vg}/{pool}; \
                     4 KiB per volume or snapshot), or delete volumes or snapshots",
                    mib(self.pool_metadata_size.max(8 << 20))
                ),
            },
            Short::Vg => Problem {
                condition: Condition::MetadataShort,
                what: format!(
                    "volume group {vg}'s metadata area is nearly full ({} bytes left of the {} \
                     LVM can use of its {} area, about {} bytes per LV): LVM would fail the next \
                     changes with \"Metadata too large for circular buffer\", and this driver \
                     keeps room for {reserve} more LVs; {}",
                    self.vg_mda_free,
                    self.vg_mda_size / 2,
                    mib(self.vg_mda_size),
                    self.lv_text,
                    self.pool_figure(vg, pool),
                ),
                remedy: format!(
                    "a metadata area cannot grow in place: add a disk with a bigger one \
                     (pvcreate --metadatasize 64m DEV; vgextend {vg} DEV), then stop LVM from \
                     using the small ones (pvchange --metadataignore y on each old PV), or move \
                     the volumes to a VG made with vgcreate --metadatasize; or delete volumes \
                     or snapshots"
                ),
            },
        }
    }
}

/// Why LVM itself refuses a new LV in `pool_lv`'s pool, read from a fresh
/// report: its metadata or the VG's metadata area at LVM's limit (no
/// reserve). `None` when neither is.
pub fn at_lvm_limit(pool_lv: &Lv) -> Option<Problem> {
    let room = Room::estimate(
        pool_lv.metadata_size,
        pool_lv.metadata_percent?,
        pool_lv.vg_mda_size,
        pool_lv.vg_mda_free,
        LV_TEXT_BYTES + 210,
        0,
    );
    room.short_of(1, 0)
        .map(|s| room.problem(s, &pool_lv.vg, &pool_lv.name, 0))
}

/// VG metadata text per LV the driver sizes for: a volume's measured 528
/// bytes (name and tags included), with a margin.
pub const SIZING_TEXT_PER_LV: u64 = 600;

/// Pool metadata per mapped data chunk, for sizing: `thin_metadata_size`
/// (thin-provisioning-tools) counts about 32 bytes; with a margin.
pub const SIZING_BYTES_PER_CHUNK: u64 = 48;

const MIB: u64 = 1 << 20;

/// The VG metadata area to give a PV made for `lvs` LVs: two copies of
/// their text (LVM writes the next beside the last) and the VG's own, in
/// whole MiB, at least LVM's 1 MiB, and at most a 32nd of the disk.
pub fn mda_size_for(lvs: u64, disk: u64) -> u64 {
    let need = (2 * (lvs * SIZING_TEXT_PER_LV + 64 * 1024)).div_ceil(MIB) * MIB;
    need.min(disk / 32 / MIB * MIB).max(MIB)
}

/// The metadata LV to give a thin pool of `data` bytes in `chunk`-byte
/// chunks that is to hold `lvs` thin LVs: what they and every mapped
/// chunk take, with LVM's free floor on top (a quarter of the LV, which
/// is at least 4 MiB from 16 MiB up), in whole extents; no more than
/// `room` (what may go to it and LVM's spare copy, each as large), no
/// less than LVM's 2 MiB.
pub fn pool_metadata_for(lvs: u64, data: u64, chunk: u64, extent: u64, room: u64) -> u64 {
    let used = lvs * THIN_DEVICE_BYTES + data / chunk.max(1) * SIZING_BYTES_PER_CHUNK + MIB;
    let extent = extent.max(1);
    let need = (used * 4 / 3).div_ceil(extent) * extent;
    let cap = room / 2 / extent * extent;
    need.min(cap).max(2 * MIB)
}

/// How many thin LVs a pool with this metadata LV holds with `data`
/// mapped in full, short of LVM's refusal.
pub fn lvs_in(metadata: u64, data: u64, chunk: u64) -> u64 {
    let usable = metadata - lvm_metadata_floor(metadata);
    let fixed = data / chunk.max(1) * SIZING_BYTES_PER_CHUNK + MIB;
    usable.saturating_sub(fixed) / THIN_DEVICE_BYTES
}

/// How many LVs a VG metadata area of `mda` bytes holds.
pub fn lvs_in_mda(mda: u64) -> u64 {
    (mda / 2).saturating_sub(64 * 1024) / SIZING_TEXT_PER_LV
}

/// `n` bytes in MiB with two decimals, or KiB below 1 MiB.
fn mib(n: u64) -> String {
    if n < 1 << 20 {
        format!("{:.0} KiB", n as f64 / 1024.0)
    } else {
        format!("{:.2} MiB", n as f64 / (1 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn lvm_floor_is_a_quarter_up_to_4_mib() {
        assert_eq!(lvm_metadata_floor(4 * MIB), MIB);
        assert_eq!(lvm_metadata_floor(16 * MIB), 4 * MIB);
        assert_eq!(lvm_metadata_floor(1024 * MIB), 4 * MIB);
    }

    /// The VM's figures: a 4 MiB metadata LV refused its 649th volume at
    /// 75.00 %; 648 fit from 10.84 %.
    #[test]
    fn pool_room_matches_what_lvm_refused() {
        let empty = Room::estimate(4 * MIB, 10.84, 1_044_480, 519_168, 528, 0);
        let left = empty.pool_lvs_left().unwrap();
        // At most what fitted, and within 2 % of it.
        assert!((635..=648).contains(&left), "{left}");
        let at_72 = Room::estimate(4 * MIB, 72.75, 1_044_480, 519_168, 528, 0);
        assert_eq!(at_72.pool_lvs_left(), Some(22));
        // What was made since the report counts: 19 more leave 3.
        let later = Room::estimate(4 * MIB, 72.75, 1_044_480, 519_168, 528, 19);
        assert_eq!(later.pool_lvs_left(), Some(3));
        assert_eq!(later.short_of(1, 0), None);
        assert_eq!(later.short_of(1, 3), Some(Short::Pool));
        assert!(later.pool_metadata_percent() > 74.0);
    }

    /// The VM's figures: 1 MiB area, 519,168 bytes free when empty, 528
    /// bytes per LV: about 983 LVs.
    #[test]
    fn vg_room_counts_the_usable_half() {
        let r = Room::estimate(64 * MIB, 1.0, 1_044_480, 519_168, 528, 0);
        assert_eq!(r.vg_lvs_left(), Some(983));
        assert_eq!(r.short_of(900, 100), Some(Short::Vg));
        assert_eq!(r.short_of(800, 100), None);
        let unknown = Room::estimate(0, 1.0, 0, 0, 528, 0);
        assert_eq!(
            (unknown.pool_lvs_left(), unknown.vg_lvs_left()),
            (None, None)
        );
        assert_eq!(unknown.short_of(10_000, 100), None);
    }

    #[test]
    fn refusals_name_the_store_and_what_to_do() {
        let r = Room::estimate(4 * MIB, 74.0, 1_044_480, 20_000, 528, 0);
        let p = r.problem(Short::Pool, "vg0", "pool", 100);
        assert!(p.is_out_of_space());
        assert_eq!(p.error(None).code(), tonic::Code::ResourceExhausted);
        let e = p.error(None).message();
        assert!(e.contains("vg0/pool's metadata is 74.0% used"), "{e}");
        assert!(
            e.contains("lvextend --poolmetadatasize +8.00 MiB vg0/pool"),
            "{e}"
        );
        let e = r
            .problem(Short::Vg, "vg0", "pool", 100)
            .error(None)
            .message();
        assert!(
            e.contains("metadata area is nearly full (20000 bytes left"),
            "{e}"
        );
        assert!(e.contains("pvchange --metadataignore y"), "{e}");
        // Each refusal shows the other store's figure too.
        assert!(
            e.contains("the pool's metadata is 74.0% used (2.96 MiB of 4.00 MiB)"),
            "{e}"
        );
        let e = r
            .problem(Short::Pool, "vg0", "pool", 100)
            .error(None)
            .message();
        assert!(
            e.contains("the VG's metadata area has 20000 bytes left of the 522240"),
            "{e}"
        );
        let unknown = Room::estimate(0, 0.0, 0, 0, 528, 0)
            .problem(Short::Vg, "vg0", "pool", 1)
            .error(None)
            .message();
        assert!(
            unknown.contains("LVM did not report vg0/pool's metadata size"),
            "{unknown}"
        );
    }

    /// The sizing rule, at the dense node (10,000 volumes and
    /// 2,000 snapshots) and at the test rig's small loop files.
    #[test]
    fn sizing_holds_what_it_was_asked_for_where_the_disk_allows() {
        let ext = 4 * MIB;
        // 12,000 LVs: two copies of 600 bytes each, 14 MiB of area.
        assert_eq!(mda_size_for(12_000, 64 << 30), 14 * MIB);
        assert!(lvs_in_mda(14 * MIB) >= 12_000);
        // A 64 MiB disk gives it a 32nd; never below LVM's 1 MiB.
        assert_eq!(mda_size_for(12_000, 64 * MIB), 2 * MIB);
        assert_eq!(mda_size_for(10, 64 << 30), MIB);
        // A 4 GiB pool of 64 KiB chunks for 12,064 LVs: 72 MiB (LVM's
        // default would be 4 MiB: 640 volumes).
        let meta = pool_metadata_for(12_064, 4 << 30, 64 << 10, ext, 1 << 30);
        assert_eq!(meta, 72 * MIB);
        assert!(lvs_in(meta, 4 << 30, 64 << 10) >= 12_064);
        // Capped by what the VG has left beside the data (and the spare),
        // in whole extents, and at least 2 MiB.
        assert_eq!(
            pool_metadata_for(12_064, 48 * MIB, 64 << 10, ext, 12 * MIB),
            4 * MIB
        );
        assert_eq!(
            pool_metadata_for(12_064, 48 * MIB, 64 << 10, ext, 2 * MIB),
            2 * MIB
        );
        assert_eq!(
            pool_metadata_for(100, 48 * MIB, 64 << 10, ext, 1 << 30),
            4 * MIB
        );
    }

    #[test]
    fn lv_text_counts_name_and_tags() {
        let tags = vec!["tpcsi.owner=a.b".to_string(), "tpcsi.name=61".to_string()];
        assert_eq!(lv_text_bytes("csi-x", &tags), 360 + 5 + 19 + 17);
    }
}
