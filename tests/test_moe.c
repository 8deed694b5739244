/* test_moe — the Mixture-of-Experts ops on the CPU: a whole MoE feed-forward (router, top-k, gate,
 * dispatch, grouped GEMMs, combine, balance loss) against a per-token reference in double precision
 * written here without any permutation, and every parameter's gradient against central finite
 * differences (2e-2 of the gradient's scale, as test_grad). Routing edge cases: tied logits (the
 * lower expert wins), every token sent to one expert (the others get none), a balancing bias that
 * changes the choice but not the weights, a capacity that drops tokens (the count dropped is what the
 * capacity implies), sigmoid scores, unnormalised weights, a transposed expert weight; bad expert ids
 * give an error naming the tensor. A finite difference whose perturbation changes the routing (a
 * discontinuity of the loss) is skipped and counted; most must be checked. In bf16 (a bf16 compute
 * dtype): the layer on bf16-valued inputs against the same reference within bf16's rounding, its
 * gradients against the f32 run's, and a GPT with MoE blocks training as its f32 run does. */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int N, C, F, E, k;
    unsigned flags;
    float capacity_factor; /* 0 = dropless */
    float aux;             /* weight of the balance loss in the loss */
    int trans_b;           /* w2 stored [E, C, F] and used transposed */
    int force_expert;      /* >= 0: a bias that sends every token to this expert first (k = 1: only) */
    int zero_router;       /* all logits tied at 0 */
    int by_expert;         /* the buffer by expert, [E, capacity, C] (capacity N when dropless) */
    int fd_samples;        /* > 0: finite differences at this many evenly spaced entries of each parameter (0: all) */
} moe_case;

static const moe_case cases[] = {
    {"dropless_top2", 12, 6, 5, 4, 2, 0, 0, 0.1f, 0, -1, 0, 0, 0},
    {"capacity_drops", 16, 5, 4, 4, 2, 0, 0.75f, 0.1f, 0, -1, 0, 0, 0},
    {"sigmoid_unnormalised_trans_b", 10, 6, 5, 5, 2, PDDE_MOE_SIGMOID | PDDE_MOE_NO_NORMALIZE, 0, 0, 1, -1, 0, 0, 0},
    {"switch_top1_all_to_one", 9, 5, 4, 4, 1, PDDE_MOE_NO_NORMALIZE, 0, 0.05f, 0, 2, 0, 0, 0},
    {"bias_top2_sigmoid", 8, 4, 3, 6, 2, PDDE_MOE_SIGMOID, 0, 0, 0, 5, 0, 0, 0},
    {"tied_logits", 6, 4, 3, 4, 2, 0, 0, 0.1f, 0, -1, 1, 0, 0},
    {"by_expert_dropless", 12, 6, 5, 4, 2, 0, 0, 0.1f, 0, -1, 0, 1, 0},
    {"by_expert_capacity_trans_b", 16, 5, 4, 4, 2, 0, 0.75f, 0.1f, 1, -1, 0, 1, 0},
    {"by_expert_all_to_one", 9, 5, 4, 4, 1, PDDE_MOE_NO_NORMALIZE, 0, 0.05f, 0, 2, 0, 1, 0},
};

/* Rows wider than the CPU kernels' 256-value chunks and not a multiple of their 8 lanes, the grouped
 * GEMMs in several row tiles: in f32 (finite differences at 48 entries of each parameter) and bf16 */
static const moe_case wide_cases[] = {
    {"wide_rows_top2", 40, 300, 6, 4, 2, 0, 0, 0.1f, 0, -1, 0, 0, 48},
    {"wide_rows_capacity_by_expert", 40, 300, 6, 4, 2, 0, 0.75f, 0.1f, 1, -1, 0, 1, 48},
};

static uint64_t rng = 7;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / 8388608.0) - 1.0f;
}

static double gelu_ref(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

typedef struct {
    pdde_tensor *x, *router, *w1, *w2, *bias, *wout, *idx, *gate, *counts, *y, *loss;
    int64_t cap;
} moe_net;

static pdde_status build(pdde_graph *g, const moe_case *c, moe_net *m) {
    int64_t N = c->N, C = c->C, F = c->F, E = c->E;
    m->x = pdde_param(g, "x", 2, (int64_t[]){N, C}, 0.0f);
    m->router = pdde_param(g, "router", 2, (int64_t[]){C, E}, 0.0f);
    m->w1 = pdde_param(g, "w1", 3, (int64_t[]){E, C, F}, 0.0f);
    m->w2 = c->trans_b ? pdde_param(g, "w2", 3, (int64_t[]){E, C, F}, 0.0f) : pdde_param(g, "w2", 3, (int64_t[]){E, F, C}, 0.0f);
    m->bias = c->force_expert >= 0 ? pdde_input(g, "bias", PDDE_F32, 1, (int64_t[]){E}) : NULL;
    m->wout = pdde_input(g, "wout", PDDE_F32, 2, (int64_t[]){N, C});
    m->cap = pdde_moe_capacity(N, c->k, c->E, c->capacity_factor);
    if (c->by_expert && m->cap == 0) m->cap = N; /* (an expert gets each token once at most: nothing dropped) */
    pdde_tensor *logits = pdde_matmul(g, m->x, m->router, 0, 0);
    m->idx = pdde_moe_topk(g, logits, m->bias, c->k, c->flags);
    m->gate = pdde_moe_gate(g, logits, m->idx, c->flags);
    m->counts = pdde_moe_counts(g, m->idx, c->E);
    pdde_tensor *xe = c->by_expert ? pdde_moe_dispatch_experts(g, m->x, m->idx, c->E, m->cap) : pdde_moe_dispatch(g, m->x, m->idx, c->E, m->cap);
    pdde_tensor *h = pdde_gelu(g, pdde_moe_grouped_matmul(g, xe, m->w1, m->idx, m->cap, 0));
    pdde_tensor *ye = pdde_moe_grouped_matmul(g, h, m->w2, m->idx, m->cap, c->trans_b);
    m->y = pdde_moe_combine(g, ye, m->idx, m->gate, c->E, m->cap);
    m->loss = pdde_sum(g, pdde_mul(g, m->y, m->wout), -1, 0);
    if (c->aux > 0) m->loss = pdde_add(g, pdde_reshape(g, m->loss, 1, (int64_t[]){1}), pdde_scale(g, pdde_moe_aux_loss(g, logits, m->idx, c->E), c->aux));
    pdde_mark_output(m->idx), pdde_mark_output(m->gate), pdde_mark_output(m->counts), pdde_mark_output(m->y);
    return pdde_graph_status(g);
}

typedef struct { float *x, *router, *w1, *w2, *bias, *wout; } moe_values;

/* The reference: per token, its scores, its k experts (ties: the lower id), its weights, and each kept
 * choice's expert MLP directly; a choice is kept when fewer than cap earlier choices (token order)
 * picked its expert. Returns y [N, C], the chosen ids, the dropped count and the balance loss. */
static void reference(const moe_case *c, int64_t cap, const moe_values *v, double *y, int *ids, int64_t *dropped, double *aux) {
    int N = c->N, C = c->C, F = c->F, E = c->E, k = c->k;
    bool sig = c->flags & PDDE_MOE_SIGMOID, norm = !(c->flags & PDDE_MOE_NO_NORMALIZE);
    int *seen = calloc((size_t)E, sizeof *seen), *cnt = calloc((size_t)E, sizeof *cnt);
    double *l = malloc((size_t)E * sizeof *l), *s = malloc((size_t)E * sizeof *s), *P = calloc((size_t)E, sizeof *P);
    *dropped = 0;
    memset(y, 0, (size_t)N * C * sizeof *y);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, z = 0;
        for (int e = 0; e < E; e++) {
            l[e] = 0;
            for (int i = 0; i < C; i++) l[e] += (double)v->x[n * C + i] * v->router[i * E + e];
            mx = l[e] > mx ? l[e] : mx;
        }
        for (int e = 0; e < E; e++) z += exp(l[e] - mx);
        for (int e = 0; e < E; e++) P[e] += exp(l[e] - mx) / z / N, s[e] = sig ? 1 / (1 + exp(-l[e])) : exp(l[e] - mx) / z;
        int *id = ids + n * k;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int p = 0; p < j; p++) taken |= id[p] == e;
                double se = s[e] + (v->bias ? v->bias[e] : 0), sb = best >= 0 ? s[best] + (v->bias ? v->bias[best] : 0) : 0;
                if (!taken && (best < 0 || se > sb)) best = e;
            }
            id[j] = best;
        }
        double sum = 0;
        for (int j = 0; j < k; j++) sum += s[id[j]];
        for (int j = 0; j < k; j++) {
            int e = id[j];
            cnt[e]++;
            if (cap > 0 && seen[e]++ >= cap) { ++*dropped; continue; }
            double w = norm ? s[e] / sum : s[e];
            for (int o = 0; o < C; o++) {
                double out = 0;
                for (int f = 0; f < F; f++) {
                    double h = 0;
                    for (int i = 0; i < C; i++) h += (double)v->x[n * C + i] * v->w1[((int64_t)e * C + i) * F + f];
                    double w2 = c->trans_b ? v->w2[((int64_t)e * C + o) * F + f] : v->w2[((int64_t)e * F + f) * C + o];
                    out += gelu_ref(h) * w2;
                }
                y[n * C + o] += w * out;
            }
        }
    }
    *aux = 0;
    for (int e = 0; e < E; e++) *aux += (double)E * cnt[e] / ((double)N * k) * P[e];
    free(seen), free(cnt), free(l), free(s), free(P);
}

static void write_all(pdde_session *s, const moe_net *m, const moe_values *v) {
    pdde_session_write(s, m->x, v->x, pdde_tensor_nbytes(m->x));
    pdde_session_write(s, m->router, v->router, pdde_tensor_nbytes(m->router));
    pdde_session_write(s, m->w1, v->w1, pdde_tensor_nbytes(m->w1));
    pdde_session_write(s, m->w2, v->w2, pdde_tensor_nbytes(m->w2));
    if (m->bias) pdde_session_write(s, m->bias, v->bias, pdde_tensor_nbytes(m->bias));
    pdde_session_write(s, m->wout, v->wout, pdde_tensor_nbytes(m->wout));
}

static float *randoms(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}

static void check_case(pdde_context *ctx, const moe_case *c) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    moe_net m;
    pdde_session *s = NULL;
    int before = test_failed;
    CHECK(build(g, c, &m) == PDDE_OK, "%s: build: %s", c->name, pdde_last_error(ctx));
    if (test_failed == before) CHECK(pdde_backward(g, m.loss) == PDDE_OK, "%s: backward: %s", c->name, pdde_last_error(ctx));
    if (test_failed == before) CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "%s: session: %s", c->name, pdde_last_error(ctx));
    if (test_failed != before) { pdde_graph_free(g); return; }
    int64_t N = c->N, C = c->C, F = c->F, E = c->E, k = c->k;
    moe_values v = {randoms(N * C, 1.0f), randoms(C * E, c->zero_router ? 0.0f : 1.0f), randoms(E * C * F, 0.6f), randoms(E * C * F, 0.6f), NULL,
                    randoms(N * C, 1.0f)};
    if (c->force_expert >= 0) {
        v.bias = calloc((size_t)E, sizeof *v.bias);
        v.bias[c->force_expert] = 10.0f; /* scores are in (0, 1): this expert is everyone's first */
    }
    write_all(s, &m, &v);
    CHECK(pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "%s: run: %s", c->name, pdde_last_error(ctx));

    /* forward against the reference */
    double *yref = malloc((size_t)(N * C) * sizeof *yref), aux_ref;
    int *idref = malloc((size_t)(N * k) * sizeof *idref);
    int64_t dropped_ref;
    reference(c, m.cap, &v, yref, idref, &dropped_ref, &aux_ref);
    float *y = malloc((size_t)(N * C) * sizeof *y), *yr = malloc((size_t)(N * C) * sizeof *yr);
    int32_t *ids = malloc((size_t)(N * k) * sizeof *ids), *counts = malloc((size_t)E * sizeof *counts);
    pdde_session_read(s, m.y, y, (size_t)(N * C) * sizeof *y);
    pdde_session_read(s, m.idx, ids, (size_t)(N * k) * sizeof *ids);
    pdde_session_read(s, m.counts, counts, (size_t)E * sizeof *counts);
    double yscale = 0;
    for (int64_t i = 0; i < N * C; i++) yr[i] = (float)yref[i], yscale = fabs(yref[i]) > yscale ? fabs(yref[i]) : yscale;
    char what[96];
    snprintf(what, sizeof what, "%s: moe output against the reference", c->name);
    /* (wide rows: f32 sums of hundreds of terms; relative, or absolute below 1e-2 of the output's scale) */
    test_close_all(what, y, yr, (size_t)(N * C), C > 64 ? 1e-2 * yscale : 1e-3, 1e-4);
    int same_ids = 1, counted = 0;
    for (int64_t i = 0; i < N * k; i++) same_ids &= ids[i] == idref[i];
    for (int64_t e = 0; e < E; e++) counted += counts[e];
    CHECK(same_ids, "%s: top-k ids differ from the reference", c->name);
    CHECK(counted == N * k, "%s: counts sum to %d, expected %lld", c->name, counted, (long long)(N * k));
    CHECK(pdde_moe_dropped(counts, (int)E, m.cap) == dropped_ref, "%s: %lld dropped, the capacity %lld implies %lld", c->name,
          (long long)pdde_moe_dropped(counts, (int)E, m.cap), (long long)m.cap, (long long)dropped_ref);
    if (c->capacity_factor > 0) CHECK(dropped_ref > 0, "%s: the case must drop tokens (capacity %lld)", c->name, (long long)m.cap);
    if (c->force_expert >= 0) {
        CHECK(counts[c->force_expert] == N, "%s: expert %d got %d tokens, expected all %lld", c->name, c->force_expert, counts[c->force_expert], (long long)N);
        if (k == 1)
            for (int64_t e = 0; e < E; e++) CHECK(e == c->force_expert || counts[e] == 0, "%s: expert %lld got tokens", c->name, (long long)e);
    }
    if (c->zero_router) { /* every logit 0: the first k experts, weights 1/k */
        int first = 1;
        for (int64_t i = 0; i < N * k; i++) first &= ids[i] == (int32_t)(i % k);
        CHECK(first, "%s: ties must go to the lower expert ids", c->name);
    }
    if (c->aux > 0) {
        /* loss = sum(y * wout) + aux * balance: the balance from the loss and the reference's y */
        double dot = 0;
        for (int64_t i = 0; i < N * C; i++) dot += yref[i] * v.wout[i];
        double balance = (pdde_session_loss(s) - dot) / c->aux;
        CHECK(fabs(balance - aux_ref) < 1e-3 * (1 + aux_ref), "%s: balance loss %.6f, expected %.6f", c->name, balance, aux_ref);
        if (c->zero_router) CHECK(fabs(aux_ref - 1.0) < 1e-9, "%s: tied logits: balance loss %.6f, expected 1", c->name, aux_ref);
    }

    /* gradients against finite differences */
    pdde_tensor *params[4] = {m.x, m.router, m.w1, m.w2};
    float *vals[4] = {v.x, v.router, v.w1, v.w2};
    const char *names[4] = {"x", "router", "w1", "w2"};
    int64_t checked = 0, skipped = 0;
    int32_t *ids2 = malloc((size_t)(N * k) * sizeof *ids2);
    for (int p = 0; p < 4; p++) {
        int64_t n = pdde_tensor_numel(params[p]);
        float *grad = malloc((size_t)n * sizeof *grad);
        pdde_session_read(s, params[p]->grad, grad, (size_t)n * sizeof *grad);
        double scale = 1e-3, maxerr = 0;
        for (int64_t i = 0; i < n; i++) scale = fabs(grad[i]) > scale ? fabs(grad[i]) : scale;
        int64_t step = c->fd_samples > 0 && n > c->fd_samples ? n / c->fd_samples : 1;
        for (int64_t i = 0; i < n; i += step) {
            const float h = 1e-2f;
            float orig = vals[p][i];
            double l[2];
            bool flipped = false;
            for (int side = 0; side < 2; side++) {
                vals[p][i] = orig + (side ? -h : h);
                pdde_session_write(s, params[p], vals[p], (size_t)n * sizeof *grad);
                pdde_session_run(s, PDDE_RUN_FORWARD);
                l[side] = pdde_session_loss(s);
                pdde_session_read(s, m.idx, ids2, (size_t)(N * k) * sizeof *ids2);
                flipped |= memcmp(ids, ids2, (size_t)(N * k) * sizeof *ids2) != 0;
            }
            vals[p][i] = orig;
            pdde_session_write(s, params[p], vals[p], (size_t)n * sizeof *grad);
            if (flipped) { skipped++; continue; }
            checked++;
            double err = fabs((l[0] - l[1]) / (2.0 * h) - grad[i]);
            if (!(err <= maxerr)) maxerr = err; /* (NaN sticks) */
        }
        CHECK(maxerr <= 2e-2 * scale, "%s: gradient of %s off by %.3g (scale %.3g)", c->name, names[p], maxerr, scale);
        free(grad);
    }
    CHECK(checked > 4 * skipped, "%s: %lld differences checked, %lld skipped (routing changed)", c->name, (long long)checked, (long long)skipped);
    printf("%-30s %s (%lld differences, %lld skipped where the routing changed, capacity %lld, %lld dropped)\n", c->name,
           test_failed == before ? "ok" : "FAILED", (long long)checked, (long long)skipped, (long long)m.cap, (long long)dropped_ref);
    free(yref), free(idref), free(y), free(yr), free(ids), free(ids2), free(counts);
    free(v.x), free(v.router), free(v.w1), free(v.w2), free(v.bias), free(v.wout);
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* A GPT with an MoE feed-forward in every block (8 experts, top-2, the balance loss) trains: on token
 * sequences with a learnable rule (t+1 = 5 t + 1 mod 32, one token in 8 random), the mean loss of the
 * last 10 of 60 steps is below 60% of the first 10's; every step routes all N*k choices, and the
 * experts' weights move (their gradients reach them through dispatch and combine). */
static void check_gpt_trains(pdde_context *ctx, float capacity, pdde_dtype dt, float *losses) {
    gpt_config c = {.vocab = 32, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 8, .moe_experts = 8, .moe_topk = 2,
                    .moe_capacity = capacity, .moe_aux = 0.01f};
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f, op.weight_decay = 0; /* (a decay would move weights that get no gradient) */
    pdde_session *s = NULL;
    pdde_status st = pdde_graph_set_compute_dtype(g, dt);
    if (!st) st = gpt_build(g, &c, &m);
    if (!st) st = pdde_backward(g, m.loss);
    if (!st) st = pdde_optimizer_adamw(g, &op);
    if (!st) st = pdde_session_init(g, NULL, &s);
    CHECK(st == PDDE_OK, "moe gpt: %s", pdde_last_error(ctx));
    if (st) { pdde_graph_free(g); return; }
    int BT = c.batch * c.ctx;
    int32_t *x = malloc((size_t)BT * sizeof *x), *y = malloc((size_t)BT * sizeof *y), counts[8];
    pdde_tensor *w = pdde_graph_find(g, "h1.moe.w1");
    size_t wb = pdde_tensor_nbytes(w);
    float *w0 = calloc(1, wb), *w1 = calloc(1, wb);
    double first = 0, last = 0;
    int64_t routed_ok = 1, dropped = 0;
    uint64_t r = 99;
    for (int step = 0; step < 60; step++) {
        for (int b = 0; b < c.batch; b++) {
            int32_t t = (int32_t)(r >> 33) % 32;
            for (int i = 0; i <= c.ctx; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                int32_t next = (r >> 33) % 8 == 0 ? (int32_t)((r >> 40) % 32) : (5 * t + 1) % 32;
                if (i < c.ctx) x[b * c.ctx + i] = t;
                if (i > 0) y[b * c.ctx + i - 1] = t;
                t = next;
            }
        }
        pdde_session_write(s, m.ids, x, (size_t)BT * sizeof *x);
        pdde_session_write(s, m.targets, y, (size_t)BT * sizeof *y);
        st = pdde_session_run(s, PDDE_RUN_STEP);
        if (st) break;
        float loss = pdde_session_loss(s);
        if (losses) losses[step] = loss;
        if (step == 0) CHECK(pdde_session_read(s, w, w0, wb) == PDDE_OK, "moe gpt: read %s: %s", w->name, pdde_last_error(ctx));
        if (step < 10) first += loss / 10;
        if (step >= 50) last += loss / 10;
        for (int l = 0; l < c.layers; l++) {
            char name[32];
            snprintf(name, sizeof name, "h%d.moe.counts", l);
            pdde_session_read(s, pdde_graph_find(g, name), counts, sizeof counts);
            int64_t sum = 0;
            for (int e = 0; e < 8; e++) sum += counts[e];
            routed_ok &= sum == (int64_t)BT * 2;
            dropped += pdde_moe_dropped(counts, 8, pdde_moe_capacity(BT, 2, 8, capacity));
        }
    }
    CHECK(st == PDDE_OK, "moe gpt: run: %s", pdde_last_error(ctx));
    CHECK(pdde_session_read(s, w, w1, wb) == PDDE_OK, "moe gpt: read %s: %s", w->name, pdde_last_error(ctx));
    CHECK(memcmp(w0, w1, wb) != 0, "moe gpt: the expert weights did not move after step 1");
    CHECK(routed_ok, "moe gpt: a step did not route every token k times");
    CHECK(last < 0.6 * first, "moe gpt (capacity %g): loss %.4f over the last 10 steps, %.4f over the first 10: not learning", capacity, last, first);
    if (capacity > 0) CHECK(dropped > 0, "moe gpt: capacity %g dropped nothing in 60 steps", capacity);
    printf("moe gpt (capacity %g, %s)       loss %.4f -> %.4f, %lld dropped\n", capacity, pdde_dtype_name(dt), first, last, (long long)dropped);
    free(x), free(y), free(w0), free(w1);
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* ---- bf16 (pdde_graph_set_compute_dtype(g, PDDE_BF16)) ----
 * The layer's inputs are rounded to bf16 first, so the casts of x, the router and the experts change
 * nothing and the router's logits are f32 sums of the same products: the routing is the f32 run's, and
 * what differs is the rounding of the activations the MoE ops move (gelu's output, the experts'
 * outputs) and of the gradients the GEMMs read, about 2^-9 relative each. */
#define MOE_BF16_U 0x1p-8 /* bf16's unit roundoff (2^-8: its 8 significand bits) */

static double nmse_f32(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), den += (double)ref[i] * ref[i];
    }
    return num == 0 ? 0 : num / (den > 0 ? den : 1e-30);
}

static void bf16_round(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = pdde_bf16_to_f32(pdde_f32_to_bf16(p[i]));
}

/* How many nodes of op read (src k) or write (k < 0) dtype dt */
static int nodes_of(pdde_graph *g, pdde_op op, int k, pdde_dtype dt) {
    int n = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == op) n += (k < 0 ? t->dtype : t->src[k]->dtype) == dt;
    }
    return n;
}

/* The case in f32 and in bf16 on the same bf16-valued inputs: the same expert ids; y against the double
 * reference within a few bf16 roundings; every gradient against the f32 run's, NMSE within (3u)^2 (three
 * roundings in a row), and not equal to it (the bf16 path ran); the graph's dispatch and grouped GEMMs
 * read bf16 rows, the router's top-k and the balance loss f32 logits. */
static void check_bf16_case(pdde_context *ctx, const moe_case *c) {
    int64_t N = c->N, C = c->C, F = c->F, E = c->E, k = c->k;
    moe_values v = {randoms(N * C, 1.0f), randoms(C * E, 1.0f), randoms(E * C * F, 0.6f), randoms(E * C * F, 0.6f), NULL, randoms(N * C, 1.0f)};
    bf16_round(v.x, N * C), bf16_round(v.router, C * E), bf16_round(v.w1, E * C * F), bf16_round(v.w2, E * C * F);
    int64_t numel[4] = {N * C, C * E, E * C * F, E * C * F};
    float *grads[2][4] = {{0}}, *y[2] = {0};
    int32_t *ids[2] = {0};
    int before = test_failed;
    for (int run = 0; run < 2; run++) { /* 0: f32, 1: bf16 */
        pdde_graph *g;
        pdde_graph_init(ctx, &g);
        moe_net m;
        pdde_session *s = NULL;
        pdde_status st = pdde_graph_set_compute_dtype(g, run ? PDDE_BF16 : PDDE_F32);
        if (!st) st = build(g, c, &m);
        if (!st) st = pdde_backward(g, m.loss);
        if (!st) st = pdde_session_init(g, NULL, &s);
        if (!st) write_all(s, &m, &v), st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
        CHECK(st == PDDE_OK, "%s bf16 (run %d): %s", c->name, run, pdde_last_error(ctx));
        if (st) { pdde_session_free(s), pdde_graph_free(g); break; }
        if (run) {
            int lowp = nodes_of(g, PDDE_OP_MOE_DISPATCH, 0, PDDE_BF16) + nodes_of(g, PDDE_OP_MOE_GROUPED_MATMUL, 0, PDDE_BF16) +
                       nodes_of(g, PDDE_OP_MOE_GROUPED_MATMUL, 1, PDDE_BF16) + nodes_of(g, PDDE_OP_MOE_COMBINE, 0, PDDE_BF16) +
                       nodes_of(g, PDDE_OP_MOE_GROUPED_MATMUL_BACK_W, 0, PDDE_BF16);
            /* forward: the dispatch, 2 GEMMs (rows and weights), the combine; backward: the dispatch's (a combine of bf16
             * rows), 2 input-gradient GEMMs (rows and weights), 2 weight gradients */
            CHECK(lowp == 1 + 2 * 2 + 2 + 2 * 2 + 2, "%s bf16: %d MoE operands are bf16, expected 13", c->name, lowp);
            CHECK(nodes_of(g, PDDE_OP_MOE_TOPK, 0, PDDE_F32) == 1 && nodes_of(g, PDDE_OP_MOE_GATE, 0, PDDE_F32) == 1 &&
                  (c->aux == 0 || nodes_of(g, PDDE_OP_MOE_AUX_LOSS, 0, PDDE_F32) == 1),
                  "%s bf16: top-k, the gate and the balance loss must read f32 logits", c->name);
        }
        y[run] = malloc((size_t)(N * C) * sizeof *y[run]), ids[run] = malloc((size_t)(N * k) * sizeof *ids[run]);
        pdde_session_read(s, m.y, y[run], (size_t)(N * C) * sizeof *y[run]);
        pdde_session_read(s, m.idx, ids[run], (size_t)(N * k) * sizeof *ids[run]);
        pdde_tensor *params[4] = {m.x, m.router, m.w1, m.w2};
        for (int p = 0; p < 4; p++) {
            grads[run][p] = malloc(pdde_tensor_nbytes(params[p]));
            pdde_session_read(s, params[p]->grad, grads[run][p], pdde_tensor_nbytes(params[p]));
        }
        pdde_session_free(s);
        pdde_graph_free(g);
    }
    if (test_failed == before) {
        CHECK(!memcmp(ids[0], ids[1], (size_t)(N * k) * sizeof *ids[0]), "%s bf16: the expert ids differ from the f32 run's", c->name);
        double *yref = malloc((size_t)(N * C) * sizeof *yref), aux;
        int *idref = malloc((size_t)(N * k) * sizeof *idref);
        float *yr = malloc((size_t)(N * C) * sizeof *yr);
        int64_t dropped;
        int64_t cap = pdde_moe_capacity(N, c->k, c->E, c->capacity_factor);
        if (c->by_expert && cap == 0) cap = N;
        reference(c, cap, &v, yref, idref, &dropped, &aux);
        double scale = 0;
        for (int64_t i = 0; i < N * C; i++) yr[i] = (float)yref[i], scale = fabs(yref[i]) > scale ? fabs(yref[i]) : scale;
        char what[96];
        snprintf(what, sizeof what, "%s bf16: moe output against the reference", c->name);
        /* gelu's output and the expert outputs rounded: 2 u relative, over the F- and k-term sums */
        double worst = test_close_all(what, y[1], yr, (size_t)(N * C), scale, 2 * MOE_BF16_U);
        double e_y = nmse_f32(y[1], y[0], N * C), e_g = 0;
        CHECK(e_y > 0, "%s bf16: the output equals the f32 run's bit for bit: the activations were not rounded", c->name);
        const char *names[4] = {"x", "router", "w1", "w2"};
        for (int p = 0; p < 4; p++) {
            double e = nmse_f32(grads[1][p], grads[0][p], numel[p]);
            CHECK(e <= 9 * MOE_BF16_U * MOE_BF16_U, "%s bf16: gradient of %s: NMSE %.3g against the f32 run's > %.3g", c->name, names[p], e,
                  9 * MOE_BF16_U * MOE_BF16_U);
            e_g = e > e_g ? e : e_g;
        }
        printf("%-30s bf16 %s (output %.2g relative to the reference, NMSE %.2g to f32; gradients NMSE %.2g)\n", c->name,
               test_failed == before ? "ok" : "FAILED", worst, e_y, e_g);
        free(yref), free(idref), free(yr);
    }
    for (int run = 0; run < 2; run++) {
        free(y[run]), free(ids[run]);
        for (int p = 0; p < 4; p++) free(grads[run][p]);
    }
    free(v.x), free(v.router), free(v.w1), free(v.w2), free(v.wout);
}

/* The MoE GPT in bf16 (gpt --dtype bf16) follows its f32 run: the first step's loss (the same
 * parameters, only the rounding differs) within MOE_GPT_BF16_STEP0, and the mean loss of every 10 of
 * the 60 steps within MOE_GPT_BF16_TOL, relative; not equal to it all along. Single steps drift further
 * apart than a dense GPT's (measured 8.6e-2 worst, the dense model's 8.7e-3): a rounded router logit
 * sends a token to another expert now and then, where f32 would not (a router in f32 drifts as far). */
#define MOE_GPT_BF16_STEP0 1e-5 /* measured 3.4e-7 (at initialisation the logits are small) */
#define MOE_GPT_BF16_TOL 3e-2   /* measured 1.3e-2 */
static void check_gpt_bf16(pdde_context *ctx) {
    float f32[60], bf16[60];
    check_gpt_trains(ctx, 0.0f, PDDE_F32, f32);
    check_gpt_trains(ctx, 0.0f, PDDE_BF16, bf16);
    double worst = 0, moved = 0, step0 = fabs((double)bf16[0] - f32[0]) / fabs((double)f32[0]);
    for (int w = 0; w < 6; w++) {
        double a = 0, b = 0;
        for (int i = w * 10; i < w * 10 + 10; i++) a += f32[i], b += bf16[i], moved += fabs((double)bf16[i] - f32[i]);
        double d = fabs(b - a) / fabs(a);
        if (!(d <= worst)) worst = d; /* (NaN sticks) */
    }
    CHECK(step0 <= MOE_GPT_BF16_STEP0, "moe gpt bf16: the first step's loss %.3g relative from the f32 run's (tolerance %.3g)", step0,
          MOE_GPT_BF16_STEP0);
    CHECK(worst <= MOE_GPT_BF16_TOL, "moe gpt bf16: a 10-step mean loss %.3g relative from the f32 run's (tolerance %.3g)", worst, MOE_GPT_BF16_TOL);
    CHECK(moved > 0, "moe gpt bf16: every loss equals the f32 run's: nothing ran in bf16");
    printf("moe gpt bf16 against f32       step 0 %.2g relative (tolerance %.2g), 10-step means %.2g (tolerance %.2g)\n", step0,
           MOE_GPT_BF16_STEP0, worst, MOE_GPT_BF16_TOL);
}

/* Expert ids a kernel cannot use (from an input, not top-k) fail the run with a message naming them. */
static void check_bad_ids(pdde_context *ctx) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){3, 2});
    pdde_tensor *idx = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){3, 1});
    pdde_tensor *y = pdde_moe_dispatch(g, x, idx, 4, 0);
    pdde_tensor *loss = pdde_sum(g, y, -1, 0);
    CHECK(loss != NULL, "bad ids: build: %s", pdde_last_error(ctx));
    CHECK(pdde_moe_dispatch(g, x, idx, 0, 0) == NULL && pdde_graph_status(g) == PDDE_ERR_INVALID_ARG, "0 experts must be refused");
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){3, 2});
    idx = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){3, 1});
    loss = pdde_sum(g, pdde_moe_dispatch(g, x, idx, 4, 0), -1, 0);
    pdde_session *s = NULL;
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "bad ids: session: %s", pdde_last_error(ctx));
    if (s) {
        float xv[6] = {1, 2, 3, 4, 5, 6};
        int32_t iv[3] = {0, 7, 1};
        pdde_session_write(s, x, xv, sizeof xv);
        pdde_session_write(s, idx, iv, sizeof iv);
        pdde_status st = pdde_session_run(s, PDDE_RUN_FORWARD);
        CHECK(st == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "ids") && strstr(pdde_last_error(ctx), "7"),
              "an expert id of 7 of 4 experts: status %d, message '%s'", st, pdde_last_error(ctx));
        pdde_session_free(s);
    }
    pdde_graph_free(g);
}

/* ZeRO-3 inside ep groups (mesh [dp 2, ep 2]): the group axis (dp) splits the tokens without a layout,
 * so every use of a parameter, forward and backward, requires it whole there (gathered); the dense
 * weights split over dp and ep, the experts over ep and then dp. (test_moe_dp runs it against one
 * process.) */
static void check_zero3_groups_layout(pdde_context *ctx) {
    gpt_config cfg = {.vocab = 64, .ctx = 8, .layers = 1, .heads = 2, .width = 16, .batch = 8, .moe_experts = 4, .moe_topk = 2, .moe_ep = 1};
    gpt_plan gp = {.dp = 4, .tp = 1, .pp = 1, .micro = 1, .zero = 3, .ep = 2};
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    pdde_status st = gpt_build_plan(g, &cfg, &gp, &op, &m);
    CHECK(st == PDDE_OK, "ZeRO-3 in ep groups: %s", pdde_last_error(ctx));
    const pdde_tensor *w = pdde_graph_find(g, "h0.attn.w"), *w1 = pdde_graph_find(g, "h0.moe.w1");
    if (st || !w || !w1) {
        pdde_graph_free(g);
        return;
    }
    CHECK(w->dist.dims_mapping[0] == 0 && w->dist.dims_mapping[1] == 1 && w1->dist.dims_mapping[0] == 1 && w1->dist.dims_mapping[1] == 0,
          "ZeRO-3 in ep groups: h0.attn.w over [%d, %d] (want dp, ep: [0, 1]), h0.moe.w1 over [%d, %d, ..] (want ep, dp: [1, 0])",
          w->dist.dims_mapping[0], w->dist.dims_mapping[1], w1->dist.dims_mapping[0], w1->dist.dims_mapping[1]);
    int uses[2] = {0, 0}, split_uses = 0; /* (forward, backward) */
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        for (int k = 0; k < t->nsrc && t->phase != PDDE_PHASE_OPTIMIZER; k++) {
            if (t->src[k] != w && t->src[k] != w1) continue;
            const pdde_dist_attr *r = pdde_op_input_dist_attr(g, t, k);
            uses[t->phase == PDDE_PHASE_BACKWARD]++;
            for (int d = 0; r && d < r->ndim; d++) split_uses += r->dims_mapping[d] == 0; /* over dp: the tokens' group axis */
        }
    }
    CHECK(uses[0] >= 2 && uses[1] >= 2 && split_uses == 0, "ZeRO-3 in ep groups: h0.attn.w and h0.moe.w1 used %d times in forward, %d in backward "
          "(want >= 2 each), %d of them split over the group axis (want 0: gathered)", uses[0], uses[1], split_uses);
    pdde_graph_free(g);
}

int main(int argc, char **argv) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || !strcmp(argv[1], cases[i].name)) check_case(ctx, &cases[i]);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) /* (tied logits: bf16 changes no tie; a bias: no routing bf16 could move) */
        if ((argc < 2 || !strcmp(argv[1], "bf16")) && !cases[i].zero_router && cases[i].force_expert < 0) check_bf16_case(ctx, &cases[i]);
    for (size_t i = 0; i < sizeof wide_cases / sizeof wide_cases[0]; i++) {
        if (argc < 2 || !strcmp(argv[1], wide_cases[i].name)) check_case(ctx, &wide_cases[i]);
        if (argc < 2 || !strcmp(argv[1], "bf16") || !strcmp(argv[1], wide_cases[i].name)) check_bf16_case(ctx, &wide_cases[i]);
    }
    if (argc < 2) check_bad_ids(ctx), check_zero3_groups_layout(ctx), check_gpt_trains(ctx, 1.0f, PDDE_F32, NULL);
    if (argc < 2 || !strcmp(argv[1], "bf16")) check_gpt_bf16(ctx);
    CHECK(pdde_moe_capacity(16, 2, 4, 1.25f) == 10 && pdde_moe_capacity(16, 2, 4, 0) == 0, "capacity: %lld",
          (long long)pdde_moe_capacity(16, 2, 4, 1.25f));
    pdde_context_free(ctx);
    return test_finish();
}
