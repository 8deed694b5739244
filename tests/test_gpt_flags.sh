#!/usr/bin/env bash
# gpt's flag checks name the flag that breaks a rule, its value and what was expected (the rank count
# first under a launcher); a --data file whose validation split is not longer than --ctx is refused
# with the size it needs; after an elastic re-form the trained-steps line counts the job's steps; under
# pipeline stages the printed sample is the one process's (same seed and steps). Run from the
# repository root.
. tests/script_util.sh gpt_flags
gpt=(--val-every 0 --threads 1 --layers 2 --width 64 --heads 8 --ctx 32 --seed 7)

# each line "flags|message" of stdin: the command (its name for the checks first, then its words) with
# those flags exits non-zero printing the message, no step trained
refused_each() {
    local name=$1 flags message rc ok
    shift
    while IFS='|' read -r flags message; do
        "$@" $flags >"$tmp/bad.log" 2>&1
        rc=$?
        [ $rc != 0 ] && grep -qF -- "$message" "$tmp/bad.log" && ! grep -q 'step *1/' "$tmp/bad.log"
        ok=$?
        check "$name $flags is refused: '$message' (rc $rc: $(grep -m1 'gpt:' "$tmp/bad.log" | cut -c1-160))" $ok
    done
}

# each bad value on one process
refused_each gpt "$build/gpt" "${gpt[@]}" --steps 2 --sample-len 0 <<'BAD'
--heads 6|--width 64 is not divisible by --heads 6
--batch 0|--batch must be >= 1, got 0
--layers 0|--layers must be >= 1, got 0
--ctx 1|--ctx must be >= 2
--window -1|--window wants a non-negative integer, got '-1'
--vocab 100|--vocab must be >= 256
--micro 3|--dp 1 x --micro 3 = 3 must divide --batch 8
--pp 5|--pp 5: at most --layers + 2 = 4 pipeline stages
--save-dtype f8 --save-hf x|--save-dtype takes f32, bf16 or f16, got 'f8'
--save-dtype bf16|--save-dtype bfloat16 is the dtype --save-hf and --save-peft write: give one of them
BAD

# a small file: its last 10% must be longer than --ctx; the message says so and the size it needs
head -c 300 /usr/share/games/fortunes/songs-poems >"$tmp/t300.txt" 2>/dev/null || awk 'BEGIN { for (i = 0; i < 300; i++) printf "a" }' >"$tmp/t300.txt"
"$build/gpt" "${gpt[@]}" --steps 2 --sample-len 0 --data "$tmp/t300.txt" >"$tmp/small.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -qF "the validation split (30 tokens), must be longer than --ctx 32: it needs at least 321 tokens" "$tmp/small.log"
ok=$?
check "a 300-byte --data file under --ctx 32 is refused with the rule and the 321 tokens it needs (rc $rc: $(head -1 "$tmp/small.log" | cut -c1-160))" $ok
head -c 321 /usr/share/games/fortunes/songs-poems >"$tmp/t321.txt" 2>/dev/null
"$build/gpt" "${gpt[@]}" --steps 1 --sample-len 0 --data "$tmp/t321.txt" >"$tmp/small.log" 2>&1
rc=$?
check "a 321-byte --data file under --ctx 32 trains (rc $rc: $(tail -1 "$tmp/small.log" | cut -c1-100))" $rc

# an llm.c token shard (GPT-2's u16 ids: here the bytes of a text + 256) trains as ids with --vocab
# above them, its sample printed as ids; --vocab 256 is refused naming the id and the flag; --val-data
# validates on its own file
python3 - "$tmp" <<'PY'
import struct, sys
text = open("/usr/share/games/fortunes/songs-poems", "rb").read()[:20000] if __import__("os").path.exists("/usr/share/games/fortunes/songs-poems") else bytes(range(256)) * 80
for name, part in (("train.bin", text[:18000]), ("val.bin", text[18000:]), ("part_0.bin", text[:9000]), ("part_1.bin", text[9000:18000])):
    ids = [b + 256 for b in part]
    with open(sys.argv[1] + "/" + name, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack("<%dH" % len(ids), *ids))
# llm.c's tokenizer file (version 2): ids 0..255 are "?", id 256 + b the byte b
with open(sys.argv[1] + "/tok.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240328, 2, 512, 0, *([0] * 252)))
    for i in range(512):
        f.write(bytes([1]) + (b"?" if i < 256 else bytes([i - 256])))
PY
"$build/gpt" "${gpt[@]}" --steps 2 --sample-len 0 --data "$tmp/train.bin" >"$tmp/v256.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -qE -- "--data $tmp/train.bin holds token id 3[0-9]{2}, past --vocab 256" "$tmp/v256.log"
ok=$?
check "an llm.c shard of ids up to 511 under --vocab 256 is refused naming the id and --vocab (rc $rc: $(head -1 "$tmp/v256.log" | cut -c1-140))" $ok
"$build/gpt" "${gpt[@]}" --vocab 512 --steps 30 --val-every 30 --sample-len 20 --data "$tmp/train.bin" --val-data "$tmp/val.bin" >"$tmp/ids.log" 2>&1
rc=$?
first=$(grep -m1 -o 'loss [0-9.]*' "$tmp/ids.log" | cut -d' ' -f2) val=$(grep -o 'validation loss [0-9.]*' "$tmp/ids.log" | tail -1 | cut -d' ' -f3)
sample=$(sed -n '/^---- sample (token ids/{n;p;}' "$tmp/ids.log")
awk -v a="$first" -v b="$val" 'BEGIN { exit !(a > 5.5 && b < a - 1) }' && [ $rc = 0 ] && [ "$(echo "$sample" | wc -w)" = 20 ] &&
    echo "$sample" | tr ' ' '\n' | awk '$1 >= 0 && $1 < 512 { n++ } $1 >= 256 { seen++ } END { exit !(n == 20 && seen >= 10) }'
ok=$?
check "an llm.c shard trains under --vocab 512 (loss $first, validation on --val-data $val) and samples 20 ids, most of the file's ($sample; rc $rc)" $ok

# --tokenizer prints the same sample as text: each id's bytes (here the id - 256 as a byte)
"$build/gpt" "${gpt[@]}" --vocab 512 --steps 30 --val-every 30 --sample-len 20 --data "$tmp/train.bin" --val-data "$tmp/val.bin" \
    --tokenizer "$tmp/tok.bin" >"$tmp/text.log" 2>&1
rc=$?
decoded=$(echo "$sample" | python3 -c 'import sys; sys.stdout.write("".join(chr(int(t) - 256) if int(t) >= 256 else "?" for t in sys.stdin.read().split()))')
printed=$(sed -n '/^---- sample (after token/,/^----------------$/p' "$tmp/text.log" | sed '1d;$d')
[ $rc = 0 ] && [ -n "$decoded" ] && [ "$printed" = "$decoded" ]
ok=$?
check "--tokenizer decodes the sample's ids as text ('$(echo "$printed" | head -1 | cut -c1-40)' for '$(echo "$decoded" | head -1 | cut -c1-40)'; rc $rc)" $ok
# --prompt: a token file's sample goes on from the ids given (decoded first: "HOL"), and a text's from
# the prompt's bytes; an id past --vocab is refused before training
"$build/gpt" "${gpt[@]}" --vocab 512 --steps 30 --val-every 30 --sample-len 10 --data "$tmp/train.bin" --tokenizer "$tmp/tok.bin" \
    --prompt 328,335,332 --temperature 0 >"$tmp/prompt.log" 2>&1
rc=$?
printed=$(sed -n '/^---- sample (after the prompt.s 3, decoded/{n;p;}' "$tmp/prompt.log")
"$build/gpt" "${gpt[@]}" --steps 30 --sample-len 20 --prompt "ROMEO: " --temperature 0 >"$tmp/prompt2.log" 2>&1
rc2=$?
"$build/gpt" "${gpt[@]}" --steps 30 --sample-len 20 --temperature 0 >"$tmp/prompt3.log" 2>&1
text_of() { sed -n '/^---- sample ----/,/^----------------$/p' "$1" | sed '1d;$d'; }
"$build/gpt" "${gpt[@]}" --vocab 512 --steps 2 --data "$tmp/train.bin" --prompt "300,600" >"$tmp/prompt4.log" 2>&1
rc4=$?
[ $rc = 0 ] && [ "${printed:0:3}" = HOL ] && [ ${#printed} -ge 10 ] && [ $rc2 = 0 ] && [ "$(text_of "$tmp/prompt2.log" | head -c 7)" = "ROMEO: " ] &&
    [ "$(text_of "$tmp/prompt2.log" | tail -c +8)" != "$(text_of "$tmp/prompt3.log")" ] && [ $rc4 = 2 ] &&
    grep -qF "give ids below --vocab 512 separated by commas ('464,2068'), got '600'" "$tmp/prompt4.log" && ! grep -q 'step *1/' "$tmp/prompt4.log"
ok=$?
check "--prompt: ids go on as 'HOL..' ('$printed'), text after 'ROMEO: ' ('$(text_of "$tmp/prompt2.log" | head -1 | cut -c1-30)'), id 600 refused (rc $rc/$rc2/$rc4)" $ok
head -c 2000 "$tmp/tok.bin" >"$tmp/cut.bin"
"$build/gpt" "${gpt[@]}" --vocab 512 --steps 2 --data "$tmp/train.bin" --tokenizer "$tmp/cut.bin" >"$tmp/cut.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -qF -- "--tokenizer $tmp/cut.bin: token " "$tmp/cut.log" && grep -qF "its bytes end past the end of the file" "$tmp/cut.log" && ! grep -q 'step *1/' "$tmp/cut.log"
ok=$?
check "a cut --tokenizer file is refused before training, naming the token (rc $rc: $(head -1 "$tmp/cut.log" | cut -c1-120))" $ok
"$build/gpt" "${gpt[@]}" --vocab 512 --steps 2 --sample-len 0 --data "$tmp/part_*.bin" --val-data "$tmp/val.bin" >"$tmp/glob.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -qF "gpt: data $tmp/part_*.bin (18000 training tokens)" "$tmp/glob.log"
ok=$?
check "--data 'part_*.bin' trains on both shards' 18000 tokens (rc $rc: $(grep -m1 'gpt: data' "$tmp/glob.log" | cut -c1-100))" $ok

if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: pdde-run is not built (pdde without UCX): the launcher's cases not run"
    finish; exit
fi
# under a launcher of 2 ranks: a plan for another rank count is said as such, whatever else it breaks
refused_each "pdde-run -n 2 gpt" timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "${gpt[@]}" --steps 2 --sample-len 0 <<'BAD'
--plan dp=3|--plan 'dp=3': dp 3 x tp 1 x pp 1 = 3 ranks, but the launcher started 2
--dp 3|--dp 3 x --tp 1 x --pp 1 = 3 ranks, but the launcher started 2
--pp 5|--dp 1 x --tp 1 x --pp 5 = 5 ranks, but the launcher started 2
--pp 2 --micro 3|--dp 1 x --micro 3 = 3 must divide --batch 8
BAD

# after an elastic re-form (rank 1 leaving at step 5 on purpose) the last line counts the job's steps
PDDE_BACKENDS=cpu PDDE_ELASTIC_LEAVE=1@5 timeout 180 "$build/pdde-run" -n 2 --elastic --min 1 --peer-timeout 10 --grace 1 \
    "$build/gpt" "${gpt[@]}" --steps 12 --sample-len 0 >"$tmp/elastic.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "rank 1 left at step 5" "$tmp/elastic.log" && grep -q "gpt: trained 12 steps in .*, 7 of them since the re-form at step 5" "$tmp/elastic.log"
ok=$?
check "a 12-step elastic job that lost a rank at step 5 says it trained 12 steps, 7 since the re-form (rc $rc: $(grep -m1 'trained' "$tmp/elastic.log"))" $ok

# the sample under pipeline stages: the first stage feeds in what the last stage chose
sample_of() { sed -n 's/^\(\[[0-9]*\] \)\{0,1\}//; /^---- sample ----$/,/^----------------$/p' "$1"; }
"$build/gpt" "${gpt[@]}" --steps 20 --sample-len 80 >"$tmp/one.log" 2>&1
rc=$?
check "one process: 20 steps and a sample ($(tail -1 "$tmp/one.log" | cut -c1-60))" $rc
for plan in "--pp 2" "--plan dp=1,pp=2,mb=2"; do
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${gpt[@]}" --steps 20 --sample-len 80 $plan >"$tmp/pp.log" 2>&1
    rc=$?
    one=$(sample_of "$tmp/one.log" | md5sum) pp=$(sample_of "$tmp/pp.log" | md5sum) lines=$(sample_of "$tmp/pp.log" | wc -l)
    [ $rc = 0 ] && [ "$lines" -ge 3 ] && [ "$one" = "$pp" ]
    ok=$?
    check "pdde-run -n 2 gpt $plan prints the one process's sample (rc $rc, $lines lines: $(sample_of "$tmp/pp.log" | sed -n 2p | tr -cd '[:print:]' | cut -c1-50))" $ok
done

# the start line says where the experts are: split over the dp ranks under --moe-ep
timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "${gpt[@]}" --dp 2 --moe-experts 4 --moe-ep --steps 1 --sample-len 0 >"$tmp/ep.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -q '^\[0\] gpt: .* 2 ranks: dp 2 x tp 1 x pp 1, the experts split over dp 2$' "$tmp/ep.log"
ok=$?
check "gpt --dp 2 --moe-ep's start line says the experts are split over dp 2 (rc $rc: $(grep -m1 -o '2 ranks:.*' "$tmp/ep.log"))" $ok

# MoE under pipeline stages: rank 0's log line covers every stage's blocks and the balance (on the last
# stage), as one process's does
moe=(--moe-experts 4 --moe-capacity 1 --steps 11 --sample-len 0)
moe_lines() { sed -n 's/^\(\[[0-9]*\] \)\{0,1\}//; /^ *moe /p' "$1"; }
"$build/gpt" "${gpt[@]}" "${moe[@]}" >"$tmp/moe1.log" 2>&1
rc1=$?
timeout 180 "$build/pdde-run" -n 3 "$build/gpt" "${gpt[@]}" "${moe[@]}" --pp 3 >"$tmp/moepp.log" 2>&1
rc=$?
lines=$(moe_lines "$tmp/moepp.log" | wc -l)
[ $rc1 = 0 ] && [ $rc = 0 ] && [ "$lines" = 2 ] && [ "$(moe_lines "$tmp/moe1.log")" = "$(moe_lines "$tmp/moepp.log")" ]
ok=$?
check "pdde-run -n 3 gpt --moe-experts 4 --pp 3 logs the one process's MoE lines (rc $rc1/$rc, $lines lines: $(moe_lines "$tmp/moepp.log" | tail -1 | cut -c1-110))" $ok
# a resume on other data: said, naming both, and its batches start at that data's beginning (the
# checkpoint written one step later is at data position 8, one batch, not 16 + 8); on the same data
# nothing is said and the position goes on (24)
# gpt FLAGS... -- FLAGS...: a run of the first flags stopped after step 2 of 3, resumed with the second; sets rc, rc2
# and pos (the data position of the checkpoint the resume wrote); the resume's output in $tmp/resumed.log
stop_then_resume() {
    local first=()
    while [ "$1" != -- ]; do first+=("$1"); shift; done
    shift
    rm -rf "$tmp/ckr"
    "$build/gpt" "${first[@]}" --steps 3 --ckpt-dir "$tmp/ckr" --stop-after 2 >"$tmp/stopped.log" 2>&1
    rc=$?
    "$build/gpt" "$@" --steps 3 --ckpt-dir "$tmp/ckr" --resume >"$tmp/resumed.log" 2>&1
    rc2=$?
    pos=$("$build/pdde-ckpt" info "$tmp/ckr" | sed -n 's/.*data position \([0-9]*\).*/\1/p')
}
head -c 100000 /usr/share/games/fortunes/songs-poems >"$tmp/A.txt"
tail -c 80000 /usr/share/games/fortunes/songs-poems >"$tmp/B.txt"
for second in B A; do
    stop_then_resume "${gpt[@]}" --sample-len 0 --data "$tmp/A.txt" -- "${gpt[@]}" --sample-len 0 --data "$tmp/$second.txt"
    if [ $second = B ]; then
        grep -qF "the checkpoint's run trained on $tmp/A.txt (90000 tokens); this one on $tmp/B.txt (72000 tokens): its batches start at the beginning" "$tmp/resumed.log" && [ "$pos" = 8 ]
    else
        ! grep -q "trained on" "$tmp/resumed.log" && [ "$pos" = 24 ]
    fi
    ok=$?
    check "gpt --resume on --data $second.txt after A.txt: $([ $second = B ] && echo "said, from B's start" || echo "silent, going on") (data position $pos; rc $rc/$rc2: $(grep -m1 "trained on" "$tmp/resumed.log" | cut -c1-80))" $((rc || rc2 || ok))
done

# --init-from a checkpoint directory (a fine-tune from a trained model): its weights, this run's step,
# optimizer and schedule from their start; a model of other heads is refused
rm -rf "$tmp/ckw"
"$build/gpt" "${gpt[@]}" --sample-len 0 --steps 5 --val-every 5 --ckpt-dir "$tmp/ckw" --data "$tmp/A.txt" >"$tmp/w1.log" 2>&1
rc=$?
"$build/gpt" "${gpt[@]}" --sample-len 0 --steps 3 --init-from "$tmp/ckw" --data "$tmp/A.txt" >"$tmp/w2.log" 2>&1
rc2=$?
"$build/gpt" "${gpt[@]}" --sample-len 0 --steps 3 --init-from "$tmp/ckw" --heads 4 >"$tmp/w3.log" 2>&1
rc3=$?
v5=$(sed -n 's/^step *5  validation loss \([0-9.]*\)$/\1/p' "$tmp/w1.log") v0=$(sed -n 's/^step *0  validation loss \([0-9.]*\) .*/\1/p' "$tmp/w2.log")
[ $rc = 0 ] && [ $rc2 = 0 ] && [ -n "$v5" ] && [ "$v5" = "$v0" ] && grep -q "^step *1/3 " "$tmp/w2.log" && [ $rc3 = 1 ] &&
    grep -qF "cannot start from it: $tmp/ckw holds another model's checkpoint: saved with --heads 8, this run has --heads 4" "$tmp/w3.log"
ok=$?
check "gpt --init-from a checkpoint directory starts at its validation loss ($v0 = $v5) from step 1; other --heads refused (rc $rc/$rc2/$rc3)" $ok

# two runs given one --ckpt-dir: the second stops at its start naming the first's process; once the
# first has ended (here killed), the directory is free again
rm -rf "$tmp/ckl"
"$build/gpt" "${gpt[@]}" --sample-len 0 --steps 100000 --ckpt-dir "$tmp/ckl" >"$tmp/l1.log" 2>&1 &
first_pid=$!
for _ in $(seq 300); do grep -q 'step *1/' "$tmp/l1.log" && break; sleep 0.1; done
"$build/gpt" "${gpt[@]}" --sample-len 0 --steps 2 --ckpt-dir "$tmp/ckl" >"$tmp/l2.log" 2>&1
rc=$?
kill -9 $first_pid 2>/dev/null; wait $first_pid 2>/dev/null
"$build/gpt" "${gpt[@]}" --sample-len 0 --steps 2 --ckpt-dir "$tmp/ckl" >"$tmp/l3.log" 2>&1
rc3=$?
[ $rc = 1 ] && grep -qF -- "--ckpt-dir $tmp/ckl is in use by another run (process $first_pid)" "$tmp/l2.log" && ! grep -q 'step *1/' "$tmp/l2.log" && [ $rc3 = 0 ]
ok=$?
check "a second gpt on one --ckpt-dir stops naming the first's process $first_pid; after it is killed the directory trains (rc $rc/$rc3: $(grep -m1 'in use' "$tmp/l2.log" | cut -c1-90))" $ok

# llm.c's GPT-2 model file (tests/data/gpt2_llmc.bin: 2 layers, 4 heads, width 32, vocabulary 300, 32
# positions): --init-from takes its model and starts from its weights (the step-0 validation loss; the
# bf16 file's within bf16's rounding of it); --save-llmc writes the trained model, which validates at the
# loss training ended with; under pdde-run the weights load into tensor-parallel blocks and a --dp job
# saves; flags the file contradicts, and a save no rank can make, are refused before training
llmc=(--threads 1 --ctx 16 --seed 7 --val-every 0 --sample-len 0)
val_at() { sed -n "s/^\(\[[0-9]*\] \)\{0,1\}step *$2  validation loss \([0-9.]*\).*/\2/p" "$1" | head -1; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d < t && -d < t) }'; }
"$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc.bin --steps 3 --save-llmc "$tmp/trained.bin" >"$tmp/llmc.log" 2>&1
rc=$?
start=$(val_at "$tmp/llmc.log" 0) end=$(val_at "$tmp/llmc.log" 3)
"$build/gpt" "${llmc[@]}" --init-from "$tmp/trained.bin" --steps 0 >"$tmp/llmc2.log" 2>&1
rc2=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc_bf16.bin --steps 0 >"$tmp/llmc3.log" 2>&1
rc3=$?
[ $rc = 0 ] && grep -q "2 layers, 4 heads, width 32, context 16" "$tmp/llmc.log" && [ -n "$start" ] && [ "$start" != "$end" ] && [ $rc2 = 0 ] &&
    [ "$(val_at "$tmp/llmc2.log" 0)" = "$end" ] && [ $rc3 = 0 ] && near "$(val_at "$tmp/llmc3.log" 0)" "$start" 0.01
ok=$?
check "gpt --init-from llm.c's file starts at its validation loss ($start; bf16 file $(val_at "$tmp/llmc3.log" 0)), --save-llmc's file validates at the end's ($end = $(val_at "$tmp/llmc2.log" 0); rc $rc/$rc2/$rc3)" $ok
# the sample of the file's model (no training: the seed only draws): --temperature 0 takes the likeliest
# token whatever the seed, --top-k 1 too at any temperature; the default temperature draws by the seed
sample_with() { "$build/gpt" --threads 1 --ctx 16 --steps 0 --sample-len 40 --init-from tests/data/gpt2_llmc.bin "$@" 2>&1 | sed -n '/^---- sample/,/^-----/p' | md5sum; }
greedy=$(sample_with --temperature 0 --seed 1)
[ "$greedy" = "$(sample_with --temperature 0 --seed 2)" ] && [ "$greedy" = "$(sample_with --top-k 1 --temperature 2 --seed 3)" ] &&
    [ "$greedy" = "$(sample_with --top-p 0.000001 --temperature 2 --seed 4)" ] && [ "$greedy" != "$(sample_with --top-p 0.9 --temperature 2 --seed 4)" ] &&
    [ "$(sample_with --seed 1)" != "$(sample_with --seed 2)" ] && [ "$(sample_with --seed 1)" != "$greedy" ]
check "gpt's sample: --temperature 0, --top-k 1 and a tiny --top-p take the likeliest token whatever the seed; the default draws by it" $?
# a job started from the file and stopped resumes from its checkpoint, not from the file: its last
# validation loss is the uninterrupted run's
"$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc.bin --steps 3 --ckpt-dir "$tmp/ck" --stop-after 1 >"$tmp/llmcr1.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc.bin --steps 3 --ckpt-dir "$tmp/ck" --resume >"$tmp/llmcr2.log" 2>&1
rc2=$?
[ $rc = 0 ] && [ $rc2 = 0 ] && grep -q "resumed from" "$tmp/llmcr2.log" && ! grep -q "the weights of" "$tmp/llmcr2.log" && [ "$(val_at "$tmp/llmcr2.log" 3)" = "$end" ]
ok=$?
check "gpt --init-from --resume goes on from the checkpoint (validation $(val_at "$tmp/llmcr2.log" 3), uninterrupted $end; rc $rc/$rc2)" $ok
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc.bin --steps 0 --tp 2 >"$tmp/llmctp.log" 2>&1
rc=$?
near "$(val_at "$tmp/llmctp.log" 0)" "$start" 0.0002
ok=$?
check "pdde-run -n 2 gpt --init-from --tp 2 starts at the one process's validation loss ($(val_at "$tmp/llmctp.log" 0) vs $start; rc $rc)" $((rc || ok))
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc.bin --steps 2 --dp 2 --save-llmc "$tmp/dp.bin" >"$tmp/llmcdp.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from "$tmp/dp.bin" --steps 0 >"$tmp/llmcdp2.log" 2>&1
[ $rc = 0 ] && [ "$(val_at "$tmp/llmcdp2.log" 0)" = "$(val_at "$tmp/llmcdp.log" 2)" ]
ok=$?
check "pdde-run -n 2 gpt --dp 2 --save-llmc saves the model it trained (validation $(val_at "$tmp/llmcdp.log" 2) = $(val_at "$tmp/llmcdp2.log" 0); rc $rc)" $ok
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${llmc[@]}" --init-from tests/data/gpt2_llmc.bin --steps 2 --pp 2 --save-llmc "$tmp/pp.bin" >"$tmp/llmcpp.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -qF -- "--save-llmc $tmp/pp.bin: rank 0 holds a part of parameter" "$tmp/llmcpp.log" && ! grep -q 'step *1/' "$tmp/llmcpp.log" && [ ! -e "$tmp/pp.bin" ]
ok=$?
check "gpt --pp 2 --save-llmc is refused before training: rank 0 does not hold every parameter (rc $rc: $(grep -m1 -- --save-llmc "$tmp/llmcpp.log" | cut -c1-120))" $ok
refused_each gpt "$build/gpt" "${llmc[@]}" --steps 2 <<'BAD'
--init-from tests/data/gpt2_llmc.bin --layers 3|--init-from tests/data/gpt2_llmc.bin: --layers 3, but the file's model has 2 (leave the flag out
--init-from tests/data/gpt2_llmc.bin --ctx 64|--ctx 64, but the file's positions stop at 32
--init-from tests/data/gpt2_llmc.bin --arch llama|--init-from tests/data/gpt2_llmc.bin: --arch llama, but the file's model has gpt
--init-from tests/data/gpt2_llmc.bin --moe-experts 4|llm.c's file holds a dense GPT-2
--init-from tests/data/gpt_golden.bin|--init-from tests/data/gpt_golden.bin: header[0] = 1162101840: not llm.c's GPT-2 model file
--init-from tests/data/no-such.bin|--init-from tests/data/no-such.bin: No such file or directory
BAD

# Hugging Face's directories (tests/data/hf_llama: LLaMA, 2 kv heads of 4, theta 500000, eps 1e-6, an
# untied head, BF16 in two shards; hf_gpt2: GPT-2 as the hub saves it): --init-from takes the model and
# starts at its validation loss (a .safetensors file as its directory); --save-hf writes the trained
# model, which validates where training ended and whose header Python reads as Hugging Face's; under
# --tp 2 the heads and the untied head's vocabulary split, starting at the one process's loss
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_llama --steps 3 --save-hf "$tmp/hfl" >"$tmp/hf.log" 2>&1
rc=$?
start=$(val_at "$tmp/hf.log" 0) end=$(val_at "$tmp/hf.log" 3)
"$build/gpt" "${llmc[@]}" --init-from "$tmp/hfl" --steps 0 >"$tmp/hf2.log" 2>&1
rc2=$?
[ $rc = 0 ] && grep -q "LLaMA-style blocks, 2 kv heads, rope base 500000, ffn 80" "$tmp/hf.log" && grep -q "an untied head, norm epsilon 1e-06" "$tmp/hf.log" &&
    [ -n "$start" ] && [ "$start" != "$end" ] && [ $rc2 = 0 ] && [ "$(val_at "$tmp/hf2.log" 0)" = "$end" ]
ok=$?
check "gpt --init-from a Hugging Face LLaMA starts at its validation loss ($start), --save-hf's directory validates at the end's ($end = $(val_at "$tmp/hf2.log" 0); rc $rc/$rc2)" $ok
python3 - "$tmp/hfl" >"$tmp/hfpy.log" 2>&1 <<'PY'
import json, struct, sys
d = sys.argv[1]
config = json.load(open(d + "/config.json"))
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
tensors = {k: v for k, v in header.items() if k != "__metadata__"}
end = 0
for name, t in sorted(tensors.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    count = 1
    for s in t["shape"]:
        count *= s
    assert t["dtype"] == "F32" and a == end and b - a == 4 * count, name
    end = b
assert (8 + n) % 8 == 0 and 8 + n + end == len(raw), "the data section is the rest of the file"
assert tensors["model.layers.1.self_attn.k_proj.weight"]["shape"] == [16, 32]
assert tensors["model.layers.0.mlp.down_proj.weight"]["shape"] == [32, 80]
assert tensors["lm_head.weight"]["shape"] == [256, 32] and len(tensors) == 2 * 9 + 3
assert config["num_key_value_heads"] == 2 and config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 500000 and not config["tie_word_embeddings"]
print("read as Hugging Face's:", len(tensors), "tensors")
PY
ok=$?
check "--save-hf's directory reads in Python as Hugging Face's: config, header, offsets, shapes ($(tail -1 "$tmp/hfpy.log"))" $ok
# --save-dtype bf16 / f16: the same run's weights, each the f32 one rounded to the nearest (Python's own rounding
# for f16), the header's dtype and torch_dtype say so, and it validates near the end's loss
for dt in bf16 f16; do
    "$build/gpt" "${llmc[@]}" --init-from tests/data/hf_llama --steps 3 --save-hf "$tmp/hfl_$dt" --save-dtype $dt >"$tmp/hf_$dt.log" 2>&1
    rc=$?
    "$build/gpt" "${llmc[@]}" --init-from "$tmp/hfl_$dt" --steps 0 >"$tmp/hf2_$dt.log" 2>&1
    rc2=$?
    python3 - "$tmp/hfl" "$tmp/hfl_$dt" $dt >"$tmp/hfpy_$dt.log" 2>&1 <<'PY'
import json, struct, sys
def tensors(d):
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return raw[8 + n:], {k: v for k, v in header.items() if k != "__metadata__"}
f32, t32 = tensors(sys.argv[1])
half, th = tensors(sys.argv[2])
dt = sys.argv[3]
assert json.load(open(sys.argv[2] + "/config.json"))["torch_dtype"] == {"bf16": "bfloat16", "f16": "float16"}[dt]
assert sorted(t32) == sorted(th)
end, values = 0, 0
for name, t in sorted(th.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    assert t["dtype"] == dt.upper() and t["shape"] == t32[name]["shape"] and a == end, name
    a32, b32 = t32[name]["data_offsets"]
    assert b - a == (b32 - a32) // 2, name
    for i in range(0, (b - a) // 2):
        x = struct.unpack_from("<f", f32, a32 + 4 * i)[0]
        bits = struct.unpack_from("<I", f32, a32 + 4 * i)[0]
        want = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 if dt == "bf16" else struct.unpack("<H", struct.pack("<e", x))[0]
        got = struct.unpack_from("<H", half, a + 2 * i)[0]
        assert got == want, (name, i, x, hex(got), hex(want))
        values += 1
    end = b
assert end == len(half)
print("each of", values, "values the f32 one rounded to", dt)
PY
    pyrc=$?
    near "$(val_at "$tmp/hf2_$dt.log" 0)" "$end" 0.02 && [ $rc = 0 ] && [ $rc2 = 0 ] && [ $pyrc = 0 ] && grep -q "model.safetensors, $([ $dt = bf16 ] && echo bfloat16 || echo float16)" "$tmp/hf_$dt.log"
    ok=$?
    check "--save-hf --save-dtype $dt: $(tail -1 "$tmp/hfpy_$dt.log"), validates at $(val_at "$tmp/hf2_$dt.log" 0) (f32: $end; rc $rc/$rc2)" $ok
done
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2/model.safetensors --steps 0 >"$tmp/hfg.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2 --steps 0 >"$tmp/hfg2.log" 2>&1
[ $rc = 0 ] && [ -n "$(val_at "$tmp/hfg.log" 0)" ] && [ "$(val_at "$tmp/hfg.log" 0)" = "$(val_at "$tmp/hfg2.log" 0)" ] && grep -q "2 layers, 4 heads, width 32" "$tmp/hfg.log"
ok=$?
check "gpt --init-from a GPT-2 .safetensors file starts as from its directory ($(val_at "$tmp/hfg.log" 0) = $(val_at "$tmp/hfg2.log" 0); rc $rc)" $ok
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${llmc[@]}" --init-from tests/data/hf_llama --steps 0 --tp 2 >"$tmp/hftp.log" 2>&1
rc=$?
near "$(val_at "$tmp/hftp.log" 0)" "$start" 0.0002
ok=$?
check "pdde-run -n 2 gpt --init-from tests/data/hf_llama --tp 2 starts at the one process's validation loss ($(val_at "$tmp/hftp.log" 0) vs $start; rc $rc)" $((rc || ok))
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${llmc[@]}" --init-from tests/data/hf_llama --steps 2 --pp 2 --save-hf "$tmp/hfpp" >"$tmp/hfpp.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -qF -- "--save-hf $tmp/hfpp: rank 0 holds a part of parameter" "$tmp/hfpp.log" && ! grep -q 'step *1/' "$tmp/hfpp.log" && [ ! -e "$tmp/hfpp" ]
ok=$?
check "gpt --pp 2 --save-hf is refused before training (rc $rc: $(grep -m1 -- --save-hf "$tmp/hfpp.log" | cut -c1-120))" $ok
# Qwen2 (tests/data/hf_qwen2: LLaMA's layers with biases on q, k and v) and Qwen3 (hf_qwen3: heads of 16 for
# width 32, an RMSNorm on each head of q and k): each trains, --tp 2 gives the one process's losses (Qwen2's bias
# split with the weight's columns; Qwen3's norms' gains whole on each rank, their gradients summed over its
# heads), --save-hf writes it back as its class (Qwen3: head_dim, q_norm, k_norm) and it validates there
for case in "qwen2|ffn 72, qkv bias" "qwen3|ffn 64, heads 16 wide, q and k normed per head"; do
    IFS='|' read -r q says <<<"$case"
    "$build/gpt" "${llmc[@]}" --init-from "tests/data/hf_$q" --steps 2 --val-every 2 --save-hf "$tmp/$q" >"$tmp/$q.log" 2>&1
    rc=$?
    timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${llmc[@]}" --init-from "tests/data/hf_$q" --steps 2 --val-every 2 --tp 2 >"$tmp/${q}tp.log" 2>&1
    rc2=$?
    "$build/gpt" "${llmc[@]}" --init-from "$tmp/$q" --steps 0 >"$tmp/${q}2.log" 2>&1
    rc3=$?
    end=$(val_at "$tmp/$q.log" 2)
    [ $rc = 0 ] && grep -q "$says" "$tmp/$q.log" && [ -n "$end" ] && [ "$end" != "$(val_at "$tmp/$q.log" 0)" ] && [ $rc2 = 0 ] &&
        near "$(val_at "$tmp/${q}tp.log" 2)" "$end" 0.0002 && [ $rc3 = 0 ] && [ "$(val_at "$tmp/${q}2.log" 0)" = "$end" ] &&
        grep -q "\"model_type\": \"$q\"" "$tmp/$q/config.json"
    ok=$?
    check "gpt --init-from a $q directory trains ($(val_at "$tmp/$q.log" 0) -> $end), --tp 2 too ($(val_at "$tmp/${q}tp.log" 2)), --save-hf's $q validates there ($(val_at "$tmp/${q}2.log" 0); rc $rc/$rc2/$rc3)" $ok
done
grep -q '"head_dim": 16' "$tmp/qwen3/config.json" && grep -q 'model.layers.1.self_attn.k_norm.weight' "$tmp/qwen3/model.safetensors"
check "--save-hf's Qwen3 keeps its head_dim and its q and k norms" $?
# the same layers from the flags (--head-dim 16 --qk-norm) take its file
q3flags=(--arch llama --layers 2 --heads 4 --kv-heads 2 --width 32 --ffn 64 --head-dim 16 --qk-norm --rope-base 1000000 --norm-eps 1e-6 --untied-head)
"$build/gpt" "${llmc[@]}" "${q3flags[@]}" --init-from tests/data/hf_qwen3 --steps 0 >"$tmp/q3f.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_qwen3 --head-dim 8 --steps 0 >"$tmp/q3g.log" 2>&1
rc2=$?
"$build/gpt" "${llmc[@]}" --head-dim 16 --steps 0 >"$tmp/q3h.log" 2>&1
rc3=$?
[ $rc = 0 ] && [ "$(val_at "$tmp/q3f.log" 0)" = "$(val_at "$tmp/qwen3.log" 0)" ] && [ $rc2 = 2 ] &&
    grep -qF -- "--head-dim 8, but the file's model has 16" "$tmp/q3g.log" && [ $rc3 = 2 ] && grep -qF -- "--head-dim, --qk-norm and --qkv-bias are LLaMA's" "$tmp/q3h.log"
ok=$?
check "the Qwen3 layers from flags (--head-dim 16 --qk-norm) take its file; --head-dim 8 against it and --head-dim for GPT refused (rc $rc/$rc2/$rc3)" $ok
# LLaMA 3.1's rope_scaling (tests/data/hf_llama3): taken from config.json, written back by --save-hf, kept
# beside a checkpoint, where a run without it is refused
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_llama3 --steps 2 --save-hf "$tmp/hfl3" --ckpt-dir "$tmp/ck3" >"$tmp/hf3.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from "$tmp/hfl3" --steps 0 >"$tmp/hf3b.log" 2>&1
rc2=$?
"$build/gpt" "${llmc[@]}" --arch llama --kv-heads 1 --layers 2 --heads 4 --width 32 --ffn 64 --init-from "$tmp/ck3" --steps 0 >"$tmp/hf3c.log" 2>&1
rc3=$?
[ $rc = 0 ] && grep -q "rope base 10000, LLaMA 3 scaling 8,1,4,64, ffn 64" "$tmp/hf3.log" && [ $rc2 = 0 ] && [ -n "$(val_at "$tmp/hf3.log" 2)" ] &&
    [ "$(val_at "$tmp/hf3b.log" 0)" = "$(val_at "$tmp/hf3.log" 2)" ] && grep -q '"rope_type": "llama3", "factor": 8' "$tmp/hfl3/config.json" && [ $rc3 = 1 ] &&
    grep -qF "saved with --rope-scaling 8,1,4,64, this run has --rope-scaling none" "$tmp/hf3c.log"
ok=$?
check "gpt --init-from a LLaMA 3 directory scales its RoPE, --save-hf keeps rope_scaling ($(val_at "$tmp/hf3.log" 2) = $(val_at "$tmp/hf3b.log" 0)), its checkpoint refuses a run without it (rc $rc/$rc2/$rc3)" $ok
# LoRA on the Hugging Face LLaMA: adapters trained (the validation loss moves), --save-hf writes the
# merged weights, which validate where the run ended; --tp 2 and --dp 2 train the one process's model; a
# resume with another --lora-alpha is refused; without --init-from it is refused
lora=("${llmc[@]}" --init-from tests/data/hf_llama --lora-rank 4 --steps 4 --val-every 4)
"$build/gpt" "${lora[@]}" --save-hf "$tmp/lora" --save-peft "$tmp/peft" --ckpt-dir "$tmp/ckl4" >"$tmp/lora.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from "$tmp/lora" --steps 0 >"$tmp/lora2.log" 2>&1
rc2=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${lora[@]}" --tp 2 >"$tmp/loratp.log" 2>&1
rc3=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${lora[@]}" --dp 2 >"$tmp/loradp.log" 2>&1
rc4=$?
"$build/gpt" "${lora[@]}" --micro 2 >"$tmp/loramicro.log" 2>&1 # (the frozen weights, state inputs: one value for both micro-batches)
rc6=$?
"$build/gpt" "${lora[@]}" --lora-alpha 8 --ckpt-dir "$tmp/ckl4" --resume >"$tmp/lora3.log" 2>&1
rc5=$?
end=$(val_at "$tmp/lora.log" 4)
[ $rc = 0 ] && grep -q "LoRA rank 4, alpha 4: .* parameters trained, the pretrained weights frozen" "$tmp/lora.log" && [ -n "$end" ] &&
    [ "$end" != "$(val_at "$tmp/lora.log" 0)" ] && [ $rc2 = 0 ] && near "$(val_at "$tmp/lora2.log" 0)" "$end" 0.0002 && [ $rc3 = 0 ] &&
    near "$(val_at "$tmp/loratp.log" 4)" "$end" 0.0002 && [ $rc4 = 0 ] && near "$(val_at "$tmp/loradp.log" 4)" "$end" 0.0002 && [ $rc5 = 1 ] &&
    [ $rc6 = 0 ] && near "$(val_at "$tmp/loramicro.log" 4)" "$end" 0.0002 &&
    grep -qF "saved with --lora-alpha 4, this run has --lora-alpha 8" "$tmp/lora3.log"
ok=$?
check "gpt --lora-rank 4 trains adapters ($(val_at "$tmp/lora.log" 0) -> $end), --save-hf's merged weights validate there ($(val_at "$tmp/lora2.log" 0)), --tp 2, --dp 2 and --micro 2 too ($(val_at "$tmp/loratp.log" 4), $(val_at "$tmp/loradp.log" 4), $(val_at "$tmp/loramicro.log" 4)); another --lora-alpha refused (rc $rc/$rc2/$rc3/$rc4/$rc5/$rc6)" $ok
# --save-peft writes the adapters alone as PEFT does (alpha 5, rank 2): applied to the pretrained weights by PEFT's rule
# (W + lora_B lora_A alpha / r; GPT-2's Conv1D transposed, fan_in_fan_out) they give --save-hf's merged
# weights of the same run, for LLaMA (q, k, v from one fused weight), GPT-2 (c_attn's permuted columns) and
# Qwen3 (q and o_proj 64 wide for width 32)
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2 --lora-rank 2 --lora-alpha 5 --steps 4 --save-hf "$tmp/gm" --save-peft "$tmp/gpeft" >"$tmp/gpeft.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_qwen3 --lora-rank 2 --lora-alpha 5 --steps 4 --save-hf "$tmp/q3m" --save-peft "$tmp/q3peft" >"$tmp/q3peft.log" 2>&1
rc4=$?
cat >"$tmp/peft.py" <<'PY'
import json, os, struct, sys
def tensors(d, name=None):
    index = d + "/model.safetensors.index.json"
    files = [name] if name else sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for fn in files:
        raw = open(os.path.join(d, fn), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        for k, v in json.loads(raw[8:8 + n]).items():
            if k == "__metadata__": continue
            a, b = v["data_offsets"]
            body = raw[8 + n + a:8 + n + b]
            if v["dtype"] == "F32": vals = struct.unpack("<%df" % (len(body) // 4), body)
            else: vals = [struct.unpack("<f", struct.pack("<I", x << 16))[0] for x in struct.unpack("<%dH" % (len(body) // 2), body)]  # (BF16)
            out[k] = (v["shape"], vals)
    return out
base, merged, peft = sys.argv[1:4]
cfg = json.load(open(peft + "/adapter_config.json"))
scale = cfg["lora_alpha"] / cfg["r"]
B, M, P = tensors(base), tensors(merged), tensors(peft, "adapter_model.safetensors")
checked, worst, moved = 0, 0.0, 0.0
for k in P:
    if not k.endswith(".lora_A.weight"): continue
    wname = k[len("base_model.model."):-len(".lora_A.weight")] + ".weight"
    (r, nin), A = P[k]
    (nout, _), L = P[k.replace("lora_A", "lora_B")]
    _, W0 = B[wname if wname in B else wname.split(".", 1)[1]]  # (the hub's GPT-2 names lack "transformer.")
    _, W1 = M[wname]
    for o in range(nout):
        for i in range(nin):
            d = scale * sum(L[o * r + j] * A[j * nin + i] for j in range(r))
            at = i * nout + o if cfg["fan_in_fan_out"] else o * nin + i
            worst, moved = max(worst, abs(W0[at] + d - W1[at]) / max(1.0, abs(W1[at]))), max(moved, abs(d))
    checked += 1
assert checked * 2 == len(P) and all(m in ",".join(P) for m in cfg["target_modules"]), (checked, len(P))
assert worst < 2e-6 and moved > 1e-4, (worst, moved)
print("ok", checked, "modules, worst %.1e" % worst)
PY
python3 "$tmp/peft.py" tests/data/hf_llama "$tmp/lora" "$tmp/peft" >"$tmp/peft.log" 2>&1
rc2=$?
python3 "$tmp/peft.py" tests/data/hf_gpt2 "$tmp/gm" "$tmp/gpeft" >"$tmp/gpeft2.log" 2>&1
rc3=$?
[ $rc4 = 0 ] && python3 "$tmp/peft.py" tests/data/hf_qwen3 "$tmp/q3m" "$tmp/q3peft" >"$tmp/q3peft2.log" 2>&1
rc4=$?
[ $rc = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ] && [ $rc4 = 0 ] && grep -q '"lora_alpha": 5,' "$tmp/gpeft/adapter_config.json" && grep -q '"fan_in_fan_out": true' "$tmp/gpeft/adapter_config.json"
ok=$?
check "--save-peft's adapters applied to the pretrained weights by PEFT's rule give --save-hf's merged ones (LLaMA: $(tail -1 "$tmp/peft.log"); GPT-2: $(tail -1 "$tmp/gpeft2.log"); Qwen3: $(tail -1 "$tmp/q3peft2.log"); rc $rc/$rc2/$rc3/$rc4)" $ok
# a Hugging Face model's tokenizer.json prints the sample of its token ids as text (by default the one beside
# the weights; --tokenizer names another, a config.json is refused as one)
python3 - "$tmp/hfids.bin" <<'PY'
import struct, sys
ids = [(i * 37) % 301 for i in range(4000)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack("<%dH" % len(ids), *ids))
PY
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2 --data "$tmp/hfids.bin" --steps 0 --sample-len 8 >"$tmp/hftok.log" 2>&1
rc=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2 --data "$tmp/hfids.bin" --steps 0 --sample-len 8 --tokenizer tests/data/hf_llama/config.json >"$tmp/hftok2.log" 2>&1
rc2=$?
[ $rc = 0 ] && grep -q "^---- sample (after token [0-9]*, decoded by tests/data/hf_gpt2/tokenizer.json) ----" "$tmp/hftok.log" && [ $rc2 = 2 ] &&
    grep -qF -- "--tokenizer tests/data/hf_llama/config.json: no model.vocab" "$tmp/hftok2.log"
ok=$?
check "gpt --init-from a Hugging Face directory decodes the sample by its tokenizer.json; a config.json as --tokenizer is refused (rc $rc/$rc2)" $ok
# your own text for a Hugging Face model: build/tokenize writes its token file by the model's tokenizer.json
# (a document after "<|endoftext|>"; the ids decode back to the text), gpt fine-tunes on it and goes on
# from a text --prompt encoded the same way; given the text itself, gpt tokenizes it the same way
printf ' the cat caf\xc3\xa9\n\nsat on the mat; the cat sat. ' >"$tmp/doc.txt"
for i in 1 2 3 4 5 6; do cat "$tmp/doc.txt" "$tmp/doc.txt" >"$tmp/doc2.txt" && mv "$tmp/doc2.txt" "$tmp/doc.txt"; done
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/doc.tok" "$tmp/doc.txt" >"$tmp/tokz.log" 2>&1
rc=$?
python3 - "$tmp/doc.tok" "$tmp/doc.txt" tests/data/hf_gpt2/tokenizer.json >"$tmp/tokzpy.log" 2>&1 <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
assert raw[:8] == b"PDDETOK1", raw[:8]
n = struct.unpack("<Q", raw[8:16])[0]
ids = struct.unpack("<%di" % n, raw[16:])
vocab = {i: t for t, i in json.load(open(sys.argv[3]))["model"]["vocab"].items()}
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:] + [256 + k for k in range(256 - len(bs))]
bs += [b for b in range(256) if b not in bs]
byte = {chr(c): b for b, c in zip(bs, cs)}
assert ids[0] == 300, ids[:3]
text = bytes(byte[ch] for i in ids[1:] for ch in vocab[i])
assert text == open(sys.argv[2], "rb").read(), text[:40]
print("ok", n)
PY
rc2=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2 --data "$tmp/doc.tok" --steps 2 --val-every 2 --sample-len 4 --prompt " the cat" >"$tmp/tokzg.log" 2>&1
rc3=$?
"$build/gpt" "${llmc[@]}" --init-from tests/data/hf_gpt2 --data "$tmp/doc.txt" --steps 2 --val-every 2 >"$tmp/tokzt.log" 2>&1
rc4=$?
[ $rc = 0 ] && grep -q "^ok $(( $(wc -c <"$tmp/doc.txt") + 1 ))\$" "$tmp/tokzpy.log" && [ $rc3 = 0 ] &&
    grep -qaE "^---- sample \(after the prompt's 8, decoded by tests/data/hf_gpt2/tokenizer.json\) ----" "$tmp/tokzg.log" &&
    grep -aA1 -- "^---- sample" "$tmp/tokzg.log" | tail -1 | grep -qa "^ the cat" && [ $rc4 = 0 ] &&
    grep -qF "is text: 1 document, 2880 bytes -> 2881 tokens by tests/data/hf_gpt2/tokenizer.json" "$tmp/tokzt.log" &&
    [ -n "$(val_at "$tmp/tokzt.log" 2)" ] && [ "$(val_at "$tmp/tokzt.log" 0)" = "$(val_at "$tmp/tokzg.log" 0)" ] &&
    [ "$(val_at "$tmp/tokzt.log" 2)" = "$(val_at "$tmp/tokzg.log" 2)" ]
ok=$?
check "build/tokenize writes a token file gpt fine-tunes on, whose ids decode to the text ($(tail -1 "$tmp/tokzpy.log")); a text --prompt is encoded; gpt on the text itself trains as on the token file ($(val_at "$tmp/tokzt.log" 2) = $(val_at "$tmp/tokzg.log" 2); rc $rc/$rc2/$rc3/$rc4)" $ok
# JSON Lines: each record's "text" a document (a \u0000 in it kept), the same ids as the texts in files of their own; a record
# without one is refused naming the file and line, and nothing is written
printf 'the cat \xe2\x80\x9csat\xe2\x80\x9d\n' >"$tmp/a.txt" && printf 'caf\xc3\xa9\t\0<|endoftext|>' >"$tmp/b.txt"
printf '{"id": 1, "text": "the cat \\u201csat\\u201d\\n"}\n\n{"meta": {"text": 0}, "text": "caf\xc3\xa9\\t\\u0000<|endoftext|>"}\n' >"$tmp/ab.jsonl"
printf '{"text": "ok"}\n{"txt": "x"}\n' >"$tmp/bad.jsonl"
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/ab.tok" "$tmp/a.txt" "$tmp/b.txt" >"$tmp/jl1.log" 2>&1
rc=$?
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/abj.tok" "$tmp/ab.jsonl" >"$tmp/jl2.log" 2>&1
rc2=$?
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/bad.tok" "$tmp/bad.jsonl" >"$tmp/jl3.log" 2>&1
rc3=$?
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/none.tok" --doc-start none "$tmp/a.txt" >"$tmp/jl4.log" 2>&1
rc4=$?
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/none.tok" --doc-start 301 "$tmp/a.txt" >"$tmp/jl5.log" 2>&1
rc5=$?
[ $rc = 0 ] && [ $rc2 = 0 ] && cmp -s "$tmp/ab.tok" "$tmp/abj.tok" && grep -q "^tokenize: 2 documents, 38 bytes -> 28 tokens" "$tmp/jl2.log" &&
    [ $rc3 = 1 ] && grep -qF "bad.jsonl:2: a record with a \"text\" string, or a \"prompt\" and a \"completion\", expected" "$tmp/jl3.log" && [ ! -e "$tmp/bad.tok" ] && [ ! -e "$tmp/bad.tok.tmp" ] &&
    [ $rc4 = 0 ] && grep -q "^tokenize: 1 document, 18 bytes -> 18 tokens" "$tmp/jl4.log" && [ "$("$build/tokenize" --tokenizer tests/data/hf_gpt2 --text " the")" = "220 83 71 68" ] &&
    [ $rc5 = 2 ] && grep -qF -- "--doc-start 301: an id below the vocabulary's 301, or none" "$tmp/jl5.log"
ok=$?
check "build/tokenize reads JSON Lines: each record's text a document, the ids of the same texts as files ($(head -1 "$tmp/jl2.log" | cut -c1-60)); a record without text refused by line; --doc-start none, --text (rc $rc/$rc2/$rc3/$rc4/$rc5)" $ok
# JSON Lines of prompts and completions (instruction tuning): the start token and each prompt are stored as no
# targets (~id), the completion and "<|endoftext|>" (the end) as targets; gpt trains on the completions alone,
# the loss their mean however they fall on ranks and micro-batches (--dp 2 and --micro 2: the one process's
# validation losses); a record with a completion and no prompt is refused by line
python3 - "$tmp/sft.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(60):
        f.write(json.dumps({"prompt": "the cat sat on the mat " * (1 + i % 4) + "?", "completion": " caf\u00e9 %d" % (i % 7)}) + "\n")
PY
printf '{"completion": "x"}\n' >"$tmp/sftbad.jsonl"
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/sft.tok" "$tmp/sft.jsonl" >"$tmp/sft1.log" 2>&1
rc=$?
python3 - "$tmp/sft.tok" "$tmp/sft.jsonl" >"$tmp/sftpy.log" 2>&1 <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[8:16])[0]
ids = struct.unpack("<%di" % n, raw[16:])
records = [json.loads(l) for l in open(sys.argv[2])]
at = 0
for r in records:  # ~start, the prompt's ~ids, the completion's ids, the end
    assert ids[at] == ~300, (at, ids[at])
    at += 1
    while ids[at] < 0: at += 1
    done = at
    while ids[at] != 300: assert ids[at] > 0, ids[at]; at += 1
    assert at - done == len(r["completion"].encode()), (at - done, r)  # (a byte a token: the fixture's vocabulary has no merges)
    at += 1
assert at == n, (at, n)
print("ok", n, sum(i < 0 for i in ids))
PY
rc2=$?
"$build/tokenize" --tokenizer tests/data/hf_gpt2 --out "$tmp/sftbad.tok" "$tmp/sftbad.jsonl" >"$tmp/sft2.log" 2>&1
rc3=$?
sft=("${llmc[@]}" --init-from tests/data/hf_gpt2 --data "$tmp/sft.jsonl" --steps 3 --val-every 3 --batch 4)
"$build/gpt" "${sft[@]}" >"$tmp/sft3.log" 2>&1
rc4=$?
"$build/gpt" "${sft[@]}" --micro 2 >"$tmp/sft4.log" 2>&1
rc5=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${sft[@]}" --dp 2 >"$tmp/sft5.log" 2>&1
rc6=$?
end=$(val_at "$tmp/sft3.log" 3)
[ $rc = 0 ] && [ $rc2 = 0 ] && grep -q "^tokenize: [0-9]* of them prompts' (no targets)" "$tmp/sft1.log" &&
    [ "$(grep -o '[0-9]* of them' "$tmp/sft1.log" | cut -d' ' -f1)" = "$(cut -d' ' -f3 "$tmp/sftpy.log")" ] && [ $rc3 = 1 ] &&
    grep -qF 'sftbad.jsonl:1: a record with a "text" string, or a "prompt" and a "completion", expected' "$tmp/sft2.log" &&
    [ $rc4 = 0 ] && grep -q "of them prompts' (no targets)" "$tmp/sft3.log" && [ -n "$end" ] && [ "$end" != "$(val_at "$tmp/sft3.log" 0)" ] &&
    [ $rc5 = 0 ] && near "$(val_at "$tmp/sft4.log" 3)" "$end" 0.0002 && [ $rc6 = 0 ] && near "$(val_at "$tmp/sft5.log" 3)" "$end" 0.0002
ok=$?
check "prompts and completions: the prompts stored as no targets ($(tail -1 "$tmp/sftpy.log")), gpt trains on the completions ($(val_at "$tmp/sft3.log" 0) -> $end), --micro 2 and --dp 2 the same ($(val_at "$tmp/sft4.log" 3), $(val_at "$tmp/sft5.log" 3)); a completion without a prompt refused (rc $rc/$rc2/$rc3/$rc4/$rc5/$rc6)" $ok
# --doc-windows: every window starts at a record's start (the last of a run of start tokens: GPT-2's end token is its
# start token too), so each completion sees its whole prompt: other losses from the first validation on; --dp 2 the
# same; without a start token refused
"$build/gpt" "${sft[@]}" --ctx 32 >"$tmp/dw0.log" 2>&1
"$build/gpt" "${sft[@]}" --ctx 32 --doc-windows >"$tmp/dw1.log" 2>&1
rc=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${sft[@]}" --ctx 32 --doc-windows --dp 2 >"$tmp/dw2.log" 2>&1
rc2=$?
"$build/gpt" "${gpt[@]}" --steps 2 --doc-windows >"$tmp/dw3.log" 2>&1
rc3=$?
end=$(val_at "$tmp/dw1.log" 3)
[ $rc = 0 ] && [ -n "$end" ] && [ "$(val_at "$tmp/dw1.log" 0)" != "$(val_at "$tmp/dw0.log" 0)" ] && [ "$end" != "$(val_at "$tmp/dw0.log" 3)" ] &&
    [ $rc2 = 0 ] && near "$(val_at "$tmp/dw2.log" 3)" "$end" 0.0002 &&
    [ $rc3 = 2 ] && grep -qF -- "--doc-windows needs the token each document starts with" "$tmp/dw3.log"
ok=$?
check "--doc-windows: windows at the records' starts ($(val_at "$tmp/dw1.log" 0) -> $end; at any token $(val_at "$tmp/dw0.log" 0) -> $(val_at "$tmp/dw0.log" 3)), --dp 2 the same ($(val_at "$tmp/dw2.log" 3)); no start token refused (rc $rc/$rc2/$rc3)" $ok
# a resume that windows the data otherwise (--doc-windows given or left out) is said and starts at the data's
# beginning: the checkpoint's data position counts other windows; the same windows go on silently
for second in plain aligned; do
    stop_then_resume "${sft[@]}" --ctx 32 --doc-windows -- "${sft[@]}" --ctx 32 $([ $second = aligned ] && echo --doc-windows)
    if [ $second = plain ]; then
        grep -qF "tokens, windows at token 300); this one on $tmp/sft.jsonl" "$tmp/resumed.log" && [ "$pos" = 4 ]
    else
        ! grep -q "trained on" "$tmp/resumed.log" && [ "$pos" = 12 ]
    fi
    ok=$?
    check "gpt --resume $([ $second = aligned ] && echo "with" || echo "without") --doc-windows after a run with: $([ $second = plain ] && echo "said, from the data's start" || echo "silent, going on") (data position $pos; rc $rc/$rc2: $(grep -m1 "trained on" "$tmp/resumed.log" | cut -c1-90))" $((rc || rc2 || ok))
done
# trained longer, it answers a prompt (the likeliest token each time) and stops at the end token it learned
"$build/gpt" "${sft[@]}" --steps 150 --val-every 150 --batch 8 --temperature 0 --sample-len 12 --prompt "the cat sat on the mat ?" >"$tmp/sft6.log" 2>&1
rc7=$?
[ $rc7 = 0 ] && grep -qF "sample (after the prompt's 24, to the end token 300," "$tmp/sft6.log" &&
    grep -aA1 -- "^---- sample" "$tmp/sft6.log" | tail -1 | grep -qaE "^the cat sat on the mat \? caf.+ [0-9]\$"
ok=$?
check "the instruction-tuned model answers the prompt and stops at the end token ($(grep -aA1 -- "^---- sample" "$tmp/sft6.log" | tail -1); rc $rc7)" $ok
# --doc-mask: packed documents kept apart (attention inside each, GPT-2's positions restarting at each start
# token): short records, several a window, train otherwise than without it, and --dp 2, --tp 2 and --micro 2
# (and --pp 2, the OpenCL device) give the one process's validation losses (the starts split with the batch, whole over the heads); LLaMA's
# too (hf_llama: --doc-token, "?" its byte token 35, as its template puts no start token); without a start
# token it is refused
python3 -c 'import json; [print(json.dumps({"text": "the cat sat on the mat " * (i % 3) + "?%d" % i})) for i in range(200)]' >"$tmp/docs.jsonl"
dm=("${llmc[@]}" --data "$tmp/docs.jsonl" --steps 3 --val-every 3 --batch 4)
"$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 >"$tmp/dm0.log" 2>&1
"$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 --doc-mask >"$tmp/dm1.log" 2>&1
rc=$?
"$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 --doc-mask --micro 2 >"$tmp/dm2.log" 2>&1
rc2=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 --doc-mask --dp 2 >"$tmp/dm3.log" 2>&1
rc3=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 --doc-mask --tp 2 >"$tmp/dm4.log" 2>&1
rc4=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 --doc-mask --pp 2 >"$tmp/dm8.log" 2>&1
rc8=$?
"$build/gpt" "${dm[@]}" --init-from tests/data/hf_gpt2 --doc-mask --device opencl >"$tmp/dm9.log" 2>&1
rc9=$?
"$build/gpt" "${dm[@]}" --init-from tests/data/hf_llama --doc-mask --doc-token 35 >"$tmp/dm5.log" 2>&1
rc5=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${dm[@]}" --init-from tests/data/hf_llama --doc-mask --doc-token 35 --tp 2 >"$tmp/dm6.log" 2>&1
rc6=$?
"$build/gpt" "${gpt[@]}" --steps 2 --doc-mask >"$tmp/dm7.log" 2>&1
rc7=$?
end=$(val_at "$tmp/dm1.log" 3)
[ $rc = 0 ] && [ -n "$end" ] && [ "$end" != "$(val_at "$tmp/dm0.log" 3)" ] && [ $rc2 = 0 ] && near "$(val_at "$tmp/dm2.log" 3)" "$end" 0.0002 &&
    [ $rc3 = 0 ] && near "$(val_at "$tmp/dm3.log" 3)" "$end" 0.0002 && [ $rc4 = 0 ] && near "$(val_at "$tmp/dm4.log" 3)" "$end" 0.0002 &&
    [ $rc8 = 0 ] && near "$(val_at "$tmp/dm8.log" 3)" "$end" 0.0002 && [ $rc9 = 0 ] && near "$(val_at "$tmp/dm9.log" 3)" "$end" 0.0002 &&
    [ $rc5 = 0 ] && [ -n "$(val_at "$tmp/dm5.log" 3)" ] && [ $rc6 = 0 ] && near "$(val_at "$tmp/dm6.log" 3)" "$(val_at "$tmp/dm5.log" 3)" 0.0002 &&
    [ $rc7 = 2 ] && grep -qF -- "--doc-mask needs the token each document starts with" "$tmp/dm7.log"
ok=$?
check "--doc-mask trains ($end, without: $(val_at "$tmp/dm0.log" 3)); --micro 2, --dp 2, --tp 2, --pp 2, the OpenCL device the same ($(val_at "$tmp/dm2.log" 3), $(val_at "$tmp/dm3.log" 3), $(val_at "$tmp/dm4.log" 3), $(val_at "$tmp/dm8.log" 3), $(val_at "$tmp/dm9.log" 3)); LLaMA --tp 2 ($(val_at "$tmp/dm6.log" 3) = $(val_at "$tmp/dm5.log" 3)); no start token refused (rc $rc/$rc2/$rc3/$rc4/$rc5/$rc6/$rc7)" $ok
# Mistral's sliding window (hf_llama's model as Mistral's class with "sliding_window": 4: each token sees itself and the
# 3 before it): trains otherwise than LLaMA's; --tp 2 and --dp 2 give the one process's validation losses; --save-hf
# writes Mistral's class with its window, which --init-from reads back (validating at the loss training ended with) and
# keeps against another --window; GPT-2's class has no window to save
mkdir -p "$tmp/mis" && cp tests/data/hf_llama/* "$tmp/mis/" &&
    sed -i 's/"model_type": "llama"/"model_type": "mistral", "sliding_window": 4/' "$tmp/mis/config.json"
"$build/gpt" "${dm[@]}" --init-from tests/data/hf_llama >"$tmp/win0.log" 2>&1
"$build/gpt" "${dm[@]}" --init-from "$tmp/mis" --save-hf "$tmp/win" >"$tmp/win1.log" 2>&1
rc=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${dm[@]}" --init-from "$tmp/mis" --tp 2 >"$tmp/win2.log" 2>&1
rc2=$?
timeout 180 "$build/pdde-run" -n 2 "$build/gpt" "${dm[@]}" --init-from "$tmp/mis" --dp 2 >"$tmp/win3.log" 2>&1
rc3=$?
"$build/gpt" "${dm[@]}" --init-from "$tmp/win" --steps 0 >"$tmp/win4.log" 2>&1
rc4=$?
"$build/gpt" "${dm[@]}" --init-from "$tmp/win" --window 8 --steps 0 >"$tmp/win5.log" 2>&1
rc5=$?
"$build/gpt" "${gpt[@]}" --window 4 --steps 1 --save-hf "$tmp/win6" >"$tmp/win6.log" 2>&1
rc6=$?
end=$(val_at "$tmp/win1.log" 3)
[ $rc = 0 ] && [ -n "$end" ] && [ "$end" != "$(val_at "$tmp/win0.log" 3)" ] && grep -q "each token sees itself and the 3 before it" "$tmp/win1.log" &&
    [ $rc2 = 0 ] && near "$(val_at "$tmp/win2.log" 3)" "$end" 0.0002 && [ $rc3 = 0 ] && near "$(val_at "$tmp/win3.log" 3)" "$end" 0.0002 &&
    grep -q '"MistralForCausalLM"' "$tmp/win/config.json" && grep -q '"sliding_window": 4' "$tmp/win/config.json" &&
    [ $rc4 = 0 ] && near "$(val_at "$tmp/win4.log" 0)" "$end" 0.0002 &&
    [ $rc5 != 0 ] && grep -qF -- "--window 8, but the file's model has 4" "$tmp/win5.log" &&
    [ $rc6 != 0 ] && grep -qF "an attention window of 4: GPT-2's class has none" "$tmp/win6.log"
ok=$?
check "Mistral's window of 4 trains ($end, LLaMA's: $(val_at "$tmp/win0.log" 3)); --tp 2, --dp 2 the same ($(val_at "$tmp/win2.log" 3), $(val_at "$tmp/win3.log" 3)); --save-hf writes Mistral's window, read back at $(val_at "$tmp/win4.log" 0), kept against --window 8; GPT-2 refused (rc $rc/$rc2/$rc3/$rc4/$rc5/$rc6)" $ok
mkdir -p "$tmp/hfnone" && cp tests/data/hf_gpt2/config.json "$tmp/hfnone/"
refused_each gpt "$build/gpt" "${llmc[@]}" --steps 2 <<BAD
--init-from tests/data/hf_llama --heads 8|--init-from tests/data/hf_llama: --heads 8, but the file's model has 4 (leave the flag out
--init-from tests/data/hf_llama --norm-eps 0.00001|--norm-eps 1e-05, but the file's model has 1e-06
--init-from tests/data/hf_gpt2 --untied-head|--untied-head given, but the file's model has a tied head
--init-from tests/data/hf_gpt2 --ctx 64|--init-from tests/data/hf_gpt2: --ctx 64, but the model's positions stop at 32
--init-from tests/data/hf_llama --moe-experts 4|Hugging Face's GPT-2 and LLaMA have no experts
--init-from tests/data/hf_llama3 --rope-scaling 32,1,4,8192|--rope-scaling 32,1,4,8192, but the file's model has 8,1,4,64
--rope-scaling 8,1,4,8192|--kv-heads, --rope-base, --rope-scaling, --head-dim, --qk-norm and --qkv-bias are LLaMA's
--arch llama --rope-scaling 8,4,1,8192|--rope-scaling wants FACTOR,LOW_FREQ,HIGH_FREQ,ORIGINAL_CONTEXT
--lora-rank 4|--lora-rank 4 adapts a pretrained model: give --init-from
--top-p 1.5|--top-p wants a probability in [0, 1], got 1.5
--init-from tests/data/hf_gpt2 --lora-rank 4 --moe-experts 4|Hugging Face's GPT-2 and LLaMA have no experts
--init-from tests/data/hf_gpt2 --save-peft /tmp/never|--save-peft /tmp/never saves LoRA adapters: give --lora-rank
--init-from $tmp/hfnone|--init-from $tmp/hfnone: $tmp/hfnone: neither model.safetensors nor model.safetensors.index.json there
BAD
finish
