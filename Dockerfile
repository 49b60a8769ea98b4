# thinpool-csi node image: the driver, its CLI client (tpcsi), plus the tools it runs (lvm2 with
# dmsetup, thin_dump/thin_delta, mkfs.ext4/resize2fs, mkfs.xfs,
# blkid/losetup). It runs privileged, with the host's /dev, the kubelet
# directory and the host's LVM run/lock directories mounted (see
# deploy/kubernetes/). Build: docker build -t thinpool-csi:0.1.0 .

# Builder: the Rust release the project is developed with, on the same
# Debian release as the runtime (the binary links against its glibc).
FROM rust:1.95-bookworm AS build
WORKDIR /src
# Only what the build reads; .dockerignore keeps target/ and .vm/ out of
# the context.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto/ proto/
COPY src/ src/
RUN cargo build --release --locked --bin thinpool-csi --bin tpcsi

FROM debian:bookworm-slim
# kmod: LVM loads dm-thin-pool with modprobe when the kernel has not loaded
# it yet (the host's /lib/modules is mounted read-only).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      lvm2 thin-provisioning-tools e2fsprogs xfsprogs util-linux kmod \
 && rm -rf /var/lib/apt/lists/*
# LVM without udevd in the container, on the host's lock directory.
COPY deploy/lvm/lvmlocal.conf /etc/lvm/lvmlocal.conf
# Every key with its default; the DaemonSet passes its own file from a
# ConfigMap with --config.
COPY config/defaults.toml /etc/thinpool-csi/config.toml
COPY --from=build /src/target/release/thinpool-csi /usr/local/bin/thinpool-csi
# The CLI client, for `kubectl exec ... -- tpcsi probe` and the like.
COPY --from=build /src/target/release/tpcsi /usr/local/bin/tpcsi
ENV CSI_ENDPOINT=unix:///csi/csi.sock
ENTRYPOINT ["/usr/local/bin/thinpool-csi"]
CMD ["--config", "/etc/thinpool-csi/config.toml"]
