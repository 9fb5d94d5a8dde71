#!/bin/sh
# The deployment-file tests render deploy/kubernetes with kustomize. Prints the
# command that renders a directory: kubectl's built-in `kubectl kustomize` where
# kubectl is installed, else a standalone kustomize, built once from its Go
# module (Debian's kubectl is too old for kustomize components) into
# $(go env GOPATH)/bin. The version is the one kubectl 1.32 embeds.
set -eu
VERSION=v5.5.0
if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
    echo "kubectl kustomize"
    exit 0
fi
if command -v kustomize >/dev/null 2>&1; then
    echo "kustomize build"
    exit 0
fi
command -v go >/dev/null 2>&1 || { echo "ensure-kustomize: neither kubectl, kustomize nor go is installed" >&2; exit 1; }
bin="$(go env GOPATH)/bin"
if [ ! -x "$bin/kustomize" ]; then
    echo "ensure-kustomize: building kustomize $VERSION into $bin (once)" >&2
    GOBIN="$bin" go install "sigs.k8s.io/kustomize/kustomize/v5@$VERSION" >&2
fi
echo "$bin/kustomize build"
