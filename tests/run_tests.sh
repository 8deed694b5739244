#!/usr/bin/env bash
# Runs every test binary, each with a time limit, and sums their "N passed, N failed[, N skipped]"
# lines. A test reports what it did not run with "SKIP <kind>: <reason>" lines; the summary lists them.
# PDDE_REQUIRE_ALL=1 (CI, where PoCL and network namespaces exist) turns an "opencl" or "netns" skip
# into a failure. PDDE_TEST_FAIL_FAST=1 stops at the first failing binary (the mutation suite).
set -u
build=$1; shift
total_pass=0; total_fail=0; total_skip=0; skips=""
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
    s=$(grep -cE '^SKIP ' "$log")
    while IFS= read -r reason; do
        [ -n "$reason" ] || continue
        skips+="  $name: ${reason#SKIP }"$'\n'
        if [ "${PDDE_REQUIRE_ALL:-0}" = 1 ] && [[ "$reason" =~ ^SKIP\ (opencl|netns): ]]; then
            f=$((f + 1)); echo "FAIL $name: PDDE_REQUIRE_ALL=1 and it skipped: ${reason#SKIP }"
        fi
    done < <(grep -E '^SKIP ' "$log")
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
    printf '%-28s %4d passed %3d failed %2d skipped  (%ds, rc=%d)\n' "$name" "$p" "$f" "$s" $(( $(date +%s) - start )) $rc
    if [ "$f" -ne 0 ]; then
        grep -E 'FAIL|rror|Sanitizer|runtime error' "$log" | head -20
        if [ "${PDDE_TEST_FAIL_FAST:-0}" = 1 ]; then echo "stopping at the first failing test (PDDE_TEST_FAIL_FAST=1)"; break; fi
    fi
done
if [ -n "$skips" ]; then printf 'skipped:\n%s' "$skips"; fi
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
