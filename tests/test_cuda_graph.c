/* test_cuda_graph — the decisions behind PDDE_CUDA_GRAPH=1 (backends/gpu_graph.h), without a GPU:
 *  - a real training session (CPU) gives every node the same key step after step, although the executor
 *    sets another learning rate, step, and dropout counter each step (so a captured step can be replayed; also
 *    a bf16 GPT with the fusions the CUDA defaults turn on, accumulating micro-batches),
 *    and the keys move with what a replay cannot take: a source's address or offset, a shape, an op
 *    parameter that is not per-step;
 *  - a segment runs plain twice, is captured on its third run and replayed from its fourth; an operation
 *    that differs, a segment that ends early or runs longer falls back (the graph dropped); segments that
 *    alternate keep a graph each; the least recently used one gives way. */
#define _GNU_SOURCE /* (setenv) */
#include "pdde.h"
#include "backends/gpu_graph.h"
#include "examples/gpt.h"
#include "tests/test_util.h"

/* ---- the keys of a real session's nodes across steps ---- */

typedef struct {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    pdde_tensor *x, *y;
} mlp;

static int mlp_init(mlp *m, int64_t batch) {
    memset(m, 0, sizeof *m);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;
    if (pdde_context_init(&cp, &m->ctx) || pdde_graph_init(m->ctx, &m->g)) return -1;
    pdde_graph *g = m->g;
    m->x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){batch, 8});
    m->y = pdde_input(g, "y", PDDE_I32, 1, (int64_t[]){batch});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){8, 16}, 0.2f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){16, 5}, 0.2f);
    pdde_tensor *h = pdde_dropout(g, pdde_gelu(g, pdde_matmul(g, m->x, w1, 0, 0)), 0.25f, 7);
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), m->y);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f, op.warmup_steps = 10, op.clip_norm = 1.0f, op.weight_decay = 0.1f; /* (warmup: another lr each step) */
    if (pdde_graph_status(g) || pdde_backward(g, loss) || pdde_optimizer_adamw(g, &op)) return -1;
    return pdde_session_init(g, NULL, &m->s) ? -1 : 0;
}

static void mlp_free(mlp *m) {
    pdde_session_free(m->s);
    pdde_graph_free(m->g);
    pdde_context_free(m->ctx);
}

static int mlp_step(mlp *m, int step, int64_t batch) {
    float x[64 * 8];
    int32_t y[64];
    for (int i = 0; i < batch * 8; i++) x[i] = (float)((i * 7 + step * 3) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < batch; i++) y[i] = (i + step) % 5;
    if (pdde_session_write(m->s, m->x, x, (size_t)batch * 8 * sizeof *x) || pdde_session_write(m->s, m->y, y, (size_t)batch * sizeof *y))
        return -1;
    return pdde_session_run(m->s, PDDE_RUN_STEP) ? -1 : 0;
}

static void test_session_keys(void) {
    mlp m;
    int64_t batch = 6;
    CHECK(mlp_init(&m, batch) == 0, "session: %s", m.ctx ? pdde_last_error(m.ctx) : "no context");
    if (test_failed) return;
    int n = pdde_session_node_count(m.s);
    uint64_t *keys = calloc((size_t)n, sizeof *keys);
    float *lr = calloc((size_t)n, sizeof *lr);
    int32_t *ctr = calloc((size_t)n, sizeof *ctr);
    int n_update = 0, n_dropout = 0, n_per_step = 0;
    for (int step = 0; step < 3; step++) {
        CHECK(mlp_step(&m, step, batch) == 0, "step %d: %s", step, pdde_last_error(m.ctx));
        int changed = 0, lr_moved = 0, ctr_moved = 0;
        for (int i = 0; i < n; i++) {
            const pdde_tensor *t = pdde_session_node(m.s, i);
            int per_step = 0;
            uint64_t k = pgd_graph_node_key(t, &per_step);
            int upd = t->op == PDDE_OP_ADAMW_UPDATE, drop = t->op == PDDE_OP_DROPOUT || t->op == PDDE_OP_DROPOUT_BACK;
            if (step == 0) n_update += upd, n_dropout += drop, n_per_step += per_step;
            else {
                changed += k != keys[i];
                lr_moved += upd && pdde_op_f32(t, PDDE_P_UPDATE_LR) != lr[i];
                ctr_moved += drop && pdde_op_i32(t, PDDE_P_DROPOUT_COUNTER) != ctr[i];
            }
            keys[i] = k, lr[i] = pdde_op_f32(t, PDDE_P_UPDATE_LR), ctr[i] = pdde_op_i32(t, PDDE_P_DROPOUT_COUNTER);
        }
        if (step == 0) continue;
        CHECK(changed == 0, "step %d: %d of %d node keys changed (the program and its addresses did not)", step, changed, n);
        CHECK(lr_moved == n_update && n_update >= 2, "step %d: the learning rate moved on %d of %d updates (warmup)", step, lr_moved, n_update);
        CHECK(ctr_moved == n_dropout && n_dropout >= 1, "step %d: the dropout counter moved on %d of %d dropouts", step, ctr_moved, n_dropout);
    }
    CHECK(n_per_step >= n_update + n_dropout, "%d nodes marked per-step, %d updates + %d dropouts", n_per_step, n_update, n_dropout);

    /* what the key must see: a node's own and its sources' address, offset, shape, a fixed parameter */
    const pdde_tensor *mm = NULL;
    for (int i = 0; i < n && !mm; i++)
        if (pdde_session_node(m.s, i)->op == PDDE_OP_MATMUL) mm = pdde_session_node(m.s, i);
    CHECK(mm && mm->nsrc == 2, "a matmul node in the session");
    if (mm) {
        pdde_tensor node = *mm, a = *mm->src[0], b = *mm->src[1];
        node.src[0] = &a, node.src[1] = &b;
        uint64_t k0 = pgd_graph_node_key(&node, NULL);
        CHECK(pgd_graph_node_key(&node, NULL) == k0, "a key is a function of the node");
        a.offset += 256;
        CHECK(pgd_graph_node_key(&node, NULL) != k0, "a source moved by 256 bytes: the same key");
        a.offset -= 256, b.data = (char *)b.data + 4096;
        CHECK(pgd_graph_node_key(&node, NULL) != k0, "a source in another buffer: the same key");
        b.data = (char *)b.data - 4096, node.offset += 64;
        CHECK(pgd_graph_node_key(&node, NULL) != k0, "the output moved: the same key");
        node.offset -= 64, node.shape[0]++;
        CHECK(pgd_graph_node_key(&node, NULL) != k0, "another shape: the same key");
        node.shape[0]--, node.iparams[PDDE_P_MATMUL_TRANS_B] ^= 1;
        CHECK(pgd_graph_node_key(&node, NULL) != k0, "another transpose: the same key");
        node.iparams[PDDE_P_MATMUL_TRANS_B] ^= 1;
        CHECK(pgd_graph_node_key(&node, NULL) == k0, "restored: the key back");
    }
    /* per-step slots only: an update's weight decay, a dropout's p are not per-step */
    for (int i = 0; i < n; i++) {
        const pdde_tensor *t = pdde_session_node(m.s, i);
        if (t->op != PDDE_OP_ADAMW_UPDATE && t->op != PDDE_OP_DROPOUT) continue;
        pdde_tensor c = *t;
        uint64_t k0 = pgd_graph_node_key(&c, NULL);
        if (t->op == PDDE_OP_ADAMW_UPDATE) {
            c.fparams[PDDE_P_UPDATE_LR] *= 3, c.iparams[PDDE_P_UPDATE_STEP] += 5, c.fparams[PDDE_P_UPDATE_GRAD_SCALE] = 0.5f;
            CHECK(pgd_graph_node_key(&c, NULL) == k0, "%s: lr, step and grad scale changed the key", t->name);
            c.fparams[PDDE_P_UPDATE_BETA2] = 0.5f;
            CHECK(pgd_graph_node_key(&c, NULL) != k0, "%s: beta2 did not change the key", t->name);
        } else {
            c.iparams[PDDE_P_DROPOUT_COUNTER] += 9;
            CHECK(pgd_graph_node_key(&c, NULL) == k0, "%s: the counter changed the key", t->name);
            c.fparams[PDDE_P_DROPOUT_P] = 0.5f;
            CHECK(pgd_graph_node_key(&c, NULL) != k0, "%s: p did not change the key", t->name);
        }
    }
    free(keys), free(lr), free(ctr);
    mlp_free(&m);

    /* a session of another batch: its matmul keys are others (shapes, buffers) */
    mlp m2;
    CHECK(mlp_init(&m2, 5) == 0 && mlp_step(&m2, 0, 5) == 0, "second session");
    if (!test_failed) {
        pdde_tensor *const nodes[1] = {(pdde_tensor *)pdde_session_node(m2.s, 0)};
        CHECK(pgd_graph_group_key(nodes, 1, 0, NULL) != pgd_graph_group_key(nodes, 1, 1, NULL), "a declined group: the accepted one's key");
    }
    mlp_free(&m2);
}

/* A bf16 GPT step with the fusions the CUDA defaults turn on (the casts folded, epilogues, bf16 copies beside
 * their values, weights' bf16 copies rewritten by the update), accumulating 2 micro-batches: every node's key
 * is the same after the third step as after the second (the first writes the weights' bf16 copies). */
static void test_gpt_keys(void) {
    static const char *const fusions[] = {"PDDE_FUSE_EPILOGUE", "PDDE_FUSE_GRAD", "PDDE_FUSE_ADD_LN", "PDDE_BF16_LOGITS", "PDDE_BF16_GRADS",
                                          "PDDE_ATT_LOWP"};
    for (size_t i = 0; i < sizeof fusions / sizeof *fusions; i++) setenv(fusions[i], "1", 1);
    const gpt_config c = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 2};
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;
    pdde_context *ctx = NULL;
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-3f, op.warmup_steps = 5, op.clip_norm = 1.0f, op.grad_accum_steps = 2;
    int ok = !pdde_context_init(&cp, &ctx) && !pdde_graph_init(ctx, &g) && !pdde_graph_set_compute_dtype(g, PDDE_BF16) && !gpt_build(g, &c, &m) &&
             !pdde_backward(g, m.loss) && !pdde_optimizer_adamw(g, &op) && !pdde_session_init(g, NULL, &s);
    CHECK(ok, "bf16 GPT session: %s", ctx ? pdde_last_error(ctx) : "no context");
    int n = ok ? pdde_session_node_count(s) : 0, changed = 0;
    uint64_t *keys = calloc((size_t)n + 1, sizeof *keys);
    int32_t ids[2 * 16], tg[2 * 16];
    for (int step = 0; ok && step < 3; step++) {
        for (int micro = 0; micro < 2 && ok; micro++) {
            for (int i = 0; i < 32; i++) ids[i] = (i * 5 + step + micro) % 64, tg[i] = (i * 3 + step) % 64;
            ok = !pdde_session_write_micro(s, m.ids, micro, ids, sizeof ids) && !pdde_session_write_micro(s, m.targets, micro, tg, sizeof tg);
        }
        ok = ok && !pdde_session_run(s, PDDE_RUN_STEP);
        CHECK(ok, "step %d: %s", step, pdde_last_error(ctx));
        for (int i = 0; ok && i < n; i++) {
            uint64_t k = pgd_graph_node_key(pdde_session_node(s, i), NULL);
            if (step == 2 && k != keys[i]) changed++;
            keys[i] = k;
        }
    }
    CHECK(ok && changed == 0, "bf16 GPT: %d of %d node keys changed from the second step to the third", changed, n);
    free(keys);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    for (size_t i = 0; i < sizeof fusions / sizeof *fusions; i++) unsetenv(fusions[i]);
}

/* ---- the decisions ---- */

/* Runs one segment of keys through tr (stops at a divergence's point, as the backend would go on PLAIN);
 * returns the close's action; *mode the open's mode, *diverged the index that diverged (-1: none). */
static pgd_graph_action run_segment(pgd_graph_tracker *tr, const uint64_t *k, int n, pgd_graph_mode *mode, int *diverged, int *drop) {
    int d = 0;
    *mode = pgd_graph_open(tr, k[0], &d);
    if (drop) *drop = d;
    *diverged = -1;
    for (int i = 0; i < n; i++) {
        int r = pgd_graph_op(tr, k[i]);
        if (r == PGD_GRAPH_DIVERGE && *diverged < 0) *diverged = i;
        if (r == PGD_GRAPH_NOMEM) return (pgd_graph_action)-1;
    }
    return pgd_graph_close(tr);
}

static void test_decisions(void) {
    pgd_graph_tracker tr;
    memset(&tr, 0, sizeof tr);
    const uint64_t a[3] = {11, 12, 13}, b[2] = {21, 22}, a_mid[3] = {11, 12, 99}, a_short[2] = {11, 12}, a_long[4] = {11, 12, 13, 14};
    pgd_graph_mode m;
    int dv;
    static const char *const mn[] = {"idle", "plain", "capture", "replay"};
    pgd_graph_action act = run_segment(&tr, a, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_PLAIN && act == PGD_GRAPH_DONE, "first run: %s, action %d", mn[m], act);
    act = run_segment(&tr, a, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_PLAIN && act == PGD_GRAPH_DONE, "second run: %s, action %d", mn[m], act);
    act = run_segment(&tr, a, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_CAPTURE && act == PGD_GRAPH_KEEP, "third run: %s, action %d (captured, kept)", mn[m], act);
    for (int r = 0; r < 3; r++) {
        act = run_segment(&tr, a, 3, &m, &dv, NULL);
        CHECK(m == PGD_GRAPH_REPLAY && act == PGD_GRAPH_LAUNCH && dv < 0, "run %d: %s, action %d, diverged at %d", r + 4, mn[m], act, dv);
    }
    /* an operation differs: the deferred ones run, the graph goes, two plain runs, a capture, a replay */
    act = run_segment(&tr, a_mid, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_REPLAY && dv == 2 && act == PGD_GRAPH_DONE, "diverging run: %s, diverged at %d, action %d", mn[m], dv, act);
    CHECK(!tr.slot[tr.cur].has_exec && tr.slot[tr.cur].n == 3 && tr.slot[tr.cur].keys[2] == 99, "after a divergence: the new keys, no graph");
    act = run_segment(&tr, a_mid, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_PLAIN && act == PGD_GRAPH_DONE, "after divergence, run 2: %s", mn[m]);
    act = run_segment(&tr, a_mid, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_CAPTURE && act == PGD_GRAPH_KEEP, "after divergence, run 3: %s, action %d", mn[m], act);
    act = run_segment(&tr, a_mid, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_REPLAY && act == PGD_GRAPH_LAUNCH, "after divergence, run 4: %s, action %d", mn[m], act);
    /* ends early; runs longer */
    act = run_segment(&tr, a_short, 2, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_REPLAY && act == PGD_GRAPH_FALLBACK, "a shorter segment: %s, action %d (the deferred run, no launch)", mn[m], act);
    CHECK(!tr.slot[tr.cur].has_exec && tr.slot[tr.cur].n == 2, "after a shorter run: %d keys, graph %d", tr.slot[tr.cur].n, tr.slot[tr.cur].has_exec);
    for (int r = 0; r < 2; r++) run_segment(&tr, a_short, 2, &m, &dv, NULL); /* (the fallback ran it plain once) */
    CHECK(m == PGD_GRAPH_CAPTURE, "the shorter segment captured on its third run: %s", mn[m]);
    act = run_segment(&tr, a_long, 4, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_REPLAY && dv == 2 && act == PGD_GRAPH_DONE, "a longer segment: %s, diverged at %d, action %d", mn[m], dv, act);
    /* a capture whose keys differ from the two runs before is launched, not kept */
    pgd_graph_tracker t2;
    memset(&t2, 0, sizeof t2);
    run_segment(&t2, a, 3, &m, &dv, NULL), run_segment(&t2, a, 3, &m, &dv, NULL);
    act = run_segment(&t2, a_mid, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_CAPTURE && act == PGD_GRAPH_DISCARD && !t2.slot[t2.cur].has_exec, "a capture unlike its runs: %s, action %d", mn[m], act);
    act = run_segment(&t2, a_mid, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_PLAIN, "after a discarded capture: %s", mn[m]);
    /* two segments alternating (forward, then backward and update): a graph each */
    pgd_graph_tracker t3;
    memset(&t3, 0, sizeof t3);
    pgd_graph_mode ma = PGD_GRAPH_IDLE, mb = PGD_GRAPH_IDLE;
    pgd_graph_action aa = PGD_GRAPH_DONE, ab = PGD_GRAPH_DONE;
    for (int r = 0; r < 5; r++) aa = run_segment(&t3, a, 3, &ma, &dv, NULL), ab = run_segment(&t3, b, 2, &mb, &dv, NULL);
    CHECK(ma == PGD_GRAPH_REPLAY && mb == PGD_GRAPH_REPLAY && aa == PGD_GRAPH_LAUNCH && ab == PGD_GRAPH_LAUNCH,
          "alternating segments: %s/%s, actions %d/%d", mn[ma], mn[mb], aa, ab);
    /* more segments than slots: the least recently used one gives way (its graph dropped) */
    int drops = 0, drop;
    for (int i = 0; i < PGD_GRAPH_SLOTS - 2; i++) { /* (a and b hold two) */
        uint64_t k[1] = {1000 + (uint64_t)i};
        run_segment(&t3, k, 1, &m, &dv, &drop);
        drops += drop;
    }
    CHECK(drops == 0, "%d graphs dropped while slots were free", drops);
    uint64_t k[1] = {5000};
    run_segment(&t3, k, 1, &m, &dv, &drop);
    CHECK(drop == 1 && m == PGD_GRAPH_PLAIN, "a 17th segment: drop %d (segment a's graph), %s", drop, mn[m]);
    act = run_segment(&t3, b, 2, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_REPLAY && act == PGD_GRAPH_LAUNCH, "segment b kept its graph: %s", mn[m]);
    act = run_segment(&t3, a, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_PLAIN, "segment a starts over: %s", mn[m]);
    /* a failed capture or patch abandons the slot: plain twice before the next capture */
    pgd_graph_tracker t4;
    memset(&t4, 0, sizeof t4);
    for (int r = 0; r < 3; r++) run_segment(&t4, a, 3, &m, &dv, NULL);
    pgd_graph_abandon(&t4);
    run_segment(&t4, a, 3, &m, &dv, NULL);
    CHECK(m == PGD_GRAPH_PLAIN, "after an abandoned graph: %s", mn[m]);
    /* a long segment is full after PGD_GRAPH_MAX_OPS operations, in every mode */
    pgd_graph_tracker t5;
    memset(&t5, 0, sizeof t5);
    uint64_t *lk = malloc(PGD_GRAPH_MAX_OPS * sizeof *lk);
    for (int i = 0; i < PGD_GRAPH_MAX_OPS; i++) lk[i] = 7000 + (uint64_t)i;
    for (int r = 0; r < 4; r++) {
        int drop, full_early = 0;
        m = pgd_graph_open(&t5, lk[0], &drop);
        for (int i = 0; i < PGD_GRAPH_MAX_OPS; i++) {
            full_early += pgd_graph_full(&t5);
            pgd_graph_op(&t5, lk[i]);
        }
        CHECK(pgd_graph_full(&t5) && !full_early, "run %d (%s): full after %d operations, %d times before", r, mn[m], PGD_GRAPH_MAX_OPS, full_early);
        act = pgd_graph_close(&t5);
    }
    CHECK(m == PGD_GRAPH_REPLAY && act == PGD_GRAPH_LAUNCH && !pgd_graph_full(&t5), "a full segment replays: %s, action %d", mn[m], act);
    free(lk);
    pgd_graph_tracker_free(&tr), pgd_graph_tracker_free(&t2), pgd_graph_tracker_free(&t3), pgd_graph_tracker_free(&t4), pgd_graph_tracker_free(&t5);
}

int main(void) {
    test_session_keys();
    test_gpt_keys();
    test_decisions();
    return test_finish();
}
