# thinpool-csi node image: the driver, its CLI client (tpcsi), plus the tools it runs (lvm2 with
# dmsetup, thin_dump/thin_delta, mkfs.ext4/resize2fs, mkfs.xfs,
# blkid/losetup, cryptsetup for LUKS2 volumes), under tini. It runs privileged, with the host's /dev, the
# kubelet directory and the host's LVM run/lock/configuration directories
# mounted (see deploy/kubernetes/). Build: docker build -t thinpool-csi:0.1.0 .

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
# it yet (the host's /lib/modules is mounted read-only). tini: PID 1, so
# whatever the driver's children leave behind is reaped.
#
# LVM's system directory, LVM_SYSTEM_DIR below, is the image's own (see
# deploy/lvm/lvmlocal.conf): the DaemonSet mounts the host's /etc/lvm over
# /etc/lvm, and this directory takes the host's lvm.conf and devices file
# from there (symlinks), with the image's lvmlocal.conf (no dmeventd, no
# udev, the host's backup directories) and lvm2's own command profiles
# (lvmdbusd.profile, which the driver's LVM shell needs), whatever the host
# has. A host without /etc/lvm/lvm.conf leaves the link dangling, and LVM
# then takes its built-in defaults.
ENV LVM_SYSTEM_DIR=/usr/local/share/thinpool-csi/lvm
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      lvm2 thin-provisioning-tools e2fsprogs xfsprogs util-linux cryptsetup-bin kmod tini \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p "$LVM_SYSTEM_DIR" \
 && cp -a /etc/lvm/profile "$LVM_SYSTEM_DIR/profile" \
 && ln -s /etc/lvm/lvm.conf "$LVM_SYSTEM_DIR/lvm.conf" \
 && ln -s /etc/lvm/devices "$LVM_SYSTEM_DIR/devices"
# LVM without udevd or dmeventd in the container, on the host's lock
# directory; also /etc/lvm/lvmlocal.conf, for an `lvm` run with
# LVM_SYSTEM_DIR unset.
COPY deploy/lvm/lvmlocal.conf /usr/local/share/thinpool-csi/lvm/lvmlocal.conf
COPY deploy/lvm/lvmlocal.conf /etc/lvm/lvmlocal.conf
# Every key with its default; the DaemonSet passes its own file from a
# ConfigMap with --config.
COPY config/defaults.toml /etc/thinpool-csi/config.toml
COPY --from=build /src/target/release/thinpool-csi /usr/local/bin/thinpool-csi
# The CLI client, for `kubectl exec ... -- tpcsi probe` and the like.
COPY --from=build /src/target/release/tpcsi /usr/local/bin/tpcsi
ENV CSI_ENDPOINT=unix:///csi/csi.sock
# tini runs the driver as its child: it forwards SIGTERM (the driver drains)
# and reaps orphans, which a driver as PID 1 would leave as zombies.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/thinpool-csi"]
CMD ["--config", "/etc/thinpool-csi/config.toml"]
