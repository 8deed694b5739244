#!/usr/bin/env bash
# pdde-bench's output says what it measured: --check prints a spec's peak in GFLOP/s or TFLOP/s by its
# size (a CPU's 50 GFLOP/s is not 0.1 TFLOP/s), and a --quick run's collectives print the time measured
# at the smallest size as the latency (the value the cluster file keeps), the line fit through the
# larger sizes labelled as such; a file without the intra link's bandwidth or a measured collective
# (pdde-bench --no-comm) is flagged. Run from the repository root: build/test_pdde_bench.
. tests/script_util.sh pdde-bench
spec() { # NAME PEAK_FLOPS
    echo "{\"name\": \"$1\", \"kind\": \"cpu\", \"backend\": \"cpu\", \"peak_flops\": $2, \"mem_bandwidth\": 1e10, \"gemm\": [],
           \"curves\": {\"elementwise\": [], \"row\": [], \"attention\": [], \"embedding\": [], \"optimizer\": []}}"
}
cat >"$tmp/two.json" <<JSON
{"format": "pdde-cluster", "version": 1, "name": "two", "specs": [$(spec slow 5e10), $(spec fast 2.5e12)],
 "machines": [{"id": 0, "name": "host", "cores": 2, "numa_nodes": 1, "host_memory": 8000000000, "l3_cache": 0,
               "intra": {"kind": "shm", "bandwidth": 5e9, "latency": 2e-6, "group": -1},
               "nic": {"kind": "net", "bandwidth": 0, "latency": 0, "group": -1},
               "devices": [{"id": 0, "spec": "slow", "memory": 8000000000}, {"id": 1, "spec": "fast", "memory": 8000000000}]}],
 "links": [], "collectives": []}
JSON
"$build/pdde-bench" --check "$tmp/two.json" >"$tmp/check.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -Eq ' slow +cpu +50\.0 GFLOP/s f32 peak' "$tmp/check.out" && grep -Eq ' fast +cpu +2\.5 TFLOP/s f32 peak' "$tmp/check.out"
ok=$?
check "--check: 5e10 FLOP/s as 50.0 GFLOP/s, 2.5e12 as 2.5 TFLOP/s (rc $rc: $(grep -o '[0-9.]* [GT]FLOP/s' "$tmp/check.out" | tr '\n' ' '))" $ok

# a file without the intra link's bandwidth or a measured collective (pdde-bench --no-comm): flagged, exit 1
sed 's/"bandwidth": 5e9/"bandwidth": 0/' "$tmp/two.json" >"$tmp/nolink.json"
"$build/pdde-bench" --check "$tmp/nolink.json" >"$tmp/nolink.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q 'machine 0 ("host") has intra bandwidth 0 .*run pdde-bench without --no-comm' "$tmp/nolink.out"
ok=$?
check "--check flags intra bandwidth 0 without a measured collective (rc $rc: $(grep -m1 -o 'has intra.\{40\}' "$tmp/nolink.out"))" $ok

if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: pdde without UCX measures no collectives"
    finish; exit
fi
timeout 300 nice "$build/pdde-bench" --quick --devices cpu -o "$tmp/cl.json" >"$tmp/bench.out" 2>&1
rc=$?
check "pdde-bench --quick --devices cpu writes a cluster file (rc $rc: $(tail -1 "$tmp/bench.out"))" $rc
line=$(grep -E '^  allreduce +auto ' "$tmp/bench.out")
python3 - "$tmp/cl.json" "$line" <<'PY'
import json, re, sys
m = re.search(r"latency +([0-9.]+) us +fit +(-?[0-9.]+) us \+ bytes / +([0-9.]+) GB/s", sys.argv[2])
cal = [c for c in json.load(open(sys.argv[1]))["collectives"] if c["op"] == "allreduce" and c["algo"] == "auto"]
ok = bool(m) and len(cal) == 1 and abs(cal[0]["latency"] * 1e6 - float(m.group(1))) <= 0.006 \
     and abs(cal[0]["bandwidth"] / 1e9 - float(m.group(3))) <= 0.0006 * max(1, float(m.group(3))) \
     and abs(float(m.group(1)) - max(0.0, float(m.group(2)))) > 0.005  # (not the fit's intercept: a call costs more than 0)
print("printed", m.groups() if m else None, "file", cal)
sys.exit(0 if ok else 1)
PY
check "the allreduce's printed latency is the measured one the file keeps, not the fit's intercept, labelled apart ($line)" $?

# --budget and --time-limit take finite seconds > 0, refused at once, named, otherwise (not NaN or
# trailing text measured as if fine; the other flag's 1 s bounds a run that does start)
for flag in --budget --time-limit; do
    for v in nan inf 5x 0 -1 ''; do
        other=--time-limit; [ $flag = --time-limit ] && other=--budget
        timeout 60 "$build/pdde-bench" --no-comm --devices cpu -o "$tmp/bad.json" $other 1 $flag "$v" >"$tmp/bad.out" 2>&1
        rc=$?
        [ $rc = 2 ] && grep -q -- "pdde-bench: $flag '$v': want seconds > 0" "$tmp/bad.out" && [ ! -e "$tmp/bad.json" ]
        ok=$?
        check "$flag '$v' is refused before measuring (rc $rc: $(head -c 120 "$tmp/bad.out" | tr '\n' ' '))" $ok
        rm -f "$tmp/bad.json"
    done
done
finish
