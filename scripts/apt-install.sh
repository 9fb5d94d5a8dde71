#!/bin/sh
# Install Debian packages for the project's tests and benchmarks, never letting
# dpkg start a service they ship (nginx, prometheus): the tests run their own
# instances on loopback ports. Callers decide what is missing; this installs.
set -eu
[ "$#" -gt 0 ] || { echo "usage: apt-install.sh PACKAGE..." >&2; exit 2; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "apt-install: cannot install $* as this user; install them and retry" >&2
        exit 1
    fi
fi
echo "apt-install: installing $* from Debian" >&2
# policy-rc.d exit 101 keeps dpkg from starting services on install.
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
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
