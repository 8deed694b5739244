/* cuda_emu.h — CUDA device code on the CPU, for the emulation tests (flash_emu.cpp, moe_emu.cpp): a
 * block's threads are cooperative fibers (ucontext) that all yield at each __syncthreads (and at each
 * warp-collective step the includer emulates), so a block runs as in lockstep, each round in the other
 * order of threads (a read missing its barrier sees the write late); blocks run one after another over
 * the grid (emu_launch). The CUDA keywords and built-in variables are macros over it. Define
 * EMU_MAX_THREADS (threads a block at most) and EMU_STACK (bytes a thread) before including it, once,
 * after <math.h>, <stdlib.h>, <string.h> and <ucontext.h>. */
#ifndef PDDE_CUDA_EMU_H
#define PDDE_CUDA_EMU_H

struct emu_dim { unsigned x, y, z; };
static ucontext_t emu_main, emu_ctx[EMU_MAX_THREADS];
static int emu_cur, emu_done[EMU_MAX_THREADS];
static char *emu_stacks;
static emu_dim emu_block, emu_grid, emu_bdim;
static void (*emu_body)(void);

static void emu_yield() { swapcontext(&emu_ctx[emu_cur], &emu_main); }
static void emu_entry() {
    emu_body();
    emu_done[emu_cur] = 1;
    swapcontext(&emu_ctx[emu_cur], &emu_main);
}
/* thread t's context, to start at emu_entry (a function of its own: no loop state across getcontext) */
static __attribute__((noinline)) void emu_make_thread(unsigned t) {
    getcontext(&emu_ctx[t]);
    emu_ctx[t].uc_stack.ss_sp = emu_stacks + (size_t)t * EMU_STACK;
    emu_ctx[t].uc_stack.ss_size = EMU_STACK;
    emu_ctx[t].uc_link = &emu_main;
    makecontext(&emu_ctx[t], emu_entry, 0);
    emu_done[t] = 0;
}
/* one block of b threads (the context switches in a function of their own: no loop state across them) */
static __attribute__((noinline)) void emu_run_block(unsigned b) {
    for (unsigned t = 0; t < b; t++) emu_make_thread(t);
    for (int live = 1, round = 0; live; round++) {
        live = 0;
        for (int i = 0; i < (int)b; i++) {
            emu_cur = round % 2 ? (int)b - 1 - i : i;
            if (!emu_done[emu_cur]) swapcontext(&emu_main, &emu_ctx[emu_cur]), live = 1;
        }
    }
}
/* every block of grid g with b threads each (b <= EMU_MAX_THREADS), running body */
static void emu_launch(emu_dim g, unsigned b, void (*body)(void)) {
    if (!emu_stacks) emu_stacks = (char *)malloc((size_t)EMU_MAX_THREADS * EMU_STACK);
    emu_grid = g, emu_bdim = emu_dim{b, 1, 1}, emu_body = body;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) emu_block = emu_dim{x, y, z}, emu_run_block(b);
}
static emu_dim emu_thread() { return emu_dim{(unsigned)emu_cur, 0, 0}; }

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx emu_thread()
#define blockIdx emu_block
#define gridDim emu_grid
#define blockDim emu_bdim
#define __syncthreads() emu_yield()

/* the bit casts CUDA has as intrinsics */
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

/* cuda_kernels.cu's block reductions (warp shuffles there): the threads' values combined, the result to every thread */
static float emu_part[EMU_MAX_THREADS];
static inline float block_sum(float v) {
    emu_part[emu_cur] = v;
    emu_yield();
    float s = 0.0f;
    for (unsigned t = 0; t < blockDim.x; t++) s += emu_part[t];
    emu_yield();
    return s;
}
/* __syncthreads_or: a barrier that also tells every thread whether any thread's p was nonzero */
static inline int __syncthreads_or(int p) {
    emu_part[emu_cur] = p ? 1.0f : 0.0f;
    emu_yield();
    int any = 0;
    for (unsigned t = 0; t < blockDim.x; t++) any |= emu_part[t] != 0.0f;
    emu_yield();
    return any;
}
static inline float block_max(float v) {
    emu_part[emu_cur] = v;
    emu_yield();
    float m = -INFINITY;
    for (unsigned t = 0; t < blockDim.x; t++) m = fmaxf(m, emu_part[t]);
    emu_yield();
    return m;
}

#endif
