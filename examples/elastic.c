/* elastic — Demonstrates how to keep training when ranks die or join: the elastic API on a small MLP
 * (data parallel over whatever ranks there are): kill a rank and the others go on, in the same
 * processes, from the last step boundary.
 *
 *   ./build/pdde-run -n 4 --elastic --min 2 ./build/elastic [STEPS]     (then: kill -9 <a rank's pid>)
 *
 * A SIGTERM to a rank (a scheduler preempting its node) makes it leave at the next step boundary, the
 * others going on without losing a step; to every rank, the job stops there. It exits 128 + the signal.
 *
 * The pattern: build the graph and session for the current world; at each step boundary
 * pdde_elastic_step_begin (snapshot), after each step pdde_elastic_step_end; when it says the world
 * changed, free the session and graph, pdde_elastic_recover, build again, pdde_elastic_restore. */
#define _GNU_SOURCE /* (sigaction) */
#include "pdde.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static pdde_elastic *el;
static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) { stop_signal = sig, pdde_elastic_request_leave(el, sig); } /* (a flag: safe here) */

#define BATCH 12 /* the global batch: 4, 3, 2 and 1 ranks divide it */
int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 300;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    if (pdde_elastic_init(ctx, NULL, &el)) { fprintf(stderr, "elastic: %s\n", pdde_last_error(ctx)); return 1; }
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESETHAND}; /* (a second signal ends it at once) */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    float xs[BATCH * 10];
    int32_t ts[BATCH];
    for (;;) { /* one pass per generation of the world */
        pdde_comm *world = pdde_elastic_world(el);
        int n = pdde_comm_size(world);
        pdde_graph *g;
        pdde_session *s;
        pdde_graph_init(ctx, &g);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){BATCH, 10});
        pdde_tensor *t = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){BATCH});
        pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){10, 32}, 0.3f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){32, 3}, 0.3f);
        pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, pdde_relu(g, pdde_matmul(g, x, w1, 0, 0)), w2, 0, 0), t);
        pdde_backward(g, loss);
        pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
        opt.lr = 1e-2f;
        pdde_optimizer_adamw(g, &opt);
        pdde_strategy_data_parallel(g, pdde_mesh_create(g, 1, (int[]){n}, (const char *[]){"dp"}, NULL), "dp");
        pdde_complete_dist_attrs(g);
        pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
        sp.world = world;
        if (pdde_graph_status(g) || pdde_session_init(g, &sp, &s)) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
        uint64_t sample = 0; /* the data position: the next sample */
        char plan[32];
        snprintf(plan, sizeof plan, "dp=%d", n);
        if (pdde_elastic_generation(el) > 0 && pdde_elastic_restore(el, s, plan, &sample)) {
            fprintf(stderr, "%s\n", pdde_last_error(ctx));
            return 1;
        }
        pdde_status st = PDDE_OK;
        int change = 0;
        while (pdde_session_step(s) < steps) {
            if ((st = pdde_elastic_step_begin(el, s, sample, &change)) || change) break;
            for (int i = 0; i < BATCH; i++, sample++) /* the global batch: every rank writes it, keeps its rows */
                for (int k = 0; k < 10; k++) xs[i * 10 + k] = (float)(sample % 10 == (uint64_t)k), ts[i] = (int32_t)(sample % 10 % 3);
            pdde_session_write_global(s, x, xs, sizeof xs);
            pdde_session_write_global(s, t, ts, sizeof ts);
            if ((st = pdde_elastic_step_end(el, s, pdde_session_run(s, PDDE_RUN_STEP)))) break;
            if (pdde_comm_rank(world) == 0 && pdde_session_step(s) % 1000 == 0)
                printf("step %lld loss %.4f\n", (long long)pdde_session_step(s), pdde_session_loss(s));
        }
        if (!st && !change && pdde_comm_rank(world) == 0) printf("loss %.4f after %d steps on %d ranks\n", pdde_session_loss(s), steps, n);
        if (change == PDDE_ELASTIC_LEAVE || change == PDDE_ELASTIC_STOP)
            printf("rank %d leaves at step %lld\n", pdde_comm_rank(world), (long long)pdde_session_step(s));
        pdde_session_free(s);
        pdde_graph_free(g);
        if (change == PDDE_ELASTIC_LEAVE || change == PDDE_ELASTIC_STOP || (!st && !change)) break; /* done (or this rank leaves) */
        if ((st && st != PDDE_ERR_PEER_LOST) || pdde_elastic_recover(el, NULL)) {
            fprintf(stderr, "%s\n", pdde_last_error(ctx)); /* an error that would repeat, or fenced */
            return 1;
        }
    }
    pdde_elastic_free(el);
    pdde_context_free(ctx);
    return stop_signal ? 128 + stop_signal : 0;
}
