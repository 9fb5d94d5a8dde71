#!/bin/sh
# The /ui browser test drives Debian's headless Chromium over the DevTools
# protocol (aiohttp's websocket client, no driver library). Install `chromium`
# only when it is missing. chromium-driver (WebDriver) is not needed for that.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "ensure-chromium: chromium is missing and this user cannot install it; install the 'chromium' package" >&2
        exit 1
    fi
fi
echo "ensure-chromium: installing chromium from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
