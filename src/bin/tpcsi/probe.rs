//! `probe`: whether the driver serves (Probe on both sockets) and whether
//! the pool of each device class takes a new volume (GetCapacity of every
//! class, as `capacity` asks it): the pod's readiness.
//!
//! Probe's own answer has only `ready`, and the driver stays ready while
//! one class is down (the others serve; its log names the broken class),
//! so which class is down is GetCapacity's to say. The exit status:
//! - a service not ready: UNAVAILABLE (24);
//! - the default class's pool taking no new volume: as before classes,
//!   its GetCapacity code (24 for a missing pool), else 18;
//! - else another class's taking none: [`crate::failure::EXIT_CLASS_DOWN`]
//!   (5), unless
//!   `--tolerate-other-classes`.
//!
//! The readiness probe (deploy/kubernetes/base/node.yaml) passes
//! `--tolerate-other-classes`: one class down leaves the others serving
//! (README, "Device classes"), and a pod that is not ready holds up the
//! DaemonSet's rollout on that node for nothing those classes could use;
//! the default class is where a claim without `deviceClass` goes, so its
//! pool keeps deciding, as the single pool did. Run by hand, `probe` fails
//! for any class.

use thinpool_csi::proto::csi::v1 as csi;
use thinpool_csi::proto::identity as addons;
use tonic::Status;

use crate::args::ProbeArgs;
use crate::capacity::every_class;
use crate::connect::Ctx;
use crate::failure::{Failure, Result};
use crate::output::{PoolReadiness, ProbeOut, ProbeService};
use csi::identity_client::IdentityClient;

/// How long a class other than the default may take to answer
/// GetCapacity under `--tolerate-other-classes` (the deployment's
/// readiness probe gives the whole probe 8 s).
const OTHERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn probe(c: &mut Ctx, a: ProbeArgs) -> Result<()> {
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
    // Probe says the driver serves; whether a class's pool takes a new
    // volume is GetCapacity's answer (0 while it is full, failed or
    // read-only, an error while it is missing).
    // Tolerating the other classes, a hung one must not use up the
    // readiness probe's time either: each gets OTHERS_WITHIN.
    let within = a.tolerate_other_classes.then_some(OTHERS_WITHIN);
    let every = every_class(c, &csi::GetCapacityRequest::default(), within).await?;
    let classes: Vec<PoolReadiness> = every
        .answers
        .iter()
        .map(|(class, answer)| PoolReadiness::new(class, answer))
        .collect();
    let Some(pool) = classes.iter().find(|p| p.device_class == every.default) else {
        return Err(Status::internal(format!(
            "the driver's default device class {:?} is not among its classes {:?}",
            every.default,
            every.answers.iter().map(|(c, _)| c).collect::<Vec<_>>()
        ))
        .into());
    };
    let out = ProbeOut {
        services,
        pool: pool.clone(),
        default_device_class: every.default,
        device_classes: classes,
    };
    c.show(&out);
    verdict(&out, a.tolerate_other_classes)
}

/// The exit `out` gives; see the module documentation.
fn verdict(out: &ProbeOut, tolerate_other_classes: bool) -> Result<()> {
    if !out.services.iter().all(|s| s.ready) {
        return Err(Status::unavailable("the driver says it is not ready").into());
    }
    out.pool.verdict()?;
    let down: Vec<String> = out
        .device_classes
        .iter()
        .filter(|p| p.device_class != out.default_device_class)
        .filter_map(|p| p.verdict().err())
        .map(|e| e.message().to_string())
        .collect();
    if down.is_empty() || tolerate_other_classes {
        return Ok(());
    }
    Err(Failure::ClassDown(format!(
        "{}; the default class {} takes new volumes",
        down.join("; "),
        out.default_device_class
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Render;
    use tonic::Code;

    fn readiness(class: &str, available: Option<i64>) -> PoolReadiness {
        let answer = match available {
            Some(a) => Ok(csi::GetCapacityResponse {
                available_capacity: a,
                maximum_volume_size: Some(a),
                minimum_volume_size: None,
            }),
            None => Err(Status::unavailable(format!(
                "volume group vg-{class} not found"
            ))),
        };
        PoolReadiness::new(class, &answer)
    }

    fn probed(default: &str, classes: Vec<PoolReadiness>, ready: bool) -> ProbeOut {
        ProbeOut {
            services: vec![ProbeService {
                service: "csi",
                endpoint: "unix:///csi.sock".into(),
                ready,
            }],
            pool: classes
                .iter()
                .find(|p| p.device_class == default)
                .unwrap()
                .clone(),
            default_device_class: default.into(),
            device_classes: classes,
        }
    }

    #[test]
    fn every_class_serving_is_ready() {
        let out = probed(
            "default",
            vec![
                readiness("default", Some(64 << 20)),
                readiness("fast", Some(1 << 30)),
            ],
            true,
        );
        assert!(verdict(&out, false).is_ok());
        let t = out.table();
        assert!(
            t.contains("pool of class default (default): takes new volumes (64 MiB available)\n")
                && t.contains("pool of class fast: takes new volumes (1 GiB available)\n"),
            "{t}"
        );
    }

    #[test]
    fn another_class_down_is_exit_5_and_named_unless_tolerated() {
        let out = probed(
            "default",
            vec![
                readiness("default", Some(64 << 20)),
                readiness("fast", None),
                readiness("slow", Some(0)),
            ],
            true,
        );
        let f = verdict(&out, false).unwrap_err();
        assert_eq!(f.exit_status(), 5);
        let line = f.line();
        assert!(
            line.contains("device class fast takes no new volume: GetCapacity: volume group vg-fast not found")
                && line.contains("device class slow takes no new volume: GetCapacity answers 0")
                && line.contains("the default class default takes new volumes"),
            "{line}"
        );
        assert!(verdict(&out, true).is_ok());
        let t = out.table();
        assert!(
            t.contains("pool of class fast: takes no new volume: GetCapacity: volume group vg-fast not found\n"),
            "{t}"
        );
        let j = serde_json::to_value(&out).unwrap();
        assert_eq!(j["default_device_class"], "default");
        assert_eq!(j["pool"]["device_class"], "default");
        assert_eq!(j["device_classes"][1]["device_class"], "fast");
        assert_eq!(j["device_classes"][1]["takes_new_volumes"], false);
    }

    #[test]
    fn the_default_class_keeps_its_code_whatever_the_others_do() {
        // The default class need not be the top-level pool.
        let out = probed(
            "fast",
            vec![readiness("default", None), readiness("fast", None)],
            true,
        );
        for tolerate in [false, true] {
            match verdict(&out, tolerate) {
                Err(Failure::Grpc(s)) => {
                    assert_eq!(s.code(), Code::Unavailable);
                    assert!(s.message().contains("device class fast"), "{s:?}");
                }
                other => panic!("{other:?}"),
            }
        }
        let full = probed("default", vec![readiness("default", Some(0))], true);
        assert_eq!(verdict(&full, true).unwrap_err().exit_status(), 18);
        // A driver that is not ready: UNAVAILABLE before any pool.
        let not_ready = probed("default", vec![readiness("default", Some(1 << 20))], false);
        assert_eq!(verdict(&not_ready, false).unwrap_err().exit_status(), 24);
    }
}
