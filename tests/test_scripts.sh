#!/usr/bin/env bash
# The shell tests check what they mean to: no `check "... $(command) ..." $?` in tests/*.sh. The
# substitution in the description runs before $? is read and resets it, so such a check reads the
# command's status (mostly 0) and passes whatever the test's command did. Take the status first:
# `rc=$?` then `check "... $(command) ..." $rc`. The check also runs on a planted violation.
# Run from the repository root: build/test_scripts.
. tests/script_util.sh scripts

# Prints FILE:LINE for each check whose description holds a command substitution and whose status is $?.
stale_status() { grep -HnE '^\s*check ".*(\$\(|`).*" \$\?\s*$' "$@" | cut -d: -f1,2; }

n=$(ls tests/*.sh | wc -l)
[ "$n" -ge 20 ]; check "tests/*.sh has the shell tests ($n files)" $?
found=$(stale_status tests/*.sh | tr '\n' ' ')
[ -z "$found" ]; check "no check reads \$? after a command substitution in its description (${found:-none})" $?
# the planted violation is found
printf '%s\n' 'false' 'check "it failed ($(head -1 "$tmp/log"))" $?' >"$tmp/planted.sh"
[ "$(stale_status "$tmp/planted.sh")" = "$tmp/planted.sh:2" ]; check "a planted violation is reported" $?
finish
