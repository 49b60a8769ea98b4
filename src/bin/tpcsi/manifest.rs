//! `tpcsi move --final --manifest FILE`: the PersistentVolume of the
//! moved volume, pinned to its new node, and the claim again under its
//! name, bound to it (docs/moving.md, "Moving a volume off a node"): the
//! YAML the cut-over applies, with no field typed by hand.
//!
//! deploy/kubernetes/examples/moved-volume.yaml is this module's output
//! for the inputs of its test, so the packaging checks hold it to the
//! Kubernetes schemas (strict) and the driver's installed class.

/// What the PV and the claim are made of.
#[derive(Debug, Clone)]
pub struct Moved<'a> {
    /// The PV's name (`tpcsi move --name`).
    pub pv: &'a str,
    pub namespace: &'a str,
    pub claim: &'a str,
    pub storage_class: &'a str,
    pub driver: &'a str,
    /// The node the volume is on now, and the topology key naming it.
    pub node: &'a str,
    pub topology_key: &'a str,
    pub volume_id: &'a str,
    pub bytes: i64,
    /// The filesystem; `None`: a raw block volume.
    pub fs_type: Option<&'a str>,
    /// ReadWriteOncePod for a single-writer volume, else ReadWriteOnce.
    pub single_writer: bool,
    /// `csi.nodeStageSecretRef` (namespace, name): an encrypted volume's
    /// passphrase, as the old PV names it.
    pub stage_secret: Option<(&'a str, &'a str)>,
    /// `spec.mountOptions`, as the old PV has them (its class's).
    pub mount_options: &'a [String],
}

/// Why a Kubernetes name is not one: `None` when it is a DNS-1123
/// subdomain (lower case alphanumerics, '-' and '.', starting and ending
/// alphanumeric, at most 253), or with `label` a DNS-1123 label (no
/// '.', at most 63), as a namespace is.
pub fn bad_name(what: &str, s: &str, label: bool) -> Option<String> {
    let max = if label { 63 } else { 253 };
    let inner =
        |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (!label && c == '.');
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok =
        s.len() <= max && s.chars().all(inner) && ends(s.chars().next()) && ends(s.chars().last());
    (!ok).then(|| {
        format!(
            "{what} {s:?} is no Kubernetes name (lower case letters, digits{}, '-' inside, at most {max})",
            if label { "" } else { " and '.'" }
        )
    })
}

/// `NAMESPACE/NAME` of `--claim` or `--node-stage-secret`, each checked.
pub fn ref_of<'a>(what: &str, s: &'a str) -> Result<(&'a str, &'a str), String> {
    let (ns, name) = s
        .split_once('/')
        .filter(|(_, name)| !name.contains('/'))
        .ok_or_else(|| format!("{what} {s:?}: give it as NAMESPACE/NAME"))?;
    if let Some(e) = bad_name(&format!("{what}'s namespace"), ns, true)
        .or_else(|| bad_name(&format!("{what}'s name"), name, false))
    {
        return Err(e);
    }
    Ok((ns, name))
}

/// A YAML string: JSON's double-quoted form, which YAML reads alike.
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// The two objects, as one YAML stream.
pub fn moved_volume(m: &Moved) -> String {
    let mode = match m.single_writer {
        true => "ReadWriteOncePod",
        false => "ReadWriteOnce",
    };
    let secret = match m.stage_secret {
        Some((ns, name)) => format!(
            "    nodeStageSecretRef:\n      namespace: {}\n      name: {}\n",
            q(ns),
            q(name)
        ),
        None => String::new(),
    };
    let mount_options = match m.mount_options {
        [] => String::new(),
        o => format!(
            "  mountOptions: [{}]\n",
            o.iter().map(|o| q(o)).collect::<Vec<_>>().join(", ")
        ),
    };
    let (volume_mode, fs) = match m.fs_type {
        Some(fs) if !fs.is_empty() => ("Filesystem", format!("    fsType: {}\n", q(fs))),
        Some(_) => ("Filesystem", String::new()),
        None => ("Block", String::new()),
    };
    format!(
        "# Written by `tpcsi move --final --manifest`: the PersistentVolume of the
# moved volume, pinned to its node, and the claim again under its name,
# bound to it. Apply once the old claim is deleted and its PV is set to
# Retain (docs/moving.md, \"Moving a volume off a node\").
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {pv}
spec:
  capacity:
    storage: {bytes}
  volumeMode: {volume_mode}
  accessModes: [{mode}]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: {class}
{mount_options}  claimRef:
    namespace: {ns}
    name: {claim}
  csi:
    driver: {driver}
    volumeHandle: {id}
{fs}{secret}  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - key: {key}
              operator: In
              values: [{node}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {claim}
  namespace: {ns}
spec:
  volumeMode: {volume_mode}
  accessModes: [{mode}]
  storageClassName: {class}
  volumeName: {pv}
  resources:
    requests:
      storage: {bytes}
",
        pv = q(m.pv),
        bytes = q(&m.bytes.to_string()),
        class = q(m.storage_class),
        ns = q(m.namespace),
        claim = q(m.claim),
        driver = q(m.driver),
        id = q(m.volume_id),
        key = q(m.topology_key),
        node = q(m.node),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example in deploy/kubernetes/examples is this output, byte for
    /// byte: the packaging checks validate it against the schemas.
    #[test]
    fn the_example_manifest_is_what_move_writes() {
        let driver = "thinpool.csi.storage.dev";
        let key = thinpool_csi::config::topology_key(driver);
        let m = Moved {
            pv: "pvc-moved-data",
            namespace: "default",
            claim: "moved-data",
            storage_class: "thinpool-csi",
            driver,
            node: "node-3",
            topology_key: &key,
            volume_id: "n1779f59f4d~csi-pvc-moved-data-3ad504646db46024",
            bytes: 1 << 30,
            fs_type: Some("ext4"),
            single_writer: false,
            stage_secret: None,
            mount_options: &[],
        };
        assert_eq!(
            moved_volume(&m),
            include_str!("../../../deploy/kubernetes/examples/moved-volume.yaml")
        );
        let block = moved_volume(&Moved {
            fs_type: None,
            single_writer: true,
            ..m
        });
        assert!(block.contains("volumeMode: Block") && !block.contains("fsType"));
        assert!(block.contains("accessModes: [ReadWriteOncePod]"));
        let options = ["noatime".to_string(), "discard".to_string()];
        let encrypted = moved_volume(&Moved {
            stage_secret: Some(("apps", "luks-key")),
            mount_options: &options,
            ..m
        });
        assert!(encrypted.contains(
            "    fsType: \"ext4\"\n    nodeStageSecretRef:\n      namespace: \"apps\"\n      name: \"luks-key\"\n  nodeAffinity:"
        ), "{encrypted}");
        assert!(
            encrypted.contains("  mountOptions: [\"noatime\", \"discard\"]\n  claimRef:"),
            "{encrypted}"
        );
    }

    #[test]
    fn a_claim_is_namespace_and_name_each_a_kubernetes_name() {
        assert_eq!(ref_of("--claim", "apps/data.v2"), Ok(("apps", "data.v2")));
        for bad in [
            "data",
            "/data",
            "apps/",
            "a/b/c",
            "Apps/data",
            "apps/Data",
            "a.b/data",
            "apps/-x",
            "apps/x-",
        ] {
            assert!(ref_of("--claim", bad).is_err(), "{bad}");
        }
        assert!(bad_name("--name", &"a".repeat(253), false).is_none());
        assert!(bad_name("--name", &"a".repeat(254), false).is_some());
        assert!(bad_name("namespace", &"a".repeat(64), true).is_some());
        assert!(bad_name("--storage-class", "", false).is_some());
    }
}
