# Privileged node image: the driver plus the tools it runs (lvm2, mkfs,
# blkid). Run it with --privileged, /dev and the kubelet directory mounted.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bin thinpool-csi

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends lvm2 thin-provisioning-tools \
      e2fsprogs xfsprogs util-linux \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/thinpool-csi /usr/local/bin/thinpool-csi
COPY config/ /etc/thinpool-csi/
# No udevd runs in the container: LVM creates its /dev nodes itself.
ENV CSI_ENDPOINT=unix:///csi/csi.sock
ENTRYPOINT ["/usr/local/bin/thinpool-csi", "--config", "/etc/thinpool-csi/defaults.toml"]
