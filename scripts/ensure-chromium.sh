#!/bin/sh
# The /ui browser test drives Debian's headless Chromium over the DevTools
# protocol (aiohttp's websocket client, no driver library).
set -eu
command -v chromium >/dev/null 2>&1 \
    || sh "$(dirname "$0")/apt-install.sh" chromium fonts-dejavu-core
