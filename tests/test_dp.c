/* test_dp — data parallelism and ZeRO-1 against one process. The same GPT trains 20 steps on the same
 * global batches: in one process, then on 2 ranks (each takes half of every batch) with gradients
 * averaged by allreduce, then on 2 ranks with ZeRO-1 (reduce-scatter, sharded AdamW, all-gather).
 * The losses must agree within 1e-5 relative, and ZeRO-1 must halve the optimizer state per rank.
 * Ranks are real processes meeting through a TCP store on 127.0.0.1 that this test hosts. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEPS 20
#define RANKS 2

static const gpt_config global_cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 8};

typedef struct { float losses[STEPS]; double optimizer_bytes; int n_nodes, ok; char error[256]; } run_result;

typedef struct {
    const char *name;
    int zero;              /* ZeRO stage */
    size_t bucket_bytes;   /* 0 = the default (one bucket for this model) */
    int micro_batches;     /* gradient accumulation steps per optimizer step */
    int on_device;         /* 1: the whole model on the first non-CPU device (collectives staged via host) */
} dp_config;

static void global_batch(int step, int32_t *x, int32_t *y) {
    int n = global_cfg.batch * global_cfg.ctx;
    for (int i = 0; i < n; i++) x[i] = (i * 7 + step * 13 + i / 5) % global_cfg.vocab, y[i] = (i * 3 + step * 5 + 1) % global_cfg.vocab;
}

/* Trains on rows [rank * B / ranks, ...) of each global batch; the loss reported is the global mean. */
static void train(pdde_context *ctx, pdde_comm *comm, int rank, int ranks, const dp_config *dc, run_result *out) {
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    gpt_config cfg = global_cfg;
    int micro = dc->micro_batches;
    cfg.batch = global_cfg.batch / ranks / micro;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f, op.clip_norm = 0.5f, op.grad_accum_steps = micro;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.dp_comm = comm, sp.zero_stage = dc->zero, sp.dp_bucket_bytes = dc->bucket_bytes;
    if (dc->on_device) sp.device = pdde_device_count(ctx) - 1; /* the last device: not the CPU when there is another */
    if (gpt_build(g, &cfg, &m) || pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s)) {
        snprintf(out->error, sizeof out->error, "setup: %s", pdde_last_error(ctx));
        return;
    }
    pdde_memory_stats ms;
    pdde_session_memory(s, &ms);
    out->optimizer_bytes = (double)ms.optimizer_bytes;
    out->n_nodes = ms.n_nodes;
    int32_t x[16 * 64], y[16 * 64];
    int rows = cfg.batch * cfg.ctx;
    for (int step = 0; step < STEPS; step++) {
        global_batch(step, x, y);
        float loss = 0;
        for (int mb = 0; mb < micro; mb++) { /* this rank's rows, a micro-batch at a time */
            int at = (rank * micro + mb) * rows;
            pdde_session_write(s, m.ids, x + at, (size_t)rows * 4);
            pdde_session_write(s, m.targets, y + at, (size_t)rows * 4);
            if (pdde_session_run(s, micro == 1 ? PDDE_RUN_STEP : PDDE_RUN_FORWARD_BACKWARD)) {
                snprintf(out->error, sizeof out->error, "step %d: %s", step, pdde_last_error(ctx));
                return;
            }
            loss += pdde_session_loss(s) / (float)micro;
        }
        if (micro > 1 && pdde_session_run(s, PDDE_RUN_OPTIMIZER)) {
            snprintf(out->error, sizeof out->error, "step %d update: %s", step, pdde_last_error(ctx));
            return;
        }
        if (comm && pdde_comm_allreduce(comm, &loss, &loss, 1, PDDE_F32, PDDE_REDUCE_AVG)) {
            snprintf(out->error, sizeof out->error, "loss allreduce: %s", pdde_last_error(ctx));
            return;
        }
        out->losses[step] = loss;
    }
    out->ok = 1;
    pdde_session_free(s);
    pdde_graph_free(g);
}

static void train_rank(pdde_context *ctx, pdde_comm *comm, void *arg) {
    train(ctx, comm, pdde_comm_rank(comm), RANKS, arg, test_rank_result);
}

/* RANKS processes that meet through the store; rank 0's result comes back. */
static void run_ranks(const char *store_addr, const dp_config *dc, run_result *out) {
    run_result res[RANKS];
    memset(res, 0, sizeof res);
    test_ranks_params tp = {.addr = store_addr, .prefix = dc->name, .timeout_s = 60, .n_threads = 1,
                            .device_runtimes = dc->on_device, .results = res, .result_size = sizeof *res};
    test_run_ranks(RANKS, &tp, train_rank, (void *)dc, 240);
    for (int r = 0; r < RANKS; r++) CHECK(res[r].ok, "%s rank %d failed: %s", dc->name, r, res[r].error);
    *out = res[0];
}

static void compare(const char *name, const run_result *ref, const run_result *got) {
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        double rel = fabs(got->losses[i] - ref->losses[i]) / fabs(ref->losses[i]);
        worst = rel > worst ? rel : worst;
    }
    CHECK(got->ok && worst <= 1e-5, "%s: losses differ from one process by %.3g relative", name, worst);
    printf("%-12s losses %.5f -> %.5f, worst relative difference %.2g, optimizer state %.0f bytes per rank\n", name,
           got->losses[0], got->losses[STEPS - 1], worst, got->optimizer_bytes);
}

/* Asked in a child process, so this one never starts a device runtime before forking ranks. */
static int other_device_exists(void) {
    pid_t pid = fork();
    if (pid == 0) {
        pdde_context *c;
        pdde_context_init(NULL, &c);
        _exit(pdde_device_count(c) > 1 ? 0 : 1);
    }
    int status = 1;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;     /* the same thread count as the ranks: identical arithmetic */
    cp.backends = "cpu";  /* device runtimes do not survive fork(): only the children start them */
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    int has_device = other_device_exists();
    pdde_store_server *srv;
    CHECK(pdde_store_server_init(ctx, "127.0.0.1:0", &srv) == PDDE_OK, "store server: %s", pdde_last_error(ctx));
    if (test_failed) return test_finish();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pdde_store_server_port(srv));

    static const dp_config configs[] = {
        {"dp2", 0, 0, 1, 0},
        {"dp2_buckets", 0, 8192, 1, 0},  /* several buckets, reduced while backward goes on */
        {"dp2_accum", 0, 8192, 2, 0},    /* two micro-batches per step: buckets reduced once, before the update */
        {"zero1", 1, 0, 1, 0},
        {"zero1_accum", 1, 0, 2, 0},
        {"dp2_device", 0, 8192, 1, 1},   /* gradients in device memory, staged through the host */
        {"zero1_device", 1, 0, 1, 1},
    };
    const dp_config single = {"1 rank", 0, 0, 1, 0};
    int n_configs = has_device ? 7 : 5;
    run_result ref = {0}, res[7];
    memset(res, 0, sizeof res);
    for (int i = 0; i < n_configs; i++) run_ranks(addr, &configs[i], &res[i]);
    train(ctx, NULL, 0, 1, &single, &ref);
    CHECK(ref.ok, "reference: %s", ref.error);
    printf("%-12s losses %.5f -> %.5f, optimizer state %.0f bytes\n", "1 rank", ref.losses[0], ref.losses[STEPS - 1], ref.optimizer_bytes);
    CHECK(ref.losses[STEPS - 1] < ref.losses[0] - 0.1, "the model learns (%.4f -> %.4f)", ref.losses[0], ref.losses[STEPS - 1]);
    for (int i = 0; i < n_configs; i++) compare(configs[i].name, &ref, &res[i]);
    run_result dp = res[0], zero = res[3];
    /* 8 KiB buckets over ~110 KB of gradients: more collective nodes (and their waits) than one bucket */
    CHECK(res[1].n_nodes >= dp.n_nodes + 2 * 4, "small buckets: %d nodes vs %d with one bucket", res[1].n_nodes, dp.n_nodes);
    CHECK(dp.optimizer_bytes == ref.optimizer_bytes, "plain data parallelism keeps the whole optimizer state");
    CHECK(zero.optimizer_bytes <= 0.5 * ref.optimizer_bytes + 64, "ZeRO-1 state %.0f bytes vs %.0f: must be halved", zero.optimizer_bytes, ref.optimizer_bytes);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
