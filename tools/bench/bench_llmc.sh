#!/usr/bin/env bash
# bench-llmc: pdde against llm.c's CPU trainer (train_gpt2.c: an independent C GPT-2) on one GPT-2 124M
# model file, the same token shards, batches and update, in one run. Both read the file and compute the
# loss of the same 5 validation batches before training, then train STEPS steps on the same batches:
# the losses must agree (an independent check of the model file and of pdde's whole step), and
# step_ratio is llm.c's median step time over pdde's (> 1: pdde faster).
#   LLMC_DIR=path/to/llm.c bash tools/bench/bench_llmc.sh [build]     # B, T, STEPS, THREADS: overrides
set -euo pipefail
build=${1:-build}
llmc=${LLMC_DIR:?set LLMC_DIR to a checkout of https://github.com/karpathy/llm.c}
threads=${THREADS:-$(nproc)} B=${B:-4} T=${T:-64} STEPS=${STEPS:-6}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# llm.c's own build flags (its Makefile's CFLAGS, with OpenMP)
cc -Ofast -march=native -fopenmp -Wno-unused-result -I"$llmc" -I. tools/bench/peer_llmc.c -o "$work/peer_llmc" -lm
# shards in llm.c's format (magic 20240520, version 1, u16 ids): a text's bytes spread over GPT-2's ids
python3 - "$work" <<'PY'
import glob, struct, sys
text = b"".join(open(p, "rb").read() for p in sorted(glob.glob("/usr/share/games/fortunes/*"))[:20] + ["README.md"])
ids = [(196 * b + i % 196) % 50257 for i, b in enumerate(text)]
cut = len(ids) * 9 // 10
for name, part in (("train", ids[:cut]), ("val", ids[cut:])):
    with open("%s/%s.bin" % (sys.argv[1], name), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)) + struct.pack("<%dH" % len(part), *part))
PY
# the model: GPT-2 124M as pdde initializes it, trained 2 steps (weights away from the init), in llm.c's format
"$build/gpt" --data "$work/train.bin" --vocab 50257 --layers 12 --heads 12 --width 768 --ctx "$T" --batch "$B" --steps 2 \
    --val-every 0 --sample-len 0 --threads "$threads" --save-llmc "$work/model.bin" >"$work/gpt.log" 2>&1 || { cat "$work/gpt.log"; exit 1; }
p=$("$build/bench_llmc" "$work/model.bin" "$work/train.bin" "$work/val.bin" --batch "$B" --ctx "$T" --steps "$STEPS" --threads "$threads" | tail -n 1)
l=$("$work/peer_llmc" "$work/model.bin" "$work/train.bin" "$work/val.bin" "$B" "$T" "$STEPS" 5 | tail -n 1)
echo "pdde  $p"
echo "llm.c $l"
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
awk -v pv="$(field val_loss "$p")" -v lv="$(field val_loss "$l")" -v pm="$(field step_ms "$p")" -v lm="$(field step_ms "$l")" \
    -v pl="$(field losses "$p")" -v ll="$(field losses "$l")" -v threads="$threads" -v B="$B" -v T="$T" 'BEGIN {
    n = split(pl, a, ","); split(ll, b, ","); worst = 0
    for (i = 1; i <= n; i++) { d = (a[i] - b[i]) / b[i]; if (d < 0) d = -d; if (!(d <= worst)) worst = d }
    dv = (pv - lv) / lv; if (dv < 0) dv = -dv
    printf "RESULT llmc_cpu step_ratio=%.2f pdde_step_ms=%.1f llmc_step_ms=%.1f val_loss_rel_err=%.2g loss_max_rel_err=%.2g steps=%d B=%d T=%d threads=%d\n",
           lm / pm, pm, lm, dv, worst, n, B, T, threads }'
