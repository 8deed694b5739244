/* moe_emu.cpp — the CUDA backend's Mixture-of-Experts kernels (backends/cuda_moe.cuh) run on the CPU.
 *
 * The device code is compiled for the host: a block's threads are cooperative fibers (ucontext) that
 * all yield at each __syncthreads, so a block runs as in lockstep (each round in the other order of
 * threads); blocks run one after another over the grid that backends/gpu_moe.h launches. Each kernel
 * is checked against a plain float64 reference written here from the ops' definitions (pdde.h): the
 * layout (counts, offsets, rows; with a capacity, skewed routing and an expert with no tokens), top-k, the gate and its gradient (finite differences), dispatch,
 * combine and the weight gradient, the grouped GEMM (one launch, several tiles an expert, transposed
 * weights, the by-expert buffer) and its weight gradient, the balance loss and its gradient, and the
 * permutation on bf16 rows (a bf16 compute dtype: rounded once, copied, read as f32). It cannot
 * see what only a GPU shows (timing, races between real warps).
 *
 * Built and run by tests/test_moe_emu.sh; prints "N passed, N failed" last. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

/* ---- a block of cooperative threads ----------------------------------------------------------- */

#define EMU_MAX_THREADS 256
#define EMU_STACK (1 << 16)
#include "cuda_emu.h"
#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)
#include "../backends/cuda_convert.cuh"

#include "../backends/cuda_gemm_tile.cuh"
#include "../backends/cuda_moe.cuh"

/* ---- checks --------------------------------------------------------------------------------- */

#include "emu_checks.h"
static void check_err(double err, double tol, const char *what) { check(err < tol, what, err); }
/* the largest |a - b| over max(1, |b|) */
static double rel_err(const float *a, const double *b, long long n) {
    double w = 0;
    for (long long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs(b[i]) > 1 ? fabs(b[i]) : 1);
        if (!(d <= w)) w = isnan(d) ? INFINITY : d;
    }
    return w;
}

/* the kernels' arguments, as gpu_moe.h passes them (the launches capture these) */
static struct {
    const int *idx; int *counts, *off, *rows, *row; long long nk, N, C; int E, cap, k, flags, back, S, K, M, tb; long long R;
    const float *a, *b, *w, *dy; float *y;
    const unsigned short *ah; unsigned short *yh; /* bf16 rows (a bf16 compute dtype) */
} A;

/* ---- the reference (float64, from the definitions) ---------------------------------------------- */

struct layout { int counts[64], rows[64], off[64]; int row[4096]; };
static void ref_layout(const int *idx, long long nk, int E, int cap, long long R, layout *L) {
    memset(L, 0, sizeof *L);
    for (long long i = 0; i < nk; i++) L->counts[idx[i]]++;
    long long total = 0;
    for (int e = 0; e < E; e++) {
        L->rows[e] = cap > 0 && L->counts[e] > cap ? cap : L->counts[e];
        L->off[e] = cap > 0 ? e * cap : (int)total;
        total += L->rows[e];
    }
    int seen[64] = {0};
    for (long long i = 0; i < nk; i++) {
        int e = idx[i], r = seen[e]++;
        L->row[i] = r < L->rows[e] && L->off[e] + r < R ? L->off[e] + r : -1;
    }
}
static void ref_scores(const float *l, int E, int sig, double *s) {
    double m = -INFINITY, z = 0;
    for (int e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int e = 0; e < E; e++) z += exp(l[e] - m);
    for (int e = 0; e < E; e++) s[e] = sig ? 1 / (1 + exp(-(double)l[e])) : exp(l[e] - m) / z;
}
/* the gate weights of one row from logits l (double, for finite differences) */
static void ref_gate(const double *l, const int *id, int E, int k, int flags, double *w) {
    int sig = flags & 1, norm = !(flags & 2);
    double m = -INFINITY, z = 0, s[64];
    for (int e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int e = 0; e < E; e++) z += exp(l[e] - m);
    double S = 0;
    for (int c = 0; c < k; c++) s[c] = sig ? 1 / (1 + exp(-l[id[c]])) : exp(l[id[c]] - m) / z, S += s[c];
    for (int c = 0; c < k; c++) w[c] = norm ? s[c] / S : s[c];
}
static double ref_aux(const double *l, long long N, int E, const int *cnt) {
    double total = 0, acc = 0;
    for (int e = 0; e < E; e++) total += cnt[e];
    for (long long n = 0; n < N; n++) {
        double m = -INFINITY, z = 0;
        for (int e = 0; e < E; e++) m = l[n * E + e] > m ? l[n * E + e] : m;
        for (int e = 0; e < E; e++) z += exp(l[n * E + e] - m);
        for (int e = 0; e < E; e++) acc += exp(l[n * E + e] - m) / z * (total > 0 ? cnt[e] / total : 0);
    }
    return N ? E * acc / N : 0;
}

/* ---- one routing case -------------------------------------------------------------------------- */

static void run_case(const char *name, long long N, int E, int k, int C, int F, int capf, int flags, int skew) {
    char what[160];
    long long nk = N * k;
    float *lg = (float *)malloc(sizeof(float) * N * E), *bias = (float *)calloc(E, sizeof(float));
    for (long long i = 0; i < N * E; i++) lg[i] = 2 * frand();
    if (skew) bias[0] = 200, bias[1] = 100; /* every token to expert 0 (k = 1) or experts 0 and 1 */
    int *idx = (int *)malloc(sizeof(int) * nk);
    /* top-k */
    A.N = N, A.E = E, A.k = k, A.flags = flags;
    static const float *s_lg, *s_bias;
    s_lg = lg, s_bias = skew ? bias : NULL, A.row = idx;
    emu_launch(emu_dim{(unsigned)((N + 255) / 256), 1, 1}, 256, [] { k_moe_topk(s_lg, s_bias, A.row, A.N, A.E, A.k, A.flags); });
    int bad = 0;
    for (long long n = 0; n < N; n++) {
        double s[64];
        ref_scores(lg + n * E, E, flags & 1, s);
        for (int e = 0; e < E; e++) s[e] += bias[e] * (skew != 0);
        for (int c = 0; c < k; c++) { /* the k largest, in order */
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int p = 0; p < c; p++) taken |= idx[n * k + p] == e;
                if (!taken && (best < 0 || s[e] > s[best])) best = e;
            }
            bad += idx[n * k + c] != best;
        }
    }
    snprintf(what, sizeof what, "%s: top-%d of %d experts", name, k, E);
    check(bad == 0, what, bad);
    /* the layout */
    int cap = capf > 0 ? (int)ceil(capf / 100.0 * nk / E) : 0;
    long long R = cap > 0 ? (long long)E * cap : nk;
    layout L;
    ref_layout(idx, nk, E, cap, R, &L);
    int dev_counts[64], dev_off[64], dev_rows[64], *dev_row = (int *)malloc(sizeof(int) * nk);
    A.idx = idx, A.counts = dev_counts, A.off = dev_off, A.rows = dev_rows, A.row = dev_row, A.nk = nk, A.cap = cap, A.R = R;
    emu_launch(emu_dim{1, 1, 1}, 256, [] { k_moe_layout(A.idx, A.counts, A.off, A.rows, A.row, A.nk, A.E, A.cap, A.R); });
    bool same = !memcmp(dev_counts, L.counts, E * sizeof(int)) && !memcmp(dev_off, L.off, E * sizeof(int)) &&
                !memcmp(dev_rows, L.rows, E * sizeof(int)) && !memcmp(dev_row, L.row, nk * sizeof(int));
    int empty = 0, dropped = 0;
    for (int e = 0; e < E; e++) empty += L.counts[e] == 0, dropped += L.counts[e] - L.rows[e];
    snprintf(what, sizeof what, "%s: layout (capacity %d, %d experts empty, %d dropped)", name, cap, empty, dropped);
    check(same, what, same ? 0 : 1);
    /* the gate and its gradient (finite differences of the float64 gate) */
    float *w = (float *)malloc(sizeof(float) * nk), *dw = (float *)malloc(sizeof(float) * nk), *dl = (float *)malloc(sizeof(float) * N * E);
    for (long long i = 0; i < nk; i++) dw[i] = frand();
    double *wr = (double *)malloc(sizeof(double) * nk), *dlr = (double *)malloc(sizeof(double) * N * E);
    static float *s_w, *s_dl, *s_dw;
    s_w = w, s_dl = dl, s_dw = dw;
    A.back = 0;
    emu_launch(emu_dim{(unsigned)((N + 255) / 256), 1, 1}, 256, [] { k_moe_gate(s_lg, A.idx, NULL, s_w, A.N, A.E, A.k, A.flags, 0); });
    emu_launch(emu_dim{(unsigned)((N + 255) / 256), 1, 1}, 256, [] { k_moe_gate(s_lg, A.idx, s_dw, s_dl, A.N, A.E, A.k, A.flags, 1); });
    for (long long n = 0; n < N; n++) {
        double l[64], wp[64], wm[64];
        for (int e = 0; e < E; e++) l[e] = lg[n * E + e];
        ref_gate(l, idx + n * k, E, k, flags, wr + n * k);
        for (int e = 0; e < E; e++) {
            double h = 1e-5, sp = 0, sm = 0;
            l[e] += h, ref_gate(l, idx + n * k, E, k, flags, wp), l[e] -= 2 * h, ref_gate(l, idx + n * k, E, k, flags, wm), l[e] += h;
            for (int c = 0; c < k; c++) sp += wp[c] * dw[n * k + c], sm += wm[c] * dw[n * k + c];
            dlr[n * E + e] = (sp - sm) / (2 * h);
        }
    }
    double err = rel_err(w, wr, nk);
    snprintf(what, sizeof what, "%s: gate weights", name);
    check(err < 1e-5, what, err);
    err = rel_err(dl, dlr, N * E);
    snprintf(what, sizeof what, "%s: gate gradient against finite differences", name);
    check(err < 1e-4, what, err);
    /* dispatch (weighted), combine (weighted), the combine's weight gradient */
    float *x = (float *)malloc(sizeof(float) * N * C), *buf = (float *)calloc((size_t)R * C, sizeof(float));
    float *y = (float *)malloc(sizeof(float) * N * C), *gy = (float *)malloc(sizeof(float) * N * C), *gw = (float *)malloc(sizeof(float) * nk);
    for (long long i = 0; i < N * C; i++) x[i] = frand(), gy[i] = frand();
    double *bufr = (double *)calloc((size_t)R * C, sizeof(double)), *yr = (double *)calloc((size_t)N * C, sizeof(double)),
           *gwr = (double *)calloc(nk, sizeof(double));
    A.a = x, A.w = w, A.y = buf, A.C = C, A.row = dev_row;
    emu_launch(emu_dim{(unsigned)((nk * C + 255) / 256), 1, 1}, 256, [] { k_moe_dispatch(A.a, A.w, A.row, A.y, A.nk, A.k, A.C, 0, 0); });
    A.a = buf, A.y = y;
    emu_launch(emu_dim{(unsigned)((N * C + 255) / 256), 1, 1}, 256, [] { k_moe_combine(A.a, A.row, A.w, A.y, A.N, A.k, A.C, 0); });
    A.dy = gy, A.y = gw;
    emu_launch(emu_dim{(unsigned)((nk + 255) / 256), 1, 1}, 256, [] { k_moe_combine_back_w(A.a, A.row, A.dy, A.y, A.nk, A.k, A.C, 0, 0); });
    for (long long ch = 0; ch < nk; ch++) {
        int r = L.row[ch];
        if (r < 0) continue;
        for (int i = 0; i < C; i++) bufr[(long long)r * C + i] = (double)w[ch] * x[(ch / k) * C + i];
    }
    for (long long ch = 0; ch < nk; ch++) {
        int r = L.row[ch];
        for (int i = 0; i < C && r >= 0; i++) {
            yr[(ch / k) * C + i] += (double)w[ch] * buf[(long long)r * C + i];
            gwr[ch] += (double)gy[(ch / k) * C + i] * buf[(long long)r * C + i];
        }
    }
    snprintf(what, sizeof what, "%s: dispatch", name);
    check_err(rel_err(buf, bufr, R * C), 1e-6, what);
    snprintf(what, sizeof what, "%s: combine", name);
    check_err(rel_err(y, yr, N * C), 1e-5, what);
    snprintf(what, sizeof what, "%s: combine weight gradient", name);
    check_err(rel_err(gw, gwr, nk), 1e-5, what);
    { /* bf16 rows: the weighted dispatch of f32 x rounds each product once (its f32 result's rounding, bit
       * for bit); the unweighted one of bf16 x copies the rows; the combine and its weight gradient read
       * bf16 rows (and a bf16 gradient) as their f32 values */
        unsigned short *xh = (unsigned short *)malloc(2 * N * C), *bh = (unsigned short *)calloc((size_t)R * C, 2),
                       *ch = (unsigned short *)calloc((size_t)R * C, 2), *gyh = (unsigned short *)malloc(2 * N * C);
        float *yb = (float *)malloc(sizeof(float) * N * C), *gwb = (float *)malloc(sizeof(float) * nk), *bw = (float *)malloc(sizeof(float) * R * C);
        double *ybr = (double *)calloc((size_t)N * C, sizeof(double)), *gwbr = (double *)calloc(nk, sizeof(double));
        for (long long i = 0; i < N * C; i++) xh[i] = f32_to_bf16(x[i]), gyh[i] = f32_to_bf16(gy[i]);
        A.a = x, A.yh = bh;
        emu_launch(emu_dim{(unsigned)((nk * C + 255) / 256), 1, 1}, 256, [] { k_moe_dispatch(A.a, A.w, A.row, A.yh, A.nk, A.k, A.C, 0, 2); });
        A.ah = xh, A.yh = ch;
        emu_launch(emu_dim{(unsigned)((nk * C + 255) / 256), 1, 1}, 256, [] { k_moe_dispatch(A.ah, NULL, A.row, A.yh, A.nk, A.k, A.C, 2, 2); });
        bool rounded = true, copied = true;
        for (long long c2 = 0; c2 < nk; c2++) {
            int r = L.row[c2];
            for (int i = 0; i < C && r >= 0; i++) {
                rounded &= bh[(long long)r * C + i] == f32_to_bf16(buf[(long long)r * C + i]);
                copied &= ch[(long long)r * C + i] == xh[(c2 / k) * C + i];
            }
        }
        snprintf(what, sizeof what, "%s: dispatch to bf16 rows (weighted: rounded once; bf16 rows: copied)", name);
        check(rounded && copied, what, rounded && copied ? 0 : 1);
        for (long long i = 0; i < (long long)R * C; i++) bw[i] = bf16_to_f32(bh[i]);
        A.ah = bh, A.y = yb;
        emu_launch(emu_dim{(unsigned)((N * C + 255) / 256), 1, 1}, 256, [] { k_moe_combine(A.ah, A.row, A.w, A.y, A.N, A.k, A.C, 2); });
        A.dy = (const float *)(const void *)gyh, A.y = gwb;
        emu_launch(emu_dim{(unsigned)((nk + 255) / 256), 1, 1}, 256, [] { k_moe_combine_back_w(A.ah, A.row, A.dy, A.y, A.nk, A.k, A.C, 2, 2); });
        for (long long c2 = 0; c2 < nk; c2++) {
            int r = L.row[c2];
            for (int i = 0; i < C && r >= 0; i++) {
                ybr[(c2 / k) * C + i] += (double)w[c2] * bw[(long long)r * C + i];
                gwbr[c2] += (double)bf16_to_f32(gyh[(c2 / k) * C + i]) * bw[(long long)r * C + i];
            }
        }
        snprintf(what, sizeof what, "%s: combine of bf16 rows", name);
        check_err(rel_err(yb, ybr, N * C), 1e-5, what);
        snprintf(what, sizeof what, "%s: combine weight gradient of bf16 rows and gradient", name);
        check_err(rel_err(gwb, gwbr, nk), 1e-5, what);
        free(xh), free(bh), free(ch), free(gyh), free(yb), free(gwb), free(bw), free(ybr), free(gwbr);
    }
    /* the grouped GEMM over the buffer ([R, C] x W_e [C, F] or, transposed, [F, C]) and its weight gradient */
    for (int tb = 0; tb < 2; tb++) {
        float *W = (float *)malloc(sizeof(float) * E * C * F), *out = (float *)calloc((size_t)R * F, sizeof(float));
        for (long long i = 0; i < (long long)E * C * F; i++) W[i] = frand();
        double *outr = (double *)calloc((size_t)R * F, sizeof(double));
        A.a = buf, A.b = W, A.y = out, A.off = dev_off, A.rows = dev_rows, A.S = 0, A.K = C, A.M = F, A.tb = tb;
        emu_launch(emu_dim{(unsigned)((F + 63) / 64), (unsigned)((R + 63) / 64 + E), 1}, 256,
                   [] { k_moe_gemm(A.a, A.b, A.y, A.off, A.rows, A.E, A.S, A.K, A.M, A.tb); });
        for (int e = 0; e < E; e++)
            for (int r = L.off[e]; r < L.off[e] + L.rows[e]; r++)
                for (int j = 0; j < F; j++) {
                    double s = 0;
                    for (int i = 0; i < C; i++) s += (double)buf[(long long)r * C + i] * W[(long long)e * C * F + (tb ? (long long)j * C + i : (long long)i * F + j)];
                    outr[(long long)r * F + j] = s;
                }
        snprintf(what, sizeof what, "%s: grouped GEMM%s, one launch", name, tb ? " (transposed weights)" : "");
        check_err(rel_err(out, outr, R * F), 1e-5, what);
        free(W), free(outr);
        if (tb) { free(out); continue; }
        /* dW_e [C, F] = buf_e^T out_e */
        float *dW = (float *)malloc(sizeof(float) * E * C * F);
        double *dWr = (double *)calloc((size_t)E * C * F, sizeof(double));
        for (long long i = 0; i < (long long)E * C * F; i++) dW[i] = NAN; /* every element written, zero for an empty expert */
        A.b = out, A.y = dW;
        emu_launch(emu_dim{(unsigned)((F + 63) / 64), (unsigned)((C + 63) / 64), (unsigned)E}, 256,
                   [] { k_moe_gemm_back_w(A.a, A.b, A.y, A.off, A.rows, A.S, A.K, A.M); });
        for (int e = 0; e < E; e++)
            for (int r = L.off[e]; r < L.off[e] + L.rows[e]; r++)
                for (int i = 0; i < C; i++)
                    for (int j = 0; j < F; j++) dWr[(long long)e * C * F + (long long)i * F + j] += (double)buf[(long long)r * C + i] * out[(long long)r * F + j];
        snprintf(what, sizeof what, "%s: grouped weight gradient", name);
        check_err(rel_err(dW, dWr, (long long)E * C * F), 1e-5, what);
        free(out), free(dW), free(dWr);
    }
    /* the balance loss and its gradient (finite differences) */
    float loss, dloss = 0.7f, *daux = (float *)malloc(sizeof(float) * N * E);
    static float *s_loss, *s_dloss, *s_daux;
    s_loss = &loss, s_dloss = &dloss, s_daux = daux, A.counts = L.counts;
    emu_launch(emu_dim{1, 1, 1}, 256, [] { k_moe_aux_loss(s_lg, A.counts, s_loss, A.N, A.E); });
    emu_launch(emu_dim{(unsigned)((N + 255) / 256), 1, 1}, 256, [] { k_moe_aux_loss_back(s_lg, A.counts, s_dloss, s_daux, A.N, A.E); });
    double *l = (double *)malloc(sizeof(double) * N * E), *dauxr = (double *)malloc(sizeof(double) * N * E), lr;
    for (long long i = 0; i < N * E; i++) l[i] = lg[i];
    lr = ref_aux(l, N, E, L.counts);
    for (long long i = 0; i < N * E; i++) {
        double h = 1e-5, p, m;
        l[i] += h, p = ref_aux(l, N, E, L.counts), l[i] -= 2 * h, m = ref_aux(l, N, E, L.counts), l[i] += h;
        dauxr[i] = dloss * (p - m) / (2 * h);
    }
    snprintf(what, sizeof what, "%s: balance loss", name);
    check_err(rel_err(&loss, &lr, 1), 1e-5, what);
    snprintf(what, sizeof what, "%s: balance loss gradient against finite differences", name);
    check_err(rel_err(daux, dauxr, N * E), 1e-4, what);
    free(lg), free(bias), free(idx), free(dev_row), free(w), free(dw), free(dl), free(wr), free(dlr), free(x), free(buf), free(y), free(gy), free(gw);
    free(bufr), free(yr), free(gwr), free(daux), free(l), free(dauxr);
}

/* the by-expert buffer [E, S, K] (no layout: expert e's S rows at e S) */
static void run_by_expert(int E, int S, int K, int M) {
    float *x = (float *)malloc(sizeof(float) * E * S * K), *W = (float *)malloc(sizeof(float) * E * K * M);
    float *y = (float *)malloc(sizeof(float) * E * S * M), *dW = (float *)malloc(sizeof(float) * E * K * M);
    for (long long i = 0; i < (long long)E * S * K; i++) x[i] = frand();
    for (long long i = 0; i < (long long)E * K * M; i++) W[i] = frand();
    double *yr = (double *)calloc((size_t)E * S * M, sizeof(double)), *dWr = (double *)calloc((size_t)E * K * M, sizeof(double));
    A.a = x, A.b = W, A.y = y, A.off = NULL, A.rows = NULL, A.E = E, A.S = S, A.K = K, A.M = M, A.tb = 0;
    emu_launch(emu_dim{(unsigned)((M + 63) / 64), (unsigned)(E * ((S + 63) / 64)), 1}, 256,
               [] { k_moe_gemm(A.a, A.b, A.y, A.off, A.rows, A.E, A.S, A.K, A.M, A.tb); });
    A.b = y, A.y = dW;
    emu_launch(emu_dim{(unsigned)((M + 63) / 64), (unsigned)((K + 63) / 64), (unsigned)E}, 256,
               [] { k_moe_gemm_back_w(A.a, A.b, A.y, A.off, A.rows, A.S, A.K, A.M); });
    for (int e = 0; e < E; e++)
        for (int r = 0; r < S; r++)
            for (int j = 0; j < M; j++) {
                double s = 0;
                for (int i = 0; i < K; i++) s += (double)x[((long long)e * S + r) * K + i] * W[(long long)e * K * M + (long long)i * M + j];
                yr[((long long)e * S + r) * M + j] = s;
            }
    for (int e = 0; e < E; e++)
        for (int r = 0; r < S; r++)
            for (int i = 0; i < K; i++)
                for (int j = 0; j < M; j++)
                    dWr[(long long)e * K * M + (long long)i * M + j] += (double)x[((long long)e * S + r) * K + i] * y[((long long)e * S + r) * M + j];
    check_err(rel_err(y, yr, (long long)E * S * M), 1e-5, "by expert: grouped GEMM [E, S, K]");
    check_err(rel_err(dW, dWr, (long long)E * K * M), 1e-5, "by expert: grouped weight gradient");
    free(x), free(W), free(y), free(dW), free(yr), free(dWr);
}

int main() {
    /* name, N, E, k, C, F, capacity factor x 100 (0 dropless), flags (1 sigmoid, 2 not normalised), skew */
    run_case("dropless top-2", 150, 8, 2, 70, 80, 0, 0, 0);   /* experts over one 64-row tile, C and F over one tile */
    run_case("capacity 1.0 top-2", 90, 6, 2, 20, 33, 100, 0, 0);
    run_case("sigmoid, unnormalised, top-1", 37, 5, 1, 9, 7, 0, 3, 0);
    run_case("softmax unnormalised top-3", 41, 7, 3, 12, 5, 0, 2, 0);
    run_case("skewed: all to expert 0", 70, 6, 1, 17, 9, 0, 0, 1);
    run_case("skewed: experts 0 and 1 over a capacity", 40, 4, 2, 8, 9, 125, 1, 1);
    run_by_expert(3, 70, 19, 66);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
