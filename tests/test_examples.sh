#!/usr/bin/env bash
# The examples are what the READMEs say they are: every example README.md or examples/README.md
# names is a file, examples/README.md lists every example file, and `make` built each program; the
# data-parallel example (examples/mlp_dp.c) trains on 2 processes under pdde-run to the loss of the
# same program on 1 process (within TOL, relative), and the loss fell from ln 3 to below 0.1.
# Run from the repository root: build/test_examples.
. tests/script_util.sh examples
TOL=1e-5   # measured: equal to the last printed digit (9 significant)

# examples/X.c or examples/X.h cited in the READMEs, and `X.c` / `X.h` in the index examples/README.md
listed=$( { cat README.md examples/README.md | grep -oE 'examples/[A-Za-z0-9_]+\.[ch]\b';
            grep -oE '`[A-Za-z0-9_]+\.[ch]`' examples/README.md | tr -d '`' | sed 's|^|examples/|'; } | sort -u)
check "README.md and examples/README.md name examples ($(echo $listed | wc -w))" $([ -n "$listed" ] && echo 0 || echo 1)
for f in $listed; do
    [ -f "$f" ]; check "$f, named in a README, exists" $?
done
for f in examples/*.c examples/*.h; do
    grep -qF "$(basename "$f")" examples/README.md; check "examples/README.md lists $f" $?
    head -n 3 "$f" | grep -q 'Demonstrates how to'; check "$f opens with what it demonstrates" $?
done
# each example program, built by make (the plugin as a shared library; dlrm needs UCX, as pdde-run)
for f in examples/*.c; do
    name=$(basename "$f" .c); bin="$build/$name"
    [ "$name" = toy_backend ] && bin="$build/libpdde_toy.so"
    if [ "$name" = dlrm ] || [ "$name" = mlp_dp ]; then [ -x "$build/pdde-run" ] || continue; fi
    [ -f "$bin" ] && [ ! "$bin" -ot "$f" ]; check "$f is built ($bin)" $?
done

# mlp_dp on 2 ranks against 1
if [ ! -x "$build/pdde-run" ]; then
    echo "SKIP ucx: pdde-run is not built (pdde without UCX): mlp_dp on 2 ranks not run"
    finish; exit
fi
l1= n1= l2= n2=
for n in 1 2; do # rank 0 prints "[0] loss X (N ranks)"
    timeout 60 "$build/pdde-run" -n $n "$build/mlp_dp" >"$tmp/out.$n" 2>&1; rc=$?
    check "pdde-run -n $n build/mlp_dp exits 0 (rc $rc)" $rc
    [ $rc = 0 ] || sed 's/^/    /' "$tmp/out.$n"
done
read -r l1 n1 < <(sed -nE 's/^\[0\] loss ([^ ]+) \(([0-9]+) ranks\)$/\1 \2/p' "$tmp/out.1")
read -r l2 n2 < <(sed -nE 's/^\[0\] loss ([^ ]+) \(([0-9]+) ranks\)$/\1 \2/p' "$tmp/out.2")
check "each run printed its loss and rank count (1: '$l1' on $n1, 2: '$l2' on $n2)" $([ "$n1" = 1 ] && [ "$n2" = 2 ] && echo 0 || echo 1)
finite='^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$'   # (no nan, no inf)
[[ "$l1" =~ $finite ]] && [[ "$l2" =~ $finite ]]
check "the losses are finite numbers" $?
awk -v a="$l1" -v b="$l2" -v tol="$TOL" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a > b ? a : b; exit !(d <= tol * m) }'
check "2 ranks reach 1 rank's loss within $TOL relative ($l2 vs $l1)" $?
awk -v a="$l1" 'BEGIN { exit !(a < 0.1) }'
check "the loss fell from ln 3 = 1.10 to below 0.1 ($l1)" $?
# dlrm refuses a numeric flag it cannot read whole, and --data with --synthetic (which would write over the data)
if [ -x "$build/dlrm" ]; then
    printf 'keep me\n' >"$tmp/mine.tsv"
    "$build/dlrm" --data "$tmp/mine.tsv" --synthetic 3000 >"$tmp/dl.out" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q 'one or the other' "$tmp/dl.out" && [ "$(cat "$tmp/mine.tsv")" = "keep me" ]
    check "dlrm --data F --synthetic N is refused and F is untouched (rc $rc)" $?
    "$build/dlrm" --batch 64x >"$tmp/dl.out" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q -- "--batch wants a whole number, got '64x'" "$tmp/dl.out"
    check "dlrm --batch 64x is refused, naming the flag (rc $rc)" $?
    # every held-out sample is evaluated: 100 of 1000 in batches of 64 (the last one filled up), not 64
    awk 'BEGIN { srand(1); for (i = 0; i < 1000; i++) { printf "%d", rand() < 0.3; for (j = 0; j < 13; j++) printf "\t%d", int(rand() * 10);
                 for (j = 0; j < 26; j++) printf "\t%08x", int(rand() * 50); print "" } }' >"$tmp/criteo.tsv"
    "$build/dlrm" --data "$tmp/criteo.tsv" --batch 64 >"$tmp/dl.out" 2>&1
    rc=$?
    [ $rc = 0 ] && grep -q '900 for training, 100 held out' "$tmp/dl.out" && grep -Eq '^held out \(100 samples\): AUC 0\.[0-9]+  logloss 0\.[0-9]+' "$tmp/dl.out"
    ok=$?
    check "dlrm evaluates all 100 held-out samples in batches of 64 (rc $rc: $(grep -m1 '^held out' "$tmp/dl.out"))" $ok
fi
finish
