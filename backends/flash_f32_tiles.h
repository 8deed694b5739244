/* flash_f32_tiles.h — the launch shape of the CUDA backend's f32 tiled attention (backends/cuda_flash_f32.cuh),
 * in one place for the kernels, the dispatcher (backends/gpu_dispatch.h) and tests/flash_emu.cpp, so that
 * their grids agree: a block of PDDE_FF_THREADS threads takes the rows below of one head. Shared memory
 * stays under the 48 KiB of a static allocation, hence fewer rows at head size 128. */
#ifndef PDDE_FLASH_F32_TILES_H
#define PDDE_FLASH_F32_TILES_H
#define PDDE_FF_THREADS 128
#define PDDE_FF_FWD_ROWS(D) ((D) == 64 ? 64 : 32) /* query rows of a forward block */
#define PDDE_FF_BWD_ROWS(D) ((D) == 64 ? 32 : 16) /* query rows of a dq block, key rows of a dk, dv block */
#endif
