#!/usr/bin/env python3
"""Static checks of the packaging with real parsers from the registries.

Run through scripts/check-packaging.sh (it installs the pinned packages of
scripts/packaging-requirements.txt into a venv). Checks:

- Dockerfile, parsed by `dockerfile` (buildkit's own parser): the stages,
  their base images, every path a COPY takes from the build context (it
  exists and .dockerignore does not drop it), the binary copied from the
  builder, the runtime packages, CSI_ENDPOINT, the entry point (tini, then
  the driver), and the image's LVM system directory (LVM_SYSTEM_DIR: the
  host's lvm.conf, the image's lvmlocal.conf and command profiles), whose
  settings agree with the driver's own no-udev settings and start no
  dmeventd.
- What the deployment installs, as rendered: `kubectl kustomize` (kustomize
  v5, kubectl's own) of the base, of every overlay (deploy/kubernetes/
  overlays/*), and of each of those with every combination of the
  components (deploy/kubernetes/components/*: a temporary kustomization
  that names the overlay and the components). Each rendered document, and
  each example (deploy/kubernetes/examples, not installed), is parsed by
  PyYAML and validated by `kubernetes-validate` in strict mode (unknown
  fields are errors) against the oldest Kubernetes release the deploy
  README supports and the newest the package carries. Kinds that are
  CustomResourceDefinitions of other projects (VolumeSnapshotClass,
  VolumeGroupSnapshotClass, VolumeSnapshot, ReclaimSpaceCronJob,
  PodMonitor, PrometheusRule, and the SnapshotMetadataService that
  scripts/cluster-tls.sh writes) have no schema there: they are checked structurally below, against the fields
  their projects define; a render without components has none of them (it
  installs on a cluster without those CRDs). The source files kustomize
  reads (Kustomizations, Components) and kind's Cluster are checked
  structurally. The number of objects each render holds is printed.
- The kubelet directory is set in one place: with another value in
  base/settings.yaml, every render names only that one.
- The Secrets and the SnapshotMetadataService scripts/cluster-tls.sh
  writes (run into a temporary directory) pass the same schemas.
- Every sidecar flag in every rendered DaemonSet and Deployment exists in
  the release its image pins (SIDECARS below, with where each list was read).
- vagrant/Vagrantfile: `ruby -c` accepts it, every scripts/, config/
  and .ci/ path it names exists (scripts executable), and it runs .ci/run,
  the command CI runs.

Prints one line per failed check and ends with `packaging: N passed, M
failed`; the exit status is non-zero when any check failed.
"""

import base64
import fnmatch
import itertools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import dockerfile
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"

# deploy/kubernetes/README.md: "Kubernetes 1.34 or newer".
MIN_KUBERNETES = "1.34.0"
KUBERNETES_VERSIONS = [MIN_KUBERNETES, kubernetes_validate.latest_version()]

RUNTIME_PACKAGES = ["lvm2", "thin-provisioning-tools", "e2fsprogs", "xfsprogs", "util-linux", "cryptsetup-bin", "tini"]

# Flags each sidecar release accepts, as far as the manifests may use them.
# A flag not listed here fails the check: read the pinned release's docs,
# then add it. klog's `-v` is accepted by all of the kubernetes-csi ones.
# Sources (read with the project's search tool, 2026-11):
SIDECARS = {
    "registry.k8s.io/sig-storage/csi-node-driver-registrar": (
        "v2.17.0",
        # kubernetes-csi/node-driver-registrar cmd/csi-node-driver-registrar/main.go
        # (flag definitions) and README.md "Command line options".
        {"v", "csi-address", "kubelet-registration-path", "plugin-registration-path",
         "http-endpoint", "health-port", "timeout", "version"},
    ),
    "registry.k8s.io/sig-storage/livenessprobe": (
        # v2.19.0: the same flags as v2.20.0 (whose CHANGELOG lists only
        # dependency updates), and the release whose digest is known.
        "v2.19.0",
        # kubernetes-csi/livenessprobe cmd/livenessprobe/main.go (flag
        # definitions; --http-endpoint excludes the deprecated --health-port,
        # whose default 9808 is the driver's metrics port).
        {"v", "csi-address", "probe-timeout", "health-port", "http-endpoint",
         "metrics-address", "metrics-path", "version"},
    ),
    "registry.k8s.io/sig-storage/csi-provisioner": (
        "v6.3.0",
        # kubernetes-csi/external-provisioner cmd/csi-provisioner/csi-provisioner.go
        # and README.md "Command line options" (--enable-capacity,
        # --capacity-ownerref-level: 2 for a Deployment, whose pods a
        # ReplicaSet owns; pkg/owner/owner.go); CHANGELOG-6.0 .. 6.3 remove
        # no flag.
        {"v", "csi-address", "timeout", "worker-threads", "node-deployment",
         "node-deployment-immediate-binding", "strict-topology", "immediate-topology",
         "enable-capacity", "capacity-ownerref-level", "capacity-poll-interval",
         "capacity-for-immediate-binding", "extra-create-metadata", "leader-election",
         "leader-election-namespace", "http-endpoint", "metrics-path", "default-fstype",
         "retry-interval-start", "retry-interval-max", "kube-api-qps", "kube-api-burst",
         "feature-gates", "version"},
    ),
    "registry.k8s.io/sig-storage/csi-attacher": (
        "v4.12.0",
        # kubernetes-csi/external-attacher README.md "Command line options".
        {"v", "csi-address", "timeout", "worker-threads", "leader-election",
         "leader-election-namespace", "http-endpoint", "metrics-path",
         "retry-interval-start", "retry-interval-max", "kube-api-qps", "kube-api-burst",
         "version"},
    ),
    "registry.k8s.io/sig-storage/csi-resizer": (
        "v2.2.1",
        # kubernetes-csi/external-resizer README.md "Command line options"
        # (2.2.1 is a patch release of 2.2.0: no flag added or removed).
        {"v", "csi-address", "timeout", "workers", "leader-election",
         "leader-election-namespace", "http-endpoint", "metrics-path",
         "retry-interval-start", "retry-interval-max", "kube-api-qps", "kube-api-burst",
         "handle-volume-inuse-error", "feature-gates", "version"},
    ),
    "registry.k8s.io/sig-storage/csi-snapshotter": (
        "v8.6.0",
        # kubernetes-csi/external-snapshotter cmd/csi-snapshotter/main.go
        # and the vendored csi-lib-utils standardflags (leader election);
        # pkg/features/features.go: the CSIVolumeGroupSnapshot gate.
        {"v", "csi-address", "timeout", "worker-threads", "node-deployment",
         "extra-create-metadata", "snapshot-name-prefix", "snapshot-name-uuid-length",
         "groupsnapshot-name-prefix", "groupsnapshot-name-uuid-length",
         "leader-election", "leader-election-namespace",
         "http-endpoint", "metrics-path", "retry-interval-start", "retry-interval-max",
         "kube-api-qps", "kube-api-burst", "feature-gates", "version"},
    ),
    "registry.k8s.io/sig-storage/csi-snapshot-metadata": (
        "v1.1.0",
        # kubernetes-csi/external-snapshot-metadata pkg/sidecar/sidecar.go
        # (flag definitions; no leader election: every replica serves).
        {"v", "csi-address", "timeout", "port", "tls-cert", "tls-key", "audience",
         "max-streaming-duration-min", "http-endpoint", "metrics-path", "disable-metrics",
         "kube-api-qps", "kube-api-burst", "kubeconfig", "version"},
    ),
    "quay.io/csiaddons/k8s-sidecar": (
        "v0.14.0",
        # csi-addons/kubernetes-csi-addons sidecar/main.go (flag definitions).
        {"csi-addons-address", "node-id", "stagingpath", "controller-port", "controller-ip",
         "pod", "namespace", "pod-uid", "timeout", "leader-election-namespace",
         "leader-election-lease-duration", "leader-election-renew-deadline",
         "leader-election-retry-period", "enable-auth", "version"},
    ),
}
DRIVER_IMAGE = "thinpool-csi"

failures = []
passed = 0


def check(name):
    """Runs fn() as one named check: it returns a list of problems."""

    def wrap(fn):
        global passed
        try:
            problems = fn()
        except Exception as e:  # a crash is a failure, never a pass
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            failures.append(name)
            for p in problems:
                print(f"FAIL {name}: {p}")
        else:
            passed += 1
            print(f"ok   {name}")
        return fn

    return wrap


def rel(p):
    return str(pathlib.Path(p).relative_to(ROOT))


# ---------------------------------------------------------------------------
# Dockerfile


def dockerignore_patterns():
    pats = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = line[1:] if neg else line
        pats.append((neg, pat.strip("/")))
    return pats


def ignored(path, pats):
    """Whether the build context drops `path` (a pattern that matches a
    parent drops everything under it; the last matching pattern wins)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for neg, pat in pats:
        if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
            result = not neg
    return result


def stages():
    out = []
    for c in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if c.cmd == "FROM":
            v = list(c.value)
            name = v[2] if len(v) == 3 and v[1].upper() == "AS" else None
            out.append({"base": v[0], "name": name, "cmds": [], "line": c.start_line})
        elif not out:
            raise ValueError(f"Dockerfile:{c.start_line}: {c.cmd} before the first FROM")
        else:
            out[-1]["cmds"].append(c)
    return out


def flag_value(c, name):
    for f in c.flags:
        if f.startswith(f"--{name}="):
            return f.split("=", 1)[1]
    return None


@check("Dockerfile: a named Rust builder on the runtime's Debian release, then debian:<release>-slim")
def _():
    st = stages()
    p = []
    if len(st) < 2:
        return [f"needs a builder and a runtime stage, has {len(st)}"]
    m = re.fullmatch(r"(?:docker\.io/library/)?debian:([a-z]+)-slim", st[-1]["base"])
    if not m:
        return [f"the runtime base must be debian:<release>-slim, is {st[-1]['base']}"]
    release = m.group(1)
    msrv = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["rust-version"]
    for s in st[:-1]:
        b = re.fullmatch(r"(?:docker\.io/library/)?rust:(\d+)\.(\d+)(?:\.\d+)?-([a-z]+)", s["base"])
        if not b:
            p.append(f"Dockerfile:{s['line']}: builder base {s['base']} is not an official rust:<x.y>-<release> image")
            continue
        if b.group(3) != release:
            p.append(f"Dockerfile:{s['line']}: builder on {b.group(3)}, runtime on {release}: the binary links the builder's glibc")
        if (int(b.group(1)), int(b.group(2))) < tuple(int(x) for x in msrv.split(".")[:2]):
            p.append(f"Dockerfile:{s['line']}: rust {b.group(1)}.{b.group(2)} is older than rust-version {msrv}")
        if not s["name"]:
            p.append(f"Dockerfile:{s['line']}: the builder stage needs a name (FROM ... AS name)")
    return p


@check("Dockerfile: every path COPY takes from the context exists and is sent")
def _():
    pats = dockerignore_patterns()
    p = []
    copies = 0
    for s in stages():
        for c in s["cmds"]:
            if c.cmd not in ("COPY", "ADD"):
                continue
            if c.cmd == "ADD":
                p.append(f"Dockerfile:{c.start_line}: use COPY, not ADD")
            if flag_value(c, "from") is not None:
                continue
            for src in c.value[:-1]:
                copies += 1
                if not (ROOT / src).exists():
                    p.append(f"Dockerfile:{c.start_line}: COPY source {src} does not exist")
                elif ignored(src, pats):
                    p.append(f"Dockerfile:{c.start_line}: COPY source {src} is dropped by .dockerignore")
    for big in ("target", ".vm", ".git"):
        if not ignored(big, pats):
            p.append(f".dockerignore must drop {big}/ (hundreds of MiB, never read by the build)")
    if copies == 0:
        p.append("no COPY from the build context at all")
    return p


# The init the image runs as PID 1 (Debian's tini package), in front of the driver.
INIT = ["/usr/bin/tini", "--"]


def runtime_env():
    """ENV of the runtime stage, in order."""
    env = {}
    for c in stages()[-1]["cmds"]:
        if c.cmd == "ENV":
            env.update(zip(c.value[0::2], c.value[1::2]))
    return env


@check("Dockerfile: the runtime gets the built binary, the tools, LVM settings, CSI_ENDPOINT and an entry point")
def _():
    st = stages()
    named = {s["name"]: s for s in st if s["name"]}
    rt = st[-1]
    p = []
    binary = None
    for c in rt["cmds"]:
        frm = flag_value(c, "from") if c.cmd == "COPY" else None
        if frm is None:
            continue
        b = named.get(frm)
        if b is None:
            p.append(f"Dockerfile:{c.start_line}: --from={frm} names no stage")
            continue
        workdir = "/"
        build = None
        for bc in b["cmds"]:
            if bc.cmd == "WORKDIR":
                workdir = bc.value[0]
            if bc.cmd == "RUN" and "cargo build" in bc.value[0]:
                build = bc.value[0]
        if build is None:
            p.append(f"stage {frm} runs no cargo build")
            continue
        # Each binary copied from the builder is one its cargo build makes
        # (the driver, and the tpcsi client).
        name = c.value[0].rsplit("/", 1)[-1] if len(c.value) == 2 else None
        if name not in ("thinpool-csi", "tpcsi"):
            p.append(f"Dockerfile:{c.start_line}: copies {list(c.value[:-1])}, not one built binary")
            continue
        for want in ("--release", "--locked", f"--bin {name}"):
            if want not in build:
                p.append(f"stage {frm}: cargo build needs {want}")
        if "--target" in build.split() or any("CARGO_TARGET_DIR" in " ".join(bc.value) for bc in b["cmds"]):
            p.append(f"stage {frm}: the binary's path below assumes cargo's default target dir")
        built = workdir.rstrip("/") + f"/target/release/{name}"
        if list(c.value[:-1]) != [built]:
            p.append(f"Dockerfile:{c.start_line}: copies {list(c.value[:-1])}, cargo leaves the binary at {built}")
        if name == "thinpool-csi":
            binary = c.value[-1]
    if binary is None:
        p.append("the runtime stage copies no binary from a builder stage")
    runs = " ".join(c.value[0] for c in rt["cmds"] if c.cmd == "RUN")
    words = set(runs.split())
    for pkg in RUNTIME_PACKAGES:
        if pkg not in words:
            p.append(f"the runtime stage installs no {pkg}")
    for want in ("--no-install-recommends", "rm -rf /var/lib/apt/lists"):
        if want not in runs:
            p.append(f"the apt-get install needs {want}")
    dests = {c.value[-1]: c.value[0] for c in rt["cmds"] if c.cmd == "COPY" and flag_value(c, "from") is None}
    if dests.get("/etc/lvm/lvmlocal.conf") != "deploy/lvm/lvmlocal.conf":
        p.append("deploy/lvm/lvmlocal.conf must be installed as /etc/lvm/lvmlocal.conf")
    env = runtime_env()
    if not re.fullmatch(r"unix:///\S+", env.get("CSI_ENDPOINT", "")):
        p.append(f"ENV CSI_ENDPOINT must be unix:///<path>, is {env.get('CSI_ENDPOINT')!r}")
    # LVM's system directory: the image's own, with the host's lvm.conf (a
    # link into the host's /etc/lvm the DaemonSet mounts), the image's
    # lvmlocal.conf and lvm2's command profiles.
    sysdir = env.get("LVM_SYSTEM_DIR", "")
    if not sysdir.startswith("/") or sysdir.rstrip("/") == "/etc/lvm":
        p.append(f"ENV LVM_SYSTEM_DIR must be a directory of the image's own, not the host's /etc/lvm; is {sysdir!r}")
    else:
        if dests.get(f"{sysdir}/lvmlocal.conf") != "deploy/lvm/lvmlocal.conf":
            p.append(f"deploy/lvm/lvmlocal.conf must be installed as {sysdir}/lvmlocal.conf (LVM_SYSTEM_DIR)")
        made = re.sub(r"\s+", " ", runs.replace("$LVM_SYSTEM_DIR", sysdir).replace('"', ""))
        for want, why in ((f"ln -s /etc/lvm/lvm.conf {sysdir}/lvm.conf", "the host's lvm.conf"),
                          (f"cp -a /etc/lvm/profile {sysdir}/profile", "lvm2's command profiles (lvmdbusd)")):
            if want not in made:
                p.append(f"the runtime stage must run `{want}`: {why} in LVM_SYSTEM_DIR")
    entry = [c for c in rt["cmds"] if c.cmd == "ENTRYPOINT"]
    cmd = [c for c in rt["cmds"] if c.cmd == "CMD"]
    if not entry or not entry[-1].json or list(entry[-1].value[:3]) != INIT + [binary]:
        p.append(f"ENTRYPOINT must be the exec form {INIT + [binary]!r} + args: tini reaps what the driver's children leave")
    argv = (list(entry[-1].value) if entry else []) + (list(cmd[-1].value) if cmd else [])
    if "--config" in argv:
        cfg = argv[argv.index("--config") + 1]
        if cfg not in dests:
            p.append(f"--config {cfg} is not a file the image contains")
    else:
        p.append("ENTRYPOINT/CMD must pass --config FILE")
    return p


def lvm_settings(text):
    """`key = value` pairs of an LVM config text (comments dropped)."""
    text = re.sub(r"#[^\n]*", "", text)
    return {k: v.strip('"') for k, v in re.findall(r"(\w+)\s*=\s*(\"[^\"]*\"|\S+)", text)}


@check("LVM settings: the image's lvmlocal.conf agrees with the driver's no-udev settings, starts no dmeventd")
def _():
    src = (ROOT / "src" / "lvm" / "mod.rs").read_text()
    m = re.search(r'const NO_UDEV_CONFIG: &str = "((?:[^"\\]|\\.)*)";', src, re.S)
    if not m:
        return ["src/lvm/mod.rs has no NO_UDEV_CONFIG constant to compare with"]
    driver = lvm_settings(m.group(1).replace("\\\n", " "))
    image = lvm_settings((ROOT / "deploy" / "lvm" / "lvmlocal.conf").read_text())
    p = []
    if set(driver) != {"udev_rules", "udev_sync", "obtain_device_list_from_udev"}:
        p.append(f"NO_UDEV_CONFIG sets {sorted(driver)}; this check knows udev_rules, udev_sync, obtain_device_list_from_udev")
    for k, v in driver.items():
        if image.get(k) != v:
            p.append(f"lvmlocal.conf: {k} = {image.get(k)!r}, the driver passes {k} = {v}")
    if image.get("locking_dir") != "/run/lock/lvm":
        p.append("lvmlocal.conf: locking_dir must be the host's /run/lock/lvm (mounted by the DaemonSet)")
    if image.get("monitoring") != "0":
        p.append("lvmlocal.conf: monitoring must be 0 (a dmeventd started in the container lives and dies there)")
    sysdir = runtime_env().get("LVM_SYSTEM_DIR", "")
    if image.get("profile_dir") != f"{sysdir}/profile":
        p.append(f"lvmlocal.conf: profile_dir must be {sysdir}/profile (the image's lvm2 profiles), is {image.get('profile_dir')!r}")
    for k in ("backup_dir", "archive_dir"):
        if not image.get(k, "").startswith("/etc/lvm/"):
            p.append(f"lvmlocal.conf: {k} must be under the host's /etc/lvm (else LVM puts it under LVM_SYSTEM_DIR), is {image.get(k)!r}")
    return p


# ---------------------------------------------------------------------------
# Manifests


def manifests():
    """(file, index, document) of every YAML document under deploy/kubernetes
    (the source files; a symlinked directory is not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(DEPLOY):
        dirnames.sort()
        for name in sorted(filenames):
            f = pathlib.Path(dirpath) / name
            if f.suffix == ".yaml" and not f.is_symlink():
                for i, doc in enumerate(yaml.safe_load_all(f.read_text())):
                    if doc is not None:
                        out.append((f, i, doc))
    return sorted(out, key=lambda x: (str(x[0]), x[1]))


# ---------------------------------------------------------------------------
# Renders: what `kubectl apply -k` would install.

BASE = DEPLOY / "base"
OVERLAYS = DEPLOY / "overlays"
COMPONENTS = DEPLOY / "components"
# The kinds a component brings that need another project's CRDs.
CRD_KINDS = {"VolumeSnapshotClass", "PodMonitor", "PrometheusRule", "VolumeSnapshot",
             "VolumeGroupSnapshotClass", "ReclaimSpaceCronJob", "SnapshotMetadataService"}


def kubectl():
    k = shutil.which("kubectl")
    if k is None:
        raise RuntimeError("kubectl is not installed: it renders the kustomizations (kubectl kustomize, "
                           "kustomize v5); install kubectl and run again")
    return k


def render_dir(d):
    """The documents `kubectl kustomize d` renders."""
    r = subprocess.run([kubectl(), "kustomize", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {d}: {r.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(r.stdout) if doc is not None]


def targets(deploy=DEPLOY):
    """The base and every overlay: what a component combination goes over."""
    overlays = sorted(p.parent for p in (deploy / "overlays").glob("*/kustomization.yaml"))
    return [deploy / "base"] + overlays


def components(deploy=DEPLOY):
    return sorted(p.parent for p in (deploy / "components").glob("*/kustomization.yaml"))


def combinations(items):
    return [list(c) for n in range(len(items) + 1) for c in itertools.combinations(items, n)]


def render(target, comps):
    """`kubectl kustomize` of target, or of a temporary kustomization that
    names target and the components comps."""
    if not comps:
        return render_dir(target)
    with tempfile.TemporaryDirectory(prefix="thinpool-kustomize-") as tmp:
        # kustomize takes relative paths only.
        relp = lambda d: os.path.relpath(d, tmp)
        text = yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [relp(target)],
            "components": [relp(c) for c in comps],
        })
        (pathlib.Path(tmp) / "kustomization.yaml").write_text(text)
        return render_dir(tmp)


_renders = None


def renders():
    """{name: documents} of every target with every combination of the
    components, rendered once."""
    global _renders
    if _renders is None:
        out = {}
        for t in targets():
            for comps in combinations(components()):
                name = " + ".join([str(t.relative_to(DEPLOY))] + [c.name for c in comps])
                out[name] = render(t, comps)
        _renders = out
    return _renders


def expect(p, where, cond, msg):
    if not cond:
        p.append(f"{where}: {msg}")


def only_keys(p, where, obj, allowed):
    if not isinstance(obj, dict):
        p.append(f"{where}: must be a mapping")
        return False
    for k in obj:
        expect(p, where, k in allowed, f"unknown field {k!r} (known: {sorted(allowed)})")
    return True


def is_name(s):
    return isinstance(s, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", s) and len(s) <= 253


def check_meta(p, where, doc, namespaced):
    meta = doc.get("metadata") or {}
    expect(p, where, is_name(meta.get("name")), f"metadata.name {meta.get('name')!r} is not a DNS name")
    if namespaced:
        expect(p, where, is_name(meta.get("namespace")), "a namespaced object needs metadata.namespace")


# Structural checks of the kinds kubernetes-validate has no schema for,
# after the types their projects define:
# - snapshot.storage.k8s.io/v1 (kubernetes-csi/external-snapshotter client/apis/volumesnapshot/v1/types.go);
# - csiaddons.openshift.io/v1alpha1 ReclaimSpaceCronJob (csi-addons/kubernetes-csi-addons
#   api/csiaddons/v1alpha1/reclaimspacecronjob_types.go and reclaimspacejob_types.go);
# - kustomize.config.k8s.io/v1beta1 Kustomization; kind.x-k8s.io/v1alpha4 Cluster;
# - monitoring.coreos.com/v1 PodMonitor and PrometheusRule (prometheus-operator
#   pkg/apis/monitoring/v1 podmonitor_types.go and prometheusrule_types.go).


def volume_snapshot_class(p, w, d):
    only_keys(p, w, d, {"apiVersion", "kind", "metadata", "driver", "deletionPolicy", "parameters"})
    check_meta(p, w, d, namespaced=False)
    expect(p, w, isinstance(d.get("driver"), str) and d["driver"], "driver is required")
    expect(p, w, d.get("deletionPolicy") in ("Delete", "Retain"), "deletionPolicy must be Delete or Retain")
    params = d.get("parameters", {})
    expect(p, w, isinstance(params, dict) and all(isinstance(v, str) for v in params.values()),
           "parameters must map strings to strings")


def volume_snapshot(p, w, d):
    only_keys(p, w, d, {"apiVersion", "kind", "metadata", "spec"})
    check_meta(p, w, d, namespaced=True)
    spec = d.get("spec")
    if only_keys(p, f"{w} spec", spec, {"source", "volumeSnapshotClassName"}):
        src = spec.get("source")
        if only_keys(p, f"{w} spec.source", src, {"persistentVolumeClaimName", "volumeSnapshotContentName"}):
            expect(p, w, len(src) == 1 and all(isinstance(v, str) for v in src.values()),
                   "spec.source names exactly one of persistentVolumeClaimName, volumeSnapshotContentName")


def reclaim_space_cron_job(p, w, d):
    only_keys(p, w, d, {"apiVersion", "kind", "metadata", "spec"})
    check_meta(p, w, d, namespaced=True)
    spec = d.get("spec")
    if not only_keys(p, f"{w} spec", spec, {"schedule", "startingDeadlineSeconds", "concurrencyPolicy",
                                            "suspend", "jobTemplate", "successfulJobsHistoryLimit",
                                            "failedJobsHistoryLimit"}):
        return
    expect(p, w, isinstance(spec.get("schedule"), str) and spec["schedule"], "spec.schedule is required")
    expect(p, w, spec.get("concurrencyPolicy", "Forbid") in ("Forbid", "Replace"),
           "spec.concurrencyPolicy must be Forbid or Replace")
    for k in ("successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        v = spec.get(k, 0)
        expect(p, w, isinstance(v, int) and 0 <= v <= 60, f"spec.{k} must be 0..60")
    jt = spec.get("jobTemplate")
    if not only_keys(p, f"{w} spec.jobTemplate", jt, {"metadata", "spec"}):
        return
    js = jt.get("spec")
    if not only_keys(p, f"{w} spec.jobTemplate.spec", js,
                     {"target", "backOffLimit", "retryDeadlineSeconds", "timeout", "operations"}):
        return
    target = js.get("target")
    if only_keys(p, f"{w} spec.jobTemplate.spec.target", target, {"persistentVolumeClaim"}):
        expect(p, w, is_name(target.get("persistentVolumeClaim")),
               "spec.jobTemplate.spec.target.persistentVolumeClaim is required")
    expect(p, w, isinstance(js.get("backOffLimit", 0), int) and 0 <= js.get("backOffLimit", 0) <= 60,
           "backOffLimit must be 0..60")
    expect(p, w, isinstance(js.get("retryDeadlineSeconds", 0), int) and 0 <= js.get("retryDeadlineSeconds", 0) <= 1800,
           "retryDeadlineSeconds must be 0..1800")
    if "timeout" in js:
        expect(p, w, isinstance(js["timeout"], int) and js["timeout"] >= 60, "timeout must be >= 60")


def pod_monitor(p, w, d):
    only_keys(p, w, d, {"apiVersion", "kind", "metadata", "spec"})
    check_meta(p, w, d, namespaced=True)
    spec = d.get("spec")
    if not only_keys(p, f"{w} spec", spec, {"selector", "podMetricsEndpoints", "namespaceSelector",
                                            "jobLabel", "podTargetLabels"}):
        return
    expect(p, w, isinstance(spec.get("selector"), dict), "spec.selector is required")
    eps = spec.get("podMetricsEndpoints") or []
    expect(p, w, eps, "spec.podMetricsEndpoints is required")
    for i, e in enumerate(eps):
        ew = f"{w} spec.podMetricsEndpoints[{i}]"
        if only_keys(p, ew, e, {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings",
                                "metricRelabelings", "honorLabels"}):
            expect(p, ew, isinstance(e.get("port"), str) and e["port"], "port (a container port's name) is required")


def prometheus_rule(p, w, d):
    only_keys(p, w, d, {"apiVersion", "kind", "metadata", "spec"})
    check_meta(p, w, d, namespaced=True)
    spec = d.get("spec")
    if not only_keys(p, f"{w} spec", spec, {"groups"}):
        return
    for i, g in enumerate(spec.get("groups") or []):
        gw = f"{w} spec.groups[{i}]"
        if not only_keys(p, gw, g, {"name", "interval", "rules", "limit"}):
            continue
        expect(p, gw, isinstance(g.get("name"), str) and g["name"], "name is required")
        for j, r in enumerate(g.get("rules") or []):
            rw = f"{gw} rules[{j}]"
            if only_keys(p, rw, r, {"alert", "record", "expr", "for", "labels", "annotations",
                                    "keep_firing_for"}):
                expect(p, rw, ("alert" in r) != ("record" in r), "exactly one of alert, record")
                expect(p, rw, isinstance(r.get("expr"), str) and r["expr"].strip(), "expr is required")


def kustomization(p, w, d, f):
    """kustomize.config.k8s.io/v1beta1 Kustomization and v1alpha1 Component
    (sigs.k8s.io/kustomize api/types/kustomization.go), as far as used here."""
    want = {"Kustomization": "kustomize.config.k8s.io/v1beta1",
            "Component": "kustomize.config.k8s.io/v1alpha1"}[d["kind"]]
    expect(p, w, d.get("apiVersion") == want, f"apiVersion must be {want}")
    expect(p, w, f.name == "kustomization.yaml", "must be a directory's kustomization.yaml")
    only_keys(p, w, d, {"apiVersion", "kind", "resources", "components", "patches", "images",
                        "replacements", "namespace", "configMapGenerator", "generatorOptions"})
    for r in d.get("resources", []):
        expect(p, w, (f.parent / r).exists(), f"resource {r} does not exist")
    for c in d.get("components", []):
        k = f.parent / c / "kustomization.yaml"
        expect(p, w, k.is_file() and (yaml.safe_load(k.read_text()) or {}).get("kind") == "Component",
               f"component {c} is not a directory with a Component kustomization.yaml")
    for patch in d.get("patches", []):
        if only_keys(p, f"{w} patch", patch, {"path", "target"}):
            expect(p, w, (f.parent / patch.get("path", "")).is_file(), f"patch {patch.get('path')} does not exist")
    for i, img in enumerate(d.get("images", [])):
        if only_keys(p, f"{w} images[{i}]", img, {"name", "newName", "newTag", "digest"}):
            expect(p, w, isinstance(img.get("name"), str) and img["name"], f"images[{i}] needs a name")
            if "digest" in img:
                expect(p, w, re.fullmatch(r"sha256:[0-9a-f]{64}", str(img["digest"])),
                       f"images[{i}] digest must be sha256:<64 hex>")
    for i, r in enumerate(d.get("replacements", [])):
        rw = f"{w} replacements[{i}]"
        if not only_keys(p, rw, r, {"source", "targets"}):
            continue
        only_keys(p, f"{rw} source", r.get("source"), {"kind", "name", "namespace", "fieldPath", "group", "version"})
        for j, t in enumerate(r.get("targets") or []):
            if only_keys(p, f"{rw} targets[{j}]", t, {"select", "reject", "fieldPaths", "options"}):
                expect(p, rw, t.get("fieldPaths"), f"targets[{j}] names no fieldPaths")
                only_keys(p, f"{rw} targets[{j}] options", t.get("options", {}), {"delimiter", "index", "create"})


def patch_files():
    """Strategic merge patches the Kustomizations and Components name:
    partial objects, checked in what they render into instead of against a
    schema."""
    out = set()
    for f, _, d in manifests():
        if d.get("kind") in ("Kustomization", "Component"):
            out.update((f.parent / x["path"]).resolve() for x in d.get("patches", []) if "path" in x)
    return out


def local_config(d):
    """A document kustomize reads and leaves out of what it renders."""
    ann = (d.get("metadata") or {}).get("annotations") or {}
    return ann.get("config.kubernetes.io/local-config") == "true"


def strategic_patch(p, w, d):
    """A patch names an object the base renders, by kind, name and namespace
    (a patch of something missing would make it, half)."""
    key = (d.get("kind"), d.get("metadata", {}).get("name"), d.get("metadata", {}).get("namespace"))
    base = renders()["base"]
    expect(p, w, any((b.get("kind"), b["metadata"].get("name"), b["metadata"].get("namespace")) == key for b in base),
           f"patches {key}, which the base does not render")


def kind_cluster(p, w, d):
    only_keys(p, w, d, {"apiVersion", "kind", "name", "nodes", "networking", "featureGates",
                        "runtimeConfig", "containerdConfigPatches"})
    nodes = d.get("nodes") or []
    expect(p, w, nodes, "nodes is required")
    for i, n in enumerate(nodes):
        nw = f"{w} nodes[{i}]"
        if not only_keys(p, nw, n, {"role", "image", "extraMounts", "extraPortMappings", "labels",
                                    "kubeadmConfigPatches"}):
            continue
        expect(p, nw, n.get("role") in ("control-plane", "worker"), "role must be control-plane or worker")
        for j, m in enumerate(n.get("extraMounts", [])):
            mw = f"{nw} extraMounts[{j}]"
            if only_keys(p, mw, m, {"hostPath", "containerPath", "readOnly", "selinuxRelabel", "propagation"}):
                for k in ("hostPath", "containerPath"):
                    expect(p, mw, isinstance(m.get(k), str) and m[k].startswith("/"), f"{k} must be an absolute path")
                expect(p, mw, m.get("propagation", "None") in ("None", "HostToContainer", "Bidirectional"),
                       "propagation must be None, HostToContainer or Bidirectional")


def snapshot_metadata_service(p, w, d):
    # external-snapshot-metadata v1.1.0
    # client/config/crd/cbt.storage.k8s.io_snapshotmetadataservices.yaml:
    # cluster-scoped; spec.address, spec.audience and spec.caCert (bytes)
    # all required.
    only_keys(p, w, d, {"apiVersion", "kind", "metadata", "spec"})
    check_meta(p, w, d, namespaced=False)
    spec = d.get("spec") or {}
    only_keys(p, w + " spec", spec, {"address", "audience", "caCert"})
    for k in ("address", "audience", "caCert"):
        expect(p, w, isinstance(spec.get(k), str) and spec[k], f"spec.{k} is required")
    try:
        pem = base64.b64decode(spec.get("caCert", ""), validate=True).decode()
        expect(p, w, pem.startswith("-----BEGIN CERTIFICATE-----"), "spec.caCert must be a base64 PEM certificate")
    except Exception as e:
        p.append(f"{w}: spec.caCert is not base64: {e}")


STRUCTURAL = {
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"): volume_snapshot_class,
    # external-snapshotter v8.6.0 client/config/crd/
    # groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml: v1 has
    # the same fields as a VolumeSnapshotClass.
    ("groupsnapshot.storage.k8s.io/v1", "VolumeGroupSnapshotClass"): volume_snapshot_class,
    ("cbt.storage.k8s.io/v1beta1", "SnapshotMetadataService"): snapshot_metadata_service,
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshot"): volume_snapshot,
    ("csiaddons.openshift.io/v1alpha1", "ReclaimSpaceCronJob"): reclaim_space_cron_job,
    ("kind.x-k8s.io/v1alpha4", "Cluster"): kind_cluster,
    ("monitoring.coreos.com/v1", "PodMonitor"): pod_monitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): prometheus_rule,
}


def validate(doc, version):
    """kubernetes-validate's verdict: None, or the error text."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
        return None
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(x) for x in e.path)
        return f"{path}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError:
        return f"no schema for {doc.get('apiVersion')} {doc.get('kind')}"


@check("kubernetes-validate rejects a misspelled field (strict mode really checks)")
def _():
    bad = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "x", "namespace": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [
                {"name": "v", "mountPath": "/v", "mountPropogation": "Bidirectional"}]}]}}},
    }
    good = {**bad, "spec": {**bad["spec"], "template": {**bad["spec"]["template"], "spec": {
        "containers": [{"name": "c", "image": "i", "volumeMounts": [
            {"name": "v", "mountPath": "/v", "mountPropagation": "Bidirectional"}]}]}}}}
    p = []
    for v in KUBERNETES_VERSIONS:
        if validate(bad, v) is None:
            p.append(f"{v}: a DaemonSet with `mountPropogation` passed")
        err = validate(good, v)
        if err is not None:
            p.append(f"{v}: the corrected DaemonSet failed: {err}")
    return p


def check_document(p, w, doc, _cache={}):
    """A full object: the Kubernetes schemas (strict), or its CRD's
    structure. Identical documents (the same object in several renders) are
    checked once."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in STRUCTURAL:
        STRUCTURAL[key](p, w, doc)
        return
    text = json.dumps(doc, sort_keys=True)
    if text not in _cache:
        _cache[text] = [f"Kubernetes {v}: {err}" for v in KUBERNETES_VERSIONS if (err := validate(doc, v))]
    p.extend(f"{w}: {e}" for e in _cache[text])


def doc_name(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


@check("kustomize: the base, every overlay and every combination of components render")
def _():
    p = []
    kubectl()
    comps = components()
    expect(p, "deploy/kubernetes/overlays", len(targets()) > 1, "has no overlay")
    expect(p, "deploy/kubernetes/components", comps, "has no component")
    for name, docs in renders().items():
        kinds = {}
        for d in docs:
            kinds[d.get("kind")] = kinds.get(d.get("kind"), 0) + 1
        print(f"     {name}: {len(docs)} objects ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
        names = [(d.get("kind"), (d.get("metadata") or {}).get("namespace"), (d.get("metadata") or {}).get("name"))
                 for d in docs]
        expect(p, name, len(names) == len(set(names)), "renders an object twice")
        for d in docs:
            expect(p, name, not local_config(d), f"renders {doc_name(d)}, a local-config object kustomize should drop")
    return p


@check(f"rendered: every object passes the Kubernetes {' and '.join(KUBERNETES_VERSIONS)} schemas (strict), or its CRD's structure")
def _():
    p = []
    for name, docs in renders().items():
        with_components = " + " in name
        for i, doc in enumerate(docs):
            w = f"[{name}][{i}] {doc_name(doc)}"
            check_document(p, w, doc)
            # The base and the overlays install on a cluster without the
            # snapshot, CSI-Addons and Prometheus CRDs.
            expect(p, w, with_components or doc.get("kind") not in CRD_KINDS,
                   "needs another project's CRD: it belongs in a component")
    return p


@check("sources: Kustomizations, Components, patches, kind's cluster and the examples")
def _():
    p = []
    docs = manifests()
    if not docs:
        return ["no manifests found under deploy/kubernetes"]
    patches = patch_files()
    used = set(patches)
    for f, _, d in docs:
        if d.get("kind") in ("Kustomization", "Component"):
            used.update((f.parent / r).resolve() for r in d.get("resources", []))
    for f, i, doc in docs:
        w = f"{rel(f)}[{i}] {doc_name(doc)}"
        key = (doc.get("apiVersion"), doc.get("kind"))
        if f.resolve() in patches:
            strategic_patch(p, w, doc)
        elif key[1] in ("Kustomization", "Component"):
            kustomization(p, w, doc, f)
        elif key[1] == "Cluster" or f.parent.name == "examples":
            check_document(p, w, doc)
        else:
            # Everything else is a resource of a kustomization; the renders
            # check it as installed.
            expect(p, w, f.resolve() in used, "is named by no kustomization (examples go to examples/)")
    kinds = {d.get("kind") for _, _, d in docs}
    for want in ("ReclaimSpaceCronJob", "PersistentVolumeClaim", "Pod", "VolumeSnapshot", "Cluster"):
        expect(p, "deploy/kubernetes", want in kinds, f"has no {want}")
    return p


@check("scripts/cluster-tls.sh: its Secrets and SnapshotMetadataService pass the schemas")
def _():
    p = []
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([str(ROOT / "scripts" / "cluster-tls.sh"), tmp, "--days", "2"],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            return [f"exit {out.returncode}: {out.stderr}"]
        kinds = []
        for f in ("secrets.yaml", "snapshot-metadata.yaml"):
            for i, doc in enumerate(yaml.safe_load_all(pathlib.Path(tmp, f).read_text())):
                kinds.append(doc.get("kind"))
                check_document(p, f"{f}[{i}] {doc_name(doc)}", doc)
        expect(p, "cluster-tls.sh", sorted(kinds) == ["Secret", "Secret", "Secret", "SnapshotMetadataService"],
               f"writes {kinds}: three Secrets and a SnapshotMetadataService")
    return p


@check("kubelet directory: one value in base/settings.yaml, and every render names only it")
def _():
    p = []
    other = "/var/lib/k0s/kubelet"
    with tempfile.TemporaryDirectory(prefix="thinpool-kubelet-dir-") as tmp:
        copy = pathlib.Path(tmp) / "kubernetes"
        shutil.copytree(DEPLOY, copy, symlinks=True)
        settings = copy / "base" / "settings.yaml"
        text = settings.read_text()
        new, n = re.subn(r"(?m)^(  kubeletDir: ).*$", rf"\g<1>{other}", text)
        if n != 1:
            return ["base/settings.yaml has no `  kubeletDir: ` line"]
        settings.write_text(new)
        for t in targets(copy):
            docs = render(t, components(copy))
            where = f"{t.relative_to(copy)} + every component, kubeletDir {other}"
            strings = []

            def walk(x):
                if isinstance(x, dict):
                    for v in x.values():
                        walk(v)
                elif isinstance(x, list):
                    for v in x:
                        walk(v)
                elif isinstance(x, str):
                    strings.append(x)

            walk(docs)
            stale = [x for x in strings if "/var/lib/kubelet" in x]
            expect(p, where, not stale, f"still names /var/lib/kubelet: {stale}")
            named = [x for x in strings if other in x]
            # socket-dir, registration-dir and kubelet-dir host paths, the
            # driver's mount, KUBELET_DIR of the registrar and csi-addons,
            # allowed_roots.
            expect(p, where, len(named) >= 7, f"names {other} in {len(named)} places, expected 7: {named}")
            for d in docs:
                if d.get("kind") == "ConfigMap" and "config.toml" in (d.get("data") or {}):
                    roots = tomllib.loads(d["data"]["config.toml"]).get("allowed_roots")
                    expect(p, where, roots == [other], f"config.toml allowed_roots is {roots}, not [{other!r}]")
    return p


@check("manifests: the example claims mount a filesystem volume and a raw block volume")
def _():
    p = []
    claims = {}
    pods = []
    for f, _, d in manifests():
        if d.get("kind") == "PersistentVolumeClaim" and f.parent.name == "examples":
            claims[d["metadata"]["name"]] = d["spec"].get("volumeMode", "Filesystem")
        if d.get("kind") == "Pod" and f.parent.name == "examples":
            pods.append(d)
    used = set()
    for pod in pods:
        vols = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["spec"].get("volumes", [])}
        for c in pod["spec"]["containers"]:
            for m in c.get("volumeMounts", []):
                if vols.get(m["name"]) in claims:
                    used.add(("Filesystem", claims[vols[m["name"]]]))
            for m in c.get("volumeDevices", []):
                if vols.get(m["name"]) in claims:
                    used.add(("Block", claims[vols[m["name"]]]))
    expect(p, "examples", ("Filesystem", "Filesystem") in used, "no pod mounts a Filesystem claim")
    expect(p, "examples", ("Block", "Block") in used, "no pod uses a Block claim as a raw device")
    return p


def split_image(image):
    """(repository, tag) of `repo[:tag][@digest]`."""
    image = image.split("@", 1)[0]
    repo, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, ""
    return repo, tag


@check("sidecars: images pinned to the checked release, every flag exists in it, in every render")
def _():
    p = []
    seen = set()
    for name, docs in renders().items():
        pods = []
        for kind in ("DaemonSet", "Deployment"):
            found = [d for d in docs if d.get("kind") == kind]
            if len(found) != 1:
                p.append(f"[{name}]: expected one {kind}, found {len(found)}")
            pods.extend((kind, d) for d in found)
        containers = [(kind, c) for kind, d in pods for c in d["spec"]["template"]["spec"]["containers"]]
        for kind, c in containers:
            w = f"[{name}] {kind} {c['name']}"
            if not c.get("image"):
                p.append(f"{w}: no image (a patch that names a container the {kind} lacks makes half of one)")
                continue
            repo, tag = split_image(c["image"])
            if repo == DRIVER_IMAGE:
                continue
            if repo not in SIDECARS:
                p.append(f"{w}: image {c['image']} has no entry in SIDECARS")
                continue
            seen.add(repo)
            pinned, flags = SIDECARS[repo]
            expect(p, w, tag == pinned, f"image tag {tag} differs from the checked {pinned}: re-read its flags")
            for a in c.get("args", []):
                m = re.fullmatch(r"--?([a-z0-9-]+)(=.*)?", a)
                if not m:
                    p.append(f"{w}: argument {a!r} is not a --flag[=value]")
                elif m.group(1) not in flags:
                    p.append(f"{w}: {repo}:{pinned} has no flag --{m.group(1)}")
    for repo in SIDECARS:
        expect(p, "renders", repo in seen, f"no render runs {repo}")
    return p


# ---------------------------------------------------------------------------
# Vagrant


@check("vagrant/Vagrantfile: Ruby syntax, script paths, and the test command CI runs")
def _():
    vf = ROOT / "vagrant" / "Vagrantfile"
    text = vf.read_text()
    p = []
    ruby = shutil.which("ruby")
    if ruby is None:
        p.append("ruby is not installed (apt-get install ruby): the Vagrantfile's syntax was not checked")
    else:
        r = subprocess.run([ruby, "-c", str(vf)], capture_output=True, text=True)
        if r.returncode != 0 or "Syntax OK" not in r.stdout:
            p.append(f"ruby -c: {r.stdout.strip()} {r.stderr.strip()}")
    paths = set(re.findall(r"(?<![\w/.])(?:\.ci|scripts|config)/[A-Za-z0-9_.-]+", text))
    for s in sorted(paths):
        f = ROOT / s
        expect(p, "Vagrantfile", f.is_file(), f"names {s}, which does not exist")
        if s.startswith(("scripts/", ".ci/")):
            expect(p, "Vagrantfile", f.is_file() and f.stat().st_mode & 0o111, f"{s} is not executable")
    ci = (ROOT / ".ci" / "run").read_text()
    expect(p, "Vagrantfile", ".ci/run" in paths and re.search(r"^exec scripts/test\.sh", ci, re.M),
           "must run .ci/run, which must exec scripts/test.sh: the VM runs what CI runs")
    return p


print(f"packaging: {passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
