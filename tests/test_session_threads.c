/* test_session_threads — two sessions of one context, trained on two host threads at once (as a pipeline stage's
 * workers each drive a session, or a recommender's pipeline its sparse stage on the CPU and its dense one on an
 * accelerator): each thread's losses equal, bit for bit, those of its session trained alone. Both on the CPU, both
 * on each other device (PoCL's OpenCL device in CI; CUDA where there is one, whose cuBLAS handle and cublasLt plans
 * the sessions' streams share), and one on the CPU with one on each other device. A thread's batches differ from
 * the other's, so a GEMM run on the other session's stream or with its operands shows in the losses. */
#define _GNU_SOURCE /* pthread_timedjoin_np */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/gpt_test_steps.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEPS 6
#define ROUNDS 3       /* runs of the two threads at once */
#define DEADLINE_S 120 /* for a round: past it the threads are taken as hung (a deadlock), and the test ends */

typedef struct {
    pdde_context *ctx;
    int device, which; /* the device; which of the two sessions (its batches: steps which * STEPS + k) */
    pdde_dtype dt;
    float loss[STEPS];
    int rc;
    char error[200];
} job;

static void *train(void *arg) {
    job *j = arg;
    gpt_config cfg = {.vocab = 96, .ctx = 32, .layers = 2, .heads = 2, .width = 64, .batch = 4};
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_graph_init(j->ctx, &g);
    pdde_graph_set_compute_dtype(g, j->dt);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = j->device;
    j->rc = gpt_build(g, &cfg, &m) || pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s);
    for (int step = 0; step < STEPS && !j->rc; step++) {
        j->rc = gpt_test_write_batch(s, &m, j->which * STEPS + step) || pdde_session_run(s, PDDE_RUN_STEP);
        j->loss[step] = pdde_session_loss(s);
    }
    if (j->rc) snprintf(j->error, sizeof j->error, "%s", pdde_last_error(j->ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
    return NULL;
}

/* Whether thread th ended by the round's deadline (joined then) */
static int joined_by(pthread_t th, const struct timespec *deadline) { return pthread_timedjoin_np(th, NULL, deadline) == 0; }

/* Session w (0, 1) on device dev[w]: 0, or -1: a round's threads hung (the test cannot go on) */
static int test_pair(pdde_context *ctx, const int dev[2], const char *where) {
    for (int k = 0; k < 2; k++) {
        pdde_dtype dt = k ? PDDE_BF16 : PDDE_F32;
        job alone[2], both[2];
        for (int w = 0; w < 2; w++) {
            alone[w] = (job){.ctx = ctx, .device = dev[w], .which = w, .dt = dt};
            train(&alone[w]);
            CHECK(!alone[w].rc, "%s, %s: session %d alone: %s", where, pdde_dtype_name(dt), w, alone[w].error);
        }
        if (alone[0].rc || alone[1].rc) continue;
        CHECK(memcmp(alone[0].loss, alone[1].loss, sizeof alone[0].loss) != 0, "%s, %s: the two sessions' batches give other losses", where,
              pdde_dtype_name(dt));
        int same = 1, failed = 0;
        for (int round = 0; round < ROUNDS; round++) {
            pthread_t th[2];
            int started[2];
            struct timespec deadline;
            clock_gettime(CLOCK_REALTIME, &deadline);
            deadline.tv_sec += DEADLINE_S;
            for (int w = 0; w < 2; w++) {
                both[w] = (job){.ctx = ctx, .device = dev[w], .which = w, .dt = dt};
                started[w] = pthread_create(&th[w], NULL, train, &both[w]) == 0;
            }
            for (int w = 0; w < 2; w++) {
                if (started[w] && !joined_by(th[w], &deadline)) {
                    CHECK(0, "%s, %s, round %d: thread %d still runs after %d s (a deadlock)", where, pdde_dtype_name(dt), round, w, DEADLINE_S);
                    return -1;
                }
                if (!started[w] || both[w].rc) {
                    failed = 1;
                    fprintf(stderr, "%s, round %d, thread %d: %s\n", where, round, w, started[w] ? both[w].error : "pthread_create failed");
                } else if (memcmp(both[w].loss, alone[w].loss, sizeof both[w].loss)) {
                    same = 0;
                    fprintf(stderr, "%s, round %d, thread %d: loss %.9g against %.9g alone\n", where, round, w, both[w].loss[STEPS - 1],
                            alone[w].loss[STEPS - 1]);
                }
            }
        }
        printf("%s, %s: losses %.6f .. %.6f and %.6f .. %.6f, alone and on two threads at once (%d rounds)\n", where, pdde_dtype_name(dt),
               alone[0].loss[0], alone[0].loss[STEPS - 1], alone[1].loss[0], alone[1].loss[STEPS - 1], ROUNDS);
        CHECK(!failed && same, "%s, %s: two sessions on two threads at once train as each alone, bit for bit", where, pdde_dtype_name(dt));
    }
    return 0;
}

int main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    if (test_pair(ctx, (int[2]){0, 0}, "cpu")) return test_finish(); /* (hung threads: leave them to the process' end) */
    if (pdde_device_count(ctx) < 2) test_skip("opencl", "no device besides the CPU (PoCL in CI): two sessions at once on a GPU backend");
    for (int d = 1; d < pdde_device_count(ctx); d++) {
        pdde_device_props props;
        pdde_device_get_props(ctx, d, &props);
        char where[320];
        snprintf(where, sizeof where, "%s (%s)", props.name, props.backend);
        if (test_pair(ctx, (int[2]){d, d}, where)) return test_finish();
        snprintf(where, sizeof where, "cpu and %s (%s)", props.name, props.backend); /* (a recommender's pipeline: sparse and dense) */
        if (test_pair(ctx, (int[2]){0, d}, where)) return test_finish();
    }
    pdde_context_free(ctx);
    return test_finish();
}
