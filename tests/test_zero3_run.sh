#!/usr/bin/env bash
# ZeRO-3 under pdde-run: `gpt --dp 2 --zero 3 --micro 2`, `gpt --dp 2 --pp 2 --zero 3 --micro 2` (also
# with --pp-chunks 2) and the MoE GPT `--moe-experts 8 --dp 4 --ep 2 --zero 3` train as one process does (each step's loss within 1e-6
# relative, with the prefetch and the early gradient reductions on (PDDE_ZERO3_PREFETCH=1 PDDE_OVERLAP_GRADIENTS=1); so do
# ZeRO-2 and ZeRO-1 with interleaved stages, `--dp 2 --pp 2 --zero 2|1 --micro 2 --pp-chunks 2`, whose programs do overlap
# the reductions with backward), the same bits with
# PDDE_ZERO3_REGATHER=0 (gathering a parameter again for backward changes no value) and with
# PDDE_ZERO3_PREFETCH=0 against =1 (losses, and the checkpoint after the last step: pdde-ckpt diff; the MoE GPT's
# dense parameters, split over dp and ep, gathered in two steps, each prefetched: rank 0's program), and with the
# regathering each rank's session holds less: its activation arena ("activations X MB (the memory plan's arenas", every
# rank; with pipeline stages no rank more, one less at least) and all it allocated (--metrics memory_bytes, rank 0). Run from the repository root.
. tests/script_util.sh zero3
if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: pdde-run is not built (no UCX)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
args=(--steps 4 --val-every 0 --sample-len 0 --threads 1)
# a rank waiting for a message its peer never sends fails in a minute, not at the default 300 s
export PDDE_COMM_TIMEOUT=60
# every step's loss as --metrics wrote it (%.9g)
losses() { python3 -c 'import json, sys; print(" ".join("%.9g" % r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r))' "$1" 2>/dev/null; }
close() { python3 -c 'import sys; a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
sys.exit(0 if len(a) == 4 and len(a) == len(b) and all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(a, b)) else 1)' "$1" "$2"; }
arenas() { grep -E '^\[[0-9]+\] gpt: data' "$1" | sed -E "s/^\[([0-9]+)\].*activations ([0-9.]+) MB \(the memory plan's arenas.*/\1 \2/" | sort -n | awk '{print $2}' | tr '\n' ' '; }
allocated() { python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["memory_bytes"])' "$1" 2>/dev/null; }

run_case() { # NAME RANKS ONE-PROCESS-FLAGS -- PLAN-FLAGS (smaller=some: not every rank's arena need shrink; two_axis=1:
             # parameters gathered over two mesh axes, whose second steps must be prefetched)
    local smaller=${smaller:-each}
    local name=$1 n=$2; shift 2
    local one=() plan=()
    while [ "$1" != -- ]; do one+=("$1"); shift; done
    shift; plan=("$@")
    "$build/gpt" "${one[@]}" "${args[@]}" --metrics "$tmp/$name.one.json" >"$tmp/$name.one.log" 2>&1
    local ref; ref=$(losses "$tmp/$name.one.json")
    check "$name: one process trains ($ref)" $([ -n "$ref" ] && echo 0 || echo 1)
    for on in 1 0 p; do # (1: the regathering's default, the prefetch and the early gradient reductions on even where the ranks
                        # take every core; 0: no regathering; p: no prefetch)
        local env=(env -u PDDE_ZERO3_REGATHER PDDE_ZERO3_PREFETCH=1 PDDE_OVERLAP_GRADIENTS=1) ckpt=()
        [ $on = 0 ] && env=(env -u PDDE_ZERO3_PREFETCH PDDE_ZERO3_REGATHER=0)
        [ $on = p ] && env=(env -u PDDE_ZERO3_REGATHER PDDE_ZERO3_PREFETCH=0)
        [ $on != 0 ] && ckpt=(--stop-after 4 --ckpt-dir "$tmp/$name.$on.ckpt")
        [ $on = 1 ] && ckpt+=(--show-program)
        "${env[@]}" timeout 240 "$build/pdde-run" -n "$n" "$build/gpt" "${one[@]}" "${plan[@]}" "${args[@]}" "${ckpt[@]}" \
            --metrics "$tmp/$name.$on.json" >"$tmp/$name.$on.log" 2>&1
        local rc=$?
        check "$name, variant $on: pdde-run -n $n exits 0 ($(tail -1 "$tmp/$name.$on.log"))" $rc
    done
    local l1 l0; l1=$(losses "$tmp/$name.1.json"); l0=$(losses "$tmp/$name.0.json")
    close "$l1" "$ref"
    check "$name: losses '$l1' equal one process's '$ref' (1e-6)" $?
    check "$name: PDDE_ZERO3_REGATHER=0 gives the same bits ('$l0')" $([ -n "$l1" ] && [ "$l1" = "$l0" ] && echo 0 || echo 1)
    local lp; lp=$(losses "$tmp/$name.p.json")
    check "$name: PDDE_ZERO3_PREFETCH=0 gives the same bits ('$lp')" $([ -n "$l1" ] && [ "$l1" = "$lp" ] && echo 0 || echo 1)
    local out; out=$("$build/pdde-ckpt" diff "$tmp/$name.1.ckpt" "$tmp/$name.p.ckpt" 2>&1)
    local rc=$?
    check "$name: the parameters and optimizer state after 4 steps the same bits with and without the prefetch ($(echo "$out" | tail -1))" $rc
    if [ -n "${two_axis:-}" ]; then # (a second step reads the wait of a prefetched first)
        local all pre
        all=$(grep -E '^\[0\] +(forward|backward) +[0-9]+ +allgather ' "$tmp/$name.1.log" | grep -c ', of comm_wait')
        pre=$(grep -E '^\[0\] +(forward|backward) +[0-9]+ +allgather ' "$tmp/$name.1.log" | grep -c 'prefetched, of comm_wait')
        check "$name: rank 0's second-axis gather steps after a prefetched first are prefetched too ($pre of $all)" $([ "$all" -gt 0 ] && [ "$pre" = "$all" ] && echo 0 || echo 1)
    fi
    local a1 a0 m1 m0; a1=$(arenas "$tmp/$name.1.log"); a0=$(arenas "$tmp/$name.0.log")
    m1=$(allocated "$tmp/$name.1.json"); m0=$(allocated "$tmp/$name.0.json")
    python3 -c 'import sys; a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]; m1, m0 = int(sys.argv[3]), int(sys.argv[4])
smaller = [x < y for x, y in zip(a, b)]
sys.exit(0 if len(a) == int(sys.argv[5]) and len(a) == len(b) and all(0 < x <= y for x, y in zip(a, b)) and
         (all(smaller) if sys.argv[6] == "each" else any(smaller)) and 0 < m1 < m0 else 1)' \
        "$a1" "$a0" "${m1:-0}" "${m0:-0}" "$n" "$smaller"
    check "$name: $smaller rank's activation arena smaller with the regathering, none larger ($a1 MB against $a0 MB), rank 0's allocation too ($m1 B against $m0 B)" $?
}

run_case dp2_micro2 2 -- --dp 2 --zero 3 --micro 2
# (pipeline stages: the tied embedding table, gathered on the first stage, crosses to the last once per
# micro-batch, not again for backward; the last stage's arena, at 0.1 MB, need not shrink)
smaller=some run_case dp2_pp2_micro2 4 -- --dp 2 --pp 2 --zero 3 --micro 2
# (interleaved: each chunk's backward is a pass of its own, and so is its gradients' bucket)
smaller=some run_case dp2_pp2_chunks2 4 -- --dp 2 --pp 2 --zero 3 --micro 2 --pp-chunks 2
two_axis=1 run_case moe_dp4_ep2 4 --moe-experts 8 -- --dp 4 --ep 2 --zero 3

# By default a session prefetches the gathers on host memory only where the ranks leave the machine a core
# (2 ranks of one thread: on 2 cores none, on more some)
cores=$(getconf _NPROCESSORS_ONLN)
env -u PDDE_ZERO3_PREFETCH timeout 120 "$build/pdde-run" -n 2 "$build/gpt" --dp 2 --zero 3 "${args[@]}" --steps 1 --show-program \
    >"$tmp/default.log" 2>&1
rc=$?
all=$(grep -cE '^\[0\] +(forward|backward) +[0-9]+ +allgather ' "$tmp/default.log")
pre=$(grep -E '^\[0\] +(forward|backward) +[0-9]+ +allgather ' "$tmp/default.log" | grep -c 'prefetched')
if [ "$cores" -le 2 ]; then want=none; ok=$([ $rc = 0 ] && [ "$all" -gt 0 ] && [ "$pre" = 0 ] && echo 0 || echo 1)
else want=some; ok=$([ $rc = 0 ] && [ "$pre" -gt 0 ] && echo 0 || echo 1); fi
check "the defaults, 2 ranks of one thread on $cores cores: $pre of rank 0's $all gathers prefetched (want $want; exit $rc)" $ok

run_equal() { # NAME RANKS ONE-PROCESS-FLAGS -- PLAN-FLAGS: the losses of one process (1e-6), early gradient reductions on
    local name=$1 n=$2; shift 2
    local one=() plan=()
    while [ "$1" != -- ]; do one+=("$1"); shift; done
    shift; plan=("$@")
    "$build/gpt" "${one[@]}" "${args[@]}" --metrics "$tmp/$name.one.json" >"$tmp/$name.one.log" 2>&1
    PDDE_OVERLAP_GRADIENTS=1 timeout 240 "$build/pdde-run" -n "$n" "$build/gpt" "${one[@]}" "${plan[@]}" "${args[@]}" --metrics "$tmp/$name.json" \
        --show-program >"$tmp/$name.log" 2>&1
    local rc=$?
    check "$name: pdde-run -n $n exits 0 ($(tail -1 "$tmp/$name.log"))" $rc
    local ref l; ref=$(losses "$tmp/$name.one.json"); l=$(losses "$tmp/$name.json")
    close "$l" "$ref"
    check "$name: losses '$l' equal one process's '$ref' (1e-6)" $?
    local early; early=$(overlapped "$tmp/$name.log")
    check "$name: the ranks' programs overlap gradient reductions with backward ($early buckets started early or completed later)" $([ "$early" -gt 0 ] && echo 0 || echo 1)
}
# buckets in backward of the ranks' programs (--show-program) started early, or whose members do not come right
# after them (a micro-batch's bucket completed one later)
overlapped() { awk '/^\[[0-9]+\] +backward/ { r = $1; if (r in want) { if (index($0, "out of " want[r] " ") == 0) n++; delete want[r] }
                                        if ($0 ~ /a bucket of/ && $0 !~ /started early/) want[r] = $5 }
                    /^\[[0-9]+\] +backward.*started early/ { n++ } END { print n + 0 }' "$1"; }
# Interleaved stages: each chunk's backward is a pass of its own, a gradient bucket takes the gradients
# of one chunk only, and one completed later (ZeRO-2's) completes before the next chunk's nodes; ZeRO-1's
# buckets start early, in the last micro-batch's backward of their chunk
run_equal zero2_dp2_pp2_chunks2 4 --layers 4 --width 64 -- --dp 2 --pp 2 --zero 2 --micro 2 --pp-chunks 2
run_equal zero1_dp2_pp2_chunks2 4 --layers 4 --width 64 -- --dp 2 --pp 2 --zero 1 --micro 2 --pp-chunks 2
finish
