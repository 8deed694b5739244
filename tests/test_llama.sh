#!/usr/bin/env bash
# gpt --arch llama (LLaMA-style blocks): --help lists its flags and bad values of them stop gpt with a
# message naming the flag; a run stopped and resumed has the uninterrupted run's losses; a checkpoint of
# the other architecture is refused on resume (both ways), saying so, nothing trained and the
# checkpoint left as it was; LLaMA with MoE blocks (GELU experts) trains. Run from the repository root.
. tests/script_util.sh llama
gpt=(--val-every 0 --sample-len 0 --threads 1 --layers 2 --width 64 --heads 4 --ctx 32 --batch 4 --seed 5)
llama=(--arch llama --kv-heads 2)

"$build/gpt" --help >"$tmp/help.log" 2>&1
grep -q -- '--arch gpt|llama' "$tmp/help.log" && grep -q -- '--kv-heads N' "$tmp/help.log" && grep -q -- '--rope-base X' "$tmp/help.log"
check "--help lists --arch, --kv-heads and --rope-base" $?

# each bad value: exit non-zero, the message, no step trained
while IFS='|' read -r flags message; do
    "$build/gpt" "${gpt[@]}" --steps 2 $flags >"$tmp/bad.log" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q -- "$message" "$tmp/bad.log" && ! grep -q 'step *1/' "$tmp/bad.log"
    ok=$?
    check "gpt $flags is refused: '$message' (rc $rc: $(head -1 "$tmp/bad.log" | cut -c1-120))" $ok
done <<'BAD'
--arch mamba|--arch takes gpt or llama
--arch|no value after it
--kv-heads 2|--kv-heads, --rope-base, --rope-scaling, --head-dim, --qk-norm and --qkv-bias are LLaMA's
--rope-base 5000|--kv-heads, --rope-base, --rope-scaling, --head-dim, --qk-norm and --qkv-bias are LLaMA's
--arch llama --kv-heads 3|--kv-heads 3 dividing --heads 4
--arch llama --kv-heads -1|--kv-heads wants a non-negative integer
--arch llama --rope-base 0.5|RoPE's base must be > 1
--arch llama --rope-base 0|RoPE's base must be > 1
--arch llama --rope-base inf|--rope-base wants a finite number
--arch llama --width 36|an even head dim
--qk-norm|--head-dim, --qk-norm and --qkv-bias are LLaMA's
--arch llama --head-dim 7|an even head dim (--head-dim, or --width / --heads: 7
--arch llama --head-dim 5000|no --head-dim (1 .. 4096, got 5000)
--arch llama --head-dim -2|--head-dim wants a non-negative integer
BAD

# stopped after 4 of 8 steps and resumed: steps 5-8 as the uninterrupted run's
"$build/gpt" "${gpt[@]}" "${llama[@]}" --steps 8 --metrics "$tmp/full.jsonl" >"$tmp/full.log" 2>&1
rc=$?
check "gpt --arch llama: 8 steps ($(tail -1 "$tmp/full.log"))" $rc
"$build/gpt" "${gpt[@]}" "${llama[@]}" --steps 8 --stop-after 4 --ckpt-dir "$tmp/ck_llama" >"$tmp/a.log" 2>&1
"$build/gpt" "${gpt[@]}" "${llama[@]}" --steps 8 --resume --ckpt-dir "$tmp/ck_llama" --metrics "$tmp/b.jsonl" >"$tmp/b.log" 2>&1
rc=$?
check "resumed after step 4 ($(tail -1 "$tmp/b.log"))" $rc
python3 - "$tmp/full.jsonl" "$tmp/b.jsonl" >"$tmp/cmp" 2>&1 <<'PY'
import json, math, sys
full, b = ({r["step"]: r for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:])
assert sorted(b) == list(range(5, 9)), sorted(b)
for k in range(5, 9):
    assert math.isfinite(b[k]["loss"]) and abs(b[k]["loss"] - full[k]["loss"]) <= 1e-6 * abs(full[k]["loss"]), \
        "step %d: loss %.9g resumed, %.9g uninterrupted" % (k, b[k]["loss"], full[k]["loss"])
print("ok: steps 5-8 equal the uninterrupted run's (step 5: %.7f)" % b[5]["loss"])
PY
rc=$?
check "LLaMA: the resumed steps equal the uninterrupted run's ($(tail -1 "$tmp/cmp"))" $rc

# a checkpoint of the other architecture (or without the q and k norms): refused, nothing trained, the checkpoint unchanged
"$build/gpt" "${gpt[@]}" --steps 2 --ckpt-dir "$tmp/ck_gpt" >"$tmp/g.log" 2>&1
rc=$?
check "gpt --arch gpt saves a checkpoint ($(tail -1 "$tmp/g.log"))" $rc
for case in "ck_llama|--arch gpt" "ck_gpt|${llama[*]}" "ck_llama|${llama[*]} --qk-norm"; do
    IFS='|' read -r dir flags <<<"$case"
    before=$(cd "$tmp/$dir" && find . -type f | sort | xargs md5sum)
    "$build/gpt" "${gpt[@]}" $flags --steps 8 --resume --ckpt-dir "$tmp/$dir" >"$tmp/other.log" 2>&1
    rc=$?
    after=$(cd "$tmp/$dir" && find . -type f | sort | xargs md5sum)
    [ $rc != 0 ] && grep -Eq "cannot resume: .*tensor .*(is not in this model|there, the model's is|of the model is missing)" "$tmp/other.log" &&
        grep -q "holds another model's checkpoint: resume with the model flags that saved it" "$tmp/other.log" &&
        ! grep -q 'step *[0-9]*/8' "$tmp/other.log" && [ "$before" = "$after" ]
    ok=$?
    check "$dir resumed with $flags is refused, nothing trained or written (rc $rc: $(grep -m1 'cannot resume' "$tmp/other.log" | cut -c1-150))" $ok
done

# the rope base does not show in the tensors' shapes: the flags kept beside the checkpoint refuse another one
"$build/gpt" "${gpt[@]}" "${llama[@]}" --rope-base 500 --steps 8 --resume --ckpt-dir "$tmp/ck_llama" >"$tmp/rope.log" 2>&1
rc=$?
[ $rc != 0 ] && grep -q "saved with --rope-base 10000, this run has --rope-base 500" "$tmp/rope.log" && ! grep -q 'step *[0-9]*/8' "$tmp/rope.log"
ok=$?
check "the LLaMA checkpoint resumed with --rope-base 500 is refused naming both bases (rc $rc: $(grep -m1 'cannot resume' "$tmp/rope.log" | cut -c1-150))" $ok

# MoE blocks in the LLaMA model: GELU experts after its RMSNorm
"$build/gpt" "${gpt[@]}" "${llama[@]}" --moe-experts 4 --moe-every 2 --steps 3 >"$tmp/moe.log" 2>&1
rc=$?
[ $rc = 0 ] && grep -Eq 'step +3/3 +loss [0-9]' "$tmp/moe.log"
ok=$?
check "gpt --arch llama --moe-experts 4 --moe-every 2 trains (rc $rc: $(grep -m1 'step *3/3' "$tmp/moe.log"))" $ok
finish
