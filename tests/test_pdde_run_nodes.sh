#!/usr/bin/env bash
# pdde-run on two "hosts" (two pdde-run --nnodes 2 on 127.0.0.1, node 0 hosting the store, node 1 finding it
# by --rdzv tcp://): with the same job secret the job trains on 4 ranks; node 1 with another secret stops at once (before starting any
# rank), saying the store refused its job secret and naming the store's address, without printing
# either secret. Run from the repository root: build/test_pdde_run_nodes.
. tests/script_util.sh pdde_run_nodes
if [ ! -x "$build/pdde-run" ] || [ ! -x "$build/gpt" ]; then
    echo "SKIP ucx: pdde-run or gpt is not built (pdde without UCX)"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
export UCX_WARN_UNUSED_ENV_VARS=n PDDE_BACKENDS=cpu
secret_a=nodes-test-secret-a-$$-$RANDOM-0123456789
secret_b=nodes-test-secret-b-$$-$RANDOM-0123456789
gpt=("$build/gpt" --dp 4 --steps 3 --layers 1 --width 32 --heads 2 --ctx 16 --batch 8 --threads 1 --val-every 0 --sample-len 0)
# node K with SECRET on PORT: node K's log in $tmp/nodeK.log; a fourth argument "rdzv" names the store by
# --rdzv tcp://127.0.0.1:PORT/JOB instead of --store (the same, for a job that is not elastic)
node() {
    local where=(--store 127.0.0.1:$2)
    [ "${4:-}" = rdzv ] && where=(--rdzv tcp://127.0.0.1:$2/nodes)
    PDDE_JOB_SECRET=$3 timeout 90 "$build/pdde-run" -n 2 --nnodes 2 --node-rank $1 "${where[@]}" "${gpt[@]}" >"$tmp/node$1.log" 2>&1
}

for try in 1 2 3; do # (a random port that another process took: the next one)
    port=$((20000 + (RANDOM * 7 + $$) % 40000))
    node 0 $port $secret_a & a=$!
    node 1 $port $secret_a rdzv; rb=$?
    wait $a; ra=$?
    grep -q "Address already in use\|cannot listen" "$tmp/node0.log" || break
done
check "the same secret: both nodes' pdde-run exit 0 ($ra, $rb)" $([ $ra = 0 ] && [ $rb = 0 ] && echo 0 || echo 1)
check "the 4 ranks trained together (dp 4, 3 steps)" $(grep -q "4 ranks: dp 4" "$tmp/node0.log" && grep -q "step *3/3" "$tmp/node0.log" && echo 0 || echo 1)
[ $ra = 0 ] && [ $rb = 0 ] || tail -5 "$tmp/node0.log" "$tmp/node1.log" | sed 's/^/    /'

for try in 1 2 3; do
    port=$((20000 + (RANDOM * 7 + $$) % 40000))
    node 0 $port $secret_a & a=$!
    start=$(date +%s%N)
    node 1 $port $secret_b; rb=$?
    took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    kill $a 2>/dev/null; wait $a
    grep -q "Address already in use\|cannot listen" "$tmp/node0.log" || break
done
msg=$(grep "pdde-run:" "$tmp/node1.log" | head -1)
check "another secret on node 1: its pdde-run exits 2 at once ($rb after $took_ms ms; under 10 s)" \
    $([ $rb = 2 ] && [ $took_ms -lt 10000 ] && echo 0 || echo 1)
check "it says the store at 127.0.0.1:$port refused its job secret: $msg" \
    $(echo "$msg" | grep -q "job store at 127.0.0.1:$port refused this node's job secret" && echo 0 || echo 1)
check "it started no rank" $(grep -q "^\[[0-9]" "$tmp/node1.log" && echo 1 || echo 0)
check "neither secret is printed" $(grep -q -e "$secret_a" -e "$secret_b" "$tmp/node1.log" "$tmp/node0.log" && echo 1 || echo 0)
[ $rb = 2 ] || sed 's/^/    /' "$tmp/node1.log" | tail -8
# a secret of the wrong size on node 1: said as such at once, not as a store that does not answer
PDDE_JOB_SECRET=short timeout 30 "$build/pdde-run" -n 1 --nnodes 2 --node-rank 1 --store 127.0.0.1:9 true >"$tmp/short.log" 2>&1
rb=$?
msg=$(head -1 "$tmp/short.log")
check "a 5-byte secret on node 1: exit 2, said as such ($rb: $msg)" \
    $([ $rb = 2 ] && echo "$msg" | grep -q "has 5 bytes; want 16" && ! grep -q "not running there" "$tmp/short.log" && echo 0 || echo 1)

# node 1 never starts: node 0's rank stops after PDDE_COMM_INIT_TIMEOUT (3 s here, 300 by default), naming rank 1
port=$((20000 + (RANDOM * 7 + $$) % 40000))
start=$(date +%s%N)
PDDE_COMM_INIT_TIMEOUT=3 PDDE_JOB_SECRET=$secret_a timeout 90 "$build/pdde-run" -n 2 --nnodes 2 --node-rank 0 --store 127.0.0.1:$port \
    "${gpt[@]}" >"$tmp/alone.log" 2>&1
ra=$?
took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
msg=$(grep -m1 "did not publish its address" "$tmp/alone.log")
check "node 1 never started: node 0 stops after PDDE_COMM_INIT_TIMEOUT=3 ($ra after $took_ms ms; under 30 s): $msg" \
    $([ $ra != 0 ] && [ $took_ms -lt 30000 ] && echo "$msg" | grep -q "rank [23] did not publish" && echo 0 || echo 1)
finish
