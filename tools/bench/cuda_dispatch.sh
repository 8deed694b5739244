#!/usr/bin/env bash
# cuda_dispatch: the host's cost per op on a CUDA GPU, where small models are launch-bound. First the checks:
# test_dispatch_env (no PDDE_* variable read by a step's ops, on the CPU, OpenCL and CUDA; a switch set between
# sessions read by the next) and the conformance suite on CUDA (test_backend_ops --backend cuda: the dispatcher's
# settings now come from the session's stream, cuBLAS's stream is set only when it changes). Then bench_dispatch
# on the GPU against PyTorch eager there: the deep narrow MLP (534 ops a step) and the tiny GPT in bf16 (--gpt
# --bf16), each without and with PDDE_CUDA_GRAPH=1 (a step's kernels replayed as CUDA graphs).
#
#   bash tools/bench/cuda_dispatch.sh [BUILD]     (BUILD: the build folder, default build; built here)
#
# Prints a RESULT line per check and run and ends with `RESULT gpu_dispatch mlp_us_per_op=.. mlp_ratio=..
# mlp_graph_us_per_op=.. gpt_us_per_op=.. gpt_ratio=.. gpt_graph_us_per_op=.. failed=..` (ratio: pdde's step
# over PyTorch eager's on the same GPU; below 1 is faster).
set -u
build=${1:-build}
cap=${CAP:-120}
log=$(mktemp -d)
tests=gpu_dispatch_test runs=gpu_dispatch_run summary=gpu_dispatch
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_dispatch_env" "$build/test_backend_ops" "$build/bench_dispatch" "$build/bench_cuda"
check dispatch_env X=0 "$build/test_dispatch_env"
check backend_ops X=0 "$build/test_backend_ops" --backend cuda
declare -A us rat
bench() { # NAME ENV... -- ARGS...: one bench_dispatch run on the GPU; its us_per_op and ratio
    local name=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    timeout "$cap" env "${envs[@]}" "$build/bench_dispatch" --device cuda "$@" >"$log/$name.out" 2>&1
    local line
    line=$(grep '^RESULT dispatch' "$log/$name.out" | tail -1)
    us[$name]=$(field "$log/$name.out" us_per_op)
    rat[$name]=$(field "$log/$name.out" ratio)
    echo "RESULT $runs name=$name ${line#RESULT dispatch }"
    [ -n "$line" ] || { failed=$((failed + 1)); tail -5 "$log/$name.out"; }
    grep "pdde: cuda: PDDE_CUDA_GRAPH" "$log/$name.out" | head -3
}
bench mlp X=0 --
bench mlp_graph PDDE_CUDA_GRAPH=1 -- --no-torch
bench gpt X=0 -- --gpt --bf16
bench gpt_graph PDDE_CUDA_GRAPH=1 -- --gpt --bf16 --no-torch
echo "RESULT $summary mlp_us_per_op=${us[mlp]:-na} mlp_ratio=${rat[mlp]:-na} mlp_graph_us_per_op=${us[mlp_graph]:-na}" \
     "gpt_us_per_op=${us[gpt]:-na} gpt_ratio=${rat[gpt]:-na} gpt_graph_us_per_op=${us[gpt_graph]:-na} failed=$failed"
