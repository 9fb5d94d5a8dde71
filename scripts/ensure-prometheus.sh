#!/bin/sh
# The observability tests run Debian's Prometheus (and its promtool) against a
# live sidecar. Install the `prometheus` package only when either is missing,
# without letting dpkg start the system service: the tests run their own
# instance on a free loopback port with storage in a temporary directory.
set -eu
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "ensure-prometheus: prometheus is missing and this user cannot install it; install the 'prometheus' package" >&2
        exit 1
    fi
fi
echo "ensure-prometheus: installing prometheus (and promtool) from Debian" >&2
# policy-rc.d exit 101 keeps dpkg from starting prometheus.service on install.
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
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# Belt and braces: if a service manager started it anyway, stop it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $SUDO systemctl stop prometheus || true
fi
command -v prometheus >/dev/null
command -v promtool >/dev/null
