#!/bin/sh
# The whole suite as three pytest processes side by side: the tests that start
# JVMs (Spark, the Kafka broker) in one; the install, the demo and every other
# file of the rest of tests/functional (in name order: the 1st, 3rd, 5th...)
# in the second; the other files of tests/functional, the unit tests and the
# fuzz corpus in the third. Most of a test's time here is waiting (for a JVM
# to start, a server to answer, a timeout to pass): on two cores the suite
# used about one of them with two processes, and took 18 minutes on a slower
# machine of this kind. A new test file goes to one of the last two by its
# name, with no list to keep. Any process failing fails the run; the outputs
# of the first two are printed after the third's.
# Usage: scripts/pytest-split.sh PYTEST [ARGS...] (ARGS go to all three).
set -u
pytest=$1
shift
jvm="tests/functional/test_warm_spark.py tests/functional/test_capacity.py
tests/functional/test_real_broker.py tests/functional/test_broker_demo.py
tests/functional/test_plugin_chunk_cache.py tests/functional/test_deploy_warmup.py"
# About 80 s between them, whichever process they are in.
second="tests/functional/test_install.py tests/functional/test_demo.py"
ignored=""
for file in $jvm $second; do
    ignored="$ignored --ignore=$file"
done
listed=" $(echo $jvm $second) "
turn=0
for file in tests/functional/test_*.py; do
    case "$listed" in
        *" $file "*) continue ;;
    esac
    if [ "$turn" -eq 0 ]; then
        second="$second $file"
        ignored="$ignored --ignore=$file"
    fi
    turn=$((1 - turn))
done
mkdir -p test-artifacts
jvm_log=test-artifacts/pytest-jvm-half.log
second_log=test-artifacts/pytest-functional-half.log
# shellcheck disable=SC2086 # word splitting of the file lists is meant
"$pytest" "$@" $jvm >"$jvm_log" 2>&1 &
jvm_pid=$!
# shellcheck disable=SC2086
"$pytest" "$@" $second >"$second_log" 2>&1 &
second_pid=$!
trap 'kill "$jvm_pid" "$second_pid" 2>/dev/null' INT TERM
# shellcheck disable=SC2086
"$pytest" "$@" $ignored
others=$?
wait "$second_pid"
second_status=$?
wait "$jvm_pid"
jvm_status=$?
echo "---- the install, the demo and every other file of tests/functional ($second_log):"
cat "$second_log"
echo "---- the tests that start JVMs ($jvm_log):"
cat "$jvm_log"
[ "$others" -eq 0 ] && [ "$second_status" -eq 0 ] && [ "$jvm_status" -eq 0 ]
