#!/usr/bin/env bash
# bench-checkpoint: what checkpoints cost a training job. gpt on 2 ranks (dp 2, ZeRO-1: both ranks
# write shards) trains STEPS steps without checkpoints, with a sharded checkpoint every EVERY steps
# written synchronously (the step waits for the disk: the usual way, and the peer here), and written in
# the background (--ckpt-async: a host copy, the file on a thread, the manifest at the next one). The
# background can hide the disk only when it writes a checkpoint within the steps between two.
# Repeats interleaved; medians of the training time; the overheads against no checkpoints and their
# ratio. The checkpoint directory is on $CKPT_TMP (default /tmp); DATA: the text to train on (gpt's default).
set -euo pipefail
build=${1:-build}
reps=${REPS:-3} steps=${STEPS:-40} every=${EVERY:-10} threads=${THREADS:-2}
model=(--layers ${LAYERS:-4} --width ${WIDTH:-256} --heads 4 --ctx 64 --batch 8)
dir=$(mktemp -d "${CKPT_TMP:-/tmp}/pdde-bench-ckpt.XXXXXX")
trap 'rm -rf "$dir"' EXIT
run() { # mode -> seconds from the start of training to the end of the last step (the checkpoints in
    # between included, the final one after it not: it is the same in every mode)
    local extra=()
    rm -rf "$dir/ck" "$dir/m.jsonl"
    [ "$1" != none ] && extra=(--ckpt-dir "$dir/ck" --ckpt-every "$every")
    [ "$1" = async ] && extra+=(--ckpt-async)
    "$build/pdde-run" -n 2 "$build/gpt" "${model[@]}" --steps "$steps" --val-every 0 --sample-len 0 --threads "$threads" \
        --dp 2 --zero 1 --metrics "$dir/m.jsonl" ${DATA:+--data "$DATA"} "${extra[@]}" >"$dir/log" 2>&1 &&
        grep "\"step\":$steps,\"loss\"" "$dir/m.jsonl" | sed -n 's/.*"time_s":\([0-9.]*\).*/\1/p'
    # the loop's own wait for the checkpoints before the last (gpt's clock around its save calls)
    [ "$1" != none ] && sed -n 's/.*gpt: the \([0-9]*\) checkpoints before the last held the training loop \([0-9.]*\) s.*/\2/p' "$dir/log" >"$dir/held.$1.last"
    return 0
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "bench-checkpoint: $steps steps, a checkpoint every $every, $reps repeats, $threads threads a rank; load: $(uptime | sed 's/.*load/load/')"
: >"$dir/none"; : >"$dir/sync"; : >"$dir/async"; : >"$dir/held.sync"; : >"$dir/held.async"
for r in $(seq "$reps"); do
    for mode in none sync async; do
        t=$(run $mode)
        held=$(cat "$dir/held.$mode.last" 2>/dev/null || true)
        echo "  repeat $r $mode: ${t:-FAILED} s${held:+ (checkpoints held the loop $held s)}"
        [ -n "$t" ] && echo "$t" >>"$dir/$mode"
        [ -n "$held" ] && echo "$held" >>"$dir/held.$mode"
    done
done
run sync >/dev/null
mb=$(du -sm "$dir/ck" | cut -f1)
none=$(median <"$dir/none") sync=$(median <"$dir/sync") async=$(median <"$dir/async")
sync_pct=$(awk -v a="$sync" -v b="$none" 'BEGIN{printf "%.1f", 100 * (a - b) / b}')
async_pct=$(awk -v a="$async" -v b="$none" 'BEGIN{printf "%.1f", 100 * (a - b) / b}')
ratio=$(awk -v a="$sync" -v b="$none" -v c="$async" 'BEGIN{d = c - b; printf "%.2f", (d > 0.001 ? (a - b) / d : 0)}')
n=$(( (steps - 1) / every )) # the checkpoints inside the timed span
stall() { awk -v a="$1" -v b="$none" -v n="$n" 'BEGIN{printf "%.3f", (a - b) / n}'; }
echo "medians: none $none s, sync $sync s, async $async s; $n checkpoints of ${mb} MB: $(stall "$sync") s and $(stall "$async") s each"
held_sync=$(median <"$dir/held.sync") held_async=$(median <"$dir/held.async")
echo "the loop waited for its $n checkpoints before the last: sync $held_sync s, async $held_async s (medians)"
echo "RESULT checkpoint held_sync_s=$held_sync held_async_s=$held_async sync_overhead_pct=$sync_pct async_overhead_pct=$async_pct sync_over_async=$ratio sync_stall_s=$(stall "$sync") async_stall_s=$(stall "$async") ckpt_mb=$mb every=$every"
