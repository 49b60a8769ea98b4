#!/usr/bin/env bash
# Cargo target runner that runs each test binary inside the LVM test VM:
#
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=scripts/vm-cargo-runner.sh \
#       cargo test --test lvm_xxx
#
# Build happens on the host at native speed; cargo then calls
# `RUNNER /abs/path/to/test-binary ARGS...` from the package root, and each
# binary gets one VM (give every test its own VG and loop file so the tests
# can run in parallel inside it). See scripts/vm-run.sh for the details.
set -euo pipefail
here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
exec "$here/vm-run.sh" "$@"
