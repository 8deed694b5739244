# script_util.sh — the shell tests' harness (test_util.h's for scripts), sourced from the repository root:
# $build (where the test's binaries are), $tmp (a scratch folder removed on exit), check and finish.
# usage: . tests/script_util.sh NAME   (NAME names the scratch folder)
set -u
build=$(dirname "$0")
tmp=$(mktemp -d "/tmp/pdde-$1.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
# check DESCRIPTION STATUS: STATUS 0 passes. Take the status first (rc=$?) when the description holds a
# $(command): the substitution runs before $? is read and resets it, so `check "x ($(tail f))" $?` always passes.
check() { if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
