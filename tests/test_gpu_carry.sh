#!/usr/bin/env bash
# tools/gpu-carry.sh: Debian 12's UCX unpacked into a folder that works where the system has none. The
# folder: headers, libraries under their SONAMEs, transport modules, no links, each library's RUNPATH
# $ORIGIN, under 30 MiB. With the system's UCX and libnuma hidden (a private mount namespace: root and
# unshare; else they stay visible and that is said): a UCP program built as the Makefile's UCX_DIR builds
# (-I, -L, -rpath) takes libucp, libucs and libnuma from the folder and opens a worker; ucx_info from the
# folder loads its cma module; the Makefile takes DIR/.gpu-carry/ucx by itself (deps-report: UCX), and
# NO_UCX=1 still leaves UCX out. Needs apt-get download (network); skipped where that fails.
# Run from the repository root (make test does).
. tests/script_util.sh gpu-carry
root=$PWD
carry=$tmp/proj/.gpu-carry
mkdir -p "$tmp/proj"
s=$(date +%s)
if ! bash tools/gpu-carry.sh "$carry" >"$tmp/carry.log" 2>&1; then
    if grep -q "apt-get download failed" "$tmp/carry.log"; then
        echo "SKIP: tools/gpu-carry.sh could not download Debian's packages here: $(tail -1 "$tmp/carry.log")"
        echo "0 passed, 0 failed, 1 skipped"
        exit 0
    fi
    check "tools/gpu-carry.sh $carry (log: $(tail -3 "$tmp/carry.log"))" 1
    finish
    exit
fi
echo "$(tail -2 "$tmp/carry.log" | head -1) ($(($(date +%s) - s)) s)"
u=$carry/ucx
[ -f "$u/include/ucp/api/ucp.h" ] && [ -f "$u/lib/libucp.so.0" ] && [ -f "$u/lib/libnuma.so.1" ] &&
    [ -f "$u/lib/ucx/libuct_cma.so.0" ] && [ -x "$u/bin/ucx_info" ] && grep -q 'INPUT(libucp.so.0)' "$u/lib/libucp.so"
check "the folder holds the headers, libucp.so.0, libnuma.so.1, the cma module, ucx_info, libucp.so for -lucp" $?
links=$(find "$carry" -type l | wc -l)
check "no symbolic links in it ($links)" "$links"
kib=$(du -sk "$carry" | awk '{print $1}')
check "under 30 MiB ($kib KiB)" "$([ "$kib" -lt 30720 ] && echo 0 || echo 1)"
bad=$(for f in "$u"/lib/*.so.* "$u"/lib/ucx/*.so.*; do readelf -d "$f" | grep -q 'RUNPATH.*\[\$ORIGIN' || basename "$f"; done)
check "every library's RUNPATH starts with \$ORIGIN (not: $bad)" "$([ -z "$bad" ] && echo 0 || echo 1)"

# the system's UCX and libnuma out of sight for what runs in hide
hidden=0 skipped=0
if unshare -m --propagation private true 2>/dev/null; then
    hidden=1
    mkdir -p "$tmp/empty"
    cat >"$tmp/hide.sh" <<EOF
set -e
for d in /usr/include/ucp /usr/include/uct /usr/include/ucs /usr/include/ucm /usr/lib/x86_64-linux-gnu/ucx; do
    [ -d "\$d" ] && mount --bind "$tmp/empty" "\$d"
done
for f in /usr/lib/x86_64-linux-gnu/lib{ucp,uct,ucs,ucm,ucs_signal,numa}.so.*.* /usr/lib/x86_64-linux-gnu/pkgconfig/ucx*.pc; do
    [ -f "\$f" ] && mount --bind /dev/null "\$f"
done
exec "\$@"
EOF
    hide() { unshare -m --propagation private bash "$tmp/hide.sh" "$@"; }
    hide bash -c '! pkg-config --exists ucx && [ ! -f /usr/include/ucp/api/ucp.h ]'
    check "the system's UCX is hidden in the namespace" $?
else
    echo "SKIP (part): no private mount namespace (needs root): the system's UCX, if any, stays visible"
    skipped=1
    hide() { "$@"; }
fi

cat >"$tmp/ucp.c" <<'EOF'
#include <stdio.h>
#include <ucp/api/ucp.h>
int main(void) {
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_config_t *config;
    ucp_context_h ctx;
    ucp_worker_h worker;
    if (ucp_config_read(NULL, NULL, &config) != UCS_OK) return 1;
    if (ucp_init(&p, config, &ctx) != UCS_OK) return 2;
    ucp_config_release(config);
    if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK) return 3;
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    printf("ucp %s: a worker opened\n", ucp_get_version_string());
    return 0;
}
EOF
hide cc -std=c11 -I"$u/include" "$tmp/ucp.c" -o "$tmp/ucp" -L"$u/lib" -Wl,-rpath,"$u/lib" -lucp -luct -lucs -lucm 2>"$tmp/cc.log"
rc=$?
check "a UCP program builds against the folder (-I, -L, -rpath; $(head -2 "$tmp/cc.log"))" $rc
hide ldd "$tmp/ucp" >"$tmp/ldd.log" 2>&1
for l in libucp.so.0 libucs.so.0 libnuma.so.1; do
    grep -q "$l => $u/lib/$l" "$tmp/ldd.log"
    rc=$?
    check "it takes $l from the folder ($(grep "$l" "$tmp/ldd.log" | tr -s ' \t' ' '))" $rc
done
out=$(hide env -u LD_LIBRARY_PATH "$tmp/ucp" 2>&1)
check "it opens a UCP worker ($out)" $?
hide env -u LD_LIBRARY_PATH "$u/bin/ucx_info" -d >"$tmp/info.log" 2>&1
grep -q 'Transport: cma' "$tmp/info.log"
rc=$?
check "the folder's ucx_info loads the folder's cma module ($(grep -c 'Transport:' "$tmp/info.log") transports)" $rc

# the Makefile: DIR/.gpu-carry/ucx where pkg-config has none; NO_UCX=1 wins
r=$(hide make -s -C "$tmp/proj" -f "$root/Makefile" deps-report 2>&1)
echo "$r" | grep -q '✓UCX'
check "make in a tree with .gpu-carry/ucx builds with UCX ($r)" $?
if [ $hidden = 1 ]; then
    r=$(hide make -s -C "$tmp/proj" -f "$root/Makefile" -p -n deps-report 2>/dev/null | grep '^UCX_DIR :\?=' | head -1)
    [ "$r" = "UCX_DIR := $tmp/proj/.gpu-carry/ucx" ]
    check "... and UCX_DIR is that folder ($r)" $?
fi
r=$(hide make -s -C "$tmp/proj" -f "$root/Makefile" NO_UCX=1 deps-report 2>&1)
echo "$r" | grep -q '✗UCX'
check "make NO_UCX=1 there builds without ($r)" $?
echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]
