#!/bin/sh
# The real-client tests (tests/functional/test_real_clients.py) drive the aws
# cli, rclone and s3cmd against a sidecar; Debian ships all three.
set -eu
missing=""
command -v aws >/dev/null 2>&1 || missing="$missing awscli"
command -v rclone >/dev/null 2>&1 || missing="$missing rclone"
command -v s3cmd >/dev/null 2>&1 || missing="$missing s3cmd"
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086  # one word per package
    sh "$(dirname "$0")/apt-install.sh" $missing
fi
