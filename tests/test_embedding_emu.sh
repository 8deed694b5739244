#!/usr/bin/env bash
# The CUDA backend's reproducible embedding backward (backends/cuda_embedding.cuh) on the CPU:
# tests/embedding_emu.cpp compiles its device code for the host (a block's threads as fibers, __syncthreads a
# yield) and checks the sorted keys (one block's network, the radix sort over many blocks) and the gradient
# against the CPU backend's sum order, bit for bit (needs a C++ compiler; no GPU). Run from the repository root.
. tests/script_util.sh embedding-emu

. tests/cuda_emu_util.sh
run_emulation tests/embedding_emu.cpp 37
finish
