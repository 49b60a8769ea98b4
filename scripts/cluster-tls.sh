#!/usr/bin/env bash
# The certificates of the channel between the controller and the node
# plugins (deploy/kubernetes/README.md, "Certificates"; docs/cluster.md,
# "The channel"), made with openssl, and the two Secrets that carry them:
#
#   thinpool-csi-node-tls        tls.crt, tls.key: every node plugin's
#                                server certificate (DNS name
#                                thinpool-csi-node); ca.crt: the nodes' CA
#   thinpool-csi-controller-tls  tls.crt, tls.key: the controller's client
#                                certificate; ca.crt: the controller's CA
#
# Two CAs: the nodes' CA signs node plugins only, the controller's CA the
# controller only, and a node takes clients of the controller's CA alone,
# so a node's own certificate opens no other node.
#
# For the snapshot-metadata component, a third CA signs the
# csi-snapshot-metadata sidecar's server certificate (Secret
# thinpool-csi-snapshot-metadata-tls, for the DNS names of its Service),
# and DIR/snapshot-metadata.yaml holds that Secret and the
# SnapshotMetadataService `thinpool.csi.storage.dev`, whose caCert backup
# tools trust.
#
#   scripts/cluster-tls.sh DIR [--days N] [--namespace NS]
#   kubectl apply -f DIR/secrets.yaml
#   kubectl apply -f DIR/snapshot-metadata.yaml    # with that component
#
# DIR keeps the two CAs (ca keys never leave it: keep it safe, or delete
# the keys and make new CAs next time). Run again with the same DIR to
# renew the leaf certificates under the same CAs, apply, then restart the
# controller and the node plugins (`kubectl -n thinpool-csi rollout
# restart deployment/thinpool-csi-controller daemonset/thinpool-csi-node`):
# they read their certificates at start. Every openssl run is bounded.
set -euo pipefail

usage() { echo "usage: $0 DIR [--days N] [--namespace NS]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
dir=$1; shift
days=365
namespace=thinpool-csi
while [[ $# -gt 0 ]]; do
    case $1 in
        --days) days=${2:?}; shift 2 ;;
        --namespace) namespace=${2:?}; shift 2 ;;
        *) usage ;;
    esac
done
[[ $days =~ ^[0-9]+$ && $days -ge 1 ]] || { echo "$0: --days must be a positive number" >&2; exit 2; }
command -v openssl >/dev/null || { echo "$0: openssl is needed" >&2; exit 1; }
mkdir -p "$dir"
umask 077

ossl() { timeout 60 openssl "$@"; }

# ca NAME SUBJECT: DIR/NAME.{key,crt}, kept when they exist.
ca() {
    local name=$1 subject=$2
    if [[ -s $dir/$name.key && -s $dir/$name.crt ]]; then
        echo "cluster-tls: keeping $dir/$name.crt" >&2
        return
    fi
    ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key"
    ossl req -x509 -new -key "$dir/$name.key" -subj "/CN=$subject" -days 3650 \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$dir/$name.crt"
    echo "cluster-tls: made the CA $dir/$name.crt ($subject)" >&2
}

# leaf NAME CA CN EXTENSIONS: DIR/NAME.{key,crt}, always new.
leaf() {
    local name=$1 ca=$2 cn=$3 ext=$4
    ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key"
    ossl req -new -key "$dir/$name.key" -subj "/CN=$cn" -out "$dir/$name.csr"
    printf '%b' "$ext" > "$dir/$name.ext"
    ossl x509 -req -in "$dir/$name.csr" -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" \
        -CAcreateserial -days "$days" -extfile "$dir/$name.ext" -out "$dir/$name.crt" 2>/dev/null
    rm -f "$dir/$name.csr" "$dir/$name.ext"
    echo "cluster-tls: made $dir/$name.crt ($cn, $days days, signed by $ca)" >&2
}

ca nodes-ca "thinpool-csi nodes CA"
ca controller-ca "thinpool-csi controller CA"
ca snapshot-metadata-ca "thinpool-csi snapshot metadata CA"
# Client use too: a node plugin pulls a restore's data from another with
# it (cluster.peer_ca, docs/moving.md).
leaf node nodes-ca thinpool-csi-node \
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:thinpool-csi-node\n"
leaf controller controller-ca thinpool-csi-controller \
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
# components/snapshot-metadata/service.yaml's name, in the namespace.
service=thinpool-csi-snapshot-metadata
leaf snapshot-metadata snapshot-metadata-ca "$service.$namespace" \
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:$service.$namespace,DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.cluster.local\n"

b64() { base64 -w0 < "$1"; }
secret() {
    local name=$1 leafname=$2 ca=$3
    cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $name
  namespace: $namespace
  labels:
    app.kubernetes.io/name: thinpool-csi
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$dir/$leafname.crt")
  tls.key: $(b64 "$dir/$leafname.key")
  ca.crt: $(b64 "$dir/$ca.crt")
YAML
}
{
    secret thinpool-csi-node-tls node nodes-ca
    echo "---"
    secret thinpool-csi-controller-tls controller controller-ca
} > "$dir/secrets.yaml"
echo "cluster-tls: wrote $dir/secrets.yaml (kubectl apply -f $dir/secrets.yaml)" >&2
{
    secret thinpool-csi-snapshot-metadata-tls snapshot-metadata snapshot-metadata-ca
    cat <<YAML
---
# Named after the driver: the sidecar and backup tools look it up so.
apiVersion: cbt.storage.k8s.io/v1beta1
kind: SnapshotMetadataService
metadata:
  name: thinpool.csi.storage.dev
  labels:
    app.kubernetes.io/name: thinpool-csi
spec:
  address: $service.$namespace:6443
  audience: thinpool-csi-snapshot-metadata
  caCert: $(b64 "$dir/snapshot-metadata-ca.crt")
YAML
} > "$dir/snapshot-metadata.yaml"
echo "cluster-tls: wrote $dir/snapshot-metadata.yaml (with the snapshot-metadata component)" >&2
