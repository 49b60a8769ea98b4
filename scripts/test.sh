#!/usr/bin/env bash
# Runs every test: the native suite (unit tests, plus root-only loop/mount
# tests) on this machine, then the LVM suite inside a VM whose kernel has
# dm-thin-pool (scripts/vm-run.sh), since LVM needs device-mapper.
#
#   scripts/test.sh           # everything
#   scripts/test.sh native    # native only
#   scripts/test.sh vm        # VM only
#   scripts/test.sh sanity    # csi-sanity in the VM (scripts/csi-sanity.sh)
#
# SANITY_FOCUS, when set, is csi-sanity's -ginkgo.focus (a regex of spec
# names); by default every spec runs.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}

if [[ $(id -u) -ne 0 ]]; then
    echo "test.sh: the suite needs root (loop devices, mounts, the VM's LVM); run it as root" >&2
    exit 1
fi

native() {
    echo "== native tests"
    # --test deploy: static checks of the Dockerfile and deploy/kubernetes.
    cargo test --lib --bins --test deploy
}

vm() {
    echo "== LVM tests in the VM"
    cargo build --bins
    cargo test --no-run --test lvm
    # --show-output prints what passing tests wrote: the benchmark and
    # reclaim figures (BENCH, MEASURE, RECLAIM lines).
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/vm-cargo-runner.sh" \
        cargo test --test lvm -- --test-threads="${LVM_TEST_THREADS:-2}" --show-output
}

sanity() {
    echo "== csi-sanity in the VM"
    local focus=${SANITY_FOCUS:-}
    if [[ -n $focus ]]; then
        scripts/csi-sanity.sh -ginkgo.focus="$focus"
    else
        scripts/csi-sanity.sh
    fi
}

case $what in
    native) native ;;
    vm) vm ;;
    sanity) sanity ;;
    all) native; vm; sanity ;;
    *) echo "usage: $0 [all|native|vm|sanity]" >&2; exit 2 ;;
esac
