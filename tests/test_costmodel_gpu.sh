#!/usr/bin/env bash
# tools/bench/costmodel_gpu.sh end to end where there is no GPU: the same pipeline on the OpenCL device
# (PoCL): pdde-bench calibrates it (the half-precision attention curves and bf16 GEMMs included), the
# cost model predicts a small GPT's bf16 step from that file, bench_cuda measures it, and the RESULT line
# carries both with their error; the prediction within 3x of the measured step (a loaded 2-core machine
# measures within tens of percent; a broken pipeline is off by far more). With the cuda device and no
# GPU: it says so and exits 0.
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
awk -v p="$p" -v m="$m" -v e="$e" 'BEGIN { ok = p + 0 > 0 && m + 0 > 0 && p / m < 3 && m / p < 3 && (e - 100 * (p - m) / m) ^ 2 < 0.01; exit !ok }'
check "RESULT line: predicted $p ms and measured $m ms within 3x, err_pct $e = (p - m) / m" $?
grep -q "^predicted on .* attention [0-9.]* ms, its backward [0-9.]* ms" "$tmp/ocl.out"
check "the prediction's time by op class and the attention's" $?
f=$tmp/ocl/cluster_opencl.json
grep -q '"fused_attention_half_backward"' "$f" && grep -q '"dtype":[[:space:]]*"bf16"' "$f"
check "the cluster file has the device's bf16 attention curves and bf16 GEMM points" $?
"$build/pdde-bench" --check "$f" >"$tmp/check.out" 2>&1
check "the cluster file reads back ($(head -1 "$tmp/check.out"))" $?
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
