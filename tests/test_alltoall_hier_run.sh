#!/usr/bin/env bash
# The hierarchical all-to-all under the launcher: an MoE GPT (4 experts, one a rank: the tokens'
# exchange is an all-to-all over all 4 ranks) on two "hosts" of 2 ranks, each started by its own
# pdde-run (--nnodes 2, the store on 127.0.0.1, PDDE_HOST_ID telling the hosts apart, UCX between
# them), once with the exchange flat (PDDE_COMM_A2A_HIER=0) and once hierarchical (=1): every step's
# loss is the same to the last printed digit (the exchange only moves data; every other collective
# runs alike). Run from the repository root: build/test_alltoall_hier_run.
. tests/script_util.sh a2a_hier_run
if [ ! -x "$build/pdde-run" ] || [ ! -x "$build/gpt" ]; then
    echo "SKIP ucx: pdde-run or gpt is not built (pdde without UCX)"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
export PDDE_JOB_SECRET=a2a-hier-test-$$-$RANDOM UCX_WARN_UNUSED_ENV_VARS=n PDDE_BACKENDS=cpu
gpt=("$build/gpt" --moe-experts 4 --dp 4 --moe-ep --steps 3 --layers 2 --width 64 --heads 2 --ctx 32 --batch 8 --vocab 256 --threads 1)
for mode in 0 1; do
    for try in 1 2 3; do # (a random port that another process took: the next one)
        port=$((20000 + (RANDOM * 7 + $$) % 40000))
        PDDE_COMM_A2A_HIER=$mode PDDE_HOST_ID=host-a timeout 90 "$build/pdde-run" -n 2 --nnodes 2 --node-rank 0 --store 127.0.0.1:$port \
            "${gpt[@]}" --metrics "$tmp/m$mode.json" >"$tmp/a$mode.log" 2>&1 &
        a=$!
        PDDE_COMM_A2A_HIER=$mode PDDE_HOST_ID=host-b timeout 90 "$build/pdde-run" -n 2 --nnodes 2 --node-rank 1 --store 127.0.0.1:$port \
            "${gpt[@]}" >"$tmp/b$mode.log" 2>&1
        rb=$?
        wait $a; ra=$?
        grep -q "Address already in use\|cannot listen" "$tmp/a$mode.log" || break
    done
    check "PDDE_COMM_A2A_HIER=$mode: both hosts' pdde-run exit 0 ($ra, $rb)" $([ $ra = 0 ] && [ $rb = 0 ] && echo 0 || echo 1)
    [ $ra = 0 ] && [ $rb = 0 ] || { tail -5 "$tmp/a$mode.log" "$tmp/b$mode.log" | sed 's/^/    /'; }
done
l0=$(sed -nE 's/.*"loss":([^,]+).*/\1/p' "$tmp/m0.json" 2>/dev/null | tr '\n' ' ')
l1=$(sed -nE 's/.*"loss":([^,]+).*/\1/p' "$tmp/m1.json" 2>/dev/null | tr '\n' ' ')
check "3 losses from each run (flat: $l0; hierarchical: $l1)" $([ "$(echo $l0 | wc -w)" = 3 ] && [ "$(echo $l1 | wc -w)" = 3 ] && echo 0 || echo 1)
finite='^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$'
ok=0; for l in $l0; do [[ "$l" =~ $finite ]] || ok=1; done
check "the losses are finite numbers" $ok
check "the hierarchical exchange's losses equal the flat one's digit for digit" $([ -n "$l0" ] && [ "$l0" = "$l1" ] && echo 0 || echo 1)
finish
