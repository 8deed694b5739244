#!/usr/bin/env bash
# bench-lora: LoRA fine-tuning of a SmolLM2-135M-shaped LLaMA (30 layers, width 576, 9 heads over 3 kv
# heads, SwiGLU 1536, vocabulary 49152, tied head), rank 8 on every linear of the blocks, on the CPU:
# pdde's LoRA step against PyTorch's (tools/bench/peer_lora_torch.py, the same model file, batch shape and
# update, in the same run) and against pdde's full fine-tune of the same model. The model is pdde's
# initialization saved as a Hugging Face directory (gpt --save-hf). Prints each side, then
#   RESULT lora_cpu torch_ratio=<pdde tok/s over PyTorch's> full_ratio=<LoRA tok/s over full fine-tuning>
#          mem_ratio=<full's parameters+gradients+AdamW bytes over LoRA's> ...
#   bash tools/bench/bench_lora.sh [build]        # B, T, STEPS, THREADS: overrides
set -euo pipefail
build=${1:-build}
threads=${THREADS:-$(nproc)} B=${B:-4} T=${T:-128} STEPS=${STEPS:-6}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--arch llama --layers 30 --width 576 --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152 --rope-base 100000)
"$build/gpt" "${model[@]}" --ctx "$T" --batch "$B" --steps 0 --val-every 0 --sample-len 0 --threads "$threads" --save-hf "$work/model" \
    >"$work/init.log" 2>&1 || { cat "$work/init.log"; exit 1; }
run() { # the median tok/s of the timed steps (the first is warm-up) and the persistent MB, of gpt with "$@"
    "$build/gpt" --init-from "$work/model" --ctx "$T" --batch "$B" --steps "$STEPS" --val-every 0 --sample-len 0 --threads "$threads" "$@" \
        >"$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
    local tok mb
    tok=$(sed -n 's/^step *\([0-9]*\)\/[0-9]*  loss .*  \([0-9]*\) tok\/s.*/\1 \2/p' "$work/run.log" | awk '$1 > 1 { print $2 }' | sort -n |
          awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    mb=$(sed -n 's/.*memory: params \([0-9.]*\) MB, grads \([0-9.]*\) MB, adam \([0-9.]*\) MB.*/\1 \2 \3/p' "$work/run.log" | awk '{ print $1 + $2 + $3 }')
    echo "$tok $mb"
}
read -r lora_tok lora_mb < <(run --lora-rank 8)
read -r full_tok full_mb < <(run)
peer=$(/usr/bin/python3 tools/bench/peer_lora_torch.py "$work/model" 8 "$B" "$T" "$STEPS" "$threads" | tail -n 1)
torch_ms=$(sed -n 's/.* step_ms=\([0-9.]*\).*/\1/p' <<<"$peer")
echo "pdde LoRA   $lora_tok tok/s, parameters + gradients + AdamW $lora_mb MB"
echo "pdde full   $full_tok tok/s, parameters + gradients + AdamW $full_mb MB"
echo "PyTorch     $peer"
awk -v lt="$lora_tok" -v ft="$full_tok" -v lm="$lora_mb" -v fm="$full_mb" -v tms="$torch_ms" -v B="$B" -v T="$T" -v threads="$threads" 'BEGIN {
    tt = B * T / (tms / 1e3)
    printf "RESULT lora_cpu torch_ratio=%.2f full_ratio=%.2f mem_ratio=%.1f lora_tok_s=%.0f torch_tok_s=%.0f full_tok_s=%.0f lora_mb=%.1f full_mb=%.1f B=%d T=%d threads=%d\n",
           lt / tt, lt / ft, fm / lm, lt, tt, ft, lm, fm, B, T, threads }'
