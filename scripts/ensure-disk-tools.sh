#!/bin/sh
# The cache-disk fault tests make a file system on a loop device (mkfs.ext4 from
# e2fsprogs; mount, losetup and fallocate from util-linux and mount).
set -eu
missing=""
command -v mkfs.ext4 >/dev/null 2>&1 || missing="$missing e2fsprogs"
command -v losetup >/dev/null 2>&1 || missing="$missing util-linux"
command -v fallocate >/dev/null 2>&1 || missing="$missing util-linux"
command -v mount >/dev/null 2>&1 || missing="$missing mount"
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    sh "$(dirname "$0")/apt-install.sh" $(echo $missing | tr ' ' '\n' | sort -u)
fi
