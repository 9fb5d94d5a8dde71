#!/bin/sh
# The whole suite as two pytest processes side by side: the tests that start
# JVMs (Spark, the Kafka broker), the install and the demo in one, all the
# others in the other. Most of a test's time here is waiting (for a JVM to
# start, a server to answer, a timeout to pass), so two at once on two cores
# take about three quarters of the time of one after the other. Either failing
# fails the run; the JVM half's output is printed after the other's.
# Usage: scripts/pytest-pair.sh PYTEST [ARGS...] (ARGS go to both).
set -u
pytest=$1
shift
jvm="tests/functional/test_warm_spark.py tests/functional/test_capacity.py
tests/functional/test_real_broker.py tests/functional/test_broker_demo.py
tests/functional/test_plugin_chunk_cache.py tests/functional/test_deploy_warmup.py
tests/functional/test_install.py tests/functional/test_demo.py"
ignored=""
for file in $jvm; do
    ignored="$ignored --ignore=$file"
done
mkdir -p test-artifacts
log=test-artifacts/pytest-jvm-half.log
# shellcheck disable=SC2086 # word splitting of the file lists is meant
"$pytest" "$@" $jvm >"$log" 2>&1 &
half=$!
trap 'kill "$half" 2>/dev/null' INT TERM
# shellcheck disable=SC2086
"$pytest" "$@" $ignored
others=$?
wait "$half"
jvm_status=$?
echo "---- the tests that start JVMs, the install and the demo ($log):"
cat "$log"
[ "$others" -eq 0 ] && [ "$jvm_status" -eq 0 ]
