/* gpt_test_steps.h — the GPT device tests' training: each step's ids and targets a fixed pattern of the
 * step (the same on every device and rank), then the step. Header-only; after examples/gpt.h. */
#ifndef PDDE_GPT_TEST_STEPS_H
#define PDDE_GPT_TEST_STEPS_H
#include <stdio.h>
#include <stdlib.h>

/* Writes step's batch (batch x ctx ids and targets) into m's inputs. */
static inline pdde_status gpt_test_write_batch(pdde_session *s, const gpt_model *m, int step) {
    int n = m->cfg.batch * m->cfg.ctx, vocab = m->cfg.vocab;
    int32_t *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    pdde_status st = x && y ? PDDE_OK : PDDE_ERR_OOM;
    for (int i = 0; !st && i < n; i++) x[i] = (i * 5 + step * 3) % vocab, y[i] = (i * 7 + step + 2) % vocab;
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
#endif
