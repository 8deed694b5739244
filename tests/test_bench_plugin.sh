#!/usr/bin/env bash
# A new device's calibration as backends/README.md's bring-up guide has it: pdde-bench on the toy plugin
# (loaded from PDDE_BACKEND_PLUGINS, and by --plugin), which runs only f32 2-D matmuls and a few elementwise ops. Its
# figures are its own (strict sessions: nothing timed on the CPU in its place): f32 GEMM points and the
# elementwise curve, no bf16 GEMM, no attention curve, and one line saying what it does not run; its
# host <-> device link measured (bandwidth and latency > 0). The file calibrates the toy alone
# (--devices toy): --check names the CPU it left unmeasured and the pdde-bench --devices to run (exit
# 1), and the planner's error names that cluster device. Run from the repository root.
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
finish
