/* test_matmul — the CPU matmul, with whatever GEMM the build has (oneDNN, OpenBLAS or the portable
 * loop; `make test` runs all three builds), against a double-precision reference computed here.
 *
 * Every form the graph uses (the four transposes, batched, a shared 2-D b or a), f32 and bf16 (bf16 in,
 * f32 accumulation and output), on 1, 2 and 3 threads with shapes that split into tiles by rows, by
 * columns and by uneven batch chunks. Bounds per element, with S = sum_k |a_ik b_kj|:
 *   f32: |c - ref| <= 4 K 2^-24 S (the rounding of K float accumulations);
 *   bf16 against the reference on the bf16-rounded inputs: the same f32 bound (bf16 products are exact
 *   in f32), and against the reference on the unrounded f32 inputs: (2^-7 + 2^-16) S on top (each
 *   input rounds to 8 significant bits, off by at most 2^-8 relative; a product by 2^-7 + 2^-16).
 * The backward pass of a bf16 matmul (the gradient GEMMs run in bf16 too) is checked the same way. */
#include "pdde.h"
#include "tests/test_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct { int64_t M, N, K; int ta, tb; int64_t batch; int shared; /* 1: b 2-D, 2: a 2-D */ } mm_case;

static const mm_case cases[] = {
    {96, 40, 70, 0, 0, 0, 0},   /* rows split */
    {24, 300, 70, 0, 0, 0, 0},  /* columns split */
    {96, 40, 70, 1, 0, 0, 0},   {24, 300, 70, 0, 1, 0, 0}, {61, 67, 53, 1, 1, 0, 0},
    {33, 29, 31, 0, 0, 5, 0},   /* batch chunks of 2, 2, 1 on 3 threads */
    {33, 29, 31, 0, 1, 2, 0},   {33, 29, 31, 1, 0, 4, 0}, {33, 29, 31, 1, 1, 3, 0},
    {40, 50, 60, 0, 0, 3, 1},   /* shared b, a not transposed: one GEMM over all rows */
    {40, 50, 60, 1, 1, 3, 1},   /* shared b under a transposed a: a broadcast batch */
    {40, 50, 60, 0, 0, 4, 2},   {40, 50, 60, 0, 1, 4, 2},
    {1, 1, 1, 0, 0, 0, 0},      {3, 5, 600, 0, 1, 0, 0},
};

static uint64_t rng = 88172645463325252ull;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float bf16_round(float x) { return pdde_bf16_to_f32(pdde_f32_to_bf16(x)); }

/* element (bi, i, k) of op(a) for a stored row-major as [batch?, rows, cols] */
static double at(const float *x, int64_t stride, int trans, int64_t rows_op, int64_t cols_op, int64_t bi, int64_t i, int64_t k) {
    return trans ? x[bi * stride + k * rows_op + i] : x[bi * stride + i * cols_op + k];
}

/* Checks y (batch x M x N) against op(a) op(b) computed in double from xa, xb (f32 values) with the
 * bound tol K S + rel S. Returns the number of elements outside it. */
static int check_product(const char *what, const mm_case *c, const float *y, const float *xa, const float *xb, double tol, double rel) {
    int64_t M = c->M, N = c->N, K = c->K, B = c->batch ? c->batch : 1;
    int64_t sa = c->shared == 2 ? 0 : M * K, sb = c->shared == 1 ? 0 : K * N;
    int bad = 0;
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double ref = 0, S = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = at(xa, sa, c->ta, M, K, bi, i, k) * at(xb, sb, c->tb, K, N, bi, k, j);
                    ref += p, S += p < 0 ? -p : p;
                }
                double err = fabs((double)y[(bi * M + i) * N + j] - ref);
                if (!(err <= tol * (double)K * S + rel * S + 1e-30)) { /* NaN fails too */
                    if (!bad) fprintf(stderr, "  %s: c[%lld,%lld,%lld] = %.9g, reference %.9g (bound %.3g)\n", what, (long long)bi,
                                      (long long)i, (long long)j, y[(bi * M + i) * N + j], ref, tol * (double)K * S + rel * S);
                    bad++;
                }
            }
    return bad;
}

static void run_case(pdde_context *ctx, const mm_case *c, pdde_dtype dt) {
    int64_t M = c->M, N = c->N, K = c->K, B = c->batch;
    int64_t ar = c->ta ? K : M, ac = c->ta ? M : K, br = c->tb ? N : K, bc = c->tb ? K : N;
    int a3 = B && c->shared != 2, b3 = B && c->shared != 1;
    int64_t sa[3] = {B, ar, ac}, sb[3] = {B, br, bc};
    int64_t na = (a3 ? B : 1) * ar * ac, nb = (b3 ? B : 1) * br * bc, ny = (B ? B : 1) * M * N;
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_graph_init(ctx, &g);
    /* f32 parameters, cast to bf16 when dt is bf16, so that the backward pass reaches them */
    pdde_tensor *pa = pdde_param(g, "a", a3 ? 3 : 2, a3 ? sa : sa + 1, 0), *pb = pdde_param(g, "b", b3 ? 3 : 2, b3 ? sb : sb + 1, 0);
    pdde_tensor *a = dt == PDDE_BF16 ? pdde_cast(g, pa, PDDE_BF16) : pa, *b = dt == PDDE_BF16 ? pdde_cast(g, pb, PDDE_BF16) : pb;
    pdde_tensor *y = pdde_matmul(g, a, b, c->ta, c->tb);
    pdde_mark_output(y);
    pdde_backward(g, pdde_sum(g, y, -1, 0)); /* dy = 1: da = 1 op(b)^T summed, db likewise */
    char label[128];
    snprintf(label, sizeof label, "%s %lldx%lldx%lld ta%d tb%d batch %lld shared %d, %d threads", pdde_dtype_name(dt), (long long)M,
             (long long)N, (long long)K, c->ta, c->tb, (long long)B, c->shared, pdde_context_thread_count(ctx));
    pdde_status st = pdde_graph_status(g);
    if (st == PDDE_OK) st = pdde_session_init(g, NULL, &s);
    CHECK(st == PDDE_OK, "%s: %s", label, pdde_last_error(ctx));
    if (st != PDDE_OK) { pdde_graph_free(g); return; }
    float *xa = malloc((size_t)na * 4), *xb = malloc((size_t)nb * 4), *ra = malloc((size_t)na * 4), *rb = malloc((size_t)nb * 4);
    float *out = malloc((size_t)ny * 4), *ga = malloc((size_t)na * 4);
    for (int64_t i = 0; i < na; i++) xa[i] = urand(), ra[i] = dt == PDDE_BF16 ? bf16_round(xa[i]) : xa[i];
    for (int64_t i = 0; i < nb; i++) xb[i] = urand(), rb[i] = dt == PDDE_BF16 ? bf16_round(xb[i]) : xb[i];
    pdde_session_write(s, pa, xa, (size_t)na * 4);
    pdde_session_write(s, pb, xb, (size_t)nb * 4);
    st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    CHECK(st == PDDE_OK, "%s: run: %s", label, pdde_last_error(ctx));
    pdde_session_read(s, y, out, (size_t)ny * 4);
    pdde_session_read(s, pa->grad, ga, (size_t)na * 4);
    const double f32_tol = 4.0 / 16777216.0;
    CHECK(check_product("product", c, out, ra, rb, f32_tol, 0) == 0, "%s: product outside the f32 accumulation bound", label);
    if (dt == PDDE_BF16)
        CHECK(check_product("product vs f32 inputs", c, out, xa, xb, f32_tol, 1.0 / 128 + 1.0 / 65536) == 0, "%s: product outside the bf16 bound", label);
    /* da = dy op(b)^T with dy = 1, as a product of its own: (M x N ones) times op(b)^T, per batch; a
     * shared (2-D) a sums over the batch. Checked elementwise against the sums of b computed here. */
    int bad = 0;
    int64_t sbs = c->shared == 1 ? 0 : K * N;
    for (int64_t bi = 0; bi < (a3 ? B : 1); bi++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++) {
                double ref = 0, S = 0;
                for (int64_t b2 = (a3 ? bi : 0); b2 < (a3 ? bi + 1 : (B ? B : 1)); b2++)
                    for (int64_t j = 0; j < N; j++) {
                        double v = at(rb, sbs, c->tb, K, N, b2, k, j);
                        ref += v, S += fabs(v);
                    }
                float got = c->ta ? ga[bi * M * K + k * M + i] : ga[bi * M * K + i * K + k];
                if (!(fabs(got - ref) <= 8.0 / 16777216.0 * (double)(N * (B ? B : 1)) * S + 1e-30)) bad++;
            }
    CHECK(bad == 0, "%s: gradient of a off in %d elements", label, bad);
    free(xa), free(xb), free(ra), free(rb), free(out), free(ga);
    pdde_session_free(s);
    pdde_graph_free(g);
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    for (int threads = 1; threads <= 3; threads++) {
        cp.n_threads = threads;
        pdde_context *ctx;
        if (pdde_context_init(&cp, &ctx) != PDDE_OK) { CHECK(0, "context with %d threads", threads); continue; }
        if (threads == 1) {
            pdde_device_props p;
            pdde_device_get_props(ctx, 0, &p);
            printf("device 0: %s\n", p.name);
        }
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            run_case(ctx, &cases[i], PDDE_F32);
            run_case(ctx, &cases[i], PDDE_BF16);
        }
        pdde_context_free(ctx);
    }
    /* mismatched dtypes are refused with a message naming both */
    pdde_context *ctx;
    pdde_graph *g;
    pdde_context_init(&cp, &ctx);
    pdde_graph_init(ctx, &g);
    int64_t s2[2] = {4, 4};
    pdde_tensor *y = pdde_matmul(g, pdde_input(g, "xf", PDDE_F32, 2, s2), pdde_input(g, "xb", PDDE_BF16, 2, s2), 0, 0);
    CHECK(!y && pdde_graph_status(g) == PDDE_ERR_DTYPE && strstr(pdde_last_error(ctx), "xb (bf16)"), "f32 x bf16: %s",
          pdde_last_error(ctx));
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return test_finish();
}
