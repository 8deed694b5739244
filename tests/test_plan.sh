#!/usr/bin/env bash
# The planner end to end: a cluster file (written here: one machine, a CPU with its speeds), pdde-plan
# --auto on it, and gpt --plan auto / --plan by hand on 2 ranks under pdde-run, whose per-step losses
# must equal one process's (the plans only split the work). Run from the repository root.
. tests/script_util.sh plan
cat >"$tmp/cluster.json" <<'JSON'
{"format": "pdde-cluster", "version": 1, "name": "test",
 "specs": [{"name": "cpu", "kind": "cpu", "backend": "cpu", "peak_flops": 5e10, "mem_bandwidth": 1e10, "gemm": [],
            "curves": {"elementwise": [[49152, 2e-5]], "row": [], "attention": [], "embedding": [], "optimizer": []}}],
 "machines": [{"id": 0, "name": "host", "cores": 2, "numa_nodes": 1, "host_memory": 8000000000, "l3_cache": 0,
               "intra": {"kind": "shm", "bandwidth": 5e9, "latency": 2e-6, "group": -1},
               "nic": {"kind": "net", "bandwidth": 0, "latency": 0, "group": -1},
               "devices": [{"id": 0, "spec": "cpu", "memory": 8000000000}]}],
 "links": [], "collectives": []}
JSON
"$build/pdde-plan" --auto --cluster "$tmp/cluster.json" --ranks 2 >"$tmp/plan.log" 2>&1
rc=$?
check "pdde-plan --auto on the cluster file ($(tail -2 "$tmp/plan.log"))" $rc
grep -q '^best dp=' "$tmp/plan.log"
check "pdde-plan --auto prints a best plan" $?
# one step of a forced plan, simulated from both ranks' lowered programs: the text timeline, an SVG and
# a Chrome trace with both ranks' compute and communication, the pipeline's bubble idle on each stage
"$build/pdde-plan" --plan dp=1,pp=2,mb=4 --cluster "$tmp/cluster.json" --timeline "$tmp/t.svg" --trace "$tmp/t.json" >"$tmp/tl.log" 2>&1
rc=$?
check "pdde-plan --plan pp=2 --timeline --trace ($(tail -1 "$tmp/tl.log"))" $rc
grep -q '^rank   1 |' "$tmp/tl.log" && grep -Eq '^rank   0 \|#+\.+' "$tmp/tl.log"
rc=$?
check "the text timeline has a lane per rank, stage 0 idle while stage 1 fills ($(grep '^rank   0' "$tmp/tl.log" | cut -c1-60))" $rc
[ "$(grep -c '<rect' "$tmp/t.svg")" -gt 100 ] && grep -q 'rank 1' "$tmp/t.svg"
check "the SVG timeline draws both ranks' events" $?
# a slow accelerator beside the CPU (PoCL on the same cores): the search keeps both ranks on copies of the
# CPU, and a plan's simulation runs them there too, not rank 1 on the accelerator. The CPU has the
# contention pdde-bench measures on 2 cores (without it the simulation runs 2 ranks at twice one's speed,
# where the estimate shares the CPU's figures between them)
sed -e 's/"kind": "cpu", "backend": "cpu",/"kind": "cpu", "backend": "cpu", "contention": {"gemm": 1.5, "elementwise": 2.5, "row": 1.85},/' \
    -e 's/"specs": \[/"specs": [{"name": "slow", "kind": "accel", "backend": "opencl", "peak_flops": 5e8, "mem_bandwidth": 1e8, "gemm": [], "curves": {"elementwise": [[49152, 2e-3]], "row": [], "attention": [], "embedding": [], "optimizer": []}}, /' \
    -e 's/"memory": 8000000000}\]}\]/"memory": 8000000000}, {"id": 1, "spec": "slow", "memory": 8000000000}]}]/' "$tmp/cluster.json" >"$tmp/slow_acc.json"
"$build/pdde-plan" --plan dp=2 --cluster "$tmp/slow_acc.json" >"$tmp/tl2.log" 2>&1
compute=$(sed -n 's/^rank   [01] |.*| compute \([0-9.e-]*\) s.*/\1/p' "$tmp/tl2.log" | sort -u)
[ "$(grep -c '^rank   [01] |' "$tmp/tl2.log")" = 2 ] && [ "$(echo "$compute" | wc -l)" = 1 ]
rc=$?
check "a plan of 2 ranks beside a slow accelerator is simulated with both on the CPU (compute: $(echo $compute))" $rc
# a forced plan's place= is simulated on that device: the slow accelerator's step is far longer than the CPU's,
# half the blocks on it about half as long again (PoCL is the OpenCL device lowered for)
if "$build/pdde-info" 2>/dev/null | grep -Eq '^ +opencl +available'; then
    for pl in dp=1 dp=1,place=opencl dp=1,place=opencl:1-2; do
        "$build/pdde-plan" --plan $pl --cluster "$tmp/slow_acc.json" >"$tmp/pl.log" 2>&1
        sed -n 's/^rank   0 |.*| compute \([0-9.e-]*\) s.*/\1/p' "$tmp/pl.log"
    done >"$tmp/placed.txt"
    read -r own all part < <(tr '\n' ' ' <"$tmp/placed.txt")
    awk -v o="$own" -v a="$all" -v p="$part" 'BEGIN { exit !(o > 0 && a > 20 * o && p > o && p < a) }'
    rc=$?
    check "pdde-plan --plan place=opencl simulates the blocks on the slow accelerator (compute: own $own s, all placed $all s, blocks 1-2 $part s)" $rc
else
    echo "SKIP opencl: pdde-plan --plan place=opencl (no OpenCL device here)"
fi
"$build/pdde-plan" --auto --cluster "$tmp/slow_acc.json" --ranks 2 --top 1 >"$tmp/est.log" 2>&1
"$build/pdde-plan" --auto --cluster "$tmp/slow_acc.json" --ranks 2 --top 1 --simulate >"$tmp/sim.log" 2>&1
est=$(awk '/^best/ {print $3}' "$tmp/est.log") sim=$(awk '/^best/ {print $3}' "$tmp/sim.log")
awk -v e="$est" -v s="$sim" 'BEGIN { exit !(e > 0 && s > 0 && s < 2 * e && e < 2 * s) }'
rc=$?
check "there, the best plan's simulated step is within 2x of its estimate ($sim against $est s)" $rc
python3 - "$tmp/t.json" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
kinds = {(e["pid"], e["tid"], e["cat"]) for e in ev}
need = {(0, 0, "compute"), (1, 0, "compute"), (0, 1, "comm"), (1, 1, "comm")}
ok = need <= kinds and all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev)
print(len(ev), "events", sorted(kinds))
sys.exit(0 if ok else 1)
PY
check "the Chrome trace is JSON with compute and comm events of both ranks" $?
"$build/pdde-plan" --plan dp=1,pp=2,mb=3 --cluster "$tmp/cluster.json" >"$tmp/tlbad.log" 2>&1
[ $? -ne 0 ] && grep -q 'do not divide the batch' "$tmp/tlbad.log"
rc=$?
check "a forced plan whose micro-batches do not divide the batch is refused ($(head -1 "$tmp/tlbad.log"))" $rc
# a forced plan over its devices' memory (1 MiB each): its timeline, then which rank is over by how much, exit 1
sed 's/"memory": 8000000000}/"memory": 1048576}/' "$tmp/cluster.json" >"$tmp/tinymem.json"
"$build/pdde-plan" --plan dp=2 --cluster "$tmp/tinymem.json" >"$tmp/tlmem.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -q '^rank   1 |' "$tmp/tlmem.log" && grep -Eq 'does not fit: rank 0 needs [0-9.e-]+ GiB at its peak, its device \(cluster device 0\) has 0.000488[0-9]* GiB for it: [0-9.e-]+ GiB over' "$tmp/tlmem.log"
ok=$?
check "a forced plan over its devices' memory says by how much and exits 1 (rc $rc: $(grep -m1 'does not fit' "$tmp/tlmem.log"))" $ok
# a cluster file of 2 machines for a job on one: gpt says so and suggests measuring this machine into
# another file, not over the operator's own
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); m = dict(d['machines'][0], id=1, devices=[{'id': 1, 'spec': 'cpu', 'memory': 8000000000}])
d['machines'].append(m); json.dump(d, open(sys.argv[2], 'w'))" "$tmp/cluster.json" "$tmp/two_machines.json"
"$build/gpt" --plan auto --cluster "$tmp/two_machines.json" --steps 1 >"$tmp/two.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "2 machines, the job has 1 ranks (build/pdde-bench -o build/this-machine.json" "$tmp/two.log" &&
    ! grep -q "pdde-bench -o $tmp/two_machines.json" "$tmp/two.log"
ok=$?
check "a cluster file of 2 machines for 1 rank: measuring this machine into another file is suggested (rc $rc: $(grep -m1 'gpt: --plan auto' "$tmp/two.log"))" $ok
# a place= range past the model's layers (0-5 for 4 blocks) is refused by name, not clamped to nothing
"$build/pdde-plan" --plan dp=1,place=opencl:9-12 --cluster "$tmp/cluster.json" >"$tmp/place.log" 2>&1
rc=$?
"$build/gpt" --plan dp=1,tp=1,pp=1,mb=1,zero=0,place=opencl:4-6 --layers 4 --steps 1 >"$tmp/gplace.log" 2>&1
grc=$?
[ $rc != 0 ] && grep -q "place=opencl:9-12 is outside the model's layers 0-5" "$tmp/place.log" && [ $grc != 0 ] &&
    grep -q "place=opencl:4-6 is outside the model's layers 0-5" "$tmp/gplace.log"
ok=$?
check "a place= range outside the model is refused by pdde-plan and gpt (rc $rc, $grc: $(head -1 "$tmp/place.log"))" $ok
# after --auto, the best plan's timeline runs each rank on the device the search gave it: on the CPU
# beside the slow accelerator, both ranks alike
"$build/pdde-plan" --auto --cluster "$tmp/slow_acc.json" --ranks 2 --top 1 --timeline "$tmp/best.svg" >"$tmp/best.log" 2>&1
rc=$?
compute=$(sed -n 's/^rank   [01] |.*| compute \([0-9.e-]*\) s.*/\1/p' "$tmp/best.log" | sort -u)
[ $rc = 0 ] && [ "$(grep -c '^rank   [01] |' "$tmp/best.log")" = 2 ] && [ "$(echo "$compute" | wc -l)" = 1 ]
ok=$?
check "--auto --timeline beside a slow accelerator simulates the best plan on the search's devices, both on the CPU (rc $rc, compute: $(echo $compute))" $ok
# memory in GiB throughout (the plans' peaks, the reasons, the timeline), no decimal GB or MB
grep -Eq '^best .* peak [0-9.e+-]+ GiB \(device' "$tmp/best.log" && grep -Eq '^rank   0 \|.*peak [0-9.e+-]+ GiB$' "$tmp/best.log" &&
    ! grep -Eq '[0-9] (GB|MB)([^/]|$)' "$tmp/best.log" "$tmp/plan.log" "$tmp/tl.log"
ok=$?
check "pdde-plan says memory in GiB only ($(grep -m1 -o 'peak [^(]*' "$tmp/best.log"))" $ok
"$build/pdde-plan" --dp 2 --zero 1 >"$tmp/hand.log" 2>&1 && grep -Eq '^ranks 0 1: parameters [0-9.e+-]+ GiB' "$tmp/hand.log" && ! grep -Eq '[0-9] (GB|MB)([^/]|$)' "$tmp/hand.log"
ok=$?
check "pdde-plan --dp 2 --zero 1 says each rank's bytes in GiB ($(grep -m1 '^ranks' "$tmp/hand.log"))" $ok
# a bad --model: the key named and the keys it takes
"$build/pdde-plan" --auto --cluster "$tmp/cluster.json" --model gpt:layers=2,depth=3 >"$tmp/model.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "no key 'depth' (keys: layers, width, heads, ctx, vocab, batch, ffn, experts, topk, window; llama: kv_heads)" "$tmp/model.log"
ok=$?
check "--model gpt:layers=2,depth=3 names the key and lists the keys (rc $rc: $(head -1 "$tmp/model.log"))" $ok
# the LLaMA-style model: its kv heads taken (the tensor-parallel degrees then divide them), GPT's refused
"$build/pdde-plan" --auto --cluster "$tmp/cluster.json" --ranks 2 --model llama:layers=2,width=64,heads=4,kv_heads=2,ctx=32,vocab=256,batch=8 \
    >"$tmp/llama_model.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q '^LLaMA 2 layers, width 64, 4 heads' "$tmp/llama_model.log" && grep -q '^best dp=' "$tmp/llama_model.log"
ok=$?
check "pdde-plan --model llama:...,kv_heads=2 plans the LLaMA model (rc $rc: $(grep -m1 '^LLaMA' "$tmp/llama_model.log" | cut -c1-80))" $ok
# a sliding window (gpt --window): the attention priced at the window's pairs, the step shorter than the whole context's
for w in 256 16; do
    "$build/pdde-plan" --auto --cluster "$tmp/cluster.json" --ranks 1 --model llama:layers=2,width=64,heads=4,ctx=256,vocab=256,batch=2,window=$w \
        >"$tmp/window_$w.log" 2>&1 || echo "rc $?" >>"$tmp/window_$w.log"
done
whole=$(sed -n 's/^best .* \([0-9.e+-]*\) s\/step.*/\1/p' "$tmp/window_256.log") windowed=$(sed -n 's/^best .* \([0-9.e+-]*\) s\/step.*/\1/p' "$tmp/window_16.log")
awk -v a="$windowed" -v b="$whole" 'BEGIN { exit !(a > 0 && b > 0 && a < b) }'
ok=$?
check "pdde-plan --model llama:...,window=16 at ctx 256: a step of ${windowed:-?} s, without a window ${whole:-?} s" $ok
"$build/pdde-plan" --auto --cluster "$tmp/cluster.json" --model gpt:layers=2,kv_heads=2 >"$tmp/model.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "no key 'kv_heads'" "$tmp/model.log"
ok=$?
check "--model gpt:kv_heads=2 is refused: the kv heads are LLaMA's (rc $rc: $(head -1 "$tmp/model.log"))" $ok
"$build/pdde-plan" --auto --cluster "$tmp/cluster.json" --model gpt:layers=x >"$tmp/model.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "'layers=x' is not KEY=N" "$tmp/model.log"
ok=$?
check "--model gpt:layers=x says what it expected (rc $rc: $(head -1 "$tmp/model.log"))" $ok
"$build/pdde-plan" --auto --cluster "$tmp/nonexistent.json" >"$tmp/bad.log" 2>&1
[ $? -ne 0 ] && grep -q nonexistent "$tmp/bad.log"
rc=$?
check "a missing cluster file is an error naming it ($(head -1 "$tmp/bad.log"))" $rc

# the recommender (build/dlrm's model) on a machine with a CPU and a GPU (peak figures only) and a machine
# with a GPU alone: the dense stage goes to the GPU, the table's pull and push to its machine's CPU; the
# GPU of the machine without a CPU is refused, saying why
cat >"$tmp/mixed.json" <<'JSON'
{"format": "pdde-cluster", "version": 1, "name": "mixed",
 "specs": [{"name": "cpu", "kind": "cpu", "backend": "cpu", "peak_flops": 5e10, "mem_bandwidth": 1e10, "gemm": [],
            "curves": {"elementwise": [[49152, 2e-5]], "row": [], "attention": [], "embedding": [], "optimizer": []}},
           {"name": "gpu", "kind": "gpu", "backend": "cuda", "peak_flops": 5e13, "mem_bandwidth": 2e12, "gemm": [],
            "curves": {"elementwise": [], "row": [], "attention": [], "embedding": [], "optimizer": []}}],
 "machines": [{"id": 0, "name": "host", "cores": 4, "numa_nodes": 1, "host_memory": 8000000000, "l3_cache": 0,
               "intra": {"kind": "shm", "bandwidth": 5e9, "latency": 2e-6, "group": -1},
               "nic": {"kind": "net", "bandwidth": 1e9, "latency": 1e-5, "group": -1},
               "devices": [{"id": 0, "spec": "cpu", "memory": 8000000000}, {"id": 1, "spec": "gpu", "memory": 16000000000}]},
              {"id": 1, "name": "gpuonly", "cores": 4, "numa_nodes": 1, "host_memory": 8000000000, "l3_cache": 0,
               "intra": {"kind": "shm", "bandwidth": 5e9, "latency": 2e-6, "group": -1},
               "nic": {"kind": "net", "bandwidth": 1e9, "latency": 1e-5, "group": -1},
               "devices": [{"id": 2, "spec": "gpu", "memory": 16000000000}]}],
 "links": [], "collectives": []}
JSON
"$build/pdde-plan" --auto --cluster "$tmp/mixed.json" --model dlrm:batch=256,dim=8,hidden=64 >"$tmp/dlrm_plan.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q '^DLRM batch 256, dim 8, hidden 64' "$tmp/dlrm_plan.log" &&
    grep -q '^best dense on device 1 (cuda, gpu), pull and push on CPU device 0 of host: ' "$tmp/dlrm_plan.log" &&
    grep -q '^     dense on device 0 (cpu, cpu), pull and push on CPU device 0 of host: ' "$tmp/dlrm_plan.log" &&
    grep -q "^no   dense on device 2 (cuda, gpu): machine gpuonly lists no CPU device" "$tmp/dlrm_plan.log"
ok=$?
check "pdde-plan --model dlrm: the dense stage on the GPU, the table's rows on its machine's CPU, the CPU-less machine refused (rc $rc: $(grep -m1 '^best' "$tmp/dlrm_plan.log"))" $ok
# its prediction is build/dlrm's own: the same stages timed, the same threads (4: the machine's cores;
# PDDE_NUM_THREADS for dlrm) sized by the pipeline. The table's pull and push are slow here, so the
# pipeline gives push a second thread.
sed 's/"embedding": \[\], "optimizer": \[\]}},/"embedding": [], "optimizer": [], "ps_pull": [[1e5, 4e-3]], "ps_push": [[1e5, 4e-3]]}},/' \
    "$tmp/mixed.json" >"$tmp/slowps.json"
"$build/pdde-plan" --auto --cluster "$tmp/slowps.json" --model dlrm:batch=256 >"$tmp/dlrm_slow.log" 2>&1
mkdir -p "$tmp/dlrm_run/build" # (dlrm --synthetic writes its data to build/ under its folder)
dlrm_bin=$(realpath "$build/dlrm")
(cd "$tmp/dlrm_run" && PDDE_NUM_THREADS=4 timeout 120 "$dlrm_bin" --device cpu --pipeline 2 --cluster "$tmp/slowps.json" \
    --synthetic 1000 >"$tmp/dlrm_run.log" 2>&1)
rc=$?
# (the CPU line's batch time, in ms to dlrm's 3 digits, and dlrm's sizing)
plan_ms=$(awk '/dense on device 0 \(cpu/ { for (i = 1; i <= NF; i++) if ($i == "s/batch") printf "%.3g", 1e3 * $(i - 1) }' "$tmp/dlrm_slow.log")
run_ms=$(sed -n 's/^pipeline sized from .*; predicted \([0-9.e+-]*\) ms per batch.*/\1/p' "$tmp/dlrm_run.log")
plan_sizing=$(grep -A1 'dense on device 0 (cpu' "$tmp/dlrm_slow.log" | sed -n 's/^ *sized from //p')
[ $rc = 0 ] && [ -n "$run_ms" ] && [ "$plan_ms" = "$run_ms" ] && grep -q "^pipeline sized from $plan_sizing\$" "$tmp/dlrm_run.log" &&
    grep -q 'push [0-9.]* ms x 2' "$tmp/dlrm_run.log"
ok=$?
check "pdde-plan's dlrm prediction on the CPU ($plan_ms ms/batch: $plan_sizing) is build/dlrm --pipeline's ($run_ms ms, rc $rc)" $ok
# a cluster whose machines list no CPU (the GPU example files): nothing to time the rows' pull and push on,
# an error; the refusals as many as --top, the rest counted
"$build/pdde-plan" --auto --cluster tools/clusters/h100_128.json --model dlrm:batch=256 --top 2 >"$tmp/dlrm_nocpu.log" 2>&1
rc=$?
[ $rc = 1 ] && [ "$(grep -c '^no   dense on device' "$tmp/dlrm_nocpu.log")" = 2 ] && grep -q '^no   126 more devices refused' "$tmp/dlrm_nocpu.log" &&
    grep -q 'no device of tools/clusters/h100_128.json can be timed for the recommender' "$tmp/dlrm_nocpu.log"
ok=$?
check "pdde-plan --model dlrm on a cluster without CPUs fails, listing --top 2 refusals and counting the rest (rc $rc: $(tail -1 "$tmp/dlrm_nocpu.log"))" $ok
"$build/pdde-plan" --auto --cluster "$tmp/mixed.json" --model dlrm:batch=256,tables=26 >"$tmp/dlrm_bad.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "^pdde-plan: --model dlrm:batch=256,tables=26: no key 'tables' (keys: batch, dim, hidden, threads (N); dense=adamw|sgd|servers; optimizer=sgd|adagrad|adam)" "$tmp/dlrm_bad.log"
ok=$?
check "--model dlrm:tables=26 names the key and lists the keys (rc $rc: $(head -1 "$tmp/dlrm_bad.log"))" $ok
"$build/pdde-plan" --auto --cluster "$tmp/mixed.json" --model dlrm:optimizer=rmsprop >"$tmp/dlrm_bad.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "optimizer=rmsprop: want sgd, adagrad or adam" "$tmp/dlrm_bad.log"
ok=$?
check "--model dlrm:optimizer=rmsprop says what it expected (rc $rc: $(head -1 "$tmp/dlrm_bad.log"))" $ok

# the losses of steps 1..4, as gpt prints them (rank 0 or the only process)
losses() { grep -E 'step +[1-4]/4 ' "$1" | sed -E 's/.*loss ([0-9.]+).*/\1/' | tr '\n' ' '; }
args=(--steps 4 --val-every 0 --sample-len 0 --threads 1)
"$build/gpt" "${args[@]}" >"$tmp/one.log" 2>&1
ref=$(losses "$tmp/one.log")
check "one process trains ($ref)" $([ -n "$ref" ] && echo 0 || echo 1)
# a --cluster file that does not parse is an error naming the file and the field, as with --plan auto
sed 's/"peak_flops": 5e10/"peak_flops": "fast"/' "$tmp/cluster.json" >"$tmp/broken.json"
for how in "" "--plan auto"; do
    "$build/gpt" $how --cluster "$tmp/broken.json" "${args[@]}" >"$tmp/broken.log" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q "broken.json: .*peak_flops" "$tmp/broken.log" && ! grep -q 'step *1/4' "$tmp/broken.log"
    ok=$?
    check "gpt $how --cluster FILE that does not parse stops, naming the file and the field (rc $rc: $(grep -m1 broken.json "$tmp/broken.log"))" $ok
done
if [ -x "$build/pdde-run" ]; then
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --plan auto --cluster "$tmp/cluster.json" "${args[@]}" >"$tmp/auto.log" 2>&1
    rc=$?
    check "pdde-run -n 2 gpt --plan auto exits 0 ($(tail -2 "$tmp/auto.log"))" $rc
    grep -q 'the planner chose dp=' "$tmp/auto.log"
    check "gpt says which plan the planner chose" $?
    # no plan given under a launcher of two: data parallel over both, the losses of one process
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${args[@]}" >"$tmp/default.log" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q 'gpt: 2 ranks and no plan given: data parallel over them (--dp 2)' "$tmp/default.log" &&
        [ "$(losses "$tmp/default.log")" = "$ref" ]
    ok=$?
    check "pdde-run -n 2 gpt without a plan trains data parallel over both ranks, the losses '$(losses "$tmp/default.log")' of one process (rc $rc)" $ok
    # a given plan of one rank under a launcher of two would train two copies: refused, saying what to give
    for how in "--dp 1" "--dp 1 --moe-experts 8 --moe-ep"; do
        timeout 180 "$build/pdde-run" -n 2 "$build/gpt" $how --ckpt-dir "$tmp/twice" "${args[@]}" >"$tmp/world.log" 2>&1
        rc=$?
        [ $rc != 0 ] && grep -q 'the launcher started 2 ranks but the plan (--dp 1 x --tp 1 x --pp 1) uses one' "$tmp/world.log" &&
            grep -q 'Give --dp 2' "$tmp/world.log" && ! grep -q 'step *1/4' "$tmp/world.log" && [ ! -e "$tmp/twice" ]
        ok=$?
        check "pdde-run -n 2 gpt $how is refused, nothing trained or written (rc $rc: $(grep -m1 'launcher started' "$tmp/world.log" | cut -c1-150))" $ok
    done
    grep -q 'the experts over the --dp ranks' "$tmp/world.log"
    check "--moe-ep with --dp 1: the message says the experts split over the --dp ranks" $?
    check "--plan auto: losses '$(losses "$tmp/auto.log")' equal one process's '$ref'" $([ "$(losses "$tmp/auto.log")" = "$ref" ] && echo 0 || echo 1)
    # split parameters start as their slices of one process's initial values (tensor parallel: each
    # rank its columns; ZeRO-3: each its rows), so the losses are one process's from step 1 on
    for plan in "--tp 2" "--plan dp=2,zero=3" "--plan dp=2,zero=2,shares=3:1"; do
        timeout 180 "$build/pdde-run" -n 2 "$build/gpt" $plan "${args[@]}" >"$tmp/split.log" 2>&1
        check "gpt $plan: losses '$(losses "$tmp/split.log")' equal one process's '$ref'" $([ "$(losses "$tmp/split.log")" = "$ref" ] && echo 0 || echo 1)
    done
    # (the last: shares=3:1, one micro-batch a share: each rank says its part)
    grep -q '^\[0\] .*uneven shares: this rank runs 3 of the step.s 4 micro-batches' "$tmp/split.log" &&
        grep -q '^\[1\] .*uneven shares: this rank runs 1 of the step.s 4 micro-batches' "$tmp/split.log"
    ok=$?
    check "shares=3:1: each rank says its part of the step ($(grep -o 'uneven shares.*' "$tmp/split.log" | head -1))" $ok
    # the LLaMA-style model (grouped-query attention: tp 2 gives each rank one kv group and its 2 query heads;
    # pipeline stages; ZeRO-3)
    "$build/gpt" --arch llama --kv-heads 2 "${args[@]}" >"$tmp/llama.log" 2>&1
    llama_ref=$(losses "$tmp/llama.log")
    check "gpt --arch llama --kv-heads 2 trains ($llama_ref)" $([ -n "$llama_ref" ] && echo 0 || echo 1)
    for plan in "--tp 2" "--dp 2" "--plan dp=1,pp=2,mb=4" "--plan dp=2,zero=3"; do
        timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --arch llama --kv-heads 2 $plan "${args[@]}" >"$tmp/llama2.log" 2>&1
        check "gpt --arch llama --kv-heads 2 $plan: losses '$(losses "$tmp/llama2.log")' equal one process's '$llama_ref'" \
            $([ "$(losses "$tmp/llama2.log")" = "$llama_ref" ] && echo 0 || echo 1)
    done
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --arch llama --kv-heads 1 --tp 2 "${args[@]}" >"$tmp/llama_tp.log" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q 'tp 2 must divide the 1 kv heads' "$tmp/llama_tp.log" && ! grep -q 'step *1/4' "$tmp/llama_tp.log"
    ok=$?
    check "gpt --arch llama --kv-heads 1 --tp 2 is refused, naming the kv heads (rc $rc: $(grep -m1 'kv heads' "$tmp/llama_tp.log" | cut -c1-120))" $ok
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --plan dp=1,pp=2,mb=4,stages=5:1 "${args[@]}" >"$tmp/cut.log" 2>&1
    rc=$?
    check "an uneven stage cut (5:1) runs ($(tail -1 "$tmp/cut.log"))" $rc
    check "--plan pp=2,stages=5:1: losses '$(losses "$tmp/cut.log")' equal one process's '$ref'" $([ "$(losses "$tmp/cut.log")" = "$ref" ] && echo 0 || echo 1)
    # the plans the search returns run as they say: a stage recomputing its first layers (rc), and a
    # stage per block of ranks (blocks=1: ranks 0 and 1 are stage 0)
    arena() { grep -E "^\[$2\] gpt: data" "$1" | sed -E "s/.*activations ([0-9.]+) MB \(the memory plan's arenas.*/\1/"; }
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --plan dp=1,pp=2,mb=4 "${args[@]}" >"$tmp/pp.log" 2>&1
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --plan dp=1,pp=2,mb=4,rc=2:0 "${args[@]}" >"$tmp/rc.log" 2>&1
    rc=$?
    check "--plan pp=2,rc=2:0 runs ($(tail -1 "$tmp/rc.log"))" $rc
    check "--plan pp=2,rc=2:0: losses '$(losses "$tmp/rc.log")' equal one process's '$ref'" $([ "$(losses "$tmp/rc.log")" = "$ref" ] && echo 0 || echo 1)
    a0=$(arena "$tmp/pp.log" 0); a1=$(arena "$tmp/rc.log" 0); b0=$(arena "$tmp/pp.log" 1); b1=$(arena "$tmp/rc.log" 1)
    awk -v a="$a0" -v b="$a1" -v c="$b0" -v d="$b1" 'BEGIN { exit !(b + 0 > 0 && b < a && d == c) }' </dev/null
    rc=$?
    check "rc=2:0 shrinks stage 0's activation arena only (stage 0: $a0 -> $a1 MB, stage 1: $b0 -> $b1 MB)" $rc
    timeout 300 "$build/pdde-run" -n 4 "$build/gpt" --plan dp=2,pp=2,mb=2,blocks=1 --show-program "${args[@]}" >"$tmp/blocks.log" 2>&1
    rc=$?
    check "--plan dp=2,pp=2,blocks=1 runs on 4 ranks ($(tail -1 "$tmp/blocks.log"))" $rc
    check "--plan blocks=1: losses '$(losses "$tmp/blocks.log")' equal one process's '$ref'" $([ "$(losses "$tmp/blocks.log")" = "$ref" ] && echo 0 || echo 1)
    grep -q '^\[1\] # local program.*pipeline stage 0 of 2' "$tmp/blocks.log" && grep -q '^\[2\] # local program.*pipeline stage 1 of 2' "$tmp/blocks.log"
    rc=$?
    check "blocks=1: process 1 runs stage 0, process 2 stage 1 ($(grep -o '^\[1\] # local program.*' "$tmp/blocks.log" | cut -c1-90))" $rc
    # sampling under vocab-parallel tensor parallelism (each rank holds V/2 columns of the logits): from
    # the same checkpoint, the same text as one process
    sample() { sed -n '/---- sample/,/^\(\[0\] \)\{0,1\}----------------$/p' "$1" | sed 's/^\[0\] //' | od -c; }
    "$build/gpt" --steps 2 --val-every 0 --sample-len 40 --threads 1 --ckpt-dir "$tmp/ck" >"$tmp/s1.log" 2>&1
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" --tp 2 --steps 2 --val-every 0 --sample-len 40 --threads 1 --ckpt-dir "$tmp/ck" --resume \
        >"$tmp/s2.log" 2>&1
    [ -n "$(sample "$tmp/s1.log")" ] && [ "$(sample "$tmp/s1.log")" = "$(sample "$tmp/s2.log")" ]
    rc=$?
    check "gpt --tp 2 samples what one process samples from the same checkpoint ($(sample "$tmp/s2.log" | head -2 | tr -s ' ' | tr '\n' ' '))" $rc
else
    echo "SKIP comm: the 2-rank runs (this build has no UCX)"
fi
# device placement: the blocks on the OpenCL device (PoCL in CI) by a forced plan, and chosen by the
# planner from a cluster file whose machine has a CPU and a (here much faster) OpenCL device
if "$build/pdde-info" 2>/dev/null | grep -Eq '^ +opencl +available'; then
    "$build/gpt" --plan dp=1,place=opencl "${args[@]}" >"$tmp/place.log" 2>&1
    rc=$?
    check "gpt --plan dp=1,place=opencl runs ($(tail -1 "$tmp/place.log"))" $rc
    grep -q 'blocks on opencl' "$tmp/place.log"
    check "gpt says the blocks are on opencl" $?
    check "--plan place=opencl: losses '$(losses "$tmp/place.log")' equal one process's '$ref'" $([ "$(losses "$tmp/place.log")" = "$ref" ] && echo 0 || echo 1)
    sed -e 's/"specs": \[/"specs": [{"name": "ocl", "kind": "gpu", "backend": "opencl", "peak_flops": 5e12, "mem_bandwidth": 1e12, "gemm": [],\n            "curves": {"elementwise": [], "row": [], "attention": [], "embedding": [], "optimizer": []}}, /' \
        -e 's/"devices": \[{"id": 0, "spec": "cpu", "memory": 8000000000}\]/"devices": [{"id": 0, "spec": "cpu", "memory": 8000000000}, {"id": 1, "spec": "ocl", "memory": 8000000000}]/' \
        "$tmp/cluster.json" >"$tmp/cluster2.json"
    "$build/gpt" --plan auto --cluster "$tmp/cluster2.json" "${args[@]}" >"$tmp/autoplace.log" 2>&1
    rc=$?
    check "gpt --plan auto on a CPU + fast OpenCL machine runs ($(grep -m1 'planner chose' "$tmp/autoplace.log"; tail -1 "$tmp/autoplace.log"))" $rc
    grep -q 'the planner chose' "$tmp/autoplace.log" && grep -q 'rank 0: device [0-9]*, opencl:0 .*auto: predicted' "$tmp/autoplace.log" &&
        grep -q 'blocks on opencl' "$tmp/autoplace.log"
    rc=$?
    check "the rank trains on the faster OpenCL device, its own ($(grep -m1 'rank 0: device' "$tmp/autoplace.log"))" $rc
    check "--plan auto, placed: losses '$(losses "$tmp/autoplace.log")' equal one process's '$ref'" $([ "$(losses "$tmp/autoplace.log")" = "$ref" ] && echo 0 || echo 1)
    # with pipeline stages: stage 1 (layers 3..5 of 6) runs its last block, layer 4, on OpenCL
    if [ -x "$build/pdde-run" ]; then
        timeout 300 "$build/pdde-run" -n 2 "$build/gpt" --plan dp=1,pp=2,mb=4,place=opencl:4-4 "${args[@]}" >"$tmp/ppplace.log" 2>&1
        rc=$?
        check "pdde-run -n 2 gpt --plan dp=1,pp=2,mb=4,place=opencl:4-4 runs ($(tail -1 "$tmp/ppplace.log"))" $rc
        check "--plan pp=2,place=opencl:4-4: losses '$(losses "$tmp/ppplace.log")' equal one process's '$ref'" $([ "$(losses "$tmp/ppplace.log")" = "$ref" ] && echo 0 || echo 1)
    fi
else
    echo "SKIP opencl: no OpenCL device (PoCL in CI): the placed runs"
fi
for bad in "dp=0" "zero=5" "pp=2,stages=9:9" "dp=x" "pp=2,mb=2,chunks=2,place=opencl"; do
    "$build/gpt" --plan "$bad" "${args[@]}" >"$tmp/badplan.log" 2>&1
    check "gpt --plan $bad is refused" $([ $? -ne 0 ] && echo 0 || echo 1)
done
finish
