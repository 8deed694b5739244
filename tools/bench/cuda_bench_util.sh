# Sourced by the CUDA bench scripts (cuda_fusions.sh, cuda_gemm.sh, cuda_memk.sh, cuda_moe.sh, cuda_switches.sh) and
# tools/gpu-check.sh. The caller sets build, cap, log,
# tests and runs (the RESULT names of a test's and a training run's line: gpu_fusions_test, gpu_fusions_run)
# and summary (of the last line: gpu_fusions).
failed=0
lt_fallbacks=0 # (cublasLt's "no algorithm" lines of the training runs; not the tuning's choices)
declare -A tok # (each training run's tokens/s)

# TARGETS...: builds them in $build (UCX as tools/gpu-check.sh finds it: UCX_DIR, pkg-config's or
# .gpu-carry/ucx; else none) and exits 0 where there is no CUDA device, 1 where the build fails
cuda_bench_prepare() {
    local ucx=(NO_UCX=1)
    { [ -n "${UCX_DIR:-}" ] || pkg-config --exists ucx 2>/dev/null || [ -f .gpu-carry/ucx/include/ucp/api/ucp.h ]; } && ucx=()
    if ! make -s -j"$(nproc)" BUILD="$build" WERROR= "${ucx[@]}" "$@" >"$log/build.out" 2>&1; then
        tail -20 "$log/build.out"
        echo "RESULT $summary status=build_failed"
        exit 1
    fi
    if "$build/bench_cuda" --probe | grep -q "no CUDA device"; then
        echo "RESULT $summary status=no_device"
        exit 0
    fi
}
field() { sed -n "s/.*[ ]$2=\([^ ]*\).*/\1/p" "$1" | tail -1; } # FILE KEY: the last KEY=value in FILE
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else printf "na" }'; }
losses_match() { # A B TOL: the largest relative difference of the two metrics files' losses, or "nan" (a step missing, NaN)
    # (a loss must be written as a number: "nan" and "inf" compare as numbers in some awks, and pass every bound)
    awk -v tol="$3" -F'[:,]' 'FNR == 1 { f++ } { for (i = 1; i < NF; i++) { if ($i ~ /"step"/) s = $(i + 1); if ($i ~ /"loss"/) l[f, s] = $(i + 1) } n[f] = s }
        END { w = 0; num = "^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$"; if (n[1] < 1 || n[1] != n[2]) { print "nan"; exit 1 }
              for (s = 1; s <= n[1]; s++) { a = l[1, s]; b = l[2, s]; if (a !~ num || b !~ num || b == 0) { print "nan"; exit 1 }
                  d = (a - b) / b; if (d < 0) d = -d; if (d > w) w = d }
              printf "%.3g", w; exit !(w <= tol) }' "$1" "$2"
}
check() { # NAME ENV... -- CMD...: a test; a RESULT line with its last line's counts; a failure counts
    local name=$1 rc
    shift
    timeout "$cap" env "$@" >"$log/$name.out" 2>&1
    rc=$?
    local counts
    counts=$(tail -1 "$log/$name.out" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed.*/passed=\1 failed=\2/p')
    echo "RESULT $tests name=$name ${counts:-passed=0 failed=na} exit=$rc"
    [ $rc = 0 ] && [ -n "$counts" ] || { failed=$((failed + 1)); grep -E "FAIL|error" "$log/$name.out" | head -5; }
    grep "pdde: cuda: cublasLt" "$log/$name.out" | sort | uniq -c | head -4
}
run() { # NAME ENV...: one bench_cuda --gpt run in bf16 (only the names in RUNS where it is set); its tokens/s in tok[NAME]
    local name=$1
    shift
    [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $name "* ]] || return 0
    timeout "$cap" env "$@" "$build/bench_cuda" --gpt --dtype bf16 >"$log/gpt_$name.out" 2>&1
    local line
    line=$(grep '^GPT ' "$log/gpt_$name.out" | tail -1)
    tok[$name]=$(field "$log/gpt_$name.out" tok_s)
    lt_fallbacks=$((lt_fallbacks + $(grep "pdde: cuda: cublasLt" "$log/gpt_$name.out" | grep -cv "candidates, fastest")))
    echo "RESULT $runs name=$name ${line#GPT }"
    [ -n "$line" ] || { failed=$((failed + 1)); tail -5 "$log/gpt_$name.out"; }
    grep "pdde: cuda: cublasLt" "$log/gpt_$name.out" | grep -v "candidates, fastest" | sort | uniq -c | head -3
    grep "pdde: cuda: PDDE_CUDA_GRAPH" "$log/gpt_$name.out" | head -3 # (graph runs: what was captured, replayed, fell back)
}
