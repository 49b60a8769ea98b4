//! Generated protocol code. The modules follow the proto packages, and sit
//! side by side because the add-ons code refers to `super::csi::v1`.

#[allow(clippy::all, clippy::pedantic)]
pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}
#[allow(clippy::all, clippy::pedantic)]
pub mod identity {
    tonic::include_proto!("identity");
}
#[allow(clippy::all, clippy::pedantic)]
pub mod reclaimspace {
    tonic::include_proto!("reclaimspace");
}
#[allow(clippy::all, clippy::pedantic)]
pub mod healer {
    tonic::include_proto!("healer");
}
#[allow(clippy::all, clippy::pedantic)]
pub mod encryptionkeyrotation {
    tonic::include_proto!("encryptionkeyrotation");
}
#[allow(clippy::all, clippy::pedantic)]
pub mod thinpool {
    pub mod cluster {
        pub mod v1 {
            tonic::include_proto!("thinpool.cluster.v1");
        }
    }
}
