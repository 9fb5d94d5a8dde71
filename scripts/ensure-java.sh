#!/bin/sh
# Spark (the warm-up job and its tests) needs a Java 17+ runtime. Install the
# headless JRE from Debian's packages only when no `java` is on the PATH.
set -eu
if command -v java >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "ensure-java: java is missing and this user cannot install it; install openjdk-17-jre-headless" >&2
        exit 1
    fi
fi
echo "ensure-java: installing openjdk-17-jre-headless (Spark needs Java 17)" >&2
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y openjdk-17-jre-headless
