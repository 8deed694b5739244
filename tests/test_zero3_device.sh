#!/usr/bin/env bash
# ZeRO-3 with every rank's blocks on a device (`--blocks-on opencl`: PoCL here, the ranks share it; the
# embedding and the head on the CPU, whose backward is deterministic where the device's float atomics
# are not): the parameter gathers into device memory start while the layer before computes (half of
# rank 0's at least print `prefetched` in its program), the same bits as PDDE_ZERO3_PREFETCH=0 (the
# losses, and the checkpoint after the last step by pdde-ckpt diff), and the losses of one process on
# the device within 1e-6 relative. `gpt --dp 2 --zero 3 --micro 2` (gathers along dim 0), the same
# with 2 pipeline stages, and the MoE GPT `--moe-experts 4 --dp 4 --ep 2 --zero 3` (experts along dim 1; its
# dense parameters, split over dp and ep, gathered in two steps, the second prefetched too where the first is).
# Run from the repository root.
. tests/script_util.sh zero3dev
if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: pdde-run is not built (no UCX)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
backend=${PDDE_TEST_DEVICE:-opencl} # (a GPU run: PDDE_TEST_DEVICE=cuda)
if ! "$build/pdde-info" 2>/dev/null | grep -Eq "^ +$backend +available"; then
    if [ "$backend" = opencl ]; then echo "SKIP opencl: no OpenCL device (PoCL in CI)"; else echo "SKIP $backend: no $backend device (PDDE_TEST_DEVICE)"; fi
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
# the prefetch as by default (OpenCL's); other backends' device gathers only with PDDE_ZERO3_PREFETCH=1
on=(env -u PDDE_ZERO3_REGATHER -u PDDE_ZERO3_PREFETCH)
[ "$backend" != opencl ] && on=(env -u PDDE_ZERO3_REGATHER PDDE_ZERO3_PREFETCH=1)
dev=(--blocks-on "$backend" --steps 3 --val-every 0 --sample-len 0 --threads 1)
export PDDE_COMM_TIMEOUT=60 # (a rank waiting for a message its peer never sends fails in a minute)
losses() { python3 -c 'import json, sys; print(" ".join("%.9g" % r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r))' "$1" 2>/dev/null; }
close() { python3 -c 'import sys; a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
sys.exit(0 if len(a) == 3 and len(a) == len(b) and all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(a, b)) else 1)' "$1" "$2"; }

run_case() { # NAME RANKS ONE-PROCESS-FLAGS -- PLAN-FLAGS (two_axis=1: parameters gathered over two mesh axes)
    local name=$1 n=$2; shift 2
    local one=() plan=()
    while [ "$1" != -- ]; do one+=("$1"); shift; done
    shift; plan=("$@")
    "$build/gpt" "${one[@]}" "${dev[@]}" --metrics "$tmp/$name.one.json" >"$tmp/$name.one.log" 2>&1
    local ref; ref=$(losses "$tmp/$name.one.json")
    check "$name: one process trains on the device ($ref)" $([ -n "$ref" ] && echo 0 || echo 1)
    for pf in 1 0; do
        local show=() env=("${on[@]}")
        [ $pf = 1 ] && show=(--show-program)
        [ $pf = 0 ] && env=(env -u PDDE_ZERO3_REGATHER PDDE_ZERO3_PREFETCH=0)
        "${env[@]}" timeout 240 "$build/pdde-run" -n "$n" "$build/gpt" "${one[@]}" "${plan[@]}" \
            "${dev[@]}" "${show[@]}" --stop-after 3 --ckpt-dir "$tmp/$name.$pf.ckpt" --metrics "$tmp/$name.$pf.json" >"$tmp/$name.$pf.log" 2>&1
        local rc=$?
        check "$name, prefetch $pf: pdde-run -n $n exits 0 ($(tail -1 "$tmp/$name.$pf.log"))" $rc
    done
    # rank 0's gathers of parameters on the device (not device 0, the CPU), and those prefetched
    local all pre
    all=$(grep -E '^\[0\] +(forward|backward) +[1-9][0-9]* +allgather ' "$tmp/$name.1.log" | grep -c ', of ')
    pre=$(grep -E '^\[0\] +(forward|backward) +[1-9][0-9]* +allgather ' "$tmp/$name.1.log" | grep -c 'prefetched')
    check "$name: rank 0's gathers on the device are prefetched ($pre of $all; half at least)" $([ "$all" -gt 0 ] && [ $((2 * pre)) -ge "$all" ] && echo 0 || echo 1)
    if [ -n "${two_axis:-}" ]; then # (a second step reads the wait of a prefetched first)
        all=$(grep -E '^\[0\] +(forward|backward) +[1-9][0-9]* +allgather ' "$tmp/$name.1.log" | grep -c ', of comm_wait')
        pre=$(grep -E '^\[0\] +(forward|backward) +[1-9][0-9]* +allgather ' "$tmp/$name.1.log" | grep -c 'prefetched, of comm_wait')
        check "$name: rank 0's second-axis gather steps on the device after a prefetched first are prefetched too ($pre of $all)" $([ "$all" -gt 0 ] && [ "$pre" = "$all" ] && echo 0 || echo 1)
    fi
    local l1 l0; l1=$(losses "$tmp/$name.1.json"); l0=$(losses "$tmp/$name.0.json")
    close "$l1" "$ref"
    check "$name: losses '$l1' equal one process's '$ref' (1e-6)" $?
    close "$l0" "$ref"
    check "$name: losses '$l0' without the prefetch equal one process's too" $?
    check "$name: PDDE_ZERO3_PREFETCH=0 gives the same bits ('$l0')" $([ -n "$l1" ] && [ "$l1" = "$l0" ] && echo 0 || echo 1)
    local out; out=$("$build/pdde-ckpt" diff "$tmp/$name.1.ckpt" "$tmp/$name.0.ckpt" 2>&1)
    local rc=$?
    check "$name: the parameters and optimizer state after 3 steps the same bits with and without the prefetch ($(echo "$out" | tail -1))" $rc
}

run_case dp2_micro2 2 --layers 2 -- --dp 2 --zero 3 --micro 2
# (1F1B: a stage's forward and backward passes of different micro-batches take turns)
run_case dp2_pp2_micro2 4 --layers 4 --width 64 -- --dp 2 --pp 2 --zero 3 --micro 2
two_axis=1 run_case moe_dp4_ep2 4 --layers 2 --moe-experts 4 --width 64 --batch 4 -- --dp 4 --ep 2 --zero 3
finish
