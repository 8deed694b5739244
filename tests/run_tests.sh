#!/usr/bin/env bash
# Runs every test binary, each with a time limit, and sums their "N passed, N failed" lines.
set -u
build=$1; shift
total_pass=0; total_fail=0
for t in "$@"; do
    name=$(basename "$(dirname "$t")")/$(basename "$t"); name=${name#"$(basename "$build")/"}
    log="$t.log"
    start=$(date +%s)
    timeout --signal=KILL "${PDDE_TEST_TIMEOUT:-300}" "$t" >"$log" 2>&1
    rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    p=0; f=0
    if [ -n "$line" ]; then p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}'); fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # a crash or timeout counts as a failure
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
    printf '%-28s %4d passed %3d failed  (%ds, rc=%d)\n' "$name" "$p" "$f" $(( $(date +%s) - start )) $rc
    if [ "$f" -ne 0 ]; then sed -n '1,60p' "$log" | grep -E 'FAIL|rror|Sanitizer|runtime error' | head -20; fi
done
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
