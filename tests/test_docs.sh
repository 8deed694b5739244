#!/usr/bin/env bash
# The documentation says what is true of this tree (no build needed; run from the repository root):
#  - every repository path a README cites in backticks (`comm/README.md`, `tests/test_*.c`) exists;
#  - the README's C program is examples/mlp.c, byte for byte (the file `make` builds);
#  - every pdde_ name the README uses is declared in the public headers;
#  - every public function that allocates an object (returns it through `T **out`, or returns a new
#    `T *` from an _init/_open/_create/_connect/_load) has a destructor: a _free or _close taking `T *`;
#  - no README and no public header refers to project history or to files outside the repository;
#  - every --flag a README gives one of the tools (in a command, or a backticked `gpt --flag ...`) is in
#    that tool's --help (this check needs the tools built; it says SKIP without them);
#  - every PDDE_ name a README gives (an environment variable, a constant) is in the code, comments
#    removed: a variable no code reads, or a misspelt one, is reported.
# Each check is also run on a copy with a planted violation, which it must report.
. tests/script_util.sh docs

# The READMEs: the front page and each folder's.
docs() { (cd "$1" && ls README.md */README.md */*/README.md tools/bench/*.md 2>/dev/null); }

# Prints "FILE: PATH" for each backticked repository path in FILE (under root $1) that does not exist.
# A path is a word inside backticks whose first component is a folder of the repository (build/ is
# made by make and not checked); it may be relative to the root or to FILE's folder; globs must match.
missing_paths() {
    local root=$1 file=$2 dirs
    dirs=$(cd "$root" && find . -mindepth 1 -maxdepth 1 -type d ! -name build ! -name '.*' | sed 's|^\./||' | paste -sd'|')
    # inline code only: fenced blocks are commands and programs, not citations
    awk '/^```/ { fence = !fence; next } !fence' "$root/$file" |
        grep -oE '`[^`]+`' | tr -d '`' | tr ' (),;' '\n\n\n\n\n' | sed -E 's/[:.]+$//' |
        grep -E "^($dirs)(/[A-Za-z0-9_.*-]+)*/?$" | sort -u |
        while read -r p; do
            ( cd "$root" && compgen -G "$p" >/dev/null ) || ( cd "$root/$(dirname "$file")" && compgen -G "$p" >/dev/null ) ||
                echo "$file: $p"
        done
}

# The ```c blocks of a markdown file, each as a file $2.N (N from 1).
c_blocks() {
    awk -v out="$2" '/^```c$/ { n++; f = out "." n; printf "" > f; inb = 1; next }
                     inb && /^```$/ { inb = 0; close(f); next } inb { print > f }' "$1"
}
# 0 when one of README.md's C blocks is examples/mlp.c byte for byte.
readme_example_is_mlp() {
    local root=$1 d
    d=$(mktemp -d "$tmp/blocks.XXXX")
    c_blocks "$root/README.md" "$d/block"
    for b in "$d"/block.*; do [ -f "$b" ] && cmp -s "$b" "$root/examples/mlp.c" && return 0; done
    return 1
}

# The public headers' declarations, one a line, comments and directives removed.
declarations() {
    for h in "$1/pdde.h" "$1/pdde_extension.h"; do [ -f "$h" ] && gcc -fpreprocessed -E -P -x c "$h" 2>/dev/null; done |
        grep -v '^[[:space:]]*#' | tr '\n' ' ' | tr ';{}' '\n\n\n' | sed -E 's/[[:space:]]+/ /g; s/^ //' |
        grep -E '^[A-Za-z_][A-Za-z0-9_ ]*[ *]pdde_[a-z0-9_]+ ?\([^()]*\) ?$'
}

# Allocators that rightly have no destructor of their own ("function type"): the tensors pdde_split
# and pdde_sparse_embedding_init return belong to the graph and are freed with it (pdde_graph_free); a
# background checkpoint writer ends with pdde_checkpoint_writer_finish, which frees it and returns the
# save's outcome (a destructor that can fail, so it is not called _free).
ALLOC_EXCEPTIONS="pdde_split pdde_tensor
pdde_sparse_embedding_init pdde_tensor
pdde_checkpoint_writer_start pdde_checkpoint_writer
pdde_checkpoint_writer_start_snapshot pdde_checkpoint_writer"

# Prints "FUNCTION allocates TYPE with no _free/_close" for each allocator without a destructor.
unpaired_allocators() {
    declarations "$1" | awk -v exceptions="$ALLOC_EXCEPTIONS" '
    BEGIN { n = split(exceptions, ex, "\n"); for (i = 1; i <= n; i++) excused[ex[i]] = 1 }
    {
        match($0, /pdde_[a-z0-9_]+ ?\(/); name = substr($0, RSTART, RLENGTH); sub(/ ?\($/, "", name)
        ret = substr($0, 1, RSTART - 1); params = substr($0, RSTART + RLENGTH); sub(/\) ?$/, "", params)
        np = split(params, ps, ",")
        if (name ~ /_(free|close)$/) {
            p = ps[1]; sub(/^ ?(const )?/, "", p)
            if (match(p, /^pdde_[a-z0-9_]+ ?\*/)) { t = substr(p, 1, RLENGTH); sub(/ ?\*$/, "", t); freed[t] = 1 }
            next
        }
        for (i = 1; i <= np; i++) {
            p = ps[i]; sub(/^ /, "", p)
            if (p ~ /^pdde_[a-z0-9_]+ ?\*\* ?[a-z_0-9]*$/) { t = p; sub(/ ?\*\*.*/, "", t); alloc[name " " t] = 1 }
        }
        if (ret ~ /^pdde_[a-z0-9_]+ ?\* ?$/ && name ~ /_(init|open|create|connect|load)$/) {
            t = ret; sub(/ ?\* ?$/, "", t); alloc[name " " t] = 1
        }
    }
    END { for (k in alloc) { split(k, f, " "); if (!freed[f[2]] && !excused[k]) print f[1] " allocates " f[2] " with no _free/_close" } }' | sort
}

# Prints each lowercase pdde_ name in README.md that no public header declares or mentions.
undeclared_names() {
    local root=$1 known
    known=$(cat "$root/pdde.h" "$root"/pdde_extension.h 2>/dev/null | grep -oE '\bpdde_[a-z0-9_]+' | sort -u)
    grep -oE '\bpdde_[a-z0-9_]*[a-z0-9]\b' "$root/README.md" | sort -u | grep -vxF -f <(echo "$known")
}

# Prints "FILE:LINE: text" for references to project history or to files outside the repository.
history_refs() {
    local root=$1; shift
    (cd "$root" && grep -nHiE 'shared/DESIGN|\.\./shared|DESIGN\.md|\bstop [0-9]+|\bissue [0-9]+|this stop|\bengineers\b' "$@" 2>/dev/null)
}
HISTORY_FILES="$(docs .) pdde.h $( [ -f pdde_extension.h ] && echo pdde_extension.h)"

# The tools whose flags the READMEs give, each answering --help without running anything.
DOC_TOOLS="gpt dlrm pdde-run pdde-plan pdde-bench pdde-ckpt pdde-plot pdde-info"

# Prints "FILE TOOL --flag" for every flag FILE (under root $1) gives one of DOC_TOOLS: in the lines of its
# fenced blocks and in its backticked spans, a flag belongs to the last tool named before it (./build/gpt,
# build/gpt or gpt) until another program (a path that is no flag's value), `&&`, `;` or `|`, or a `#`
# comment in a fenced line. In README.md a span that starts with a flag gives it to "any" of the tools.
tool_flags() {
    local root=$1 file=$2
    { awk '/^```/ { fence = !fence; next } fence { sub(/(^| )#.*/, ""); print }' "$root/$file"
      awk '/^```/ { fence = !fence; next } !fence' "$root/$file" | grep -oE '`[^`]+`' | tr -d '`'; } |
        awk -v file="$file" -v tools="$DOC_TOOLS" '
        BEGIN { n = split(tools, t, " "); for (i = 1; i <= n; i++) tool[t[i]] = 1 }
        {
            cur = (file == "README.md" && $1 ~ /^--[a-z]/) ? "any" : ""
            for (i = 1; i <= NF; i++) {
                w = $i; base = w; sub(/.*\//, "", base)
                if (w ~ /^(&&|;|\||\|\|)$/) cur = ""
                else if (tool[base] && (w == base || w ~ /(^|\/)build\/[a-z-]+$/)) cur = base
                else if (w ~ /\// && w !~ /^-/ && w !~ /=/ && (i == 1 || $(i - 1) !~ /^--/)) cur = ""   # ./prog, ./build/mlp_dp
                else if (cur != "" && w ~ /^--[a-z][a-z0-9-]*/) { f = w; sub(/[^a-z0-9-].*$/, "", f); if (f != "--help") print file, cur, f }
            }
        }' | sort -u
}

# 0 when the help text in file $2 lists flag $1 (whole: --zero is not --zero-stage).
help_lists() { grep -qE -- "(^|[^a-z0-9-])$1([^a-z0-9-]|\$)" "$2"; }

# Prints "FILE: TOOL has no --flag" for each flag of tool_flags that the tool in $2 does not list in its --help.
unknown_tool_flags() {
    local root=$1 bin=$2 f file tool flag
    for f in $(docs "$root"); do tool_flags "$root" "$f"; done | while read -r file tool flag; do
        [ -f "$tmp/help.$tool" ] || if [ "$tool" = any ]; then for t in $DOC_TOOLS; do "$bin/$t" --help 2>&1; done; else "$bin/$tool" --help 2>&1; fi >"$tmp/help.$tool"
        help_lists "$flag" "$tmp/help.$tool" || echo "$file: $tool has no $flag"
    done
}

# The code of the tree: C and CUDA sources with their comments removed, scripts without comment lines
# (not this test's, whose planted violations name what no code reads).
code_text() {
    local root=$1 f
    (cd "$root" && find . -path ./build -prune -o -path ./tests/mutants -prune -o -path ./.git -prune -o -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print) | while read -r f; do
        gcc -fpreprocessed -dD -E -P -x c "$root/$f" 2>/dev/null
    done
    (cd "$root" && find . -path ./build -prune -o -path ./tests/mutants -prune -o -path ./.git -prune -o -type f \
        \( -name '*.sh' -o -name '*.py' -o -name Makefile \) ! -name test_docs.sh -print) | while read -r f; do
        grep -vE '^[[:space:]]*#' "$root/$f"
    done
}

# Prints "FILE: NAME" for each PDDE_ name in a README that the code (code_text) does not contain, whole
# or as a backend's prefix literal ("PDDE_CUDA_") followed by a suffix literal ("CE1") it joins.
unknown_pdde_names() {
    local root=$1 names code prefixes f n p ok
    code_text "$root" >"$tmp/code.txt"
    names=$(grep -ohE '\bPDDE_[A-Z0-9_]*[A-Z0-9]\b' "$tmp/code.txt" | sort -u)
    prefixes=$(grep -ohE '"PDDE_[A-Z0-9_]*_"' "$tmp/code.txt" | tr -d '"' | sort -u)
    for f in $(docs "$root"); do
        grep -oE '\bPDDE_[A-Z0-9_]*[A-Z0-9]\b' "$root/$f" | sort -u | grep -vxF -f <(echo "$names") |
            while read -r n; do
                ok=1
                for p in $prefixes; do
                    [[ "$n" == "$p"?* ]] && grep -qF "\"${n#"$p"}\"" "$tmp/code.txt" && ok=0
                done
                [ $ok = 0 ] || echo "$f: $n"
            done
    done
}

# --- the checks on this tree
for f in $(docs .); do
    bad=$(missing_paths . "$f")
    check "$f cites only paths that exist${bad:+: $(echo $bad)}" $([ -z "$bad" ] && echo 0 || echo 1)
done
readme_example_is_mlp .
check "README.md's C program is examples/mlp.c, byte for byte" $?
bad=$(undeclared_names .)
check "every pdde_ name in README.md is in the public headers${bad:+: $(echo $bad)}" $([ -z "$bad" ] && echo 0 || echo 1)
bad=$(unpaired_allocators .)
check "every public allocator has a _free/_close${bad:+: $bad}" $([ -z "$bad" ] && echo 0 || echo 1)
n=$(declarations . | wc -l)
check "the public declarations were read ($n functions)" $([ "$n" -gt 100 ] && echo 0 || echo 1)
bad=$(history_refs . $HISTORY_FILES)
check "no history or outside references in the READMEs and public headers${bad:+: $bad}" $([ -z "$bad" ] && echo 0 || echo 1)
if [ -x $build/gpt ] && [ -x $build/dlrm ] && [ -x $build/pdde-run ] && [ -x $build/pdde-plan ] && [ -x $build/pdde-bench ] &&
   [ -x $build/pdde-ckpt ] && [ -x $build/pdde-plot ] && [ -x $build/pdde-info ]; then
    bad=$(unknown_tool_flags . "$build")
    n=$(for f in $(docs .); do tool_flags . "$f"; done | wc -l)
    check "every flag the READMEs give a tool is in its --help ($n flags)${bad:+: $bad}" $([ -z "$bad" ] && [ "$n" -gt 100 ] && echo 0 || echo 1)
else
    echo "SKIP build: no tools beside this script in $build/ (make all, then run build/test_docs): the READMEs' flags not checked"
fi
bad=$(unknown_pdde_names .)
check "every PDDE_ name in the READMEs is in the code${bad:+: $(echo $bad)}" $([ -z "$bad" ] && echo 0 || echo 1)

# --- planted violations, each in a copy of the tree (no build/), must be reported
mkdir -p "$tmp/bad"
tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$tmp/bad"
printf '\nThe scheduler lives in `core/no_such_file.c`; see `tests/no_such_test_*.c`.\n' >>"$tmp/bad/tests/README.md"
bad=$(missing_paths "$tmp/bad" tests/README.md)
echo "$bad" | grep -qxF "tests/README.md: core/no_such_file.c" && echo "$bad" | grep -qxF "tests/README.md: tests/no_such_test_*.c"
check "a planted violation is reported: a README cites a file that does not exist" $?
printf '/* a line the README does not have */\n' >>"$tmp/bad/examples/mlp.c"
readme_example_is_mlp "$tmp/bad"
check "a planted violation is reported: examples/mlp.c no longer matches the README's block" $([ $? != 0 ] && echo 0 || echo 1)
printf '\nCall `pdde_no_such_call()` first.\n' >>"$tmp/bad/README.md"
undeclared_names "$tmp/bad" | grep -qx pdde_no_such_call
check "a planted violation is reported: the README names a function no header declares" $?
printf '\ntypedef struct pdde_planted pdde_planted;\npdde_status pdde_planted_init(pdde_context *ctx,\n    pdde_planted **out);\npdde_widget *pdde_widget_open(const char *path);\ntypedef struct pdde_widget pdde_widget;\n' >>"$tmp/bad/pdde.h"
bad=$(unpaired_allocators "$tmp/bad")
echo "$bad" | grep -qx "pdde_planted_init allocates pdde_planted with no _free/_close" && echo "$bad" | grep -qx "pdde_widget_open allocates pdde_widget with no _free/_close"
check "a planted violation is reported: an allocator without a destructor (through **out and returned)" $?
printf '\nvoid pdde_planted_free(pdde_planted *p);\nvoid pdde_widget_close(pdde_widget *w);\n' >>"$tmp/bad/pdde.h"
bad=$(unpaired_allocators "$tmp/bad")
check "and its destructor satisfies the check" $([ -z "$bad" ] && echo 0 || echo 1)
printf '\nAs decided in stop 12 (see ../shared/DESIGN.md), for issue 7.\n' >>"$tmp/bad/tests/README.md"
printf '/* see shared/DESIGN.md "Layers" */\n' >>"$tmp/bad/pdde.h"
bad=$(history_refs "$tmp/bad" tests/README.md pdde.h)
[ "$(echo "$bad" | grep -c 'tests/README.md')" -ge 1 ] && echo "$bad" | grep -q '^pdde.h:'
check "a planted violation is reported: history and outside references in a README and the header" $?
mkdir -p "$tmp/bad/planted"
printf '\nRun `gpt --steps 5 --no-such-flag` or:\n\n```sh\n./build/pdde-run -n 2 ./build/gpt --dp 2 --cluster build/c.json --zero-stage 1 ./prog --not-ours  # --in-a-comment\n```\n' >"$tmp/bad/planted/README.md"
tool_flags "$tmp/bad" planted/README.md >"$tmp/flags.out"
[ "$(cat "$tmp/flags.out")" = "$(printf 'planted/README.md gpt --%s\n' cluster dp no-such-flag steps zero-stage)" ]
check "a planted violation is found: flags given to gpt in a command (also past a path value) and in a backticked span, not those of ./prog or a comment" $?
printf 'usage: gpt [--steps N] [--dp N] [--zero 0-3] [--cluster FILE]\n' >"$tmp/planted_help.gpt"
bad=$(tool_flags "$tmp/bad" planted/README.md | while read -r file tool flag; do
          help_lists "$flag" "$tmp/planted_help.gpt" || echo "$tool has no $flag"; done)
[ "$bad" = "$(printf 'gpt has no --no-such-flag\ngpt has no --zero-stage')" ]
ok=$?
check "and each flag the tool's --help lacks is reported (--zero-stage is not --zero)${bad:+: $(echo $bad)}" $ok
printf '\nTokens past `--moe-capacity-typo` are dropped.\n' >>"$tmp/bad/README.md"
tool_flags "$tmp/bad" README.md | grep -qx 'README.md any --moe-capacity-typo'
check "a planted violation is found: a span of README.md that starts with a flag, for every tool's --help" $?
printf '\nSet `PDDE_NO_SUCH_SWITCH=1`, `PDDE_ONLY_IN_A_COMMENT=1` or `PDDE_COMM_TIMEOUT=60`; `PDDE_CUDA_CE1=1`.\n' >>"$tmp/bad/comm/README.md"
printf '/* PDDE_ONLY_IN_A_COMMENT: a name no code reads */\n' >>"$tmp/bad/pdde.h"
bad=$(unknown_pdde_names "$tmp/bad")
[ "$(echo "$bad" | grep '^comm/README.md:')" = "$(printf 'comm/README.md: PDDE_NO_SUCH_SWITCH\ncomm/README.md: PDDE_ONLY_IN_A_COMMENT')" ]
ok=$?
check "a planted violation is reported: a README names PDDE_ variables no code reads (one only in a comment)${bad:+: $(echo $bad)}" $ok
finish
