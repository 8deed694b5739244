#!/usr/bin/env bash
# cuda_memk: the memory-bound kernels of a GPT-2 124M bf16 step on a CUDA GPU, each switch against the defaults in
# one run. First their conformance cases on the device (test_backend_ops: cross_entropy_fused, colsum2,
# adamw_chunks) and test_casts (PDDE_FUSE_CE=1: no cross_entropy_back, losses within 1e-5 of unfused); then
# bench_cuda --gpt (B 8, T 1024, AdamW) with the defaults, with each switch off, with all three off, and the defaults
# again (the spread of two runs of one configuration); then PDDE_PROFILE=1 runs of the defaults and of all three off,
# whose per-step times of the ops the switches replace are printed (the profiler synchronises after every kernel,
# so these sum to more than a step).
#
#   bash tools/bench/cuda_memk.sh [BUILD]     (BUILD: the build folder, default build; built here)
#   RUNS="default no_fuse_ce default_again" bash tools/bench/cuda_memk.sh   (only those training runs)
#
# The switches (on by default on CUDA in bf16: an H200 measured them faster): PDDE_FUSE_CE (lowering: the
# cross-entropy's forward writes dlogits beside its loss, its backward a view: one read of the logits for both), PDDE_CUDA_COLSUM2 (bias
# gradients by k_colsum2: 16-byte loads, 4 rows in flight a thread, row chunks for ~8 blocks an SM, then a second
# level), PDDE_CUDA_ADAMW_CHUNKS (the multi-tensor AdamW by k_adamw_chunks: a block per 4096 elements of a
# tensor, 16-byte loads and stores). Each step is time-boxed (CAP seconds, default 75). Prints a RESULT line per
# test, run and profile and ends with `RESULT gpu_memk ...`: tokens/s of each run and its ratio to the defaults'.
set -u
build=${1:-build}
cap=${CAP:-75}
log=$(mktemp -d)
tests=gpu_memk_test runs=gpu_memk_run summary=gpu_memk
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_backend_ops" "$build/test_casts" "$build/bench_cuda"
for op in cross_entropy_fused colsum2 adamw_chunks; do
    check "ops_$op" X=0 "$build/test_backend_ops" --backend cuda --op "$op"
done
check casts X=0 "$build/test_casts"
grep -E "cuda\): PDDE_FUSE_CE" "$log/casts.out" | head -3
run default X=0
run no_fuse_ce PDDE_FUSE_CE=0
run no_colsum2 PDDE_CUDA_COLSUM2=0
run no_adamw_chunks PDDE_CUDA_ADAMW_CHUNKS=0
run none3 PDDE_FUSE_CE=0 PDDE_CUDA_COLSUM2=0 PDDE_CUDA_ADAMW_CHUNKS=0
run default_again X=0
# NAME ENV...: a profiled run; the ms a step of the cross-entropy, its backward, sum_to and the AdamW update (steps:
# the cross-entropy's calls, one a step)
profile() {
    local name=$1
    shift
    [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $name "* ]] || return 0
    timeout "$cap" env PDDE_PROFILE=1 "$@" "$build/bench_cuda" --gpt --dtype bf16 >"$log/prof_$name.out" 2>&1
    awk -v name="$name" '
        $1 ~ /^(cross_entropy|cross_entropy_back|sum_to|adamw_update|matmul|cast|add)$/ && $3 == "ms" { ms[$1] = $2; calls[$1] = $5 }
        END {
            steps = calls["cross_entropy"] > 0 ? calls["cross_entropy"] : 1
            printf "RESULT gpu_memk_profile name=%s steps=%d", name, steps
            n = split("cross_entropy cross_entropy_back sum_to adamw_update matmul cast add", ops, " ")
            for (i = 1; i <= n; i++) printf " %s_ms=%.3f", ops[i], ms[ops[i]] / steps
            printf "\n"
        }' "$log/prof_$name.out"
}
profile profile_default X=0
profile profile_none3 PDDE_FUSE_CE=0 PDDE_CUDA_COLSUM2=0 PDDE_CUDA_ADAMW_CHUNKS=0
base=${tok[default]:-0}
out="RESULT gpu_memk default_tok_s=${tok[default]:-na} default_again_tok_s=${tok[default_again]:-na}"
for n in no_fuse_ce no_colsum2 no_adamw_chunks none3; do
    out+=" ${n}_tok_s=${tok[$n]:-na} ${n}_vs_default=$(ratio "${tok[$n]:-0}" "$base")"
done
echo "$out failed=$failed"
rm -rf "$log"
[ $failed = 0 ]
