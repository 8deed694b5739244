/* test_expand — the CPU kernel of `expand` (y = s x, x broadcast to y's shape: the backward of a sum or
 * a mean) against a naive reference that indexes x through each output element's coordinates: x
 * broadcast along each axis alone, along every pair, along all (a scalar), with fewer dims than y,
 * rows longer than the kernel's blocks, the shapes of an MoE layer's loss ([2048, 256] from [1, 1],
 * [2048, 1] and [1, 256]); x f32 or bf16, y f32 or bf16, scales 1, 0.25 and -1.5, on 2 threads.
 * f32 results are compared exactly (the same product), bf16 ones after the reference's rounding.
 *
 *   test_expand [--perf]   (--perf: also the median time of each MoE shape, f32, 2 threads) */
#include "pdde_extension.h"
#include "tests/test_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pdde_context *ctx;
static const pdde_backend_iface *cpu;
static void *dev, *stream;

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even (finite values) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void tensor(pdde_tensor *t, pdde_dtype dt, int nd, const int64_t *shape, void *data) {
    memset(t, 0, sizeof *t);
    t->dtype = dt, t->ndim = nd, t->data = data, t->device = -1, t->layer = -1;
    for (int i = 0; i < nd; i++) t->shape[i] = shape[i];
}

/* y[i] from x through y's coordinates of i (x's dims aligned at the right; size 1: broadcast) */
static double reference(const pdde_tensor *x, const float *xv, const pdde_tensor *y, int64_t i, float s) {
    int64_t xi = 0, stride = 1;
    for (int d = y->ndim - 1; d >= 0; d--) {
        int64_t c = i % y->shape[d];
        i /= y->shape[d];
        int dx = d - (y->ndim - x->ndim);
        if (dx < 0) continue;
        if (x->shape[dx] != 1) xi += c * stride;
        stride *= x->shape[dx];
    }
    return s * xv[xi];
}

/* One case: returns the kernel's seconds (the median of `reps`; 0 reps: checked once, not timed). */
static double run_case(int ynd, const int64_t *yshape, int xnd, const int64_t *xshape, pdde_dtype xdt, pdde_dtype ydt, float s, int reps) {
    pdde_tensor x, y;
    int64_t nx = 1, ny = 1;
    for (int i = 0; i < xnd; i++) nx *= xshape[i];
    for (int i = 0; i < ynd; i++) ny *= yshape[i];
    float *xv = malloc((size_t)nx * sizeof *xv), *got = malloc((size_t)ny * sizeof *got);
    void *xbuf = malloc((size_t)nx * 4), *ybuf = malloc((size_t)ny * 4);
    if (!xv || !got || !xbuf || !ybuf) {
        CHECK(0, "out of memory");
        free(xv), free(got), free(xbuf), free(ybuf);
        return 0;
    }
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)nx;
    for (int64_t i = 0; i < nx; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((double)(r >> 40) / 8388608.0 - 1.0);
        if (xdt == PDDE_BF16) ((uint16_t *)xbuf)[i] = f32_to_bf16(v), xv[i] = bf16_to_f32(((uint16_t *)xbuf)[i]);
        else ((float *)xbuf)[i] = xv[i] = v;
    }
    memset(ybuf, 0xff, (size_t)ny * 4); /* (NaN: an element the kernel skips fails) */
    tensor(&x, xdt, xnd, xshape, xbuf);
    tensor(&y, ydt, ynd, yshape, ybuf);
    y.op = PDDE_OP_EXPAND, y.nsrc = 1, y.src[0] = &x;
    pdde_op_set_f32(&y, PDDE_P_SCALE, s);
    char what[160];
    int n = snprintf(what, sizeof what, "%s [", pdde_dtype_name(xdt));
    for (int i = 0; i < xnd; i++) n += snprintf(what + n, sizeof what - (size_t)n, "%s%lld", i ? "," : "", (long long)xshape[i]);
    n += snprintf(what + n, sizeof what - (size_t)n, "] -> %s [", pdde_dtype_name(ydt));
    for (int i = 0; i < ynd; i++) n += snprintf(what + n, sizeof what - (size_t)n, "%s%lld", i ? "," : "", (long long)yshape[i]);
    snprintf(what + n, sizeof what - (size_t)n, "] x %g", s);
    double times[15], t = 0;
    int ok = 1;
    for (int k = 0; k < (reps > 0 ? reps : 1) && ok; k++) {
        double t0 = test_now();
        ok = cpu->compute(dev, stream, &y) == PDDE_OK && cpu->stream_sync(dev, stream) == PDDE_OK;
        times[k] = test_now() - t0;
    }
    CHECK(ok, "expand %s: %s", what, pdde_last_error(ctx));
    if (ok && reps > 0) {
        for (int i = 1; i < reps; i++)
            for (int j = i; j > 0 && times[j] < times[j - 1]; j--) t = times[j], times[j] = times[j - 1], times[j - 1] = t;
        t = times[reps / 2];
    }
    int64_t bad = -1;
    double want = 0;
    for (int64_t i = 0; ok && i < ny && bad < 0; i++) {
        want = reference(&x, xv, &y, i, s);
        got[i] = ydt == PDDE_BF16 ? bf16_to_f32(((uint16_t *)ybuf)[i]) : ((float *)ybuf)[i];
        if (ydt == PDDE_BF16) want = bf16_to_f32(f32_to_bf16((float)want));
        if (!(got[i] == (float)want)) bad = i;
    }
    CHECK(ok && bad < 0, "expand %s: element %lld is %.9g, want %.9g", what, (long long)bad, bad >= 0 ? got[bad] : 0, want);
    free(xv), free(got), free(xbuf), free(ybuf);
    return t;
}

int main(int argc, char **argv) {
    int perf = argc > 1 && !strcmp(argv[1], "--perf");
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 2;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK || pdde_device_backend(ctx, 0, &cpu, &dev) != PDDE_OK || !cpu ||
        strcmp(cpu->name, "cpu") || cpu->stream_create(dev, &stream) != PDDE_OK) {
        CHECK(0, "the CPU backend: %s", ctx ? pdde_last_error(ctx) : "no context");
        return test_finish();
    }
    const pdde_dtype dts[2] = {PDDE_F32, PDDE_BF16};
    const float scales[3] = {1.0f, 0.25f, -1.5f};
    /* x of [6, 5, 7] with each subset of its axes broadcast (mask bit d: axis d has size 1) */
    const int64_t full[3] = {6, 5, 7};
    for (int mask = 0; mask < 8; mask++)
        for (int xd = 0; xd < 2; xd++)
            for (int yd = 0; yd < 2; yd++) {
                int64_t xs[3];
                for (int d = 0; d < 3; d++) xs[d] = mask >> d & 1 ? 1 : full[d];
                run_case(3, full, 3, xs, dts[xd], dts[yd], scales[(mask + xd + yd) % 3], 0);
            }
    /* fewer dims than y; a 4-D y broadcast on alternate axes; rows past the kernel's 1024-element
     * blocks, walked and filled */
    for (int xd = 0; xd < 2; xd++) {
        run_case(3, full, 1, (int64_t[]){7}, dts[xd], PDDE_F32, 0.25f, 0);
        run_case(3, full, 2, (int64_t[]){5, 1}, dts[xd], PDDE_F32, -1.5f, 0);
        run_case(4, (int64_t[]){3, 4, 5, 6}, 4, (int64_t[]){3, 1, 5, 1}, dts[xd], PDDE_BF16, 1.0f, 0);
        run_case(4, (int64_t[]){3, 4, 5, 6}, 4, (int64_t[]){1, 4, 1, 6}, dts[xd], PDDE_F32, 0.25f, 0);
        run_case(2, (int64_t[]){3, 2500}, 2, (int64_t[]){1, 2500}, dts[xd], PDDE_F32, -1.5f, 0);
        run_case(2, (int64_t[]){3, 2500}, 2, (int64_t[]){3, 1}, dts[xd], PDDE_BF16, 0.25f, 0);
        run_case(1, (int64_t[]){1}, 1, (int64_t[]){1}, dts[xd], PDDE_F32, -1.5f, 0);
    }
    /* the MoE layer's loss (the sum of [2048, 256]) and its rows and columns: checked, and with --perf timed */
    const int64_t moe[2] = {2048, 256}, moe_x[3][2] = {{1, 1}, {2048, 1}, {1, 256}};
    for (int i = 0; i < 3; i++)
        for (int xd = 0; xd < 2; xd++)
            for (int k = 0; k < 3; k++) {
                double t = run_case(2, moe, 2, moe_x[i], dts[xd], PDDE_F32, scales[k], perf && !xd && k == 0 ? 15 : 0);
                if (t > 0) printf("expand f32 [%lld,%lld] -> [2048,256]: %.3f ms (median of 15, 2 threads)\n", (long long)moe_x[i][0],
                                  (long long)moe_x[i][1], t * 1e3);
            }
    cpu->stream_free(dev, stream);
    pdde_context_free(ctx);
    return test_finish();
}
