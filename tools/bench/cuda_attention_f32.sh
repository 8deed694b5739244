#!/usr/bin/env bash
# cuda_attention_f32: the CUDA backend's f32 tiled attention (k_flash_f32_*: PDDE_CUDA_ATTENTION=flash in an f32
# graph, dq and dk, dv kernels; =flash2, the one-pass backward with dq by atomics; f32's default is the unfused
# graph) on a CUDA GPU, in one run. First the conformance cases
# (test_backend_ops --backend cuda --op attention: every path, flash and flash2 on f32 among them, q, k, v apart
# and packed, against the CPU's f32 reference); then, REPEATS times (default 3) in turn:
#  - attention alone in f32 (bench_cuda --attention --dtype f32: B 8, H 12, T 1024, D 64, forward and backward;
#    q, k, v apart and packed) on the unfused path and on flash and flash2, and PyTorch's SDPA in f32 with TF32 off
#    (attention_torch.py --dtype f32; its memory-efficient kernel);
#  - GPT-2 124M f32 training steps (bench_cuda --gpt --dtype f32: B 8, T 1024, AdamW; cuBLAS without TF32)
#    with the default, flash and flash2, and PyTorch f32 (gpt_torch.py --dtype f32 --sdpa, TF32 off).
# Each figure is the median of the repeats (each itself a median of the tool's timed runs).
#
#   bash tools/bench/cuda_attention_f32.sh [BUILD]     (BUILD: the build folder, default build; built here)
#   REPEATS=5 CAP=120 bash tools/bench/cuda_attention_f32.sh
#
# Prints a RESULT line per test and run and ends with
#   RESULT gpu_attention_f32 att_unfused_ms=.. att_flash_ms=.. att_flash2_ms=.. att_torch_ms=.. att_flash_vs_unfused=..
#     att_flash_vs_torch=.. att_flash2_vs_unfused=.. att_flash2_vs_torch=.. (the same with att_packed_) gpt_default_ms=..
#     gpt_flash_ms=.. gpt_flash2_ms=.. gpt_torch_ms=.. gpt_flash_vs_default=.. gpt_flash2_vs_default=.. gpt_flash_vs_torch=..
#     gpt_flash2_vs_torch=.. gpt_default_vs_torch=.. loss_default=.. loss_flash=.. loss_flash2=.. failed=N
# (_vs_ ratios: the other's time over this one's: above 1 is faster).
set -u
build=${1:-build}
cap=${CAP:-90}
repeats=${REPEATS:-3}
log=$(mktemp -d)
tests=gpu_attention_f32_test runs=gpu_attention_f32_run summary=gpu_attention_f32
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_backend_ops" "$build/bench_cuda"
check ops_attention X=0 "$build/test_backend_ops" --backend cuda --op attention

declare -A ms # NAME -> the times of its repeats, space-separated
median() { tr ' ' '\n' | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "na" }'; }
timed() { # NAME KEY ENV... -- CMD: one run; the KEY=value of its last line appended to ms[NAME]
    local name=$1 key=$2
    shift 2
    timeout "$cap" env "$@" >"$log/$name.out" 2>&1
    local v
    v=$(field "$log/$name.out" "$key")
    echo "RESULT $runs name=$name $(tail -1 "$log/$name.out")"
    [ -n "$v" ] || { failed=$((failed + 1)); tail -3 "$log/$name.out"; }
    grep "^pdde: " "$log/$name.out" | sort | uniq -c | head -3 # (a path that does not run says why)
    ms[$name]="${ms[$name]:-} ${v:-na}"
}
for r in $(seq "$repeats"); do
    for layout in apart packed; do
        p=(); [ $layout = packed ] && p=(--packed)
        n=att; [ $layout = packed ] && n=att_packed
        timed "${n}_unfused" fwd_bwd_ms PDDE_CUDA_ATTENTION=unfused "$build/bench_cuda" --attention --dtype f32 "${p[@]}"
        timed "${n}_flash" fwd_bwd_ms PDDE_CUDA_ATTENTION=flash "$build/bench_cuda" --attention --dtype f32 "${p[@]}"
        timed "${n}_flash2" fwd_bwd_ms PDDE_CUDA_ATTENTION=flash2 "$build/bench_cuda" --attention --dtype f32 "${p[@]}"
        timed "${n}_torch" fwd_bwd_ms X=0 python3 tools/bench/attention_torch.py --dtype f32 "${p[@]}"
    done
    timed gpt_default ms X=0 "$build/bench_cuda" --gpt --dtype f32
    cp "$log/gpt_default.out" "$log/gpt_default_last.out"
    timed gpt_flash ms PDDE_CUDA_ATTENTION=flash "$build/bench_cuda" --gpt --dtype f32
    timed gpt_flash2 ms PDDE_CUDA_ATTENTION=flash2 "$build/bench_cuda" --gpt --dtype f32
    timed gpt_torch step_ms X=0 python3 tools/bench/gpt_torch.py --device cuda --vocab 50304 --layers 12 --heads 12 \
        --width 768 --ctx 1024 --batch 8 --steps 10 --warmup 3 --dtype f32 --sdpa
done
declare -A med
for name in "${!ms[@]}"; do med[$name]=$(echo "${ms[$name]}" | median); done
out="RESULT gpu_attention_f32"
for n in att att_packed; do
    out+=" ${n}_unfused_ms=${med[${n}_unfused]:-na} ${n}_flash_ms=${med[${n}_flash]:-na} ${n}_flash2_ms=${med[${n}_flash2]:-na}"
    out+=" ${n}_torch_ms=${med[${n}_torch]:-na}"
    for f in flash flash2; do
        out+=" ${n}_${f}_vs_unfused=$(ratio "${med[${n}_unfused]:-0}" "${med[${n}_$f]:-0}")"
        out+=" ${n}_${f}_vs_torch=$(ratio "${med[${n}_torch]:-0}" "${med[${n}_$f]:-0}")"
    done
done
out+=" gpt_default_ms=${med[gpt_default]:-na} gpt_flash_ms=${med[gpt_flash]:-na} gpt_flash2_ms=${med[gpt_flash2]:-na}"
out+=" gpt_torch_ms=${med[gpt_torch]:-na}"
for f in flash flash2; do
    out+=" gpt_${f}_vs_default=$(ratio "${med[gpt_default]:-0}" "${med[gpt_$f]:-0}")"
    out+=" gpt_${f}_vs_torch=$(ratio "${med[gpt_torch]:-0}" "${med[gpt_$f]:-0}")"
done
out+=" gpt_default_vs_torch=$(ratio "${med[gpt_torch]:-0}" "${med[gpt_default]:-0}")"
out+=" loss_default=$(field "$log/gpt_default_last.out" loss) loss_flash=$(field "$log/gpt_flash.out" loss)"
out+=" loss_flash2=$(field "$log/gpt_flash2.out" loss)"
echo "$out failed=$failed"
rm -rf "$log"
[ $failed = 0 ]
