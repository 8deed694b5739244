#!/usr/bin/env bash
# tools/bench/costmodel_gpu.sh end to end where there is no GPU: the same pipeline on the OpenCL device
# (PoCL): pdde-bench calibrates it (the half-precision attention curves and bf16 GEMMs included), the
# cost model predicts a small GPT's bf16 step from that file, bench_cuda measures it, and the RESULT line
# carries both with their error. The prediction's accuracy is the benchmark's to report (a timing, and
# a loaded machine's measured step moves by more than the cost model's error); checked here is that the
# prediction is made of the calibration: its op classes add up to it, and the same file with every
# figure of the device twice as slow predicts twice the step. With the cuda device and no GPU: it says
# so and exits 0.
. tests/script_util.sh costmodel-gpu
model=layers=2,width=64,heads=2,ctx=32,vocab=128,batch=4
if ! ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1 || ! "$build/bench_cuda" --probe --device opencl | grep -q "^device:"; then
    echo "skipped: no OpenCL device"
    finish
    exit $?
fi
COSTMODEL_DEVICE=opencl COSTMODEL_BUILD=$build COSTMODEL_MODEL=$model COSTMODEL_BENCH_ARGS=--run-overhead OUT=$tmp/ocl \
    timeout 150 bash tools/bench/costmodel_gpu.sh >"$tmp/ocl.out" 2>&1
rc=$?
check "the script on opencl exits 0 (rc $rc)" $rc
line=$(grep '^RESULT costmodel_gpu' "$tmp/ocl.out" | tail -1)
val() { echo "$line" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
p=$(val predicted_ms) m=$(val measured_ms) e=$(val err_pct)
echo "$line"
awk -v p="$p" -v m="$m" -v e="$e" 'BEGIN { ok = p + 0 > 0 && m + 0 > 0 && (e - 100 * (p - m) / m) ^ 2 < 0.01; exit !ok }'
check "RESULT line: predicted $p ms and measured $m ms, err_pct $e = (p - m) / m" $?
by_class=$(grep "^predicted on .* attention [0-9.]* ms, its backward [0-9.]* ms" "$tmp/ocl.out")
echo "$by_class" | awk -v p="$p" '{ s = 0; for (i = 1; i < NF; i++) if ($(i + 1) ~ /^ms/) s += $i; exit !(p > 0 && (s - p) ^ 2 <= (0.005 * NF + 0.01) ^ 2) }'
check "the prediction's time by op class and the attention's add up to its $p ms" $?
f=$tmp/ocl/cluster_opencl.json
# every figure of the device twice as slow (GEMM and peak rates halved, curve times doubled): twice the step
python3 - "$f" "$tmp/slow.json" <<'EOF2'
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["specs"]:
    if s["backend"] != "opencl": continue
    s["peak_flops"] /= 2; s["mem_bandwidth"] /= 2
    for g in s["gemm"]: g["flops"] /= 2
    for points in s["curves"].values():
        for pt in points: pt[1] *= 2
json.dump(d, open(sys.argv[2], "w"))
EOF2
"$build/bench_cuda" --gpt --dtype bf16 --device opencl --model "$model" --predict "$tmp/slow.json" --predict-only >"$tmp/slow.out" 2>&1
p2=$(sed -n 's/^PREDICT ms=\([^ ]*\).*/\1/p' "$tmp/slow.out")
awk -v p="$p" -v q="$p2" 'BEGIN { exit !(p > 0 && q / p > 1.99 && q / p < 2.01) }'
check "the device twice as slow predicts $p2 ms, twice $p ms" $?

grep -q '"fused_attention_half_backward"' "$f" && grep -q '"dtype":[[:space:]]*"bf16"' "$f"
check "the cluster file has the device's bf16 attention curves and bf16 GEMM points" $?
"$build/pdde-bench" --check "$f" >"$tmp/check.out" 2>&1
rc=$?
check "the cluster file reads back ($(head -1 "$tmp/check.out"))" $rc
grep -q "a session run: .* us of its own" "$tmp/ocl.out"
check "the run overhead was measured (--run-overhead)" $?
# the GPU's pipeline where there is none: a clear word, exit 0
if "$build/bench_cuda" --probe | grep -q "^no CUDA device"; then
    COSTMODEL_BUILD=$build OUT=$tmp/cuda bash tools/bench/costmodel_gpu.sh >"$tmp/cuda.out" 2>&1
    rc=$?
    grep -q "^RESULT costmodel_gpu device=cuda status=no_device" "$tmp/cuda.out"
    check "no GPU: status=no_device, exit 0 (rc $rc)" $((rc + $?))
else
    echo "skipped: the no-GPU case (a CUDA device is here)"
fi
finish
