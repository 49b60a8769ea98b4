# shellcheck shell=bash
# Sourced by scripts/csi-sanity.sh and scripts/test.sh: where the optional
# csi-sanity binary is, and how a user gets it. Not run on its own.

# The release of kubernetes-csi/csi-test this project's notes were checked
# against; `go install` of its cmd/csi-sanity builds the binary.
CSI_SANITY_VERSION=v5.6.0

# Prints the csi-sanity binary (CSI_SANITY, else `csi-sanity` on PATH);
# returns 1 when there is none.
csi_sanity_bin() {
    local bin=${CSI_SANITY:-}
    if [[ -z $bin ]]; then
        bin=$(command -v csi-sanity) || return 1
    fi
    [[ -x $bin ]] || return 1
    readlink -f "$bin"
}

# One line saying there is no binary and how to get one.
csi_sanity_missing() {
    local where="no csi-sanity on PATH"
    [[ -n ${CSI_SANITY:-} ]] && where="CSI_SANITY=$CSI_SANITY is not an executable"
    echo "$where. With internet access: go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_SANITY_VERSION (then CSI_SANITY=\$(go env GOPATH)/bin/csi-sanity). The project's own conformance suite (scripts/test.sh vm conformance::) covers its specs."
}
