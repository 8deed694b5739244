#!/usr/bin/env bash
# bench-checkpoint: what checkpoints cost a training job. gpt on 2 ranks (dp 2, ZeRO-1: both ranks
# write shards) trains STEPS steps without checkpoints, with a sharded checkpoint every EVERY steps
# written synchronously (the step waits for the disk: the usual way, and the peer here), and written in
# the background (--ckpt-async: a host copy, the file on a thread, the manifest at the next one).
# Repeats interleaved; medians of the training time; the overheads against no checkpoints and their
# ratio. The checkpoint directory is on $CKPT_TMP (default /tmp); DATA: the text to train on (gpt's default).
set -euo pipefail
build=${1:-build}
reps=${REPS:-3} steps=${STEPS:-40} every=${EVERY:-4} threads=${THREADS:-2}
model=(--layers ${LAYERS:-6} --width ${WIDTH:-384} --heads 6 --ctx 64 --batch 8)
dir=$(mktemp -d "${CKPT_TMP:-/tmp}/pdde-bench-ckpt.XXXXXX")
trap 'rm -rf "$dir"' EXIT
run() { # mode -> seconds from the start of training to the end of the last step (the checkpoints in
    # between included, the final one after it not: it is the same in every mode)
    local extra=()
    rm -rf "$dir/ck" "$dir/m.jsonl"
    [ "$1" != none ] && extra=(--ckpt-dir "$dir/ck" --ckpt-every "$every")
    [ "$1" = async ] && extra+=(--ckpt-async)
    "$build/pdde-run" -n 2 "$build/gpt" "${model[@]}" --steps "$steps" --val-every 0 --sample-len 0 --threads "$threads" \
        --dp 2 --zero 1 --metrics "$dir/m.jsonl" ${DATA:+--data "$DATA"} "${extra[@]}" >/dev/null 2>&1 &&
        grep "\"step\":$steps,\"loss\"" "$dir/m.jsonl" | sed -n 's/.*"time_s":\([0-9.]*\).*/\1/p'
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "bench-checkpoint: $steps steps, a checkpoint every $every, $reps repeats, $threads threads a rank; load: $(uptime | sed 's/.*load/load/')"
: >"$dir/none"; : >"$dir/sync"; : >"$dir/async"
for r in $(seq "$reps"); do
    for mode in none sync async; do
        t=$(run $mode)
        echo "  repeat $r $mode: ${t:-FAILED} s"
        [ -n "$t" ] && echo "$t" >>"$dir/$mode"
    done
done
run sync >/dev/null
mb=$(du -sm "$dir/ck" | cut -f1)
none=$(median <"$dir/none") sync=$(median <"$dir/sync") async=$(median <"$dir/async")
sync_pct=$(awk -v a="$sync" -v b="$none" 'BEGIN{printf "%.1f", 100 * (a - b) / b}')
async_pct=$(awk -v a="$async" -v b="$none" 'BEGIN{printf "%.1f", 100 * (a - b) / b}')
ratio=$(awk -v a="$sync" -v b="$none" -v c="$async" 'BEGIN{d = c - b; printf "%.2f", (d > 0.001 ? (a - b) / d : 0)}')
echo "medians: none $none s, sync $sync s, async $async s; checkpoint ${mb} MB"
echo "RESULT checkpoint sync_overhead_pct=$sync_pct async_overhead_pct=$async_pct sync_over_async=$ratio ckpt_mb=$mb steps=$steps every=$every"
