/* mlp_dp — Demonstrates how to train mlp.c's model on several processes with data parallelism.
 * Every rank builds the same global graph, annotates it data parallel on a 1-D mesh and writes only
 * its own rows of each batch; gradients are averaged once a step, so the result is one process's.
 *     build/pdde-run -n 2 build/mlp_dp     (or mpirun -n 2, srun -n 2; alone: one process) */
#include "pdde.h"
#include <stdio.h>

#define BATCH 64
#define TRY(call) do { if ((call) != PDDE_OK) { fprintf(stderr, "mlp_dp: %s\n", pdde_last_error(ctx)); return 1; } } while (0)

int main(void) {
    pdde_context *ctx;
    pdde_comm *world = NULL;
    pdde_graph *g;
    pdde_session *s;
    pdde_context_init(NULL, &ctx);
    pdde_comm_env env; /* started by a launcher (pdde-run, mpirun, srun)? then meet the other ranks */
    if (pdde_comm_env_read(ctx, &env) == PDDE_OK) TRY(pdde_comm_init(ctx, NULL, &world));
    int rank = world ? pdde_comm_rank(world) : 0, ranks = world ? pdde_comm_size(world) : 1;
    if (BATCH % ranks) { fprintf(stderr, "mlp_dp: %d ranks do not divide the batch of %d\n", ranks, BATCH); return 1; }
    TRY(pdde_graph_init(ctx, &g));

    /* the global graph: mlp.c's model on the whole batch */
    pdde_tensor *x  = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){BATCH, 10});
    pdde_tensor *t  = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){BATCH});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){10, 32}, 0.3f);
    pdde_tensor *b1 = pdde_param(g, "b1", 1, (int64_t[]){32}, 0.0f);
    pdde_tensor *w2 = pdde_param(g, "w2", 2, (int64_t[]){32, 3}, 0.3f);
    pdde_tensor *h  = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1));
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), t);

    /* the ranks as a 1-D mesh "dp": inputs split on the batch, parameters replicated */
    const pdde_mesh *mesh = pdde_mesh_create(g, 1, (int[]){ranks}, (const char *[]){"dp"}, NULL);
    TRY(pdde_strategy_data_parallel(g, mesh, "dp"));
    TRY(pdde_backward(g, loss));
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = 1e-2f;
    TRY(pdde_optimizer_adamw(g, &opt));
    TRY(pdde_complete_dist_attrs(g));                /* every tensor gets its distributed attribute */
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = world;                                /* NULL: one process */
    TRY(pdde_session_init(g, &sp, &s));              /* this rank's local program: BATCH / ranks rows */

    float xs[BATCH * 10] = {0};
    int32_t ts[BATCH] = {0};
    for (int i = 0; i < BATCH; i++) xs[i * 10 + i % 10] = 1.0f, ts[i] = (i % 10) % 3;
    int rows = BATCH / ranks, first = rank * rows;   /* this rank's part of every batch */
    for (int step = 0; step < 100; step++) {
        TRY(pdde_session_write(s, x, xs + first * 10, (size_t)rows * 10 * sizeof *xs));
        TRY(pdde_session_write(s, t, ts + first, (size_t)rows * sizeof *ts));
        TRY(pdde_session_run(s, PDDE_RUN_STEP));      /* forward, backward, gradient allreduce, AdamW */
    }
    if (rank == 0) printf("loss %.9g (%d ranks)\n", pdde_session_loss(s), ranks); /* the global batch's mean */
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_comm_free(world);
    pdde_context_free(ctx);
    return 0;
}
