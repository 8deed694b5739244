/* test_recompute — activation checkpointing (pdde_graph_set_recompute). A model trained with some or
 * all of its blocks recomputed in backward must give the same loss and the same gradients as without
 * (the recomputation runs the same kernels on the same inputs, and dropout draws the same masks), while
 * the memory plan's arena gets smaller because the blocks' activations die after the forward pass. */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

static const gpt_config small = {.vocab = 32, .ctx = 8, .layers = 3, .heads = 2, .width = 16, .batch = 4};

/* A pre-norm block model with dropout after the attention and in the MLP (gpt.h has none):
 * per block l (layer l + 1): x += drop(proj(attention(ln(x)))); x += fc2(drop(gelu(fc1(x)))). */
static pdde_status build_dropout_model(pdde_graph *g, const gpt_config *c, gpt_model *m) {
    int64_t B = c->batch, T = c->ctx, C = c->width, H = c->heads, D = c->width / c->heads;
    m->cfg = *c;
    pdde_graph_set_layer(g, 0);
    m->ids = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){B, T});
    m->targets = pdde_input(g, "targets", PDDE_I32, 1, (int64_t[]){B * T});
    pdde_tensor *wte = pdde_param(g, "wte", 2, (int64_t[]){c->vocab, C}, 0.1f);
    pdde_tensor *x = pdde_embedding(g, wte, m->ids);
    for (int l = 0; l < c->layers; l++) {
        char p[32];
        pdde_graph_set_layer(g, l + 1);
        snprintf(p, sizeof p, "h%d.ln", l);
        pdde_tensor *a = gpt_layernorm(g, NULL, p, x, C);
        snprintf(p, sizeof p, "h%d.qkv", l);
        pdde_tensor *qkv = gpt_linear(g, NULL, p, a, C, 3 * C, 0.1f), *part[3];
        pdde_split(g, qkv, 2, 3, part);
        for (int i = 0; i < 3; i++)
            part[i] = pdde_permute(g, pdde_reshape(g, part[i], 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
        pdde_tensor *y = pdde_attention(g, part[0], part[1], part[2]);
        y = pdde_reshape(g, pdde_permute(g, y, (int[]){0, 2, 1, 3}), 3, (int64_t[]){B, T, C});
        snprintf(p, sizeof p, "h%d.proj", l);
        x = pdde_add(g, x, pdde_dropout(g, gpt_linear(g, NULL, p, y, C, C, 0.1f), 0.2f, 100 + (uint64_t)l));
        snprintf(p, sizeof p, "h%d.fc1", l);
        pdde_tensor *h = pdde_dropout(g, pdde_gelu(g, gpt_linear(g, NULL, p, x, C, 4 * C, 0.1f)), 0.3f, 200 + (uint64_t)l);
        snprintf(p, sizeof p, "h%d.fc2", l);
        x = pdde_add(g, x, gpt_linear(g, NULL, p, h, 4 * C, C, 0.1f));
    }
    pdde_graph_set_layer(g, c->layers + 1);
    x = gpt_layernorm(g, NULL, "lnf", x, C);
    m->logits = pdde_matmul(g, pdde_reshape(g, x, 2, (int64_t[]){B * T, C}), wte, 0, 1);
    m->loss = pdde_cross_entropy(g, m->logits, m->targets);
    pdde_graph_set_layer(g, -1);
    return pdde_graph_status(g);
}

typedef pdde_status (*model_fn)(pdde_graph *, const gpt_config *, gpt_model *);

typedef struct {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    pdde_memory_stats mem;
} run;

/* Builds model with the blocks in `recompute` (bit l = layer l) recomputed, AdamW over accum
 * micro-batches, and a session. */
static int run_init(run *r, model_fn model, unsigned recompute, int accum) {
    memset(r, 0, sizeof *r);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 2;
    pdde_context_init(&cp, &r->ctx);
    pdde_graph_init(r->ctx, &r->g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f, op.grad_accum_steps = accum;
    if (model(r->g, &small, &r->m)) return -1;
    for (int l = 0; l < 32; l++)
        if ((recompute >> l & 1) && pdde_graph_set_recompute(r->g, l, 1)) return -1;
    if (pdde_backward(r->g, r->m.loss) || pdde_optimizer_adamw(r->g, &op) || pdde_session_init(r->g, NULL, &r->s)) return -1;
    pdde_session_memory(r->s, &r->mem);
    return 0;
}

static void run_free(run *r) {
    pdde_session_free(r->s);
    pdde_graph_free(r->g);
    pdde_context_free(r->ctx);
}

static void feed(run *r, int step) {
    int32_t x[256], y[256];
    int BT = small.batch * small.ctx;
    for (int i = 0; i < BT; i++) x[i] = (i * 7 + step * 3) % small.vocab, y[i] = (i * 5 + step + 1) % small.vocab;
    pdde_session_write(r->s, r->m.ids, x, (size_t)BT * sizeof *x);
    pdde_session_write(r->s, r->m.targets, y, (size_t)BT * sizeof *y);
}

/* Worst relative difference between the two runs' values of every parameter (grad: their gradients). */
static double worst_param_diff(run *a, run *b, int grad) {
    double worst = 0;
    for (int i = 0; i < pdde_graph_tensor_count(a->g); i++) {
        pdde_tensor *pa = pdde_graph_tensor(a->g, i);
        if (!(pa->flags & PDDE_TENSOR_PARAM)) continue;
        pdde_tensor *pb = pdde_graph_find(b->g, pa->name);
        if (!pb || (grad && (!pa->grad || !pb->grad))) return INFINITY;
        const pdde_tensor *ta = grad ? pa->grad : pa, *tb = grad ? pb->grad : pb;
        size_t n = (size_t)pdde_tensor_numel(ta);
        float *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb);
        if (pdde_session_read(a->s, ta, va, n * sizeof *va) || pdde_session_read(b->s, tb, vb, n * sizeof *vb)) worst = INFINITY;
        for (size_t k = 0; k < n; k++) {
            double d = fabs((double)va[k] - vb[k]) / fmax(fabs((double)va[k]), 1e-6);
            if (!(d <= worst)) worst = d; /* NaN-safe */
        }
        free(va), free(vb);
    }
    return worst;
}

/* No backward node of a recomputed layer reads that layer's own forward activations: it reads clones. */
static int reads_kept_activations(const run *r, unsigned recompute) {
    int bad = 0;
    for (int i = 0; i < pdde_graph_tensor_count(r->g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(r->g, i);
        if (t->phase != PDDE_PHASE_BACKWARD || t->layer < 0 || !(recompute >> t->layer & 1)) continue;
        for (int k = 0; k < t->nsrc; k++) {
            const pdde_tensor *x = t->src[k];
            bad += x->phase == PDDE_PHASE_FORWARD && x->op != PDDE_OP_NONE && x->layer == t->layer &&
                   !(x->flags & (PDDE_TENSOR_LOSS | PDDE_TENSOR_OUTPUT));
        }
    }
    return bad;
}

/* Same loss and gradients with layers `recompute` recomputed as without, over a few steps. */
static void compare(const char *what, model_fn model, unsigned recompute, int expect_smaller) {
    run base, rc;
    CHECK(run_init(&base, model, 0, 1) == 0, "%s: baseline: %s", what, pdde_last_error(base.ctx));
    CHECK(run_init(&rc, model, recompute, 1) == 0, "%s: recompute: %s", what, pdde_last_error(rc.ctx));
    if (test_failed) return;
    CHECK(reads_kept_activations(&rc, recompute) == 0, "%s: backward reads activations of a recomputed layer", what);
    int dropouts = 0; /* the dropout model's MLP dropout feeds a matmul whose backward reads it */
    for (int i = 0; i < pdde_graph_tensor_count(rc.g); i++)
        dropouts += pdde_graph_tensor(rc.g, i)->op == PDDE_OP_DROPOUT && pdde_graph_tensor(rc.g, i)->phase == PDDE_PHASE_BACKWARD;
    CHECK((model == build_dropout_model) == (dropouts > 0), "%s: %d dropouts recomputed", what, dropouts);
    double worst_loss = 0, worst_grad = 0;
    for (int step = 0; step < 3; step++) {
        feed(&base, step), feed(&rc, step);
        /* forward + backward, compare the gradients, then the update */
        CHECK(pdde_session_run(base.s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "%s: %s", what, pdde_last_error(base.ctx));
        CHECK(pdde_session_run(rc.s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "%s: %s", what, pdde_last_error(rc.ctx));
        float lb = pdde_session_loss(base.s), lr = pdde_session_loss(rc.s);
        double el = fabs(lb - lr) / fabs(lb), eg = worst_param_diff(&base, &rc, 1);
        if (!(el <= worst_loss)) worst_loss = el; /* (NaN counts) */
        if (!(eg <= worst_grad)) worst_grad = eg;
        pdde_session_run(base.s, PDDE_RUN_OPTIMIZER), pdde_session_run(rc.s, PDDE_RUN_OPTIMIZER);
    }
    double worst_param = worst_param_diff(&base, &rc, 0);
    /* bit-identical, as the README claims (measured: 0) */
    CHECK(worst_loss == 0 && worst_grad == 0 && worst_param == 0,
          "%s: loss differs by %.3g, gradients by %.3g, parameters by %.3g (relative)", what, worst_loss, worst_grad, worst_param);
    if (expect_smaller)
        CHECK(rc.mem.arena_bytes < base.mem.arena_bytes, "%s: arena %zu B with recompute, %zu B without", what,
              rc.mem.arena_bytes, base.mem.arena_bytes);
    else
        CHECK(rc.mem.arena_bytes <= base.mem.arena_bytes, "%s: arena %zu B with recompute, %zu B without", what,
              rc.mem.arena_bytes, base.mem.arena_bytes);
    /* a forward-only run (validation) is unaffected: the clones belong to the backward pass */
    feed(&base, 9), feed(&rc, 9);
    pdde_session_run(base.s, PDDE_RUN_FORWARD), pdde_session_run(rc.s, PDDE_RUN_FORWARD);
    CHECK(pdde_session_loss(base.s) == pdde_session_loss(rc.s), "%s: forward-only loss %.9g vs %.9g", what,
          pdde_session_loss(base.s), pdde_session_loss(rc.s));
    printf("%-34s arena %7zu B -> %7zu B (%d -> %d nodes); worst relative difference: loss %.2g, grads %.2g, params %.2g\n",
           what, base.mem.arena_bytes, rc.mem.arena_bytes, base.mem.n_nodes, rc.mem.n_nodes, worst_loss, worst_grad, worst_param);
    run_free(&base), run_free(&rc);
}

/* Two micro-batches per step: each FORWARD_BACKWARD recomputes (with that run's dropout masks). */
static void test_accumulation(void) {
    run base, rc;
    CHECK(run_init(&base, build_dropout_model, 0, 2) == 0, "accum baseline: %s", pdde_last_error(base.ctx));
    CHECK(run_init(&rc, build_dropout_model, 1u << 1 | 1u << 2 | 1u << 3, 2) == 0, "accum recompute: %s", pdde_last_error(rc.ctx));
    if (test_failed) return;
    double worst_grad = 0;
    for (int step = 0; step < 2; step++) {
        for (int micro = 0; micro < 2; micro++) {
            feed(&base, 2 * step + micro), feed(&rc, 2 * step + micro);
            pdde_session_run(base.s, PDDE_RUN_FORWARD_BACKWARD), pdde_session_run(rc.s, PDDE_RUN_FORWARD_BACKWARD);
        }
        double eg = worst_param_diff(&base, &rc, 1);
        if (!(eg <= worst_grad)) worst_grad = eg; /* (NaN counts) */
        CHECK(pdde_session_run(base.s, PDDE_RUN_OPTIMIZER) == PDDE_OK && pdde_session_run(rc.s, PDDE_RUN_OPTIMIZER) == PDDE_OK,
              "accum: optimizer run");
    }
    double worst_param = worst_param_diff(&base, &rc, 0);
    CHECK(worst_grad == 0 && worst_param == 0, "accum: gradients differ by %.3g, parameters by %.3g", worst_grad, worst_param);
    printf("%-34s worst relative difference: grads %.2g, params %.2g\n", "gradient accumulation (2 micro)", worst_grad, worst_param);
    run_free(&base), run_free(&rc);
}

static void test_errors(void) {
    pdde_context *ctx;
    pdde_graph *g;
    gpt_model m;
    pdde_context_init(NULL, &ctx);
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &small, &m) == PDDE_OK, "build");
    CHECK(pdde_graph_set_recompute(g, -1, 1) == PDDE_ERR_INVALID_ARG, "a negative layer is refused");
    CHECK(pdde_graph_set_recompute(NULL, 1, 1) == PDDE_ERR_INVALID_ARG, "NULL graph");
    CHECK(pdde_graph_set_recompute(g, 1000, 0) == PDDE_OK, "turning off a layer never set is fine");
    CHECK(pdde_graph_set_recompute(g, 1, 1) == PDDE_OK && pdde_graph_set_recompute(g, 1, 0) == PDDE_OK, "on, then off");
    CHECK(pdde_backward(g, m.loss) == PDDE_OK, "backward");
    CHECK(pdde_graph_set_recompute(g, 1, 1) == PDDE_ERR_STATE && strstr(pdde_last_error(ctx), "before pdde_backward"),
          "set after backward is refused: %s", pdde_last_error(ctx));
    /* layer 1 was turned off again: nothing was cloned */
    int clones = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        clones += t->phase == PDDE_PHASE_BACKWARD && t->op == PDDE_OP_LAYERNORM;
    }
    CHECK(clones == 0, "%d layernorms in backward with recompute off", clones);
    pdde_graph_free(g);
    pdde_context_free(ctx);
}

/* README's figure: the activation arena of build/gpt's default model (the session's memory plan, what
 * it allocates) drops from 19.0 MB to 7.2 MB with every transformer block recomputed. */
static void test_readme_arena(void) {
    const gpt_config c = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8}; /* build/gpt's default */
    double mb[2] = {0, 0};
    for (int rc = 0; rc < 2; rc++) {
        pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
        cp.backends = "cpu";
        pdde_context *ctx;
        pdde_graph *g;
        pdde_session *s = NULL;
        gpt_model m;
        pdde_context_init(&cp, &ctx);
        pdde_graph_init(ctx, &g);
        gpt_plan plan = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .recompute = rc};
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        pdde_status st = gpt_build_plan(g, &c, &plan, &op, &m);
        if (!st) pdde_mark_output(m.logits), st = pdde_session_init(g, NULL, &s);
        pdde_memory_stats ms;
        if (!st) st = pdde_session_memory(s, &ms);
        CHECK(!st, "default gpt%s: %s", rc ? " recomputed" : "", pdde_last_error(ctx));
        if (!st) mb[rc] = (double)ms.arena_bytes / 1e6;
        pdde_session_free(s);
        pdde_graph_free(g);
        pdde_context_free(ctx);
    }
    CHECK(fabs(mb[0] - 19.04) < 0.05 && fabs(mb[1] - 7.22) < 0.05, "the default gpt's arena: %.2f MB, %.2f MB recomputed (RESULTS.md: 19.0, 7.2)",
          mb[0], mb[1]);
}

/* A planner's plan recomputing the first rc layers of its one stage ("rc=K", what the search picks when
 * a stage fits only so), run by gpt_build_plan: exactly those layers are recomputed (the backward of
 * each reads clones, the next layer's reads its own activations), the arena the session allocates
 * shrinks as pdde_predict_memory predicts, and the losses equal the plan's without recompute. */
static void test_plan_partial(void) {
    enum { STEPS = 3 };
    const int counts[3] = {0, 3, small.layers + 2};
    float loss[3][STEPS];
    size_t arena[3] = {0};
    for (int i = 0; i < 3; i++) {
        char text[96];
        snprintf(text, sizeof text, "dp=1,tp=1,pp=1,mb=1,zero=0,recompute=0,rc=%d", counts[i]);
        pdde_plan plan;
        run r;
        memset(&r, 0, sizeof r);
        pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
        cp.n_threads = 2;
        pdde_status st = pdde_plan_parse(text, &plan);
        CHECK(st == PDDE_OK && plan.recompute_layers[0] == counts[i], "parse %s", text);
        if (st || pdde_context_init(&cp, &r.ctx) || pdde_graph_init(r.ctx, &r.g)) return;
        gpt_plan gp = gpt_plan_of(&plan);
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        op.lr = 1e-2f;
        st = gpt_build_plan(r.g, &small, &gp, &op, &r.m);
        if (!st) st = pdde_session_init(r.g, NULL, &r.s);
        pdde_memory_stats predicted = {0};
        if (!st) st = pdde_predict_memory(r.g, NULL, 0, 0, &predicted);
        CHECK(st == PDDE_OK, "%s: %s", text, pdde_last_error(r.ctx));
        if (st) { run_free(&r); return; }
        pdde_session_memory(r.s, &r.mem);
        arena[i] = r.mem.arena_bytes;
        CHECK(predicted.arena_bytes == r.mem.arena_bytes, "%s: pdde_predict_memory predicts an arena of %zu B, the session allocates %zu B", text,
              predicted.arena_bytes, r.mem.arena_bytes);
        unsigned first = counts[i] >= 32 ? ~0u : (1u << counts[i]) - 1, next = 1u << counts[i];
        CHECK(reads_kept_activations(&r, first) == 0, "%s: the backward of a layer below %d reads its kept activations", text, counts[i]);
        if (counts[i] >= 1 && counts[i] <= small.layers) /* a block: its backward reads what it kept */
            CHECK(reads_kept_activations(&r, next) > 0, "%s: layer %d (not in the plan's rc) is recomputed too", text, counts[i]);
        for (int step = 0; step < STEPS; step++) {
            feed(&r, step);
            CHECK(pdde_session_run(r.s, PDDE_RUN_STEP) == PDDE_OK, "%s: %s", text, pdde_last_error(r.ctx));
            loss[i][step] = pdde_session_loss(r.s);
        }
        run_free(&r);
    }
    /* (recomputing the last block and the head too leaves the peak where it is: the arena may stay) */
    CHECK(arena[1] < arena[0] && arena[2] <= arena[1], "arena with rc=0, 3, %d: %zu, %zu, %zu B (must fall, then not grow)", small.layers + 2, arena[0], arena[1],
          arena[2]);
    for (int step = 0; step < STEPS; step++)
        CHECK(loss[1][step] == loss[0][step] && loss[2][step] == loss[0][step], "step %d: loss %.9g (rc=3), %.9g (all) vs %.9g without", step,
              loss[1][step], loss[2][step], loss[0][step]);
}

int main(void) {
    test_readme_arena();
    unsigned blocks = 0;
    for (int l = 1; l <= small.layers; l++) blocks |= 1u << l;
    compare("gpt, every block recomputed", gpt_build, blocks, 1);
    compare("gpt, block 2 of 3 recomputed", gpt_build, 1u << 2, 0);
    compare("gpt, every layer (with head, emb)", gpt_build, blocks | 1u | 1u << (small.layers + 1), 1);
    compare("dropout model, every block", build_dropout_model, blocks, 1);
    compare("dropout model, blocks 1 and 3", build_dropout_model, 1u << 1 | 1u << 3, 0);
    test_accumulation();
    test_plan_partial();
    test_errors();
    return test_finish();
}
