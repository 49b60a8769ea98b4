//! `capacity`: the pool's GetCapacity, with both metadata stores scraped
//! from the driver's metrics.

use thinpool_csi::proto::csi::v1 as csi;

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
    let r = c.controller().await?.get_capacity(req).await?.into_inner();
    let mut out = CapacityOut::from(&r);
    out.metadata = metadata(&c.ends).await;
    c.show(&out);
    Ok(())
}

/// Both metadata stores from the driver's metrics, or why they are not
/// shown (on stderr; GetCapacity's answer stands on its own).
async fn metadata(ends: &Endpoints) -> Option<scrape::Metadata> {
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
        Ok(s) => Some(scrape::Metadata::from_samples(
            &s,
            thinpool_csi::naming::DEFAULT_CLASS,
        )),
        Err(e) => {
            eprintln!("note: {e}: metadata figures not shown");
            None
        }
    }
}
