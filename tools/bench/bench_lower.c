/* bench_lower — lowering every rank of a big plan in one process, with no communicator and no tensor
 * memory: a GPT of 96 layers of width 12288 (GPT-3 175B's shape) under dp=8 x tp=8 x pp=16, 1024
 * ranks, the planner's inner loop (it lowers thousands of candidate plans). Prints the graph's size,
 * the median time per rank (this thread's CPU time: the machine's cores may be busy with other work;
 * the wall time too), rank 0's program size and the process' peak memory; last line `RESULT lowering ranks=1024 ms_per_rank=<median> peak_mb=<peak RSS>`.
 * BENCH_LOWER_LAYERS / BENCH_LOWER_RANKS (a prefix of the ranks) shrink it for a quick look. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "bench_common.h"
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* CPU time of this thread: what lowering costs, whatever else the machine's cores are doing */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
    const char *env_layers = getenv("BENCH_LOWER_LAYERS"), *env_ranks = getenv("BENCH_LOWER_RANKS");
    const int dp = 8, tp = 8, pp = 16, world = dp * tp * pp;
    gpt_config cfg = {.vocab = 51200, .ctx = 2048, .layers = env_layers ? atoi(env_layers) : 96, .heads = 96, .width = 12288, .batch = 8 * 16};
    int ranks = env_ranks ? atoi(env_ranks) : world;
    if (ranks < 1 || ranks > world) ranks = world;
    /* a planner lowering plan after plan keeps its heap: freed memory is not handed back to the
     * kernel between ranks (each rank's program would fault its pages in again) */
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1, cp.backends = "cpu";
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 1;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    gpt_plan plan = {.dp = dp, .tp = tp, .pp = pp, .micro = 16, .zero = 1};
    double t0 = bench_now();
    if (gpt_build_plan(g, &cfg, &plan, &op, &m)) {
        fprintf(stderr, "build: %s\n", pdde_last_error(ctx));
        return 1;
    }
    double t_build = bench_now() - t0, params = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++)
        if (pdde_graph_tensor(g, i)->flags & PDDE_TENSOR_PARAM) params += (double)pdde_tensor_numel(pdde_graph_tensor(g, i));
    printf("GPT %d layers, width %d, %.1fB parameters: %d graph nodes, built and completed in %.2f s\n", cfg.layers, cfg.width, params / 1e9,
           pdde_graph_tensor_count(g), t_build);
    /* each rank lowered (and its program freed), timed per rank; nothing printed */
    double *ms = malloc((size_t)ranks * sizeof *ms), *wall = malloc((size_t)ranks * sizeof *wall);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.overlap_gradients = 1;
    pdde_status st = PDDE_OK;
    for (int r = 0; r < ranks && !st; r++) {
        double t = bench_now(), c = cpu_s();
        st = pdde_lower_dump(g, &sp, world, r, NULL);
        ms[r] = 1e3 * (cpu_s() - c), wall[r] = 1e3 * (bench_now() - t);
    }
    if (st) {
        fprintf(stderr, "lower: %s\n", pdde_last_error(ctx));
        return 1;
    }
    /* one program printed for a look at its size */
    char *dump = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&dump, &len);
    pdde_lower_dump(g, &sp, world, 0, f);
    fclose(f);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += dump[i] == '\n';
    free(dump);
    qsort(ms, (size_t)ranks, sizeof *ms, bench_cmp);
    qsort(wall, (size_t)ranks, sizeof *wall, bench_cmp);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("lowered %d of %d ranks: median %.3f ms CPU time (min %.3f, max %.3f), median %.3f ms wall per rank; rank 0's program %d lines\n",
           ranks, world, ms[ranks / 2], ms[0], ms[ranks - 1], wall[ranks / 2], lines);
    printf("RESULT lowering ranks=%d ms_per_rank=%.3f peak_mb=%.1f\n", ranks, ms[ranks / 2], (double)ru.ru_maxrss / 1024.0);
    free(ms), free(wall);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return 0;
}
