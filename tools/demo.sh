#!/usr/bin/env bash
# make demo: install what is missing, build, measure this machine (once), let the planner choose how
# to train a small GPT on it, and train with that plan: progress, validation loss and a sample.
# Extra flags for examples/gpt go in DEMO_ARGS; DEMO_RANKS overrides the number of ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! bash tools/install-deps.sh --check >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] || command -v sudo >/dev/null; then
        bash tools/install-deps.sh
    else
        echo "demo: some packages are missing; run 'sudo bash tools/install-deps.sh' first" >&2
        exit 1
    fi
fi
make -s all
cores=$(nproc)
ranks=${DEMO_RANKS:-$(( cores >= 2 ? 2 : 1 ))}
threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
cluster=build/cluster-${ranks}x${threads}.json
echo
echo "== pdde demo: a GPT-2-style model learns to write like /usr/share/games/fortunes/songs-poems =="
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
"${launcher[@]}" ./build/gpt --plan auto --cluster "$cluster" --steps 600 --ckpt-dir build/demo-ckpt ${DEMO_ARGS:-}
