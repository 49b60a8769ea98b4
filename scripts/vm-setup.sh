#!/usr/bin/env bash
# Build (once) and cache the QEMU guest that scripts/vm-run.sh boots.
#
# The host kernel has no device-mapper, so LVM tests run in a VM: Debian's own
# kernel (which has dm-thin-pool as modules) booted by QEMU with a tiny busybox
# initramfs; the guest then uses the host's / over virtio-9p as its root, so it
# runs the host's lvm2, thin tools, mkfs and freshly built test binaries.
#
# Everything is cached under <repo>/.vm/ (git-ignored) and rebuilt only when
# missing; the initramfs is also rebuilt when scripts/vm-guest-init changes.
# Usage: scripts/vm-setup.sh [--rebuild]
#
# VM_KERNEL picks the guest kernel: empty (the default) is Debian 12's
# linux-image-amd64 (6.1); "6.12" is the newest
# linux-image-6.12.*+deb12-amd64-unsigned (bookworm-security), whose
# filesystem freezes nest (Linux 6.8 and later), for the group snapshot
# tests. Each kernel has its own kernel folder and initramfs; QEMU and
# busybox are shared.
# All progress goes to stderr (vm-run.sh's stdout belongs to the job).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd -P)
VM_DIR="$REPO_ROOT/.vm"
GUEST_INIT="$SCRIPT_DIR/vm-guest-init"

VM_KERNEL=${VM_KERNEL:-}
case "$VM_KERNEL" in
'') KSUFFIX= ;;
6.12) KSUFFIX=-6.12 ;;
*) echo "vm-setup: VM_KERNEL must be empty (Debian's default) or 6.12, got '$VM_KERNEL'" >&2; exit 2 ;;
esac
KERNEL_DIR="$VM_DIR/kernel$KSUFFIX" # vmlinux, kver, lib/modules/<kver>/
QEMU_DIR="$VM_DIR/qemu"           # dpkg -x of qemu-system-x86 and its libraries
BUSYBOX_DIR="$VM_DIR/busybox"     # dpkg -x of busybox-static
INITRAMFS="$VM_DIR/initramfs$KSUFFIX.cpio"
INITRAMFS_STAMP="$VM_DIR/initramfs$KSUFFIX.stamp"

# Host packages the guest needs: it runs the host's binaries, so they must be
# installed here (kmod: depmod/modprobe for the module closure, and modprobe
# in the guest for modules requested on demand).
HOST_PACKAGES=(lvm2 thin-provisioning-tools e2fsprogs xfsprogs util-linux kmod xz-utils)

# Guest kernel modules; modprobe --show-depends adds their dependencies.
# Debian's 6.1 kernel builds all of these as modules (xfs and ext4 included).
GUEST_MODULES=(
	virtio_pci 9pnet_virtio 9p overlay     # host root over 9p + tmpfs overlay
	crc32c_intel crc32c_generic libcrc32c  # checksums for ext4/xfs/thin metadata
	loop                                   # loop devices for the test PVs
	dm_mod dm_bufio dm_thin_pool dm_snapshot dm_mirror dm_zero
	ext4 xfs
)

# Packages qemu-system-x86 needs beyond its libraries. Listed explicitly so a
# host that happens to have some of them installed still gets a full private
# tree (firmware and accelerator modules are looked up inside it).
QEMU_PACKAGES=(qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu)

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0

msg() { echo "vm-setup: $*" >&2; }
die() { msg "ERROR: $*"; exit 1; }

# --- apt helpers --------------------------------------------------------------

apt_update() {
	[ "$APT_UPDATED" = 1 ] && return 0
	msg "apt-get update"
	apt-get update -q >&2
	APT_UPDATED=1
}

# Run an apt command; if it fails (e.g. stale lists where a package version has
# been superseded and the download 404s), update the lists once and retry.
apt_retry() {
	"$@" >&2 && return 0
	[ "$APT_UPDATED" = 1 ] && return 1
	apt_update
	"$@" >&2
}

# Make sure apt knows all the given packages (fresh machines may have empty
# lists): run apt-get update only if one of them has no install candidate.
apt_ensure_known() {
	local p
	for p in "$@"; do
		# (No "| grep -q" here: grep quitting early makes apt-cache die of
		# SIGPIPE, which pipefail would turn into a false "unknown".)
		if [[ "$(apt-cache policy "$p" 2>/dev/null)" != *"Candidate: "[!\(]* ]]; then
			apt_update
			return 0
		fi
	done
}

# apt-get download as root warns that the _apt sandbox user cannot write the
# folder; downloading as root is what we want here.
apt_download() { apt-get download -q -o APT::Sandbox::User=root "$@"; }

# Download packages into a scratch folder and unpack them all into $1 with
# dpkg -x (nothing gets installed on the host). Returns 1 if a download fails,
# before anything is unpacked.
download_extract() {
	local dest=$1 tmp deb
	shift
	tmp=$(mktemp -d "$VM_DIR/debs.XXXXXX")
	if ! (cd "$tmp" && apt_download "$@" >&2); then
		rm -rf "$tmp"
		return 1
	fi
	for deb in "$tmp"/*.deb; do
		dpkg -x "$deb" "$dest"
	done
	rm -rf "$tmp"
}

# fetch_packages DEST LIST_FN: download and unpack the packages that LIST_FN
# prints. With stale lists a download can 404 (the version was superseded, and
# for the kernel even the ABI package name changes), so on failure update the
# lists, ask LIST_FN again and retry once.
fetch_packages() {
	local dest=$1 list_fn=$2 pkgs=() attempt
	for attempt in 1 2; do
		mapfile -t pkgs < <("$list_fn")
		[ ${#pkgs[@]} -gt 0 ] || die "$list_fn found no packages"
		msg "fetching ${pkgs[*]} (downloaded and unpacked, never installed)"
		download_extract "$dest" "${pkgs[@]}" && return 0
		if [ "$attempt" = 2 ] || [ "$APT_UPDATED" = 1 ]; then break; fi
		apt_update
	done
	die "apt-get download ${pkgs[*]} failed"
}

# --- host packages --------------------------------------------------------------

ensure_host_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = 'install ok installed' ] || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	msg "installing host packages: ${missing[*]}"
	apt_ensure_known "${missing[@]}"
	apt_retry apt-get install -y -q --no-install-recommends "${missing[@]}" ||
		die "apt-get install ${missing[*]} failed"
}

# --- kernel ---------------------------------------------------------------------

# QEMU's -kernel boots an uncompressed ELF vmlinux through its PVH entry point.
# Under TCG that skips 5-8 s of in-guest decompression of the bzImage. Debian's
# bzImage carries an xz stream: find its magic and decompress just that stream
# (the bytes after it are not xz data).
extract_vmlinux() {
	local bzimage=$1 out=$2 off
	off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bzimage" | head -n1 | cut -d: -f1 || true)
	if [ -n "$off" ]; then
		# xz stops after the first stream, so tail may die of SIGPIPE: judge
		# the result by its ELF header, not by the pipeline's status.
		tail -c +"$((off + 1))" "$bzimage" | xz -dc --single-stream >"$out.tmp" 2>/dev/null || true
	fi
	if [ -s "$out.tmp" ] && [ "$(head -c4 "$out.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
		mv "$out.tmp" "$out"
	else
		# Slower, but still boots: let the guest decompress itself.
		msg "WARNING: no xz-compressed ELF found in $bzimage; booting the bzImage"
		rm -f "$out.tmp"
		cp "$bzimage" "$out"
	fi
}

# linux-image-amd64 is a metapackage; the kernel is in the ABI package it
# depends on (e.g. linux-image-6.1.0-56-amd64). For VM_KERNEL=6.12: the
# newest 6.12 image bookworm carries (one package per upload, so the name
# changes with each; the highest version is taken).
kernel_packages() {
	if [ "$VM_KERNEL" = 6.12 ]; then
		apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' 2>/dev/null |
			awk '{print $1}' | sort -V | tail -n1
		return
	fi
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

build_kernel() {
	local tmp kver
	[ -s "$KERNEL_DIR/vmlinux" ] && [ -s "$KERNEL_DIR/kver" ] && return 0
	apt_ensure_known linux-image-amd64
	[ -n "$(kernel_packages)" ] || {
		apt_update
		[ -n "$(kernel_packages)" ] || die "apt knows no kernel package for VM_KERNEL='$VM_KERNEL'"
	}
	rm -rf "$KERNEL_DIR" "$KERNEL_DIR.tmp"
	tmp="$KERNEL_DIR.tmp"
	mkdir -p "$tmp"
	fetch_packages "$tmp" kernel_packages
	kver=$(basename "$(find "$tmp/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")
	if [ -z "$kver" ] || [ ! -f "$tmp/boot/vmlinuz-$kver" ]; then
		die "unexpected layout in the kernel package"
	fi
	# Debian ships no modules.dep (its postinst runs depmod); make one so that
	# modprobe works both here (closure) and in the guest (on-demand loads).
	depmod -b "$tmp" "$kver"
	extract_vmlinux "$tmp/boot/vmlinuz-$kver" "$tmp/vmlinux"
	echo "$kver" >"$tmp/kver"
	rm -rf "${tmp:?}/boot" "${tmp:?}/usr"
	mv "$tmp" "$KERNEL_DIR"
	msg "kernel $kver ready"
}

# --- qemu -----------------------------------------------------------------------

qemu_env() {
	# The private tree is not installed: point the loader, QEMU's module loader
	# (TCG itself is a module in Debian's build) and its firmware path into it.
	env LD_LIBRARY_PATH="$QEMU_DIR/usr/lib/x86_64-linux-gnu:$QEMU_DIR/lib/x86_64-linux-gnu" \
		QEMU_MODULE_DIR="$QEMU_DIR/usr/lib/x86_64-linux-gnu/qemu" "$@"
}

# Installing Debian 12's qemu-system-x86 (7.2) would remove a qemu-utils from
# backports (10.x) that this kind of machine has. So ask apt what it WOULD
# install, and download exactly that to unpack it privately. Never libc6 (apt
# lists it when QEMU wants a newer one than the host has): a libc must match
# the host's ld.so, which is what loads QEMU.
qemu_packages() {
	{
		printf '%s\n' "${QEMU_PACKAGES[@]}"
		apt-get install -s --no-install-recommends qemu-system-x86 2>/dev/null |
			awk '/^Inst / {print $2}'
	} | grep -vx 'libc6' | sort -u
}

build_qemu() {
	local tmp
	[ -x "$QEMU_DIR/usr/bin/qemu-system-x86_64" ] && return 0
	apt_ensure_known "${QEMU_PACKAGES[@]}"
	rm -rf "$QEMU_DIR" "$QEMU_DIR.tmp"
	tmp="$QEMU_DIR.tmp"
	mkdir -p "$tmp"
	fetch_packages "$tmp" qemu_packages
	mv "$tmp" "$QEMU_DIR"
	qemu_env "$QEMU_DIR/usr/bin/qemu-system-x86_64" --version >/dev/null ||
		{ rm -rf "$QEMU_DIR"; die "the private QEMU does not run (missing libraries?)"; }
	msg "$(qemu_env "$QEMU_DIR/usr/bin/qemu-system-x86_64" --version | head -n1) ready"
}

# --- busybox and initramfs --------------------------------------------------------

busybox_packages() { echo busybox-static; }

build_busybox() {
	[ -x "$BUSYBOX_DIR/bin/busybox" ] && return 0
	apt_ensure_known busybox-static
	rm -rf "$BUSYBOX_DIR" "$BUSYBOX_DIR.tmp"
	mkdir -p "$BUSYBOX_DIR.tmp"
	fetch_packages "$BUSYBOX_DIR.tmp" busybox_packages
	mv "$BUSYBOX_DIR.tmp" "$BUSYBOX_DIR"
}

initramfs_fingerprint() {
	{
		cat "$GUEST_INIT"
		cat "$KERNEL_DIR/kver"
		printf '%s\n' "${GUEST_MODULES[@]}"
		sha256sum "$BUSYBOX_DIR/bin/busybox"
	} | sha256sum | cut -d' ' -f1
}

build_initramfs() {
	local fp kver stage mod kind path _ applet
	local -A seen=()
	fp=$(initramfs_fingerprint)
	if [ -s "$INITRAMFS" ] && [ "$(cat "$INITRAMFS_STAMP" 2>/dev/null)" = "$fp" ]; then
		return 0
	fi
	kver=$(cat "$KERNEL_DIR/kver")
	stage=$(mktemp -d "$VM_DIR/initramfs.XXXXXX")
	mkdir -p "$stage"/{bin,dev,proc,sys,mnt/host,mnt/rw,newroot,modules}
	cp "$BUSYBOX_DIR/bin/busybox" "$stage/bin/busybox"
	for applet in $("$stage/bin/busybox" --list); do
		[ "$applet" = busybox ] || ln -s busybox "$stage/bin/$applet"
	done
	install -m 0755 "$GUEST_INIT" "$stage/init"
	# The kernel opens /dev/console before running /init; provide the node if
	# we are allowed to (the init script copes without it).
	mknod -m 600 "$stage/dev/console" c 5 1 2>/dev/null || true

	# Module closure in load order: "insmod <path>" lines, deduplicated.
	: >"$stage/modules/load.list"
	for mod in "${GUEST_MODULES[@]}"; do
		modprobe -d "$KERNEL_DIR" -S "$kver" --show-depends "$mod" >"$stage/deps" ||
			die "kernel $kver has no module $mod"
		while read -r kind path _; do
			[ "$kind" = insmod ] || continue # "builtin <name>" needs nothing
			[ -z "${seen[$path]:-}" ] || continue
			seen[$path]=1
			# Newer kernels ship xz-compressed modules; busybox's insmod
			# takes them plain.
			case "$path" in
			*.ko.xz)
				xz -dc "$path" >"$stage/modules/$(basename "$path" .xz)"
				basename "$path" .xz >>"$stage/modules/load.list"
				;;
			*)
				cp "$path" "$stage/modules/"
				basename "$path" >>"$stage/modules/load.list"
				;;
			esac
		done <"$stage/deps"
	done
	rm -f "$stage/deps"

	# Uncompressed on purpose: unpacking is cheaper than decompressing in TCG.
	(cd "$stage" && find . -print | "$stage/bin/busybox" cpio -o -H newc 2>/dev/null) >"$INITRAMFS.tmp"
	mv "$INITRAMFS.tmp" "$INITRAMFS"
	echo "$fp" >"$INITRAMFS_STAMP"
	rm -rf "$stage"
	msg "initramfs ready ($(du -h "$INITRAMFS" | cut -f1), ${#seen[@]} modules)"
}

main() {
	local rebuild=0
	case "${1:-}" in
	--rebuild) rebuild=1 ;;
	'') ;;
	*) echo "usage: $0 [--rebuild]" >&2; exit 2 ;;
	esac
	[ "$(id -u)" = 0 ] || die "must run as root (apt-get, dpkg -x, 9p passthrough)"
	[ -f "$GUEST_INIT" ] || die "missing $GUEST_INIT"
	mkdir -p "$VM_DIR"
	# One setup at a time (two vm-run.sh started together on a fresh machine).
	exec 8>"$VM_DIR/setup.lock"
	flock 8
	if [ "$rebuild" = 1 ]; then
		# Also wait for a running VM (vm-run.sh holds run.lock while qemu runs;
		# it calls this script before taking it, so this cannot deadlock).
		exec 7>"$VM_DIR/run.lock"
		flock 7
		rm -rf "$KERNEL_DIR" "$QEMU_DIR" "$BUSYBOX_DIR" "$INITRAMFS" "$INITRAMFS_STAMP"
	fi

	local start=$SECONDS
	ensure_host_packages
	if [ -s "$KERNEL_DIR/kver" ] && [ -x "$QEMU_DIR/usr/bin/qemu-system-x86_64" ] &&
		[ -x "$BUSYBOX_DIR/bin/busybox" ] && [ -s "$INITRAMFS" ] &&
		[ "$(cat "$INITRAMFS_STAMP" 2>/dev/null)" = "$(initramfs_fingerprint)" ]; then
		return 0 # everything cached: stay silent
	fi
	build_kernel
	build_qemu
	build_busybox
	build_initramfs
	msg "guest ready in $((SECONDS - start)) s under $VM_DIR"
}

main "$@"
