/* test_cuda — the GPU backends around their kernels (the kernels themselves are checked op by op
 * against the CPU by test_backend_ops).
 *
 * Without a driver (CI, any machine with no NVIDIA GPU): the cuda and level_zero families report
 * PDDE_ERR_UNAVAILABLE with a clear reason, have no devices, and a session asked for a device that
 * is not there fails cleanly.
 * With a CUDA GPU: the device's properties; matmul (cuBLAS and the built-in kernel, every transpose,
 * batched and shared operands), a few row ops and a reduction against the CPU; a small GPT trained
 * for several AdamW steps (with gradient clipping) on the GPU and on the CPU, with the same losses
 * and the same weights after; SGD with momentum; dropout masks identical to the CPU's; device
 * memory exhaustion reported as PDDE_ERR_DEVICE_OOM; with PDDE_CUDA_GRAPH=1, the steps' losses as without it,
 * each segment captured once and replayed from then on (the device's own count). */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int family_index(pdde_context *ctx, const char *name) {
    for (int i = 0; i < pdde_backend_count(ctx); i++)
        if (!strcmp(pdde_backend_name(ctx, i), name)) return i;
    return -1;
}

static void fill(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
}

static double max_rel_diff(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = d; /* NaN-safe max */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 1e-30 ? den : 1.0);
}

/* ------------------------------------------------------------------------------------------------
 * Without a device */

static void test_status(pdde_context *ctx) {
    int cu = family_index(ctx, "cuda"), ze = family_index(ctx, "level_zero");
    CHECK(cu > 0, "the cuda family is registered");
    CHECK(ze > 0, "the level_zero family is registered");
    const char *why = NULL;
    pdde_status st = cu > 0 ? pdde_backend_status(ctx, cu, &why) : PDDE_ERR_UNAVAILABLE;
    if (st != PDDE_OK) {
        CHECK(st == PDDE_ERR_UNAVAILABLE, "cuda unavailable: status %d", st);
        CHECK(why && (strstr(why, "CUDA driver") || strstr(why, "CUDA device")), "cuda: a clear reason, got '%s'",
              why ? why : "(null)");
        CHECK(pdde_device_find(ctx, "cuda", 0) == -1, "no cuda device when the family is unavailable");
        printf("cuda: unavailable: %s\n", why ? why : "");
    } else {
        printf("cuda: available\n");
    }
    why = NULL;
    st = ze > 0 ? pdde_backend_status(ctx, ze, &why) : PDDE_ERR_UNAVAILABLE;
    if (st != PDDE_OK) {
        CHECK(st == PDDE_ERR_UNAVAILABLE, "level_zero unavailable: status %d", st);
        CHECK(why && strstr(why, "no Level Zero driver"), "level_zero: a clear reason, got '%s'", why ? why : "(null)");
        CHECK(pdde_device_find(ctx, "level_zero", 0) == -1, "no level_zero device when the family is unavailable");
        printf("level_zero: unavailable: %s\n", why ? why : "");
    } else {
        printf("level_zero: available (%d devices)\n", pdde_device_find(ctx, "level_zero", 0) >= 0);
    }
    /* the library stays usable: no error left behind by the absent families */
    CHECK(pdde_device_count(ctx) >= 1, "the CPU is always there");
}

/* A session on a device index that does not exist (where CUDA would be) fails cleanly. */
static void test_missing_device_session(pdde_context *ctx) {
    int dev = pdde_device_find(ctx, "cuda", 0);
    if (dev >= 0) return;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_param(g, "x", 2, (int64_t[]){4, 4}, 0.1f);
    pdde_mark_output(pdde_relu(g, x));
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = pdde_device_count(ctx); /* one past the last device */
    pdde_session *s = (pdde_session *)&sp;
    pdde_status st = pdde_session_init(g, &sp, &s);
    CHECK(st != PDDE_OK && s == NULL, "a session on a missing device is refused (status %d)", st);
    CHECK(pdde_last_error(ctx)[0] != 0, "with a message");
    printf("session on a missing device: %s (%s)\n", pdde_status_str(st), pdde_last_error(ctx));
    pdde_graph_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * With a CUDA device: op graphs run on the CPU and on the GPU from the same inputs */

typedef pdde_tensor *(*build_fn)(pdde_graph *g, pdde_tensor **leaves, int *n_leaves, int variant);

/* Runs build() on device dev and returns the output (malloc'ed, *n elements). */
static float *run_graph(pdde_context *ctx, int dev, build_fn build, int variant, int64_t *n) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *leaves[8];
    int nl = 0;
    pdde_tensor *y = build(g, leaves, &nl, variant);
    float *out = NULL;
    if (!y) {
        CHECK(0, "graph: %s", pdde_last_error(ctx));
        pdde_graph_free(g);
        return NULL;
    }
    pdde_mark_output(y);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    pdde_session *s = NULL;
    pdde_status st = pdde_session_init(g, &sp, &s);
    CHECK(st == PDDE_OK, "session on device %d: %s", dev, pdde_last_error(ctx));
    if (st == PDDE_OK) {
        for (int i = 0; i < nl; i++) {
            int64_t m = pdde_tensor_numel(leaves[i]);
            if (leaves[i]->dtype == PDDE_I32) {
                int32_t *v = malloc((size_t)(m ? m : 1) * 4);
                for (int64_t k = 0; k < m; k++) v[k] = (int32_t)((k * 7 + 3) % 17) - (k % 11 == 5 ? 20 : 0);
                pdde_session_write(s, leaves[i], v, (size_t)m * 4);
                free(v);
            } else {
                float *v = malloc((size_t)(m ? m : 1) * 4);
                fill(v, m, 1234u + (uint32_t)i * 77u);
                pdde_session_write(s, leaves[i], v, (size_t)m * 4);
                free(v);
            }
        }
        st = pdde_session_run(s, PDDE_RUN_FORWARD);
        CHECK(st == PDDE_OK, "run on device %d: %s", dev, pdde_last_error(ctx));
        *n = pdde_tensor_numel(y);
        out = malloc((size_t)(*n ? *n : 1) * 4);
        pdde_session_read(s, y, out, (size_t)*n * 4);
    }
    pdde_session_free(s);
    pdde_graph_free(g);
    return out;
}

static void compare(pdde_context *ctx, int dev, const char *what, build_fn build, int variant, double tol) {
    int64_t n1 = 0, n2 = 0;
    float *ref = run_graph(ctx, 0, build, variant, &n1);
    float *got = run_graph(ctx, dev, build, variant, &n2);
    if (ref && got) {
        double e = max_rel_diff(got, ref, n1);
        CHECK(n1 == n2 && e <= tol, "%s (variant %d): max diff %.3g of the largest value (tolerance %.1g)", what, variant,
              e, tol);
    }
    free(ref);
    free(got);
}

/* matmul variants: bit 0 ta, bit 1 tb, bits 2-3: 0 plain 2-D, 1 both batched, 2 b shared, 3 a shared */
static pdde_tensor *b_matmul(pdde_graph *g, pdde_tensor **lv, int *nl, int v) {
    int64_t M = 67, N = 131, K = 45, B = 3;
    int ta = v & 1, tb = (v >> 1) & 1, mode = v >> 2;
    int64_t as[3] = {B, ta ? K : M, ta ? M : K}, bs[3] = {B, tb ? N : K, tb ? K : N};
    int a3 = mode == 1 || mode == 2, b3 = mode == 1 || mode == 3;
    pdde_tensor *a = pdde_input(g, "a", PDDE_F32, a3 ? 3 : 2, a3 ? as : as + 1);
    pdde_tensor *b = pdde_input(g, "b", PDDE_F32, b3 ? 3 : 2, b3 ? bs : bs + 1);
    lv[(*nl)++] = a;
    lv[(*nl)++] = b;
    return pdde_matmul(g, a, b, ta, tb);
}

static pdde_tensor *b_rowops(pdde_graph *g, pdde_tensor **lv, int *nl, int v) {
    int64_t R = 37, C = v == 2 ? 3001 : 257;
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 3, (int64_t[]){R / 37 + 1, 37, C});
    pdde_tensor *gm = pdde_input(g, "g", PDDE_F32, 1, (int64_t[]){C});
    pdde_tensor *bt = pdde_input(g, "b", PDDE_F32, 1, (int64_t[]){C});
    lv[(*nl)++] = x;
    lv[(*nl)++] = gm;
    lv[(*nl)++] = bt;
    if (v == 0) return pdde_layernorm(g, x, gm, bt, 1e-5f);
    if (v == 1) return pdde_rmsnorm(g, x, gm, 1e-6f);
    return pdde_gelu(g, pdde_add(g, x, bt));
}

static pdde_tensor *b_softmax(pdde_graph *g, pdde_tensor **lv, int *nl, int v) {
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 4, (int64_t[]){2, 3, 41, 41});
    lv[(*nl)++] = x;
    return pdde_softmax(g, pdde_scale(g, x, 3.0f), v);
}

static pdde_tensor *b_reduce(pdde_graph *g, pdde_tensor **lv, int *nl, int v) {
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 3, (int64_t[]){29, 513, 7});
    lv[(*nl)++] = x;
    if (v == 3) return pdde_mean(g, x, -1, 0);
    return pdde_sum(g, x, v, 0);
}

static pdde_tensor *b_xent(pdde_graph *g, pdde_tensor **lv, int *nl, int v) {
    (void)v;
    pdde_tensor *x = pdde_input(g, "logits", PDDE_F32, 2, (int64_t[]){61, 17});
    pdde_tensor *t = pdde_input(g, "targets", PDDE_I32, 1, (int64_t[]){61});
    lv[(*nl)++] = x;
    lv[(*nl)++] = t;
    return pdde_cross_entropy(g, x, t);
}

static pdde_tensor *b_dropout(pdde_graph *g, pdde_tensor **lv, int *nl, int v) {
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){100, 1001});
    lv[(*nl)++] = x;
    return pdde_dropout(g, x, v ? 0.5f : 0.1f, 0x123456789abcull);
}

static void test_ops(pdde_context *ctx, int dev) {
    for (int v = 0; v < 16; v++) compare(ctx, dev, "matmul", b_matmul, v, 2e-5);
    for (int v = 0; v < 3; v++) compare(ctx, dev, "row ops", b_rowops, v, 2e-5);
    for (int v = 0; v < 2; v++) compare(ctx, dev, "softmax", b_softmax, v, 2e-6);
    for (int v = 0; v < 4; v++) compare(ctx, dev, "sum/mean", b_reduce, v, 2e-5);
    compare(ctx, dev, "cross-entropy", b_xent, 0, 2e-6);
    /* the mask is a hash of (seed, counter, index): the GPU must keep exactly the CPU's elements */
    for (int v = 0; v < 2; v++) compare(ctx, dev, "dropout", b_dropout, v, 1e-6);
}

/* ------------------------------------------------------------------------------------------------
 * Training: a small GPT, the same steps on the CPU and on the GPU */

static const gpt_config tiny = {.vocab = 61, .ctx = 16, .layers = 2, .heads = 4, .width = 64, .batch = 4};

typedef struct {
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
} trainer;

static int trainer_init(pdde_context *ctx, trainer *t, int dev, int sgd) {
    memset(t, 0, sizeof *t);
    pdde_graph_init(ctx, &t->g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f;
    op.clip_norm = 1.0f;
    op.weight_decay = 0.01f;
    op.momentum = 0.9f;
    gpt_config c = tiny;
    c.separate_qkv = gpt_separate_qkv("cuda");
    if (gpt_build(t->g, &c, &t->m) || pdde_backward(t->g, t->m.loss)) return -1;
    if ((sgd ? pdde_optimizer_sgd(t->g, &op) : pdde_optimizer_adamw(t->g, &op)) != PDDE_OK) return -1;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    return pdde_session_init(t->g, &sp, &t->s);
}

static void trainer_free(trainer *t) {
    pdde_session_free(t->s);
    pdde_graph_free(t->g);
}

static void feed(trainer *t, int step) {
    int BT = tiny.batch * tiny.ctx;
    int32_t x[1024], y[1024];
    for (int i = 0; i < BT; i++) x[i] = (i * 7 + step * 3) % tiny.vocab, y[i] = (i * 5 + step + 1) % tiny.vocab;
    pdde_session_write(t->s, t->m.ids, x, (size_t)BT * 4);
    pdde_session_write(t->s, t->m.targets, y, (size_t)BT * 4);
}

static void test_training(pdde_context *ctx, int dev, int sgd) {
    const char *opt = sgd ? "sgd" : "adamw";
    trainer cpu, gpu;
    int st1 = trainer_init(ctx, &cpu, 0, sgd);
    CHECK(st1 == PDDE_OK, "%s cpu trainer: %s", opt, pdde_last_error(ctx));
    int st2 = trainer_init(ctx, &gpu, dev, sgd);
    CHECK(st2 == PDDE_OK, "%s gpu trainer: %s", opt, pdde_last_error(ctx));
    if (st1 == PDDE_OK && st2 == PDDE_OK) {
        float first = 0, last_c = 0, last_g = 0;
        double worst = 0;
        for (int step = 0; step < 8; step++) {
            feed(&cpu, step);
            feed(&gpu, step);
            CHECK(pdde_session_run(cpu.s, PDDE_RUN_STEP) == PDDE_OK, "cpu step: %s", pdde_last_error(ctx));
            CHECK(pdde_session_run(gpu.s, PDDE_RUN_STEP) == PDDE_OK, "gpu step: %s", pdde_last_error(ctx));
            float lc = pdde_session_loss(cpu.s), lg = pdde_session_loss(gpu.s);
            double d = fabs(lc - lg) / fabs(lc);
            if (!(d <= worst)) worst = d; /* (NaN counts) */
            if (step == 0) first = lc;
            last_c = lc, last_g = lg;
        }
        printf("%s: loss %.5f -> cpu %.5f, gpu %.5f (largest relative loss difference %.2g)\n", opt, first, last_c,
               last_g, worst);
        CHECK(worst < 1e-3, "%s: GPU losses follow the CPU's (worst relative difference %.3g)", opt, worst);
        CHECK(last_g < first, "%s: the loss goes down on the GPU (%.4f -> %.4f)", opt, first, last_g);
        /* the weights after the steps */
        pdde_tensor *wc = pdde_graph_find(cpu.g, "h0.attn.w"), *wg = pdde_graph_find(gpu.g, "h0.attn.w");
        if (!wc) wc = pdde_graph_find(cpu.g, "wte"), wg = pdde_graph_find(gpu.g, "wte");
        if (wc && wg) {
            int64_t n = pdde_tensor_numel(wc);
            float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
            pdde_session_read(cpu.s, wc, a, (size_t)n * 4);
            pdde_session_read(gpu.s, wg, b, (size_t)n * 4);
            double e = max_rel_diff(b, a, n);
            CHECK(e < 1e-3, "%s: weights %s after 8 steps differ by %.3g", opt, wc->name, e);
            free(a);
            free(b);
        }
    }
    if (st1 == PDDE_OK) trainer_free(&cpu);
    else pdde_graph_free(cpu.g);
    if (st2 == PDDE_OK) trainer_free(&gpu);
    else pdde_graph_free(gpu.g);
}

static void test_props_and_oom(pdde_context *ctx, int dev) {
    pdde_device_props p;
    CHECK(pdde_device_get_props(ctx, dev, &p) == PDDE_OK, "props");
    CHECK(p.kind == PDDE_DEVICE_GPU && !strcmp(p.backend, "cuda"), "a cuda GPU");
    CHECK(p.name[0] && p.memory_total > (1ull << 30) && p.compute_units > 0, "name, memory, SMs");
    printf("cuda device %d: %s, %.1f GiB, %d SMs, %.1f TFLOP/s f32 peak, %.0f GB/s\n", dev, p.name,
           (double)p.memory_total / (1ull << 30), p.compute_units, p.peak_flops_f32 / 1e12, p.mem_bandwidth / 1e9);
    /* a parameter of 4 TiB: the device cannot hold it */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *w = pdde_param(g, "huge", 2, (int64_t[]){1ll << 20, 1ll << 20}, 0.0f);
    pdde_mark_output(pdde_scale(g, w, 2.0f));
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    pdde_session *s = NULL;
    pdde_status st = pdde_session_init(g, &sp, &s);
    CHECK(st == PDDE_ERR_DEVICE_OOM && !s, "4 TiB on the GPU: status %d (%s)", st, pdde_last_error(ctx));
    CHECK(strstr(pdde_last_error(ctx), "bytes") != NULL, "the message names the size: %s", pdde_last_error(ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* The losses of 8 AdamW steps on device dev (NaN where a step failed) */
static void train_losses(pdde_context *ctx, int dev, float loss[8]) {
    trainer t;
    for (int i = 0; i < 8; i++) loss[i] = NAN;
    int st = trainer_init(ctx, &t, dev, 0);
    CHECK(st == PDDE_OK, "trainer: %s", pdde_last_error(ctx));
    for (int step = 0; st == PDDE_OK && step < 8; step++) {
        feed(&t, step);
        st = pdde_session_run(t.s, PDDE_RUN_STEP);
        CHECK(st == PDDE_OK, "step %d: %s", step, pdde_last_error(ctx));
        loss[step] = pdde_session_loss(t.s);
    }
    if (t.s) trainer_free(&t);
    else pdde_graph_free(t.g);
}

int main(void) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) return 1;
    test_status(ctx);
    test_missing_device_session(ctx);
    int dev = pdde_device_find(ctx, "cuda", 0);
    float plain[8];
    if (dev >= 0) {
        train_losses(ctx, dev, plain);
        test_props_and_oom(ctx, dev);
        test_ops(ctx, dev);
        test_training(ctx, dev, 0);
        test_training(ctx, dev, 1);
    } else {
        test_skip("cuda", "no CUDA device: the GPU checks");
    }
    pdde_context_free(ctx);
    if (dev >= 0) {
        /* the built-in GEMM, as on a machine without cuBLAS (the variable is read when the family starts) */
        setenv("PDDE_CUDA_NO_CUBLAS", "1", 1);
        pdde_context_init(NULL, &ctx);
        dev = pdde_device_find(ctx, "cuda", 0);
        for (int v = 0; v < 16; v++) compare(ctx, dev, "matmul without cuBLAS", b_matmul, v, 2e-5);
        test_training(ctx, dev, 0);
        pdde_context_free(ctx);
        unsetenv("PDDE_CUDA_NO_CUBLAS");
    }
    /* PDDE_CUDA_GRAPH=1 (read when a device opens): the steps captured once and replayed as CUDA graphs, the
     * optimizer's step count patched into the kept graph each step (a kernel argument): the losses of the steps without
     * (replays run the same kernels; 1e-5 for a library that picks other kernels under capture). Without a
     * device, the family is still reported unavailable with its reason. */
    setenv("PDDE_CUDA_GRAPH", "1", 1);
    pdde_context_init(NULL, &ctx);
    if (dev < 0) test_status(ctx);
    else {
        float graphed[8];
        train_losses(ctx, pdde_device_find(ctx, "cuda", 0), graphed);
        double worst = 0;
        for (int i = 0; i < 8; i++) {
            double d = fabs((double)graphed[i] - plain[i]) / fabs((double)plain[i]);
            if (!(d <= worst)) worst = d;
        }
        printf("PDDE_CUDA_GRAPH=1: losses %.5f .. %.5f, largest relative difference to the steps without graphs %.2g\n", graphed[0], graphed[7],
               worst);
        CHECK(worst <= 1e-5, "PDDE_CUDA_GRAPH=1: losses differ from the steps without graphs by %.3g (relative)", worst);
    }
    /* the device's close says what its graphs did (stderr, read back here): of 8 alike steps, the first two
     * run plain, the third is captured, the other five replay with the step patched in (four where the first
     * step differs), none falls back */
    FILE *said = NULL;
    int saved = -1;
    if (dev >= 0) fflush(stderr), said = tmpfile(), saved = said ? dup(2) : -1;
    if (saved >= 0) dup2(fileno(said), 2);
    pdde_context_free(ctx);
    if (saved >= 0) {
        fflush(stderr), dup2(saved, 2), close(saved), rewind(said);
        char line[512];
        long long captured = -1, not_kept = -1, replayed = -1, patched = -1, fell_back = -1;
        while (fgets(line, sizeof line, said)) {
            fputs(line, stderr);
            char *p = strstr(line, " segments captured");
            while (p && p > line && p[-1] >= '0' && p[-1] <= '9') p--;
            if (p && strstr(line, "PDDE_CUDA_GRAPH=1 on"))
                sscanf(p, "%lld segments captured (%lld not kept), %lld replayed (%lld kernels patched), %lld fell back", &captured, &not_kept,
                       &replayed, &patched, &fell_back);
        }
        fclose(said);
        printf("PDDE_CUDA_GRAPH=1: %lld segments captured (%lld not kept), %lld replayed (%lld kernels patched), %lld fell back\n", captured,
               not_kept, replayed, patched, fell_back);
        CHECK(captured >= 1 && not_kept == 0 && replayed >= 4 * captured && patched >= 4 && fell_back == 0,
              "PDDE_CUDA_GRAPH=1: %lld captured (%lld not kept), %lld replayed, %lld kernels patched, %lld fell back", captured, not_kept, replayed,
              patched, fell_back);
    }
    unsetenv("PDDE_CUDA_GRAPH");
    return test_finish();
}
