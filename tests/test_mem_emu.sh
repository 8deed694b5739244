#!/usr/bin/env bash
# The CUDA backend's memory-bound kernels (backends/cuda_mem.cuh: the fused cross-entropy, direct and staged, the
# two-level column sums, AdamW in chunks, by chunks or a few blocks, bias_gelu by rows) on the CPU: tests/mem_emu.cpp
# compiles their device code for the host with the barriers and block reductions emulated and checks them against
# float64, against adamw_element and against k_bias_gelu's elements (needs a C++ compiler; no GPU). Run from
# the repository root.
. tests/script_util.sh mem-emu

. tests/cuda_emu_util.sh
run_emulation tests/mem_emu.cpp 53
finish
