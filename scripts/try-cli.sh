#!/usr/bin/env bash
# Try the tpcsi client against the driver on the embedded default
# (config/dev.toml: a 1 GiB loop-backed thin pool, built on first start).
#
#   scripts/try-cli.sh            a short tour: every tpcsi command once
#   scripts/try-cli.sh CMD ARGS   run CMD instead, with tpcsi on PATH, e.g.
#                                 scripts/try-cli.sh tpcsi info
#                                 scripts/try-cli.sh bash -c 'tpcsi create a --size 100Mi && tpcsi list'
#
# The driver is started in the background (log: $TPCSI_TRY_LOG, default
# /tmp/thinpool-csi/driver.log), and stopped when CMD ends. On a kernel
# without device-mapper, all of it runs inside the project's VM
# (scripts/vm-run.sh): the pool, the mounts and the driver live in guest
# memory and vanish with the VM, and the exit status is CMD's.
# On a machine with device-mapper you can instead keep `scripts/run-dev.sh`
# running and use target/debug/tpcsi from another shell.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${THINPOOL_IN_VM:-}" != 1 ]; then
    cargo build --bins
fi
if ! grep -qw device-mapper /proc/misc; then
    [ "${THINPOOL_IN_VM:-}" = 1 ] && { echo "try-cli: no device-mapper in the VM either" >&2; exit 1; }
    echo "try-cli: this kernel has no device-mapper; running in the VM" >&2
    exec scripts/vm-run.sh "$PWD/scripts/try-cli.sh" "$@"
fi

export PATH="$PWD/target/debug:$PATH"
log=${TPCSI_TRY_LOG:-/tmp/thinpool-csi/driver.log}
mkdir -p "$(dirname "$log")"
thinpool-csi --config config/dev.toml 2>"$log" &
driver=$!
stop() {
    kill -TERM "$driver" 2>/dev/null || true
    wait "$driver" 2>/dev/null || true
}
trap stop EXIT

# Ready when Probe answers on both sockets (the first start builds the pool).
for _ in $(seq 1 600); do
    if tpcsi probe >/dev/null 2>&1; then
        break
    fi
    if ! kill -0 "$driver" 2>/dev/null; then
        echo "try-cli: the driver exited; its log:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.2
done
tpcsi probe

tour() {
    set -x
    tpcsi info
    tpcsi capacity
    tpcsi create demo --size 128Mi --fs ext4
    id=$(tpcsi --json list | sed -n 's/.*"volume_id": "\(csi-demo-[0-9a-f]*\)".*/\1/p' | head -n1)
    tpcsi list
    tpcsi expand "$id" --size 192Mi
    mkdir -p /tmp/thinpool-csi/staging/demo /tmp/thinpool-csi/pods/demo
    tpcsi stage "$id" /tmp/thinpool-csi/staging/demo
    tpcsi publish "$id" /tmp/thinpool-csi/pods/demo/vol --staging /tmp/thinpool-csi/staging/demo
    dd if=/dev/urandom of=/tmp/thinpool-csi/pods/demo/vol/scratch bs=1M count=32 conv=fsync status=none
    tpcsi stats "$id" /tmp/thinpool-csi/pods/demo/vol
    rm /tmp/thinpool-csi/pods/demo/vol/scratch
    sync
    tpcsi reclaim "$id" --node --path /tmp/thinpool-csi/pods/demo/vol --progress
    tpcsi heal "$id" --path /tmp/thinpool-csi/pods/demo/vol --staging /tmp/thinpool-csi/staging/demo
    tpcsi snapshot create demo-snap --volume "$id"
    tpcsi snapshot list
    tpcsi unpublish "$id" /tmp/thinpool-csi/pods/demo/vol
    tpcsi unstage "$id" /tmp/thinpool-csi/staging/demo
    tpcsi reclaim "$id"
    tpcsi snapshot delete "$(tpcsi --json snapshot list --volume "$id" | sed -n 's/.*"snapshot_id": "\(snap-[^"]*\)".*/\1/p')"
    tpcsi delete "$id"
    tpcsi list
    # An error: the gRPC code, and 10 + the code as exit status.
    tpcsi get "$id" || echo "exit status $?"
    set +x
}

if [ $# -eq 0 ]; then
    tour
else
    "$@"
fi
