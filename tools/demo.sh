#!/usr/bin/env bash
# make demo: install what is missing, build, measure this machine (once), let the planner choose how
# to train a small GPT on it, and train with that plan: progress, validation loss and a sample.
# Extra flags for examples/gpt go in DEMO_ARGS; DEMO_RANKS overrides the number of ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! bash tools/install-deps.sh --check >/dev/null 2>&1; then
    # a machine without Debian's packages or network (a GPU node) builds with what it has
    if { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null; } && bash tools/install-deps.sh; then :
    else echo "demo: some packages are missing and could not be installed: building with what is here" >&2; fi
fi
make -s all
cores=$(nproc)
# a rank per GPU where there are GPUs (and a launcher), else 2 CPU ranks where there are 2 cores
gpus=$(./build/pdde-info 2>/dev/null | awk '$1 == "cuda" && $2 == "available," {print $3}')
if [ -n "${DEMO_RANKS:-}" ]; then ranks=$DEMO_RANKS
elif [ "${gpus:-0}" -ge 1 ]; then ranks=$gpus
else ranks=$(( cores >= 2 ? 2 : 1 )); fi
[ -x build/pdde-run ] || ranks=1
threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
data=/usr/share/games/fortunes/songs-poems
if [ ! -s "$data" ]; then # (no fortunes package): pdde's own documentation
    data=build/demo-text.txt
    cat README.md ./*/README.md > "$data"
fi
cluster=build/cluster-${ranks}x${threads}.json
echo
echo "== pdde demo: a GPT-2-style model learns to write like $data =="
./build/pdde-info 2>/dev/null || true
if [ ! -s "$cluster" ]; then
    echo
    echo "== measuring this machine for the cost model ($threads thread(s) per rank, once: $cluster) =="
    PDDE_NUM_THREADS=$threads ./build/pdde-bench --quick -o "$cluster"
fi
echo
echo "== the planner's options for $ranks rank(s) of $threads thread(s) on this machine =="
./build/pdde-plan --auto --cluster "$cluster" --ranks "$ranks" --top 5
echo
echo "== training with the planner's choice (each rank says which device it took: PDDE_DEVICE=${PDDE_DEVICE:-auto}) =="
launcher=()
[ "$ranks" -gt 1 ] && launcher=(./build/pdde-run -n "$ranks")
# shellcheck disable=SC2086
"${launcher[@]}" ./build/gpt --plan auto --cluster "$cluster" --data "$data" --steps 600 --ckpt-dir build/demo-ckpt ${DEMO_ARGS:-}
