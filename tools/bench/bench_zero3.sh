#!/usr/bin/env bash
# bench-zero3: what ZeRO-3's regathering (a parameter gathered for forward, freed, gathered again for
# backward) costs and saves against keeping the forward copy to backward (PDDE_ZERO3_REGATHER=0, the
# peer here), and what its prefetch (each layer's gathers started while the layer before it computes)
# gains against blocking gathers (PDDE_ZERO3_PREFETCH=0). gpt under pdde-run: the default model on 2
# ranks (--dp 2 --zero 3) and its MoE form on 4 (--moe-experts 8 --dp 4 --ep 2 --zero 3). Per
# configuration: rank 0's activation arena and all it allocated (the session's memory plan: the same
# every run), and the median step time of REPS alternating triples (steps 2..STEPS of each run), with
# the ratios regathering / peer and prefetch / blocking gathers. BENCH_ARGS adds gpt flags (a larger
# model: --layers 8 --width 256).
set -euo pipefail
build=${1:-build}
reps=${REPS:-3} steps=${STEPS:-8}
dir=$(mktemp -d /tmp/pdde-bench-zero3.XXXXXX)
trap 'rm -rf "$dir"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
run() { # NAME RANKS ON FLAGS... -> appends the run's step times (steps 2..) to $dir/NAME.ON.steps (ON: 1 the defaults,
        # 0 no regathering, p no prefetch)
    local name=$1 n=$2 on=$3; shift 3
    local re=1 pf=1
    [ "$on" = 0 ] && re=0
    [ "$on" = p ] && pf=0
    PDDE_ZERO3_REGATHER=$re PDDE_ZERO3_PREFETCH=$pf "$build/pdde-run" -n "$n" "$build/gpt" "$@" ${BENCH_ARGS:-} --steps "$steps" --val-every 0 \
        --sample-len 0 --threads 1 --metrics "$dir/m.json" >"$dir/$name.$on.log" 2>&1
    sed -n 's/.*"step":\([0-9]*\),"loss".*"step_s":\([0-9.]*\).*/\1 \2/p' "$dir/m.json" | awk '$1 > 1 {print $2}' >>"$dir/$name.$on.steps"
    sed -n "s/^\[0\] gpt: data.*activations \([0-9.]*\) MB (the memory plan's arenas.*/\1/p" "$dir/$name.$on.log" >"$dir/$name.$on.arena"
    sed -n 's/.*"step":1,"loss".*"memory_bytes":\([0-9]*\).*/\1/p' "$dir/m.json" >"$dir/$name.$on.alloc"
}
echo "bench-zero3: $reps alternating triples of $steps steps${BENCH_ARGS:+ ($BENCH_ARGS)}; load: $(uptime | sed 's/.*load/load/')"
result="RESULT zero3"
for cfg in "dense 2 --dp 2 --zero 3" "moe 4 --moe-experts 8 --dp 4 --ep 2 --zero 3"; do
    set -- $cfg
    name=$1 n=$2; shift 2
    for ((i = 0; i < reps; i++)); do run "$name" "$n" 1 "$@"; run "$name" "$n" 0 "$@"; run "$name" "$n" p "$@"; done
    s1=$(median <"$dir/$name.1.steps"); s0=$(median <"$dir/$name.0.steps"); sp=$(median <"$dir/$name.p.steps")
    ap=$(cat "$dir/$name.p.arena")
    pratio=$(awk -v a="$s1" -v b="$sp" 'BEGIN { printf "%.3f", a / b }')
    a1=$(cat "$dir/$name.1.arena"); a0=$(cat "$dir/$name.0.arena")
    m1=$(cat "$dir/$name.1.alloc"); m0=$(cat "$dir/$name.0.alloc")
    ratio=$(awk -v a="$s1" -v b="$s0" 'BEGIN { printf "%.3f", a / b }')
    printf '%-6s %d ranks: arena %s MB (regather) vs %s MB (kept), allocated %.1f vs %.1f MB, step %.4f vs %.4f s (median): ratio %s\n' \
        "$name" "$n" "$a1" "$a0" "$(awk -v m="$m1" 'BEGIN{print m / 1e6}')" "$(awk -v m="$m0" 'BEGIN{print m / 1e6}')" "$s1" "$s0" "$ratio"
    printf '%-6s %d ranks: prefetch: arena %s MB vs %s MB (blocking gathers), step %.4f vs %.4f s (median): ratio %s\n' \
        "$name" "$n" "$a1" "$ap" "$s1" "$sp" "$pratio"
    result+=" ${name}_arena_mb=$a1 ${name}_arena_kept_mb=$a0 ${name}_step_ratio=$ratio ${name}_arena_blocking_mb=$ap ${name}_prefetch_ratio=$pratio"
done
echo "$result"
