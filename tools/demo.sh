#!/usr/bin/env bash
# make demo: install what is missing, build, train a small GPT on this machine's CPU with a fortunes
# corpus, show progress and a sample. Extra flags for examples/gpt go in DEMO_ARGS.
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
echo
echo "== pdde demo: a GPT-2-style model learns to write like /usr/share/games/fortunes/songs-poems =="
./build/pdde-info 2>/dev/null || true
# shellcheck disable=SC2086
./build/gpt --steps 600 --ckpt-dir build/demo-ckpt ${DEMO_ARGS:-}
