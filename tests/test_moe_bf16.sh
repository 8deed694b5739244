#!/usr/bin/env bash
# An MoE GPT in bf16 (gpt --moe-experts 4 --dtype bf16) on 2 ranks under pdde-run with the experts split
# over them (--dp 2 --moe-ep: the tokens' rows exchanged all-to-all) against one process in bf16: every
# step's loss within TOL_EP relative, closer than the f32 run is (the f32 run differs: the bf16 path
# ran); and the exchanges carry bf16 (2 bytes an element in the program --show-program prints), not
# f32. Run from the repository root.
. tests/script_util.sh moe_bf16
if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: no build/pdde-run (this build has no UCX)"
    finish
    exit
fi
gpt=(--val-every 0 --sample-len 0 --threads 1 --layers 2 --width 64 --heads 2 --seed 5 --steps 10 --moe-experts 4 --moe-topk 2)
run2() { timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "$@"; }

"$build/gpt" "${gpt[@]}" --dtype bf16 --metrics "$tmp/one.jsonl" >"$tmp/one.log" 2>&1
rc=$?
check "one process, bf16 ($(tail -1 "$tmp/one.log"))" $rc
run2 "${gpt[@]}" --dtype bf16 --dp 2 --moe-ep --metrics "$tmp/ep2.jsonl" >"$tmp/ep2.log" 2>&1
rc=$?
check "2 ranks, --dp 2 --moe-ep, bf16 ($(tail -1 "$tmp/ep2.log"))" $rc
"$build/gpt" "${gpt[@]}" --metrics "$tmp/f32.jsonl" >"$tmp/f32.log" 2>&1
rc=$?
check "one process, f32 ($(tail -1 "$tmp/f32.log"))" $rc

# the exchanges of one step: every all-to-all (4 a block forward, more backward) moves 2-byte elements
run2 "${gpt[@]}" --steps 1 --dtype bf16 --dp 2 --moe-ep --show-program >"$tmp/prog.log" 2>&1
rc=$?
check "the bf16 program on 2 ranks (exit $rc)" $rc
read -r n_a2a n_bf16 < <(awk '$4 == "alltoall" { n++; split(substr($6, 2, length($6) - 2), d, ","); e = 1; for (i in d) e *= d[i];
                               if ($(NF - 1) == 2 * e) b++ } END { print n + 0, b + 0 }' "$tmp/prog.log")
[ "$n_a2a" -ge 8 ] && [ "$n_a2a" = "$n_bf16" ]
check "the token exchanges carry bf16: $n_bf16 of $n_a2a all-to-alls of 2-byte elements (want all, at least 8)" $?

python3 - "$tmp" >"$tmp/cmp" 2>&1 <<'PY'
import json, math, sys
t = sys.argv[1]
TOL_EP = 1e-3  # 2 ranks against one process, both bf16 (measured 2.2e-4)
MIN_F32 = 1e-5  # the f32 run's largest difference from the bf16 run must exceed this (measured 7.8e-4)
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open("%s/%s.jsonl" % (t, name))) if "loss" in r}
one, ep2, f32 = losses("one"), losses("ep2"), losses("f32")
steps = list(range(1, 11))
assert sorted(one) == steps and sorted(ep2) == steps and sorted(f32) == steps, (sorted(one), sorted(ep2), sorted(f32))
rel = lambda a, b: abs(a - b) / abs(b) if math.isfinite(a) and math.isfinite(b) else math.inf
ep, fp = max(rel(ep2[k], one[k]) for k in steps), max(rel(f32[k], one[k]) for k in steps)
print("2 ranks (ep 2) against one process in bf16: worst %.2g (tolerance %.2g); f32 against bf16: worst %.2g (at least %.2g)" % (ep, TOL_EP, fp, MIN_F32))
sys.exit(0 if ep <= TOL_EP and fp > MIN_F32 and ep < fp else 1)
PY
rc=$?
check "bf16 losses: $(tr '\n' ' ' <"$tmp/cmp")" $rc
cat "$tmp/cmp"
finish
