//! Node keys in ids, natively over the CSI socket (docs/cluster.md): a
//! node that serves a cluster's controller hands out ids with its key in
//! front, reads its own key and ids without one, and takes another node's
//! key as an object it does not hold. The LVM report comes from a fake
//! `lvm` that prints a fixed one, so no device-mapper is needed.

mod common;

use std::sync::Arc;

use thinpool_csi::naming;
use thinpool_csi::proto::csi::v1::controller_client::ControllerClient;
use thinpool_csi::proto::csi::v1::*;
use thinpool_csi::volume::classes::Classes;
use tonic::transport::Channel;

struct Node {
    _dir: tempfile::TempDir,
    client: ControllerClient<Channel>,
    /// The LV names of its volumes, in name order.
    volumes: Vec<String>,
    /// Its CSI-Addons socket, as a URI.
    addons: String,
}

/// A node with three volumes, serving a cluster's controller or not.
async fn node(node_id: &str, cluster: bool) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..3).map(|i| format!("pvc-{i}")).collect();
    let (mut cfg, volumes) = common::fake_lvm(dir.path(), &names);
    if cluster {
        cfg.cluster.listen = "127.0.0.1:9443".into();
    }
    let classes = Arc::new(Classes::new(&cfg, node_id));
    let socket = dir.path().join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(thinpool_csi::grpc::serve(
        classes.clone(),
        listener,
        std::future::pending(),
    ));
    let addons = dir.path().join("addons.sock");
    let addons_listener = tokio::net::UnixListener::bind(&addons).unwrap();
    tokio::spawn(thinpool_csi::grpc::serve_addons(
        classes,
        addons_listener,
        std::future::pending(),
    ));
    let client = ControllerClient::connect(format!("unix://{}", socket.display()))
        .await
        .unwrap();
    Node {
        _dir: dir,
        client,
        volumes,
        addons: format!("unix://{}", addons.display()),
    }
}

/// The services a node's CSI-Addons identity names.
async fn addons_services(uri: &str) -> Vec<i32> {
    use thinpool_csi::proto::identity::capability::Type;
    thinpool_csi::proto::identity::identity_client::IdentityClient::connect(uri.to_string())
        .await
        .unwrap()
        .get_capabilities(thinpool_csi::proto::identity::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect()
}

/// On a cluster, the controller takes the csi-addons lease: a node's
/// CSI-Addons identity names NODE_SERVICE alone; alone, it is both.
#[tokio::test]
async fn a_node_on_a_cluster_is_no_csi_addons_controller() {
    use thinpool_csi::proto::identity::capability::service::Type;
    let (c, n) = (Type::ControllerService as i32, Type::NodeService as i32);
    let on = node("worker-1", true).await;
    assert_eq!(addons_services(&on.addons).await, [n]);
    let alone = node("worker-1", false).await;
    assert_eq!(addons_services(&alone.addons).await, [c, n]);
}

async fn get(c: &mut ControllerClient<Channel>, id: &str) -> Result<String, tonic::Code> {
    c.controller_get_volume(ControllerGetVolumeRequest {
        volume_id: id.into(),
    })
    .await
    .map(|r| r.into_inner().volume.unwrap().volume_id)
    .map_err(|s| s.code())
}

#[tokio::test]
async fn a_node_on_a_cluster_hands_out_its_key_and_reads_ids_with_and_without_it() {
    let mut n = node("worker-1", true).await;
    let key = naming::node_key("worker-1");
    let keyed: Vec<String> = n
        .volumes
        .iter()
        .map(|v| naming::with_node(&key, v))
        .collect();
    // Every listed id and every token carries the key, and paging by
    // those tokens lists each volume once.
    let (ids, tokens) = common::list_ids(&mut n.client, 1).await;
    assert_eq!(ids, keyed);
    assert_eq!(tokens, keyed[..2].to_vec());
    // Its own key, or none (an id minted before the cluster): the volume,
    // shown with the key.
    for id in [&keyed[1], &n.volumes[1]] {
        assert_eq!(get(&mut n.client, id).await, Ok(keyed[1].clone()), "{id}");
    }
    // Another node's key: not here.
    let theirs = naming::with_node(&naming::node_key("worker-2"), &n.volumes[1]);
    assert_eq!(
        get(&mut n.client, &theirs).await,
        Err(tonic::Code::NotFound)
    );
    // A removal sent here for another node's object is refused, never
    // answered "gone": the CO would drop a volume that still exists.
    let e = n
        .client
        .delete_volume(DeleteVolumeRequest {
            volume_id: theirs.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    let snap = naming::with_node(
        &naming::node_key("worker-2"),
        &naming::snapshot_lv_name_for("snap-1"),
    );
    let e = n
        .client
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    // This node's key on a volume it does not hold: gone, OK.
    let gone = naming::with_node(&key, &naming::lv_name_for("pvc-gone"));
    n.client
        .delete_volume(DeleteVolumeRequest {
            volume_id: gone,
            ..Default::default()
        })
        .await
        .unwrap();
    // Another node's token was not issued here.
    let e = n
        .client
        .list_volumes(ListVolumesRequest {
            max_entries: 1,
            starting_token: theirs,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Aborted);
}

#[tokio::test]
async fn a_node_alone_hands_out_ids_as_before_and_still_reads_its_key() {
    let mut n = node("worker-1", false).await;
    let (ids, _) = common::list_ids(&mut n.client, 0).await;
    assert_eq!(ids, n.volumes);
    let keyed = naming::with_node(&naming::node_key("worker-1"), &n.volumes[0]);
    assert_eq!(get(&mut n.client, &keyed).await, Ok(n.volumes[0].clone()));
}

/// A CO on the node's socket cannot make it pull a copy from elsewhere:
/// the copy header (`channel::COPY_HEADER`) counts only on a call the
/// controller made on the channel. Here, a restore of another node's
/// snapshot with the header is what it is without: NOT_FOUND, and no
/// grant is asked of anyone (the address is one nothing listens on).
#[tokio::test]
async fn the_copy_header_means_nothing_on_the_csi_socket() {
    use prost::Message;
    use thinpool_csi::proto::thinpool::cluster::v1::CopyFrom;
    let mut n = node("node-1", true).await;
    let elsewhere = naming::with_node(
        &naming::node_key("node-2"),
        &naming::snapshot_lv_name_for("s1"),
    );
    let mut r = tonic::Request::new(CreateVolumeRequest {
        name: "pvc-copy".into(),
        volume_capabilities: vec![VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(Default::default())),
            access_mode: Some(volume_capability::AccessMode { mode: 1 }),
        }],
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: elsewhere,
                },
            )),
        }),
        ..Default::default()
    });
    let copy = CopyFrom {
        node_id: "node-2".into(),
        address: "127.0.0.1:1".into(),
        server_name: "thinpool-csi-node".into(),
        token: "00".into(),
        snapshot_bytes: 8 << 20,
        ..Default::default()
    };
    r.metadata_mut().insert_bin(
        thinpool_csi::channel::COPY_HEADER,
        tonic::metadata::MetadataValue::from_bytes(&copy.encode_to_vec()),
    );
    let e = n.client.create_volume(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}
