/* test_dp_mean — means and products of reductions over a batch split by data parallelism, against one
 * process: the gradients completion and lowering give small graphs on 2 ranks (x [8, 4] split on its
 * rows, weights whole) equal one process's. One SGD step of lr 1 (the weights' change is minus their
 * gradient) and the loss the session reports (a loss pending a sum over the ranks: their sum), each
 * within TOL relative (NaN fails), for:
 *   mean      loss = mean(x W1): the gradient of pdde_mean over the split rows (each rank's mean's
 *             gradient, averaged over the ranks: not 1/ranks too small)
 *   mean_rows loss = sum(mean(x W1, rows)): a mean over the split dim alone, then summed
 *   mul       loss = sum(sum(x W1, rows) * mean(x W2, rows)): a pending sum times a pending mean (one
 *             of them reduced first; the product is a sum, not labelled an average)
 *   mul_rows  loss = mean(x W1 * mean(x W2, rows)): a split tensor times a pending mean
 *   sum_mean  loss = sum(x W1) * mean(x W2): two whole-batch reductions, multiplied */
#define _GNU_SOURCE
#include "pdde.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL 1e-5
enum { N = 8, K = 4, M = 3 };
typedef struct { float dw1[K * M], dw2[K * M], loss; int ok; char error[256]; } result;
static const char *const names[] = {"mean", "mean_rows", "mul", "mul_rows", "sum_mean"};
static int which;

static pdde_tensor *build(pdde_graph *g, int c, pdde_tensor **x, pdde_tensor **w1, pdde_tensor **w2) {
    *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){N, K});
    *w1 = pdde_param(g, "w1", 2, (int64_t[]){K, M}, 0.5f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){K, M}, 0.5f);
    pdde_tensor *y1 = pdde_matmul(g, *x, *w1, 0, 0), *y2 = pdde_matmul(g, *x, *w2, 0, 0);
    switch (c) {
    case 0: return pdde_sum(g, pdde_add(g, pdde_mean(g, y1, -1, 0), pdde_scale(g, pdde_mean(g, y2, -1, 0), 0.0f)), -1, 0);
    case 1: return pdde_sum(g, pdde_add(g, pdde_mean(g, y1, 0, 0), pdde_scale(g, pdde_mean(g, y2, 0, 0), 0.0f)), -1, 0);
    case 2: return pdde_sum(g, pdde_mul(g, pdde_sum(g, y1, 0, 0), pdde_mean(g, y2, 0, 0)), -1, 0);
    case 3: return pdde_mean(g, pdde_mul(g, y1, pdde_mean(g, y2, 0, 1)), -1, 0);
    default: return pdde_mul(g, pdde_sum(g, y1, -1, 0), pdde_mean(g, y2, -1, 0));
    }
}

#define FAIL_WITH(...) do { snprintf(out->error, sizeof out->error, __VA_ARGS__); goto done; } while (0)

static void run(pdde_context *ctx, pdde_comm *comm, result *out) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_session *s = NULL;
    pdde_tensor *x, *w1, *w2, *loss = build(g, which, &x, &w1, &w2);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1.0f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    if (pdde_backward(g, loss) || pdde_optimizer_sgd(g, &op)) FAIL_WITH("graph: %s", pdde_last_error(ctx));
    if (comm) {
        const pdde_mesh *mesh = pdde_mesh_create(g, 1, (int[]){pdde_comm_size(comm)}, (const char *[]){"dp"}, NULL);
        if (!mesh || pdde_strategy_data_parallel(g, mesh, "dp") || pdde_complete_dist_attrs(g)) FAIL_WITH("annotate: %s", pdde_last_error(ctx));
    }
    if (pdde_session_init(g, &sp, &s)) FAIL_WITH("session: %s", pdde_last_error(ctx));
    float xs[N * K], before[2][K * M];
    for (int i = 0; i < N * K; i++) xs[i] = (float)((i * 7 + i / 3) % 11) / 11.0f - 0.4f;
    if (pdde_session_write_global(s, x, xs, sizeof xs) || pdde_session_read(s, w1, before[0], sizeof before[0]) ||
        pdde_session_read(s, w2, before[1], sizeof before[1]) || pdde_session_run(s, PDDE_RUN_STEP) ||
        pdde_session_read(s, w1, out->dw1, sizeof out->dw1) || pdde_session_read(s, w2, out->dw2, sizeof out->dw2))
        FAIL_WITH("run: %s", pdde_last_error(ctx));
    for (int i = 0; i < K * M; i++) out->dw1[i] = before[0][i] - out->dw1[i], out->dw2[i] = before[1][i] - out->dw2[i];
    out->loss = pdde_session_loss(s);
    out->ok = 1;
done:
    pdde_session_free(s);
    pdde_graph_free(g);
}

static void run_rank(pdde_context *ctx, pdde_comm *comm, void *arg) { (void)arg; run(ctx, comm, test_rank_result); }

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1, cp.backends = "cpu";
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    CHECK(srv != NULL, "store server: %s", pdde_last_error(ctx));
    if (test_failed) return test_finish();
    for (which = 0; which < (int)(sizeof names / sizeof *names); which++) {
        result ref = {0}, res[2];
        memset(res, 0, sizeof res);
        test_ranks_params tp = {.addr = addr, .prefix = names[which], .timeout_s = 30, .n_threads = 1, .server = srv, .results = res,
                                .result_size = sizeof *res};
        test_run_ranks(2, &tp, run_rank, NULL, 60);
        run(ctx, NULL, &ref);
        CHECK(ref.ok, "%s one process: %s", names[which], ref.error);
        double worst = 0;
        for (int r = 0; r < 2; r++) {
            CHECK(res[r].ok, "%s rank %d: %s", names[which], r, res[r].error);
            if (!res[r].ok || !ref.ok) continue;
            char what[64];
            snprintf(what, sizeof what, "%s rank %d: the loss", names[which], r);
            test_close_all(what, &res[r].loss, &ref.loss, 1, 1e-6, TOL);
            snprintf(what, sizeof what, "%s rank %d: w1's gradient", names[which], r);
            double w = test_close_all(what, res[r].dw1, ref.dw1, K * M, 1e-6, TOL);
            worst = w > worst ? w : worst;
            snprintf(what, sizeof what, "%s rank %d: w2's gradient", names[which], r);
            w = test_close_all(what, res[r].dw2, ref.dw2, K * M, 1e-6, TOL);
            worst = w > worst ? w : worst;
        }
        printf("%-9s loss %.6f (one process %.6f, rank 0 %.6f), gradients' worst relative difference %.2g (tolerance %.2g)\n", names[which], ref.loss,
               ref.loss, res[0].loss, worst, TOL);
    }
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
