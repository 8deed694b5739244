#!/usr/bin/env bash
# make test-mutants: applies each planted bug under tests/mutants/ to a scratch copy of this tree and
# checks that `make test` fails (fail-fast, the tests a mutant names first). A mutant whose snippet is
# no longer in its file is STALE and counts as not killed. Last line: RESULT mutants killed=<n> total=<m>.
# MUTANTS="a b" runs only the mutants whose names contain a or b; PDDE_MUTANT_DIR sets the scratch folder.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$(command -v /usr/bin/python3 || command -v python3)
scratch=${PDDE_MUTANT_DIR:-/tmp/pdde-mutants.$$}
mkdir -p "$scratch"
killed=0; total=0; survivors=""
for mut in "$root"/tests/mutants/*.mut; do
    name=$(basename "$mut" .mut)
    if [ -n "${MUTANTS:-}" ]; then
        match=0; for m in $MUTANTS; do [[ "$name" == *"$m"* ]] && match=1; done
        [ $match = 1 ] || continue
    fi
    total=$((total + 1))
    work="$scratch/$name"; rm -rf "$work"; mkdir -p "$work"
    # the tree as it is now (tracked and untracked files) and its build folder, times kept, so only
    # what the mutant touches is rebuilt
    (cd "$root" && git ls-files -co --exclude-standard -z | tar -cf - --exclude=build/asan --null -T - build) | tar -xf - -C "$work"
    start=$(date +%s)
    "$py" "$root/tests/mutants/apply.py" "$mut" "$work"; rc=$?
    if [ $rc -ne 0 ]; then
        [ $rc -eq 2 ] && verdict=STALE || verdict=MALFORMED
        survivors+=" $name($verdict)"; echo "MUTANT $name $verdict"; rm -rf "$work"; continue
    fi
    first=$("$py" "$root/tests/mutants/apply.py" "$mut" "$work" --tests)
    log="$scratch/$name.log"
    if ! make -C "$work" -s -j2 all >"$log" 2>&1; then
        # a compile error is the mutant's doing; anything else (no fork, disk) is not a verdict
        if grep -q 'error:' "$log"; then verdict="killed (does not build)"; else verdict="ERROR (build, see $log)"; fi
    elif PDDE_TEST_FAIL_FAST=1 make -C "$work" -s -j2 test TEST_FIRST="$first" >>"$log" 2>&1; then
        verdict=SURVIVED
    else
        # the test binary whose line in run_tests.sh's table shows failures
        by=$(grep -E '^[a-z_/]*test_[a-z0-9_]+ +[0-9]+ passed +[1-9][0-9]* failed' "$log" | head -n 1 | awk '{print $1}')
        if [ -n "$by" ]; then verdict="killed by $by"; else verdict="ERROR (make test failed with no failing test, see $log)"; fi
    fi
    case "$verdict" in killed*) killed=$((killed + 1)) ;; *) survivors+=" $name" ;; esac
    echo "MUTANT $name $verdict ($(( $(date +%s) - start ))s)"
    [ "$verdict" = SURVIVED ] && tail -n 3 "$log"
    case "$verdict" in killed\ by*) grep -m 3 -E '^FAIL' "$log" | cut -c1-300 | sed 's/^/    /' ;; esac
    [ "${PDDE_MUTANT_KEEP:-0}" = 1 ] || rm -rf "$work"
done
[ -n "$survivors" ] && echo "not killed:$survivors"
echo "RESULT mutants killed=$killed total=$total"
[ "$killed" -eq "$total" ]
