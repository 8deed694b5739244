#!/usr/bin/env bash
# A new device's calibration as backends/README.md's bring-up guide has it: pdde-bench on the toy plugin
# (loaded from PDDE_BACKEND_PLUGINS, and by --plugin), which runs only f32 2-D matmuls and a few elementwise ops. Its
# figures are its own (strict sessions: nothing timed on the CPU in its place): f32 GEMM points and the
# elementwise curve, no bf16 GEMM, no attention curve, and one line saying what it does not run; its
# host <-> device link measured (bandwidth and latency > 0), also on a toy that does not run scale. The file calibrates the toy alone
# (--devices toy): --check names the CPU it left unmeasured and the pdde-bench --devices to run (exit
# 1), and the planner's error names that cluster device. A toy whose every matmul fails: pdde-bench exits 1 naming
# the device and the first error, and the planner refuses the file, saying why. Run from the repository root.
. tests/script_util.sh bench-plugin

PDDE_BACKEND_PLUGINS="$build/libpdde_toy.so" timeout 120 "$build/pdde-bench" --quick --no-comm --devices toy -o "$tmp/toy.json" \
    >"$tmp/bench.out" 2>&1
rc=$?
check "pdde-bench --devices toy with the toy plugin exits 0 (rc $rc: $(tail -1 "$tmp/bench.out"))" $rc

python3 - "$tmp/toy.json" >"$tmp/figures.out" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
toy = [s for s in d["specs"] if s["backend"] == "toy"][0]
dtypes = sorted({g["dtype"] for g in toy.get("gemm", [])})
curves = sorted(toy.get("curves", {}).keys())
links = d["links"]
print("toy gemm dtypes", dtypes, "curves", curves, "links", [(l["bandwidth"], l["latency"]) for l in links])
ok = dtypes == ["f32"] and "elementwise" in curves and "attention" not in curves and "row" not in curves
ok = ok and len(links) == 1 and links[0]["bandwidth"] > 0 and links[0]["latency"] > 0
sys.exit(0 if ok else 1)
EOF
rc=$?
check "the toy's figures are its own: f32 GEMM points and the elementwise curve only; its link measured ($(cat "$tmp/figures.out"))" $rc
[ "$(grep -c "toy does not run: .*bf16 gemm.*attention curve.*the cost model prices" "$tmp/bench.out")" = 1 ]
rc=$?
check "what the toy does not run is said once ($(grep -m1 -o "toy does not run: .\{60\}" "$tmp/bench.out"))" $rc

# --plugin loads it as the environment does
timeout 60 "$build/pdde-bench" --plugin "$build/libpdde_toy.so" --quick --no-comm --devices toy --time-limit 1 -o "$tmp/p.json" >"$tmp/p.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "^device 1 (toy:" "$tmp/p.out"
ok=$?
check "pdde-bench --plugin libpdde_toy.so --devices toy measures the toy (rc $rc: $(grep -m1 "^device" "$tmp/p.out"))" $ok

# a plugin whose device reports memory 0: refused at once, naming the device and the field, before minutes of measuring
t0=$(date +%s)
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_nomem.so" timeout 60 "$build/pdde-bench" --quick --no-comm --devices toy -o "$tmp/nomem.json" >"$tmp/nomem.out" 2>&1
code=$? took=$(( $(date +%s) - t0 ))
[ $code = 1 ] && grep -q "pdde-bench: this machine's devices, as their backends report them: .*memory: expected .*got 0" "$tmp/nomem.out" &&
    [ ! -e "$tmp/nomem.json" ] && [ "$took" -lt 10 ]
ok=$?
check "a plugin device of memory 0 is refused before measuring (exit $code in ${took} s: $(tail -1 "$tmp/nomem.out" | cut -c1-160))" $ok
# the plugin forgotten: the backend is not known, and the message says how to load it
timeout 60 "$build/pdde-bench" --quick --no-comm --devices cpu,toy -o "$tmp/none.json" >"$tmp/none.out" 2>&1
code=$?
[ $code = 1 ] && grep -q "no backend named toy (this machine has devices of cpu.*--plugin FILE or PDDE_BACKEND_PLUGINS" "$tmp/none.out" && [ ! -e "$tmp/none.json" ]
ok=$?
check "pdde-bench --devices cpu,toy without the plugin says to load it (exit $code: $(tail -1 "$tmp/none.out" | cut -c1-150))" $ok

# a device that does not run scale (the first op the link's graph tries): its link is measured through add
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_noscale.so" timeout 60 "$build/pdde-bench" --quick --no-comm --devices toy --time-limit 1 \
    -o "$tmp/noscale.json" >"$tmp/noscale.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "): host -> device: latency" "$tmp/noscale.out"
ok=$?
check "pdde-bench measures the link of a toy without scale (rc $rc: $(grep -m1 "host <-> device\|host -> device" "$tmp/noscale.out"))" $ok

"$build/pdde-bench" --check "$tmp/toy.json" >"$tmp/check.out" 2>&1
code=$?
[ $code = 1 ] && grep -q 'device 0 (".*", cpu) has no GEMM figures' "$tmp/check.out" && grep -q "pdde-bench --devices cpu,toy" "$tmp/check.out"
rc=$?
check "--check on it names the unmeasured CPU and the calibration to run (exit $code: $(tail -1 "$tmp/check.out"))" $rc

"$build/pdde-plan" --auto --cluster "$tmp/toy.json" --ranks 2 >"$tmp/plan.out" 2>&1
code=$?
[ $code != 0 ] && grep -q "cluster device 0 (cpu, rank [0-9]'s): flops 0.*run pdde-bench --devices .*cpu" "$tmp/plan.out"
rc=$?
check "the planner's error names the cluster device and the calibration (exit $code: $(head -1 "$tmp/plan.out"))" $rc
# a toy whose every matmul launch fails: pdde-bench says which device and the first error once, and exits 1 (the
# file marks it unusable: no GEMM figures); pdde-plan then refuses to plan on it, with the cost model's reason
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_mmfails.so" timeout 120 "$build/pdde-bench" --quick --no-comm --devices toy -o "$tmp/mmfails.json" \
    >"$tmp/mmfails.out" 2>"$tmp/mmfails.err"
code=$?
[ $code = 1 ] && grep -q "^pdde-bench: device 1 (toy:.*): [0-9]* runs failed and it has no GEMM figures: the planner will not use it; the first error: toy: matmul launch failed: vendor code -9" "$tmp/mmfails.err" &&
    [ "$(grep -c "run failed" "$tmp/mmfails.err")" = 1 ]
rc=$?
check "pdde-bench on a toy whose matmuls fail exits 1 naming the device and the first error, once (exit $code: $(grep -m1 "runs failed" "$tmp/mmfails.err"))" $rc
# (the CPU given figures and the machine a link, as a run with --devices cpu,toy and the collectives gives them: only the toy
# lacks figures, and a plan on the CPU alone would otherwise be made around it, silently)
python3 - "$tmp/mmfails.json" "$tmp/mmfails_cpu.json" <<'EOF2'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["specs"]:
    if s["backend"] == "cpu":
        s["peak_flops"], s["mem_bandwidth"] = 1e11, 2e10
        s["gemm"] = [{"dtype": "f32", "m": 512, "n": 512, "k": 512, "flops": 1e11}]
d["machines"][0]["intra"].update(bandwidth=2e9, latency=5e-5)
json.dump(d, open(sys.argv[2], "w"))
EOF2
"$build/pdde-plan" --auto --cluster "$tmp/mmfails_cpu.json" --ranks 2 >"$tmp/mmplan.out" 2>&1
code=$?
[ $code != 0 ] && grep -q "no plan fits: cluster device 1 (toy) has no measured figures and is not planned on: cost: device 1 .* has no GEMM curve and no peak_flops" "$tmp/mmplan.out" &&
    ! grep -q "^best" "$tmp/mmplan.out"
rc=$?
check "pdde-plan refuses the cluster with the failed device, saying why (exit $code: $(head -1 "$tmp/mmplan.out"))" $rc
finish
