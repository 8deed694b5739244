#!/usr/bin/env bash
# Bad input gets an error, never a crash: every function pdde.h declares (tests/api_null_sweep.py reads
# them, so a new one is covered too), called with every pointer NULL and every other argument zero, in
# a child process of its own, returns within 10 s. One check per function.
# Run from the repository root: build/test_api_null.
. tests/script_util.sh api-null
MIN_FUNCTIONS=300   # pdde.h declares about 320: fewer means the generator stopped reading it

n=$(python3 tests/api_null_sweep.py pdde.h "$tmp/sweep.c" 2>"$tmp/gen.log"); rc=$?
check "tests/api_null_sweep.py reads pdde.h ($(head -3 "$tmp/gen.log"))" $rc
[ "${n:-0}" -ge $MIN_FUNCTIONS ] 2>/dev/null; check "it calls at least $MIN_FUNCTIONS functions (${n:-none})" $?
# the compiler, flags and libraries of this build's C tests (written by make beside this script)
mapfile -t flags <"$0.flags"
# shellcheck disable=SC2086 # (the flags, words apart)
${flags[0]} -O0 "$tmp/sweep.c" -o "$tmp/sweep" "$build/libpdde.a" ${flags[1]} >"$tmp/cc.log" 2>&1
rc=$?
check "the calls compile against $build/libpdde.a ($(head -3 "$tmp/cc.log"))" $rc
[ $rc = 0 ] || { finish; exit; }

# in an empty folder of its own: a NULL path must not become a file named "(null)" there
mkdir "$tmp/cwd"
(cd "$tmp/cwd" && "$tmp/sweep") >"$tmp/run.log"; rc=$?
check "the sweep ran to its end (exit $rc)" $rc
left=$(ls -A "$tmp/cwd" | head -5 | tr '\n' ' ')
[ -z "$left" ]; check "the calls wrote no files ($left)" $?
ran=0
while read -r name how code; do
    ran=$((ran + 1))
    [ "$how $code" = "exit 0" ]; rc=$?
    check "$name with NULL pointers and zeros returns ($how $code$([ "$how $code" = "signal 14" ] && echo ': the alarm, over 10 s'))" $rc
done <"$tmp/run.log"
[ "$ran" = "$n" ]; check "every function was called ($ran of $n)" $?
finish
