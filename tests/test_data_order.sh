#!/usr/bin/env bash
# Exact data order: the data position is the global sample index and the dp ranks split each global
# batch by the plan, so gpt --dp 2 (even, and uneven shares 3:1) trains on the samples one process does:
# every step's loss equals one process's within 1e-6 relative (NaN fails). The position is in every
# checkpoint, so a job resized at a checkpoint goes on with the same samples: 1 process for 10 steps,
# then 2 ranks (dp 2) for 10 more, and 2 ranks (shares 3:1) for 10 steps, then 1 process for 10 more,
# each equal to 20 steps of one process; and a job that resumes from a checkpoint written in the
# background (gpt --ckpt-async) after the next save was killed. Run from the repository root.
. tests/script_util.sh data_order
if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: no build/pdde-run (this build has no UCX)"
    finish
    exit
fi
gpt=(--val-every 0 --sample-len 0 --threads 1 --layers 2 --width 64 --heads 2 --seed 5 --steps 20)
run2() { timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "$@"; }

"$build/gpt" "${gpt[@]}" --metrics "$tmp/one.jsonl" >"$tmp/one.log" 2>&1
rc=$?
check "one process, 20 steps ($(tail -1 "$tmp/one.log"))" $rc
run2 "${gpt[@]}" --dp 2 --metrics "$tmp/dp2.jsonl" >"$tmp/dp2.log" 2>&1
rc=$?
check "2 ranks, --dp 2 ($(tail -1 "$tmp/dp2.log"))" $rc
run2 "${gpt[@]}" --plan dp=2,shares=3:1 --metrics "$tmp/shares.jsonl" >"$tmp/shares.log" 2>&1
rc=$?
check "2 ranks, --plan dp=2,shares=3:1 ($(tail -1 "$tmp/shares.log"))" $rc

# resized at step 10: 1 -> 2 ranks, and 2 ranks (uneven) -> 1
"$build/gpt" "${gpt[@]}" --stop-after 10 --ckpt-dir "$tmp/up" --metrics "$tmp/up.jsonl" >"$tmp/up1.log" 2>&1 &&
    run2 "${gpt[@]}" --dp 2 --resume --ckpt-dir "$tmp/up" --metrics "$tmp/up.jsonl" >"$tmp/up2.log" 2>&1
rc=$?
check "1 process for 10 steps, then 2 ranks resume ($(grep -h 'resumed from' "$tmp/up2.log"))" $rc
run2 "${gpt[@]}" --plan dp=2,shares=3:1 --stop-after 10 --ckpt-dir "$tmp/down" --metrics "$tmp/down.jsonl" >"$tmp/down1.log" 2>&1 &&
    "$build/gpt" "${gpt[@]}" --resume --ckpt-dir "$tmp/down" --metrics "$tmp/down.jsonl" >"$tmp/down2.log" 2>&1
rc=$?
check "2 ranks (shares 3:1) for 10 steps, then 1 process resumes ($(grep -h 'resumed from' "$tmp/down2.log"))" $rc

# --ckpt-async: the checkpoint of step 8, written in the background while steps 9 and 10 ran, is the
# one left when the save of step 10 dies before its manifest's rename; resumed, it goes on as above
PDDE_CHECKPOINT_PAUSE=manifest:3 "$build/gpt" "${gpt[@]}" --stop-after 10 --ckpt-every 4 --ckpt-async --ckpt-dir "$tmp/async" \
    --metrics "$tmp/async1.jsonl" >"$tmp/async1.log" 2>&1 &
bg=$!
for i in $(seq 300); do grep -q 'checkpoint paused' "$tmp/async1.log" && break; sleep 0.1; done
pid=$(grep -o 'paused at manifest:3 (pid [0-9]*' "$tmp/async1.log" | grep -o '[0-9]*$')
[ -n "$pid" ] && kill -9 "$pid"
wait $bg 2>/dev/null
check "--ckpt-async: the save of step 10 paused before its rename and was killed (pid ${pid:-none})" $([ -n "$pid" ] && echo 0 || echo 1)
"$build/gpt" "${gpt[@]}" --resume --ckpt-dir "$tmp/async" --metrics "$tmp/async.jsonl" >"$tmp/async2.log" 2>&1
rc=$?
grep -q 'resumed from .* at step 8 (data position 64)' "$tmp/async2.log"
check "the background checkpoint of step 8 resumes ($(grep -h 'resumed from' "$tmp/async2.log"))" $(( rc || $? ))
head -8 "$tmp/async1.jsonl" | cat - "$tmp/async.jsonl" >"$tmp/async.all" && mv "$tmp/async.all" "$tmp/async.jsonl"

python3 - "$tmp" >"$tmp/cmp" 2>&1 <<'PY'
import json, math, sys
t = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open("%s/%s.jsonl" % (t, name))) if "loss" in r}
one, bad = losses("one"), []
assert sorted(one) == list(range(1, 21)), sorted(one)
for name in ("dp2", "shares", "up", "down", "async"):
    got = losses(name)
    if sorted(got) != list(range(1, 21)):
        bad.append("%s: steps %s" % (name, sorted(got)))
        continue
    worst = max(abs(got[k] - one[k]) / abs(one[k]) if math.isfinite(got[k]) else math.inf for k in got)
    print("%s: worst relative loss difference %.2g" % (name, worst))
    if not worst <= 1e-6:
        bad.append("%s: %s" % (name, [(k, got[k], one[k]) for k in sorted(got) if not abs(got[k] - one[k]) <= 1e-6 * abs(one[k])][:3]))
print("; ".join(bad) if bad else "ok: every run's 20 losses equal one process's within 1e-6")
sys.exit(1 if bad else 0)
PY
rc=$?
check "the same samples in every run: losses equal one process's ($(tr '\n' ' ' <"$tmp/cmp"))" $rc
cat "$tmp/cmp"
finish
