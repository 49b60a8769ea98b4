#!/usr/bin/env bash
# Runs every test: the native suite (unit tests, root-only loop/mount
# tests, and the packaging and docs checks) on this machine, then the LVM
# suite and csi-sanity against real LVM. Where this kernel has
# device-mapper (scripts/have-dm.sh: a Debian VM, bare metal, the
# Vagrant box) they run right here; where it has not (the CI machines)
# they run inside a QEMU VM with Debian's kernel (scripts/vm-run.sh).
#
#   scripts/test.sh           # everything
#   scripts/test.sh native    # native only (no LVM needed)
#   scripts/test.sh vm        # the LVM suite (tests/lvm/), natively or in the VM
#   scripts/test.sh sanity    # csi-sanity (scripts/csi-sanity.sh), natively or in the VM
#
# Arguments after `vm` go to the LVM test binary (a name filter:
# `scripts/test.sh vm node::stage`), after `sanity` to csi-sanity.
#
# SANITY_FOCUS, when set, is csi-sanity's -ginkgo.focus (a regex of spec
# names); by default every spec runs.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
shift || true
extra=("$@")

if [[ $(id -u) -ne 0 ]]; then
    echo "test.sh: the suite needs root (loop devices, mounts, the VM's LVM); run it as root" >&2
    exit 1
fi

native() {
    echo "== native tests"
    # The pinned venv first: a native test calls the driver with Python's
    # grpcio from it (scripts/grpcio_call.py).
    scripts/check-packaging.sh --setup
    # --test deploy: static checks of the Dockerfile and deploy/kubernetes;
    # --test docs: README's configuration reference and commands.
    cargo test --lib --bins --test deploy --test docs
    echo "== packaging checks (Dockerfile parser, Kubernetes schemas, Vagrantfile)"
    scripts/check-packaging.sh
}

vm() {
    cargo build --bins
    cargo test --no-run --test lvm
    # --show-output prints what passing tests wrote: their MEASURE and
    # RECLAIM lines (the benchmark is scripts/bench.sh, not a test).
    local args=(--test lvm -- --test-threads="${LVM_TEST_THREADS:-2}" --show-output "${extra[@]}")
    if scripts/have-dm.sh; then
        echo "== LVM tests natively (kernel $(uname -r) has device-mapper)"
        cargo test "${args[@]}"
    else
        echo "== LVM tests in the VM (this kernel has no device-mapper)"
        CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/vm-cargo-runner.sh" \
            cargo test "${args[@]}"
    fi
}

sanity() {
    echo "== csi-sanity"
    local focus=${SANITY_FOCUS:-}
    if [[ -n $focus ]]; then
        scripts/csi-sanity.sh -ginkgo.focus="$focus" "${extra[@]}"
    else
        scripts/csi-sanity.sh "${extra[@]}"
    fi
}

case $what in
    native) native ;;
    vm) vm ;;
    sanity) sanity ;;
    all) native; vm; sanity ;;
    *) echo "usage: $0 [all|native|vm|sanity]" >&2; exit 2 ;;
esac
