/* emu_checks.h — the checks the CUDA emulation tests share (mem_emu.cpp, norm_emu.cpp, moe_emu.cpp): a pass/fail
 * count, inputs from one xorshift stream, f32 / f16 / bf16 element reads and 16-byte aligned buffers. Include after
 * backends/cuda_convert.cuh (bf16_to_f32, f16_to_f32). */
#ifndef PDDE_EMU_CHECKS_H
#define PDDE_EMU_CHECKS_H

static int n_pass, n_fail;
static inline void check(bool ok, const char *what, double err) {
    ok ? n_pass++ : n_fail++;
    printf("%s %s (error %.3g)\n", ok ? "ok  " : "FAIL", what, err);
}
static uint64_t rng = 88172645463325252ull;
static inline float frand() { /* [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
/* element i of an array of dtype dt (0 f32, 1 f16, 2 bf16), and the dtype's name */
static inline float load_dt(const void *p, long long i, int dt) {
    return dt == 2 ? bf16_to_f32(((const unsigned short *)p)[i]) : dt == 1 ? f16_to_f32(((const unsigned short *)p)[i]) : ((const float *)p)[i];
}
static inline const char *dt_name(int dt) { return dt == 2 ? "bf16" : dt == 1 ? "f16" : "f32"; }
/* n bytes or more, 16-byte aligned (aligned_alloc's size a multiple of the alignment, as C11 asks) */
static inline void *alloc16(size_t n) { return aligned_alloc(16, (n + 15) / 16 * 16); }

#endif
