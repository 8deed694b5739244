#!/usr/bin/env bash
# tools/bench/costmodel_gpu.sh — the cost model's predicted training step on a GPU against the measured one.
#
#   bash tools/bench/costmodel_gpu.sh            (on a machine with an NVIDIA GPU; about a minute)
#   COSTMODEL_DEVICE=opencl COSTMODEL_MODEL=layers=2,width=128,heads=4,ctx=64,vocab=256,batch=8 \
#   COSTMODEL_BUILD=build bash tools/bench/costmodel_gpu.sh      (the same pipeline on another device)
#
# 1. builds pdde-bench and bench_cuda with what it finds (no UCX, cJSON, OpenBLAS or oneDNN needed: UCX as
#    tools/gpu-check.sh takes it, UCX_DIR, pkg-config or .gpu-carry/ucx, else NO_UCX=1; COSTMODEL_BUILD=DIR uses the
#    binaries already in DIR instead);
# 2. pdde-bench --quick --no-comm --devices $COSTMODEL_DEVICE (cuda) writes this machine's cluster file
#    (under a minute): GEMMs in f32 and bf16, every op class's curve, the attention as the device runs it;
# 3. bench_cuda --gpt --dtype bf16 --predict FILE --predict-only: the cost model's step for the graph
#    bench_cuda runs (GPT-2 124M: B 8, T 1024, AdamW, one device, the backend's default attention path),
#    the session's program simulated on that file;
# 4. bench_cuda --gpt --dtype bf16: the measured step (median of 8 after 2 warm-up steps).
# Last line: RESULT costmodel_gpu device=.. predicted_ms=.. measured_ms=.. err_pct=.. (err_pct signed:
# (predicted - measured) / measured; the target is |err_pct| <= 10). Where the device is missing it says
# so (RESULT costmodel_gpu status=no_device) and exits 0. Files (cluster file, logs) in $OUT
# (default build/costmodel-gpu).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
device=${COSTMODEL_DEVICE:-cuda}
out=${OUT:-$root/build/costmodel-gpu}
mkdir -p "$out"
cluster=$out/cluster_$device.json
model_args=()
[ -n "${COSTMODEL_MODEL:-}" ] && model_args=(--model "$COSTMODEL_MODEL")
start=$(date +%s)
fail() { echo "RESULT costmodel_gpu device=$device status=$1 seconds=$(($(date +%s) - start))"; exit "${2:-1}"; }

if [ -n "${COSTMODEL_BUILD:-}" ]; then
    bin=$COSTMODEL_BUILD
else
    bin=build
    # the committed generated kernel headers as they are (no GPU toolchain needed to build)
    touch backends/cuda_kernels_ptx.h backends/gpu_kernels_cl.h backends/gpu_kernels_spv.h
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64
    command -v cc >/dev/null 2>&1 || export CC=gcc
    # UCX as tools/gpu-check.sh finds it (UCX_DIR, else pkg-config, else the Makefile's .gpu-carry/ucx, else
    # none), so that both build the same library in build/
    ucx=(NO_UCX=1)
    if [ -n "${UCX_DIR:-}" ]; then ucx=(UCX_DIR="$UCX_DIR"); export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$UCX_DIR/lib
    elif pkg-config --exists ucx 2>/dev/null || [ -f .gpu-carry/ucx/include/ucp/api/ucp.h ]; then ucx=(); fi
    echo "== build: make ${ucx[*]} ${COSTMODEL_MAKE_ARGS:-} $bin/pdde-bench $bin/bench_cuda"
    # shellcheck disable=SC2086 # (COSTMODEL_MAKE_ARGS: more make variables, e.g. NO_CJSON=1 to build as without it)
    timeout 300 make -j"$(nproc 2>/dev/null || echo 4)" "${ucx[@]}" ${COSTMODEL_MAKE_ARGS:-} "$bin/pdde-bench" "$bin/bench_cuda" >"$out/build.log" 2>&1 ||
        { tail -20 "$out/build.log"; fail build_failed; }
fi
for b in pdde-bench bench_cuda; do [ -x "$bin/$b" ] || fail "missing_$b"; done

# is the device there? (bench_cuda says "no ... device" and exits 0 where it is not)
probe=$(timeout 60 "$bin/bench_cuda" --probe --device "$device" 2>&1 | head -3)
if echo "$probe" | grep -q "^no .* device"; then
    echo "$probe"
    fail no_device 0
fi

echo "== calibration: pdde-bench --quick --no-comm --devices $device --time-limit 60 (killed at 90 s)"
timeout --signal=KILL 90 "$bin/pdde-bench" --quick --no-comm --devices "$device" --time-limit 60 ${COSTMODEL_BENCH_ARGS:-} -o "$cluster" >"$out/pdde-bench.log" 2>&1
rc=$?
grep -E "^(device|  a session run|  fused_attention|wrote)" "$out/pdde-bench.log"
[ $rc = 0 ] && [ -s "$cluster" ] || { tail -5 "$out/pdde-bench.log"; fail "calibration_failed_rc$rc"; }

echo "== prediction: bench_cuda --gpt --dtype bf16 --predict $cluster --predict-only ${model_args[*]}"
timeout 60 "$bin/bench_cuda" --gpt --dtype bf16 --device "$device" "${model_args[@]}" --predict "$cluster" --predict-only >"$out/predict.log" 2>&1
grep -E "^(predicted|PREDICT)" "$out/predict.log" || { tail -5 "$out/predict.log"; fail prediction_failed; }
predicted=$(sed -n 's/^PREDICT ms=\([^ ]*\).*/\1/p' "$out/predict.log" | tail -1)

echo "== measured: bench_cuda --gpt --dtype bf16 ${model_args[*]}"
timeout 120 "$bin/bench_cuda" --gpt --dtype bf16 --device "$device" "${model_args[@]}" >"$out/measure.log" 2>&1
grep -E "^(device|gpt step|GPT)" "$out/measure.log" || { tail -5 "$out/measure.log"; fail measure_failed; }
measured=$(sed -n 's/^GPT .* ms=\([^ ]*\) .*/\1/p' "$out/measure.log" | tail -1)
attention=$(sed -n 's/^GPT .* attention=\([^ ]*\) .*/\1/p' "$out/measure.log" | tail -1)

err=$(awk -v p="$predicted" -v m="$measured" 'BEGIN { if (p > 0 && m > 0) printf "%.1f", 100 * (p - m) / m; else printf "na" }')
[ "$err" = na ] && fail "no_numbers predicted_ms=${predicted:-na} measured_ms=${measured:-na}"
echo "RESULT costmodel_gpu device=$device attention=${attention:-default} predicted_ms=$predicted measured_ms=$measured err_pct=$err" \
     "seconds=$(($(date +%s) - start))"
