#!/usr/bin/env bash
# cuda_moe: the Mixture-of-Experts ops on a CUDA GPU (PDDE_CUDA_MOE=1) against their CPU fallback (the default until
# a run of this has timed them: each MoE op's tokens copied to the CPU and back), in one run. First their
# conformance cases on the device (test_backend_ops --op moe_layer, test_moe_device); then an MoE GPT (gpt
# --moe-experts 8, top-2, 4 layers of width 512, T 256, B 8) trained on the GPU for 20 steps in f32 and in bf16,
# device and fallback alternating, twice: tokens/s (the median of steps 6..20 of a run, the better of its two
# runs) and, in f32, the largest relative difference of the two sides' losses (the same model and data: they
# differ by the sums' order).
#
#   bash tools/bench/cuda_moe.sh [BUILD]     (BUILD: the build folder, default build; built here)
#
# Each run is time-boxed (CAP seconds, default 75). Ends with RESULT gpu_moe device_tok_s=.. fallback_tok_s=..
# device_vs_fallback=.. (f32) bf16_device_tok_s=.. bf16_fallback_tok_s=.. bf16_device_vs_fallback=..
# f32_max_rel_loss_diff=.. failed=N.
set -u
build=${1:-build}
cap=${CAP:-75}
log=$(mktemp -d)
tests=gpu_moe_test runs=gpu_moe_run summary=gpu_moe
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_backend_ops" "$build/test_moe_device" "$build/gpt" "$build/bench_cuda"
check ops_moe_layer PDDE_CUDA_MOE=1 "$build/test_backend_ops" --backend cuda --op moe_layer
check moe_device PDDE_CUDA_MOE=1 "$build/test_moe_device"

model=(--layers 4 --width 512 --heads 8 --ctx 256 --batch 8 --steps 20 --moe-experts 8 --val-every 0 --sample-len 0 --data README.md --device cuda)
# DTYPE SIDE MOE ROUND: one training run; its median tokens/s (steps 6..) into tok[DTYPE_SIDE] where it beats the other round's
moe_run() {
    local m="$log/$1_$2_$4.jsonl"
    timeout "$cap" env PDDE_CUDA_MOE="$3" "$build/gpt" "${model[@]}" --dtype "$1" --metrics "$m" >"$log/$1_$2_$4.out" 2>&1
    local t
    t=$(sed -n 's/.*"step":\([0-9]*\),"loss".*"tokens_per_s":\([0-9.]*\).*/\1 \2/p' "$m" 2>/dev/null | awk '$1 >= 6 { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
    echo "RESULT $runs dtype=$1 side=$2 round=$4 tok_s=${t:-na}"
    if [ -z "$t" ]; then failed=$((failed + 1)); tail -5 "$log/$1_$2_$4.out"; return; fi
    awk -v a="$t" -v b="${tok[$1_$2]:-0}" 'BEGIN { exit !(a > b) }' && tok[$1_$2]=$t
}
for round in 1 2; do
    for dtype in f32 bf16; do
        moe_run "$dtype" device 1 "$round"
        moe_run "$dtype" fallback 0 "$round"
    done
done
# the f32 losses of the first round's two runs: the largest relative difference (nan: a step missing or not a number)
diff=$(losses_match "$log/f32_device_1.jsonl" "$log/f32_fallback_1.jsonl" 1e-4) || failed=$((failed + 1))
echo "RESULT gpu_moe device_tok_s=${tok[f32_device]:-na} fallback_tok_s=${tok[f32_fallback]:-na}" \
    "device_vs_fallback=$(ratio "${tok[f32_device]:-0}" "${tok[f32_fallback]:-0}")" \
    "bf16_device_tok_s=${tok[bf16_device]:-na} bf16_fallback_tok_s=${tok[bf16_fallback]:-na}" \
    "bf16_device_vs_fallback=$(ratio "${tok[bf16_device]:-0}" "${tok[bf16_fallback]:-0}") f32_max_rel_loss_diff=${diff:-na} failed=$failed"
rm -rf "$log"
[ $failed = 0 ]
