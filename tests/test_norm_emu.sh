#!/usr/bin/env bash
# The CUDA backend's warp-per-row layernorm kernels (backends/cuda_norm.cuh: forward, dx, dgamma's partial sums) on
# the CPU: tests/norm_emu.cpp compiles their device code for the host with the warp shuffles and the barriers
# emulated and checks them against float64 (needs a C++ compiler; no GPU). Run from the repository root.
. tests/script_util.sh norm-emu

. tests/cuda_emu_util.sh
run_emulation tests/norm_emu.cpp 45
finish
