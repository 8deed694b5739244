#!/usr/bin/env bash
# cuda_gemm: the GEMM paths of a GPT-2 124M bf16 step on a CUDA GPU, in one run (a few minutes). First the
# conformance cases of the switches on the device: PDDE_FUSE_BGRAD's matmul with the bias gradient (the
# k_colsum fallback, then cublasLt's BGRADA, then tuned), cublasLt's fused matmuls under PDDE_CUDA_LT_TUNE=1,
# PDDE_CUDA_GEMMEX_LOWP=1's bf16-out GEMM (the bf16 logits), PDDE_CUDA_GEMM_SINGLE=1 (cublasGemmEx for a
# batch of 1) on both, PDDE_CUDA_LT_LOWP_BIAS=1 (a bf16 output and its bias rounded to bf16 in one cublasLtMatmul;
# matmul_bias and gelu_fused have cases that set it themselves, the runs named so set it on all of theirs) and
# PDDE_CUDA_LT_REDUCTION=all (split-K partial sums reduced in bf16 allowed); PDDE_CUDA_LT_WORKSPACE=1 (a 1 MiB
# workspace) in the --gemm table and a training run. Then `bench_cuda --gemm`: each GEMM
# shape of the step (forward, input and weight gradients; with a bias, the GELU epilogues, bf16 and f32 out,
# beta 1) on every path next to torch doing the same work, a RATIO line per shape and path (RESULT gpu_gemm;
# cublasLt's notes and the tuning's choices on stderr, kept in the log). Then training steps (bench_cuda --gpt
# --dtype bf16) with the defaults and the switches, in the same run.
#
#   bash tools/bench/cuda_gemm.sh [BUILD]      (BUILD: the build folder, default build; built here)
#   RUNS="default no_bgrad" bash tools/bench/cuda_gemm.sh     (only those training runs; RUNS=none: no runs)
#
# Prints a RESULT line per test and run, the --gemm table and ends with `RESULT gpu_gemm_check ...`: each
# run's tokens/s and its ratio to the defaults'. Each command is time-boxed (CAP seconds, default 120).
set -u
build=${1:-build}
cap=${CAP:-120}
log=${LOG:-$(mktemp -d)}
mkdir -p "$log"
tests=gpu_gemm_test runs=gpu_gemm_run summary=gpu_gemm_check
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_backend_ops" "$build/bench_cuda"
check bgrad PDDE_CUDA_LT=0 "$build/test_backend_ops" --backend cuda --op sum_to
check bgrad_lt PDDE_CUDA_LT=1 "$build/test_backend_ops" --backend cuda --op sum_to
check bgrad_lt_tune PDDE_CUDA_LT=1 PDDE_CUDA_LT_TUNE=1 "$build/test_backend_ops" --backend cuda --op sum_to
check matmul_bias_lt_tune PDDE_CUDA_LT=1 PDDE_CUDA_LT_TUNE=1 "$build/test_backend_ops" --backend cuda --op matmul_bias
check matmul_grad_lt_tune PDDE_CUDA_LT=1 PDDE_CUDA_LT_TUNE=1 "$build/test_backend_ops" --backend cuda --op matmul_grad
check gemmex_lowp PDDE_CUDA_GEMMEX_LOWP=1 "$build/test_backend_ops" --backend cuda --op cross_entropy_lowp
check gemm_single PDDE_CUDA_GEMM_SINGLE=1 PDDE_CUDA_LT=0 "$build/test_backend_ops" --backend cuda --op matmul
check gemm_single_lowp PDDE_CUDA_GEMM_SINGLE=1 PDDE_CUDA_GEMMEX_LOWP=1 "$build/test_backend_ops" --backend cuda --op cross_entropy_lowp
check matmul_bias_lt PDDE_CUDA_LT=1 "$build/test_backend_ops" --backend cuda --op matmul_bias
check matmul_bias_lt_lowp_bias PDDE_CUDA_LT=1 PDDE_CUDA_LT_LOWP_BIAS=1 "$build/test_backend_ops" --backend cuda --op matmul_bias
check gelu_fused_lt_lowp_bias PDDE_CUDA_LT=1 PDDE_CUDA_LT_LOWP_BIAS=1 "$build/test_backend_ops" --backend cuda --op gelu_fused
check matmul_bias_lt_reduction_all PDDE_CUDA_LT=1 PDDE_CUDA_LT_REDUCTION=all "$build/test_backend_ops" --backend cuda --op matmul_bias
# the GEMMs alone, pdde's paths and torch.matmul (python3 with torch: PDDE_TORCH_PYTHON to name another)
timeout "$((cap * 3))" "$build/bench_cuda" --gemm >"$log/gemm.out" 2>"$log/gemm.err"
grep -vE "^(GEMM|TORCH) " "$log/gemm.out"
grep -c "candidates, fastest" "$log/gemm.err" | sed 's/^/cublasLt plans tuned: /'
grep -E "no .*algorithm|failed" "$log/gemm.err" | sort | uniq -c | head -16 # (each shape cublasLt declined, its alignments and status)
grep -q "^RESULT gpu_gemm " "$log/gemm.out" || failed=$((failed + 1))
# the defaults (on CUDA in bf16: cublasLt and lowering's fusions, PDDE_FUSE_GRAD and PDDE_FUSE_BGRAD among them: the
# biased linears' weight gradients write their bias gradient and leave PDDE_FUSE_GRAD); no_bgrad: each weight gradient
# in its accumulation and the bias gradients summed apart; no_bgrad_nograd: neither fusion
run default X=0
run no_bgrad PDDE_FUSE_BGRAD=0
run no_bgrad_nograd PDDE_FUSE_BGRAD=0 PDDE_FUSE_GRAD=0
run tune PDDE_CUDA_LT_TUNE=1
run no_bgrad_tune PDDE_FUSE_BGRAD=0 PDDE_CUDA_LT_TUNE=1
run gemmex PDDE_CUDA_GEMMEX_LOWP=1
run tune_gemmex PDDE_CUDA_LT_TUNE=1 PDDE_CUDA_GEMMEX_LOWP=1
run single PDDE_CUDA_GEMM_SINGLE=1
run single_gemmex PDDE_CUDA_GEMM_SINGLE=1 PDDE_CUDA_GEMMEX_LOWP=1
run lowp_bias PDDE_CUDA_LT_LOWP_BIAS=1
run reduction_all PDDE_CUDA_LT_REDUCTION=all
run workspace_1mib PDDE_CUDA_LT_WORKSPACE=1
run gelu_lowp_bias PDDE_FUSE_GELU=1 PDDE_CUDA_LT_LOWP_BIAS=1
run default_again X=0
out="RESULT gpu_gemm_check default_tok_s=${tok[default]:-na}"
for n in no_bgrad no_bgrad_nograd tune no_bgrad_tune gemmex tune_gemmex single single_gemmex lowp_bias reduction_all workspace_1mib gelu_lowp_bias default_again; do
    out+=" ${n}_vs_default=$(ratio "${tok[$n]:-0}" "${tok[default]:-0}")"
done
echo "$out $(grep '^RESULT gpu_gemm ' "$log/gemm.out" | sed 's/^RESULT gpu_gemm //') failed=$failed log=$log"
[ $failed = 0 ]
