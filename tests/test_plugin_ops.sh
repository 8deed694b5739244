#!/usr/bin/env bash
# The conformance suite as a vendor runs it on an out-of-tree backend: test_backend_ops --plugin with
# the toy plugin passes its ops (and counts the ones the toy leaves to the CPU as unsupported, not
# passed), and so with the plugin from PDDE_BACKEND_PLUGINS; a plugin whose devices report another
# backend, of another vtable version, an unknown --backend or --op fail with a message and a non-zero
# exit instead of "0 passed"; a wrong mul fails mul's cases only, each failure listing the ops the device
# ran; the comparisons of ops the toy does not run (attention, bias_gelu, rope) are counted as not run; an op supports_op claims but compute calls
# unsupported fails its cases; gpt's LLaMA-style blocks on the toy run a share of the step there, and a wrong mul
# changes their losses; --help goes to stdout with exit 0.
# Run from the repository root.
. tests/script_util.sh plugin-ops

"$build/test_backend_ops" --plugin "$build/libpdde_toy.so" >"$tmp/toy.log" 2>&1
rc=$?
check "test_backend_ops --plugin libpdde_toy.so exits 0 ($(tail -2 "$tmp/toy.log"))" $rc
passed=$(awk '/^device [0-9]+: [0-9]+ passed/ {print $3}' "$tmp/toy.log")
unsupported=$(sed -n 's/^device [0-9]*: .* failed, \([0-9]*\) cases of ops it does not run.*/\1/p' "$tmp/toy.log")
[ "${passed:-0}" -ge 10 ] && [ "${unsupported:-0}" -ge 10 ]
check "the toy's ops pass and the others are counted unsupported (passed '$passed', unsupported '$unsupported')" $?

# the same plugin from the environment (as an application loads it) is a plugin too: its ops left to the CPU are
# counted, not failed as "unsupported by the device"
PDDE_BACKEND_PLUGINS="$build/libpdde_toy.so" "$build/test_backend_ops" --backend toy >"$tmp/env.log" 2>&1
rc=$?
unsupported=$(sed -n 's/^device [0-9]*: .* 0 failed, \([0-9]*\) cases of ops it does not run.*/\1/p' "$tmp/env.log")
[ $rc -eq 0 ] && [ "${unsupported:-0}" -ge 10 ] && ! grep -q "unsupported by the device" "$tmp/env.log"
check "PDDE_BACKEND_PLUGINS=libpdde_toy.so test_backend_ops --backend toy exits 0, unsupported counted (rc $rc, unsupported '$unsupported')" $?

# a plugin whose devices report another backend than its .name (make builds it from the toy): --backend NAME
# tests nothing, so it fails
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_misnamed.so" "$build/test_backend_ops" --backend toy >"$tmp/mis.log" 2>&1
code=$?
[ $code -ne 0 ] && grep -q "no device reports backend toy; the devices: 0 .*(backend cpu).*(backend toyaccel)" "$tmp/mis.log"
rc=$?
check "a plugin whose devices report another backend: --backend toy exits non-zero listing the devices (exit $code: $(tail -1 "$tmp/mis.log"))" $rc
grep -q "pdde: plugin backend toy: its device 0 says backend 'toyaccel' (device_props.backend must be the backend's name)" "$tmp/mis.log"
check "the library says so when it loads the plugin" $?

# a wrong mul (libpdde_toy_badmul.so): only mul's own cases fail (the gradient checks' loss runs on the CPU),
# and --op mul runs those
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_badmul.so" "$build/test_backend_ops" --backend toy >"$tmp/badmul.log" 2>&1
code=$?
failed=$(grep -c "^FAIL" "$tmp/badmul.log")
others=$(grep "^FAIL" "$tmp/badmul.log" | grep -vc "worst <= tol: mul(")
[ $code -ne 0 ] && [ "$failed" -ge 1 ] && [ "$others" -eq 0 ] && grep -q "times the bound" "$tmp/badmul.log"
rc=$?
check "a toy with a wrong mul: $failed failures, all mul's own ($others others; exit $code; $(grep -m1 '^FAIL' "$tmp/badmul.log"))" $rc
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_badmul.so" "$build/test_backend_ops" --backend toy --op mul -v >"$tmp/opmul.log" 2>&1
cases=$(grep -c "^  toy " "$tmp/opmul.log")
not_mul=$(grep "^  toy " "$tmp/opmul.log" | grep -vc " mul(")
[ "$cases" -ge 1 ] && [ "$not_mul" -eq 0 ]
check "--op mul runs mul's cases only ($cases lines, $not_mul of other ops)" $?

# each failure names the ops the device ran in its case (the op a wrong plugin's failures share is the suspect)
[ "$(grep "^FAIL" "$tmp/badmul.log" | grep -vc "ops run on the device: \[.* mul .*\]")" -eq 0 ]
rc=$?
check "each of the wrong mul's failures lists the ops the device ran, mul among them ($(grep -m1 -o "ops run on the device: .*" "$tmp/badmul.log"))" $rc

# the fused attention, bias_gelu and rope comparisons on the toy, which runs none of those ops, are counted as not run,
# not as passes (the toy runs other nodes of their graphs)
"$build/test_backend_ops" --plugin "$build/libpdde_toy.so" -v >"$tmp/toyv.log" 2>&1
compared=$(grep -c "attention .* on toy.* NMSE\|bias_gelu \[.* NMSE\|rope \[.* NMSE" "$tmp/toyv.log")
[ "$compared" -eq 0 ] && grep -q "fused attention f32 .* not supported (runs on the CPU)" "$tmp/toyv.log"
rc=$?
check "the toy's attention, bias_gelu and rope cases are not counted as passes ($compared compared: $(grep -m1 "attention .* NMSE" "$tmp/toyv.log"))" $rc

# a plugin whose supports_op claims gelu but whose compute returns UNSUPPORTED for it: the cases that run gelu on it
# fail naming the case, the node, the contradiction and the plugin's message (a training run would fail every step),
# not "ops it does not run"
"$build/test_backend_ops" --plugin "$build/libpdde_toy_claims_gelu.so" >"$tmp/gelu.log" 2>&1
code=$?
[ $code -ne 0 ] && grep -q "^FAIL.* gelu(.*supports_op took the nodes of ops \[.*gelu.*UNSUPPORTED (session: node gelu\.[0-9]* (op gelu) on device [0-9]*: the backend's compute refused a node its supports_op accepted .*: toy: op gelu is not supported)" "$tmp/gelu.log"
rc=$?
check "a claimed op whose compute says UNSUPPORTED fails its cases (exit $code: $(grep -m1 '^FAIL.* gelu(' "$tmp/gelu.log"))" $rc

"$build/test_backend_ops" --plugin "$build/libpdde_toy_v99.so" >"$tmp/v99.log" 2>&1
code=$?
[ $code -ne 0 ] && grep -q "api_version 99; this pdde takes 1" "$tmp/v99.log"
rc=$?
check "a plugin of another version is refused, exit $code ($(tail -1 "$tmp/v99.log"))" $rc

# gpt's blocks on the toy, which runs neither AdamW's update nor a gradient accumulation (both in place):
# what those write lives on the CPU, the toy reads copies, and the losses are the CPU's
gpt_args=(--steps 6 --layers 1 --width 32 --heads 2 --ctx 16 --batch 4 --seed 5 --sample-len 0)
"$build/gpt" "${gpt_args[@]}" >"$tmp/gpt_cpu.log" 2>&1
PDDE_BACKEND_PLUGINS="$build/libpdde_toy.so" "$build/gpt" "${gpt_args[@]}" --blocks-on toy >"$tmp/gpt_toy.log" 2>&1
code=$?
cpu_losses=$(grep -o 'loss [0-9][0-9.]*' "$tmp/gpt_cpu.log" | tr '\n' ' ')
toy_losses=$(grep -o 'loss [0-9][0-9.]*' "$tmp/gpt_toy.log" | tr '\n' ' ')
[ $code -eq 0 ] && [ -n "$cpu_losses" ] && [ "$toy_losses" = "$cpu_losses" ] && grep -q "adamw_update (device [0-9])" "$tmp/gpt_toy.log"
rc=$?
check "gpt --blocks-on toy trains, its updates on the CPU, with the CPU's losses (exit $code; toy '$toy_losses', cpu '$cpu_losses'; $(grep -m1 'cannot\|error' "$tmp/gpt_toy.log"))" $rc

# README section 10's "train with it": LLaMA-style blocks on the toy run its ops (the linear layers' matmuls, SwiGLU's
# mul and their gradients: 32 of the step's 124 nodes at this size; 20 with 2-D matmuls only, the weight gradients'),
# it says how many, and a toy with a wrong mul gives other losses than the good toy's
gpt_args+=(--arch llama --steps 4)
PDDE_BACKEND_PLUGINS="$build/libpdde_toy.so" "$build/gpt" "${gpt_args[@]}" --blocks-on toy >"$tmp/llama_toy.log" 2>&1
code=$?
PDDE_BACKEND_PLUGINS="$build/libpdde_toy_wrongmul.so" "$build/gpt" "${gpt_args[@]}" --blocks-on toy >"$tmp/llama_bad.log" 2>&1
toy_losses=$(grep -o 'loss [0-9][0-9.]*' "$tmp/llama_toy.log" | tr '\n' ' ')
bad_losses=$(grep -o 'loss [0-9][0-9.]*' "$tmp/llama_bad.log" | tr '\n' ' ')
on_toy=$(sed -n 's/^gpt: \([0-9]*\) of the step.s \([0-9]*\) nodes run on toy.*/\1 of \2/p' "$tmp/llama_toy.log")
[ $code -eq 0 ] && [ "${on_toy%% *}" -ge 30 ] 2>/dev/null
check "gpt --arch llama --blocks-on toy runs a share of the step on the toy and says so (exit $code; '$on_toy')" $?
[ -n "$toy_losses" ] && [ -n "$bad_losses" ] && [ "$toy_losses" != "$bad_losses" ]
check "a toy with a wrong mul trains to other losses through that step (good '$toy_losses', wrong mul '$bad_losses')" $?

"$build/test_backend_ops" --backend nosuchbackend >"$tmp/b.log" 2>&1
code=$?
[ $code -eq 2 ] && grep -q "no such backend" "$tmp/b.log"
rc=$?
check "--backend nosuchbackend exits 2 naming it (exit $code: $(tail -1 "$tmp/b.log"))" $rc

"$build/test_backend_ops" --plugin "$build/libpdde_toy.so" --op nosuchop >"$tmp/o.log" 2>&1
code=$?
[ $code -eq 2 ] && grep -q "no such op" "$tmp/o.log"
rc=$?
check "--op nosuchop exits 2 naming it (exit $code: $(tail -1 "$tmp/o.log"))" $rc

# a cluster file where the toy is 1000x the CPU: the toy runs no in-place update (adamw_update, embedding_back),
# so no rank takes it as its own device (pdde_device_select); the planner plans the same: the rank on the CPU,
# the blocks placed on the toy, and the prediction it prints is of the placement gpt runs
cat >"$tmp/fast_toy.json" <<'JSON'
{"format": "pdde-cluster", "version": 1, "name": "fast toy",
 "specs": [{"name": "cpu", "kind": "cpu", "backend": "cpu", "peak_flops": 5e10, "mem_bandwidth": 1e10, "gemm": [],
            "curves": {"elementwise": [[49152, 2e-5]], "row": [], "attention": [], "embedding": [], "optimizer": []}},
           {"name": "fast", "kind": "accel", "backend": "toy", "peak_flops": 5e13, "mem_bandwidth": 1e12, "gemm": [],
            "curves": {"elementwise": [[49152, 2e-8]], "row": [], "attention": [], "embedding": [], "optimizer": []}}],
 "machines": [{"id": 0, "name": "host", "cores": 2, "numa_nodes": 1, "host_memory": 8000000000, "l3_cache": 0,
               "intra": {"kind": "shm", "bandwidth": 5e9, "latency": 2e-6, "group": -1},
               "nic": {"kind": "net", "bandwidth": 0, "latency": 0, "group": -1},
               "devices": [{"id": 0, "spec": "cpu", "memory": 8000000000}, {"id": 1, "spec": "fast", "memory": 8000000000}]}],
 "links": [], "collectives": []}
JSON
PDDE_BACKEND_PLUGINS="$build/libpdde_toy.so" "$build/gpt" --plan auto --cluster "$tmp/fast_toy.json" --steps 2 --sample-len 0 --layers 2 \
    --width 64 --heads 4 --ctx 32 >"$tmp/auto.log" 2>&1
code=$?
[ $code -eq 0 ] && grep -q "^gpt: the planner chose dp=1,.*,place=toy for 1 rank" "$tmp/auto.log" && grep -q "rank 0: device 0, cpu:0 .*not toy: it does not run" "$tmp/auto.log"
rc=$?
check "gpt --plan auto on a fast toy that runs no in-place update: the planner's rank and gpt's are the CPU, the blocks on the toy (exit $code: $(grep -m1 'planner chose' "$tmp/auto.log" | cut -c1-100))" $rc

"$build/test_backend_ops" --help >"$tmp/h.out" 2>"$tmp/h.err"
code=$?
[ $code -eq 0 ] && grep -q -- "--plugin" "$tmp/h.out" && [ ! -s "$tmp/h.err" ]
check "--help on stdout, exit 0 (exit $code)" $?

finish
