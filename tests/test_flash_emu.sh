#!/usr/bin/env bash
# The CUDA backend's tensor-core attention (backends/cuda_flash.cuh, cuda_flash2.cuh) on the CPU: tests/flash_emu.cpp
# compiles its device code for the host with mma.sync, ldmatrix, shfl and the barriers emulated after the
# PTX manual, and checks forward, dq, dk and dv against float64 (needs a C++ compiler; no GPU).
# Run from the repository root.
. tests/script_util.sh flash-emu

cxx=${CXX:-c++}
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "SKIP c++: no C++ compiler ($cxx) to build tests/flash_emu.cpp"
    finish
    exit $?
fi
"$cxx" -std=c++17 -O2 -Wall -Wextra -Werror -Wno-unknown-pragmas tests/flash_emu.cpp -o "$tmp/flash_emu" >"$tmp/build.log" 2>&1
rc=$?
check "tests/flash_emu.cpp builds ($(head -3 "$tmp/build.log"))" $rc
if [ $rc = 0 ]; then
    "$tmp/flash_emu" >"$tmp/run.log" 2>&1
    rc=$?
    grep -E '^(ok|FAIL)' "$tmp/run.log"
    line=$(tail -1 "$tmp/run.log")
    n_ok=$(echo "$line" | awk '/passed/ {print $1}'); n_bad=$(echo "$line" | awk '/passed/ {print $3}')
    pass=$((pass + ${n_ok:-0})); fail=$((fail + ${n_bad:-0}))
    [ $rc = 0 ] && [ "${n_ok:-0}" -ge 77 ]
    check "the emulation ran every case ($line, exit $rc)" $?
fi
finish
