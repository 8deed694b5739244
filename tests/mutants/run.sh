#!/usr/bin/env bash
# make test-mutants: applies each planted bug under tests/mutants/ to a scratch copy of this tree and
# checks that the tests of `make test` fail (run_tests.sh in fail-fast mode, the tests a mutant names
# first, the portable build's last). A mutant whose snippet is no longer in its file is STALE and
# counts as not killed. Last line: RESULT mutants killed=<n> total=<m>.
# MUTANTS="a b" runs only the mutants whose names contain a or b; PDDE_MUTANT_DIR sets the scratch folder.
# Builds at MUTANT_OPT (default -O1 -g0: the library compiles in a third of -O3's time; the tests
# check results, not speed).
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
    # the tree as it is now (tracked and untracked files; no build folder: every mutant touches the
    # library, which everything links, so nothing built would be reused)
    (cd "$root" && git ls-files -co --exclude-standard -z | tar -cf - --null -T -) | tar -xf - -C "$work"
    start=$(date +%s)
    "$py" "$root/tests/mutants/apply.py" "$mut" "$work"; rc=$?
    if [ $rc -ne 0 ]; then
        [ $rc -eq 2 ] && verdict=STALE || verdict=MALFORMED
        survivors+=" $name($verdict)"; echo "MUTANT $name $verdict"; rm -rf "$work"; continue
    fi
    first=$("$py" "$root/tests/mutants/apply.py" "$mut" "$work" --tests)
    log="$scratch/$name.log"; : >"$log"
    # what `make test` runs (the test binaries, and the launcher and gpt that some of them start), each built once;
    # the mutant's tests first, the portable build's (another compile of the library) only when all passed
    # (and the shell tests the mutant names: the others run in `make test` only)
    tests=$(cd "$work" && { ls tests/test_*.c | sed 's|^tests/|build/|; s|\.c$||'; for t in $first; do [ -f "tests/$t.sh" ] && echo "build/$t"; done; })
    ordered=$(for t in $first; do echo "$tests" | grep -x "build/$t"; done; echo "$tests" | grep -vxF -f <(for t in $first; do echo "build/$t"; done; echo none))
    opt=${MUTANT_OPT:--O1 -g0 -march=native -fno-math-errno}
    # the mutant's own tests are built and run first; the others are built only if those pass
    firsts=$(echo "$ordered" | head -n "$(echo "$first" | wc -w)"); rest=$(echo "$ordered" | tail -n +"$(( $(echo "$firsts" | grep -c .) + 1 ))")
    # the programs the shell tests start, where the mutant names one (else a missing program would kill it)
    tools="build/pdde-run build/gpt"
    for t in $first; do [ -f "$work/tests/$t.sh" ] && tools="$tools $(grep -oh '\$build/[a-z_-]*' "$work/tests/$t.sh" | sed 's|\$build/|build/|' | sort -u | tr '\n' ' ')"; done
    tools=$(for t in $tools; do [ -f "$work/tools/${t#build/}.c" ] || [ -f "$work/examples/${t#build/}.c" ] || [ "$t" = build/gpt ] && echo "$t"; done | sort -u | tr '\n' ' ')
    verdict=""
    for group in "$firsts" "$rest"; do
        [ -n "$(echo $group)" ] || continue
        if ! make -C "$work" -s -j2 OPT="$opt" $group $tools >>"$log" 2>&1 || ! (cd "$work" && ls $group >/dev/null 2>&1); then
            # a compile error is the mutant's doing; anything else (no fork, disk) is not a verdict
            if grep -q 'error:' "$log"; then verdict="killed (does not build)"; else verdict="ERROR (build, see $log)"; fi
            break
        fi
        (cd "$work" && PDDE_TEST_FAIL_FAST=1 bash tests/run_tests.sh build $group >>"$log" 2>&1) || { verdict=failed; break; }
    done
    # then the fallback builds make test runs (OpenBLAS without oneDNN, the portable GEMM), as it runs them
    fallback_openblas="build/openblas/test_matmul build/openblas/test_backend_ops build/openblas/test_gpt_golden"
    fallback_portable="build/portable/test_matmul build/portable/test_backend_ops build/portable/test_gpt_golden build/portable/test_grad"
    if [ -z "$verdict" ] && ! (cd "$work" &&
          make -s -j2 OPT="$opt" BUILD=build/openblas NO_DNNL=1 NO_UCX=1 $fallback_openblas >>"$log" 2>&1 &&
          make -s -j2 OPT="$opt" BUILD=build/portable NO_DNNL=1 NO_OPENBLAS=1 NO_UCX=1 $fallback_portable >>"$log" 2>&1 &&
          PDDE_TEST_FAIL_FAST=1 bash tests/run_tests.sh build $fallback_openblas $fallback_portable >>"$log" 2>&1); then
        verdict=failed
    fi
    [ -z "$verdict" ] && verdict=SURVIVED
    if [ "$verdict" = failed ]; then
        # the test binary whose line in run_tests.sh's table shows failures
        by=$(grep -E '^[a-z_/]*test_[a-z0-9_]+ +[0-9]+ passed +[1-9][0-9]* failed' "$log" | head -n 1 | awk '{print $1}')
        if [ -n "$by" ]; then verdict="killed by $by"; else verdict="ERROR (the tests failed with no failing test, see $log)"; fi
    fi
    case "$verdict" in killed*) killed=$((killed + 1)) ;; *) survivors+=" $name" ;; esac
    echo "MUTANT $name $verdict ($(( $(date +%s) - start ))s)"
    [ "$verdict" = SURVIVED ] && tail -n 3 "$log"
    case "$verdict" in killed\ by*) grep -m 3 -E '^FAIL' "$log" | cut -c1-300 | sed 's/^/    /' ;; esac
    [ "${PDDE_MUTANT_KEEP:-0}" = 1 ] || rm -rf "$work"
done
[ -n "$survivors" ] && echo "not killed:$survivors"
echo "logs: $scratch/*.log"
echo "RESULT mutants killed=$killed total=$total"
[ "$killed" -eq "$total" ]
