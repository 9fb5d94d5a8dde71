#!/bin/sh
# The observability tests run Debian's Prometheus and promtool against a live
# sidecar (their own instance on a free loopback port, storage in a temp dir).
set -eu
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    sh "$(dirname "$0")/apt-install.sh" prometheus
fi
