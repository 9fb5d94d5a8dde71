#!/bin/sh
# Spark (the warm-up job and its tests) needs a Java 17+ runtime.
set -eu
command -v java >/dev/null 2>&1 || sh "$(dirname "$0")/apt-install.sh" openjdk-17-jre-headless
