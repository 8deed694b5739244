#!/usr/bin/env bash
# The conformance suite as a vendor runs it on an out-of-tree backend: test_backend_ops --plugin with
# the toy plugin passes its ops (and counts the ones the toy leaves to the CPU as unsupported, not
# passed); a plugin of another vtable version, an unknown --backend or --op fail with a message and a
# non-zero exit instead of "0 passed"; --help goes to stdout with exit 0. Run from the repository root.
. tests/script_util.sh plugin-ops

"$build/test_backend_ops" --plugin "$build/libpdde_toy.so" >"$tmp/toy.log" 2>&1
rc=$?
check "test_backend_ops --plugin libpdde_toy.so exits 0 ($(tail -2 "$tmp/toy.log"))" $rc
passed=$(awk '/^device [0-9]+: [0-9]+ passed/ {print $3}' "$tmp/toy.log")
unsupported=$(sed -n 's/^device [0-9]*: .* failed, \([0-9]*\) cases of ops it does not run.*/\1/p' "$tmp/toy.log")
[ "${passed:-0}" -ge 10 ] && [ "${unsupported:-0}" -ge 10 ]
check "the toy's ops pass and the others are counted unsupported (passed '$passed', unsupported '$unsupported')" $?

"$build/test_backend_ops" --plugin "$build/libpdde_toy_v99.so" >"$tmp/v99.log" 2>&1
code=$?
[ $code -ne 0 ] && grep -q "api_version 99; this pdde takes 1" "$tmp/v99.log"
rc=$?
check "a plugin of another version is refused, exit $code ($(tail -1 "$tmp/v99.log"))" $rc

"$build/test_backend_ops" --backend nosuchbackend >"$tmp/b.log" 2>&1
code=$?
[ $code -eq 2 ] && grep -q "no such backend" "$tmp/b.log"
rc=$?
check "--backend nosuchbackend exits 2 naming it (exit $code: $(tail -1 "$tmp/b.log"))" $rc

"$build/test_backend_ops" --plugin "$build/libpdde_toy.so" --op nosuchop >"$tmp/o.log" 2>&1
code=$?
[ $code -eq 2 ] && grep -q "no such op" "$tmp/o.log"
rc=$?
check "--op nosuchop exits 2 naming it (exit $code: $(tail -1 "$tmp/o.log"))" $rc

"$build/test_backend_ops" --help >"$tmp/h.out" 2>"$tmp/h.err"
code=$?
[ $code -eq 0 ] && grep -q -- "--plugin" "$tmp/h.out" && [ ! -s "$tmp/h.err" ]
check "--help on stdout, exit 0 (exit $code)" $?

finish
