#!/usr/bin/env python3
"""What one LVM read and one LVM write of a VG cost without emulation, as
the VG grows: issue 22's scale bench runs in the TCG VM, where every LVM
command is about ten times slower than on the host's CPU.

    scripts/lvm-read-cost.py [LVs ...]     # as root; default 100 to 12,000
    scripts/lvm-read-cost.py --copies [LVs ...]  # default 100 2000 6000 12000

On a loop device over a sparse file in /tmp (removed afterwards): a PV with
a 16 MiB metadata area and a VG, then for each count a VG text with a thin
pool and that many thin LVs named and tagged like the driver's is written
with `vgcfgrestore --force`, and timed (median of 3): `vgs` of every VG (what
start-up ran before commit b428f3d), the driver's report (`lvs` with its
fields) and one metadata write (`lvchange --addtag`, archive off, as the
driver writes). LVM runs with activation off, so it works on a kernel
without device-mapper (such as the CI machines'); it never activates
anything, and the driver's report would add device-mapper status reads of
the active LVs. Prints a Markdown table.

With --copies it measures what LVM's metadata copies cost instead (issue
22): for each count, and for each of four layouts built afresh (one at a
time, so LVM scans no other VG), the driver's report and one write (median
of 5 each): (a) one PV with one metadata area, what the driver builds;
(b) one PV with two (`pvcreate --pvmetadatacopies 2`); (c) a VG of two
PVs with one area each; (d) the same VG after `vgchange
--vgmetadatacopies 1`, where LVM keeps one of the two areas in use. The
layouts take turns in a rotating order; every area is 16 MiB, the files
are sparse (16 GiB and 1 GiB) and only the metadata is written."""
import os, re, shutil, subprocess, sys, time, statistics, string

FIELDS = ("lv_name,vg_name,lv_attr,lv_size,pool_lv,segtype,data_percent,"
          "metadata_percent,lv_tags,lv_health_status,lv_kernel_major,lv_kernel_minor,vg_extent_size,"
          "vg_size,vg_free,chunk_size,lv_time,origin,lv_read_ahead,thin_id,lv_metadata_size,vg_mda_size,"
          "vg_mda_free")
CFG = "global { activation = 0 } devices { obtain_device_list_from_udev = 0 } activation { udev_rules = 0 udev_sync = 0 } backup { archive = 0 }"
VG = "tpcsi-read-cost"
D = "/tmp/lvm-read-cost"

def lvm(*args, check=True):
    r = subprocess.run(["lvm", args[0], "--config", CFG, *args[1:]], capture_output=True, text=True,
                       env={**os.environ, "LVM_SUPPRESS_FD_WARNINGS": "1"})
    if check and r.returncode != 0:
        sys.exit(f"lvm {args}: {r.stderr}")
    return r

def timed(*args, n=3):
    ts = []
    for _ in range(n):
        t = time.monotonic(); lvm(*args); ts.append(time.monotonic() - t)
    return statistics.median(ts)

def lvid(k):
    a = string.ascii_letters + string.digits
    digits = []
    for _ in range(32):
        digits.append(a[k % len(a)]); k //= len(a)
    s = "".join(digits)
    out, at = [], 0
    for p in [6, 4, 4, 4, 4, 4, 6]:
        out.append(s[at:at + p]); at += p
    return "-".join(out)

def section(name, k, visible, count, segment, tags=None):
    """One LV of the VG text: `count` extents of one segment, whose
    type-specific lines are `segment`."""
    status = '["READ", "WRITE", "VISIBLE"]' if visible else '["READ", "WRITE"]'
    tags = f"\n\t\t\ttags = [{tags}]" if tags else ""
    body = "\n".join(f"\t\t\t\t{line}" for line in segment)
    return f'''
		{name} {{
			id = "{lvid(k)}"
			status = {status}
			flags = []{tags}
			creation_time = 1704067200
			creation_host = "guest"
			segment_count = 1

			segment1 {{
				start_extent = 0
				extent_count = {count}

{body}
			}}
		}}
'''

def thin(i, dev_id):
    name = thin_name(i)
    tags = ["tpcsi.owner=thinpool.csi.example.com", f"tpcsi.p.pvc=data-{i}", "tpcsi.p.ns=default",
            f"tpcsi.p.pv=pvc-{i:08x}-4b5a-6978-8796-a5b4c3d2e1f0", "tpcsi.a=block"]
    tags = ", ".join(f'"{t}"' for t in tags)
    return section(name, dev_id + 100, True, 1, ['type = "thin"', 'thin_pool = "pool"',
                   f"transaction_id = {dev_id - 1}", f"device_id = {dev_id}"], tags)

def linear(name, k, pe, count):
    return section(name, k, False, count, ['type = "striped"', "stripe_count = 1",
                   "stripes = [", f'\t"pv0", {pe}', "]"])

def pool(transaction):
    return section("pool", 1, True, 3000, ['type = "thin-pool"', 'metadata = "pool_tmeta"',
                   'pool = "pool_tdata"', f"transaction_id = {transaction}", "chunk_size = 128",
                   'discards = "passdown"', "zero_new_blocks = 1"])

def thin_name(i):
    return f"csi-{i:08x}4b5a69788796a5b4c3d2e1f0aabbccddeeff00112233445566778"[:61]

def with_lvs(base, n):
    """The VG text `base` (a backup of the VG without LVs) with the pool,
    its hidden LVs on pv0 and `n` thin LVs, its seqno one past base's."""
    lvs = [pool(n), linear("pool_tmeta", 9, 0, 20), linear("pool_tdata", 10, 20, 3000),
           linear("lvol0_pmspare", 11, 3020, 20)]
    lvs += [thin(i, i + 1) for i in range(n)]
    seq = int(re.search(r"seqno = (\d+)", base).group(1))
    text = re.sub(r"seqno = \d+", f"seqno = {seq + 1}", base, count=1)
    # Close the VG block with the LVs before its last brace.
    at = text.rstrip().rfind("}")
    return text[:at] + "\n\tlogical_volumes {\n" + "".join(lvs) + "\n\t}\n" + text[at:]

def loop(name, size):
    img = f"{D}/{name}.img"
    with open(img, "wb") as f:
        f.truncate(size)
    return subprocess.run(["losetup", "-f", "--show", img], capture_output=True, text=True,
                          check=True).stdout.strip()

# (label, pvcreate's options, PVs, vgchange's options after vgcreate)
LAYOUTS = [
    ("(a) 1 PV, 1 area (the driver's)", [], 1, None),
    ("(b) 1 PV, `--pvmetadatacopies 2`", ["--pvmetadatacopies", "2"], 1, None),
    ("(c) 2 PVs, 1 area each", [], 2, None),
    ("(d) 2 PVs, `--vgmetadatacopies 1`", [], 2, ["--vgmetadatacopies", "1"]),
]

def copies(ns):
    ns = ns or [100, 2000, 6000, 12000]
    os.makedirs(D, exist_ok=True)
    devs = []
    try:
        rows = {}
        for step, n in enumerate(ns):
            order = LAYOUTS[step % len(LAYOUTS):] + LAYOUTS[:step % len(LAYOUTS)]
            for label, pv_opts, pvs, vg_opts in order:
                devs = [loop("pv0", 16 << 30)] + [loop(f"pv{k}", 1 << 30) for k in range(1, pvs)]
                lvm("pvcreate", "--yes", "--metadatasize", "16m", *pv_opts, *devs)
                lvm("vgcreate", VG, *devs)
                if vg_opts:
                    lvm("vgchange", *vg_opts, VG)
                lvm("vgcfgbackup", "-f", f"{D}/base.vg", VG)
                text = with_lvs(open(f"{D}/base.vg").read(), n)
                open(f"{D}/n.vg", "w").write(text)
                lvm("vgcfgrestore", "--force", "-f", f"{D}/n.vg", VG)
                # What LVM holds after the restore: areas, and those in use.
                areas = lvm("vgs", "--noheadings", "-o", "vg_mda_count,vg_mda_used_count",
                            VG).stdout.split()
                report = timed("lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                               "-o", FIELDS, VG, n=5)
                ts = []
                for k in range(5):
                    t = time.monotonic()
                    lvm("lvchange", "--addtag", f"x{k}", f"{VG}/{thin_name(0)}")
                    ts.append(time.monotonic() - t)
                rows[(n, label)] = (f"{areas[0]} ({areas[1]})", report, statistics.median(ts), len(text))
                for dev in devs:
                    lvm("pvremove", "--force", "--force", "--yes", dev, check=False)
                    subprocess.run(["losetup", "-d", dev])
                devs = []
                print(f"{n} LVs, {label}: done", file=sys.stderr, flush=True)
            if step == 0:
                print("| LVs | layout | metadata areas (in use) | `lvs` (the driver's report) "
                      "| `lvchange --addtag` (a write) | write against (a) | VG text |")
                print("|---|---|---|---|---|---|---|")
            a = rows[(n, LAYOUTS[0][0])][2]
            for label, *_ in LAYOUTS:
                areas, report, write, size = rows[(n, label)]
                against = "" if label == LAYOUTS[0][0] else f"{(write / a - 1) * 100:+.1f} %"
                print(f"| {n + 4} | {label} | {areas} | {report:.3f} s | {write:.3f} s "
                      f"| {against} | {size:,} B |", flush=True)
    finally:
        for dev in devs:
            lvm("pvremove", "--force", "--force", "--yes", dev, check=False)
            subprocess.run(["losetup", "-d", dev])
        shutil.rmtree(D)

def main():
    if sys.argv[1:2] == ["--copies"]:
        return copies([int(x) for x in sys.argv[2:]])
    ns = [int(x) for x in sys.argv[1:]] or [100, 2000, 4000, 6000, 8000, 10000, 12000]
    os.makedirs(D, exist_ok=True)
    img = f"{D}/pool.img"
    with open(img, "wb") as f:
        f.truncate(16 << 30)
    dev = subprocess.run(["losetup", "-f", "--show", img], capture_output=True, text=True, check=True).stdout.strip()
    try:
        lvm("pvcreate", "--yes", "--metadatasize", "16m", dev)
        lvm("vgcreate", VG, dev)
        lvm("vgcfgbackup", "-f", f"{D}/base.vg", VG)
        base = open(f"{D}/base.vg").read()
        print("| LVs | vgs | lvs (the driver's report) | lvchange --addtag (a write) | text |")
        print("|---|---|---|---|---|")
        for n in ns:
            text = with_lvs(base, n)
            open(f"{D}/n.vg", "w").write(text)
            lvm("vgcfgrestore", "--force", "-f", f"{D}/n.vg", VG)
            base = open(f"{D}/base.vg").read()  # seqno moves on below
            vgs = timed("vgs", "--reportformat", "json", "-o", "vg_name")
            report = timed("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", FIELDS, VG)
            name = thin_name(0)
            write = timed("lvchange", "--addtag", "x", f"{VG}/{name}", n=1)
            lvm("lvchange", "--deltag", "x", f"{VG}/{name}")
            lvm("vgcfgbackup", "-f", f"{D}/base.vg", VG)
            # Back to the empty VG text for the next size.
            base = re.sub(r"\n\tlogical_volumes \{.*\n\t\}\n", "\n", open(f"{D}/base.vg").read(), flags=re.S)
            print(f"| {n + 4} | {vgs:.3f} s | {report:.3f} s | {write:.3f} s | {len(text)} B |", flush=True)
    finally:
        lvm("pvremove", "--force", "--force", "--yes", dev, check=False)
        subprocess.run(["losetup", "-d", dev])
        shutil.rmtree(D)

main()
