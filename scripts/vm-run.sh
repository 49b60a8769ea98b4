#!/usr/bin/env bash
# Run one command as root inside a throwaway QEMU VM whose kernel has
# device-mapper and dm-thin-pool (the host kernel has neither).
#
#   scripts/vm-run.sh CMD [ARGS...]
#
# - The guest sees the host's / (read-only over virtio-9p, with a RAM overlay on
#   top: writes, /tmp files and loop files live in guest memory and vanish with
#   the VM), so CMD runs from the same absolute working directory, with the
#   host's binaries (lvm2, thin tools, mkfs, freshly built tests).
# - CMD's stdout/stderr stream to ours; its exit status becomes ours.
# - The first stderr line comes from the guest and names its kernel and LVM
#   versions, as proof that the run really happened in the VM.
# - Only PATH, HOME, RUST_LOG, RUST_BACKTRACE, RUST_TEST_THREADS, THINPOOL_*,
#   TPCSI_* (test knobs) and CARGO_* (minus secrets and host-only ones)
#   reach CMD; it also gets
#   THINPOOL_IN_VM=1. Inside the guest this script just execs CMD.
#
# Exit status: CMD's; 124 if the VM ran longer than VM_TIMEOUT; 125 if the VM
# could not be set up, booted, or died without reporting a status.
#
# Environment knobs:
#   VM_TIMEOUT=1800        seconds for the whole VM before qemu is killed
#   VM_MEM=2048            guest memory in MiB (guest /tmp and overlay use it)
#   VM_CPUS=2              guest CPUs
#   VM_CPU=Nehalem         guest CPU model under TCG (under KVM: host)
#   VM_ACCEL=auto          auto | kvm | tcg
#   VM_KEEP=0              1 keeps .vm/runs/<run>/ (job, console log, output)
#   VM_LOCK_TIMEOUT=3600   seconds to wait for another VM run to finish
#   VM_TMP=overlay         guest /tmp: "overlay" = host's /tmp visible, new
#                          files in guest RAM; "tmpfs" = an empty tmpfs
#   VM_APPEND=             extra guest kernel arguments (e.g. ignore_loglevel
#                          to see every kernel message in the console log)
#   VM_KERNEL=             the guest kernel: empty (Debian 12's default, 6.1)
#                          or 6.12 (scripts/vm-setup.sh)
#   VM_OUT=                a host folder: what CMD writes under the folder
#                          named by $THINPOOL_VM_OUT (in the guest) is copied
#                          there after the run (reports, logs)
#
# The guest (kernel, initramfs, private QEMU) is built on first use by
# scripts/vm-setup.sh and cached under <repo>/.vm/.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd -P)
VM_DIR="$REPO_ROOT/.vm"
# The same names as scripts/vm-setup.sh's (which checks VM_KERNEL).
case "${VM_KERNEL:-}" in 6.12) KSUFFIX=-6.12 ;; *) KSUFFIX= ;; esac
KERNEL_DIR="$VM_DIR/kernel$KSUFFIX"
QEMU_DIR="$VM_DIR/qemu"
INITRAMFS="$VM_DIR/initramfs$KSUFFIX.cpio"

VM_TIMEOUT=${VM_TIMEOUT:-1800}
VM_MEM=${VM_MEM:-2048}
VM_CPUS=${VM_CPUS:-2}
VM_ACCEL=${VM_ACCEL:-auto}
VM_KEEP=${VM_KEEP:-0}
VM_LOCK_TIMEOUT=${VM_LOCK_TIMEOUT:-3600}
VM_TMP=${VM_TMP:-overlay}

EXIT_TIMEOUT=124
EXIT_VM_FAILED=125

msg() { echo "vm-run: $*" >&2; }
fail() { msg "ERROR: $*"; exit "$EXIT_VM_FAILED"; }

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

# KVM only when it can really run a stock kernel: /dev/kvm must open, and the
# CPU must have hardware virtualisation. Some hosts expose a /dev/kvm backed by
# something else (e.g. PVM, without vmx/svm) where Debian's kernel hangs right
# after decompression; there we fall back to TCG.
pick_accel() {
	case "$VM_ACCEL" in
	kvm | tcg) echo "$VM_ACCEL"; return ;;
	auto) ;;
	*) fail "VM_ACCEL must be auto, kvm or tcg (got '$VM_ACCEL')" ;;
	esac
	if [ -c /dev/kvm ] && (: <>/dev/kvm) 2>/dev/null && grep -qwE 'vmx|svm' /proc/cpuinfo; then
		echo kvm
	else
		echo tcg
	fi
}

# Names of the environment variables handed to CMD (besides PATH and HOME).
# CARGO_* carries what cargo sets for a test binary (CARGO_MANIFEST_DIR,
# CARGO_PKG_*, ...) but can also carry registry tokens: anything that looks
# like a credential stays out (the job file is written to disk). Also left out:
# CARGO_MAKEFLAGS (it names jobserver fds of host processes) and runner
# settings (the guest would try to start a VM inside the VM).
is_secret_name() {
	case "$1" in
	*TOKEN* | *SECRET* | *PASSWORD* | *PASSWD* | *CREDENTIAL* | *AUTH* | *_KEY | *_KEY_*) return 0 ;;
	esac
	return 1
}

passed_env_names() {
	local name
	for name in $(compgen -e); do
		case "$name" in
		RUST_LOG | RUST_BACKTRACE | RUST_TEST_THREADS) ;;
		THINPOOL_IN_VM) continue ;; # set by us in the guest
		THINPOOL_*) ;;
		TPCSI_*) ;; # test knobs, e.g. TPCSI_STORM_KILLS
		CARGO_MAKEFLAGS | CARGO_TARGET_*_RUNNER | CARGO_BUILD_RUNNER) continue ;;
		CARGO_*) ;;
		*) continue ;;
		esac
		is_secret_name "$name" && continue
		echo "$name"
	done
}

# The job the guest runs with /bin/bash and an empty environment. Every value
# is quoted with printf %q, so arguments and values arrive byte for byte; no
# string is ever re-parsed unquoted.
write_job() {
	local job=$1 name guest_path
	shift
	guest_path=${PATH:-/usr/bin:/bin}
	# LVM and mkfs tools live in sbin folders; make sure they are found.
	case ":$guest_path:" in *:/usr/sbin:*) ;; *) guest_path="$guest_path:/usr/sbin" ;; esac
	case ":$guest_path:" in *:/sbin:*) ;; *) guest_path="$guest_path:/sbin" ;; esac
	{
		echo '# Generated by scripts/vm-run.sh for one VM run.'
		printf 'export PATH=%q\n' "$guest_path"
		printf 'export HOME=%q\n' "${HOME:-/root}"
		for name in $(passed_env_names); do
			printf 'export %s=%q\n' "$name" "${!name}"
		done
		echo 'export THINPOOL_IN_VM=1'
		echo 'export THINPOOL_VM_OUT=/run/vm/out'
		printf 'cd -- %q || exit %d\n' "$PWD" "$EXIT_VM_FAILED"
		printf 'exec --'
		printf ' %q' "$@"
		printf '\n'
	} >"$job"
}

# QEMU option values are comma-separated; a literal comma is written twice.
qemu_escape() { printf '%s' "${1//,/,,}"; }

# Print the end of the guest console (and QEMU's own messages) after a failure.
show_console_tail() {
	local run=$1
	if [ -s "$run/qemu.log" ]; then
		msg "qemu said:"
		sed 's/^/  | /' "$run/qemu.log" | tail -n 20 >&2
	fi
	if [ -s "$run/console.log" ]; then
		msg "last lines of the guest console ($run/console.log):"
		tr -d '\r' <"$run/console.log" | tail -n 40 | sed 's/^/  | /' >&2
	else
		msg "the guest console stayed empty ($run/console.log)"
	fi
	msg "run folder kept: $run"
}

main() {
	[ $# -gt 0 ] || usage
	case "$1" in -h | --help) usage ;; esac

	# Already inside the VM (e.g. a cargo runner setting that leaked into a
	# guest job): run the command directly.
	if [ "${THINPOOL_IN_VM:-}" = 1 ]; then
		exec "$@"
	fi

	[ "$(id -u)" = 0 ] || fail "must run as root (the VM shares / over 9p with host ownership)"
	case "$VM_TIMEOUT" in '' | *[!0-9]*) fail "VM_TIMEOUT must be a number of seconds" ;; esac
	case "$VM_TMP" in overlay | tmpfs) ;; *) fail "VM_TMP must be overlay or tmpfs (got '$VM_TMP')" ;; esac

	# The guest mounts its own /proc, /sys, /dev and /run over the host's.
	case "$PWD/" in
	/proc/* | /sys/* | /dev/* | /run/*) fail "the working directory $PWD is hidden by a guest-private mount" ;;
	/tmp/*) [ "$VM_TMP" = overlay ] || fail "the working directory $PWD is hidden by the guest's tmpfs /tmp (VM_TMP=tmpfs)" ;;
	esac

	"$SCRIPT_DIR/vm-setup.sh" >&2 || fail "scripts/vm-setup.sh failed"

	mkdir -p "$VM_DIR/runs"
	# One VM at a time: on 2 cores, parallel TCG guests only slow each other.
	exec 9>"$VM_DIR/run.lock"
	if ! flock -n 9; then
		msg "waiting for another VM run to finish..."
		flock -w "$VM_LOCK_TIMEOUT" 9 || fail "gave up waiting for $VM_DIR/run.lock"
	fi
	# Forget runs older than a day that were kept after failures.
	find "$VM_DIR/runs" -mindepth 1 -maxdepth 1 -mtime +1 -exec rm -rf {} + 2>/dev/null || true

	local run accel kver qemu cpu tsc='' start qpid t_out t_err qrc=0 rc
	run=$(mktemp -d "$VM_DIR/runs/run.XXXXXX")
	write_job "$run/job.sh" "$@"
	: >"$run/stdout"
	: >"$run/stderr"
	mkdir "$run/out"

	accel=$(pick_accel)
	kver=$(cat "$KERNEL_DIR/kver")
	echo "accel $accel, ${VM_CPUS} cpus, ${VM_MEM}M" >"$run/meta"
	if [ "$accel" = kvm ]; then
		cpu=host
	else
		# TCG emulates AVX/XSAVE slowly; an older CPU model makes libraries
		# pick SSE code paths (dd and lvm ran about 10x faster than with
		# -cpu max). Nehalem still has SSE4.2 for crc32c-intel.
		cpu=${VM_CPU:-Nehalem}
		# The clocksource watchdog, comparing the emulated TSC with the
		# HPET under load, may mark the TSC unstable mid-run; the kernel
		# then patches sched_clock's static branch while other vCPUs run
		# it, and multi-threaded TCG has oopsed on that patch's int3 (twice
		# on the 6.12 guest, 5 s into the group tests: "Oops: int3" in
		# sched_clock_cpu, then a panic). The TSC is taken as reliable:
		# no watchdog, no flip.
		tsc=tsc=reliable
	fi

	# shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
	qemu=(
		env LD_LIBRARY_PATH="$QEMU_DIR/usr/lib/x86_64-linux-gnu:$QEMU_DIR/lib/x86_64-linux-gnu"
		QEMU_MODULE_DIR="$QEMU_DIR/usr/lib/x86_64-linux-gnu/qemu"
		"$QEMU_DIR/usr/bin/qemu-system-x86_64"
		-L "$QEMU_DIR/usr/share/qemu" -L "$QEMU_DIR/usr/share/seabios" -L "$QEMU_DIR/usr/lib/ipxe/qemu"
		-nodefaults -no-user-config -display none -monitor none
		-machine pc -accel "$accel" -cpu "$cpu" -smp "$VM_CPUS" -m "$VM_MEM"
		-no-reboot -nic none
		-chardev "file,id=console,path=$(qemu_escape "$run/console.log")" -serial chardev:console
		# An ELF vmlinux boots through its PVH entry point: no decompression.
		-kernel "$KERNEL_DIR/vmlinux" -initrd "$INITRAMFS"
		-append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off ${tsc:+$tsc }rdinit=/init vm.tmp=$VM_TMP${VM_APPEND:+ $VM_APPEND}"
		# The host root, read-only. multidevs=remap keeps inode numbers
		# unique across the host's different filesystems.
		-fsdev "local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap"
		-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
		# This run's folder, read-write: job, stdout, stderr, status.
		-fsdev "local,id=results,path=$(qemu_escape "$run"),security_model=passthrough"
		-device virtio-9p-pci,fsdev=results,mount_tag=results
		# The guest kernel's modules, for modprobe on demand.
		-fsdev "local,id=modules,path=$(qemu_escape "$KERNEL_DIR/lib/modules/$kver"),security_model=passthrough,readonly=on"
		-device virtio-9p-pci,fsdev=modules,mount_tag=modules
	)

	start=$SECONDS
	# timeout kills qemu if the whole VM takes too long (then exits 124).
	timeout --kill-after=10 "$VM_TIMEOUT" "${qemu[@]}" </dev/null >"$run/qemu.log" 2>&1 &
	qpid=$!
	# Stream the job's output while the guest writes it through 9p (cache=none
	# there, so every write lands in the host file at once). tail ends by
	# itself once qemu is gone, after a last read.
	tail -c +1 -s 0.2 -f --pid="$qpid" "$run/stdout" &
	t_out=$!
	tail -c +1 -s 0.2 -f --pid="$qpid" "$run/stderr" >&2 &
	t_err=$!

	local interrupted=0
	trap 'interrupted=1; kill -TERM "$qpid" 2>/dev/null || true' INT TERM HUP
	while :; do
		qrc=0
		wait "$qpid" || qrc=$?
		# A trapped signal interrupts wait with a status > 128; wait again
		# until qemu has really gone.
		kill -0 "$qpid" 2>/dev/null || break
	done
	wait "$t_out" "$t_err" 2>/dev/null || true
	trap - INT TERM HUP

	if [ "$interrupted" = 1 ]; then
		msg "interrupted; VM stopped (run folder: $run)"
		exit 130
	fi
	if [ "$qrc" = "$EXIT_TIMEOUT" ] && [ ! -s "$run/status" ]; then
		msg "ERROR: the VM did not finish within VM_TIMEOUT=${VM_TIMEOUT}s; qemu was killed"
		show_console_tail "$run"
		exit "$EXIT_TIMEOUT"
	fi
	rc=$(cat "$run/status" 2>/dev/null || true)
	case "$rc" in
	'' | *[!0-9]*)
		msg "ERROR: the guest died or could not boot: no exit status after $((SECONDS - start)) s (qemu exit $qrc)"
		show_console_tail "$run"
		exit "$EXIT_VM_FAILED"
		;;
	esac
	if [ -n "${VM_OUT:-}" ]; then
		if ! { mkdir -p "$VM_OUT" && cp -a "$run/out/." "$VM_OUT/"; }; then
			msg "ERROR: could not copy the guest's output to $VM_OUT"
		fi
	fi
	if [ "$VM_KEEP" = 1 ]; then
		msg "run folder kept: $run ($((SECONDS - start)) s)"
	else
		rm -rf "$run"
	fi
	exit "$rc"
}

main "$@"
