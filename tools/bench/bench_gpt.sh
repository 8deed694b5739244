#!/usr/bin/env bash
# bench-gpt: one GPT training step in pdde and in PyTorch (Debian's python3-torch), same shapes, same
# thread count, OPENBLAS_NUM_THREADS set for both, in one run. Medians of repeated steps.
# *_ratio: pdde's tokens/s over PyTorch's (wall clock); *_cpu_ratio: PyTorch's CPU time per step over
# pdde's (all threads; on a machine shared with other work it is the steadier of the two).
set -euo pipefail
build=${1:-build}
threads=${THREADS:-$(nproc)}
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "bench-gpt: PyTorch is missing: run 'sudo bash tools/install-deps.sh --torch'" >&2
    exit 1
fi
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
run() { # name, steps, warmup, model flags...
    local name=$1 steps=$2 warmup=$3; shift 3
    local p t
    p=$("$build/bench_gpt" "$@" --steps "$steps" --warmup "$warmup" --threads "$threads" | tail -n 1)
    t=$(/usr/bin/python3 tools/bench/gpt_torch.py "$@" --steps "$steps" --warmup "$warmup" --threads "$threads" | tail -n 1)
    printf '%-6s pdde  %s\n%-6s torch %s\n' "$name" "$p" "$name" "$t"
    eval "${name}_ratio=$(awk -v a="$(field tokens_per_s "$p")" -v b="$(field tokens_per_s "$t")" 'BEGIN{printf "%.3f", a/b}')"
    eval "${name}_cpu_ratio=$(awk -v a="$(field cpu_ms "$t")" -v b="$(field cpu_ms "$p")" 'BEGIN{printf "%.3f", a/b}')"
    eval "${name}_pdde_mb=$(field peak_mb "$p")"
    eval "${name}_torch_mb=$(field peak_mb "$t")"
}
echo "threads: $threads; load: $(uptime | sed 's/.*load/load/')"
run small 30 5 --vocab 256 --layers 4 --heads 4 --width 128 --ctx 64 --batch 8
run gpt2 5 1 --vocab 50257 --layers 12 --heads 12 --width 768 --ctx 64 --batch 4
# mixed precision: pdde's bf16 matmuls (f32 masters) against torch.autocast's, GPT-2 124M's shape
run bf16 5 1 --vocab 50257 --layers 12 --heads 12 --width 768 --ctx 64 --batch 4 --dtype bf16
# the LLaMA-style model (RMSNorm, RoPE, grouped-query attention of 2 kv heads, SwiGLU) at the small shape
run llama 30 5 --vocab 256 --layers 4 --heads 4 --width 128 --ctx 64 --batch 8 --arch llama --kv-heads 2
# packed documents kept apart (gpt --doc-mask): 4 documents of 16 tokens a row, each attending inside itself
run docs 30 5 --vocab 256 --layers 4 --heads 4 --width 128 --ctx 64 --batch 8 --doc-every 16
# the same at T 1024: 8 documents of 128 tokens a row (pdde skips the key tiles no query of a tile sees; PyTorch masks
# a T x T score matrix)
run longdocs 5 1 --vocab 256 --layers 4 --heads 4 --width 128 --ctx 1024 --batch 2 --doc-every 128
echo "RESULT gpt_train small_ratio=$small_ratio gpt2_ratio=$gpt2_ratio bf16_ratio=$bf16_ratio llama_ratio=$llama_ratio docs_ratio=$docs_ratio longdocs_ratio=$longdocs_ratio small_cpu_ratio=$small_cpu_ratio gpt2_cpu_ratio=$gpt2_cpu_ratio bf16_cpu_ratio=$bf16_cpu_ratio llama_cpu_ratio=$llama_cpu_ratio docs_cpu_ratio=$docs_cpu_ratio longdocs_cpu_ratio=$longdocs_cpu_ratio longdocs_peak_mb=$longdocs_pdde_mb torch_longdocs_peak_mb=$longdocs_torch_mb small_peak_mb=$small_pdde_mb torch_small_peak_mb=$small_torch_mb gpt2_peak_mb=$gpt2_pdde_mb torch_gpt2_peak_mb=$gpt2_torch_mb bf16_peak_mb=$bf16_pdde_mb torch_bf16_peak_mb=$bf16_torch_mb"
