#!/usr/bin/env bash
# cuda_fusions: lowering's graph fusions and cublasLt on a CUDA GPU, in one run. First their conformance
# cases on the device (with and without cublasLt) and test_casts (the same losses bit for bit on the
# GPU's generic path, the casts and nodes a step counted); then GPT-2 124M bf16 training steps
# (bench_cuda --gpt: B 8, T 1024, AdamW) with the defaults, with all of them off (old_defaults), with each
# one off, and with the switches still off by default on, in the same run.
#
#   bash tools/bench/cuda_fusions.sh [BUILD]     (BUILD: the build folder, default build; built here)
#   RUNS="default old_defaults default_again" bash tools/bench/cuda_fusions.sh   (only those training runs)
#
# On by default on CUDA in bf16 graphs (each variable "0" turns it off): PDDE_FUSE_EPILOGUE (bias and residual
# adds, and the qkv cast, in the matmul), PDDE_FUSE_GRAD (weight-gradient matmuls inside their accumulations),
# PDDE_FUSE_ADD_LN (the residual gradient added in the layernorm's backward), PDDE_BF16_LOGITS (bf16 logits
# into the loss), PDDE_BF16_GRADS (the bias_gelu backward writes bf16, its bias gradient summed from it),
# PDDE_ATT_LOWP (the attention writes the bf16 copies of its output and input gradient beside them), and
# PDDE_CUDA_LT (the fused matmuls on cublasLt). Off by default ("1" turns it on): PDDE_FUSE_GELU (bias and
# GELU in the fc matmul's epilogue, gelu' in the backward's: cublasLt GELU_AUX_BIAS / DGELU), PDDE_CUDA_GRAPH
# (each step's work captured on the stream and replayed as one CUDA graph). Each step is time-boxed (CAP
# seconds, default 75). Prints a RESULT line per test and run and ends with `RESULT gpu_fusions ...`: tokens/s
# of each run, its ratio to the defaults', and the defaults' to old_defaults'.
# A cublasLt shape that falls back says so on stderr ("pdde: cuda: cublasLt ..."), counted in lt_fallbacks.
set -u
build=${1:-build}
cap=${CAP:-75}
log=$(mktemp -d)
tests=gpu_fusions_test runs=gpu_fusions_run summary=gpu_fusions
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_backend_ops" "$build/test_casts" "$build/bench_cuda"
check casts PDDE_CUDA_LT=0 "$build/test_casts"
grep -E "cuda\): PDDE_FUSE|cuda\): PDDE_BF16_GRADS|cuda\): and PDDE_ATT_LOWP|cuda\): casts per step" "$log/casts.out" | head -8
for op in matmul_bias matmul_grad cross_entropy_lowp layernorm_res layernorm_add bias_gelu_grads layernorm_copy gelu_fused; do
    check "ops_$op" PDDE_CUDA_LT=0 "$build/test_backend_ops" --backend cuda --op "$op"
    check "ops_${op}_lt" PDDE_CUDA_LT=1 "$build/test_backend_ops" --backend cuda --op "$op"
done
run default X=0 # (the defaults: on CUDA in bf16 the fusions below and cublasLt are on)
run old_defaults PDDE_FUSE_EPILOGUE=0 PDDE_FUSE_GRAD=0 PDDE_FUSE_ADD_LN=0 PDDE_BF16_LOGITS=0 PDDE_BF16_GRADS=0 PDDE_ATT_LOWP=0 \
    PDDE_CUDA_LT=0 # (every one of them off: the defaults before they were measured)
run no_epilogue PDDE_FUSE_EPILOGUE=0
run no_grad PDDE_FUSE_GRAD=0
run no_add_ln PDDE_FUSE_ADD_LN=0
run no_bf16_logits PDDE_BF16_LOGITS=0
run no_bf16_grads PDDE_BF16_GRADS=0
run no_att_lowp PDDE_ATT_LOWP=0
run no_lt PDDE_CUDA_LT=0
run gelu PDDE_FUSE_GELU=1
run graph PDDE_CUDA_GRAPH=1
run gelu_graph PDDE_FUSE_GELU=1 PDDE_CUDA_GRAPH=1
run default_again X=0 # (the defaults once more: the spread of two runs of one configuration)
base=${tok[default]:-0}
out="RESULT gpu_fusions default_tok_s=${tok[default]:-na} default_again_tok_s=${tok[default_again]:-na}"
out+=" old_defaults_tok_s=${tok[old_defaults]:-na} default_vs_old_defaults=$(ratio "$base" "${tok[old_defaults]:-0}")"
for n in no_epilogue no_grad no_add_ln no_bf16_logits no_bf16_grads no_att_lowp no_lt gelu graph gelu_graph; do
    out+=" ${n}_tok_s=${tok[$n]:-na} ${n}_vs_default=$(ratio "${tok[$n]:-0}" "$base")"
done
echo "$out lt_fallbacks=$lt_fallbacks failed=$failed"
rm -rf "$log"
[ $failed = 0 ]
