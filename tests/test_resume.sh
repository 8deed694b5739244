#!/usr/bin/env bash
# A resumed run keeps the learning-rate schedule of the run it resumes: a 20-step run stopped after 10
# steps and resumed with --steps 30 trains steps 11-20 with exactly the learning rates (and so the
# losses) of an uninterrupted 20-step run, and says that it keeps the checkpoint's schedule;
# --reschedule says it changes it and follows the new one. Run from the repository root.
. tests/script_util.sh resume
gpt=(--val-every 0 --sample-len 0 --threads 1 --layers 2 --width 64 --heads 2 --seed 5)

"$build/gpt" "${gpt[@]}" --steps 20 --metrics "$tmp/full.jsonl" >"$tmp/full.log" 2>&1
rc=$?
check "the uninterrupted 20-step run ($(tail -1 "$tmp/full.log"))" $rc
"$build/gpt" "${gpt[@]}" --steps 20 --stop-after 10 --ckpt-dir "$tmp/ck" --metrics "$tmp/a.jsonl" >"$tmp/a.log" 2>&1
rc=$?
check "a 20-step run stopped after step 10 ($(tail -1 "$tmp/a.log"))" $rc
cp -r "$tmp/ck" "$tmp/ck2"
cp -r "$tmp/ck" "$tmp/ck_heads"
"$build/gpt" "${gpt[@]}" --steps 30 --resume --ckpt-dir "$tmp/ck" --metrics "$tmp/b.jsonl" >"$tmp/b.log" 2>&1
rc=$?
check "resumed with --steps 30 ($(tail -1 "$tmp/b.log"))" $rc
grep -q "over 20 steps .*over 30 .*keeping the checkpoint's schedule" "$tmp/b.log"
rc=$?
check "the resume says it keeps the 20-step schedule ($(grep 'schedule' "$tmp/b.log" | head -1))" $rc

python3 - "$tmp/full.jsonl" "$tmp/a.jsonl" "$tmp/b.jsonl" >"$tmp/cmp" 2>&1 <<'PY'
import json, math, sys
def rows(p): return {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
full, a, b = map(rows, sys.argv[1:])
assert sorted(a) == list(range(1, 11)) and sorted(b) == list(range(11, 31)), (sorted(a), sorted(b))
for k in range(11, 21):
    assert b[k]["lr"] == full[k]["lr"], "step %d: lr %g resumed, %g uninterrupted" % (k, b[k]["lr"], full[k]["lr"])
    assert math.isfinite(b[k]["loss"]) and abs(b[k]["loss"] - full[k]["loss"]) <= 1e-4 * abs(full[k]["loss"]), \
        "step %d: loss %g resumed, %g uninterrupted" % (k, b[k]["loss"], full[k]["loss"])
assert all(b[k]["lr"] == b[21]["lr"] for k in range(21, 31)) and b[21]["lr"] < full[20]["lr"], \
    "past its end the schedule stays at its minimum: %s" % [b[k]["lr"] for k in range(19, 31)]
print("ok: lr and loss of steps 11-20 as uninterrupted (step 15: lr %g, loss %.5f)" % (b[15]["lr"], b[15]["loss"]))
PY
rc=$?
check "steps 11-20 after the resume have the uninterrupted run's lr and loss ($(tail -1 "$tmp/cmp"))" $rc

"$build/gpt" "${gpt[@]}" --steps 30 --resume --reschedule --ckpt-dir "$tmp/ck2" --metrics "$tmp/c.jsonl" >"$tmp/c.log" 2>&1
rc=$?
check "resumed with --steps 30 --reschedule ($(tail -1 "$tmp/c.log"))" $rc
grep -q "CHANGING to this run's schedule" "$tmp/c.log" &&
    python3 -c "
import json, sys
c = {r['step']: r for r in map(json.loads, open('$tmp/c.jsonl')) if 'loss' in r}
f = {r['step']: r for r in map(json.loads, open('$tmp/full.jsonl')) if 'loss' in r}
sys.exit(0 if c[15]['lr'] > f[15]['lr'] else 1)"
check "--reschedule says it changes the schedule and stretches the cosine over 30 steps" $?

# the heads do not show in the tensors' shapes: the flags kept beside the checkpoint refuse other heads, naming
# the flag and both values, nothing trained or written; a checkpoint without them (an older gpt's) loads, said
before=$(cd "$tmp/ck_heads" && find . -type f | sort | xargs md5sum)
"$build/gpt" "${gpt[@]}" --heads 4 --steps 20 --resume --ckpt-dir "$tmp/ck_heads" >"$tmp/heads.log" 2>&1
rc=$?
after=$(cd "$tmp/ck_heads" && find . -type f | sort | xargs md5sum)
[ $rc != 0 ] && grep -q "cannot resume: .*saved with --heads 2, this run has --heads 4: give the model flags that saved it" "$tmp/heads.log" &&
    ! grep -q 'step *[0-9]*/20' "$tmp/heads.log" && [ "$before" = "$after" ]
ok=$?
check "resumed with --heads 4 from a --heads 2 checkpoint: refused naming both, nothing trained or written (rc $rc: $(grep -m1 'cannot resume' "$tmp/heads.log" | cut -c1-150))" $ok
# an attention window is such a flag too
"$build/gpt" "${gpt[@]}" --window 4 --steps 20 --resume --ckpt-dir "$tmp/ck_heads" >"$tmp/window.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "cannot resume: .*saved with --window 0, this run has --window 4" "$tmp/window.log" && ! grep -q 'step *[0-9]*/20' "$tmp/window.log"
ok=$?
check "resumed with --window 4 from a checkpoint without a window: refused naming both (rc $rc: $(grep -m1 'cannot resume' "$tmp/window.log" | cut -c1-150))" $ok
rm -f "$tmp/ck_heads/gpt-model-flags.txt"
"$build/gpt" "${gpt[@]}" --steps 20 --resume --ckpt-dir "$tmp/ck_heads" >"$tmp/old.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "has no gpt-model-flags.txt (a checkpoint of an older gpt)" "$tmp/old.log" && grep -q "resumed from .* at step 10" "$tmp/old.log" &&
    [ -f "$tmp/ck_heads/gpt-model-flags.txt" ]
ok=$?
check "a checkpoint without the model flags file loads, saying so, and the next save writes it (rc $rc: $(grep -m1 'has no' "$tmp/old.log" | cut -c1-120))" $ok

# MoE with DeepSeek's balancing bias (an input gpt updates between steps, pdde_mark_state): the checkpoint keeps
# it, so the resumed steps equal the uninterrupted run's (a bias restarted from zeros routes otherwise)
moe=(--moe-experts 4 --moe-bias-rate 0.02 --steps 20)
"$build/gpt" "${gpt[@]}" "${moe[@]}" --metrics "$tmp/moe_full.jsonl" >"$tmp/moe_full.log" 2>&1 &&
    "$build/gpt" "${gpt[@]}" "${moe[@]}" --stop-after 10 --ckpt-dir "$tmp/moe_ck" >"$tmp/moe_a.log" 2>&1 &&
    "$build/gpt" "${gpt[@]}" "${moe[@]}" --resume --ckpt-dir "$tmp/moe_ck" --metrics "$tmp/moe_b.jsonl" >"$tmp/moe_b.log" 2>&1
rc=$?
check "MoE with --moe-bias-rate: 20 steps, 10 and a resume ($(tail -1 "$tmp/moe_b.log"))" $rc
python3 - "$tmp/moe_full.jsonl" "$tmp/moe_b.jsonl" >"$tmp/moe_cmp" 2>&1 <<'PY'
import json, math, sys
full, b = ({r["step"]: r for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:])
assert sorted(b) == list(range(11, 21)), sorted(b)
for k in range(11, 21):
    assert math.isfinite(b[k]["loss"]) and abs(b[k]["loss"] - full[k]["loss"]) <= 1e-6 * abs(full[k]["loss"]), \
        "step %d: loss %.9g resumed, %.9g uninterrupted" % (k, b[k]["loss"], full[k]["loss"])
print("ok: steps 11-20 equal the uninterrupted run's (step 11: %.7f)" % b[11]["loss"])
PY
rc=$?
check "MoE with its balancing bias: the resumed steps equal the uninterrupted run's ($(tail -1 "$tmp/moe_cmp"))" $rc

# A signal stops training after the step every rank is in and saves a checkpoint there: SIGTERM to rank 1 alone of a
# pdde-run -n 2 --dp 2 job (rank 0, never signaled, stops after the same step: the checkpoint is whole), exit 143;
# the resumed steps have the losses of a run never stopped. One process, SIGINT, no --ckpt-dir: 130, nothing saved.
long=("${gpt[@]}" --steps 100000)
wait_step() { for _ in $(seq 600); do grep -q "step *$2/" "$1" && return 0; sleep 0.1; done; return 1; }
timeout 120 "$build/pdde-run" -n 2 --grace 30 "$build/gpt" "${long[@]}" --dp 2 --ckpt-dir "$tmp/cks" >"$tmp/sig.log" 2>&1 &
job=$!
wait_step "$tmp/sig.log" 21 && kill -TERM "$(pgrep -P "$(pgrep -P $job)" | sort -n | tail -1)"
wait $job
rc=$?
n=$(sed -n 's/^\[0\] gpt: Terminated: stopped after step \([0-9]*\), saved a checkpoint in .*/\1/p' "$tmp/sig.log")
at=$("$build/pdde-ckpt" info "$tmp/cks" | sed -n 's/^step \([0-9]*\) .*/\1/p')
[ $rc = 143 ] && [ -n "$n" ] && [ "$at" = "$n" ]
ok=$?
check "SIGTERM to rank 1 of 2: both stop after step ${n:-?} and save it (the checkpoint's step ${at:-none}; rc $rc)" $ok
if [ $ok = 0 ]; then
    timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "${long[@]}" --dp 2 --stop-after $((n + 3)) --metrics "$tmp/sigref.jsonl" >"$tmp/sigref.log" 2>&1
    rc=$?
    timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "${long[@]}" --dp 2 --stop-after $((n + 3)) --ckpt-dir "$tmp/cks" --resume \
        --metrics "$tmp/sigres.jsonl" >"$tmp/sigres.log" 2>&1
    rc2=$?
    python3 - "$tmp/sigref.jsonl" "$tmp/sigres.jsonl" "$n" >"$tmp/sig_cmp" 2>&1 <<'PY'
import json, math, sys
ref, res = ({r["step"]: r for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:3])
n = int(sys.argv[3])
assert sorted(res) == [n + 1, n + 2, n + 3], sorted(res)
for k in res:
    assert math.isfinite(res[k]["loss"]) and abs(res[k]["loss"] - ref[k]["loss"]) <= 1e-6 * abs(ref[k]["loss"]), \
        "step %d: loss %.9g resumed, %.9g never stopped" % (k, res[k]["loss"], ref[k]["loss"])
print("ok: steps %d-%d as never stopped (step %d: %.7f)" % (n + 1, n + 3, n + 1, res[n + 1]["loss"]))
PY
    ok=$?
    check "the resume after the signal goes on as a run never stopped ($(tail -1 "$tmp/sig_cmp"); rc $rc/$rc2)" $((rc || rc2 || ok))
fi
"$build/gpt" "${long[@]}" >"$tmp/int.log" 2>&1 &
job=$!
wait_step "$tmp/int.log" 11 && kill -INT $job
wait $job
rc=$?
[ $rc = 130 ] && grep -q "^gpt: Interrupt: stopped after step [0-9]* (no --ckpt-dir: nothing saved)" "$tmp/int.log"
ok=$?
check "SIGINT to one process without --ckpt-dir: stops after a step, saying nothing was saved (rc $rc: $(grep -m1 'stopped after' "$tmp/int.log"))" $ok

finish
