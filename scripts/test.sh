#!/usr/bin/env bash
# Runs every test: the native suite (unit tests, root-only loop/mount
# tests, and the packaging and docs checks) on this machine, then the LVM
# suite with the project's own conformance suite against real LVM. Where
# this kernel has device-mapper (scripts/have-dm.sh: a Debian VM, bare
# metal, the Vagrant box) they run right here; where it has not (the CI
# machines) they run inside a QEMU VM with Debian's kernel
# (scripts/vm-run.sh). It installs the Debian packages it lacks first
# (scripts/install-deps.sh), so it works on a fresh machine by itself.
#
#   scripts/test.sh           # everything (csi-sanity only where a binary is found)
#   scripts/test.sh native    # native only (no LVM needed)
#   scripts/test.sh vm        # the LVM suite (tests/lvm/), natively or in the VM
#   scripts/test.sh sanity    # kubernetes-csi's csi-sanity (scripts/csi-sanity.sh); fails without it
#   scripts/test.sh lint      # cargo fmt --check, clippy --all-targets, shellcheck, the bench builds
#
# Arguments after `vm` go to the LVM test binary (a name filter:
# `scripts/test.sh vm node::stage`), after `sanity` to csi-sanity.
#
# csi-sanity is an optional extra: the project's conformance suite
# (tests/lvm/conformance/, part of `vm`) carries every spec it checks. The
# binary is CSI_SANITY, else `csi-sanity` on PATH. SANITY_FOCUS, when set,
# is csi-sanity's -ginkgo.focus (a regex of spec names).
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
shift || true
extra=("$@")
case $what in
    all | native | vm | sanity | lint) ;;
    *) echo "usage: $0 [all|native|vm|sanity|lint]" >&2; exit 2 ;;
esac

if [[ $(id -u) -ne 0 ]]; then
    echo "test.sh: the suite needs root (loop devices, mounts, the VM's LVM); run it as root" >&2
    exit 1
fi

case $what in
    lint) scripts/install-deps.sh lint ;;
    all | native | vm | sanity) scripts/install-deps.sh test ;;
esac

native() {
    echo "== native tests"
    # The pinned venv first: a native test calls the driver with Python's
    # grpcio from it (scripts/grpcio_call.py).
    scripts/check-packaging.sh --setup
    # --test deploy: deploy/kubernetes rendered with `kubectl kustomize`
    # (every overlay and component combination) and checked;
    # --test docs: docs/configuration.md's reference and the commands of README and docs/;
    # --test conformance_table: every rule the conformance tables name exists;
    # --test scale_seed: the text benches/scale.rs seeds LVM with;
    # --test channel, cluster, node_keys: the internal channel, the cluster's
    # controller and node keys, with a fake `lvm`.
    cargo test --lib --bins --test deploy --test docs --test conformance_table --test scale_seed \
        --test channel --test cluster --test node_keys
    echo "== packaging checks (Dockerfile parser, rendered manifests against the Kubernetes schemas, Vagrantfile)"
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
        TPCSI_EXPECT_FREEZE_NEST=0 \
            CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/vm-cargo-runner.sh" \
            cargo test "${args[@]}"
        # Freezes nest from Linux 6.8, and group snapshots of mounted
        # volumes take that path there: on a full run the group tests run
        # again on Debian 12's 6.12 kernel (group::the_kernel_is_the_one_asked_for
        # fails if the guest's freezes do not nest).
        if [[ ${#extra[@]} -eq 0 ]]; then
            echo "== group snapshot tests in the VM on Debian 12's 6.12 kernel (freezes nest)"
            VM_KERNEL=6.12 TPCSI_EXPECT_FREEZE_NEST=1 \
                CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/vm-cargo-runner.sh" \
                cargo test --test lvm -- --test-threads="${LVM_TEST_THREADS:-2}" --show-output group::
        fi
    fi
}

# The one way to find csi-sanity, and to say how to get it.
# shellcheck source=scripts/csi-sanity-bin.sh
source scripts/csi-sanity-bin.sh

sanity() {
    echo "== csi-sanity"
    local focus=${SANITY_FOCUS:-}
    if [[ -n $focus ]]; then
        scripts/csi-sanity.sh -ginkgo.focus="$focus" "${extra[@]}"
    else
        scripts/csi-sanity.sh "${extra[@]}"
    fi
}

# Everything: csi-sanity runs where a binary is found, and is skipped with
# one line otherwise (the conformance suite in `vm` covers its specs).
sanity_if_found() {
    if csi_sanity_bin >/dev/null; then
        sanity
    else
        echo "== csi-sanity skipped: $(csi_sanity_missing)"
    fi
}

lint() {
    echo "== cargo fmt --check"
    cargo fmt --check
    echo "== cargo clippy --all-targets -- -D warnings"
    cargo clippy --all-targets -- -D warnings
    echo "== the benchmark builds (scripts/bench.sh runs it)"
    cargo build --benches
    echo "== shellcheck"
    # vm-guest-init is the VM's /init under busybox sh, not bash.
    shellcheck scripts/*.sh .ci/run
    shellcheck -s sh scripts/vm-guest-init
}

case $what in
    native) native ;;
    vm) vm ;;
    sanity) sanity ;;
    lint) lint ;;
    all) native; vm; sanity_if_found ;;
esac
