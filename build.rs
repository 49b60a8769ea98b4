//! Compiles the CSI and CSI-Addons protos with protox (pure Rust, no protoc
//! to install) and generates tonic services with tonic-prost-build.

const PROTO_ROOT: &str = "proto";
const FILES: &[&str] = &[
    "github.com/container-storage-interface/spec/lib/go/csi/csi.proto",
    "identity/identity.proto",
    "reclaimspace/reclaimspace.proto",
    "healer/healer.proto",
    "encryptionkeyrotation/encryptionkeyrotation.proto",
    "thinpool/cluster/v1/cluster.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: Vec<String> = FILES.iter().map(|f| format!("{PROTO_ROOT}/{f}")).collect();
    let fds = protox::compile(&files, [PROTO_ROOT])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    Ok(())
}
