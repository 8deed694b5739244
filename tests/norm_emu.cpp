/* norm_emu.cpp — the CUDA backend's warp-per-row layernorm kernels (backends/cuda_norm.cuh) run on the CPU.
 *
 * The device code is compiled for the host: a block's threads are cooperative fibers (tests/cuda_emu.h), a warp
 * shuffle is a write, a yield and a read of the partner's slot (each warp's lanes run the same steps, so they stay
 * in lockstep), __syncthreads is a real barrier here (the kernels' warps may take different numbers of rows before
 * the gamma kernel's barriers), the 16-byte vector types are plain structs. Checked against float64 references
 * from the ops' definitions: k_layernorm2 (y in f32, bf16 and f16; the added residual and its sum, bit for bit),
 * k_layernorm_back2 (dx with and without the residual, its bf16 / f16 copy equal to dx rounded) and
 * k_layernorm_gamma2's partial sums, for rows in 16-byte groups (C a multiple of 4, aligned) and element by element
 * (C not a multiple of 4, or a misaligned tensor), rows not a multiple of a block's warps, grids that stride over
 * the rows, blocks of 2 and 8 warps, C = 1 and C = 768, and each wider instance (1024, 1664, 2048 columns) at its
 * widths' edges (1024, 1025, 1600, 1664, 1665, 2048) and on a narrow row. The layernorm's inputs are f32 in
 * every graph (the dispatcher takes no other), so only the outputs come in bf16 / f16. It cannot see what only a
 * GPU shows (timing, races between real warps, coalescing).
 *
 * Built and run by tests/test_norm_emu.sh; prints "N passed, N failed" last. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define EMU_MAX_THREADS 256
#define EMU_STACK (1 << 15)
#include "cuda_emu.h"

/* ---- what cuda_norm.cuh takes from CUDA and from cuda_kernels.cu ------------------------------ */

/* a barrier that waits for every thread of the block (cuda_emu.h's is one yield: enough only where every thread
 * yields alike) */
static unsigned bar_arrived, bar_generation;
static void block_barrier() {
    unsigned gen = bar_generation;
    if (++bar_arrived == blockDim.x) bar_arrived = 0, bar_generation++;
    else
        while (bar_generation == gen) emu_yield();
}
#undef __syncthreads
#define __syncthreads() block_barrier()

struct __attribute__((may_alias)) uint2 { unsigned x, y; };
struct __attribute__((may_alias)) float4 { float x, y, z, w; };
static uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fmul_rn(float a, float b) { return a * b; }
static float rsqrtf(float x) { return 1.0f / sqrtf(x); }

static float shfl_slot[EMU_MAX_THREADS];
static float __shfl_xor_sync(unsigned, float v, int o) {
    shfl_slot[emu_cur] = v;
    emu_yield();
    float r = shfl_slot[(emu_cur & ~31) | ((emu_cur & 31) ^ o)];
    emu_yield();
    return r;
}
static float warp_sum(float v) { /* (cuda_kernels.cu's) */
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#include "../backends/cuda_convert.cuh"

#include "../backends/cuda_norm.cuh"

/* ---- checks --------------------------------------------------------------------------------- */

#include "emu_checks.h"
/* n floats from `shift` floats past a 16-byte boundary (shift 1: the kernels' element path), filled from frand * scale + offset */
static float *floats(long long n, int shift, float scale, float offset) {
    float *p = (float *)alloc16((size_t)(n + 8) * 4) + shift;
    for (long long i = 0; i < n; i++) p[i] = frand() * scale + offset;
    return p;
}
static void free_floats(float *p, int shift) { free(p - shift); }
/* the worst of |got - ref| - tol, with NaN as infinity */
static void worst(double *err, double got, double ref, double tol) {
    double e = fabs(got - ref) - tol;
    if (!(e <= *err)) *err = isnan(e) ? INFINITY : e;
}
/* row r's mean and 1/sqrt(var + eps) in float64 */
static void row_stats(const float *x, long long r, long long C, double eps, double *mean, double *rstd) {
    double s = 0, q = 0;
    for (long long j = 0; j < C; j++) s += x[r * C + j];
    *mean = s / C;
    for (long long j = 0; j < C; j++) q += (x[r * C + j] - *mean) * (x[r * C + j] - *mean);
    *rstd = 1.0 / sqrt(q / C + eps);
}

/* the launch's arguments (the kernel bodies below read them); inst: the instance (0 .. 3: up to 768, 1024, 1664, 2048 columns) */
static struct {
    const float *x, *g, *b, *dy, *res; void *y, *cp; float *dx, *sum, *part; long long rows, C, rpb; float eps; int ydt, inst;
} A;
static const char *const inst_suffix[] = {"", "_1024", "_1664", "_2048"};
/* the instance the dispatcher takes for rows of C columns (gpu_dispatch.h's pgd_ln2_kernel) */
static int instance_for(long long C) { return C <= 768 ? 0 : C <= 1024 ? 1 : C <= 1664 ? 2 : 3; }
static void run_forward() {
    switch (A.inst) {
    case 0: k_layernorm2(A.x, A.g, A.b, A.y, A.rows, A.C, A.eps, A.ydt, A.res, A.sum); break;
    case 1: k_layernorm2_1024(A.x, A.g, A.b, A.y, A.rows, A.C, A.eps, A.ydt, A.res, A.sum); break;
    case 2: k_layernorm2_1664(A.x, A.g, A.b, A.y, A.rows, A.C, A.eps, A.ydt, A.res, A.sum); break;
    default: k_layernorm2_2048(A.x, A.g, A.b, A.y, A.rows, A.C, A.eps, A.ydt, A.res, A.sum);
    }
}
static void run_backward() {
    switch (A.inst) {
    case 0: k_layernorm_back2(A.x, A.g, A.dy, A.dx, A.rows, A.C, A.eps, A.res, A.cp, A.ydt); break;
    case 1: k_layernorm_back2_1024(A.x, A.g, A.dy, A.dx, A.rows, A.C, A.eps, A.res, A.cp, A.ydt); break;
    case 2: k_layernorm_back2_1664(A.x, A.g, A.dy, A.dx, A.rows, A.C, A.eps, A.res, A.cp, A.ydt); break;
    default: k_layernorm_back2_2048(A.x, A.g, A.dy, A.dx, A.rows, A.C, A.eps, A.res, A.cp, A.ydt);
    }
}
static void run_gamma() {
    switch (A.inst) {
    case 0: k_layernorm_gamma2(A.x, A.dy, A.part, A.rows, A.C, A.eps, A.rpb); break;
    case 1: k_layernorm_gamma2_1024(A.x, A.dy, A.part, A.rows, A.C, A.eps, A.rpb); break;
    case 2: k_layernorm_gamma2_1664(A.x, A.dy, A.part, A.rows, A.C, A.eps, A.rpb); break;
    default: k_layernorm_gamma2_2048(A.x, A.dy, A.part, A.rows, A.C, A.eps, A.rpb);
    }
}
static const float eps = 1e-5f;

/* ---- k_layernorm2 ----------------------------------------------------------------------------- */

/* rows x C, y of dtype ydt, with a residual (res: r added to x, the sum beside), tensors `shift` floats off 16 bytes,
 * `grid` blocks of bt threads, by instance inst (-1: the one the dispatcher takes) */
static void forward_case(long long rows, long long C, int ydt, bool res, int shift, unsigned grid, unsigned bt, int inst = -1) {
    char what[200];
    float *x = floats(rows * C, shift, 2.0f, 0.5f), *g = floats(C, shift, 1.0f, 1.0f), *b = floats(C, shift, 0.5f, 0.0f);
    float *rr = res ? floats(rows * C, shift, 1.0f, 0.0f) : NULL, *sum = res ? floats(rows * C, shift, 0.0f, NAN) : NULL;
    char *ybuf = (char *)alloc16((size_t)(rows * C + 8) * 4);
    void *y = ybuf + (shift ? (ydt ? 2 : 4) : 0);
    for (long long i = 0; i < rows * C; i++) store_out(y, i, NAN, ydt);
    A.x = x, A.g = g, A.b = b, A.y = y, A.rows = rows, A.C = C, A.eps = eps, A.ydt = ydt, A.res = rr, A.sum = sum;
    A.inst = inst < 0 ? instance_for(C) : inst;
    emu_launch(emu_dim{grid, 1, 1}, bt, run_forward);
    double err = 0;
    long long sum_diff = 0;
    float *s = x;
    if (res) { /* (the sum: x + r in f32, bit for bit; y normalises it) */
        s = (float *)malloc(sizeof(float) * rows * C);
        for (long long i = 0; i < rows * C; i++) s[i] = x[i] + rr[i], sum_diff += memcmp(&s[i], &sum[i], 4) != 0;
    }
    for (long long r = 0; r < rows; r++) {
        double mean, rstd;
        row_stats(s, r, C, eps, &mean, &rstd);
        for (long long j = 0; j < C; j++) {
            double ref = (s[r * C + j] - mean) * rstd * g[j] + b[j];
            worst(&err, load_dt(y, r * C + j, ydt), ref, 2e-5 * (1 + fabs(ref)) + (ydt ? fabs(ref) * (ydt == 2 ? 1.0 / 256 : 1.0 / 2048) : 0));
        }
    }
    snprintf(what, sizeof what, "k_layernorm2%s %lld x %lld, y %s%s%s, %u blocks of %u: y%s", inst_suffix[A.inst], rows, C, dt_name(ydt), res ? ", residual" : "",
             shift ? " (misaligned)" : "", grid, bt, res ? " and the sum (bit for bit)" : "");
    check(err <= 0 && sum_diff == 0, what, err + (double)sum_diff);
    if (res) free(s), free_floats(rr, shift), free_floats(sum, shift);
    free_floats(x, shift), free_floats(g, shift), free_floats(b, shift), free(ybuf);
}

/* ---- k_layernorm_back2 ------------------------------------------------------------------------ */

/* dx of rows x C (res: the other gradient added), its rounded copy of dtype cdt (0: none) */
static void backward_case(long long rows, long long C, bool res, int cdt, int shift, unsigned grid, unsigned bt, int inst = -1) {
    char what[200];
    float *x = floats(rows * C, shift, 2.0f, -0.25f), *g = floats(C, shift, 1.0f, 1.0f), *dy = floats(rows * C, shift, 1.0f, 0.1f);
    float *rr = res ? floats(rows * C, shift, 1.0f, 0.0f) : NULL, *dx = floats(rows * C, shift, 0.0f, NAN);
    char *cbuf = cdt ? (char *)alloc16((size_t)(rows * C + 8) * 2) : NULL;
    void *cp = cdt ? cbuf + (shift ? 2 : 0) : NULL;
    A.x = x, A.g = g, A.dy = dy, A.dx = dx, A.rows = rows, A.C = C, A.eps = eps, A.res = rr, A.cp = cp, A.ydt = cdt;
    A.inst = inst < 0 ? instance_for(C) : inst;
    emu_launch(emu_dim{grid, 1, 1}, bt, run_backward);
    double err = 0;
    long long copy_diff = 0;
    for (long long r = 0; r < rows; r++) {
        double mean, rstd, m1 = 0, m2 = 0;
        row_stats(x, r, C, eps, &mean, &rstd);
        for (long long j = 0; j < C; j++) {
            double dg = (double)dy[r * C + j] * g[j];
            m1 += dg, m2 += dg * (x[r * C + j] - mean) * rstd;
        }
        m1 /= C, m2 /= C;
        for (long long j = 0; j < C; j++) {
            double xh = (x[r * C + j] - mean) * rstd, ref = rstd * ((double)dy[r * C + j] * g[j] - m1 - xh * m2) + (res ? rr[r * C + j] : 0.0);
            worst(&err, dx[r * C + j], ref, 2e-5 * (1 + fabs(ref)));
            if (cdt) {
                unsigned short want = cdt == 2 ? f32_to_bf16(dx[r * C + j]) : f32_to_f16(dx[r * C + j]);
                copy_diff += ((unsigned short *)cp)[r * C + j] != want;
            }
        }
    }
    snprintf(what, sizeof what, "k_layernorm_back2%s %lld x %lld%s%s%s, %u blocks of %u: dx%s", inst_suffix[A.inst], rows, C, res ? ", residual" : "",
             cdt ? (cdt == 2 ? ", bf16 copy" : ", f16 copy") : "", shift ? " (misaligned)" : "", grid, bt, cdt ? " and its copy (bit for bit)" : "");
    check(err <= 0 && copy_diff == 0, what, err + (double)copy_diff);
    if (res) free_floats(rr, shift);
    free_floats(x, shift), free_floats(g, shift), free_floats(dy, shift), free_floats(dx, shift), free(cbuf);
}

/* ---- k_layernorm_gamma2 ----------------------------------------------------------------------- */

/* the partial dgamma sums of rows x C, rpb rows a block, blocks of bt threads */
static void gamma_case(long long rows, long long C, long long rpb, int shift, unsigned bt, int inst = -1) {
    char what[200];
    long long blocks = (rows + rpb - 1) / rpb;
    float *x = floats(rows * C, shift, 2.0f, 0.3f), *dy = floats(rows * C, shift, 1.0f, 0.0f), *part = floats(blocks * C, 0, 0.0f, NAN);
    A.x = x, A.dy = dy, A.part = part, A.rows = rows, A.C = C, A.eps = eps, A.rpb = rpb;
    A.inst = inst < 0 ? instance_for(C) : inst;
    emu_launch(emu_dim{(unsigned)blocks, 1, 1}, bt, run_gamma);
    double err = 0;
    double *ref = (double *)calloc((size_t)(blocks * C), sizeof(double)), *mag = (double *)calloc((size_t)(blocks * C), sizeof(double));
    for (long long r = 0; r < rows; r++) {
        double mean, rstd;
        row_stats(x, r, C, eps, &mean, &rstd);
        for (long long j = 0; j < C; j++) {
            double t = dy[r * C + j] * (x[r * C + j] - mean) * rstd;
            ref[(r / rpb) * C + j] += t, mag[(r / rpb) * C + j] += fabs(t);
        }
    }
    for (long long i = 0; i < blocks * C; i++) worst(&err, part[i], ref[i], 2e-5 * (1 + mag[i]));
    snprintf(what, sizeof what, "k_layernorm_gamma2%s %lld x %lld, %lld rows a block (%lld blocks of %u)%s: partial sums", inst_suffix[A.inst],
             rows, C, rpb, blocks, bt,
             shift ? " (misaligned)" : "");
    check(err <= 0, what, err);
    free(ref), free(mag), free_floats(x, shift), free_floats(dy, shift), free_floats(part, 0);
}

int main() {
    /* forward: 16-byte groups (C a multiple of 4, aligned) and the element path; 8 and 2 warps a block; grids that
     * stride; rows not a multiple of the warps */
    forward_case(37, 768, 0, false, 0, 5, 256);
    forward_case(37, 768, 2, true, 0, 2, 256);
    forward_case(13, 64, 1, true, 0, 3, 64);
    forward_case(9, 131, 0, true, 0, 2, 256);
    forward_case(11, 132, 2, false, 1, 2, 64);
    forward_case(5, 1, 0, false, 0, 1, 64);
    forward_case(3, 700, 0, true, 1, 1, 256);
    /* backward */
    backward_case(37, 768, false, 0, 0, 5, 256);
    backward_case(37, 768, true, 2, 0, 2, 256);
    backward_case(13, 64, true, 1, 0, 3, 64);
    backward_case(9, 131, true, 2, 0, 2, 256);
    backward_case(11, 132, false, 0, 1, 2, 64);
    backward_case(5, 1, true, 0, 0, 1, 64);
    /* dgamma's partial sums: blocks whose warps take different numbers of rows, a last block of fewer rows */
    gamma_case(100, 768, 13, 0, 256);
    gamma_case(37, 131, 37, 0, 64);
    gamma_case(64, 64, 32, 0, 256);
    gamma_case(9, 1, 4, 0, 256);
    gamma_case(21, 132, 10, 1, 64);
    /* the wider instances: each at the edges of its widths (1024 the most the 1024 one holds, 1025 the least the 1664
     * one takes, ...), 16-byte groups and the element path, rows not a multiple of the warps; a narrow row on each */
    forward_case(37, 1024, 0, true, 0, 2, 256);
    forward_case(11, 1025, 2, false, 0, 3, 64);
    forward_case(37, 1600, 1, true, 0, 2, 256);
    forward_case(9, 1664, 0, false, 1, 2, 256);
    forward_case(13, 1665, 0, true, 0, 2, 64);
    forward_case(37, 2048, 2, true, 0, 5, 256);
    backward_case(37, 1024, true, 2, 0, 2, 256);
    backward_case(11, 1025, false, 0, 0, 3, 64);
    backward_case(37, 1600, true, 1, 0, 2, 256);
    backward_case(9, 1664, false, 0, 1, 2, 256);
    backward_case(13, 1665, true, 0, 0, 2, 64);
    backward_case(37, 2048, true, 2, 0, 5, 256);
    gamma_case(37, 1024, 13, 0, 256);
    gamma_case(21, 1025, 10, 0, 64);
    gamma_case(100, 1600, 13, 0, 256);
    gamma_case(9, 1664, 9, 1, 256);
    gamma_case(21, 1665, 8, 0, 64);
    gamma_case(37, 2048, 13, 0, 256);
    for (int inst = 1; inst < 4; inst++) {
        forward_case(9, 131, 0, true, 0, 2, 64, inst);
        backward_case(9, 131, true, 2, 0, 2, 64, inst);
        gamma_case(21, 132, 10, 1, 64, inst);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
