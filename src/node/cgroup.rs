//! Per-volume I/O limits, enforced with cgroup v2's `io.max` in the cgroup
//! of each pod that has the volume published. The pod is the one kubelet
//! names in the target path (`.../pods/<uid>/volumes/...` for a
//! filesystem, `.../volumeDevices/publish/<pv>/<uid>` for a raw block
//! volume); its cgroup is found in either layout kubelet's cgroup drivers
//! make (systemd: `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid
//! with _>.slice`; cgroupfs: `kubepods/<qos>/pod<uid>`; a Guaranteed pod
//! has no QoS level).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The parameters (StorageClass or mutable) and the `io.max` key each sets.
pub const KEYS: [(&str, &str); 4] = [
    ("readBytesPerSecond", "rbps"),
    ("writeBytesPerSecond", "wbps"),
    ("readIOPS", "riops"),
    ("writeIOPS", "wiops"),
];

/// Read and write limits of one volume; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoLimits {
    pub rbps: Option<u64>,
    pub wbps: Option<u64>,
    pub riops: Option<u64>,
    pub wiops: Option<u64>,
}

/// Why a limit is not enforced (the volume is served all the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotEnforced(pub String);

impl IoLimits {
    /// The limits parameters `params` set (values already checked by
    /// [`parse_value`]); `max` is unlimited.
    pub fn from_params(params: &BTreeMap<String, String>) -> IoLimits {
        let get = |name: &str| params.get(name).and_then(|v| parse_value(v).ok().flatten());
        IoLimits {
            rbps: get(KEYS[0].0),
            wbps: get(KEYS[1].0),
            riops: get(KEYS[2].0),
            wiops: get(KEYS[3].0),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        *self == IoLimits::default()
    }

    /// The `io.max` line for device `dev`; an unset limit is `max`.
    pub fn line(&self, (major, minor): (u32, u32)) -> String {
        let v = |l: Option<u64>| l.map_or("max".to_string(), |n| n.to_string());
        format!(
            "{major}:{minor} rbps={} wbps={} riops={} wiops={}",
            v(self.rbps),
            v(self.wbps),
            v(self.riops),
            v(self.wiops)
        )
    }
}

/// A limit's value: a positive decimal integer (bytes or operations per
/// second), or `max` (no limit; how ModifyVolume takes one away).
pub fn parse_value(v: &str) -> Result<Option<u64>, String> {
    if v == "max" {
        return Ok(None);
    }
    match v.parse::<u64>() {
        Ok(n) if n > 0 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
        _ => Err(format!(
            "{v:?} is not a limit: a positive whole number (per second), or \"max\" for none"
        )),
    }
}

/// The pod a kubelet target path belongs to: its uid.
pub fn pod_uid(target: &Path) -> Option<String> {
    let parts: Vec<&str> = target.iter().filter_map(|c| c.to_str()).collect();
    let uid = if let Some(i) = parts.iter().rposition(|c| *c == "pods") {
        parts.get(i + 1).copied()
    } else {
        // Raw block: .../volumeDevices/publish/<pv>/<uid>.
        let i = parts.iter().rposition(|c| *c == "publish")?;
        (i >= 1 && parts[i - 1] == "volumeDevices" && parts.len() == i + 3).then(|| parts[i + 2])
    }?;
    let ok = !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_');
    ok.then(|| uid.to_string())
}

/// The cgroup directory of pod `uid` under the cgroup v2 mount `root`.
pub fn pod_cgroup(root: &Path, uid: &str) -> Result<PathBuf, NotEnforced> {
    if !root.join("cgroup.controllers").is_file() {
        return Err(NotEnforced(format!(
            "{} is not a cgroup v2 mount",
            root.display()
        )));
    }
    let under = uid.replace('-', "_");
    let mut candidates = vec![
        root.join(format!("kubepods.slice/kubepods-pod{under}.slice")),
        root.join(format!("kubepods/pod{uid}")),
    ];
    for qos in ["burstable", "besteffort"] {
        candidates.push(root.join(format!(
            "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice"
        )));
        candidates.push(root.join(format!("kubepods/{qos}/pod{uid}")));
    }
    candidates.into_iter().find(|c| c.is_dir()).ok_or_else(|| {
        NotEnforced(format!(
            "no cgroup of pod {uid} under {} (kubelet's systemd or cgroupfs layout)",
            root.display()
        ))
    })
}

/// Writes `limits` for device `dev` to the `io.max` of `cgroup`.
pub fn apply(cgroup: &Path, dev: (u32, u32), limits: &IoLimits) -> Result<(), NotEnforced> {
    let file = cgroup.join("io.max");
    if !file.is_file() {
        return Err(NotEnforced(format!(
            "{} has no io.max: the io controller is not enabled for it",
            cgroup.display()
        )));
    }
    let line = limits.line(dev);
    std::fs::write(&file, &line)
        .map_err(|e| NotEnforced(format!("cannot write {line:?} to {}: {e}", file.display())))?;
    tracing::info!(cgroup = %cgroup.display(), line, "set I/O limits");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_come_from_parameters_and_become_an_io_max_line() {
        let p: BTreeMap<String, String> = [
            ("writeBytesPerSecond", "1048576"),
            ("readIOPS", "200"),
            ("writeIOPS", "max"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let l = IoLimits::from_params(&p);
        assert_eq!(
            l.line((253, 7)),
            "253:7 rbps=max wbps=1048576 riops=200 wiops=max"
        );
        assert!(!l.is_unlimited());
        assert!(IoLimits::from_params(&BTreeMap::new()).is_unlimited());
        for bad in ["0", "-1", "1e6", "10M", "", " 5"] {
            assert!(parse_value(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_value("max"), Ok(None));
    }

    #[test]
    fn the_pod_is_read_from_kubelets_target_paths() {
        let uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let fs = format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/pvc-1/mount");
        assert_eq!(pod_uid(Path::new(&fs)).as_deref(), Some(uid));
        let blk =
            format!("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/{uid}");
        assert_eq!(pod_uid(Path::new(&blk)).as_deref(), Some(uid));
        assert_eq!(pod_uid(Path::new("/mnt/somewhere/else")), None);
        assert_eq!(pod_uid(Path::new("/x/pods/../etc/volumes/a")), None);
    }

    #[test]
    fn the_pod_cgroup_is_found_in_either_layout() {
        let root = tempfile::tempdir().unwrap();
        let uid = "0f1e2d3c-4b5a";
        assert!(pod_cgroup(root.path(), uid)
            .unwrap_err()
            .0
            .contains("not a cgroup v2"));
        std::fs::write(root.path().join("cgroup.controllers"), "io memory").unwrap();
        assert!(pod_cgroup(root.path(), uid)
            .unwrap_err()
            .0
            .contains("no cgroup of pod"));
        let systemd = root.path().join(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a.slice",
        );
        std::fs::create_dir_all(&systemd).unwrap();
        assert_eq!(pod_cgroup(root.path(), uid).unwrap(), systemd);
        std::fs::remove_dir(&systemd).unwrap();
        let cgroupfs = root.path().join("kubepods/pod0f1e2d3c-4b5a");
        std::fs::create_dir_all(&cgroupfs).unwrap();
        assert_eq!(pod_cgroup(root.path(), uid).unwrap(), cgroupfs);
        assert!(apply(&cgroupfs, (253, 1), &IoLimits::default())
            .unwrap_err()
            .0
            .contains("no io.max"));
        std::fs::write(cgroupfs.join("io.max"), "").unwrap();
        apply(
            &cgroupfs,
            (253, 1),
            &IoLimits {
                riops: Some(5),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(cgroupfs.join("io.max")).unwrap(),
            "253:1 rbps=max wbps=max riops=5 wiops=max"
        );
    }
}
