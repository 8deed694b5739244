#!/usr/bin/env bash
# What a run shows of itself: gpt --trace writes a Chrome/Perfetto trace that parses as JSON with ops on
# the device lane and a run per step; pdde-run --trace merges a 2-stage pipeline's ranks into one file
# holding both ranks' ops, sends/receives and micro-batch passes; --log-dir keeps each rank's output;
# gpt --metrics writes a JSON line per step (step, loss, lr, tokens/s, memory); pdde-plot draws two
# metrics files into one SVG; every tool's --help is on stdout with exit 0 and a bad argument exits 2.
# Run from the repository root.
. tests/script_util.sh trace
gpt=(--steps 4 --val-every 2 --sample-len 0 --threads 1 --layers 2 --width 64 --heads 2)

"$build/gpt" "${gpt[@]}" --trace "$tmp/one.json" --metrics "$tmp/one.jsonl" >"$tmp/one.log" 2>&1
rc=$?
check "gpt --trace --metrics exits 0 ($(tail -1 "$tmp/one.log"))" $rc
python3 - "$tmp/one.json" >"$tmp/one.check" 2>&1 <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in ev if e.get("ph") == "X"]
assert all(k in e for e in x for k in ("name", "cat", "ts", "dur", "pid", "tid")), "an event lacks a field"
assert all(e["dur"] >= 0 and e["ts"] > 0 for e in x), "negative duration or no timestamp"
ops = [e for e in x if e["cat"] == "op" and e["tid"] == 0]
runs = [e for e in x if e["cat"] == "run" and e["name"] == "step"]
assert len(runs) == 4, "want 4 steps, got %d" % len(runs)
assert any(e["name"].startswith("matmul") for e in ops), "no matmul on device 0"
names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
assert any(n.startswith("device 0") for n in names), names
print("ok: %d events, %d ops, %d steps" % (len(x), len(ops), len(runs)))
PY
rc=$?
check "the trace parses and holds ops on device 0 and 4 steps ($(tail -1 "$tmp/one.check"))" $rc

python3 - "$tmp/one.jsonl" >"$tmp/metrics.check" 2>&1 <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
assert [r["step"] for r in train] == [1, 2, 3, 4], [r["step"] for r in train]
assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["memory_bytes"] > 0 and r["lr"] > 0 for r in train)
assert [r["step"] for r in rows if "val_loss" in r] == [2, 4]
print("ok: losses", [round(r["loss"], 3) for r in train])
PY
rc=$?
check "gpt --metrics: one line per step with loss, lr, tokens/s, memory; validation at 2 and 4 ($(tail -1 "$tmp/metrics.check"))" $rc

if [ -x "$build/pdde-run" ]; then
    timeout 120 "$build/pdde-run" -n 2 --log-dir "$tmp/logs" --trace "$tmp/pp.json" "$build/gpt" "${gpt[@]}" --pp 2 --micro 2 \
        >"$tmp/pp.log" 2>&1
    rc=$?
    check "pdde-run -n 2 --trace gpt --pp 2 --micro 2 exits 0 ($(tail -1 "$tmp/pp.log"))" $rc
    python3 - "$tmp/pp.json" >"$tmp/pp.check" 2>&1 <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in ev if e.get("ph") == "X"]
for rank in (0, 1):
    mine = [e for e in x if e["pid"] == rank]
    cats = {e["cat"] for e in mine}
    assert {"op", "micro-batch", "run"} <= cats, (rank, cats)
    assert {e["args"].get("micro") for e in mine if e["cat"] == "micro-batch" and e["name"] != "update"} == {0, 1}, rank
    assert any(e["cat"] == ("send" if rank == 0 else "recv") and e["tid"] == 1000 for e in mine), (rank, cats)
names = {(e["pid"], e["args"]["name"]) for e in ev if e.get("name") == "process_name"}
assert names == {(0, "rank 0"), (1, "rank 1")}, names
print("ok: %d events from ranks %s" % (len(x), sorted({e["pid"] for e in x})))
PY
    rc=$?
    check "the merged trace has both ranks' ops, sends/receives and micro-batches ($(tail -1 "$tmp/pp.check"))" $rc
    ! ls "$tmp"/pp.json.rank* >/dev/null 2>&1
    check "the ranks' trace parts are removed after merging" $?
    grep -q "^gpt: " "$tmp/logs/rank0.log" && grep -q "^gpt: " "$tmp/logs/rank1.log" && ! grep -q "^\[1\]" "$tmp/logs/rank1.log"
    check "--log-dir: rank0.log and rank1.log hold each rank's own lines, unprefixed" $?
    if [ "$(nproc)" -ge 2 ]; then # --bind cores: one core each (PDDE_NUM_THREADS=1), not the same one
        PDDE_NUM_THREADS=1 timeout 30 "$build/pdde-run" -n 2 --bind cores sh -c 'grep Cpus_allowed_list /proc/self/status' >"$tmp/bind.log" 2>&1
        a=$(awk '/^\[0\]/ {print $NF}' "$tmp/bind.log"); b=$(awk '/^\[1\]/ {print $NF}' "$tmp/bind.log")
        [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ] && ! echo "$a$b" | grep -q '[-,]'
        check "--bind cores: each rank on one core of its own (rank 0: '$a', rank 1: '$b')" $?
    fi
else
    echo "SKIP: pdde-run (no comm in this build)"
fi

"$build/gpt" "${gpt[@]}" --lr 1e-3 --metrics "$tmp/two.jsonl" >/dev/null 2>&1 &&
    "$build/pdde-plot" "$tmp/one.jsonl" "$tmp/two.jsonl" -o "$tmp/loss.svg" --title "two <runs>"
check "pdde-plot draws two metrics files" $?
python3 - "$tmp/loss.svg" >"$tmp/svg.check" 2>&1 <<'PY'
import sys, xml.etree.ElementTree as E
root = E.parse(sys.argv[1]).getroot()
lines = [p for p in root.iter("{http://www.w3.org/2000/svg}polyline")]
loss = [p for p in lines if p.get("class") == "loss"]
assert len(loss) == 2 and all(len(p.get("points").split()) == 4 for p in loss), [p.get("points") for p in loss]
assert len(set(p.get("stroke") for p in loss)) == 2
print("ok: %d curves" % len(lines))
PY
rc=$?
check "the SVG parses with one 4-point loss curve per run in its own colour ($(tail -1 "$tmp/svg.check"))" $rc
printf '{"step":1}\n' >"$tmp/empty.jsonl"
"$build/pdde-plot" "$tmp/empty.jsonl" -o "$tmp/x.svg" 2>"$tmp/empty.err"
[ $? -eq 1 ] && grep -q "no line with" "$tmp/empty.err"
rc=$?
check "pdde-plot refuses a file without losses ($(cat "$tmp/empty.err"))" $rc

for tool in gpt pdde-plot pdde-run test_backend_ops; do
    [ -x "$build/$tool" ] || continue
    "$build/$tool" --help >"$tmp/h.out" 2>"$tmp/h.err"
    code=$?
    [ $code -eq 0 ] && [ -s "$tmp/h.out" ] && [ ! -s "$tmp/h.err" ]
    check "$tool --help: stdout, exit 0 (exit $code)" $?
    "$build/$tool" --no-such-flag >"$tmp/b.out" 2>"$tmp/b.err"
    code=$?
    [ $code -eq 2 ] && grep -q -- "--no-such-flag" "$tmp/b.err"
    rc=$?
    check "$tool --no-such-flag: exit 2 naming it (exit $code: $(head -1 "$tmp/b.err"))" $rc
done

finish
