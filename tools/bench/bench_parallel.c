/* bench_parallel.c — GPT-small training steps under each parallel strategy on 2 and 4 ranks, against
 * the same model trained in one process (the peer) on the same global batches. Each run starts from
 * its own session's initial parameters, which are the one process's whatever the plan (pdde_param:
 * a rank's block of a split parameter is that block of the one-process tensor), so the first step's
 * loss already compares the starting points. Per strategy: median step time, tokens/s, per-rank state (parameters + gradients +
 * optimizer) and activation arena, peak RSS, each against one process, and the worst relative loss
 * difference over the steps. The last line:
 *   RESULT parallel strategies=<ran> equal_losses=<within 1e-4> zero3_mem_ratio=<ZeRO-3 DP2 state / one process>
 *          opencl_dp2_vs_cpu=<step time with every rank on its OpenCL device / the same plan on the CPU, run just before> ...
 *          opencl_dp2_copy_stream=<step time with the gradient buckets' copies on a second queue / on the device's
 *          queue (PDDE_COPY_STREAM=0), run just before> opencl_zero1_copy_stream=<the same for ZeRO-1>
 *          opencl_dp2_overlap=<step time with the gradient buckets (1 MiB: GPT-small's gradients fit one of
 *          25 MiB) started in backward as they fill (overlap_gradients 1) / all at the update (-1), every
 *          rank on the device>
 *          opencl_zero2_overlap=<the same for ZeRO-2 in 1 MiB buckets: each micro-batch's reduce-scatter
 *          bucket completed one bucket later, beside the backward / at once>
 *
 *   bench_parallel [STEPS]     (what `make bench-parallel` runs; STEPS timed steps, default 15, after 3 warm-up)
 *   BENCH_PARALLEL_DEVICE_ONLY=1 runs the device rows only (and the CPU plans they compare with);
 *   BENCH_PARALLEL_BACKEND=cuda puts them on that backend's device (default opencl; the keys say which).
 *
 * Ranks are forked processes around a store server in this one (as tests/test_spmd.c), one thread each. */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    fprintf(stderr, "this tool needs pdde built with comm (UCX)\n");
    return 1;
}
#else
#include "bench_common.h"
#include "examples/gpt.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WARMUP 3
#define MAX_STEPS 64
#define MAX_RANKS 4
#define LOSS_TOL 1e-4
/* examples/gpt.c's default model */
static const gpt_config cfg = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8};

/* micro: micro-batches per step (grad_accum_steps; the pipeline plans need them in flight), gpipe: that
 * schedule instead of 1F1B, zero: ZeRO stage over dp, recompute: every block recomputed in backward,
 * chunks: runs of layers per pipeline stage (interleaved stages) */
typedef struct { const char *name; int dp, tp, pp, micro, gpipe, zero, recompute, chunks, opencl; } plan;
/* opencl: every rank's step on its OpenCL device, or BENCH_PARALLEL_BACKEND's (pdde_device_select; ranks
 * share the host's device where it has fewer: PoCL's is this machine's CPU), under tp the vocab-parallel
 * embedding and head on the CPU */
static const char *device_backend(void) {
    const char *b = getenv("BENCH_PARALLEL_BACKEND");
    return b && *b ? b : "opencl";
}

/* what one rank sends back through its pipe (well under PIPE_BUF) */
typedef struct {
    float losses[MAX_STEPS];
    double step_s[MAX_STEPS];
    double state_bytes, arena_bytes, rss_bytes;
    int ok;
    char error[200];
} rank_result;

static int n_steps; /* warm-up + timed */

static int n_ranks(const plan *p) { return p->dp * p->tp * p->pp; }

/* the global batch of a step: pseudo-random bytes, the same for every plan */
static void batch(int step, int32_t *x, int32_t *y) {
    uint32_t r = 2654435761u * (uint32_t)(step + 1);
    for (int i = 0; i < cfg.batch * cfg.ctx; i++) {
        r = r * 1664525u + 1013904223u, x[i] = (int32_t)(r >> 24);
        r = r * 1664525u + 1013904223u, y[i] = (int32_t)(r >> 24);
    }
}

/* The graph of one micro-batch, annotated with the plan's strategies. */
static pdde_status build(pdde_graph *g, gpt_model *m, const plan *p) {
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f;
    gpt_plan gp = {.dp = p->dp, .tp = p->tp, .pp = p->pp, .micro = p->micro, .zero = p->zero, .recompute = p->recompute, .pp_chunks = p->chunks};
    return gpt_build_plan(g, &cfg, &gp, &op, m);
}

/* The largest relative difference of a run's losses from the reference's over the steps (a NaN, once
 * met, stays: fmax would drop it). */
static double worst_loss_difference(const rank_result *res, const rank_result *ref) {
    double worst = 0;
    for (int k = 0; k < n_steps; k++) {
        double d = fabs(res->losses[k] - ref->losses[k]) / fabs(ref->losses[k]);
        if (isnan(d) || d > worst) worst = d;
    }
    return worst;
}

/* Trains n_steps steps on this rank (world NULL: one process), timing each step from a barrier. */
static void train(pdde_context *ctx, pdde_comm *world, const plan *p, rank_result *out) {
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = world;
    if (p->gpipe) sp.pipeline_schedule = PDDE_PIPELINE_GPIPE;
    if (strstr(p->name, "_nobucket")) sp.gradient_bucket_bytes = -1; /* (one collective per gradient: what buckets save) */
    if (strstr(p->name, "_at_update")) sp.overlap_gradients = -1;    /* (the buckets at the update, none in backward) */
    if (strstr(p->name, "_overlap")) sp.overlap_gradients = 1;       /* (started in backward as they fill, whatever the cores) */
    if (strstr(p->name, "_1mb")) sp.gradient_bucket_bytes = 1 << 20;   /* (several buckets: backward left beside the first) */
    int layer_dev[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    /* (a rank is a process of its own) */
    if (strstr(p->name, "_one_queue") || strstr(p->name, "_two_queues")) setenv("PDDE_COPY_STREAM", strstr(p->name, "_two") ? "1" : "0", 1);
    if (p->opencl) {
        pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
        pdde_device_choice dc;
        ds.backend = device_backend(), ds.share = 1;
        if (pdde_device_select(ctx, &ds, &dc)) {
            snprintf(out->error, sizeof out->error, "device: %.180s", pdde_last_error(ctx));
            pdde_graph_free(g);
            return;
        }
        sp.device = dc.device;
        if (p->tp > 1) layer_dev[0] = layer_dev[cfg.layers + 1] = 0, sp.layer_devices = layer_dev, sp.n_layer_devices = cfg.layers + 2;
    }
    if (build(g, &m, p) || pdde_session_init(g, &sp, &s)) {
        snprintf(out->error, sizeof out->error, "setup: %.180s", pdde_last_error(ctx));
        pdde_graph_free(g);
        return;
    }
    pdde_memory_stats ms;
    pdde_session_memory(s, &ms);
    out->state_bytes = (double)(ms.param_bytes + ms.grad_bytes + ms.optimizer_bytes);
    out->arena_bytes = (double)ms.arena_bytes;
    static int32_t x[8 * 64], y[8 * 64];
    int rows = cfg.batch / p->micro * cfg.ctx; /* micro-batch i: the i-th rows of the global batch */
    for (int step = 0; step < n_steps; step++) {
        batch(step, x, y);
        for (int i = 0; i < p->micro; i++)
            if (pdde_session_write_micro(s, m.ids, i, x + i * rows, sizeof x / p->micro) ||
                pdde_session_write_micro(s, m.targets, i, y + i * rows, sizeof y / p->micro)) {
                snprintf(out->error, sizeof out->error, "step %d write: %.170s", step, pdde_last_error(ctx));
                goto done;
            }
        /* every rank starts the step together, so a rank's time is the step's, not its wait for others */
        if (world && pdde_comm_barrier(world)) {
            snprintf(out->error, sizeof out->error, "barrier: %.180s", pdde_last_error(ctx));
            goto done;
        }
        double t0 = bench_now();
        if (pdde_session_run(s, PDDE_RUN_STEP)) {
            snprintf(out->error, sizeof out->error, "step %d: %.180s", step, pdde_last_error(ctx));
            goto done;
        }
        out->step_s[step] = bench_now() - t0;
        out->losses[step] = pdde_session_loss(s); /* the step's global mean, on every rank */
    }
    out->ok = 1;
done:
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* One rank process: its comm, its training, its peak RSS; the result goes to the parent through fd. */
static void rank_main(const char *store_addr, const plan *p, int rank, int fd) {
    rank_result res;
    memset(&res, 0, sizeof res);
    char r[16], n[16];
    snprintf(r, sizeof r, "%d", rank), snprintf(n, sizeof n, "%d", n_ranks(p));
    setenv("PDDE_RANK", r, 1), setenv("PDDE_LOCAL_RANK", r, 1), setenv("PDDE_WORLD_SIZE", n, 1);
    setenv("PDDE_STORE_ADDR", store_addr, 1);
    if (p->opencl) unsetenv("PDDE_BACKENDS"); /* (this rank alone starts the device runtime) */
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;
    pdde_context *ctx;
    pdde_comm *world = NULL;
    pdde_context_init(&cp, &ctx);
    pdde_comm_params cm = PDDE_COMM_PARAMS_INIT;
    cm.prefix = p->name, cm.timeout_s = 120;
    if (n_ranks(p) > 1 && pdde_comm_init(ctx, &cm, &world))
        snprintf(res.error, sizeof res.error, "comm: %.180s", pdde_last_error(ctx));
    else train(ctx, world, p, &res);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res.rss_bytes = (double)ru.ru_maxrss * 1024; /* Linux: KiB */
    int ok = write(fd, &res, sizeof res) == (ssize_t)sizeof res && res.ok;
    pdde_comm_free(world);
    pdde_context_free(ctx);
    _exit(ok ? 0 : 1);
}

/* Runs plan p on its ranks; *out gets rank 0's result with the worst case over ranks: per step the
 * slowest rank's time and the loss furthest from ref (if given), the largest memory. 0 if all ran. */
static int run_plan(const char *store_addr, const plan *p, const rank_result *ref, rank_result *out) {
    int ranks = n_ranks(p), fds[MAX_RANKS][2], bad = 0;
    pid_t pids[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < ranks; r++) {
        if (pipe(fds[r])) return -1;
        if ((pids[r] = fork()) == 0) {
            close(fds[r][0]);
            rank_main(store_addr, p, r, fds[r][1]);
        }
        close(fds[r][1]);
    }
    for (int r = 0; r < ranks; r++) {
        rank_result res;
        memset(&res, 0, sizeof res);
        ssize_t got = read(fds[r][0], &res, sizeof res);
        close(fds[r][0]);
        waitpid(pids[r], NULL, 0);
        if (got != (ssize_t)sizeof res || !res.ok) {
            fprintf(stderr, "bench_parallel: %s rank %d: %s\n", p->name, r, got == (ssize_t)sizeof res ? res.error : "died");
            bad = 1;
            continue;
        }
        if (r == 0) *out = res;
        for (int k = 0; k < n_steps; k++) {
            out->step_s[k] = fmax(out->step_s[k], res.step_s[k]);
            double d = ref ? fabs(res.losses[k] - ref->losses[k]) : 0;
            if (ref && (isnan(d) || d > fabs(out->losses[k] - ref->losses[k]))) out->losses[k] = res.losses[k]; /* a NaN sticks */
        }
        out->state_bytes = fmax(out->state_bytes, res.state_bytes);
        out->arena_bytes = fmax(out->arena_bytes, res.arena_bytes);
        out->rss_bytes = fmax(out->rss_bytes, res.rss_bytes);
    }
    return bad;
}

/* this process's resident memory now (a forked rank's peak RSS starts from it) */
static double rss_now_bytes(void) {
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%*d %ld", &pages) != 1) pages = 0;
    if (f) fclose(f);
    return (double)pages * (double)sysconf(_SC_PAGESIZE);
}

int main(int argc, char **argv) {
    n_steps = WARMUP + (argc > 1 ? atoi(argv[1]) : 15);
    if (n_steps <= WARMUP || n_steps > MAX_STEPS) {
        fprintf(stderr, "usage: bench_parallel [STEPS]   (1 to %d timed steps)\n", MAX_STEPS - WARMUP);
        return 2;
    }
    setenv("PDDE_BACKENDS", "cpu", 0); /* ranks are forked: device runtimes do not survive fork */
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;
    pdde_context *ctx;
    pdde_store_server *srv;
    pdde_context_init(&cp, &ctx);
    if (pdde_store_server_init(ctx, "127.0.0.1:0", &srv)) {
        fprintf(stderr, "bench_parallel: store: %s\n", pdde_last_error(ctx));
        return 1;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pdde_store_server_port(srv));

    static const plan one = {"1_process", 1, 1, 1, 1, 0, 0, 0, 0, 0};
    static const plan plans[] = {
        /* name            dp tp pp micro gpipe zero recompute chunks opencl */
        {"dp2",            2, 1, 1, 1, 0, 0, 0, 0, 0},
        {"dp2_nobucket",   2, 1, 1, 1, 0, 0, 0, 0, 0},
        {"tp2",            1, 2, 1, 1, 0, 0, 0, 0, 0},
        {"pp2_1f1b",       1, 1, 2, 4, 0, 0, 0, 0, 0},
        {"pp2_gpipe",      1, 1, 2, 4, 1, 0, 0, 0, 0},
        {"pp2_interleaved", 1, 1, 2, 4, 0, 0, 0, 2, 0},
        {"zero1_dp2",      2, 1, 1, 1, 0, 1, 0, 0, 0},
        {"zero1_nobucket", 2, 1, 1, 1, 0, 1, 0, 0, 0},
        {"zero2_dp2",      2, 1, 1, 1, 0, 2, 0, 0, 0},
        {"zero3_dp2",      2, 1, 1, 1, 0, 3, 0, 0, 0},
        {"dp4",            4, 1, 1, 1, 0, 0, 0, 0, 0},
        {"dp2xtp2",        2, 2, 1, 1, 0, 0, 0, 0, 0},
        {"dp2xpp2",        2, 1, 2, 4, 0, 0, 0, 0, 0},
        {"tp2xpp2",        1, 2, 2, 4, 0, 0, 0, 0, 0},
        {"dp2xtp2_recomp", 2, 2, 1, 1, 0, 0, 1, 0, 0},
    };
    int n_plans = (int)(sizeof plans / sizeof plans[0]);
    int tokens = cfg.batch * cfg.ctx, timed = n_steps - WARMUP;
    printf("GPT-small (layers %d, heads %d, width %d, ctx %d, vocab %d, global batch %d): %d steps after %d warm-up,\n"
           "1 thread per rank, %ld cores; ratios against one process; memory: the largest rank's (RSS includes the\n"
           "%.1f MB a rank inherits at fork)\n",
           cfg.layers, cfg.heads, cfg.width, cfg.ctx, cfg.vocab, cfg.batch, timed, WARMUP, sysconf(_SC_NPROCESSORS_ONLN), rss_now_bytes() / 1e6);
    printf("%-15s %5s %9s %8s %6s %8s %6s %8s %6s %7s %9s %s\n", "strategy", "ranks", "step ms", "tok/s", "ratio",
           "state MB", "ratio", "arena MB", "ratio", "RSS MB", "loss diff", "");

    rank_result ref;
    memset(&ref, 0, sizeof ref);
    if (run_plan(addr, &one, NULL, &ref)) return 1;
    double ref_ms = 1e3 * bench_median(ref.step_s + WARMUP, timed);
    printf("%-15s %5d %9.1f %8.0f %6.2f %8.2f %6.2f %8.2f %6.2f %7.1f %9s\n", one.name, 1, ref_ms, tokens / ref_ms * 1e3, 1.0,
           ref.state_bytes / 1e6, 1.0, ref.arena_bytes / 1e6, 1.0, ref.rss_bytes / 1e6, "-");
    fflush(stdout);

    int ran = 0, equal = 0;
    double zero3_ratio = 0;
    const char *device_only = getenv("BENCH_PARALLEL_DEVICE_ONLY");
    for (int i = 0; i < n_plans && !(device_only && *device_only && strcmp(device_only, "0")); i++) {
        const plan *p = &plans[i];
        rank_result res;
        memset(&res, 0, sizeof res);
        if (run_plan(addr, p, &ref, &res)) {
            printf("%-15s %5d  did not run (see above)\n", p->name, n_ranks(p));
            continue;
        }
        ran++;
        double worst = worst_loss_difference(&res, &ref);
        int match = worst <= LOSS_TOL;
        equal += match;
        double ms = 1e3 * bench_median(res.step_s + WARMUP, timed), mem = res.state_bytes / ref.state_bytes;
        if (p->zero == 3 && p->dp == 2 && n_ranks(p) == 2) zero3_ratio = mem;
        printf("%-15s %5d %9.1f %8.0f %6.2f %8.2f %6.2f %8.2f %6.2f %7.1f %9.2g %s\n", p->name, n_ranks(p), ms, tokens / ms * 1e3,
               ms / ref_ms, res.state_bytes / 1e6, mem, res.arena_bytes / 1e6, res.arena_bytes / ref.arena_bytes,
               res.rss_bytes / 1e6, worst, match ? "ok" : "DIFFERS");
        fflush(stdout);
    }
    /* every rank on its OpenCL device against the same plan on the CPU */
    static const plan on_device[] = {
        {"dp2_opencl",     2, 1, 1, 1, 0, 0, 0, 0, 1},
        {"tp2_opencl",     1, 2, 1, 1, 0, 0, 0, 0, 1},
        {"zero1_opencl",   2, 1, 1, 1, 0, 1, 0, 0, 1},
    };
    double device_ratio[3] = {NAN, NAN, NAN};
    for (int i = 0; i < 3; i++) {
        const plan *p = &on_device[i];
        rank_result res, cpu;
        memset(&res, 0, sizeof res), memset(&cpu, 0, sizeof cpu);
        const plan *same = NULL;
        for (int k = 0; k < n_plans; k++)
            if (plans[k].dp == p->dp && plans[k].tp == p->tp && plans[k].pp == p->pp && plans[k].zero == p->zero && !strstr(plans[k].name, "_nobucket")) {
                same = &plans[k];
                break;
            }
        if (!same || run_plan(addr, same, &ref, &cpu) || run_plan(addr, p, &ref, &res)) {
            printf("%-15s %5d  did not run (see above)\n", p->name, n_ranks(p));
            continue;
        }
        ran++;
        double worst = worst_loss_difference(&res, &ref);
        int match = worst <= LOSS_TOL;
        equal += match;
        double ms = 1e3 * bench_median(res.step_s + WARMUP, timed), cpu_ms = 1e3 * bench_median(cpu.step_s + WARMUP, timed);
        device_ratio[i] = ms / cpu_ms;
        printf("%-15s %5d %9.1f %8.0f %6.2f %8.2f %6.2f %8.2f %6.2f %7.1f %9.2g %s (%s on the CPU in this run: %.1f ms; %.2fx)\n", p->name,
               n_ranks(p), ms, tokens / ms * 1e3, ms / ref_ms, res.state_bytes / 1e6, res.state_bytes / ref.state_bytes, res.arena_bytes / 1e6,
               res.arena_bytes / ref.arena_bytes, res.rss_bytes / 1e6, worst, match ? "ok" : "DIFFERS", same->name, cpu_ms, ms / cpu_ms);
        fflush(stdout);
    }
    /* the gradient buckets' host copies on a second queue of the device (the default on OpenCL) against
     * the device's own queue: QUEUE_PAIRS pairs, each run one after the other (the order alternating),
     * the median of the pairs' ratios */
    /* ...and the same for buckets of 1 MiB started in backward as they fill (overlap_gradients 1) against
     * all at the update (-1), with every rank on the device */
    enum { QUEUE_PAIRS = 3, N_PAIRS = 4 };
    static const plan queues[N_PAIRS][2] = {{{"dp2_one_queue", 2, 1, 1, 1, 0, 0, 0, 0, 1}, {"dp2_two_queues", 2, 1, 1, 1, 0, 0, 0, 0, 1}},
                                            {{"zero1_one_queue", 2, 1, 1, 1, 0, 1, 0, 0, 1}, {"zero1_two_queues", 2, 1, 1, 1, 0, 1, 0, 0, 1}},
                                            {{"dp2_1mb_at_update", 2, 1, 1, 1, 0, 0, 0, 0, 1}, {"dp2_1mb_overlap", 2, 1, 1, 1, 0, 0, 0, 0, 1}},
                                            {{"zero2_1mb_at_update", 2, 1, 1, 1, 0, 2, 0, 0, 1}, {"zero2_1mb_overlap", 2, 1, 1, 1, 0, 2, 0, 0, 1}}};
    static const char *const what[N_PAIRS][2] = {{"the buckets' copies on a second queue", "on the device's queue"},
                                                 {"the buckets' copies on a second queue", "on the device's queue"},
                                                 {"the buckets started in backward", "all at the update"},
                                                 {"each reduce-scatter bucket beside the backward", "each waited for at once"}};
    double queue_ratio[N_PAIRS] = {NAN, NAN, NAN, NAN};
    for (int i = 0; i < N_PAIRS; i++) {
        double ratios[QUEUE_PAIRS], one_ms[QUEUE_PAIRS], two_ms[QUEUE_PAIRS], worst = 0;
        int pairs = 0;
        for (int r = 0; r < QUEUE_PAIRS; r++) {
            rank_result res[2]; /* [0]: the device's queue, [1]: a second queue */
            memset(res, 0, sizeof res);
            int first = r & 1;
            if (run_plan(addr, &queues[i][first], &ref, &res[first]) || run_plan(addr, &queues[i][!first], &ref, &res[!first])) break;
            for (int k = 0; k < n_steps; k++) /* (not the same bits: PoCL's embedding backward adds with atomics, in no fixed order) */
                for (int q = 0; q < 2; q++) {
                    double d = fabs(res[q].losses[k] - ref.losses[k]) / fabs(ref.losses[k]);
                    if (isnan(d) || d > worst) worst = d;
                }
            one_ms[pairs] = 1e3 * bench_median(res[0].step_s + WARMUP, timed), two_ms[pairs] = 1e3 * bench_median(res[1].step_s + WARMUP, timed);
            ratios[pairs] = two_ms[pairs] / one_ms[pairs];
            pairs++;
        }
        if (pairs < QUEUE_PAIRS) {
            printf("%-15s %5d  did not run (see above)\n", queues[i][1].name, n_ranks(&queues[i][1]));
            continue;
        }
        queue_ratio[i] = bench_median(ratios, pairs);
        printf("%-15s %5d %9.1f with %s, %.1f ms %s (medians of %d pairs): %.2fx; loss diff %.2g %s\n", queues[i][1].name,
               n_ranks(&queues[i][1]), bench_median(two_ms, pairs), what[i][0], bench_median(one_ms, pairs), what[i][1], pairs, queue_ratio[i], worst,
               worst <= LOSS_TOL ? "ok" : "DIFFERS");
        fflush(stdout);
    }
    const char *dev = device_backend();
    printf("RESULT parallel strategies=%d equal_losses=%d zero3_mem_ratio=%.3f %s_dp2_vs_cpu=%.2f %s_tp2_vs_cpu=%.2f %s_zero1_vs_cpu=%.2f "
           "%s_dp2_copy_stream=%.2f %s_zero1_copy_stream=%.2f %s_dp2_overlap=%.2f %s_zero2_overlap=%.2f\n", ran, equal, zero3_ratio, dev,
           device_ratio[0], dev, device_ratio[1], dev, device_ratio[2], dev, queue_ratio[0], dev, queue_ratio[1], dev, queue_ratio[2], dev,
           queue_ratio[3]);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return 0;
}
#endif
