#!/usr/bin/env bash
# Static checks of the packaging with real parsers from the registries
# (scripts/check_packaging.py): the Dockerfile with buildkit's parser; the
# base, every overlay and every combination of components of
# deploy/kubernetes rendered with `kubectl kustomize` and checked against
# the Kubernetes schemas (it prints the objects of each render); the
# sidecar flags against their pinned releases; the Vagrantfile.
#
#   scripts/check-packaging.sh           # set up the venv if needed, then check
#   scripts/check-packaging.sh --setup   # only set up the venv (CI does this first)
#
# The pinned packages (scripts/packaging-requirements.txt) go into a venv
# under target/ (PACKAGING_VENV), made again when the pins change. Ruby's
# `ruby -c` checks the Vagrantfile's syntax; CI installs Debian's ruby, and
# without it that one check fails, saying so. kubectl (with its kustomize
# v5) renders the manifests; without it the render checks fail, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PACKAGING_VENV:-target/packaging-venv}
req=scripts/packaging-requirements.txt

if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
    echo "check-packaging: installing $req into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$venv/requirements.txt"
fi
[[ ${1:-} == --setup ]] && exit 0
exec "$venv/bin/python" scripts/check_packaging.py "$@"
