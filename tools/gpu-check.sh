#!/usr/bin/env bash
# tools/gpu-check.sh — the CUDA backend's check on a machine with an NVIDIA GPU, in under 8 minutes.
#
# Builds what it needs with what it finds (nvcc, the CUDA driver and cuBLAS; no OpenBLAS, oneDNN, UCX or
# cJSON needed; UCX from pkg-config or UCX_DIR for the multi-rank steps), then, each step under `timeout`
# and the whole under GPU_CHECK_BUDGET seconds (450), the most telling steps first:
#   test_cuda; test_backend_ops --backend cuda --op attention (every attention path and layout against the
#   f32 reference) and test_gpu_attention (a small GPT's losses with each path against the CPU's); the
#   attention alone, forward and backward, B 8 H 12 T 1024 D 64 bf16, in pdde and in PyTorch (SDPA);
#   GPT-2 124M (B 8, T 1024, AdamW) through bench_cuda --gpt in bf16 with the defaults and with what each
#   default replaced, in f32, and the same model in PyTorch (bf16 eager with SDPA and fused AdamW,
#   torch.compile, f32 with TF32 off), the default bf16 step timed per node by device events (PDDE_PROFILE=device), each op against the GPU's peaks;
#   the switches no GPU run has measured yet, each checked and timed against the defaults (tools/bench/cuda_switches.sh); an f32 step's
#   profile with the f32 attention kernels and the graph fusions; `gpt --device auto` and 2 ranks (dp, tp) on the GPU against one
#   process; each GEMM shape against torch.matmul; the memory-bound kernels (cross-entropy, bias sums, AdamW); the CUDA defaults (graph fusions, cublasLt) against the defaults they replaced and each alone
#   turned off, the switches still off by default, and the MoE kernels on CUDA; NCCL on device buffers; ZeRO-3's
#   gathers prefetched on CUDA memory and the sparse gradients zeroed on the device (both off until measured); the
#   embedding backward in the order of the ids (off until measured) against the CPU's bits and the float atomics,
#   and its radix sort for large batches against one block's network;
#   the cost model's predicted step against the measured one (tools/bench/costmodel_gpu.sh); `make demo`
#   (200 steps) and `make bench-dlrm` with the dense stage on the GPU; f32 attention's tiled kernels; the host's
#   cost per op (tools/bench/cuda_attention_f32.sh, cuda_dispatch.sh); the whole conformance suite on cuda,
#   and on opencl where NVIDIA's OpenCL is there; memcheck.
# GPU_CHECK_SKIP="step ..." leaves steps out by name; GPU_CHECK_ONLY="step ..." runs only those (and the build);
# GPU_CHECK_SWITCHES (and GPU_CHECK_SWITCH_CHECKS) name the switches the "switches" step checks and times.
# Prints RESULT lines (also in $OUT/results.txt, and as $OUT/cuda_results.md to be kept in tools/bench/;
# every step's output in $OUT/gpu-check.log; $OUT defaults to build/gpu-check). Where there is no GPU it says so and exits 0. Exit status: 1 if a check failed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
out=${OUT:-$root/build/gpu-check}
mkdir -p "$out"
log=$out/gpu-check.log
results=$out/results.txt
: >"$log"
: >"$results"
budget=${GPU_CHECK_BUDGET:-450}
tmp=$(mktemp -d)
start=$(date +%s)
source "$root/tools/bench/cuda_bench_util.sh" # (field, ratio, losses_match)
failed=0
step_rc=0

say() { echo "$*" | tee -a "$log"; }
result() { echo "RESULT $*" | tee -a "$log" >>"$results"; }
left() { echo $((budget - ($(date +%s) - start))); }

# step NAME CAP CMD...: CMD under a limit of CAP seconds or what is left of the budget, whichever is less;
# its output goes to the log and to $out/step.out (read by the caller). Returns CMD's status, 124 on
# timeout, 125 when it was left out or too little time is left to start it (also in step_rc: `ran` says
# whether the last step ran, so that a step left out prints no RESULT line of its own).
ran() { [ "$step_rc" != 125 ]; }
step() {
    local name=$1 cap=$2 t rc s0
    shift 2
    step_rc=125
    case " ${GPU_CHECK_SKIP:-} " in *" $name "*) say "== $name: skipped (GPU_CHECK_SKIP)"; : >"$out/step.out"; return 125 ;; esac
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [ "$name" != build ]; then
        case " $GPU_CHECK_ONLY " in *" $name "*) ;; *) say "== $name: skipped (not in GPU_CHECK_ONLY)"; : >"$out/step.out"; return 125 ;; esac
    fi
    t=$(left)
    t=$((t - 5))
    [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt 10 ]; then
        say "== $name: skipped, $(left) s of the budget left"
        : >"$out/step.out"
        return 125
    fi
    say "== $name (limit ${t}s): $*"
    s0=$(date +%s)
    timeout --signal=KILL "$t" "$@" >"$out/step.out" 2>&1
    rc=$?
    [ $rc = 137 ] && rc=124
    step_rc=$rc
    cat "$out/step.out" >>"$log"
    say "== $name: exit $rc after $(($(date +%s) - s0)) s"
    return $rc
}

# "N passed, M failed" of a test's output as passed=N failed=M (a crash or timeout without it: failed=1)
counts() {
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/step.out" | tail -1)
    if [ -n "$line" ]; then echo "$line" | awk '{printf "passed=%s failed=%s", $1, $3}'; else echo "passed=0 failed=1"; fi
}
test_step() { # NAME CAP CMD...: a test binary; a RESULT line; a failure counts
    local name=$1 rc
    step "$@"
    rc=$?
    [ $rc = 125 ] && { result "$name status=skipped"; return; }
    local c
    c=$(counts)
    result "$name $c exit=$rc"
    # (a suite that ran no case, as on a device that did not open, checked nothing)
    [ $rc = 0 ] && [ "${c#passed=0 }" = "$c" ] || failed=1
}

# ---- the machine
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "no GPU: nvidia-smi finds no NVIDIA GPU here; nothing to check"
    result "gpu_check status=no_gpu"
    exit 0
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
say "GPU: $gpu; $(nvcc --version 2>/dev/null | tail -1); python3: $(python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)"
result "gpu_check gpu=\"$gpu\" date=$(date -u +%Y-%m-%dT%H:%MZ) commit=$(git rev-parse --short HEAD 2>/dev/null || echo none)"

# ---- build: the committed generated headers as they are (the PTX was made and checked with ptxas where
# the kernels were written); no optional library is required
touch backends/cuda_kernels_ptx.h backends/gpu_kernels_cl.h backends/gpu_kernels_spv.h
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64
# NVIDIA's OpenCL headers come with the toolkit: the OpenCL backend is built where they are found
if ! echo '#include <CL/cl.h>' | cc -E -x c - >/dev/null 2>&1 && [ -f /usr/local/cuda/include/CL/cl.h ]; then
    export CPATH=${CPATH:+$CPATH:}/usr/local/cuda/include
fi
command -v cc >/dev/null 2>&1 || export CC=gcc
jobs=$(nproc 2>/dev/null || echo 4)
export WERROR= # (the compiler there is another: its new warnings must not stop a measurement; CI builds with -Werror)
# UCX (for the launcher and multi-rank runs): UCX_DIR, else pkg-config's, else the one tools/gpu-carry.sh put in
# .gpu-carry/ucx (exported, so that make demo, bench-dlrm and the bench scripts build the same library); else none
[ -z "${UCX_DIR:-}" ] && ! pkg-config --exists ucx 2>/dev/null && [ -f .gpu-carry/ucx/include/ucp/api/ucp.h ] &&
    export UCX_DIR=$root/.gpu-carry/ucx
ucx=(NO_UCX=1)
if [ -n "${UCX_DIR:-}" ]; then ucx=(UCX_DIR="$UCX_DIR"); export UCX_DIR LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$UCX_DIR/lib
elif pkg-config --exists ucx 2>/dev/null; then ucx=(); fi
say "UCX: ${UCX_DIR:-$([ "${ucx[*]}" = NO_UCX=1 ] && echo none || echo "pkg-config's")} $(grep -s '^libucx0=' "${UCX_DIR:-/nonexistent}/PACKAGES")"
step build 240 make -j"$jobs" "${ucx[@]}" build/test_cuda build/test_backend_ops build/test_gpu_attention build/bench_cuda build/gpt build/pdde-bench build/test_dp \
    build/test_casts build/test_direct_grads build/test_session_threads build/test_moe_device build/test_nccl build/test_device_buckets build/test_attention_dispatch \
    build/test_zero3_device build/test_sparse_device build/test_embedding_back build/bench_embedding_back \
    $([ "${ucx[*]}" = NO_UCX=1 ] || echo build/pdde-run)
rc=$?
result "build exit=$rc"
if [ $rc != 0 ]; then
    result "gpu_check status=build_failed seconds=$(($(date +%s) - start))"
    exit 1
fi

# ---- correctness of the kernels, the attention paths first
test_step test_cuda 90 build/test_cuda
test_step test_backend_ops_cuda_attention 90 build/test_backend_ops --backend cuda --op attention
test_step test_gpu_attention 90 build/test_gpu_attention
test_step test_attention_dispatch 30 build/test_attention_dispatch
test_step test_backend_ops_cuda_rmsnorm 60 build/test_backend_ops --backend cuda --op rmsnorm_back

# ---- the whole conformance suite
test_step test_backend_ops_cuda 150 build/test_backend_ops --backend cuda
# the casts of a bf16 step counted on the GPU, and fused steps against unfused ones bit for bit (tests/test_casts.c)
test_step test_casts 90 build/test_casts
# gradients written straight into their accumulators: the same bits as accumulated (tests/test_direct_grads.c)
test_step test_direct_grads 60 build/test_direct_grads
# two sessions on the GPU from two host threads at once (the device's cuBLAS handle and cublasLt plans taken in turn)
test_step test_session_threads 60 build/test_session_threads
if ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
    test_step test_backend_ops_opencl 120 build/test_backend_ops --backend opencl
else
    result "test_backend_ops_opencl status=skipped (no OpenCL ICD in /etc/OpenCL/vendors)"
fi

# ---- attention alone, forward + backward (B 8, H 12, T 1024, D 64, bf16)
declare -A att
for path in unfused flash flash2; do
    step "attention_$path" 60 env PDDE_CUDA_ATTENTION=$path build/bench_cuda --attention --dtype bf16
    att[$path]=$(field "$out/step.out" fwd_bwd_ms)
done
step attention_torch 90 python3 tools/bench/attention_torch.py --dtype bf16
att[torch]=$(field "$out/step.out" fwd_bwd_ms)
# (fwd_bwd_vs_sdpa: the default path for q, k, v apart, flash2)
result "gpu_attention pdde_unfused_ms=${att[unfused]:-na} pdde_flash_ms=${att[flash]:-na} pdde_flash2_ms=${att[flash2]:-na} torch_sdpa_ms=${att[torch]:-na}" \
       "fwd_bwd_vs_sdpa=$(ratio "${att[flash2]:-0}" "${att[torch]:-0}") flash_vs_sdpa=$(ratio "${att[flash]:-0}" "${att[torch]:-0}")" \
       "unfused_vs_sdpa=$(ratio "${att[unfused]:-0}" "${att[torch]:-0}")"
declare -A attp # (the packed qkv the GPT block reads: flash, the default there, against flash2)
for path in flash flash2; do
    step "attention_packed_$path" 60 env PDDE_CUDA_ATTENTION=$path build/bench_cuda --attention --dtype bf16 --packed
    attp[$path]=$(field "$out/step.out" fwd_bwd_ms)
done
step attention_torch_packed 90 python3 tools/bench/attention_torch.py --dtype bf16 --packed
attp[torch]=$(field "$out/step.out" fwd_bwd_ms)
result "gpu_attention_packed pdde_flash_ms=${attp[flash]:-na} pdde_flash2_ms=${attp[flash2]:-na} torch_sdpa_ms=${attp[torch]:-na}" \
       "flash2_vs_flash=$(ratio "${attp[flash2]:-0}" "${attp[flash]:-0}") flash2_vs_sdpa=$(ratio "${attp[flash2]:-0}" "${attp[torch]:-0}")"
declare -A attd # (packed documents of 128 tokens kept apart, pdde_attention_qkv_docs: its paths against SDPA with the mask;
                 # flash2, the default: its *_docs kernels)
for path in unfused flash flash2; do
    step "attention_docs_$path" 60 env PDDE_CUDA_ATTENTION=$path build/bench_cuda --attention --dtype bf16 --packed --doc-every 128
    attd[$path]=$(field "$out/step.out" fwd_bwd_ms)
done
step attention_torch_docs 90 python3 tools/bench/attention_torch.py --dtype bf16 --packed --doc-every 128
attd[torch]=$(field "$out/step.out" fwd_bwd_ms)
result "gpu_attention_docs pdde_unfused_ms=${attd[unfused]:-na} pdde_flash_ms=${attd[flash]:-na} pdde_flash2_ms=${attd[flash2]:-na}" \
       "torch_sdpa_mask_ms=${attd[torch]:-na} flash_vs_sdpa=$(ratio "${attd[flash]:-0}" "${attd[torch]:-0}")" \
       "flash2_vs_flash=$(ratio "${attd[flash2]:-0}" "${attd[flash]:-0}") flash2_vs_sdpa=$(ratio "${attd[flash2]:-0}" "${attd[torch]:-0}")" \
       "unfused_vs_sdpa=$(ratio "${attd[unfused]:-0}" "${attd[torch]:-0}")"

# ---- GPT-2 124M training steps
declare -A tok
gpt_run() { # NAME ENV... -- ARGS...: one bench_cuda --gpt run; its tokens/s in tok[NAME]
    local name=$1
    shift
    step "gpt_$name" 90 env "$@"
    tok[$name]=$(field "$out/step.out" tok_s)
    local line
    line=$(grep '^GPT ' "$out/step.out" | tail -1)
    ran && result "gpu_gpt_run name=$name ${line#GPT }"
}
gpt_run bf16 build/bench_cuda --gpt --dtype bf16 # (the defaults: what a user gets)
mfu=$(field "$out/step.out" mfu_pct)
# (where that step's time goes: each node timed by device events, no wait per node; the per-op table in the log),
# and how far each op is from the GPU's limits: the peaks of build/cluster.json where pdde-bench measured this GPU
# there, else the nominal ones by its name (memory bandwidth; dense bf16 and f32 GEMMs), else none (no bound)
case "$gpu" in
    *H200*) nominal=4800,989,67 ;;
    *H100*PCIe* | *H100*NVL*) nominal= ;; # (other memory and clocks than the SXM's)
    *H100*) nominal=3350,989,67 ;;
    *) nominal= ;;
esac
gpt_run bf16_device_profile PDDE_PROFILE=device ${nominal:+PDDE_PROFILE_PEAKS=$nominal} build/bench_cuda --gpt --dtype bf16 \
    $([ -s build/cluster.json ] && echo --cluster build/cluster.json)
line=$(grep '^PROFILE device ' "$out/step.out" | tail -1)
line=${line:-PROFILE device status=none}
ran && result "gpu_profile ${line#PROFILE device }"
# (the ops furthest from their bound, by device ms less bound ms: RESULT gpu_roofline lines)
roofline_top() { # the six PROFILE op lines with a bound furthest from it, as "over name ms bound_ms gbps tflops calls"
    grep '^PROFILE op ' "$out/step.out" | awk '{ split("", v); for (i = 3; i <= NF; i++) { j = index($i, "="); v[substr($i, 1, j - 1)] = substr($i, j + 1) }
        if ("bound_ms" in v) printf "%.3f %s %s %s %s %s %s\n", v["ms"] - v["bound_ms"], v["name"], v["ms"], v["bound_ms"], v["gbps"], v["tflops"], v["calls"] }' |
        sort -rn | head -6
}
peaks_from=$(echo "$line" | sed -n 's/.* peaks=\([^ ]*\).*/\1/p')
rank=0
while read -r over name ms bound gbps tflops calls; do
    rank=$((rank + 1))
    result "gpu_roofline rank=$rank op=$name ms=$ms bound_ms=$bound over_ms=$over gbps=$gbps tflops=$tflops calls=$calls peaks=$peaks_from"
done < <(roofline_top)
[ $rank = 0 ] && ran && result "gpu_roofline status=no_bound (no measured cluster and no nominal peaks for \"$gpu\")"
# (each default against what it replaced: every cast kept; q, k, v sliced and permuted apart)
gpt_run bf16_casts_kept PDDE_FOLD_CASTS=0 build/bench_cuda --gpt --dtype bf16
gpt_run bf16_separate_qkv PDDE_SEPARATE_QKV=1 PDDE_CUDA_ATTENTION=flash build/bench_cuda --gpt --dtype bf16
# (flash2, the default in both layouts, against flash on the packed qkv)
gpt_run bf16_flash2 PDDE_SEPARATE_QKV=1 PDDE_CUDA_ATTENTION=flash2 build/bench_cuda --gpt --dtype bf16
gpt_run bf16_flash_packed PDDE_CUDA_ATTENTION=flash build/bench_cuda --gpt --dtype bf16
gpt_run bf16_unfused PDDE_CUDA_ATTENTION=unfused build/bench_cuda --gpt --dtype bf16
torch_args=(--device cuda --vocab 50304 --layers 12 --heads 12 --width 768 --ctx 1024 --batch 8 --steps 10 --warmup 3)
step torch_bf16_eager 90 python3 tools/bench/gpt_torch.py "${torch_args[@]}" --dtype bf16 --sdpa
tok[torch_eager]=$(field "$out/step.out" tokens_per_s)
step torch_bf16_compile 180 python3 tools/bench/gpt_torch.py "${torch_args[@]}" --dtype bf16 --sdpa --compile
tok[torch_compile]=$(field "$out/step.out" tokens_per_s)
gpt_run f32 build/bench_cuda --gpt --dtype f32
step torch_f32 90 python3 tools/bench/gpt_torch.py "${torch_args[@]}" --dtype f32 --sdpa
tok[torch_f32]=$(field "$out/step.out" tokens_per_s)
result "gpu_gpt bf16_tok_s=${tok[bf16]:-na} bf16_mfu_pct=${mfu:-na}" \
       "torch_eager_ratio=$(ratio "${tok[bf16]:-0}" "${tok[torch_eager]:-0}")" \
       "torch_compile_ratio=$(ratio "${tok[bf16]:-0}" "${tok[torch_compile]:-0}")" \
       "f32_torch_ratio=$(ratio "${tok[f32]:-0}" "${tok[torch_f32]:-0}")" \
       "bf16_unfused_tok_s=${tok[bf16_unfused]:-na} torch_eager_tok_s=${tok[torch_eager]:-na} torch_compile_tok_s=${tok[torch_compile]:-na}" \
       "f32_tok_s=${tok[f32]:-na} torch_f32_tok_s=${tok[torch_f32]:-na}"
result "gpu_gpt_paths default_tok_s=${tok[bf16]:-na} casts_kept_tok_s=${tok[bf16_casts_kept]:-na}" \
       "separate_qkv_tok_s=${tok[bf16_separate_qkv]:-na} flash2_separate_qkv_tok_s=${tok[bf16_flash2]:-na} unfused_attention_tok_s=${tok[bf16_unfused]:-na} flash_packed_tok_s=${tok[bf16_flash_packed]:-na}"
gpt_run bf16_graph PDDE_CUDA_ATTENTION=unfused build/bench_cuda --gpt --dtype bf16 --unfused-graph

# ---- switches still off by default that no GPU run has measured yet (tools/bench/cuda_switches.sh: each one's
# conformance cases, then GPT-2 steps with it against the defaults, in alternating order); GPU_CHECK_SWITCHES=
# "name:VAR=1,..." and GPU_CHECK_SWITCH_CHECKS="name:VAR=1,...:op" name others ("": the step is left out)
# (the bf16 defaults' graph fusions that apply to an f32 step: off there until measured)
f32_fusions=PDDE_FUSE_EPILOGUE=1,PDDE_FUSE_GRAD=1,PDDE_FUSE_ADD_LN=1,PDDE_FUSE_BGRAD=1,PDDE_FUSE_CE=1
new_kernels=PDDE_CUDA_LT_LOWP_BIAS=1,PDDE_CUDA_LN2=1,PDDE_CUDA_CE1=1,PDDE_CUDA_ADAMW_VEC=1,PDDE_CUDA_GELU2=1
switches=${GPU_CHECK_SWITCHES-"lowp_bias:PDDE_CUDA_LT_LOWP_BIAS=1 gelu_lowp_bias:PDDE_CUDA_LT_LOWP_BIAS=1,PDDE_FUSE_GELU=1
    ln2:PDDE_CUDA_LN2=1 ce1:PDDE_CUDA_CE1=1 adamw_vec:PDDE_CUDA_ADAMW_VEC=1 gelu2:PDDE_CUDA_GELU2=1
    k128:PDDE_FLASH2_VARIANT=k128 dqsmem:PDDE_FLASH2_VARIANT=dqsmem q128:PDDE_FLASH2_VARIANT=q128
    no_bgrad:PDDE_FUSE_BGRAD=0 no_direct:PDDE_DIRECT_GRADS=0 all_new:$new_kernels,PDDE_FLASH2_VARIANT=k128+q128
    f32_flash2:DTYPE=f32,PDDE_CUDA_ATTENTION=flash2 f32_fusions:DTYPE=f32,$f32_fusions
    f32_fusions_flash2:DTYPE=f32,$f32_fusions,PDDE_CUDA_ATTENTION=flash2"}
switch_checks=${GPU_CHECK_SWITCH_CHECKS-"lowp_bias:PDDE_CUDA_LT_LOWP_BIAS=1:matmul_bias gelu_lowp_bias:PDDE_CUDA_LT_LOWP_BIAS=1:gelu_fused
    ln2:PDDE_CUDA_LN2=1:layernorm ln2_cases:X=0:layernorm2 ce1:PDDE_CUDA_CE1=1:cross_entropy_staged adamw_vec:X=0:adamw_vec
    gelu2:X=0:bias_gelu2 k128:PDDE_FLASH2_VARIANT=k128:attention dqsmem:PDDE_FLASH2_VARIANT=dqsmem:attention
    q128:PDDE_FLASH2_VARIANT=q128:attention f32_flash2:PDDE_CUDA_ATTENTION=flash2:attention rope:PDDE_CUDA_ROPE=1:rope"}
if [ -n "$switches" ]; then
    step switches 360 env SWITCHES="$switches" CHECKS="$switch_checks" bash tools/bench/cuda_switches.sh build
    grep '^RESULT' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
    grep -q '^RESULT gpu_switches .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1
fi

# ---- where an f32 step's time goes, with the f32 attention kernels and the bf16 graph fusions (each op against the
# GPU's f32 peaks): what the f32 target (PyTorch f32, TF32 off) needs next
gpt_run f32_device_profile PDDE_PROFILE=device ${nominal:+PDDE_PROFILE_PEAKS=$nominal} PDDE_CUDA_ATTENTION=flash2 ${f32_fusions//,/ } \
    build/bench_cuda --gpt --dtype f32
line=$(grep '^PROFILE device ' "$out/step.out" | tail -1)
ran && result "gpu_profile_f32 ${line#PROFILE device }"
rank=0
while read -r over name ms bound gbps tflops calls; do
    rank=$((rank + 1))
    result "gpu_roofline_f32 rank=$rank op=$name ms=$ms bound_ms=$bound over_ms=$over gbps=$gbps tflops=$tflops calls=$calls"
done < <(roofline_top)

# ---- the cost model's step against the measured one (tools/bench/costmodel_gpu.sh on what was built)
step costmodel_gpu 150 env OUT="$tmp/costmodel" COSTMODEL_BUILD=build bash tools/bench/costmodel_gpu.sh
line=$(grep '^RESULT costmodel_gpu' "$out/step.out" | tail -1)
[ -n "$line" ] && result "${line#RESULT }"
cat "$tmp/costmodel/predict.log" >>"$log" 2>/dev/null

# ---- each GEMM shape of the step on each path against torch.matmul, the bias gradient in the GEMM
# (PDDE_FUSE_BGRAD), cublasLt's tuning (PDDE_CUDA_LT_TUNE) and batch-1 GEMMs through cublasGemmEx
# (PDDE_CUDA_GEMM_SINGLE), all off by default (tools/bench/cuda_gemm.sh)
step gemm 240 env RUNS="${GPU_CHECK_GEMM_RUNS-default single tune no_bgrad lowp_bias default_again}" bash tools/bench/cuda_gemm.sh build
grep '^RESULT' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
grep -q '^RESULT gpu_gemm_check .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1

# ---- the graph fusions and cublasLt (tools/bench/cuda_fusions.sh: their conformance cases with and without
# cublasLt, test_casts, and GPT-2 124M bf16 steps: the defaults against the old defaults (every fusion off),
# each default turned off alone, and the switches still off: GELU's epilogue, CUDA graphs), and the MoE
# kernels on CUDA (PDDE_CUDA_MOE=1). GPU_CHECK_FUSION_RUNS="" runs every run the script has.
step fusions 300 env RUNS="${GPU_CHECK_FUSION_RUNS-default old_defaults no_lt no_grad no_att_lowp gelu graph default_again}" \
    bash tools/bench/cuda_fusions.sh build
grep '^RESULT' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
grep -q '^RESULT gpu_fusions .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1
# ---- the memory-bound kernels (tools/bench/cuda_memk.sh: the fused cross-entropy PDDE_FUSE_CE, the two-level column
# sums PDDE_CUDA_COLSUM2, the chunked AdamW PDDE_CUDA_ADAMW_CHUNKS, all on by default): their conformance cases, then
# GPT-2 124M bf16 steps with each turned off against the defaults, and profiles of the ops they replace
step memk 240 env RUNS="${GPU_CHECK_MEMK_RUNS-default no_fuse_ce no_colsum2 no_adamw_chunks none3 default_again}" bash tools/bench/cuda_memk.sh build
grep '^RESULT' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
grep -q '^RESULT gpu_memk .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1
test_step test_backend_ops_cuda_moe 60 env PDDE_CUDA_MOE=1 build/test_backend_ops --backend cuda --op moe_layer
test_step test_moe_device_cuda 90 env PDDE_CUDA_MOE=1 build/test_moe_device
# the MoE ops on the GPU against their CPU fallback (the default until this has timed them): an MoE GPT's tokens/s
step moe 240 env CAP=50 bash tools/bench/cuda_moe.sh build
grep '^RESULT gpu_moe ' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
grep -q '^RESULT gpu_moe .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1
# NCCL (loaded at run time; found beside PyTorch) on device buffers: one rank on one GPU, two on two
test_step test_nccl 60 env NCCL_DEBUG=WARN build/test_nccl

# ---- ranks on the GPU: `gpt --device auto` takes it; dp=2 and tp=2 with both ranks on it (shared) equal one
# process on it (f32, so that only the reductions' order differs)
gpt_small=(--layers 2 --width 128 --heads 4 --ctx 64 --batch 8 --steps 20 --val-every 0 --sample-len 0 --data README.md)
step gpt_device_auto 60 build/gpt "${gpt_small[@]}" --device auto --metrics "$tmp/auto.jsonl"
auto_rc=$?
chose=$(grep -o 'rank 0: device [0-9]*, [a-z_]*:[0-9]*' "$out/step.out" | head -1 | sed 's/.*, //')
[ $auto_rc = 125 ] || { result "gpu_rank_device auto=${chose:-none}"; [ "${chose%%:*}" = cuda ] || failed=1; }
if [ $auto_rc = 125 ]; then
    : # (the ranks' runs compare with it)
elif [ -x build/pdde-run ]; then
    for par in "--dp 2" "--tp 2"; do
        name=$(echo "$par" | tr -d ' -')
        step "gpt_cuda_$name" 90 build/pdde-run -n 2 build/gpt "${gpt_small[@]}" $par --device cuda --share-device --metrics "$tmp/$name.jsonl"
        [ $? = 125 ] && continue
        d=$(losses_match "$tmp/$name.jsonl" "$tmp/auto.jsonl" 1e-5)
        rc=$?
        result "gpu_ranks run=$name ranks=2 device=cuda max_rel_diff_vs_one_process=$d"
        [ $rc = 0 ] || failed=1
    done
else
    result "gpu_ranks status=skipped (built without UCX: set UCX_DIR)"
fi

# gradient buckets' copies on the device's second stream (off on CUDA until this has run): test_dp's device rows
[ -x build/pdde-run ] && test_step test_dp_copy_stream 120 env PDDE_BACKENDS=cpu,cuda PDDE_COPY_STREAM=1 build/test_dp
# ZeRO-1/2 and allreduce buckets in CUDA memory (bucket streams, the copy stream, a killed peer), then through NCCL,
# which on one GPU must decline two ranks before its init ("share one GPU") and leave them to host buckets
[ -x build/pdde-run ] && test_step test_device_buckets_cuda 120 env PDDE_TEST_DEVICE=cuda build/test_device_buckets
[ -x build/pdde-run ] && test_step test_device_buckets_nccl 120 env PDDE_TEST_DEVICE=cuda PDDE_DEVICE_COLLECTIVES=nccl build/test_device_buckets
# ZeRO-3's parameter gathers prefetched a layer ahead on CUDA memory (PDDE_ZERO3_PREFETCH=1: off on CUDA until this
# has run), and the sparse batch's gradients zeroed on the device (PDDE_CUDA_ZERO=1: off until this has run)
[ -x build/pdde-run ] && test_step test_zero3_device_cuda 150 env PDDE_TEST_DEVICE=cuda build/test_zero3_device
test_step test_sparse_device_cuda 60 env PDDE_CUDA_ZERO=1 build/test_sparse_device
# the embedding backward summed per row in the order of the ids (PDDE_CUDA_EMBEDDING_BACK=sorted: off until this has
# run): bit for bit the CPU's and run to run, and its time against the float atomics (GPT's and DLRM's shapes)
test_step test_embedding_back_cuda 60 build/test_embedding_back
for shape in gpt recsys; do
    step "embedding_back_$shape" 60 build/bench_embedding_back --backend cuda $([ $shape = recsys ] && echo --recsys)
    r=$(grep '^RESULT embedding_back ' "$out/step.out" | tail -1 | sed 's/^RESULT //')
    ran && result "${r:-embedding_back shape=$shape status=failed}"
done
# a recommender batch (106496 ids into [1000000, 16]): the radix sort over many blocks against one block's network
# and the atomics, device time per step (PDDE_PROFILE=device); PGD_EMB_RADIX_MIN is a PoCL number until this runs
step embedding_back_large 60 env PDDE_PROFILE=device build/bench_embedding_back --backend cuda --large --sorts --reps 3
r=$(grep '^RESULT embedding_back_sorts ' "$out/step.out" | tail -1 | sed 's/^RESULT //')
ran && result "${r:-embedding_back_sorts shape=large status=failed}"

# ---- what a user runs: `make demo` (a rank per GPU; packages it cannot install are left out) and the
# recommender with its dense stage on the GPU (`make bench-dlrm`: hetero_ratio's target is 1.3)
step demo 150 env PDDE_OFFLINE=1 DEMO_ARGS="--steps 200" bash tools/demo.sh
took=$(grep -o 'rank 0: device [0-9]*, [a-z_]*:[0-9]*' "$out/step.out" | head -1 | sed 's/.*, //')
ran && result "gpu_demo rank0=${took:-none} loss=$(grep -o 'validation loss [0-9.]*' "$out/step.out" | tail -1 | awk '{print $3}')"
step dlrm 150 make -s bench-dlrm BENCH_DLRM_ARGS="--reps 3"
r=$(grep '^RESULT dlrm ' "$out/step.out" | tail -1 | sed 's/^RESULT //')
ran && result "${r:-dlrm status=failed}"

# ---- f32 attention's tiled kernels (off by default) against the unfused graph and PyTorch f32, alone and in GPT-2
# (tools/bench/cuda_attention_f32.sh), and the host's cost per op against PyTorch eager (tools/bench/cuda_dispatch.sh)
step attention_f32 240 env REPEATS=1 bash tools/bench/cuda_attention_f32.sh build
grep '^RESULT' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
grep -q '^RESULT gpu_attention_f32 .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1
step dispatch 200 bash tools/bench/cuda_dispatch.sh build
grep '^RESULT' "$out/step.out" | sed 's/^RESULT //' | while read -r line; do result "$line"; done
grep -q '^RESULT gpu_dispatch .*failed=0' "$out/step.out" || [ ! -s "$out/step.out" ] || failed=1

# ---- with what time is left: the new kernels under compute-sanitizer, and where a bf16 step's time goes
if command -v compute-sanitizer >/dev/null 2>&1; then
    step sanitizer_memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
        build/test_backend_ops --backend cuda --op attention
    rc=$?
    result "sanitizer_memcheck exit=$rc errors=$(grep -o 'ERROR SUMMARY: [0-9]*' "$out/step.out" | tail -1 | grep -o '[0-9]*$')"
    [ $rc = 0 ] || [ $rc = 124 ] || [ $rc = 125 ] || failed=1
fi
step gpt_bf16_profile 60 env PDDE_PROFILE=1 build/bench_cuda --gpt --dtype bf16

result "gpu_check status=done failed=$failed seconds=$(($(date +%s) - start))"
# the record for tools/bench/ (the RESULT lines with the GPU and the date)
{
    echo "# CUDA check: $gpu, $(date -u +%Y-%m-%d)"
    echo
    echo "\`bash tools/gpu-check.sh\` (commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)); each line is a RESULT line."
    echo
    echo '```'
    cat "$results"
    echo '```'
} >"$out/cuda_results.md"
grep '^RESULT' "$results"
exit $failed
