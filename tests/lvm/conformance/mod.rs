//! Our own conformance suite, organised by RPC: each submodule holds the
//! rules of one service, checked against the real binary. A test runs a
//! table of cases on one driver and reports every broken rule by name,
//! with the words of `csi-spec.md` it breaks, instead of stopping at the
//! first.
//!
//! It stands where kubernetes-csi's csi-sanity stood in CI: `sanity.rs`
//! checks what csi-sanity checks, with its inputs, where no other module
//! does; `addons.rs` checks every row of the CSI-Addons error tables.
//!
//! ## The csi-sanity table
//!
//! Every spec of kubernetes-csi's csi-sanity (csi-test `pkg/sanity` at
//! v5.6.0: 98 specs and one pending, by their full names as csi-sanity
//! prints them), what csi-sanity does with this driver at its defaults
//! (endpoint, paths and sizes only), and the rule of ours that checks the
//! same thing: `file::function` under `tests/lvm/` and words of the rule
//! as they stand in that function. `tests/conformance_table.rs` fails
//! when a rule named here does not exist. csi-sanity itself is an
//! optional extra (`scripts/csi-sanity.sh`); these rules run in every CI
//! run.
//!
//! | # | csi-sanity spec | csi-sanity with us | our rule |
//! |---|---|---|---|
//! | S1 | Controller Service [Controller Server] ControllerGetCapabilities should return appropriate capabilities | runs | `conformance::sanity::sanity_controller_get_capabilities` `every advertised RPC is a type of the spec` |
//! | S2 | Controller Service [Controller Server] GetCapacity should return capacity (no optional values added) | runs | `conformance::controller::get_capacity_rules` `GetCapacityRequest::default()` |
//! | S3 | Controller Service [Controller Server] ListVolumes should return appropriate values (no optional values added) | runs | `conformance::sanity::sanity_list_volumes` `every entry carries a volume with a volume_id` |
//! | S4 | Controller Service [Controller Server] ListVolumes should fail when an invalid starting_token is passed | runs | `conformance::sanity::sanity_list_volumes` `ListVolumes: starting_token` |
//! | S5 | Controller Service [Controller Server] ListVolumes check the presence of new volumes and absence of deleted ones in the volume list | runs | `conformance::sanity::sanity_list_volumes` `a deleted volume is not listed (count back)` |
//! | S6 | Controller Service [Controller Server] CreateVolume should fail when no name is provided | runs | `conformance::sanity::sanity_create_volume` `CreateVolume: no name and no volume_capabilities` |
//! | S7 | Controller Service [Controller Server] CreateVolume should fail when no volume capabilities are provided | runs | `conformance::controller::create_volume_rules` `rule("CreateVolume", "volume_capabilities")` |
//! | S8 | Controller Service [Controller Server] CreateVolume should return appropriate values SingleNodeWriter NoCapacity | runs | `conformance::sanity::sanity_create_volume` `volume_id set, capacity_bytes` |
//! | S9 | Controller Service [Controller Server] CreateVolume should return appropriate values SingleNodeWriter WithCapacity 1Gi | runs | `conformance::sanity::sanity_create_volume` `SINGLE_NODE_WRITER with a capacity` |
//! | S10 | Controller Service [Controller Server] CreateVolume should not fail when requesting to create a volume with already existing name and same capacity | runs | `conformance::controller::create_volume_rules` `the repeated call returns the same volume` |
//! | S11 | Controller Service [Controller Server] CreateVolume should fail when requesting to create a volume with already existing name and different capacity | runs | `conformance::sanity::sanity_create_volume` `twice the required and limit bytes` |
//! | S12 | Controller Service [Controller Server] CreateVolume should not fail when creating volume with maximum-length name | runs | `conformance::controller::create_volume_rules` `a 128-byte name is accepted` |
//! | S13 | Controller Service [Controller Server] CreateVolume should create volume from an existing source snapshot | runs | `conformance::sanity::sanity_create_volume` `the reply's content_source is set` |
//! | S14 | Controller Service [Controller Server] CreateVolume should fail when the volume source snapshot is not found | runs | `conformance::sanity::sanity_create_volume` `non-existing-snapshot-id` |
//! | S15 | Controller Service [Controller Server] CreateVolume should create volume from an existing source volume | runs | `conformance::sanity::sanity_create_volume` `CreateVolume from an existing volume (a clone)` |
//! | S16 | Controller Service [Controller Server] CreateVolume should fail when the volume source volume is not found | runs | `conformance::sanity::sanity_create_volume` `CreateVolume from a volume that does not exist` |
//! | S17 | Controller Service [Controller Server] CreateVolume should create volume with a volume attribute class | runs; at csi-sanity's defaults the map is empty | `conformance::sanity::sanity_create_volume` `an empty mutable_parameters map (a VolumeAttributesClass with no parameters)` |
//! | S18 | Controller Service [Controller Server] CreateVolume should not create volume with an invalid volume attribute class | runs | `conformance::sanity::sanity_create_volume` `CreateVolume: mutable_parameters {XXX_FakeKey` |
//! | S19 | Controller Service [Controller Server] DeleteVolume should fail when no volume id is provided | runs | `conformance::sanity::sanity_delete_volume` `DeleteVolume: no volume_id` |
//! | S20 | Controller Service [Controller Server] DeleteVolume should succeed when an invalid volume id is used | runs | `conformance::sanity::sanity_delete_volume` `fake-vol-id` |
//! | S21 | Controller Service [Controller Server] DeleteVolume should return appropriate values (no optional values added) | runs | `conformance::sanity::sanity_delete_volume` `DeleteVolume of a volume` |
//! | S22 | Controller Service [Controller Server] ValidateVolumeCapabilities should fail when no volume id is provided | runs | `conformance::sanity::sanity_validate_volume_capabilities` `ValidateVolumeCapabilities: an empty request` |
//! | S23 | Controller Service [Controller Server] ValidateVolumeCapabilities should fail when no volume capabilities are provided | runs | `conformance::sanity::sanity_validate_volume_capabilities` `a volume and no volume_capabilities` |
//! | S24 | Controller Service [Controller Server] ValidateVolumeCapabilities should return appropriate values (no optional values added) | runs | `conformance::sanity::sanity_validate_volume_capabilities` `a set confirmed lists its capabilities` |
//! | S25 | Controller Service [Controller Server] ValidateVolumeCapabilities should fail when the requested volume does not exist | runs | `conformance::sanity::sanity_validate_volume_capabilities` `ValidateVolumeCapabilities: a volume that does not exist` |
//! | S26 | Controller Service [Controller Server] ControllerPublishVolume should fail when no volume id is provided | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S27 | Controller Service [Controller Server] ControllerPublishVolume should fail when no node id is provided | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S28 | Controller Service [Controller Server] ControllerPublishVolume should fail when no volume capability is provided | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S29 | Controller Service [Controller Server] ControllerPublishVolume should fail when publishing more volumes than the node max attach limit | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S30 | Controller Service [Controller Server] ControllerPublishVolume should fail when the volume does not exist | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S31 | Controller Service [Controller Server] ControllerPublishVolume should fail when the node does not exist | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S32 | Controller Service [Controller Server] ControllerPublishVolume should fail when the volume is already published but is incompatible | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerPublishVolume: not served → UNIMPLEMENTED` |
//! | S33 | Controller Service [Controller Server] volume lifecycle should work | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `PUBLISH_UNPUBLISH_VOLUME is not advertised` |
//! | S34 | Controller Service [Controller Server] volume lifecycle should be idempotent | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `PUBLISH_UNPUBLISH_VOLUME is not advertised` |
//! | S35 | Controller Service [Controller Server] ControllerUnpublishVolume should fail when no volume id is provided | skipped: PUBLISH_UNPUBLISH_VOLUME is not advertised | `conformance::controller::controller_publish_rules` `ControllerUnpublishVolume: not served → UNIMPLEMENTED` |
//! | S36 | ListSnapshots [Controller Server] should return appropriate values (no optional values added) | runs | `conformance::sanity::sanity_list_snapshots` `every entry has snapshot_id, source_volume_id and creation_time` |
//! | S37 | ListSnapshots [Controller Server] should return snapshots that match the specified snapshot id | runs | `conformance::sanity::sanity_list_snapshots` `ListSnapshots by snapshot_id` |
//! | S38 | ListSnapshots [Controller Server] should return empty when the specified snapshot id does not exist | runs | `conformance::sanity::sanity_list_snapshots` `none-exist-id` |
//! | S39 | ListSnapshots [Controller Server] should return snapshots that match the specified source volume id | runs | `conformance::sanity::sanity_list_snapshots` `ListSnapshots by source_volume_id` |
//! | S40 | ListSnapshots [Controller Server] should return empty when the specified source volume id does not exist | runs | `conformance::sanity::sanity_list_snapshots` `a source_volume_id that does not exist` |
//! | S41 | ListSnapshots [Controller Server] check the presence of new snapshots in the snapshot list | runs | `conformance::sanity::sanity_list_snapshots` `a deleted snapshot is not listed (count back)` |
//! | S42 | ListSnapshots [Controller Server] should return next token when a limited number of entries are requested | runs | `conformance::sanity::sanity_list_snapshots` `exactly 2 entries and a next_token` |
//! | S43 | GetSnapshot [Controller Server] should return an error | skipped: GET_SNAPSHOT is not advertised | `conformance::sanity::sanity_controller_get_capabilities` `GetSnapshot: not served` |
//! | S44 | GetSnapshot [Controller Server] should return snapshot that match the specified snapshot id | skipped: GET_SNAPSHOT is not advertised | `conformance::sanity::sanity_controller_get_capabilities` `GET_SNAPSHOT is not advertised` |
//! | S45 | GetSnapshot [Controller Server] should return an error when the specified snapshot id does not exist | skipped: GET_SNAPSHOT is not advertised | `conformance::sanity::sanity_controller_get_capabilities` `/csi.v1.Controller/GetSnapshot` |
//! | S46 | DeleteSnapshot [Controller Server] should fail when no snapshot id is provided | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `DeleteSnapshot: no snapshot_id` |
//! | S47 | DeleteSnapshot [Controller Server] should succeed when an invalid snapshot id is used | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `reallyfakesnapshotid` |
//! | S48 | DeleteSnapshot [Controller Server] should return appropriate values (no optional values added) | runs | `conformance::sanity::sanity_create_volume` `ready_to_use, with snapshot_id, source_volume_id and creation_time` |
//! | S49 | CreateSnapshot [Controller Server] should fail when no name is provided | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `CreateSnapshot: no name, source` |
//! | S50 | CreateSnapshot [Controller Server] should fail when no source volume id is provided | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `CreateSnapshot: no source_volume_id` |
//! | S51 | CreateSnapshot [Controller Server] should succeed when requesting to create a snapshot with already existing name and same source volume ID | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `the same name and source twice` |
//! | S52 | CreateSnapshot [Controller Server] should fail when requesting to create a snapshot with already existing name and different source volume ID | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `the same name, another source volume` |
//! | S53 | CreateSnapshot [Controller Server] should succeed when creating snapshot with maximum-length name | runs | `conformance::sanity::sanity_delete_and_create_snapshot` `a 128-character name` |
//! | S54 | ExpandVolume [Controller Server] should fail if no volume id is given | runs | `conformance::sanity::sanity_expand_volume` `no volume_id (capacity given)` |
//! | S55 | ExpandVolume [Controller Server] should fail if no capacity range is given | runs | `conformance::sanity::sanity_expand_volume` `no volume_id and no capacity_range` |
//! | S56 | ExpandVolume [Controller Server] should work | runs | `conformance::sanity::sanity_expand_volume` `capacity_bytes is exactly the size asked for` |
//! | S57 | ModifyVolume [Controller Server] should fail if no volume id is given | runs; at csi-sanity's defaults the map is empty | `conformance::sanity::sanity_modify_volume` `no volume_id, empty mutable_parameters` |
//! | S58 | ModifyVolume [Controller Server] should fail if volume does not exist | runs; at csi-sanity's defaults the map is empty | `conformance::sanity::sanity_modify_volume` `non-existing-volume-id` |
//! | S59 | ModifyVolume [Controller Server] should fail if specified mutable parameters are not supported by the volume | runs | `conformance::sanity::sanity_modify_volume` `ControllerModifyVolume: {XXX_FakeKey` |
//! | S60 | ModifyVolume [Controller Server] should modify a volume created without a volume attribute class | runs; at csi-sanity's defaults the map is empty | `conformance::sanity::sanity_modify_volume` `a volume created without mutable parameters` |
//! | S61 | ModifyVolume [Controller Server] should modify a volume created with a volume attribute class | runs; at csi-sanity's defaults the map is empty | `conformance::sanity::sanity_modify_volume` `a volume created with (empty) mutable parameters` |
//! | S62 | ModifyVolume [Controller Server] should fail to modify a volume created with a volume attribute class if new mutable parameters are not supported by volume | runs | `conformance::sanity::sanity_modify_volume` `a volume created with mutable parameters, then` |
//! | S63 | Controller Service [Controller Server] ListVolumes pagination should detect volumes added between pages and accept tokens when the last volume from a page is deleted | pending in csi-sanity (XIt): never runs | `controller::pagination_across_creates_and_deletes` `Nothing from page 1 repeats` |
//! | S64 | Node Service NodeGetCapabilities should return appropriate capabilities | runs | `conformance::sanity::sanity_node_capabilities_and_info` `every advertised RPC is a type of the spec this driver serves` |
//! | S65 | Node Service NodeGetInfo should return appropriate values | runs | `conformance::sanity::sanity_node_capabilities_and_info` `node_id set, max_volumes_per_node` |
//! | S66 | Node Service NodePublishVolume should fail when no volume id is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodePublishVolume: an empty request` |
//! | S67 | Node Service NodePublishVolume should fail when no target path is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodePublishVolume: a volume_id only` |
//! | S68 | Node Service NodePublishVolume should fail when no volume capability is provided | runs | `conformance::sanity::sanity_node_required_fields` `a volume_id and target_path, no volume_capability` |
//! | S69 | Node Service NodePublishVolume with single node multi writer capability should fail when volume with single node single writer access mode is already mounted at a different target path | runs | `conformance::sanity::sanity_single_node_single_writer` `NodePublishVolume at another target` |
//! | S70 | Node Service NodeUnpublishVolume should fail when no volume id is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeUnpublishVolume: an empty request` |
//! | S71 | Node Service NodeUnpublishVolume should fail when no target path is provided | runs | `conformance::sanity::sanity_node_required_fields` `a volume_id and no target_path` |
//! | S72 | Node Service NodeUnpublishVolume should remove target path | runs | `conformance::sanity::sanity_node_lifecycle` `removes the target path` |
//! | S73 | Node Service NodeStageVolume should fail when no volume id is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeStageVolume: an empty request` |
//! | S74 | Node Service NodeStageVolume should fail when no staging target path is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeStageVolume: a volume_id and no staging_target_path` |
//! | S75 | Node Service NodeStageVolume should fail when no volume capability is provided | runs | `conformance::sanity::sanity_node_required_fields` `a volume that exists, no volume_capability` |
//! | S76 | Node Service NodeUnstageVolume should fail when no volume id is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeUnstageVolume: an empty request` |
//! | S77 | Node Service NodeUnstageVolume should fail when no staging target path is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeUnstageVolume: a volume_id and no staging_target_path` |
//! | S78 | Node Service NodeGetVolumeStats should fail when no volume id is provided | runs | `conformance::sanity::sanity_node_required_fields` `and no volume_id` |
//! | S79 | Node Service NodeGetVolumeStats should fail when no volume path is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeGetVolumeStats: a volume_id and no volume_path` |
//! | S80 | Node Service NodeGetVolumeStats should fail when volume is not found | runs | `conformance::sanity::sanity_node_required_fields` `NodeGetVolumeStats: a volume that does not exist at` |
//! | S81 | Node Service NodeGetVolumeStats should fail when volume does not exist on the specified path | runs | `conformance::sanity::sanity_node_lifecycle` `a published volume asked at` |
//! | S82 | Node Service NodeExpandVolume should fail when no volume id is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeExpandVolume: an empty request` |
//! | S83 | Node Service NodeExpandVolume should fail when no volume path is provided | runs | `conformance::sanity::sanity_node_required_fields` `NodeExpandVolume: a volume that exists and no volume_path` |
//! | S84 | Node Service NodeExpandVolume should fail when volume is not found | runs | `conformance::sanity::sanity_node_required_fields` `NodeExpandVolume: a volume that does not exist at` |
//! | S85 | Node Service NodeExpandVolume should work if node-expand is called after node-publish | runs | `conformance::sanity::sanity_node_lifecycle` `NodeExpandVolume at the target` |
//! | S86 | Node Service NodeGetVolumeHealth should fail when no volume id is provided | skipped: GET_VOLUME_HEALTH is not advertised | `conformance::sanity::sanity_node_capabilities_and_info` `/csi.v1.Node/NodeGetVolumeHealth` |
//! | S87 | Node Service NodeGetVolumeHealth should return health for a valid volume | skipped: GET_VOLUME_HEALTH is not advertised | `conformance::sanity::sanity_node_capabilities_and_info` `GET_VOLUME_HEALTH and GET_STORAGE_HEALTH are not advertised` |
//! | S88 | Node Service NodeGetStorageHealth should return appropriate response | skipped: GET_STORAGE_HEALTH is not advertised | `conformance::sanity::sanity_node_capabilities_and_info` `/csi.v1.Node/NodeGetStorageHealth` |
//! | S89 | Node Service should work | runs | `conformance::sanity::sanity_node_lifecycle` `NodeGetVolumeStats reports usage` |
//! | S90 | Node Service should be idempotent | runs | `conformance::sanity::sanity_node_lifecycle` `should be idempotent ({kind}): NodePublishVolume` |
//! | S91 | Identity Service GetPluginCapabilities should return appropriate capabilities | runs (its allow-list predates SNAPSHOT_METADATA_SERVICE, which we advertise where thin tools run) | `conformance::sanity::sanity_identity_specs` `every service is a type of the spec` |
//! | S92 | Identity Service Probe should return appropriate information | runs | `conformance::sanity::sanity_identity_specs` `ready is true or unset` |
//! | S93 | Identity Service GetPluginInfo should return appropriate information | runs | `conformance::sanity::sanity_identity_specs` `starting and ending with a letter` |
//! | S94 | GroupController Service [GroupController Server] GroupControllerGetCapabilities should return appropriate capabilities | runs | `conformance::identity::advertised_services_and_rpcs_are_served` `the only type advertised is CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT` |
//! | S95 | GroupController Service [GroupController VolumeGroupSnapshots] CreateVolumeGroupSnapshot should fail when no name is provided | runs | `conformance::group::group_controller_rules` `required("CreateVolumeGroupSnapshot", "name")` |
//! | S96 | GroupController Service [GroupController VolumeGroupSnapshots] GetVolumeGroupSnapshot should fail when no volume id is provided | runs | `conformance::group::group_controller_rules` `required("GetVolumeGroupSnapshot", "group_snapshot_id")` |
//! | S97 | GroupController Service [GroupController VolumeGroupSnapshots] GetVolumeGroupSnapshot should fail when an invalid volume id is used | runs | `conformance::group::group_controller_rules` `GetVolumeGroupSnapshot: group {u} does not exist` |
//! | S98 | GroupController Service [GroupController VolumeGroupSnapshots] DeleteVolumeGroupSnapshot should fail when no volume id is provided | runs | `conformance::group::group_controller_rules` `required("DeleteVolumeGroupSnapshot", "group_snapshot_id")` |
//! | S99 | GroupController Service [GroupController VolumeGroupSnapshots] DeleteVolumeGroupSnapshot should succeed when an invalid volume id is used | runs | `conformance::group::group_controller_rules` `DeleteVolumeGroupSnapshot: group {u} does not exist` |
//!
//! ## The CSI-Addons error tables
//!
//! Every row of the error tables of `csi-addons-reclaimspace.md`,
//! `csi-addons-healer.md` and csi-addons/spec's
//! `encryptionkeyrotation/README.md`, and the rule that checks it.
//! ReclaimSpace and NodeHealer take no secrets, so their "Not
//! authenticated" is checked as: secrets are accepted and ignored, never
//! UNAUTHENTICATED; EncryptionKeyRotate's is a current passphrase that
//! opens no key slot. "Error is Unknown" is checked as: no rule of this
//! suite may be answered UNKNOWN.
//!
//! | # | spec | RPC | condition | code | our rule |
//! |---|---|---|---|---|---|
//! | A1 | ReclaimSpace | ControllerReclaimSpace | Missing required field | 3 INVALID_ARGUMENT | `conformance::addons::addons_missing_required_field` `ControllerReclaimSpace: volume_id is REQUIRED` |
//! | A2 | ReclaimSpace | ControllerReclaimSpace | Volume does not exist | 5 NOT_FOUND | `conformance::addons::addons_volume_does_not_exist` `ControllerReclaimSpace: {what}` |
//! | A3 | ReclaimSpace | ControllerReclaimSpace | Operation pending for volume | 10 ABORTED | `conformance::addons::addons_pending_operation_is_aborted` `while another operation on the volume is pending` |
//! | A4 | ReclaimSpace | ControllerReclaimSpace | Not authenticated | 16 UNAUTHENTICATED | `conformance::addons::addons_secrets_and_parameters_are_ignored` `ControllerReclaimSpace with secrets` |
//! | A5 | ReclaimSpace | ControllerReclaimSpace | Error is Unknown | 2 UNKNOWN | `conformance::mod::code` `never UNKNOWN` |
//! | A6 | ReclaimSpace | NodeReclaimSpace | Missing required field | 3 INVALID_ARGUMENT | `conformance::addons::addons_missing_required_field` `NodeReclaimSpace: volume_path is REQUIRED` |
//! | A7 | ReclaimSpace | NodeReclaimSpace | Volume does not exist | 5 NOT_FOUND | `conformance::addons::addons_volume_does_not_exist` `NodeReclaimSpace: {what}` |
//! | A8 | ReclaimSpace | NodeReclaimSpace | Operation pending for volume | 10 ABORTED | `conformance::addons::addons_pending_operation_is_aborted` `while another operation on the volume is pending` |
//! | A9 | ReclaimSpace | NodeReclaimSpace | Not authenticated | 16 UNAUTHENTICATED | `conformance::addons::addons_secrets_and_parameters_are_ignored` `NodeReclaimSpace with secrets` |
//! | A10 | ReclaimSpace | NodeReclaimSpace | Error is Unknown | 2 UNKNOWN | `conformance::mod::code` `never UNKNOWN` |
//! | A11 | Healer | NodeHealer | Missing required field | 3 INVALID_ARGUMENT | `conformance::addons::addons_missing_required_field` `NodeHealer: volume_path is REQUIRED` |
//! | A12 | Healer | NodeHealer | Volume does not exist | 5 NOT_FOUND | `conformance::addons::addons_volume_does_not_exist` `NodeHealer: {what}` |
//! | A13 | Healer | NodeHealer | Call not implemented | 12 UNIMPLEMENTED | `conformance::addons::addons_unserved_calls_are_unimplemented` `a CSI-Addons service not served` |
//! | A14 | Healer | NodeHealer | Operation pending for volume | 10 ABORTED | `conformance::addons::addons_pending_operation_is_aborted` `while another operation on the volume is pending` |
//! | A15 | Healer | NodeHealer | Not authenticated | 16 UNAUTHENTICATED | `conformance::addons::addons_secrets_and_parameters_are_ignored` `NodeHealer with secrets` |
//! | A16 | Healer | NodeHealer | Error is Unknown | 2 UNKNOWN | `conformance::mod::code` `never UNKNOWN` |
//! | A17 | EncryptionKeyRotation | EncryptionKeyRotate | Missing required field | 3 INVALID_ARGUMENT | `conformance::addons::addons_missing_required_field` `EncryptionKeyRotate: volume_id is REQUIRED` |
//! | A18 | EncryptionKeyRotation | EncryptionKeyRotate | Volume does not exist | 5 NOT_FOUND | `conformance::addons::addons_volume_does_not_exist` `EncryptionKeyRotate: {what}` |
//! | A19 | EncryptionKeyRotation | EncryptionKeyRotate | Operation pending for volume | 10 ABORTED | `conformance::addons::addons_pending_operation_is_aborted` `"EncryptionKeyRotate",` |
//! | A20 | EncryptionKeyRotation | EncryptionKeyRotate | Not authenticated | 16 UNAUTHENTICATED | `conformance::addons::addons_key_rotation_authenticates_the_current_passphrase` `opens no key slot → UNAUTHENTICATED` |
//! | A21 | EncryptionKeyRotation | EncryptionKeyRotate | Error is Unknown | 2 UNKNOWN | `conformance::mod::code` `never UNKNOWN` |

mod addons;
mod controller;
mod group;
mod identity;
mod metadata;
mod node;
mod sanity;

use std::fmt::Display;

use thinpool_csi::error::REMEDY;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

/// A unary call of `path` with an empty message on the socket at `uri`:
/// for RPCs no client of ours is generated for (services or methods this
/// driver does not serve).
pub async fn raw_call(uri: &str, path: &'static str) -> Result<Response<()>, Status> {
    // As the generated clients' `connect` does: `Endpoint::new` takes the
    // unix: scheme.
    let ch: Channel = tonic::transport::Endpoint::new(uri.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    g.unary(
        tonic::Request::new(()),
        http::uri::PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::<(), ()>::default(),
    )
    .await
}

/// A status message in the driver's shape: what was wrong, [`REMEDY`],
/// then a clause of at least three words saying what to do.
fn remedied(message: &str) -> bool {
    match message.split_once(REMEDY) {
        Some((what, todo)) => !what.trim().is_empty() && todo.split_whitespace().count() >= 3,
        None => false,
    }
}

/// The spec's Error Scheme, quoted by every required-field rule.
pub const MISSING: &str =
    "Error Scheme: \"Missing required field: 3 INVALID_ARGUMENT\" (the whole request is checked before any look-up)";
/// The Error Scheme's row for a call the plugin does not implement (the
/// CSI-Addons error tables have it in the same words).
pub const NOT_IMPLEMENTED: &str = "\"Call not implemented: 12 UNIMPLEMENTED\"";
/// The spec's Size Limits table.
pub const SIZE: &str = "Size Limits: \"128 bytes string\"";
/// The path fields' override of the size limit.
pub const PATH_MIN: &str = "\"SP MUST accept a max path length of at least 128 bytes\"";

/// The rule that `field` of `rpc` is REQUIRED.
pub fn required(rpc: &str, field: &str) -> String {
    format!("{rpc}: {field} is REQUIRED; without it → INVALID_ARGUMENT [{MISSING}]")
}

/// Creates a volume as `q` asks, the rule being that it succeeds; a
/// test cannot go on without it.
pub async fn created(
    r: &mut Rules,
    c: &mut thinpool_csi::proto::csi::v1::controller_client::ControllerClient<Channel>,
    q: thinpool_csi::proto::csi::v1::CreateVolumeRequest,
) -> String {
    let name = q.name.clone();
    r.ok(
        &format!("CreateVolume {name:?} succeeds"),
        c.create_volume(q).await,
    )
    .and_then(|v| v.volume)
    .map(|v| v.volume_id)
    .unwrap_or_else(|| panic!("cannot go on without volume {name:?}"))
}

/// The rules checked by one test and the ones broken.
pub struct Rules {
    what: &'static str,
    checked: usize,
    broken: Vec<String>,
}

impl Rules {
    pub fn new(what: &'static str) -> Rules {
        Rules {
            what,
            checked: 0,
            broken: Vec::new(),
        }
    }

    /// `rule` holds when the reply carries `want`; an error must also
    /// carry a message and no details (Error Scheme). Returns the reply
    /// when it is OK.
    pub fn code<T>(
        &mut self,
        rule: &str,
        got: Result<Response<T>, Status>,
        want: Code,
    ) -> Option<T> {
        self.checked += 1;
        match got {
            Ok(r) => {
                if want != Code::Ok {
                    self.broken
                        .push(format!("{rule}\n      got OK, want {want:?}"));
                }
                Some(r.into_inner())
            }
            Err(s) => {
                if s.code() != want {
                    // The CSI-Addons tables' "Error is Unknown: 2 UNKNOWN"
                    // row: the driver's failures are typed, so it never
                    // answers UNKNOWN.
                    let unknown = if s.code() == Code::Unknown {
                        " [never UNKNOWN: every failure of the driver has a typed code]"
                    } else {
                        ""
                    };
                    self.broken.push(format!(
                        "{rule}\n      got {:?} ({}), want {want:?}{unknown}",
                        s.code(),
                        s.message()
                    ));
                } else if s.message().is_empty() || !s.details().is_empty() {
                    self.broken.push(format!(
                        "{rule}\n      {want:?} must carry a message and no details [Error Scheme: \"The status message MUST contain a human readable description\", \"The status details MUST be empty\"]"
                    ));
                } else if !remedied(s.message()) {
                    self.broken.push(format!(
                        "{rule}\n      {want:?} message {:?} must say what was wrong, then {REMEDY:?} and what to do [ours: issue 11, typed errors]",
                        s.message()
                    ));
                }
                None
            }
        }
    }

    /// `rule` holds when the call succeeds; returns the reply.
    pub fn ok<T>(&mut self, rule: &str, got: Result<Response<T>, Status>) -> Option<T> {
        self.code(rule, got, Code::Ok)
    }

    /// `rule` holds when `holds` is true; `detail` says what was seen.
    pub fn check(&mut self, rule: &str, holds: bool, detail: impl Display) {
        self.checked += 1;
        if !holds {
            self.broken.push(format!("{rule}\n      {detail}"));
        }
    }

    /// Panics listing every broken rule; prints the count either way.
    pub fn finish(self) {
        eprintln!(
            "conformance {}: {} rules checked, {} broken",
            self.what,
            self.checked,
            self.broken.len()
        );
        assert!(
            self.broken.is_empty(),
            "conformance {}: {} of {} rules broken:\n  - {}",
            self.what,
            self.broken.len(),
            self.checked,
            self.broken.join("\n  - ")
        );
    }
}
