#!/bin/sh
# Java 17 for Spark (the warm-up job and its tests), and the Java peers of the
# real-broker tests, `sidecar demo --broker` and `make bench`'s broker scenario:
# Apache Kafka, its log4j2 binding and the stand-in remote storage manager
# (tests/kafka/), fetched from Maven Central and built once into
# tests/kafka/target/lib/ (ignored). Java 17+ and Maven are installed from Debian
# when missing.
set -eu
here=$(dirname "$0")
command -v java >/dev/null 2>&1 || sh "$here/apt-install.sh" openjdk-17-jdk-headless
command -v javac >/dev/null 2>&1 || sh "$here/apt-install.sh" openjdk-17-jdk-headless
command -v mvn >/dev/null 2>&1 || sh "$here/apt-install.sh" maven
cd "$here/../tests/kafka"
# Copied afresh: copy-dependencies only adds, so a version changed in pom.xml
# would leave the old jars beside the new ones on the broker's classpath.
rm -rf target/lib
mvn -B -q package
touch target/.fetched
