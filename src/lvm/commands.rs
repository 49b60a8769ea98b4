//! The LV commands: create (thin volume, snapshot), remove, extend,
//! activate, deactivate, retag and read-ahead, each one `lvcreate`,
//! `lvremove`, `lvextend` or `lvchange` with its write to the cached report.

use super::report::Write;
use super::{lv_dm_name, Lvm};
use crate::error::{Error, Result};

impl Lvm {
    /// Creates a thin LV with its tags in the same command, inactive: the
    /// node activates it when it stages the volume.
    pub async fn create_thin(
        &self,
        name: &str,
        size: u64,
        tags: &[String],
        read_ahead: Option<&str>,
    ) -> Result<()> {
        let mut args = crate::argv![
            "--type",
            "thin",
            "--virtualsize",
            format!("{size}b"),
            "--thinpool",
            self.lv_path(&self.pool),
            "--name",
            name,
            "--activate",
            "n",
            "--yes"
        ];
        add_tags(&mut args, tags);
        add_read_ahead(&mut args, read_ahead);
        args.push(self.vg.clone());
        let made = Write::CreatedThin {
            name: name.to_string(),
            pool: self.pool.clone(),
            size,
            tags: tags.to_vec(),
            read_ahead: read_ahead.map(str::to_string),
        };
        self.change_with("lvcreate", args, Some(made))
            .await
            .map(drop)
    }

    /// Creates a thin snapshot `name` of the thin LV `origin` with its tags,
    /// inactive: read-only with LVM's activation-skip flag for a snapshot,
    /// writable without the flag for a volume made from one (a restore or
    /// a clone). A thin snapshot has its origin's size.
    pub async fn create_snapshot(
        &self,
        name: &str,
        origin: &str,
        tags: &[String],
        writable: bool,
        read_ahead: Option<&str>,
    ) -> Result<()> {
        let mut args = crate::argv![
            "--snapshot",
            "--name",
            name,
            "--permission",
            if writable { "rw" } else { "r" },
            "--setactivationskip",
            if writable { "n" } else { "y" },
            "--activate",
            "n",
            "--yes"
        ];
        add_tags(&mut args, tags);
        add_read_ahead(&mut args, read_ahead);
        args.push(self.lv_path(origin));
        self.change("lvcreate", args).await.map(drop)
    }

    pub async fn remove(&self, name: &str) -> Result<()> {
        self.change_with(
            "lvremove",
            crate::argv!["--yes", self.lv_path(name)],
            Some(Write::Removed(name.to_string())),
        )
        .await
        .map(drop)
    }

    /// Removes the thin LV `name` of our pool if it carries `owner_tag`:
    /// the ownership check runs inside the same locked LVM command that
    /// removes, so nothing else can ever be removed. No such LV is success.
    pub async fn remove_owned(&self, name: &str, owner_tag: &str) -> Result<()> {
        let select = remove_selection(name, &self.pool, owner_tag)?;
        self.change_with(
            "lvremove",
            crate::argv!["--yes", "--select", select, self.vg.clone()],
            Some(Write::Removed(name.to_string())),
        )
        .await
        .map(drop)
    }

    pub async fn extend(&self, name: &str, size: u64) -> Result<()> {
        self.change_with(
            "lvextend",
            crate::argv!["--size", format!("{size}b"), self.lv_path(name)],
            Some(Write::Resized {
                name: name.to_string(),
                size,
            }),
        )
        .await
        .map(drop)
    }

    /// Activates an LV (`-K` so thin snapshots, which carry the
    /// activation-skip flag, activate too) and returns the device numbers
    /// the kernel gave it, read from device-mapper, not from another `lvs`.
    pub async fn activate(&self, name: &str) -> Result<(u32, u32)> {
        let args = crate::argv![
            "--activate",
            "y",
            "--ignoreactivationskip",
            self.lv_path(name)
        ];
        let _turn = self.writers.acquire().await;
        let started = self.change_begins();
        let res = self.run("lvchange", args.clone(), true).await;
        let kernel = match res {
            Ok(_) => self.kernel_numbers(name).await,
            Err(e) => Err(e),
        };
        let write = kernel.as_ref().ok().map(|k| Write::Activated {
            name: name.to_string(),
            kernel: *k,
        });
        // Logged and applied like every change; on failure the cache goes.
        self.change_done("lvchange", &args, started, kernel.as_ref().map(drop), write);
        match kernel {
            Ok(k) => Ok(k),
            Err(e) => Err(self.explain(e, Some(name)).await),
        }
    }

    /// The device numbers of the active LV `name`.
    async fn kernel_numbers(&self, name: &str) -> Result<(u32, u32)> {
        self.live_device(name).await?.ok_or_else(|| {
            Error::Internal(format!(
                "LVM activated {} but device-mapper shows no live device for it",
                self.lv_path(name)
            ))
        })
    }

    /// The device numbers of LV `name` if device-mapper has it live (one
    /// ioctl, no LVM command): whether it is active, whatever the cached
    /// report says.
    pub async fn live_device(&self, name: &str) -> Result<Option<(u32, u32)>> {
        let dm_name = lv_dm_name(&self.vg, name);
        crate::blocking::run("read an LV's device numbers", self.timeout, move || {
            Ok(crate::sys::dm_numbers(&dm_name)?)
        })
        .await
    }

    /// Removes tag `del` and adds tag `add` in one lvchange.
    pub async fn retag(&self, name: &str, del: Option<&str>, add: Option<&str>) -> Result<()> {
        let del: Vec<String> = del.into_iter().map(str::to_string).collect();
        let add: Vec<String> = add.into_iter().map(str::to_string).collect();
        self.retag_all(name, &del, &add).await
    }

    /// Removes every tag of `del` and adds every tag of `add`, in one
    /// `lvchange` (one metadata commit: all of it happens, or none). A tag
    /// in both is kept: `lvchange` adds before it deletes, and would drop
    /// it.
    pub async fn retag_all(&self, name: &str, del: &[String], add: &[String]) -> Result<()> {
        let del: Vec<String> = del.iter().filter(|t| !add.contains(t)).cloned().collect();
        let mut args = Vec::new();
        for t in &del {
            args.extend(crate::argv!["--deltag", t]);
        }
        add_tags(&mut args, add);
        if args.is_empty() {
            return Ok(());
        }
        args.push(self.lv_path(name));
        let write = Write::Retagged {
            name: name.to_string(),
            del,
            add: add.to_vec(),
        };
        self.change_with("lvchange", args, Some(write))
            .await
            .map(drop)
    }

    /// Sets the LV's read-ahead (`auto` or sectors) and, in the same
    /// command, replaces tag `del` with `add` (each when given).
    pub async fn set_read_ahead(
        &self,
        name: &str,
        value: &str,
        del: Option<&str>,
        add: Option<&str>,
    ) -> Result<()> {
        let mut args = crate::argv!["--readahead", value];
        retag_args(&mut args, del, add);
        args.push(self.lv_path(name));
        self.change("lvchange", args).await.map(drop)
    }

    pub async fn deactivate(&self, name: &str) -> Result<()> {
        self.change_with(
            "lvchange",
            crate::argv!["--activate", "n", self.lv_path(name)],
            Some(Write::Deactivated(name.to_string())),
        )
        .await
        .map(drop)
    }
}

/// `--addtag T` for each tag: tags are written by the command that makes
/// the LV.
fn add_tags(args: &mut Vec<String>, tags: &[String]) {
    for t in tags {
        args.push("--addtag".into());
        args.push(t.clone());
    }
}

/// `--deltag DEL --addtag ADD`, each when given.
fn retag_args(args: &mut Vec<String>, del: Option<&str>, add: Option<&str>) {
    if let Some(t) = del {
        args.extend(crate::argv!["--deltag", t]);
    }
    if let Some(t) = add {
        args.extend(crate::argv!["--addtag", t]);
    }
}

/// The `--select` of [`Lvm::remove_owned`]: this name, in this pool, with
/// this tag among its tags. Names and tags that could break out of the
/// quoted strings are refused (ours never do).
fn remove_selection(name: &str, pool: &str, tag: &str) -> Result<String> {
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+_.-/=!:&#".contains(c))
    };
    if !(plain(name) && plain(pool) && plain(tag)) {
        return Err(Error::Internal(format!(
            "cannot select LV {name:?} of pool {pool:?} by tag {tag:?}: unexpected characters"
        )));
    }
    Ok(format!(
        "lv_name=\"{name}\" && pool_lv=\"{pool}\" && lv_tags={{\"{tag}\"}}"
    ))
}

fn add_read_ahead(args: &mut Vec<String>, read_ahead: Option<&str>) {
    if let Some(r) = read_ahead {
        args.extend(crate::argv!["--readahead", r]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_selects_name_pool_and_owner_tag() {
        let s = remove_selection("csi-a-1", "pool", "tpcsi.owner=d.x").unwrap();
        assert_eq!(
            s,
            r#"lv_name="csi-a-1" && pool_lv="pool" && lv_tags={"tpcsi.owner=d.x"}"#
        );
        assert!(remove_selection("a\"b", "pool", "t").is_err());
        assert!(remove_selection("a", "pool", "t} || lv_name=x").is_err());
        assert!(remove_selection("", "pool", "t").is_err());
    }
}
