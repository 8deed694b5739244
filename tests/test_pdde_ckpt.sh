#!/usr/bin/env bash
# pdde-ckpt on a sharded checkpoint of gpt under tp=2 (2 ranks): info prints the step, data position,
# files and every tensor's shape, dist attr and blocks; verify passes; convert makes a single file and
# a directory of it again, which diff finds bit-identical to the original, and which gpt resumes from
# with the losses of a resume from the original. A manifest with a block line dropped or doubled (its
# CRC made right again) fails verify (a tensor not covered, blocks overlapping); a damaged manifest
# fails its CRC; convert and info refuse what is not a checkpoint. Run from the repository root.
. tests/script_util.sh pdde_ckpt
ck=$build/pdde-ckpt
if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: no build/pdde-run (this build has no UCX)"
    finish
    exit
fi
gpt=(--val-every 0 --sample-len 0 --threads 1 --layers 2 --width 64 --heads 2 --seed 5 --steps 8)
timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "${gpt[@]}" --tp 2 --stop-after 4 --ckpt-dir "$tmp/tp" >"$tmp/tp.log" 2>&1
rc=$?
check "gpt --tp 2 saves a sharded checkpoint after step 4 ($(tail -1 "$tmp/tp.log"))" $rc

"$ck" info "$tmp/tp" >"$tmp/info" 2>&1
rc=$?
check "info runs ($(head -1 "$tmp/info"))" $rc
grep -q '^step 4 .*data position 32' "$tmp/info" && grep -q '^file s1-r0.shard' "$tmp/info" && grep -q '^file s1-r1.shard' "$tmp/info" &&
    grep -q '^tensor h0.attn.w f32 \[64x192\] mesh\[2\] dims\[-1,tp\]' "$tmp/info" &&
    grep -A2 '^tensor h0.attn.w ' "$tmp/info" | grep -q 'block \[0:64,96:192\] in s1-r1.shard'
rc=$?
check "info: step 4, data position 32 (4 x 8 samples), both ranks' files, h0.attn.w split by columns with its second half in rank 1's file" $rc

out=$("$ck" verify "$tmp/tp" 2>&1)
rc=$?
check "verify passes ($out)" $rc
"$ck" convert "$tmp/tp" "$tmp/one.ckpt" >/dev/null 2>&1 && "$ck" convert "$tmp/one.ckpt" "$tmp/back/" >/dev/null 2>&1
rc=$?
check "convert: directory -> single file -> directory" $rc
[ -f "$tmp/one.ckpt" ] && [ -f "$tmp/back/manifest" ] && [ "$(ls "$tmp/back" | grep -c 'shard$')" = 1 ]
check "the single file is a file; the directory has a manifest and one shard" $?
out=$("$ck" diff "$tmp/tp" "$tmp/one.ckpt" 2>&1) && out2=$("$ck" diff "$tmp/tp" "$tmp/back" 2>&1)
rc=$?
check "diff: both conversions hold the same tensors bit for bit ($out)" $rc
"$ck" verify "$tmp/one.ckpt" >/dev/null 2>&1 && "$ck" verify "$tmp/back" >/dev/null 2>&1
check "verify passes on both conversions" $?

# one process resumes from the original and from the converted directory: the same losses
cp -r "$tmp/tp" "$tmp/tp2"
"$build/gpt" "${gpt[@]}" --resume --ckpt-dir "$tmp/tp2" --metrics "$tmp/a.jsonl" >"$tmp/a.log" 2>&1 &&
    "$build/gpt" "${gpt[@]}" --resume --ckpt-dir "$tmp/back" --metrics "$tmp/b.jsonl" >"$tmp/b.log" 2>&1
rc=$?
check "one process resumes from the original and from the converted directory" $rc
a=$(grep -o '"loss":[^,]*' "$tmp/a.jsonl" | tr '\n' ' '); b=$(grep -o '"loss":[^,]*' "$tmp/b.jsonl" | tr '\n' ' ')
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$(grep -c '"loss"' "$tmp/a.jsonl")" = 4 ]
check "steps 5-8 have the same losses ($a)" $?
# and those of the uninterrupted tp=2 run (within 1e-6: one process against tensor parallelism), so
# neither load was a no-op (from the initial parameters step 5's loss is about 5.5)
timeout 120 "$build/pdde-run" -n 2 "$build/gpt" "${gpt[@]}" --tp 2 --metrics "$tmp/full.jsonl" >"$tmp/full.log" 2>&1
python3 - "$tmp/full.jsonl" "$tmp/a.jsonl" >"$tmp/cmp" 2>&1 <<'PY'
import json, math, sys
full, a = ({r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r} for p in sys.argv[1:])
assert sorted(a) == [5, 6, 7, 8], sorted(a)
worst = max(abs(a[k] - full[k]) / abs(full[k]) if math.isfinite(a[k]) else math.inf for k in a)
print("worst relative difference %.2g" % worst)
sys.exit(0 if worst <= 1e-6 else 1)
PY
rc=$?
check "the resumed losses are the uninterrupted tp=2 run's ($(cat "$tmp/cmp"))" $rc

# manifests edited with their CRC made right: a dropped block, a doubled block
edit() { # edit DIR PYTHON-EXPR-ON-LINES
    python3 - "$1/manifest" "$2" <<'PY'
import sys, zlib
path, expr = sys.argv[1], sys.argv[2]
lines = open(path).read().split("\n")[:-2]  # without the crc line and the final empty string
lines = eval(expr)
body = "\n".join(lines) + "\n"
open(path, "w").write(body + "crc %08x\n" % (zlib.crc32(body.encode()) & 0xffffffff))
PY
}
cp -r "$tmp/tp" "$tmp/drop"
edit "$tmp/drop" '[l for i, l in enumerate(lines) if i != max(k for k, x in enumerate(lines) if x.startswith("block "))]'
out=$("$ck" verify "$tmp/drop" 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q 'its blocks hold .* of its .* elements'
check "a dropped block: verify says a tensor is not covered ($out)" $?
cp -r "$tmp/tp" "$tmp/dup"
edit "$tmp/dup" 'lines + [[x for x in lines if x.startswith("block ")][0]]'
out=$("$ck" verify "$tmp/dup" 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q 'overlap'
check "a doubled block: verify says blocks overlap ($out)" $?
cp -r "$tmp/tp" "$tmp/dmg"
sed -i 's/^step 4$/step 5/' "$tmp/dmg/manifest"
out=$("$ck" info "$tmp/dmg" 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q 'manifest.*fails its CRC'
check "a damaged manifest fails its CRC ($out)" $?
# shard files without their manifest (a save that did not finish, or the manifest removed): refused as such, not
# taken for an empty directory (a resume would start over and its next save delete them)
cp -r "$tmp/tp" "$tmp/nomanifest" && rm "$tmp/nomanifest/manifest"
out=$("$ck" info "$tmp/nomanifest" 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q 'shard files (the newest s[0-9]*-r\*.shard) but no manifest'
check "shard files without a manifest are refused as such ($out)" $?
out=$("$ck" convert "$tmp/info" "$tmp/x.ckpt" 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q 'not a pdde checkpoint'
check "convert refuses a text file ($out)" $?
out=$("$ck" info "$tmp" 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q 'directory without a manifest'
check "info refuses a directory without a checkpoint ($out)" $?
"$ck" bogus >/dev/null 2>&1
[ $? = 2 ]
check "an unknown command is a usage error (exit 2)" $?
finish
