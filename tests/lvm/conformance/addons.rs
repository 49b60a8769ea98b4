//! CSI-Addons: every row of the error tables of ReclaimSpace (Controller
//! and Node), NodeHealer (`csi-addons-reclaimspace.md`,
//! `csi-addons-healer.md`) and EncryptionKeyRotate (csi-addons/spec,
//! `encryptionkeyrotation/README.md`), and UNIMPLEMENTED for the
//! CSI-Addons services this driver does not serve.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::node_client::NodeClient;
use thinpool_csi::proto::csi::v1::DeleteVolumeRequest;
use thinpool_csi::proto::encryptionkeyrotation::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient;
use thinpool_csi::proto::encryptionkeyrotation::EncryptionKeyRotateRequest;
use thinpool_csi::proto::healer::healer_node_client::HealerNodeClient;
use thinpool_csi::proto::healer::NodeHealerRequest;
use thinpool_csi::proto::identity::capability::Type as AddonsCap;
use thinpool_csi::proto::identity::identity_client::IdentityClient as AddonsIdentityClient;
use thinpool_csi::proto::identity::GetCapabilitiesRequest;
use thinpool_csi::proto::reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient;
use thinpool_csi::proto::reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient;
use thinpool_csi::proto::reclaimspace::{ControllerReclaimSpaceRequest, NodeReclaimSpaceRequest};
use tonic::transport::Channel;
use tonic::Code;

use super::{raw_call, Rules, NOT_IMPLEMENTED};
use crate::fixtures::{block_cap, create, mount_cap, publish_req, s, stage_req, Kubelet};
use crate::harness::{TestDriver, MIB};

/// The rows of the CSI-Addons error tables, as quoted by the rules.
const MISSING: &str = "\"Missing required field: 3 INVALID_ARGUMENT\"";
const NO_VOLUME: &str = "\"Volume does not exist: 5 NOT_FOUND\"";
const PENDING: &str = "\"Operation pending for volume: 10 ABORTED\"";
const KEY_AUTH: &str = "\"Not authenticated: 16 UNAUTHENTICATED\"";
const AUTH: &str =
    "\"Not authenticated: 16 UNAUTHENTICATED\" (we take no secrets: any are ignored)";

fn secrets() -> HashMap<String, String> {
    [("user".to_string(), "not-a-real-secret".to_string())].into()
}

fn ctl_req(id: &str) -> ControllerReclaimSpaceRequest {
    ControllerReclaimSpaceRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

fn node_req(id: &str, path: &str) -> NodeReclaimSpaceRequest {
    NodeReclaimSpaceRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

/// An EncryptionKeyRotate of `id` from passphrase `current` to `new`.
fn rotate_req(id: &str, current: &str, new: &str) -> EncryptionKeyRotateRequest {
    EncryptionKeyRotateRequest {
        volume_id: id.into(),
        encryption_key: new.into(),
        secrets: [("passphrase".to_string(), current.to_string())].into(),
        ..Default::default()
    }
}

fn heal_req(id: &str, path: &str) -> NodeHealerRequest {
    NodeHealerRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    }
}

/// What the error-table rules start from: a driver on a kubelet directory
/// of its own, their Rules, the CSI-Addons clients, and three volumes: one
/// staged and published (`live`, at `stg` and `tgt`), one unstaged
/// (`idle`), one deleted (`gone`). A test binds `k` and `d` even when it
/// does not use them: a field left to `..` is dropped at once.
struct AddonsGround {
    k: Kubelet,
    d: TestDriver,
    r: Rules,
    uri: String,
    ctl: ReclaimSpaceControllerClient<Channel>,
    rn: ReclaimSpaceNodeClient<Channel>,
    h: HealerNodeClient<Channel>,
    kr: EncryptionKeyRotationControllerClient<Channel>,
    n: NodeClient<Channel>,
    live: String,
    idle: String,
    gone: String,
    tgt: String,
    stg: String,
}

async fn addons_ground(name: &str, what: &'static str) -> AddonsGround {
    let k = Kubelet::new(name);
    let d = TestDriver::start(name, 512 * MIB, &k.extra()).await;
    let r = Rules::new(what);
    let uri = d.addons_uri();
    let ctl = ReclaimSpaceControllerClient::connect(uri.clone())
        .await
        .unwrap();
    let rn = ReclaimSpaceNodeClient::connect(uri.clone()).await.unwrap();
    let h = HealerNodeClient::connect(uri.clone()).await.unwrap();
    let kr = EncryptionKeyRotationControllerClient::connect(uri.clone())
        .await
        .unwrap();
    let mut n = d.node().await;
    let mut c = d.controller().await;

    // A staged and published volume, an unstaged one, and a deleted one.
    let live = create(&d, "cfadd-live", 32 * MIB, mount_cap("ext4")).await;
    let staging = k.staging("live");
    let target = k.target("live");
    n.node_stage_volume(stage_req(&live, &staging, mount_cap("ext4")))
        .await
        .expect("stage");
    n.node_publish_volume(publish_req(
        &live,
        &staging,
        &target,
        mount_cap("ext4"),
        false,
    ))
    .await
    .expect("publish");
    let idle = create(&d, "cfadd-idle", 16 * MIB, block_cap()).await;
    let gone = create(&d, "cfadd-gone", 16 * MIB, block_cap()).await;
    c.delete_volume(DeleteVolumeRequest {
        volume_id: gone.clone(),
        secrets: HashMap::new(),
    })
    .await
    .expect("delete");
    let (tgt, stg) = (s(&target), s(&staging));
    AddonsGround {
        k,
        d,
        r,
        uri,
        ctl,
        rn,
        h,
        kr,
        n,
        live,
        idle,
        gone,
        tgt,
        stg,
    }
}

/// Missing required field → INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread")]
async fn addons_missing_required_field() {
    let AddonsGround {
        k: _k,
        d: _d,
        mut r,
        mut ctl,
        mut rn,
        mut h,
        mut kr,
        live,
        tgt,
        ..
    } = addons_ground("cfaddm", "CSI-Addons missing field").await;
    // -- Missing required field ---------------------------------------------
    r.code(
        &format!("ControllerReclaimSpace: volume_id is REQUIRED → INVALID_ARGUMENT [{MISSING}]"),
        ctl.controller_reclaim_space(ctl_req("")).await,
        Code::InvalidArgument,
    );
    r.code(
        &format!("NodeReclaimSpace: volume_id is REQUIRED → INVALID_ARGUMENT [{MISSING}]"),
        rn.node_reclaim_space(node_req("", &tgt)).await,
        Code::InvalidArgument,
    );
    r.code(
        &format!("NodeReclaimSpace: volume_path is REQUIRED → INVALID_ARGUMENT [{MISSING}]"),
        rn.node_reclaim_space(node_req(&live, "")).await,
        Code::InvalidArgument,
    );
    r.code(
        &format!("NodeHealer: volume_id is REQUIRED → INVALID_ARGUMENT [{MISSING}]"),
        h.node_healer(heal_req("", &tgt)).await,
        Code::InvalidArgument,
    );
    r.code(
        &format!("NodeHealer: volume_path is REQUIRED → INVALID_ARGUMENT [{MISSING}]"),
        h.node_healer(heal_req(&live, "")).await,
        Code::InvalidArgument,
    );
    r.code(
        &format!("EncryptionKeyRotate: volume_id is REQUIRED → INVALID_ARGUMENT [{MISSING}]"),
        kr.encryption_key_rotate(rotate_req("", "old key", "new key"))
            .await,
        Code::InvalidArgument,
    );
    r.code(
        &format!("EncryptionKeyRotate: encryption_key is required by this driver (it makes no keys) → INVALID_ARGUMENT [{MISSING}]"),
        kr.encryption_key_rotate(rotate_req(&live, "old key", "")).await,
        Code::InvalidArgument,
    );
    let mut no_secret = rotate_req(&live, "old key", "new key");
    no_secret.secrets.clear();
    r.code(
        &format!("EncryptionKeyRotate: the current passphrase in the secrets is required → INVALID_ARGUMENT [{MISSING}]"),
        kr.encryption_key_rotate(no_secret).await,
        Code::InvalidArgument,
    );
    r.finish();
}

/// Volume does not exist → NOT_FOUND.
#[tokio::test(flavor = "multi_thread")]
async fn addons_volume_does_not_exist() {
    let AddonsGround {
        k: _k,
        d: _d,
        mut r,
        mut ctl,
        mut rn,
        mut h,
        mut kr,
        idle,
        gone,
        tgt,
        ..
    } = addons_ground("cfaddn", "CSI-Addons no volume").await;
    // -- Volume does not exist ----------------------------------------------
    let never = naming::lv_name_for("cfadd-never");
    for (what, u) in [
        ("a foreign id", "vg0/root"),
        ("an id of our shape never created", never.as_str()),
        ("a deleted volume", gone.as_str()),
    ] {
        r.code(
            &format!("ControllerReclaimSpace: {what} → NOT_FOUND [{NO_VOLUME}]"),
            ctl.controller_reclaim_space(ctl_req(u)).await,
            Code::NotFound,
        );
        r.code(
            &format!("NodeReclaimSpace: {what} → NOT_FOUND [{NO_VOLUME}]"),
            rn.node_reclaim_space(node_req(u, &tgt)).await,
            Code::NotFound,
        );
        r.code(
            &format!("NodeHealer: {what} → NOT_FOUND [{NO_VOLUME}]"),
            h.node_healer(heal_req(u, &tgt)).await,
            Code::NotFound,
        );
        r.code(
            &format!("EncryptionKeyRotate: {what} → NOT_FOUND [{NO_VOLUME}]"),
            kr.encryption_key_rotate(rotate_req(u, "old key", "new key"))
                .await,
            Code::NotFound,
        );
    }
    // Not in the table: a volume that exists unencrypted has no key.
    r.code(
        "EncryptionKeyRotate: an unencrypted volume → FAILED_PRECONDITION (it exists, and has no key)",
        kr.encryption_key_rotate(rotate_req(&idle, "old key", "new key"))
            .await,
        Code::FailedPrecondition,
    );
    // Not in the table, but apart from NOT_FOUND: a volume that exists
    // and is not staged here is a precondition the caller can meet.
    r.code(
        "NodeHealer: a volume that exists but is not staged on this node → FAILED_PRECONDITION (not NOT_FOUND: it exists)",
        h.node_healer(heal_req(&idle, &tgt)).await,
        Code::FailedPrecondition,
    );
    r.finish();
}

/// Not authenticated: secrets (and parameters) are taken and ignored.
#[tokio::test(flavor = "multi_thread")]
async fn addons_secrets_and_parameters_are_ignored() {
    let AddonsGround {
        d: _d,
        k: _k,
        mut r,
        mut ctl,
        mut rn,
        mut h,
        live,
        idle,
        tgt,
        stg,
        ..
    } = addons_ground("cfadda", "CSI-Addons secrets").await;
    // -- Not authenticated: secrets are taken and ignored ----------------------
    // Parameters: the csi-addons controller passes the PV's volume
    // attributes (or a CSIAddonsJob's own keys); they mean nothing here.
    let mut q = ctl_req(&idle);
    q.parameters = [
        (
            "storage.kubernetes.io/csiProvisionerIdentity",
            "1764000000000-thinpool.csi.test",
        ),
        ("fsType", "ext4"),
        ("readAheadSectors", "256"),
        ("key1", "value1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    r.ok(
        "ControllerReclaimSpace with the PV's volume attributes as parameters → OK (opaque, ignored)",
        ctl.controller_reclaim_space(q).await,
    );
    let mut q = ctl_req(&idle);
    q.secrets = secrets();
    r.ok(
        &format!("ControllerReclaimSpace with secrets, on an unused volume → OK, never UNAUTHENTICATED [{AUTH}]"),
        ctl.controller_reclaim_space(q).await,
    );
    let mut q = node_req(&live, &tgt);
    q.secrets = secrets();
    r.ok(
        &format!("NodeReclaimSpace with secrets, on a published volume → OK, never UNAUTHENTICATED [{AUTH}]"),
        rn.node_reclaim_space(q).await,
    );
    let mut q = heal_req(&live, &tgt);
    q.secrets = secrets();
    q.staging_target_path = stg.clone();
    let healed = r.ok(
        &format!("NodeHealer with secrets, on a published volume → OK, never UNAUTHENTICATED [{AUTH}]; NodeHealer is served, so never UNIMPLEMENTED [{NOT_IMPLEMENTED}]"),
        h.node_healer(q).await,
    );
    r.check(
        "NodeHealer: a healthy published volume is not abnormal, and the message is REQUIRED",
        healed
            .as_ref()
            .is_some_and(|v| !v.abnormal && !v.message.is_empty()),
        format!("{healed:?}"),
    );
    r.finish();
}

/// Call not implemented: services not served are UNIMPLEMENTED and not advertised.
#[tokio::test(flavor = "multi_thread")]
async fn addons_unserved_calls_are_unimplemented() {
    let AddonsGround {
        k: _k,
        d: _d,
        mut r,
        uri,
        ..
    } = addons_ground("cfaddu", "CSI-Addons unserved").await;
    // -- Call not implemented: services we do not serve are UNIMPLEMENTED
    // and not advertised.
    for path in [
        "/fence.FenceController/FenceClusterNetwork",
        "/replication.Controller/EnableVolumeReplication",
        "/volumegroup.Controller/CreateVolumeGroup",
    ] {
        r.code(
            &format!("{path}: a CSI-Addons service not served → UNIMPLEMENTED [{NOT_IMPLEMENTED}]"),
            raw_call(&uri, path).await,
            Code::Unimplemented,
        );
    }
    let mut id = AddonsIdentityClient::connect(uri.clone()).await.unwrap();
    let caps = r.ok(
        "CSI-Addons GetCapabilities answers",
        id.get_capabilities(GetCapabilitiesRequest {}).await,
    );
    let unserved: Vec<String> = caps
        .map(|c| c.capabilities)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| c.r#type)
        .filter(|t| {
            !matches!(
                t,
                AddonsCap::Service(_)
                    | AddonsCap::ReclaimSpace(_)
                    | AddonsCap::EncryptionKeyRotation(_)
            )
        })
        .map(|t| format!("{t:?}"))
        .collect();
    r.check(
        &format!("CSI-Addons GetCapabilities advertises only what is served (no NetworkFence, VolumeReplication, VolumeGroup) [{NOT_IMPLEMENTED}]"),
        unserved.is_empty(),
        format!("advertised {unserved:?}"),
    );
    r.finish();
}

/// Operation pending for volume → ABORTED.
#[tokio::test(flavor = "multi_thread")]
async fn addons_pending_operation_is_aborted() {
    let AddonsGround {
        k,
        d,
        mut r,
        mut ctl,
        mut rn,
        mut h,
        mut kr,
        n,
        ..
    } = addons_ground("cfaddp", "CSI-Addons pending").await;
    // -- Operation pending: while a stage of `busy` runs (mkfs), each
    // CSI-Addons call on it is ABORTED.
    let busy = create(&d, "cfadd-busy", 256 * MIB, mount_cap("xfs")).await;
    let busy_staging = k.staging("busy");
    let stage = {
        let (mut n, id, st) = (n.clone(), busy.clone(), busy_staging.clone());
        tokio::spawn(async move {
            n.node_stage_volume(stage_req(&id, &st, mount_cap("xfs")))
                .await
        })
    };
    // Let the stage take the volume's guard first.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let bst = s(&busy_staging);
    let mut seen: Vec<(&str, Code)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut turn = 0;
    while !stage.is_finished() && Instant::now() < deadline {
        let (what, got) = match turn % 4 {
            0 => (
                "ControllerReclaimSpace",
                ctl.controller_reclaim_space(ctl_req(&busy)).await.err(),
            ),
            1 => (
                "NodeReclaimSpace",
                rn.node_reclaim_space(node_req(&busy, &bst)).await.err(),
            ),
            2 => (
                "NodeHealer",
                h.node_healer(heal_req(&busy, &bst)).await.err(),
            ),
            _ => (
                "EncryptionKeyRotate",
                kr.encryption_key_rotate(rotate_req(&busy, "old key", "new key"))
                    .await
                    .err(),
            ),
        };
        turn += 1;
        if !stage.is_finished() {
            seen.push((what, got.map(|s| s.code()).unwrap_or(Code::Ok)));
        }
    }
    stage
        .await
        .unwrap()
        .expect("the NodeStageVolume the calls waited on succeeds");
    // The last answer may have raced the end of the stage.
    let during = &seen[..seen.len().saturating_sub(1)];
    for rpc in [
        "ControllerReclaimSpace",
        "NodeReclaimSpace",
        "NodeHealer",
        "EncryptionKeyRotate",
    ] {
        let codes: Vec<Code> = during
            .iter()
            .filter(|(w, _)| *w == rpc)
            .map(|(_, c)| *c)
            .collect();
        r.check(
            &format!(
                "{rpc}: while another operation on the volume is pending → ABORTED [{PENDING}]"
            ),
            !codes.is_empty() && codes.iter().all(|c| *c == Code::Aborted),
            format!("answers while NodeStageVolume ran: {seen:?}"),
        );
    }
    r.finish();
}

/// EncryptionKeyRotate's "Not authenticated": a current passphrase that
/// opens no key slot of the volume is UNAUTHENTICATED; the right one
/// rotates, after which the replaced one is refused in turn.
#[tokio::test(flavor = "multi_thread")]
async fn addons_key_rotation_authenticates_the_current_passphrase() {
    let k = Kubelet::new("cfaddk");
    let extra = format!(
        "{}[encryption]\npbkdf = \"pbkdf2\"\npbkdf_iterations = 1000\n",
        k.extra()
    );
    let d = TestDriver::start("cfaddk", 96 * MIB, &extra).await;
    let mut r = Rules::new("CSI-Addons EncryptionKeyRotate");
    let mut req = crate::fixtures::create_req("cfadd-enc", 24 * MIB, block_cap());
    req.parameters.insert("encrypted".into(), "true".into());
    let id = crate::fixtures::create_volume(&mut d.controller().await, req)
        .await
        .volume_id;
    let staging = k.staging("enc");
    let mut stage = stage_req(&id, &staging, block_cap());
    stage.secrets = [("passphrase".to_string(), "first key".to_string())].into();
    d.node()
        .await
        .node_stage_volume(stage)
        .await
        .expect("stage");
    let mut kr = EncryptionKeyRotationControllerClient::connect(d.addons_uri())
        .await
        .unwrap();
    r.code(
        &format!("EncryptionKeyRotate: a current passphrase that opens no key slot → UNAUTHENTICATED [{KEY_AUTH}]"),
        kr.encryption_key_rotate(rotate_req(&id, "not the key", "second key"))
            .await,
        Code::Unauthenticated,
    );
    r.ok(
        "EncryptionKeyRotate: the current passphrase → OK",
        kr.encryption_key_rotate(rotate_req(&id, "first key", "second key"))
            .await,
    );
    r.code(
        &format!("EncryptionKeyRotate: the replaced passphrase no longer authenticates → UNAUTHENTICATED [{KEY_AUTH}]"),
        kr.encryption_key_rotate(rotate_req(&id, "first key", "third key"))
            .await,
        Code::Unauthenticated,
    );
    r.finish();
}
