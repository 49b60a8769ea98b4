#!/usr/bin/env bash
# Runs the driver on the embedded default (config/dev.toml: a loop-backed
# thin pool built on first start). On a kernel without device-mapper it runs
# inside the project's VM (scripts/vm-run.sh) instead. It installs the
# Debian packages it lacks first (scripts/install-deps.sh run).
set -euo pipefail
cd "$(dirname "$0")/.."
# LVM, the thin tools and mkfs, where a fresh machine lacks them (the VM
# runs the host's own copies).
scripts/install-deps.sh run
cargo build --release --bin thinpool-csi
bin=target/release/thinpool-csi
if scripts/have-dm.sh; then
    exec "$bin" --config config/dev.toml "$@"
fi
echo "run-dev: this kernel has no device-mapper; running in the VM (Ctrl-C or VM_TIMEOUT ends it)" >&2
exec scripts/vm-run.sh "$bin" --config config/dev.toml "$@"
