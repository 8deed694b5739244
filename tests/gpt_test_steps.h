/* gpt_test_steps.h — the GPT device tests' training: each step's ids and targets a fixed pattern of the
 * step (the same on every device and rank), then the step. Header-only; after examples/gpt.h. */
#ifndef PDDE_GPT_TEST_STEPS_H
#define PDDE_GPT_TEST_STEPS_H
#include <stdio.h>
#include <stdlib.h>

/* Step's pattern: n ids into x and n targets into y, below vocab. */
static inline void gpt_test_pattern(int32_t *x, int32_t *y, int n, int vocab, int step) {
    for (int i = 0; i < n; i++) x[i] = (i * 5 + step * 3) % vocab, y[i] = (i * 7 + step + 2) % vocab;
}

/* Writes step's batch (batch x ctx ids and targets) into m's inputs. */
static inline pdde_status gpt_test_write_batch(pdde_session *s, const gpt_model *m, int step) {
    int n = m->cfg.batch * m->cfg.ctx, vocab = m->cfg.vocab;
    int32_t *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    pdde_status st = x && y ? PDDE_OK : PDDE_ERR_OOM;
    if (!st) gpt_test_pattern(x, y, n, vocab, step);
    if (!st) st = pdde_session_write(s, m->ids, x, (size_t)n * sizeof *x);
    if (!st) st = pdde_session_write(s, m->targets, y, (size_t)n * sizeof *y);
    free(x), free(y);
    return st;
}

/* steps training steps on those batches, each step's loss into losses: 0, or -1 (the error printed). */
static inline int gpt_test_train(pdde_context *ctx, pdde_session *s, const gpt_model *m, int steps, float *losses) {
    for (int step = 0; step < steps; step++) {
        if (gpt_test_write_batch(s, m, step) || pdde_session_run(s, PDDE_RUN_STEP)) {
            fprintf(stderr, "step %d: %s\n", step, pdde_last_error(ctx));
            return -1;
        }
        losses[step] = pdde_session_loss(s);
    }
    return 0;
}
/* The plan's GPT of cfg under compute dtype dt (AdamW, lr 3e-3, gradients clipped to norm 1) in a session on world's
 * ranks, its graph in *g: 0, or the failure's status (whatever was made freed). */
static inline pdde_status gpt_test_rank_session(pdde_context *ctx, pdde_comm *world, const gpt_config *cfg, const gpt_plan *plan,
                                                pdde_dtype dt, pdde_graph **g, pdde_session **s, gpt_model *m) {
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.clip_norm = 1.0f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = world;
    *s = NULL;
    pdde_graph_init(ctx, g);
    pdde_status st = pdde_graph_set_compute_dtype(*g, dt);
    if (!st) st = gpt_build_plan(*g, cfg, plan, &op, m);
    if (!st) st = pdde_session_init(*g, &sp, s);
    if (st) pdde_graph_free(*g), *g = NULL;
    return st;
}

/* step's batch (the pattern of gpt_test_write_batch: the global batch, its micro-batches one after another, of which a
 * data-parallel rank writes its rows), then the step, on world's ranks */
static inline pdde_status gpt_test_rank_step(pdde_session *s, const gpt_model *m, const gpt_plan *plan, pdde_comm *world, int step) {
    int n = m->cfg.batch * (plan->micro > 1 ? plan->micro : 1) * m->cfg.ctx, vocab = m->cfg.vocab;
    int32_t *x = (int32_t *)malloc((size_t)n * sizeof *x), *y = (int32_t *)malloc((size_t)n * sizeof *y);
    pdde_status st = x && y ? PDDE_OK : PDDE_ERR_OOM;
    if (!st) gpt_test_pattern(x, y, n, vocab, step);
    if (!st) st = gpt_write_batch(s, m, plan, plan->dp > 1 ? pdde_comm_rank(world) : 0, x, y);
    if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
    free(x), free(y);
    return st;
}
#endif
