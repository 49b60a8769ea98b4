#!/usr/bin/env bash
# Installs the Debian packages a fresh machine lacks for one of README's
# commands. The one install step: .ci/run, scripts/test.sh and
# scripts/run-dev.sh all call it, so each works on a fresh machine by
# itself. A package is installed only when its command is missing, so a
# machine that has everything runs no apt-get at all.
#
#   scripts/install-deps.sh run     # the driver: LVM, thin tools, mkfs
#   scripts/install-deps.sh test    # run, plus ruby and python3-venv (packaging checks)
#   scripts/install-deps.sh lint    # shellcheck (CI's habits)
#
# Several groups may be named at once. The VM's own packages (QEMU,
# Debian's kernel, busybox) are fetched by scripts/vm-setup.sh on the first
# VM run, not here. Needs root.
set -euo pipefail

# command:package pairs per group.
run_pkgs=(mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs losetup:util-linux blkid:util-linux
    lvm:lvm2 thin_check:thin-provisioning-tools cryptsetup:cryptsetup-bin)
# ruby: `ruby -c` checks vagrant/Vagrantfile (scripts/check_packaging.py).
# ip and nsenter: the cluster tests put each node plugin in a network
# namespace of its own (tests/lvm/cluster_rig.rs).
test_pkgs=("${run_pkgs[@]}" ruby:ruby ip:iproute2 nsenter:util-linux)
lint_pkgs=(shellcheck:shellcheck)

(($#)) || set -- test
need=()
add() {
    local pair pkg
    for pair in "$@"; do
        pkg=${pair#*:}
        command -v "${pair%%:*}" >/dev/null 2>&1 && continue
        [[ " ${need[*]} " == *" $pkg "* ]] || need+=("$pkg")
    done
}
for group in "$@"; do
    case $group in
        run) add "${run_pkgs[@]}" ;;
        test)
            add "${test_pkgs[@]}"
            # The packaging checks run in a venv (Debian's python3 needs python3-venv).
            python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
            # kubectl (kustomize v5 inside) renders the deployment for
            # tests/deploy.rs and the packaging checks. Debian packages no
            # kubectl, so it cannot be installed here: say so first (those
            # checks then fail, saying the same), and install the rest.
            if ! command -v kubectl >/dev/null 2>&1; then
                echo "install-deps: WARNING: kubectl is missing and no Debian package has it;" \
                    "the deployment checks will fail until it is installed" \
                    "(https://kubernetes.io/docs/tasks/tools/, v1.27 or later for kustomize v5)" >&2
            fi
            ;;
        lint) add "${lint_pkgs[@]}" ;;
        *)
            echo "usage: $0 [run|test|lint]..." >&2
            exit 2
            ;;
    esac
done
((${#need[@]})) || exit 0
if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing ${need[*]}; install them, or run this as root" >&2
    exit 1
fi
echo "install-deps: installing ${need[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
