#!/usr/bin/env bash
# The CUDA backend's Mixture-of-Experts kernels (backends/cuda_moe.cuh) on the CPU: tests/moe_emu.cpp
# compiles their device code for the host (a block's threads as fibers, __syncthreads a yield) and checks
# every kernel against a float64 reference and finite differences, with skewed routing and capacity
# drops, and the permutation on bf16 rows (needs a C++ compiler; no GPU). Run from the repository root.
. tests/script_util.sh moe-emu

. tests/cuda_emu_util.sh
run_emulation tests/moe_emu.cpp 92
finish
