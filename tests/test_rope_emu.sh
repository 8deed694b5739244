#!/usr/bin/env bash
# The CUDA backend's rope kernel (backends/cuda_rope.cuh: k_rope) on the CPU: tests/rope_emu.cpp compiles its device
# code for the host and checks it against float64 (f32, bf16, f16; forward and inverse) and its bf16 / f16 outputs
# against its f32 output rounded once (needs a C++ compiler; no GPU). Run from the repository root.
. tests/script_util.sh rope-emu

. tests/cuda_emu_util.sh
run_emulation tests/rope_emu.cpp 40
finish
