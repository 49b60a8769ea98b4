#!/usr/bin/env bash
# Exit status 0 when this kernel has device-mapper, so LVM (and the LVM
# suite, csi-sanity, the driver) can run natively; 1 when it has not, and
# the project's QEMU VM (scripts/vm-run.sh) must be used instead.
#
# dm-mod may be a module nobody has loaded yet (a fresh Debian VM): it is
# loaded first when modprobe can. /dev/mapper/control proves nothing (any
# `lvm version` creates it); /proc/misc lists the device only when the
# driver is really there.
modprobe -q dm_mod 2>/dev/null || true
grep -qw device-mapper /proc/misc
