/* test_grad — every differentiable op: pdde's analytic gradient against central finite differences.
 * The loss is sum(op(x) * w) for a fixed random w, so every output element matters. Differences are
 * taken in float32 with the perturbed forward evaluated twice; the tolerance (2e-2 of the gradient's
 * scale) is far below what a wrong formula produces and far above float32 rounding. */
#include "pdde.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

typedef pdde_tensor *(*build_fn)(pdde_graph *g, pdde_tensor **x);

typedef struct {
    const char *name;
    int n_inputs;
    int ndim[3];
    int64_t shape[3][4];
    build_fn build;
    float lo[3];   /* inputs drawn uniform in [lo, lo + 2) (lo = -1 by default; > -1 keeps logs/sqrt happy) */
} grad_case;

static uint64_t rng_state = 42;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / 16777216.0);
}

static pdde_tensor *b_matmul(pdde_graph *g, pdde_tensor **x) { return pdde_matmul(g, x[0], x[1], 0, 0); }
static pdde_tensor *b_matmul_tt(pdde_graph *g, pdde_tensor **x) { return pdde_matmul(g, x[0], x[1], 1, 1); }
static pdde_tensor *b_matmul_shared(pdde_graph *g, pdde_tensor **x) { return pdde_matmul(g, x[0], x[1], 0, 1); }
static pdde_tensor *b_matmul_ta_shared(pdde_graph *g, pdde_tensor **x) { return pdde_matmul(g, x[0], x[1], 1, 0); }
static pdde_tensor *b_add(pdde_graph *g, pdde_tensor **x) { return pdde_add(g, x[0], x[1]); }
static pdde_tensor *b_sub(pdde_graph *g, pdde_tensor **x) { return pdde_sub(g, x[0], x[1]); }
static pdde_tensor *b_mul(pdde_graph *g, pdde_tensor **x) { return pdde_mul(g, x[0], x[1]); }
static pdde_tensor *b_scale(pdde_graph *g, pdde_tensor **x) { return pdde_scale(g, x[0], -1.7f); }
static pdde_tensor *b_gelu(pdde_graph *g, pdde_tensor **x) { return pdde_gelu(g, x[0]); }
static pdde_tensor *b_bias_gelu(pdde_graph *g, pdde_tensor **x) { return pdde_bias_gelu(g, x[0], x[1]); }
static pdde_tensor *b_relu(pdde_graph *g, pdde_tensor **x) { return pdde_relu(g, x[0]); }
static pdde_tensor *b_silu(pdde_graph *g, pdde_tensor **x) { return pdde_silu(g, x[0]); }
static pdde_tensor *b_layernorm(pdde_graph *g, pdde_tensor **x) { return pdde_layernorm(g, x[0], x[1], x[2], 1e-5f); }
static pdde_tensor *b_rmsnorm(pdde_graph *g, pdde_tensor **x) { return pdde_rmsnorm(g, x[0], x[1], 1e-5f); }
static pdde_tensor *b_softmax(pdde_graph *g, pdde_tensor **x) { return pdde_softmax(g, x[0], 0); }
static pdde_tensor *b_softmax_causal(pdde_graph *g, pdde_tensor **x) { return pdde_softmax(g, x[0], 1); }
static pdde_tensor *b_attention(pdde_graph *g, pdde_tensor **x) { return pdde_attention(g, x[0], x[1], x[2]); }
static pdde_tensor *b_attention_unfused(pdde_graph *g, pdde_tensor **x) { return pdde_attention_unfused(g, x[0], x[1], x[2]); }
static pdde_tensor *b_reshape(pdde_graph *g, pdde_tensor **x) { return pdde_reshape(g, x[0], 2, (int64_t[]){3, 10}); }
static pdde_tensor *b_permute(pdde_graph *g, pdde_tensor **x) { return pdde_permute(g, x[0], (int[]){2, 0, 1}); }
static pdde_tensor *b_transpose(pdde_graph *g, pdde_tensor **x) { return pdde_transpose(g, x[0], 0, 1); }
static pdde_tensor *b_concat(pdde_graph *g, pdde_tensor **x) { return pdde_concat(g, 2, x, 1); }
static pdde_tensor *b_slice(pdde_graph *g, pdde_tensor **x) { return pdde_slice(g, x[0], 1, 1, 3); }
static pdde_tensor *b_split(pdde_graph *g, pdde_tensor **x) {
    pdde_tensor *p[3];
    pdde_split(g, x[0], -1, 3, p);
    return pdde_add(g, pdde_mul(g, p[0], p[1]), p[2]);
}
static pdde_tensor *b_sum_axis(pdde_graph *g, pdde_tensor **x) { return pdde_sum(g, x[0], 1, 0); }
static pdde_tensor *b_sum_all(pdde_graph *g, pdde_tensor **x) { return pdde_sum(g, x[0], -1, 0); }
static pdde_tensor *b_mean_keep(pdde_graph *g, pdde_tensor **x) { return pdde_mean(g, x[0], 0, 1); }
static pdde_tensor *b_dropout(pdde_graph *g, pdde_tensor **x) { return pdde_dropout(g, x[0], 0.3f, 7); }
static pdde_tensor *b_twice(pdde_graph *g, pdde_tensor **x) { return pdde_mul(g, x[0], pdde_gelu(g, x[0])); }

static const grad_case cases[] = {
    {"matmul", 2, {2, 2}, {{5, 7}, {7, 3}}, b_matmul, {-1, -1}},
    {"matmul_batched_tt", 2, {3, 3}, {{2, 7, 5}, {2, 3, 7}}, b_matmul_tt, {-1, -1}},
    {"matmul_shared_b", 2, {3, 2}, {{2, 5, 7}, {3, 7}}, b_matmul_shared, {-1, -1}},
    {"matmul_ta_shared_b", 2, {3, 2}, {{2, 7, 5}, {7, 3}}, b_matmul_ta_shared, {-1, -1}},
    {"add_broadcast", 2, {3, 1}, {{2, 3, 5}, {5}}, b_add, {-1, -1}},
    {"add_broadcast_mid", 2, {3, 3}, {{2, 3, 5}, {2, 1, 5}}, b_add, {-1, -1}},
    {"sub", 2, {2, 2}, {{4, 3}, {4, 3}}, b_sub, {-1, -1}},
    {"mul_broadcast", 2, {2, 2}, {{4, 3}, {4, 1}}, b_mul, {-1, -1}},
    {"scale", 1, {2}, {{4, 3}}, b_scale, {-1}},
    {"gelu", 1, {2}, {{4, 5}}, b_gelu, {-1}},
    {"bias_gelu", 2, {3, 1}, {{2, 3, 5}, {5}}, b_bias_gelu, {-1, -1}},
    {"relu", 1, {2}, {{4, 5}}, b_relu, {-1}},
    {"silu", 1, {2}, {{4, 5}}, b_silu, {-1}},
    {"layernorm", 3, {3, 1, 1}, {{2, 3, 7}, {7}, {7}}, b_layernorm, {-1, -1, -1}},
    /* C past the CPU kernels' 8 lanes: their vector body and a tail of 3 */
    {"layernorm_wide", 3, {3, 1, 1}, {{2, 3, 19}, {19}, {19}}, b_layernorm, {-1, -1, -1}},
    {"rmsnorm_wide", 2, {2, 1}, {{3, 19}, {19}}, b_rmsnorm, {-1, -1}},
    {"rmsnorm", 2, {2, 1}, {{3, 7}, {7}}, b_rmsnorm, {-1, -1}},
    {"softmax", 1, {2}, {{3, 6}}, b_softmax, {-1}},
    {"softmax_causal", 1, {3}, {{2, 5, 5}}, b_softmax_causal, {-1}},
    {"attention", 3, {4, 4, 4}, {{1, 2, 5, 3}, {1, 2, 5, 3}, {1, 2, 5, 3}}, b_attention, {-1, -1, -1}},
    /* fused, over more than one 128-row CPU tile (the keys of the second tile rescale the first's sums) */
    {"attention_tiles", 3, {4, 4, 4}, {{1, 1, 200, 4}, {1, 1, 200, 4}, {1, 1, 200, 4}}, b_attention, {-1, -1, -1}},
    {"attention_unfused", 3, {4, 4, 4}, {{2, 1, 4, 3}, {2, 1, 4, 3}, {2, 1, 4, 3}}, b_attention_unfused, {-1, -1, -1}},
    {"reshape", 1, {3}, {{2, 3, 5}}, b_reshape, {-1}},
    {"permute", 1, {3}, {{2, 3, 4}}, b_permute, {-1}},
    {"transpose", 1, {2}, {{3, 5}}, b_transpose, {-1}},
    {"concat", 2, {2, 2}, {{3, 2}, {3, 4}}, b_concat, {-1, -1}},
    {"slice", 1, {2}, {{3, 5}}, b_slice, {-1}},
    {"split", 1, {2}, {{3, 6}}, b_split, {-1}},
    {"sum_axis", 1, {3}, {{2, 3, 4}}, b_sum_axis, {-1}},
    {"sum_all", 1, {2}, {{3, 4}}, b_sum_all, {-1}},
    {"mean_keepdim", 1, {2}, {{3, 4}}, b_mean_keep, {-1}},
    {"dropout", 1, {2}, {{8, 8}}, b_dropout, {-1}},
    {"used_twice", 1, {2}, {{3, 4}}, b_twice, {-1}},
};

/* loss = sum(y * w): built as mul + sum so the seed flows through two more ops */
static pdde_tensor *build_loss(pdde_graph *g, const grad_case *c, pdde_tensor **x, pdde_tensor **w) {
    for (int i = 0; i < c->n_inputs; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        x[i] = pdde_param(g, name, c->ndim[i], c->shape[i], 0.0f);
    }
    pdde_tensor *y = c->build(g, x);
    if (!y) return NULL;
    *w = pdde_input(g, "w", PDDE_F32, y->ndim, y->shape);
    return pdde_sum(g, pdde_mul(g, y, *w), -1, 0);
}

static double eval_loss(pdde_session *s) {
    pdde_session_run(s, PDDE_RUN_FORWARD);
    return pdde_session_loss(s);
}

static void check_case(pdde_context *ctx, const grad_case *c) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x[3], *w;
    pdde_tensor *loss = build_loss(g, c, x, &w);
    CHECK(loss != NULL, "%s: build: %s", c->name, pdde_last_error(ctx));
    if (!loss) { pdde_graph_free(g); return; }
    CHECK(pdde_backward(g, loss) == PDDE_OK, "%s: backward: %s", c->name, pdde_last_error(ctx));
    pdde_session *s = NULL;
    int failed_before = test_failed; /* (this case's failures: an earlier case's must not stop this one) */
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "%s: session: %s", c->name, pdde_last_error(ctx));
    if (test_failed != failed_before) { pdde_graph_free(g); return; }
    float *xv[3];
    for (int i = 0; i < c->n_inputs; i++) {
        int64_t n = pdde_tensor_numel(x[i]);
        xv[i] = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++) xv[i][k] = c->lo[i] + 2.0f * frand();
        pdde_session_write(s, x[i], xv[i], (size_t)n * 4);
    }
    int64_t nw = pdde_tensor_numel(w);
    float *wv = malloc((size_t)nw * 4);
    for (int64_t k = 0; k < nw; k++) wv[k] = 2.0f * frand() - 1.0f;
    pdde_session_write(s, w, wv, (size_t)nw * 4);
    CHECK(pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "%s: run: %s", c->name, pdde_last_error(ctx));
    for (int i = 0; i < c->n_inputs; i++) {
        int64_t n = pdde_tensor_numel(x[i]);
        float *grad = malloc((size_t)n * 4);
        pdde_session_read(s, x[i]->grad, grad, (size_t)n * 4);
        double maxerr = 0, scale = 1e-3;
        for (int64_t k = 0; k < n; k++) scale = fabs(grad[k]) > scale ? fabs(grad[k]) : scale;
        for (int64_t k = 0; k < n; k++) {
            const float h = 1e-2f;
            float orig = xv[i][k];
            xv[i][k] = orig + h;
            pdde_session_write(s, x[i], xv[i], (size_t)n * 4);
            double lp = eval_loss(s);
            xv[i][k] = orig - h;
            pdde_session_write(s, x[i], xv[i], (size_t)n * 4);
            double lm = eval_loss(s);
            xv[i][k] = orig;
            pdde_session_write(s, x[i], xv[i], (size_t)n * 4);
            double fd = (lp - lm) / (2.0 * h), err = fabs(fd - grad[k]);
            if (c->build == b_relu && fabs(orig) < 2 * h) continue; /* the kink: no derivative there */
            if (err > maxerr) maxerr = err;
        }
        CHECK(maxerr <= 2e-2 * scale, "%s: input %d gradient off by %.3g (scale %.3g)", c->name, i, maxerr, scale);
        free(grad);
        free(xv[i]);
    }
    free(wv);
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* cross-entropy and embedding take integer inputs, so they get their own checks */
static void check_cross_entropy_and_embedding(pdde_context *ctx) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *table = pdde_param(g, "table", 2, (int64_t[]){7, 5}, 0.5f);
    pdde_tensor *ids = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){6});
    pdde_tensor *targets = pdde_input(g, "targets", PDDE_I32, 1, (int64_t[]){6});
    pdde_tensor *proj = pdde_param(g, "proj", 2, (int64_t[]){5, 7}, 0.5f);
    pdde_tensor *logits = pdde_matmul(g, pdde_embedding(g, table, ids), proj, 0, 0);
    pdde_tensor *loss = pdde_cross_entropy(g, logits, targets);
    CHECK(pdde_backward(g, loss) == PDDE_OK, "ce backward: %s", pdde_last_error(ctx));
    pdde_session *s;
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "ce session: %s", pdde_last_error(ctx));
    int32_t idv[6] = {1, 3, 3, 0, 6, 2}, tv[6] = {2, -1, 4, 6, 0, 1}; /* -1: ignored, id 3 used twice, 4 and 5 unused */
    pdde_session_write(s, ids, idv, sizeof idv);
    pdde_session_write(s, targets, tv, sizeof tv);
    float tab[35], grad[35];
    pdde_session_read(s, table, tab, sizeof tab);
    pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    pdde_session_read(s, table->grad, grad, sizeof grad);
    double maxerr = 0;
    for (int k = 0; k < 35; k++) {
        float orig = tab[k];
        tab[k] = orig + 1e-2f;
        pdde_session_write(s, table, tab, sizeof tab);
        double lp = eval_loss(s);
        tab[k] = orig - 1e-2f;
        pdde_session_write(s, table, tab, sizeof tab);
        double lm = eval_loss(s);
        tab[k] = orig;
        pdde_session_write(s, table, tab, sizeof tab);
        double err = fabs((lp - lm) / 2e-2 - grad[k]);
        maxerr = err > maxerr ? err : maxerr;
    }
    CHECK(maxerr < 2e-3, "embedding + cross-entropy gradient off by %.3g", maxerr);
    int untouched = 1;
    for (int c = 0; c < 5; c++) untouched &= grad[4 * 5 + c] == 0.0f && grad[5 * 5 + c] == 0.0f;
    CHECK(untouched, "rows of unused ids must get no gradient");
    pdde_session_free(s);
    pdde_graph_free(g);
}

int main(int argc, char **argv) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        int before = test_failed;
        check_case(ctx, &cases[i]);
        printf("%-22s %s\n", cases[i].name, test_failed == before ? "ok" : "FAILED");
    }
    if (argc == 1) check_cross_entropy_and_embedding(ctx);
    pdde_context_free(ctx);
    return test_finish();
}
