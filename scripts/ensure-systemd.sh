#!/bin/sh
# The deployment-file tests run `systemd-analyze verify` on deploy/systemd/kafka-sidecar.service.
set -eu
if ! command -v systemd-analyze >/dev/null 2>&1; then
    sh "$(dirname "$0")/apt-install.sh" systemd
fi
