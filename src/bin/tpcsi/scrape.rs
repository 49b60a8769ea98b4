//! The driver's metadata figures, read from its `/metrics` endpoint
//! (`metrics_address`, through `thinpool_csi::metrics::http::scrape`): the
//! one place the driver publishes them, as CSI's GetCapacity has no field
//! for them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

/// The address to dial for a `metrics_address`: an unspecified listen
/// address (`0.0.0.0`, `[::]`) is reached on loopback.
pub fn dial_address(listen: &str) -> Result<SocketAddr, String> {
    let mut addr: SocketAddr = listen
        .parse()
        .map_err(|e| format!("metrics address {listen:?}: {e} (want IP:PORT)"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// Both metadata stores, as the driver counts them.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Metadata {
    pub pool_metadata_size: Option<u64>,
    pub pool_metadata_percent: Option<f64>,
    /// Volumes and snapshots the pool's metadata takes before LVM refuses.
    pub pool_lvs_left: Option<u64>,
    pub vg_metadata_area_size: Option<u64>,
    pub vg_metadata_area_free: Option<u64>,
    pub vg_lvs_left: Option<u64>,
}

/// A sample of class `class`, with a `store` label when given.
fn sample(s: &BTreeMap<String, f64>, name: &str, class: &str, store: Option<&str>) -> Option<f64> {
    let key = match store {
        None => format!("{name}{{class=\"{class}\"}}"),
        Some(st) => format!("{name}{{class=\"{class}\",store=\"{st}\"}}"),
    };
    s.get(&key).copied()
}

/// What the thin-pool autopilot of a class did; absent when it is off.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Autopilot {
    pub data_growths: u64,
    pub metadata_growths: u64,
    pub backing_file_growths: u64,
    pub refusals: u64,
    /// Past a threshold and unable to grow (the volumes' conditions say why).
    pub blocked: bool,
}

impl Autopilot {
    pub fn from_samples(s: &BTreeMap<String, f64>, class: &str) -> Option<Autopilot> {
        let blocked = sample(s, "thinpool_csi_autopilot_blocked", class, None)?;
        let n = |name: &str, store| sample(s, name, class, store).unwrap_or(0.0) as u64;
        let growths = "thinpool_csi_autopilot_growths_total";
        Some(Autopilot {
            data_growths: n(growths, Some("data")),
            metadata_growths: n(growths, Some("metadata")),
            backing_file_growths: n(growths, Some("backing_file")),
            refusals: n("thinpool_csi_autopilot_refusals_total", None),
            blocked: blocked > 0.0,
        })
    }
}

impl Metadata {
    /// Device class `class`'s figures (`default`: the top-level pool).
    pub fn from_samples(s: &BTreeMap<String, f64>, class: &str) -> Metadata {
        let key = |name: &str, store: Option<&str>| match store {
            None => format!("{name}{{class=\"{class}\"}}"),
            Some(st) => format!("{name}{{class=\"{class}\",store=\"{st}\"}}"),
        };
        let n = |name: &str, store| sample(s, name, class, store).map(|v| v as u64);
        Metadata {
            pool_metadata_size: n("thinpool_csi_pool_metadata_size_bytes", None),
            pool_metadata_percent: s
                .get(&key("thinpool_csi_pool_metadata_percent", None))
                .copied(),
            pool_lvs_left: n("thinpool_csi_metadata_lvs_left", Some("pool")),
            vg_metadata_area_size: n("thinpool_csi_vg_metadata_area_size_bytes", None),
            vg_metadata_area_free: n("thinpool_csi_vg_metadata_area_free_bytes", None),
            vg_lvs_left: n("thinpool_csi_metadata_lvs_left", Some("vg")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use thinpool_csi::metrics::text::samples;

    #[test]
    fn unspecified_listen_addresses_are_dialled_on_loopback() {
        assert_eq!(
            dial_address("0.0.0.0:9808").unwrap().to_string(),
            "127.0.0.1:9808"
        );
        assert_eq!(dial_address("[::]:9808").unwrap().to_string(), "[::1]:9808");
        assert_eq!(
            dial_address("10.1.2.3:80").unwrap().to_string(),
            "10.1.2.3:80"
        );
        assert!(dial_address("localhost:9808").is_err());
    }

    #[test]
    fn autopilot_figures_from_an_exposition() {
        let text = "thinpool_csi_autopilot_growths_total{class=\"fast\",store=\"data\"} 3\n\
            thinpool_csi_autopilot_growths_total{class=\"fast\",store=\"backing_file\"} 1\n\
            thinpool_csi_autopilot_refusals_total{class=\"fast\"} 2\n\
            thinpool_csi_autopilot_blocked{class=\"fast\"} 1\n";
        let a = Autopilot::from_samples(&samples(text), "fast").unwrap();
        assert_eq!(
            a,
            Autopilot {
                data_growths: 3,
                metadata_growths: 0,
                backing_file_growths: 1,
                refusals: 2,
                blocked: true
            }
        );
        assert_eq!(Autopilot::from_samples(&samples(text), "default"), None);
    }

    #[test]
    fn metadata_figures_from_an_exposition() {
        let text = "# HELP x\n# TYPE x gauge\n\
            thinpool_csi_pool_metadata_size_bytes{class=\"default\"} 4194304\n\
            thinpool_csi_pool_metadata_size_bytes{class=\"fast\"} 8388608\n\
            thinpool_csi_pool_metadata_percent{class=\"default\"} 73.3\n\
            thinpool_csi_metadata_lvs_left{class=\"default\",store=\"pool\"} 27\n\
            thinpool_csi_metadata_lvs_left{class=\"default\",store=\"vg\"} 900\n\
            thinpool_csi_vg_metadata_area_size_bytes{class=\"default\"} 1044480\n\
            thinpool_csi_vg_metadata_area_free_bytes{class=\"default\"} 480000\n\
            thinpool_csi_rpc_requests_total{service=\"a b\",method=\"M\"} 3\n";
        let m = Metadata::from_samples(&samples(text), "default");
        assert_eq!(
            m,
            Metadata {
                pool_metadata_size: Some(4194304),
                pool_metadata_percent: Some(73.3),
                pool_lvs_left: Some(27),
                vg_metadata_area_size: Some(1044480),
                vg_metadata_area_free: Some(480000),
                vg_lvs_left: Some(900),
            }
        );
        // A label value with a space still leaves the value last.
        assert_eq!(
            samples(text).get("thinpool_csi_rpc_requests_total{service=\"a b\",method=\"M\"}"),
            Some(&3.0)
        );
        assert_eq!(
            Metadata::from_samples(&BTreeMap::new(), "default"),
            Metadata::default()
        );
    }
}
