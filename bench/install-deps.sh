#!/usr/bin/env bash
# Installs what the benchmark harness needs from Debian: nginx-light (with the
# echo module: echo_sleep / echo_exec) and wrk. Idempotent: installs only what
# is missing, and never starts (or leaves running) the system nginx service.
set -euo pipefail

missing=()
command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
# nginx may be present without the echo module (e.g. nginx-core without extras).
if command -v nginx >/dev/null 2>&1 \
    && ! ls /usr/lib/nginx/modules/ngx_http_echo_module.so >/dev/null 2>&1; then
    missing+=(libnginx-mod-http-echo)
fi

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "bench: installing ${missing[*]}" >&2
# policy-rc.d exit 101 keeps dpkg from starting the nginx service on install;
# the harness runs its own nginx instances as child processes.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    created_policy=1
fi
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        $SUDO rm -f "$policy"
    fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

# Belt and braces: if a service manager started nginx anyway, stop it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
    $SUDO systemctl stop nginx || true
fi

command -v nginx >/dev/null
command -v wrk >/dev/null
