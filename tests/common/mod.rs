//! What the native test files share: certificates for the internal
//! channel (rcgen), and a node whose LVM report comes from a fake `lvm`
//! that prints a fixed one, so no device-mapper is needed.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use thinpool_csi::config::Config;
use thinpool_csi::grpc::validate;
use thinpool_csi::naming::{self, VolumeTags};
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::*;
use tonic::transport::Channel;

pub type Ca = CertifiedIssuer<'static, KeyPair>;

pub fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate and its key (PEM) that `ca` signed for `usage`
/// (every use when empty: no extended key usage).
pub fn leaf(ca: &Ca, name: &str, usage: &[ExtendedKeyUsagePurpose]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = usage.to_vec();
    let cert = p.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub const OWNER: &str = "tpcsi.test";

pub fn row(name: &str, attr: &str, pool: &str, seg: &str, tags: &str) -> String {
    format!(
        r#"{{"lv_name":"{name}","vg_name":"vg1","lv_attr":"{attr}","lv_size":"8388608","pool_lv":"{pool}","segtype":"{seg}","data_percent":"1.00","metadata_percent":"1.00","lv_tags":"{tags}","lv_health_status":"","lv_kernel_major":"-1","lv_kernel_minor":"-1","vg_extent_size":"4194304","vg_size":"17179869184","vg_free":"0","chunk_size":"65536","lv_time":"1700000000","origin":"","lv_read_ahead":"auto","thin_id":"5","lv_metadata_size":"4194304","vg_mda_size":"1048576","vg_mda_free":"500000"}}"#
    )
}

/// The tags of a volume of ours named `co` (ext4, single writer).
pub fn tags(co: &str) -> String {
    let cap = VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            },
        )),
        access_mode: Some(volume_capability::AccessMode { mode: 1 }),
    };
    let access = validate::capabilities(&[cap], "ext4").unwrap();
    let params = validate::parameters(
        &HashMap::new(),
        naming::DEFAULT_CLASS,
        "vg1",
        "pool",
        &access,
    )
    .unwrap();
    VolumeTags {
        owner: OWNER.into(),
        co_name: co.into(),
        access: Some(access),
        params,
        mutable: Default::default(),
        class_options: Default::default(),
        from: None,
        encrypted: false,
    }
    .encode()
    .join(",")
}

/// A config whose `lvm` prints a report of a thin pool and one volume of
/// ours for each CO name in `names` (returned as LV names, in name
/// order), in `dir`.
pub fn fake_lvm(dir: &Path, names: &[String]) -> (Config, Vec<String>) {
    let mut named: Vec<(String, &String)> = names
        .iter()
        .map(|co| (naming::lv_name_for(co), co))
        .collect();
    named.sort();
    let mut rows = vec![row("pool", "twi-aotz--", "", "thin-pool", "")];
    for (lv, co) in &named {
        rows.push(row(lv, "Vwi---tz--", "pool", "thin", &tags(co)));
    }
    let report = dir.join("report.json");
    std::fs::write(
        &report,
        format!(r#"{{"report":[{{"lv":[{}]}}]}}"#, rows.join(",")),
    )
    .unwrap();
    let lvm = dir.join("lvm");
    std::fs::write(
        &lvm,
        format!(
            "#!/bin/sh\ncase $1 in lvs) cat {} ;; esac\n",
            report.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&lvm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = Config {
        driver_name: OWNER.into(),
        lvm_binary: lvm.display().to_string(),
        volume_group: "vg1".into(),
        thin_pool: "pool".into(),
        lvm_shell: false,
        state_dir: dir.join("state"),
        ..Config::default()
    };
    (cfg, named.into_iter().map(|(lv, _)| lv).collect())
}

/// Every volume id ListVolumes gives in pages of `max` (0: one page), and
/// each next token; every page holds at most `max`, and a listing that
/// does not end within 1,000 pages fails.
pub async fn list_ids(c: &mut ControllerClient<Channel>, max: i32) -> (Vec<String>, Vec<String>) {
    let (mut ids, mut tokens, mut token) = (vec![], vec![], String::new());
    for _ in 0..1000 {
        let r = c
            .list_volumes(ListVolumesRequest {
                max_entries: max,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            max == 0 || r.entries.len() <= max as usize,
            "a page over {max}"
        );
        ids.extend(r.entries.into_iter().map(|e| e.volume.unwrap().volume_id));
        token = r.next_token;
        if token.is_empty() {
            return (ids, tokens);
        }
        tokens.push(token.clone());
    }
    panic!("ListVolumes in pages of {max} did not end in 1,000 pages");
}
