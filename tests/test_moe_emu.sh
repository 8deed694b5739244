#!/usr/bin/env bash
# The CUDA backend's Mixture-of-Experts kernels (backends/cuda_moe.cuh) on the CPU: tests/moe_emu.cpp
# compiles their device code for the host (a block's threads as fibers, __syncthreads a yield) and checks
# every kernel against a float64 reference and finite differences, with skewed routing and capacity
# drops (needs a C++ compiler; no GPU). Run from the repository root.
. tests/script_util.sh moe-emu

cxx=${CXX:-c++}
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "SKIP c++: no C++ compiler ($cxx) to build tests/moe_emu.cpp"
    finish
    exit $?
fi
"$cxx" -std=c++17 -O2 -Wall -Wextra -Werror -Wno-unknown-pragmas tests/moe_emu.cpp -o "$tmp/moe_emu" >"$tmp/build.log" 2>&1
rc=$?
check "tests/moe_emu.cpp builds ($(head -3 "$tmp/build.log"))" $rc
if [ $rc = 0 ]; then
    "$tmp/moe_emu" >"$tmp/run.log" 2>&1
    rc=$?
    grep -E '^FAIL' "$tmp/run.log"
    line=$(tail -1 "$tmp/run.log")
    n_ok=$(echo "$line" | awk '/passed/ {print $1}'); n_bad=$(echo "$line" | awk '/passed/ {print $3}')
    pass=$((pass + ${n_ok:-0})); fail=$((fail + ${n_bad:-0}))
    [ $rc = 0 ] && [ "${n_ok:-0}" -ge 74 ]
    check "the emulation ran every case ($line, exit $rc)" $?
fi
finish
