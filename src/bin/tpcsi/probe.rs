//! `probe`: whether the driver serves (Probe on both sockets) and whether
//! its pool takes a new volume (GetCapacity): the pod's readiness.

use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::identity as addons;
use tonic::Status;

use crate::connect::Ctx;
use crate::failure::Result;
use crate::output::{PoolReadiness, ProbeOut, ProbeService};
use csi::identity_client::IdentityClient;

pub async fn probe(c: &mut Ctx) -> Result<()> {
    let mut services = Vec::new();
    let r = IdentityClient::new(c.csi().await?)
        .probe(csi::ProbeRequest {})
        .await?
        .into_inner();
    services.push(ProbeService {
        service: "csi",
        endpoint: c.ends.csi.clone(),
        ready: r.ready.unwrap_or(true),
    });
    if let Some(uri) = c.ends.addons.clone() {
        let r = addons::identity_client::IdentityClient::new(c.addons().await?)
            .probe(addons::ProbeRequest {})
            .await?
            .into_inner();
        services.push(ProbeService {
            service: "csi-addons",
            endpoint: uri,
            ready: r.ready.unwrap_or(true),
        });
    }
    // Probe says the driver serves; whether its pool takes a new volume
    // is GetCapacity's answer (0 while it is full, failed or read-only, an
    // error while it is missing). The pod's readiness runs this.
    let pool = match c
        .controller()
        .await?
        .get_capacity(csi::GetCapacityRequest::default())
        .await
    {
        Ok(r) => PoolReadiness::from_capacity(&r.into_inner()),
        Err(s) => PoolReadiness::refused(s.code(), s.message()),
    };
    let all_ready = services.iter().all(|s| s.ready);
    let verdict = if !all_ready {
        Err(Status::unavailable("the driver says it is not ready"))
    } else {
        pool.verdict()
    };
    c.show(&ProbeOut { services, pool });
    verdict.map_err(Into::into)
}
