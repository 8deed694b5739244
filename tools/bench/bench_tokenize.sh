#!/usr/bin/env bash
# bench-tokenize: text to ids with a Hugging Face tokenizer.json on one core: pdde's build/tokenize
# (examples/hf_tokenizer.h) against transformers.js (tools/bench/peer_tokenize.mjs, the same tokenizer.json
# and text in the same run; needs node and TRANSFORMERS_DIR, see there). The text: tests/data/tokenize's
# text, README.md and examples/*.c repeated to about MB megabytes, one document. Each side's median of
# REPEATS runs (pdde's includes reading tokenizer.json and writing the token file); the ids must be equal.
#   RESULT tokenize_<name> peer_ratio=<pdde MB/s over transformers.js's> mb_s=<pdde's> peer_mb_s=... same_ids=1|0
#   bash tools/bench/bench_tokenize.sh [build] [TOKENIZER_JSON ...]   # default: the fixtures of tests/data/tokenize
set -euo pipefail
build=${1:-build}
shift || true
tokenizers=("$@")
[ ${#tokenizers[@]} -gt 0 ] || tokenizers=(tests/data/tokenize/gpt2.json tests/data/tokenize/llama3.json tests/data/tokenize/llama2.json)
MB=${MB:-8} REPEATS=${REPEATS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
while [ "$(stat -c %s "$work/text.txt" 2>/dev/null || echo 0)" -lt $((MB * 1000000)) ]; do
    cat tests/data/tokenize/text.txt README.md examples/*.c >>"$work/text.txt"
done
bytes=$(stat -c %s "$work/text.txt")
for tj in "${tokenizers[@]}"; do
    name=$(basename "$tj" .json) # (a model directory's tokenizer.json: the directory's name)
    [ "$name" != tokenizer ] || name=$(basename "$(dirname "$tj")")
    secs=()
    for r in $(seq "$REPEATS"); do
        start=$(date +%s.%N)
        taskset -c 0 "$build/tokenize" --tokenizer "$tj" --out "$work/ids.tok" --doc-start none "$work/text.txt" >/dev/null
        secs+=("$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { print a - b }')")
    done
    mine=$(printf '%s\n' "${secs[@]}" | sort -n | sed -n "$(( (REPEATS + 1) / 2 ))p")
    python3 -c "import struct,sys; raw=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',raw[8:16])[0]; print(' '.join(map(str, struct.unpack('<%di' % n, raw[16:]))))" \
        "$work/ids.tok" >"$work/mine.ids"
    if peer=$(taskset -c 0 node tools/bench/peer_tokenize.mjs "$tj" "$work/text.txt" "$work/peer.ids" "$REPEATS" 2>&1) && [[ $peer == seconds=* ]]; then
        theirs=$(sed -n 's/^seconds=\([0-9.]*\).*/\1/p' <<<"$peer")
        same=$(cmp -s "$work/mine.ids" "$work/peer.ids" && echo 1 || echo 0)
        echo "$name: pdde $mine s, transformers.js $theirs s (encode only), $(wc -w <"$work/mine.ids") ids, equal: $same"
        awk -v n="$name" -v b="$bytes" -v m="$mine" -v t="$theirs" -v s="$same" 'BEGIN {
            printf "RESULT tokenize_%s peer_ratio=%.2f mb_s=%.1f peer_mb_s=%.1f same_ids=%d mb=%.1f\n", n, t / m, b / m / 1e6, b / t / 1e6, s, b / 1e6 }'
    else
        echo "$name: pdde $mine s; $peer"
        awk -v n="$name" -v b="$bytes" -v m="$mine" 'BEGIN { printf "RESULT tokenize_%s status=no_peer mb_s=%.1f mb=%.1f\n", n, b / m / 1e6, b / 1e6 }'
    fi
done
