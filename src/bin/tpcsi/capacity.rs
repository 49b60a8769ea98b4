//! `capacity`: a device class's GetCapacity (`-p deviceClass=NAME`, else
//! the driver's default class), with both metadata stores of that class
//! scraped from the driver's metrics.

use thinpool_csi::naming::DEFAULT_CLASS;
use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::csi::v1::identity_client::IdentityClient;

use crate::args;
use crate::capability::given_capability;
use crate::connect::{Ctx, Endpoints};
use crate::failure::Result;
use crate::output::CapacityOut;
use crate::scrape;

pub async fn capacity(c: &mut Ctx, a: args::CapacityArgs) -> Result<()> {
    let req = csi::GetCapacityRequest {
        volume_capabilities: given_capability(&a.access).into_iter().collect(),
        parameters: a.params.into_iter().collect(),
        accessible_topology: None,
    };
    // The class the answer is for: the one asked about, else the driver's
    // default (its GetPluginInfo manifest says which).
    let class = match req.parameters.get("deviceClass") {
        Some(cl) => cl.clone(),
        None => IdentityClient::new(c.csi().await?)
            .get_plugin_info(csi::GetPluginInfoRequest {})
            .await?
            .into_inner()
            .manifest
            .remove("default_device_class")
            .unwrap_or_else(|| DEFAULT_CLASS.to_string()),
    };
    let r = c.controller().await?.get_capacity(req).await?.into_inner();
    let mut out = CapacityOut::from(&r);
    out.metadata = metadata(&c.ends, &class).await;
    out.device_class = class;
    c.show(&out);
    Ok(())
}

/// Both metadata stores from the driver's metrics, or why they are not
/// shown (on stderr; GetCapacity's answer stands on its own).
async fn metadata(ends: &Endpoints, class: &str) -> Option<scrape::Metadata> {
    let Some(listen) = &ends.metrics else {
        eprintln!(
            "note: no metrics address (--metrics-address, $METRICS_ADDRESS or the config's \
             metrics_address): metadata figures not shown"
        );
        return None;
    };
    let got = match scrape::dial_address(listen) {
        Ok(addr) => thinpool_csi::metrics::http::scrape(addr).await,
        Err(e) => Err(e),
    };
    match got {
        Ok(s) => Some(scrape::Metadata::from_samples(&s, class)),
        Err(e) => {
            eprintln!("note: {e}: metadata figures not shown");
            None
        }
    }
}
