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
  claimRef:
    namespace: {ns}
    name: {claim}
  csi:
    driver: {driver}
    volumeHandle: {id}
{fs}  nodeAffinity:
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

/// `NAMESPACE/NAME` of `--claim`.
pub fn claim_of(s: &str) -> Result<(&str, &str), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(format!("--claim {s:?}: give it as NAMESPACE/NAME")),
    }
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
    }

    #[test]
    fn a_claim_is_namespace_and_name() {
        assert_eq!(claim_of("apps/data"), Ok(("apps", "data")));
        for bad in ["data", "/data", "apps/", "a/b/c"] {
            assert!(claim_of(bad).is_err(), "{bad}");
        }
    }
}
