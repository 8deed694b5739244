#!/usr/bin/env bash
# The tracked generated headers (backends/cuda_kernels_ptx.h from the CUDA sources, backends/gpu_kernels_spv.h
# from gpu_kernels.cl) are made from today's sources: `make check-generated` says so, and on a copy where one
# source has a line more it fails naming that header (no nvcc or clang needed: the headers carry a stamp of
# their sources). Run from the repository root: build/test_generated.
. tests/script_util.sh generated
make -s --no-print-directory check-generated >"$tmp/now.log" 2>&1
rc=$?
check "make check-generated: $(tail -1 "$tmp/now.log") (rc $rc)" $rc
for changed in backends/gpu_kernels.cl:backends/gpu_kernels_spv.h backends/cuda_flash2.cuh:backends/cuda_kernels_ptx.h; do
    src=${changed%%:*} header=${changed#*:}
    rm -rf "$tmp/copy" && mkdir -p "$tmp/copy/backends" && cp Makefile "$tmp/copy/" && cp backends/* "$tmp/copy/backends/" 2>/dev/null
    echo "// one line more" >>"$tmp/copy/$src"
    make -s --no-print-directory -C "$tmp/copy" check-generated >"$tmp/stale.log" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -qF "check-generated: $header is not made from today's sources" "$tmp/stale.log"
    ok=$?
    check "a line more in $src: check-generated names $header (rc $rc: $(head -1 "$tmp/stale.log" | cut -c1-120))" $ok
done
finish
