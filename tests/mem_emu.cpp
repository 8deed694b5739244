/* mem_emu.cpp — the CUDA backend's memory-bound kernels (backends/cuda_mem.cuh) run on the CPU.
 *
 * The device code is compiled for the host: a block's threads are cooperative fibers (ucontext) that all
 * yield at each __syncthreads (tests/cuda_emu.h), the 16-byte vector types are plain structs and the
 * block reductions are emulated through a shared array. Checked against references written here from the
 * ops' definitions: k_ce_fused's and k_ce_staged's loss terms and dlogits (float64; f32, bf16 and f16 logits and
 * dlogits, the 16-byte path and the element path of a misaligned or odd-width row, targets without a class (negative: ignored; V: a NaN loss term), blocks smaller
 * than a row, rows of several rounds of 4 loads a thread), k_colsum2's chunk sums (float64; f32 and bf16 rows, a
 * partial column group), k_adamw_chunks and k_adamw_vec against adamw_element one element at a time (the same float
 * operations: bit for bit; tensors of several chunks, a tail past the last 4, a misaligned tensor, bf16 copies, a
 * non-finite norm; k_adamw_vec's blocks of several chunks across tensors), k_bias_gelu2 against k_bias_gelu's element
 * (the same float operations: bit for bit; forward and backward, f32, bf16, f16 outputs, rows past rounds of 4). It cannot see what only a GPU
 * shows (timing, races between real warps, coalescing).
 *
 * Built and run by tests/test_mem_emu.sh; prints "N passed, N failed" last. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define EMU_MAX_THREADS 256
#define EMU_STACK (1 << 15)
#include "cuda_emu.h"

/* ---- what cuda_mem.cuh takes from CUDA and from cuda_kernels.cu ------------------------------- */

/* (may_alias: the kernels read and write float and 2-byte arrays through them, as CUDA's vector loads do) */
struct __attribute__((may_alias)) uint4 { unsigned x, y, z, w; };
struct __attribute__((may_alias)) uint2 { unsigned x, y; };
struct __attribute__((may_alias)) float4 { float x, y, z, w; };
static uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

#include "../backends/cuda_convert.cuh"

/* the optimizers' helpers, as cuda_kernels.cu has them */
enum { DT_F32 = 0, DT_F16, DT_BF16 };
static bool update_skipped(const float *gnorm_sq) { return gnorm_sq && !isfinite(gnorm_sq[0]); }
static float clip_factor(const float *gnorm_sq, float clip) {
    if (!gnorm_sq || clip <= 0.0f) return 1.0f;
    float nrm = sqrtf(gnorm_sq[0]);
    return nrm > clip ? clip / (nrm + 1e-6f) : 1.0f;
}
static void store_shadow(void *sh, long long i, float v, int sdt) {
    if (sdt == DT_BF16) ((unsigned short *)sh)[i] = f32_to_bf16(v);
    else if (sdt == DT_F16) ((unsigned short *)sh)[i] = f32_to_f16(v);
}
static void adamw_element(float *p, float *g, float *m, float *v, float f, float lr, float b1, float b2, float eps, float wd, float bc1,
                          float bc2) {
    float gi = *g * f;
    float mi = b1 * *m + (1.0f - b1) * gi;
    float vi = b2 * *v + (1.0f - b2) * gi * gi;
    *m = mi;
    *v = vi;
    float mh = mi / bc1, vh = vi / bc2;
    *p -= lr * (mh / (sqrtf(vh) + eps) + wd * *p);
    *g = 0.0f;
}
/* the GELU and its derivative, as cuda_kernels.cu has them */
static float gelu_f(float x) {
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
static float gelu_back_f(float x, float dy) {
    const float k = 0.7978845608028654f;
    float u = k * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = k * (1.0f + 3.0f * 0.044715f * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
#define MULTI_MAX 16
struct pdde_cu_multi {
    long long n[MULTI_MAX], p[MULTI_MAX], g[MULTI_MAX], m[MULTI_MAX], v[MULTI_MAX], s[MULTI_MAX];
    float wd[MULTI_MAX];
};

/* k_ce_staged's dynamic shared memory: one block runs at a time */
static uint4 emu_dyn_shared[1 << 14];
#define CE_STAGED_ROW(name) uint4 *name = emu_dyn_shared

#include "../backends/cuda_mem.cuh"

/* ---- checks --------------------------------------------------------------------------------- */

#include "emu_checks.h"
static size_t dt_size(int dt) { return dt ? 2 : 4; }

/* the launch's arguments (the kernel bodies below read them) */
static struct {
    const void *x; const int *tgt; const float *dloss, *cnt; float *part, *y; void *dx; long long rows, V, R, Cn, rpc; int ydt, ldt;
    float *base, *gbase; const float *gn; pdde_cu_multi t; int count, sdt; float scale;
} A;

/* ---- k_ce_fused --------------------------------------------------------------------------------- */

/* rows x V logits of dtype ldt (misaligned: one element past a 16-byte boundary), dlogits of ydt, every third target
 * without a class (or all): -1 (ignored: loss term 0) or V (loss term NaN), both with zero dlogits; blocks of bt threads; staged: k_ce_staged (the dlogits buffer starts NaN: every element written) */
static void ce_case(long long rows, long long V, int ldt, int ydt, int misaligned, int all_ignored, unsigned bt, int staged = 0) {
    char what[200];
    size_t ls = dt_size(ldt), ys = dt_size(ydt);
    char *lbuf = (char *)alloc16((size_t)(rows * V + 8) * ls), *dbuf = (char *)alloc16((size_t)(rows * V + 8) * ys);
    void *lg = lbuf + (misaligned ? ls : 0), *dx = dbuf;
    int *tgt = (int *)malloc(sizeof(int) * rows);
    for (long long i = 0; i < rows * V; i++) store_out(lg, i, 6.0f * frand(), ldt);
    for (long long r = 0; r < rows; r++) tgt[r] = all_ignored || r % 3 == 2 ? (r % 2 ? -1 : (int)V) : (int)((r * 7919) % V);
    float dloss = 0.75f, cnt = 0, *part = (float *)malloc(sizeof(float) * 2 * rows);
    for (long long r = 0; r < rows; r++) cnt += tgt[r] >= 0 && tgt[r] < V;
    for (long long i = 0; i < rows * V; i++) store_out(dx, i, NAN, ydt);
    for (long long i = 0; i < 2 * rows; i++) part[i] = NAN;
    A.x = lg, A.tgt = tgt, A.dloss = &dloss, A.cnt = &cnt, A.part = part, A.dx = dx, A.rows = rows, A.V = V, A.ydt = ydt, A.ldt = ldt;
    if (staged) {
        memset(emu_dyn_shared, 0xff, sizeof emu_dyn_shared); /* (NaN bits: a read of an element not staged shows) */
        emu_launch(emu_dim{(unsigned)(rows < 3 ? rows : 3), 1, 1}, bt,
                   [] { k_ce_staged(A.x, A.tgt, A.dloss, A.cnt, A.part, A.dx, A.rows, A.V, A.ydt, A.ldt); });
    } else
        emu_launch(emu_dim{(unsigned)(rows < 3 ? rows : 3), 1, 1}, bt,
                   [] { k_ce_fused(A.x, A.tgt, A.dloss, A.cnt, A.part, A.dx, A.rows, A.V, A.ydt, A.ldt); });
    double loss_err = 0, d_err = 0, ok_err = 0;
    for (long long r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (long long j = 0; j < V; j++) m = fmax(m, (double)load_dt(lg, r * V + j, ldt));
        for (long long j = 0; j < V; j++) s += exp((double)load_dt(lg, r * V + j, ldt) - m);
        int t = tgt[r], ok = t >= 0 && t < V;
        double loss = ok ? log(s) + m - load_dt(lg, r * V + t, ldt) : 0, sc = ok ? dloss / (cnt > 0 ? cnt : 1) : 0;
        double le = fabs(part[r] - loss) / fmax(1, fabs(loss)), oe = fabs(part[rows + r] - ok); /* (NaN: unwritten) */
        if (t >= V) le = isnan(part[r]) ? 0 : INFINITY; /* a target past the classes: NaN, which the session's loss check names */
        if (!(le <= loss_err)) loss_err = isnan(le) ? INFINITY : le;
        if (!(oe <= ok_err)) ok_err = isnan(oe) ? INFINITY : oe;
        for (long long j = 0; j < V; j++) {
            double ref = (exp((double)load_dt(lg, r * V + j, ldt) - m) / s - (j == t)) * sc, got = load_dt(dx, r * V + j, ydt);
            double tol = 1e-6 * fabs(sc) + (ydt ? fabs(ref) * (ydt == 2 ? 1.0 / 256 : 1.0 / 2048) : 0);
            double e = fabs(got - ref) - tol;
            if (!(e <= d_err)) d_err = isnan(e) ? INFINITY : e;
        }
    }
    const char *kname = staged ? "k_ce_staged" : "k_ce_fused";
    snprintf(what, sizeof what, "%s %lld x %lld, logits %s%s, dlogits %s, %u threads%s: loss terms and flags", kname, rows, V,
             ldt == 2 ? "bf16" : ldt == 1 ? "f16" : "f32", misaligned ? " (misaligned)" : "", ydt == 2 ? "bf16" : ydt == 1 ? "f16" : "f32", bt,
             all_ignored ? ", every target ignored" : "");
    check(loss_err < 1e-5 && ok_err == 0, what, loss_err + ok_err);
    snprintf(what, sizeof what, "%s %lld x %lld (%d, %d, %s): dlogits within rounding", kname, rows, V, ldt, ydt,
             misaligned ? "misaligned" : "aligned");
    check(d_err <= 0, what, d_err);
    free(lbuf), free(dbuf), free(tgt), free(part);
}

/* ---- k_colsum2 ---------------------------------------------------------------------------------- */

static void colsum_case(long long R, long long Cn, int xdt, long long rpc) {
    char what[160];
    void *x = alloc16((size_t)(R * Cn) * dt_size(xdt) + 16);
    for (long long i = 0; i < R * Cn; i++) store_out(x, i, frand(), xdt);
    long long chunks = (R + rpc - 1) / rpc;
    float *y = (float *)malloc(sizeof(float) * chunks * Cn);
    for (long long i = 0; i < chunks * Cn; i++) y[i] = NAN;
    A.x = x, A.y = y, A.R = R, A.Cn = Cn, A.rpc = rpc, A.ldt = xdt, A.scale = 0.5f;
    emu_launch(emu_dim{(unsigned)((Cn + 127) / 128), (unsigned)chunks, 1}, 256, [] { k_colsum2(A.x, A.y, A.R, A.Cn, A.scale, A.rpc, A.ldt); });
    double err = 0;
    for (long long c = 0; c < chunks; c++)
        for (long long j = 0; j < Cn; j++) {
            double s = 0;
            for (long long r = c * rpc; r < R && r < (c + 1) * rpc; r++) s += load_dt(x, r * Cn + j, xdt);
            double e = fabs(y[c * Cn + j] - 0.5 * s) / fmax(1, fabs(0.5 * s));
            if (!(e <= err)) err = isnan(e) ? INFINITY : e;
        }
    snprintf(what, sizeof what, "k_colsum2 [%lld, %lld] %s rows, %lld rows a chunk (%lld chunks)", R, Cn, xdt == 2 ? "bf16" : xdt ? "f16" : "f32", rpc, chunks);
    check(err < 1e-5, what, err);
    free(x), free(y);
}

/* ---- k_adamw_chunks ------------------------------------------------------------------------------ */

/* tensors of n[k] elements laid out one after another (at offsets `skew` elements past a multiple of 4 for those
 * marked), with bf16 copies for those marked; norm: the squared gradient norm (NaN: the step is skipped) */
static void adamw_case(const char *name, int count, const long long *n, const int *skew, const int *copy, float norm, unsigned vec_blocks = 0) {
    char what[200];
    long long at = 0, gat = 0;
    pdde_cu_multi t;
    memset(&t, 0, sizeof t);
    for (int k = 0; k < count; k++) {
        t.n[k] = n[k], t.wd[k] = k % 2 ? 0.0f : 0.1f;
        at = (at + 3) / 4 * 4 + skew[k], t.p[k] = at, at += n[k];
        at = (at + 3) / 4 * 4 + skew[k], t.m[k] = at, at += n[k];
        at = (at + 3) / 4 * 4 + skew[k], t.v[k] = at, at += n[k];
        gat = (gat + 3) / 4 * 4 + skew[k], t.g[k] = gat, gat += n[k];
    }
    long long copies = at;
    long long sat = 2 * copies; /* (the copies in 2-byte elements past the floats; -1: none) */
    for (int k = 0; k < count; k++)
        if (copy[k]) sat = (sat + 3) / 4 * 4 + skew[k], t.s[k] = sat, sat += n[k];
        else t.s[k] = -1;
    size_t nbase = (size_t)(sat / 2 + 8);
    float *base = (float *)alloc16(nbase * 4), *gbase = (float *)alloc16((size_t)(gat + 8) * 4);
    for (size_t i = 0; i < nbase; i++) base[i] = frand();
    for (long long i = 0; i < gat + 8; i++) gbase[i] = frand();
    for (int k = 0; k < count; k++)
        for (long long i = 0; i < n[k]; i++) base[t.v[k] + i] = fabsf(base[t.v[k] + i]);
    float *rb = (float *)malloc(nbase * 4), *rg = (float *)malloc((size_t)(gat + 8) * 4);
    memcpy(rb, base, nbase * 4), memcpy(rg, gbase, (size_t)(gat + 8) * 4);
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, clip = 1.0f, gs = 0.5f, bc1 = 0.1f, bc2 = 0.05f;
    float gn = norm;
    long long chunks = 0;
    for (int k = 0; k < count; k++) chunks += (n[k] + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
    A.base = base, A.gbase = gbase, A.gn = &gn, A.t = t, A.count = count, A.sdt = DT_BF16;
    if (vec_blocks) /* (k_adamw_vec: vec_blocks blocks take the chunks in turn) */
        emu_launch(emu_dim{vec_blocks, 1, 1}, 256,
                   [] { k_adamw_vec(A.base, A.gbase, A.gn, A.t, A.count, 0.01f, 0.9f, 0.95f, 1e-8f, 1.0f, 0.5f, 0.1f, 0.05f, A.sdt); });
    else
        emu_launch(emu_dim{(unsigned)chunks, 1, 1}, 256,
                   [] { k_adamw_chunks(A.base, A.gbase, A.gn, A.t, A.count, 0.01f, 0.9f, 0.95f, 1e-8f, 1.0f, 0.5f, 0.1f, 0.05f, A.sdt); });
    if (!update_skipped(&gn)) { /* the reference: adamw_element on each element, the copy rounded as a cast */
        float f = gs * clip_factor(&gn, clip);
        for (int k = 0; k < count; k++)
            for (long long i = 0; i < n[k]; i++) {
                adamw_element(rb + t.p[k] + i, rg + t.g[k] + i, rb + t.m[k] + i, rb + t.v[k] + i, f, lr, b1, b2, eps, t.wd[k], bc1, bc2);
                if (copy[k]) store_shadow((unsigned short *)rb + t.s[k], i, rb[t.p[k] + i], DT_BF16);
            }
    }
    long long diff = 0;
    for (size_t i = 0; i < nbase; i++) diff += memcmp(base + i, rb + i, 4) != 0;
    for (long long i = 0; i < gat + 8; i++) diff += memcmp(gbase + i, rg + i, 4) != 0;
    snprintf(what, sizeof what, "%s %s: parameters, moments, gradients and copies equal adamw_element's, bit for bit "
             "(%lld words differ)", vec_blocks ? "k_adamw_vec" : "k_adamw_chunks", name, diff);
    check(diff == 0, what, (double)diff);
    free(base), free(gbase), free(rb), free(rg);
}

/* ---- k_bias_gelu2 ------------------------------------------------------------------------------- */

/* [rows, nb] through k_bias_gelu2 (back: the backward) into dtype ydt, a grid of gx x gy blocks of bt threads, against
 * k_bias_gelu's element (gelu_f / gelu_back_f of x + bias[i % nb], rounded by store_out): bit for bit */
static void gelu2_case(long long rows, long long nb, int back, int ydt, unsigned gx, unsigned gy, unsigned bt) {
    char what[200];
    long long n = rows * nb;
    float *x = (float *)alloc16((size_t)(n + 4) * 4), *b = (float *)alloc16((size_t)(nb + 4) * 4);
    float *dy = (float *)alloc16((size_t)(n + 4) * 4);
    void *y = alloc16((size_t)(n + 4) * 4), *ref = malloc((size_t)(n + 4) * 4);
    for (long long i = 0; i < n; i++) x[i] = 3.0f * frand(), dy[i] = frand();
    for (long long i = 0; i < nb; i++) b[i] = frand();
    memset(y, 0xff, (size_t)(n + 4) * 4), memset(ref, 0xff, (size_t)(n + 4) * 4); /* (NaN bits: an element not written shows) */
    for (long long i = 0; i < n; i++) {
        float v = x[i] + b[i % nb];
        store_out(ref, i, back ? gelu_back_f(v, dy[i]) : gelu_f(v), ydt);
    }
    A.x = x, A.y = b, A.part = dy, A.dx = y, A.R = n, A.Cn = nb, A.count = back, A.ydt = ydt;
    emu_launch(emu_dim{gx, gy, 1}, bt, [] { k_bias_gelu2((const float *)A.x, A.y, A.part, A.dx, A.R, A.Cn, A.count, A.ydt); });
    long long diff = 0;
    for (long long i = 0; i < n + 4; i++) diff += memcmp((char *)y + i * dt_size(ydt), (char *)ref + i * dt_size(ydt), dt_size(ydt)) != 0;
    snprintf(what, sizeof what, "k_bias_gelu2 %s [%lld, %lld] into %s, %u x %u blocks of %u: k_bias_gelu's values bit for bit (%lld differ)",
             back ? "backward" : "forward", rows, nb, ydt == 2 ? "bf16" : ydt ? "f16" : "f32", gx, gy, bt, diff);
    check(diff == 0, what, (double)diff);
    free(x), free(b), free(dy), free(y), free(ref);
}

int main() {
    /* k_ce_fused: the 16-byte path (V a multiple of 8 or 4, aligned rows) and the element path */
    ce_case(4, 64, 2, 2, 0, 0, 32);
    ce_case(5, 1000, 2, 0, 0, 0, 64);
    ce_case(3, 96, 0, 2, 0, 0, 32);
    ce_case(3, 96, 0, 0, 0, 0, 256);
    ce_case(4, 304, 1, 1, 0, 0, 32);
    ce_case(4, 64, 2, 2, 1, 0, 32);
    ce_case(3, 37, 2, 0, 0, 0, 32);
    ce_case(3, 37, 0, 2, 0, 1, 32);
    ce_case(2, 1, 0, 0, 0, 0, 32);
    /* k_ce_staged: rounds of 4 loads and a tail (4096 bf16: 16 quads a thread of 32), the element path, ignored rows */
    ce_case(5, 4096, 2, 2, 0, 0, 32, 1);
    ce_case(4, 1000, 2, 0, 0, 0, 64, 1);
    ce_case(4, 1204, 0, 2, 0, 0, 32, 1);
    ce_case(3, 304, 1, 1, 0, 0, 64, 1);
    ce_case(4, 64, 2, 2, 1, 0, 32, 1);
    ce_case(3, 37, 0, 0, 0, 0, 32, 1);
    ce_case(3, 40, 2, 2, 0, 1, 32, 1);
    /* k_colsum2: one chunk, several, a partial last chunk and column group, bf16 rows */
    colsum_case(7, 8, 0, 7);
    colsum_case(300, 36, 0, 70);
    colsum_case(257, 260, 0, 64);
    colsum_case(100, 24, 2, 33);
    colsum_case(100, 132, 1, 100);
    /* k_adamw_chunks */
    const long long n1[] = {5000, 7, 4099, 9000}, n2[] = {3};
    const int aligned[] = {0, 0, 0, 0}, skewed[] = {0, 0, 1, 2}, copies[] = {1, 0, 1, 1}, none[] = {0, 0, 0, 0};
    adamw_case("4 tensors (2, 1, 2, 3 chunks), aligned, bf16 copies", 4, n1, aligned, copies, 0.8f);
    adamw_case("4 tensors, two misaligned, clipped", 4, n1, skewed, copies, 9.0f);
    adamw_case("4 tensors, no copies", 4, n1, aligned, none, 0.25f);
    adamw_case("one tensor of 3", 1, n2, aligned, copies, 0.5f);
    adamw_case("a non-finite norm: nothing changes", 4, n1, aligned, copies, NAN);
    /* k_adamw_vec: blocks of several chunks across tensors (3 or 2 blocks over 8 chunks), a tensor of one partial
     * chunk (2 groups a thread: 4096 elements; 1: 1000; none: 3), misaligned tensors, no copies, a non-finite norm */
    const long long n3[] = {5000, 7, 4099, 9000, 1000, 8192};
    const int aligned6[] = {0, 0, 0, 0, 0, 0}, skewed6[] = {0, 0, 1, 2, 0, 3}, copies6[] = {1, 0, 1, 1, 1, 0}, none6[] = {0, 0, 0, 0, 0, 0};
    adamw_case("6 tensors, aligned, bf16 copies, 3 blocks", 6, n3, aligned6, copies6, 0.8f, 3);
    adamw_case("6 tensors, three misaligned, clipped, 2 blocks", 6, n3, skewed6, copies6, 9.0f, 2);
    adamw_case("6 tensors, no copies, 1 block", 6, n3, aligned6, none6, 0.25f, 1);
    adamw_case("6 tensors, more blocks than chunks", 6, n3, aligned6, copies6, 0.5f, 20);
    adamw_case("one tensor of 3", 1, n2, aligned, copies, 0.5f, 2);
    adamw_case("a non-finite norm: nothing changes", 6, n3, aligned6, copies6, NAN, 3);
    /* k_bias_gelu2: rounds of 4 rows and a tail (11 rows over 2 row blocks), a partial column block, one row block */
    gelu2_case(11, 36, 0, 2, 2, 2, 8);
    gelu2_case(11, 36, 1, 2, 2, 2, 8);
    gelu2_case(9, 40, 0, 0, 2, 1, 8);
    gelu2_case(9, 40, 1, 0, 2, 1, 8);
    gelu2_case(13, 12, 1, 1, 1, 3, 32);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
