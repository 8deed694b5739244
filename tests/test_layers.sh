#!/usr/bin/env bash
# The layers call one way (shared/DESIGN.md "Layers"): backends/ at the bottom, then comm/, planner/,
# and pdde.c's core and executor on top. From the sources, comments stripped (no build needed):
#  - a backends/ file calls no function defined in comm/, planner/ or pdde.c;
#  - a comm/ file calls no function defined in planner/ or pdde.c, and includes or calls no comm/ file
#    that comes later in the layer order comm/README.md states;
#  - a planner/ file calls no function defined in comm/ (the planner never communicates) or pdde.c.
# A function belongs to the lowest layer that defines it. Run from the repository root.
. tests/script_util.sh layers

# comm/'s layer order: the file names of the code block under "Layers inside comm/" in its README.
order=$(awk '/^### Layers inside comm\//{s=1} s && /^```/{n++; next} s && n==1 {print $1}' comm/README.md)
check "comm/README.md states a layer order ($(echo $order))" $([ -n "$order" ] && echo 0 || echo 1)
for f in comm/*.c; do
    echo "$order" | grep -qx "$(basename "$f")"
    check "$f has a place in comm/README.md's layer order" $?
done

# Every part without comments (gcc's preprocessor: no include or macro is expanded), under $1.
strip_tree() {
    for f in backends/*.c backends/*.h comm/*.c planner/*.c planner/*.h core/*.c pdde.c; do
        mkdir -p "$1/$(dirname "$f")"
        gcc -fpreprocessed -dD -E -P -x c "$f" >"$1/$f" 2>/dev/null
    done
}

# Prints "ok|bad<TAB>message" per rule and file, for the stripped tree under $1.
layer_rules() {
    (cd "$1" && awk -v order="$(echo $order)" '
    function layer(p) { return p ~ /^backends\// ? 0 : p ~ /^comm\// ? 1 : p ~ /^planner\// ? 2 : 3 }
    BEGIN {
        n_order = split(order, o, " ")
        for (i = 1; i <= n_order; i++) pos["comm/" o[i]] = i
        name_of[0] = "backends/"; name_of[1] = "comm/"; name_of[2] = "planner/"; name_of[3] = "pdde.c"
        may[0, 0] = 1; may[1, 0] = may[1, 1] = 1; may[2, 0] = may[2, 2] = 1; may[3, 0] = may[3, 1] = may[3, 2] = may[3, 3] = 1
    }
    FNR == 1 { files[++nf] = FILENAME }
    {
        line = $0
        if (line ~ /^[ \t]*#[ \t]*include[ \t]*"[a-z_]+\.c"/) {
            inc = line; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
            includes[FILENAME] = includes[FILENAME] " " inc
        }
        gsub(/"([^"\\]|\\.)*"/, "\"\"", line) # string contents are no calls
        # a definition: a line at column 0 that starts with a type and names a function
        if (line ~ /^[A-Za-z_]/ && line !~ /^(typedef|return|#)/ && line !~ /;[ \t]*$/ && match(line, /[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/)) {
            d = substr(line, RSTART, RLENGTH); sub(/[ \t]*\($/, "", d)
            defined_in[FILENAME, d] = 1
            if (!(d in owner) || layer(FILENAME) < layer(owner[d]) || (layer(FILENAME) == 1 && layer(owner[d]) == 1 && pos[FILENAME] < pos[owner[d]])) owner[d] = FILENAME
        }
        rest = line
        while (match(rest, /(^|[^A-Za-z0-9_.>])[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/)) {
            c = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
            sub(/^[^A-Za-z_]/, "", c); sub(/[ \t]*\($/, "", c)
            calls[FILENAME] = calls[FILENAME] " " c
        }
    }
    END {
        for (k = 1; k <= nf; k++) {
            f = files[k]; lf = layer(f); bad = ""; seen_list = ""
            split(calls[f], cs, " ")
            for (i in cs) {
                c = cs[i]
                if (!(c in owner) || defined_in[f, c] || index(seen_list, " " c " ")) continue
                seen_list = seen_list " " c " "
                lo = layer(owner[c])
                if (!may[lf, lo]) bad = bad " " c " (" owner[c] ")"
            }
            what = lf == 0 ? "comm/, planner/ or pdde.c" : lf == 1 ? "planner/ or pdde.c" : lf == 2 ? "comm/ or pdde.c" : ""
            if (lf < 3) print (bad == "" ? "ok" : "bad") "\t" f " calls no function of " what (bad == "" ? "" : ":" bad)
            if (lf != 1 || !(f in pos)) continue
            bad = ""; seen_list = ""
            for (i in cs) {
                c = cs[i]
                if (!(c in owner) || defined_in[f, c] || index(seen_list, " " c " ")) continue
                seen_list = seen_list " " c " "
                if (layer(owner[c]) == 1 && pos[owner[c]] > pos[f]) bad = bad " " c " (" owner[c] ")"
            }
            print (bad == "" ? "ok" : "bad") "\t" f " calls no later comm/ file" (bad == "" ? "" : ":" bad)
            bad = ""; split(includes[f], is, " ")
            for (i in is) if (("comm/" is[i]) in pos && pos["comm/" is[i]] > pos[f]) bad = bad " " is[i]
            print (bad == "" ? "ok" : "bad") "\t" f " includes no later comm/ file" (bad == "" ? "" : ":" bad)
        }
    }' $(find . -type f | sed 's|^\./||' | sort))
}

strip_tree "$tmp/src"
while IFS=$'\t' read -r verdict msg; do
    check "$msg" $([ "$verdict" = ok ] && echo 0 || echo 1)
done < <(layer_rules "$tmp/src")

# The rules catch what they are for: planted in a copy, an earlier comm/ file calling a later one's
# function, comm/auth.c including store.c, a planner file calling the executor, a backend calling the
# planner. Each must be reported.
cp -r "$tmp/src" "$tmp/bad"
printf 'static void planted_a(void) { pdde_comm_allreduce(0, 0, 0, 0, 0, 0); }\n' >>"$tmp/bad/comm/util.c"
printf '#include "store.c"\n' >>"$tmp/bad/comm/auth.c"
printf 'static void planted_b(void) { pdde_session_run(0, 0); }\n' >>"$tmp/bad/planner/mesh.c"
printf 'static void planted_c(void) { program_lower(0, 0, 0, 0, 0); }\n' >>"$tmp/bad/backends/cpu.c"
found=$(layer_rules "$tmp/bad" | grep '^bad')
for want in "comm/util.c calls no later comm/ file: pdde_comm_allreduce" "comm/auth.c includes no later comm/ file: store.c" \
            "planner/mesh.c calls no function of comm/ or pdde.c: pdde_session_run" \
            "backends/cpu.c calls no function of comm/, planner/ or pdde.c: program_lower"; do
    echo "$found" | grep -qF "$want"
    check "a planted violation is reported: $want" $?
done
finish
