#!/usr/bin/env bash
# Runs kubernetes-csi's conformance suite, csi-sanity, against the real
# driver on a fresh loop-backed thin pool: once with mount volumes, once
# with raw block volumes. Keeps one JUnit report per access type. It is an
# optional check for users who have csi-sanity; the project's own
# conformance suite (tests/lvm/conformance/) covers every spec it checks.
#
#   scripts/csi-sanity.sh [CSI-SANITY FLAGS...]   # e.g. -ginkgo.focus=Snapshot
#
#   CSI_SANITY=PATH       the csi-sanity binary (default: `csi-sanity` on PATH;
#                         scripts/csi-sanity-bin.sh says how to get one)
#   SANITY_REPORTS=DIR    where the JUnit reports go (default target/csi-sanity)
#   SANITY_ACCESS="mount block"   the access types to run
#
# Where this kernel has device-mapper (scripts/have-dm.sh) it runs right
# here; on a kernel without it, it runs itself inside the project's VM
# (scripts/vm-run.sh). Exit status: non-zero when any spec failed, or when
# the suite could not run at all (never a silent skip).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/csi-sanity-bin.sh
source scripts/csi-sanity-bin.sh
reports=${SANITY_REPORTS:-$root/target/csi-sanity}
access=${SANITY_ACCESS:-mount block}

say() { echo "csi-sanity.sh: $*" >&2; }

if ! sanity=$(csi_sanity_bin); then
    say "ERROR: csi-sanity DID NOT RUN: $(csi_sanity_missing)"
    exit 1
fi

# Outside the VM: build, then run this very script in the guest and collect
# its reports.
if [[ ${THINPOOL_IN_VM:-} != 1 ]] && ! scripts/have-dm.sh; then
    cargo build --bin thinpool-csi
    rm -rf "$reports"
    rc=0
    VM_OUT=$reports CSI_SANITY=$sanity THINPOOL_SANITY_ACCESS=$access \
        scripts/vm-run.sh "$root/scripts/csi-sanity.sh" "$@" || rc=$?
    say "JUnit reports: $reports"
    exit "$rc"
fi

access=${THINPOOL_SANITY_ACCESS:-$access}
out=${THINPOOL_VM_OUT:-$reports}
mkdir -p "$out"
bin=$root/target/debug/thinpool-csi
# Natively the binary is built here, so it is never stale; in the VM the
# host built it before the VM started.
if [[ ${THINPOOL_IN_VM:-} != 1 ]] || [[ ! -x $bin ]]; then
    cargo build --bin thinpool-csi
fi

work=$(mktemp -d /tmp/tpcsi-sanity.XXXXXX)
driver=
stop_driver() {
    if [[ -n $driver ]] && kill -0 "$driver" 2>/dev/null; then
        kill -TERM "$driver"
        wait "$driver" || true
    fi
    driver=
}
trap stop_driver EXIT

rc=0
for kind in $access; do
    vg=tpcsi-sanity-$kind
    cat >"$work/$kind.toml" <<EOF
driver_name = "thinpool.csi.storage.dev"
node_id = "sanity-node"
endpoint = "unix://$work/$kind.sock"
csi_addons_endpoint = ""
volume_group = "$vg"
thin_pool = "pool"
default_volume_size = "64MiB"
udev = "off"
allowed_roots = ["$work/kubelet"]
state_dir = "$work/$kind-state"
[loop_pool]
backing_file = "$work/$kind-pool.img"
size = "1GiB"
pool_percent = 80
EOF
    mkdir -p "$work/kubelet"
    # ControllerModifyVolume's specs need a mutable parameter we accept.
    echo 'readAheadSectors: "256"' >"$work/mutable.yaml"
    RUST_LOG=${RUST_LOG:-info} "$bin" --config "$work/$kind.toml" >"$out/driver-$kind.log" 2>&1 &
    driver=$!
    for _ in $(seq 1 600); do
        [[ -S $work/$kind.sock ]] && break
        kill -0 "$driver" 2>/dev/null || break
        sleep 0.1
    done
    if [[ ! -S $work/$kind.sock ]]; then
        say "ERROR: the driver did not start for $kind; its log:"
        tail -n 40 "$out/driver-$kind.log" >&2
        exit 1
    fi
    say "== csi-sanity, $kind volumes"
    "$sanity" \
        -csi.endpoint="unix://$work/$kind.sock" \
        -csi.stagingdir="$work/kubelet/staging" \
        -csi.mountdir="$work/kubelet/mount" \
        -csi.testvolumesize=67108864 \
        -csi.testvolumeexpandsize=134217728 \
        -csi.testvolumeaccesstype="$kind" \
        -csi.testvolumemutableparameters="$work/mutable.yaml" \
        -ginkgo.junit-report="$out/junit-$kind.xml" \
        "$@" || rc=1
    stop_driver
done
exit "$rc"
