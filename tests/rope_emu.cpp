/* rope_emu.cpp — the CUDA backend's rope kernel (backends/cuda_rope.cuh, k_rope) run on the CPU.
 *
 * The device code is compiled for the host (tests/cuda_emu.h: a block's threads are fibers; k_rope has no barrier),
 * with the pairs' inverse frequencies computed as backends/gpu_dispatch.h computes them. Checked against a float64
 * reference of the op's definition (the angle t * inv rounded to f32, as the op defines it; its cosine, sine and the
 * rotation in double): x [B, T, H, D] of f32, bf16 and f16, forward and inverse (the backward), T not a multiple of
 * anything, D 2 to 256 (the angle table's widest), bases 10000 and 500000, grids that stride over the pairs and grids
 * of an item a pair; every element written; the bf16 / f16 outputs the f32 kernel's rounded once (bit for bit). Only
 * the 32-bit index path runs here (the 64-bit one needs 2^30 pairs). It cannot see what only a GPU shows (timing,
 * coalescing, the device's cosf / sinf).
 *
 * Built and run by tests/test_rope_emu.sh; prints "N passed, N failed" last. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define EMU_MAX_THREADS 256
#define EMU_STACK (1 << 15)
#include "cuda_emu.h"

/* ---- what cuda_rope.cuh takes from CUDA and from cuda_kernels.cu ------------------------------ */

static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
static float __fmul_rn(float a, float b) { return a * b; }
#define SMALL_INDEX(limit) ((unsigned long long)(limit) < 2147483648ULL)
enum { DT_F32 = 0, DT_F16, DT_BF16 };

#include "../backends/cuda_convert.cuh"

#include "../backends/cuda_rope.cuh"

/* ---- checks --------------------------------------------------------------------------------- */

#include "emu_checks.h"

static struct {
    const void *x;
    void *y;
    long long pairs, T, H, half_d;
    pdde_cu_rope_freqs f;
    float sign;
    int dt;
} A;
static void run_rope() { k_rope(A.x, A.y, A.pairs, A.T, A.H, A.half_d, A.f, A.sign, A.dt); }

/* k_rope on x (n elements of dtype dt) into y, grid blocks of 256 (0: an item a pair) */
static void launch(const void *x, void *y, const long long *s, float base, int inverse, int dt, unsigned grid) {
    long long D = s[3], half = D / 2, n = s[0] * s[1] * s[2] * D;
    memset(&A.f, 0, sizeof A.f);
    for (long long i = 0; i < half; i++) A.f.inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)D); /* (gpu_dispatch.h's) */
    A.x = x, A.y = y, A.pairs = n / 2, A.T = s[1], A.H = s[2], A.half_d = half, A.sign = inverse ? -1.0f : 1.0f, A.dt = dt;
    unsigned items = grid ? grid : (unsigned)((n / 2 + 255) / 256);
    emu_launch(emu_dim{items, 1, 1}, 256, run_rope);
}

static void one_case(const long long *s, float base, int inverse, int dt, unsigned grid) {
    long long B = s[0], T = s[1], H = s[2], D = s[3], half = D / 2, n = B * T * H * D;
    size_t es = dt ? 2 : 4;
    void *x = alloc16((size_t)n * es), *y = alloc16((size_t)n * es), *y32 = alloc16((size_t)n * 4);
    float *x32 = (float *)alloc16((size_t)n * 4);
    for (long long i = 0; i < n; i++) { /* (x of dtype dt; x32 its values, exactly) */
        float v = frand() * 2.0f;
        if (dt == DT_BF16) ((unsigned short *)x)[i] = f32_to_bf16(v);
        else if (dt == DT_F16) ((unsigned short *)x)[i] = f32_to_f16(v);
        else ((float *)x)[i] = v;
        x32[i] = load_dt(x, i, dt);
    }
    for (long long i = 0; i < n; i++) store_out(y, i, NAN, dt);
    launch(x, y, s, base, inverse, dt, grid);
    double num = 0, den = 0;
    for (long long r = 0; r < B * T * H; r++)
        for (long long i = 0; i < half; i++) {
            float a = (float)((r / H) % T) * (1.0f / powf(base, (float)(2 * i) / (float)D));
            double c = cos((double)a), sn = (inverse ? -1.0 : 1.0) * sin((double)a);
            long long e = r * D + i, e2 = e + half;
            double r0 = x32[e] * c - x32[e2] * sn, r1 = x32[e2] * c + x32[e] * sn, d0 = load_dt(y, e, dt) - r0, d1 = load_dt(y, e2, dt) - r1;
            num += d0 * d0 + d1 * d1, den += r0 * r0 + r1 * r1;
        }
    /* f32: a few units of roundoff an element (NMSE near 1e-14); bf16 / f16: the output's rounding, at most (2^-8)^2 / (2^-11)^2 */
    double e = isnan(num) ? INFINITY : num / den, u = dt == DT_BF16 ? 0x1p-8 : dt == DT_F16 ? 0x1p-11 : 0, tol = u ? u * u : 1e-12;
    char what[160];
    snprintf(what, sizeof what, "k_rope %s [%lld,%lld,%lld,%lld] base %g%s, %s grid: NMSE against float64 within %.3g", dt_name(dt), B, T, H, D,
             base, inverse ? " inverse" : "", grid ? "a striding" : "an item a pair's", tol);
    check(e <= tol, what, e);
    if (dt) { /* rounded once: the f32 kernel's output on the same values, rounded to dt */
        launch(x32, y32, s, base, inverse, DT_F32, grid);
        long long differ = 0;
        for (long long i = 0; i < n; i++) {
            unsigned short want = dt == DT_BF16 ? f32_to_bf16(((float *)y32)[i]) : f32_to_f16(((float *)y32)[i]);
            differ += ((unsigned short *)y)[i] != want;
        }
        snprintf(what, sizeof what, "k_rope %s [%lld,%lld,%lld,%lld]%s: the f32 result rounded once (%lld elements differ)", dt_name(dt), B, T, H, D,
                 inverse ? " inverse" : "", differ);
        check(differ == 0, what, (double)differ);
    }
    free(x), free(y), free(y32), free(x32);
}

int main() {
    static const long long shapes[][4] = {{2, 7, 3, 8}, {1, 33, 2, 64}, {2, 5, 4, 128}, {3, 1, 2, 2}, {1, 300, 1, 256}};
    static const float bases[] = {10000.0f, 500000.0f};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int dt = 0; dt < 3; dt++)
            for (int inverse = 0; inverse < 2; inverse++)
                one_case(shapes[si], bases[(si + (size_t)inverse) % 2], inverse, dt, si % 2 ? 3 : 0); /* (odd shapes: 3 blocks stride) */
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
