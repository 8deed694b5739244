#!/usr/bin/env bash
# cuda_switches: switches that are off by default, each checked on the CUDA device and timed against the defaults in
# one run: GPT-2 124M training steps (bench_cuda --gpt: B 8, T 1024, AdamW), the defaults and each switch in turn,
# then again in the reverse order (so that a drift of the GPU's clocks or temperature does not favour the runs that
# came first); each configuration's time is the mean of its two runs, and the spread of the two default runs says
# what difference is noise.
#
#   CHECKS="ln2:PDDE_CUDA_LN2=1:layernorm_back ce1:PDDE_CUDA_CE1=1:cross_entropy_fused" \
#   SWITCHES="ln2:PDDE_CUDA_LN2=1 ce1:PDDE_CUDA_CE1=1 both:PDDE_CUDA_LN2=1,PDDE_CUDA_CE1=1" \
#       bash tools/bench/cuda_switches.sh [BUILD]
#
# CHECKS: NAME:VAR=V[,VAR=V...]:OP (OP empty: the whole suite) runs `test_backend_ops --backend cuda --op OP` under
# those variables. SWITCHES: NAME:VAR=V[,VAR=V...]; DTYPE=f32 among them times an f32 step instead of bf16 (the
# defaults in that dtype are then timed too, as default_f32). PASSES=1 runs the order once and the defaults once more
# at its end (2 by default: the order, then its reverse). Each command is time-boxed (CAP seconds, default 75).
# Prints a RESULT line per test and run, and last `RESULT gpu_switches default_ms=.. NAME_ms=.. NAME_vs_default=..`
# (above 1: the switch is faster) ... failed=N.
set -u
build=${1:-build}
cap=${CAP:-75}
log=$(mktemp -d)
tests=gpu_switch_test runs=gpu_switch_run summary=gpu_switches
source "$(dirname "$0")/cuda_bench_util.sh"
cuda_bench_prepare "$build/test_backend_ops" "$build/bench_cuda"

for spec in ${CHECKS:-}; do
    IFS=: read -r name vars op <<<"$spec"
    IFS=, read -r -a env <<<"$vars"
    check "$name" "${env[@]}" "$build/test_backend_ops" --backend cuda ${op:+--op "$op"}
done

# NAME ENV...: one timed step run (DTYPE=f32 in ENV: an f32 step); its ms a step appended to ms[NAME]
declare -A ms dtype_of
step_run() {
    local name=$1 dt=bf16 e=()
    shift
    for v in "$@"; do
        if [ "$v" = DTYPE=f32 ]; then dt=f32; else e+=("$v"); fi
    done
    dtype_of[$name]=$dt
    timeout "$cap" env X=0 "${e[@]}" "$build/bench_cuda" --gpt --dtype "$dt" >"$log/gpt_$name.out" 2>&1
    local line
    line=$(grep '^GPT ' "$log/gpt_$name.out" | tail -1)
    echo "RESULT $runs name=$name ${line#GPT }"
    [ -n "$line" ] || { failed=$((failed + 1)); tail -5 "$log/gpt_$name.out"; return; }
    ms[$name]="${ms[$name]:-} $(field "$log/gpt_$name.out" ms)"
    grep "pdde: cuda:" "$log/gpt_$name.out" | grep -v "candidates, fastest" | sort | uniq -c | head -3
}
names=() specs=() f32=0
for spec in ${SWITCHES:-}; do
    names+=("${spec%%:*}") specs+=("${spec#*:}")
    [[ ",${spec#*:}," == *",DTYPE=f32,"* ]] && f32=1
done
order=() # (the defaults, each switch, the defaults in f32 where one is f32; then the reverse)
order+=(-1)
for i in "${!names[@]}"; do order+=("$i"); done
[ $f32 = 1 ] && order+=(-2)
passes=${PASSES:-2}
[ "$passes" = 1 ] && order+=(-1)
for pass in $(seq "$passes"); do
    runs_now=("${order[@]}")
    [ "$pass" = 2 ] && mapfile -t runs_now < <(printf '%s\n' "${order[@]}" | tac)
    for i in "${runs_now[@]}"; do
        case $i in
            -1) step_run default ;;
            -2) step_run default_f32 DTYPE=f32 ;;
            *) IFS=, read -r -a env <<<"${specs[$i]}"; step_run "${names[$i]}" "${env[@]}" ;;
        esac
    done
done

mean() { echo "$1" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; if (NF) printf "%.2f", s / NF; else printf "na" }'; }
out="RESULT $summary default_ms=$(mean "${ms[default]:-}") default_runs=\"${ms[default]# }\""
[ $f32 = 1 ] && out+=" default_f32_ms=$(mean "${ms[default_f32]:-}")"
for n in "${names[@]}"; do
    base=${ms[default]:-}
    [ "${dtype_of[$n]:-bf16}" = f32 ] && base=${ms[default_f32]:-}
    m=$(mean "${ms[$n]:-}")
    out+=" ${n}_ms=$m ${n}_vs_default=$(ratio "$(mean "$base")" "$m")"
done
echo "$out failed=$failed"
rm -rf "$log"
[ $failed = 0 ]
