//! `capacity`: GetCapacity of one device class (`--param deviceClass=NAME`)
//! or, without one, of every class the driver's GetPluginInfo manifest
//! names, each with both metadata stores of that class scraped from the
//! driver's metrics (one scrape for all). A class that is down shows its
//! error among the others; when every class is down the command fails
//! with the first one's code. Through the cluster's controller: each
//! node's capacity for one class (`crate::cluster::capacity`). `probe` asks every class the same way
//! ([`every_class`]).

use std::collections::BTreeMap;

use thinpool_csi::naming::DEFAULT_CLASS;
use thinpool_csi::proto::csi::v1 as csi;
use tonic::Status;

use crate::args;
use crate::capability::given_capability;
use crate::connect::{Ctx, Endpoints};
use crate::failure::{Failure, Result};
use crate::output::{CapacitiesOut, CapacityOut, ClassCapacity};
use crate::scrape;

const DEVICE_CLASS: &str = "deviceClass";

pub async fn capacity(c: &mut Ctx, a: args::CapacityArgs) -> Result<()> {
    let req = csi::GetCapacityRequest {
        volume_capabilities: given_capability(&a.access).into_iter().collect(),
        parameters: a.params.into_iter().collect(),
        accessible_topology: None,
    };
    // The cluster's controller: each node, with its topology.
    let info = crate::cluster::plugin_info(c).await?;
    if let Some(nodes) = crate::cluster::nodes(&info) {
        let out = crate::cluster::capacity(c, &nodes, req).await?;
        c.show(&out);
        return Ok(());
    }
    if let Some(class) = req.parameters.get(DEVICE_CLASS).cloned() {
        let r = c.controller().await?.get_capacity(req).await?.into_inner();
        let samples = samples(&c.ends).await;
        c.show(&answered(&r, &class, samples.as_ref()));
        return Ok(());
    }
    let every = ask_every_class(c, &req, None, classes_of(info)).await?;
    let samples = samples(&c.ends).await;
    let mut first_error = None;
    let classes: Vec<_> = every
        .answers
        .into_iter()
        .map(|(class, answer)| match answer {
            Ok(r) => ClassCapacity::Answered(answered(&r, &class, samples.as_ref())),
            Err(s) => {
                let failed = ClassCapacity::Failed {
                    error: format!("{:?}: {}", s.code(), s.message()),
                    device_class: class,
                };
                first_error.get_or_insert(s);
                failed
            }
        })
        .collect();
    // Every class down: the command fails as a single call would.
    if let Some(e) = first_error.filter(|_| {
        classes
            .iter()
            .all(|c| matches!(c, ClassCapacity::Failed { .. }))
    }) {
        return Err(e.into());
    }
    c.show(&CapacitiesOut {
        default_device_class: every.default,
        device_classes: classes,
    });
    Ok(())
}

/// GetCapacity of one request in every device class the driver serves.
pub struct EveryClass {
    /// The class a request without `deviceClass` goes to.
    pub default: String,
    /// Each class's answer, or its error, in the manifest's order.
    pub answers: Vec<(
        String,
        std::result::Result<csi::GetCapacityResponse, Status>,
    )>,
}

/// The device classes the driver serves, from its GetPluginInfo manifest:
/// (the default one, every one in its order).
pub async fn served_classes(c: &mut Ctx) -> Result<(String, Vec<String>)> {
    Ok(classes_of(crate::cluster::plugin_info(c).await?))
}

fn classes_of(info: csi::GetPluginInfoResponse) -> (String, Vec<String>) {
    let mut manifest = info.manifest;
    let default = manifest
        .remove("default_device_class")
        .unwrap_or_else(|| DEFAULT_CLASS.to_string());
    let names = manifest
        .remove("device_classes")
        .unwrap_or_else(|| default.clone());
    let all = names
        .split(',')
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    (default, all)
}

/// Before a listing: the cluster's nodes when the endpoint is its
/// controller, to name each entry's node. Else `--class NAME` is checked:
/// a class the driver does not serve is bad input naming the ones it does
/// (not an empty list, which would read as "that class has none"). A
/// controller's classes are each node's own, so it checks none.
pub async fn before_listing(
    c: &mut Ctx,
    class: Option<&str>,
) -> Result<Option<crate::cluster::Nodes>> {
    let info = crate::cluster::plugin_info(c).await?;
    if let Some(nodes) = crate::cluster::nodes(&info) {
        return Ok(Some(nodes));
    }
    let Some(class) = class else {
        return Ok(None);
    };
    let (_, all) = classes_of(info);
    if all.iter().any(|n| n == class) {
        return Ok(None);
    }
    Err(Failure::Local(format!(
        "device class {class:?} is not served by this driver; it serves: {}",
        all.join(", ")
    )))
}

/// `req` asked of every class the driver's GetPluginInfo manifest names
/// (`deviceClass` set to each). A class that is down answers UNAVAILABLE
/// and the others still answer, so an error is kept beside them, not
/// returned; the error returned is GetPluginInfo's, or a connection's.
/// With `others_within`, a class other than the default that has not
/// answered by then counts as DEADLINE_EXCEEDED: a class whose disk hangs
/// (its LVM command waits up to the driver's command timeout) cannot hold
/// the caller past that.
pub async fn every_class(
    c: &mut Ctx,
    req: &csi::GetCapacityRequest,
    others_within: Option<std::time::Duration>,
) -> Result<EveryClass> {
    let classes = served_classes(c).await?;
    ask_every_class(c, req, others_within, classes).await
}

/// [`every_class`], of the classes (default, all) already read.
async fn ask_every_class(
    c: &mut Ctx,
    req: &csi::GetCapacityRequest,
    others_within: Option<std::time::Duration>,
    (default, names): (String, Vec<String>),
) -> Result<EveryClass> {
    let mut answers = Vec::new();
    for class in &names {
        let mut one = req.clone();
        one.parameters
            .insert(DEVICE_CLASS.to_string(), class.to_string());
        let mut client = c.controller().await?;
        let call = client.get_capacity(one);
        let answer = match others_within.filter(|_| *class != default) {
            Some(within) => tokio::time::timeout(within, call)
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "device class {class} did not answer GetCapacity within {within:?}"
                    )))
                }),
            None => call.await,
        };
        answers.push((class.to_string(), answer.map(tonic::Response::into_inner)));
    }
    Ok(EveryClass { default, answers })
}

fn answered(
    r: &csi::GetCapacityResponse,
    class: &str,
    samples: Option<&BTreeMap<String, f64>>,
) -> CapacityOut {
    let mut out = CapacityOut::from(r);
    out.metadata = samples.map(|s| scrape::Metadata::from_samples(s, class));
    out.autopilot = samples.and_then(|s| scrape::Autopilot::from_samples(s, class));
    out.device_class = class.to_string();
    out
}

/// The driver's metrics, for the metadata figures, or why they are not
/// shown (on stderr; GetCapacity's answer stands on its own).
async fn samples(ends: &Endpoints) -> Option<BTreeMap<String, f64>> {
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
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("note: {e}: metadata figures not shown");
            None
        }
    }
}
