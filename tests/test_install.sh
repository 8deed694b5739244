#!/usr/bin/env bash
# pdde as users take it: `make install` into a scratch prefix (and a DESTDIR stage), examples/gpt.c
# built against it with pkg-config alone, run on 2 ranks by the installed pdde-run, `make uninstall`
# leaving nothing behind; and vendored, the five paths copied and compiled as one file. Run from the
# repository root (make test does).
. tests/script_util.sh install

make -s install BUILD="$build" PREFIX="$tmp/usr" >"$tmp/install.log" 2>&1
rc=$?
check "make install PREFIX=$tmp/usr (log: $(tail -3 "$tmp/install.log"))" $rc
readelf -d "$tmp/usr/lib/libpdde.so.0.1.0" 2>/dev/null | grep -q 'SONAME.*libpdde.so.0'
check "libpdde.so.0.1.0 carries SONAME libpdde.so.0" $?
[ -L "$tmp/usr/lib/libpdde.so" ] && [ -L "$tmp/usr/lib/libpdde.so.0" ] && [ -f "$tmp/usr/lib/libpdde.a" ]
check "libpdde.so -> libpdde.so.0 -> libpdde.so.0.1.0 and libpdde.a installed" $?

export PKG_CONFIG_PATH="$tmp/usr/lib/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 $(pkg-config --cflags pdde) examples/gpt.c -o "$tmp/gpt" $(pkg-config --libs pdde) -lm ${PDDE_TEST_SANITIZE:-} 2>"$tmp/cc.log"
rc=$?
check "examples/gpt.c builds with pkg-config --cflags/--libs pdde ($(head -3 "$tmp/cc.log"))" $rc
LD_LIBRARY_PATH="$tmp/usr/lib" ldd "$tmp/gpt" | grep -q "libpdde.so.0 => $tmp/usr/lib/libpdde.so.0"
check "gpt links the installed libpdde.so.0" $?
# shellcheck disable=SC2046
cc -std=c11 $(pkg-config --cflags pdde) examples/gpt.c -o "$tmp/gpt-static" "$tmp/usr/lib/libpdde.a" $(pkg-config --libs-only-l --static pdde | sed 's/-lpdde//') ${PDDE_TEST_SANITIZE:-} 2>"$tmp/cc2.log"
rc=$?
check "examples/gpt.c links statically with pkg-config --static ($(head -3 "$tmp/cc2.log"))" $rc

# A backend plugin built against the installed tree alone (a copy of the toy outside the sources, so
# its backends/op_params.h can only come from the installed headers), loaded by the installed pdde-info.
mkdir -p "$tmp/plugin"
cp examples/toy_backend.c "$tmp/plugin/"
# shellcheck disable=SC2046
cc -std=c11 -fPIC -shared -Wall -Wextra -Werror $(pkg-config --cflags pdde) "$tmp/plugin/toy_backend.c" -o "$tmp/plugin/libpdde_toy.so" 2>"$tmp/plugin.log"
rc=$?
check "the toy plugin (pdde.h, backends/op_params.h) builds with pkg-config --cflags pdde ($(head -3 "$tmp/plugin.log"))" $rc
LD_LIBRARY_PATH="$tmp/usr/lib" PDDE_BACKEND_PLUGINS="$tmp/plugin/libpdde_toy.so" timeout 60 "$tmp/usr/bin/pdde-info" 2>&1 | grep -Eq '^ +toy +available'
check "the installed pdde-info loads that plugin (toy available)" $?

if grep -q PDDE_HAVE_UCX "$tmp/usr/lib/pkgconfig/pdde.pc"; then
    LD_LIBRARY_PATH="$tmp/usr/lib" timeout 120 "$tmp/usr/bin/pdde-run" -n 2 "$tmp/gpt" --dp 2 --steps 4 --val-every 0 \
        --sample-len 0 --threads 1 >"$tmp/run.log" 2>&1
    rc=$?
    check "pdde-run -n 2 gpt --dp 2 from the installed tree exits 0 ($(tail -2 "$tmp/run.log"))" $rc
    first=$(awk '/step +1\/4/ {print $5}' "$tmp/run.log"); last=$(awk '/step +4\/4/ {print $5}' "$tmp/run.log")
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a + 0 == a && b + 0 == b && b < a) }' </dev/null
    check "the 2-rank run's loss falls (step 1: '$first', step 4: '$last')" $?
else
    echo "SKIP: the 2-rank run (this build has no UCX)"
fi

make -s install BUILD="$build" PREFIX=/usr/local DESTDIR="$tmp/stage" >/dev/null 2>&1 &&
    [ -f "$tmp/stage/usr/local/include/pdde.h" ] && grep -q '^prefix=/usr/local$' "$tmp/stage/usr/local/lib/pkgconfig/pdde.pc"
check "make install DESTDIR= stages under DESTDIR with prefix /usr/local in pdde.pc" $?
make -s uninstall BUILD="$build" PREFIX="$tmp/usr" >/dev/null 2>&1 && [ -z "$(find "$tmp/usr" -type f -o -type l)" ]
rc=$?
check "make uninstall removes every installed file ($(find "$tmp/usr" -type f -o -type l | head -3))" $rc

# A build made before a dependency was installed is rebuilt with it: the library of a build without UCX
# (no comm/) is not linked into pdde-run once UCX is found (here: NO_UCX=1 dropped).
flags_build="$tmp/flags-build"
if [ ! -x "$build/pdde-run" ]; then  # (built where UCX is found)
    echo "SKIP rebuild on new flags: this build has no UCX"
else
    make -s BUILD="$flags_build" OPT=-O0 NO_UCX=1 "$flags_build/libpdde.a" >"$tmp/flags.log" 2>&1 &&
        make -s BUILD="$flags_build" OPT=-O0 "$flags_build/pdde-run" >>"$tmp/flags.log" 2>&1
    rc=$?
    check "a library built with NO_UCX=1 is compiled again when UCX is used, and pdde-run links ($(grep -m2 'error' "$tmp/flags.log"))" $rc
fi

# Vendoring: the seven paths copied into a project compile as one file with no flags, with gcc and clang
# in C99 and C11, and link with -lm -ldl -pthread only (the optional libraries are then left out).
mkdir -p "$tmp/vendor"
cp -r pdde.h pdde_extension.h pdde.c core backends comm planner "$tmp/vendor/"
for cc in gcc clang; do
    command -v "$cc" >/dev/null || { echo "SKIP $cc: not installed"; continue; }
    for std in "" -std=c99 -std=c11; do
        (cd "$tmp/vendor" && "$cc" $std -c pdde.c -o pdde.o) >"$tmp/vendor.log" 2>&1
        rc=$?
        check "vendored: $cc $std -c pdde.c alone ($(head -2 "$tmp/vendor.log"))" $rc
    done
    for header in pdde.h pdde_extension.h; do
        printf '#include "%s"\nint main(void) { return pdde_status_str(PDDE_OK) == 0; }\n' "$header" >"$tmp/vendor/h.c"
        for std in -std=c99 -std=c11; do
            "$cc" $std -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$tmp/vendor" "$tmp/vendor/h.c" >"$tmp/vendor.log" 2>&1
            rc=$?
            check "$header is clean under $cc $std -pedantic -Wall -Wextra ($(head -2 "$tmp/vendor.log"))" $rc
        done
    done
done
(cd "$tmp/vendor" && gcc -c pdde.c -o pdde.o && gcc -I. "$OLDPWD/examples/mlp.c" pdde.o -o mlp -lm -ldl -pthread && ./mlp) >"$tmp/mlp.log" 2>&1
rc=$?
check "examples/mlp.c links against the vendored pdde.o with -lm -ldl -pthread and trains ($(tail -1 "$tmp/mlp.log"))" $rc

# A copy without comm/ (and without the GPU backends) still links a program that calls them: the
# calls say PDDE_ERR_UNAVAILABLE with a message, and pdde_features() says what the build has.
mkdir -p "$tmp/nocomm"
cp -r pdde.h pdde_extension.h pdde.c core backends planner "$tmp/nocomm/"
cat >"$tmp/nocomm/main.c" <<'EOF'
#include "pdde.h"
#include <stdio.h>
#include <string.h>
int main(void) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) return 10;
    uint32_t f = pdde_features();
    pdde_comm *comm = (pdde_comm *)1;
    pdde_status st = pdde_comm_init(ctx, NULL, &comm);
    int ok = st == PDDE_ERR_UNAVAILABLE && comm == NULL && strstr(pdde_last_error(ctx), "pdde_comm_init") &&
             strstr(pdde_last_error(ctx), "without communication");
    pdde_store *store;
    ok = ok && pdde_store_connect(ctx, "127.0.0.1:1", 1, &store) == PDDE_ERR_UNAVAILABLE;
    printf("features:");
    for (int i = 0; i < PDDE_FEATURE_COUNT; i++) if (f & 1u << i) printf(" %s", pdde_feature_name(1u << i));
    printf("\ncomm_init: %s: %s\n", pdde_status_str(st), pdde_last_error(ctx));
    pdde_context_free(ctx);
    return !(ok && !(f & PDDE_FEATURE_COMM) && !(f & PDDE_FEATURE_OPENCL) && !(f & PDDE_FEATURE_CUDA) && (f & PDDE_FEATURE_LEVEL_ZERO));
}
EOF
(cd "$tmp/nocomm" && gcc -std=c99 -DPDDE_HAVE_UCX -DPDDE_NO_OPENCL -DPDDE_NO_CUDA -c pdde.c -o pdde.o &&
    gcc -std=c99 -I. main.c pdde.o -o main -lm -ldl -pthread && ./main) >"$tmp/nocomm.log" 2>&1
rc=$?
check "a copy without comm/ (PDDE_NO_OPENCL, PDDE_NO_CUDA) links pdde_comm_init, which says unavailable; pdde_features agrees ($(tail -2 "$tmp/nocomm.log"))" $rc

finish
