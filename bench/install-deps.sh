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

# The harness runs its own nginx instances as child processes.
bash "$(dirname "$0")/../scripts/apt-install.sh" "${missing[@]}"
command -v nginx >/dev/null
command -v wrk >/dev/null
