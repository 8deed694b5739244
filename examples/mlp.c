/* mlp — Demonstrates how to build, train and checkpoint a model: a two-layer MLP classifier trained
 * with AdamW in one process (the README's program). */
#include "pdde.h"
#include <stdio.h>

int main(void) {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    pdde_context_init(NULL, &ctx);                   /* NULL params = defaults (all cores) */
    pdde_graph_init(ctx, &g);

    /* y = relu(x W1 + b1) W2: building allocates no data */
    pdde_tensor *x  = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){64, 10});
    pdde_tensor *t  = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){64});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){10, 32}, 0.3f);   /* N(0, 0.3) */
    pdde_tensor *b1 = pdde_param(g, "b1", 1, (int64_t[]){32}, 0.0f);      /* zeros */
    pdde_tensor *w2 = pdde_param(g, "w2", 2, (int64_t[]){32, 3}, 0.3f);
    pdde_tensor *h  = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1));
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), t);
    if (pdde_graph_status(g)) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }

    pdde_backward(g, loss);                           /* appends the backward nodes */
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = 1e-2f;
    pdde_optimizer_adamw(g, &opt);                    /* appends one update node per parameter */
    pdde_session_init(g, NULL, &s);                   /* schedule + memory plan + allocation */

    float xs[64 * 10] = {0};
    int32_t ts[64] = {0};
    for (int i = 0; i < 64; i++) xs[i * 10 + i % 10] = 1.0f, ts[i] = (i % 10) % 3;
    for (int step = 0; step < 100; step++) {
        pdde_session_write(s, x, xs, sizeof xs);
        pdde_session_write(s, t, ts, sizeof ts);
        pdde_session_run(s, PDDE_RUN_STEP);            /* forward + backward + AdamW */
    }
    printf("loss %.4f\n", pdde_session_loss(s));
    pdde_checkpoint_save(s, "mlp.ckpt", NULL);        /* atomic: write, fsync, rename */
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return 0;
}
