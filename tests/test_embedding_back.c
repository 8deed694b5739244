/* test_embedding_back — the embedding's backward on an accelerator gives the same bits every run, and the
 * CPU's: the table's gradient [V, C] adds each row's dy rows in the order of the ids (backends/cpu.c), which
 * the devices' sorted kernels (backends/gpu_dispatch.h, PGD_EMB_SORTED: OpenCL's default, CUDA's under
 * PDDE_CUDA_EMBEDDING_BACK=sorted) follow. dy is random, so any other order of a row's sum shows in the last
 * bits. Cases: a GPT's vocabulary (50304 rows, 8192 ids drawn skewed: repeated ids out of order), one id
 * many times, a table few ids touch (empty rows), a table 66 times the ids (a CPU device sorts it with the
 * GPUs' bitonic network, the others by counting), a single id, a table read twice (the second gradient
 * lands on the first: a base), the same with the GPUs' sorts forced on PoCL's CPU device (one group's network,
 * the radix sort over many groups: PDDE_OPENCL_EMBEDDING_SORT), 40k to 300k ids through the radix sort, and the
 * float-atomic form (PDDE_OPENCL_EMBEDDING_BACK=atomic, CUDA's default) within 1e-3 of the CPU (its sums in any
 * order). OpenCL is PoCL in CI. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "pdde_extension.h"
#include "tests/test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int64_t V, C, n;
    int tied; /* the table looked up twice (two id sets): the second backward adds onto the first's gradient */
    int skew; /* ids drawn V * u^skew (u uniform): small ids repeat often */
    int one;  /* every id this one (< 0: none) */
} emb_case;

static const emb_case cases[] = {
    {"gpt vocabulary", 50304, 32, 8192, 0, 3, -1},
    {"one id many times", 10, 33, 3000, 0, 1, 7},
    {"few rows touched", 1000, 5, 37, 0, 1, -1},
    {"a table far larger than the ids", 100000, 5, 1500, 0, 3, -1}, /* (a CPU device's sort: the bitonic network) */
    {"a single id", 3, 1, 1, 0, 1, -1},
    {"a table read twice", 64, 16, 100, 1, 2, -1},
};

/* Ids past one group's network (a recommender batch: 26 tables x 4096; a GPT batch 64 x 1024 is 65k): the GPUs'
 * radix sort over many groups, forced on PoCL (PDDE_OPENCL_EMBEDDING_SORT=radix; its CPU device would count).
 * None is a power of 2; skewed ids repeat and come out of order, uniform ones spread over the table. */
static const emb_case large_cases[] = {
    {"40k ids skewed", 1000003, 4, 40000, 0, 3, -1},
    {"100k ids uniform", 50304, 3, 100000, 0, 1, -1},
    {"106k ids skewed (a recommender batch)", 2000000, 2, 106496, 0, 2, -1},
    {"300k ids skewed", 100000, 2, 300001, 0, 4, -1},
    {"300k ids uniform", 7, 1, 299999, 0, 1, -1}, /* (a table of 7 rows: 3 radix bits, one pass) */
};

static uint64_t rng_state;
static double uniform(void) { /* [0, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* The case's inputs: ids (n, twice where tied), dy (n x C, twice where tied) */
static void case_inputs(const emb_case *c, int32_t *ids, float *dy) {
    rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)c->V * 31 ^ (uint64_t)c->n;
    int64_t sets = c->tied ? 2 : 1;
    for (int64_t i = 0; i < sets * c->n; i++) {
        double u = uniform(), p = u;
        for (int k = 1; k < c->skew; k++) p *= u;
        ids[i] = c->one >= 0 ? c->one : (int32_t)(p * (double)c->V);
    }
    for (int64_t i = 0; i < sets * c->n * c->C; i++) dy[i] = (float)(uniform() * 2.0 - 1.0);
}

/* The table's gradient for the case on context device `device`, into grad [V, C]. */
static pdde_status table_grad(pdde_context *ctx, int device, const emb_case *c, const int32_t *ids, const float *dy, float *grad) {
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    pdde_graph_init(ctx, &g);
    int sets = c->tied ? 2 : 1;
    pdde_tensor *table = pdde_param(g, "table", 2, (int64_t[]){c->V, c->C}, 0.5f), *loss = NULL;
    pdde_tensor *id_in[2] = {NULL, NULL}, *dy_in[2] = {NULL, NULL};
    for (int k = 0; k < sets; k++) {
        char nm[16];
        snprintf(nm, sizeof nm, "ids%d", k);
        id_in[k] = pdde_input(g, nm, PDDE_I32, 1, (int64_t[]){c->n});
        snprintf(nm, sizeof nm, "dy%d", k);
        dy_in[k] = pdde_input(g, nm, PDDE_F32, 2, (int64_t[]){c->n, c->C});
        /* sum(y * dy): y's gradient is dy itself */
        pdde_tensor *term = pdde_sum(g, pdde_mul(g, pdde_embedding(g, table, id_in[k]), dy_in[k]), -1, 0);
        loss = loss ? pdde_add(g, loss, term) : term;
    }
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device, sp.no_cpu_fallback = 1;
    pdde_status st = pdde_graph_status(g);
    if (!st) st = pdde_backward(g, loss);
    if (!st) st = pdde_session_init(g, &sp, &s);
    for (int k = 0; k < sets && !st; k++) {
        st = pdde_session_write(s, id_in[k], ids + k * c->n, (size_t)c->n * sizeof *ids);
        if (!st) st = pdde_session_write(s, dy_in[k], dy + k * c->n * c->C, (size_t)(c->n * c->C) * sizeof *dy);
    }
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_session_read(s, table->grad, grad, (size_t)(c->V * c->C) * sizeof *grad);
    pdde_session_free(s);
    pdde_graph_free(g);
    return st;
}

/* The first element where a and b differ in their bits (-1: none); tol > 0: by more than tol relative */
static int64_t first_diff(const float *a, const float *b, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if (tol > 0 ? !test_close(a[i], b[i], tol, tol) : memcmp(&a[i], &b[i], sizeof *a) != 0) return i;
    return -1;
}

/* Every case on the first device of backend fam (env: set to value for the sessions, then unset; value
 * also names the form in messages) against the CPU: bit for bit and twice (tol 0), or within tol. */
static void check_cases(pdde_context *ctx, const char *fam, const char *env, const char *value, double tol, const emb_case *cases,
                        size_t ncases) {
    int dev = pdde_device_find(ctx, fam, 0);
    if (dev < 0) {
        test_skip(fam, "no %s device: the embedding backward there", fam);
        return;
    }
    if (env) setenv(env, value, 1);
    for (size_t k = 0; k < ncases; k++) {
        const emb_case *c = &cases[k];
        int64_t sets = c->tied ? 2 : 1, gn = c->V * c->C;
        int32_t *ids = malloc((size_t)(sets * c->n) * sizeof *ids);
        float *dy = malloc((size_t)(sets * c->n * c->C) * sizeof *dy);
        float *cpu = malloc((size_t)gn * sizeof *cpu), *run1 = malloc((size_t)gn * sizeof *run1), *run2 = malloc((size_t)gn * sizeof *run2);
        if (!ids || !dy || !cpu || !run1 || !run2) {
            CHECK(0, "out of memory");
            break;
        }
        case_inputs(c, ids, dy);
        pdde_status st = table_grad(ctx, 0, c, ids, dy, cpu);
        CHECK(!st, "%s: the CPU's gradient (%s)", c->name, pdde_last_error(ctx));
        pdde_status st1 = st ? st : table_grad(ctx, dev, c, ids, dy, run1);
        CHECK(!st1, "%s, %s %s: the device's gradient (%s)", c->name, fam, value, pdde_last_error(ctx));
        if (!st1 && tol == 0) {
            int64_t at = first_diff(run1, cpu, gn, 0);
            CHECK(at < 0, "%s, %s %s: the gradient equals the CPU's bit for bit (element %lld: %.9g vs %.9g)", c->name, fam, value, (long long)at,
                  at < 0 ? 0.0 : (double)run1[at], at < 0 ? 0.0 : (double)cpu[at]);
            pdde_status st2 = table_grad(ctx, dev, c, ids, dy, run2);
            at = st2 ? 0 : first_diff(run2, run1, gn, 0);
            CHECK(at < 0, "%s, %s %s: a second run gives the same bits (element %lld; %s)", c->name, fam, value, (long long)at,
                  st2 ? pdde_last_error(ctx) : "ran");
        } else if (!st1) {
            int64_t at = first_diff(run1, cpu, gn, tol);
            CHECK(at < 0, "%s, %s %s: the gradient equals the CPU's within %g (element %lld: %.9g vs %.9g)", c->name, fam, value, tol,
                  (long long)at, at < 0 ? 0.0 : (double)run1[at], at < 0 ? 0.0 : (double)cpu[at]);
        }
        free(ids), free(dy), free(cpu), free(run1), free(run2);
    }
    if (env) unsetenv(env);
}
static void check_backend(pdde_context *ctx, const char *fam, const char *env, const char *value, double tol) {
    check_cases(ctx, fam, env, value, tol, cases, sizeof cases / sizeof cases[0]);
}

int main(void) {
    unsetenv("PDDE_OPENCL_EMBEDDING_BACK"), unsetenv("PDDE_CUDA_EMBEDDING_BACK");
    unsetenv("PDDE_OPENCL_EMBEDDING_SORT"), unsetenv("PDDE_CUDA_EMBEDDING_SORT");
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu,opencl,cuda";
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) {
        CHECK(0, "context");
        return test_finish();
    }
    /* the dy rows of one id differ in magnitude, so their sum's order shows (a check of the check) */
    const emb_case *one = &cases[1];
    int32_t *ids = malloc((size_t)one->n * sizeof *ids);
    float *dy = malloc((size_t)(one->n * one->C) * sizeof *dy);
    if (ids && dy) {
        case_inputs(one, ids, dy);
        float fwd = 0.0f, back = 0.0f;
        for (int64_t i = 0; i < one->n; i++) fwd += dy[i * one->C], back += dy[(one->n - 1 - i) * one->C];
        CHECK(memcmp(&fwd, &back, sizeof fwd) != 0, "one id's dy summed forward and backward differ (%.9g, %.9g)", fwd, back);
    }
    free(ids), free(dy);
    check_backend(ctx, "opencl", NULL, "sorted", 0); /* (its default) */
    /* the GPUs' two sorts on PoCL's CPU device, which would count: one group's network and the radix sort */
    check_backend(ctx, "opencl", "PDDE_OPENCL_EMBEDDING_SORT", "network", 0);
    check_backend(ctx, "opencl", "PDDE_OPENCL_EMBEDDING_SORT", "radix", 0);
    check_cases(ctx, "opencl", "PDDE_OPENCL_EMBEDDING_SORT", "radix", 0, large_cases, sizeof large_cases / sizeof large_cases[0]);
    /* (the atomics' order is any: 3000 dy rows of one id, partial sums near 30, end 1e-4 apart) */
    check_backend(ctx, "opencl", "PDDE_OPENCL_EMBEDDING_BACK", "atomic", 1e-3);
    check_backend(ctx, "cuda", "PDDE_CUDA_EMBEDDING_BACK", "sorted", 0);
    setenv("PDDE_CUDA_EMBEDDING_BACK", "sorted", 1); /* (the radix sort, past the network's ids) */
    check_cases(ctx, "cuda", NULL, "sorted", 0, large_cases, sizeof large_cases / sizeof large_cases[0]);
    unsetenv("PDDE_CUDA_EMBEDDING_BACK");
    check_backend(ctx, "cuda", NULL, "atomic", 1e-3); /* (its default) */
    pdde_context_free(ctx);
    return test_finish();
}
