#!/usr/bin/env bash
# The CUDA backend's tensor-core attention (backends/cuda_flash.cuh, cuda_flash2.cuh) on the CPU: tests/flash_emu.cpp
# compiles its device code for the host with mma.sync, ldmatrix, shfl and the barriers emulated after the
# PTX manual, and checks forward, dq, dk and dv against float64 (needs a C++ compiler; no GPU).
# Run from the repository root.
. tests/script_util.sh flash-emu

. tests/cuda_emu_util.sh
run_emulation tests/flash_emu.cpp 479
finish
