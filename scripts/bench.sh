#!/usr/bin/env bash
# The performance benchmark: every driver call against the bare LVM
# command that does the same job, in one run, in the VM (or natively where
# the kernel has device-mapper). Prints a table of p50, p95 and ratios.
#
#   scripts/bench.sh
#
# It builds with the bench (release) profile and takes about 12 minutes
# under TCG. It is not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
    echo "bench.sh: needs root (loop devices, LVM); run it as root" >&2
    exit 1
fi
cargo bench --bench perf --no-run
if grep -qw device-mapper /proc/misc; then
    exec cargo bench --bench perf
fi
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/vm-cargo-runner.sh" \
    exec cargo bench --bench perf
