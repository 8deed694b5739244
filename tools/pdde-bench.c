/* pdde-bench — calibrates the cost model on this machine and writes a cluster file.
 *
 *   pdde-bench [-o cluster.json] [--quick] [--no-comm] [--devices LIST] [--budget S] [--run-overhead]
 *              [--time-limit S]   (past S seconds no more points are measured; the file is written)
 *   pdde-bench --check FILE [--rewrite]     checks a cluster file (errors name the field), prints a
 *                                           summary and what the planner would refuse (exit 1: a device
 *                                           without figures, a link of bandwidth 0); --rewrite saves it
 *                                           back in canonical form
 *   --plugin LIST loads backend plugins (as PDDE_BACKEND_PLUGINS, which it replaces) to measure their devices.
 *
 * For every device (the CPU, and the OpenCL/CUDA/Level Zero devices the backends find) it runs pdde
 * graphs through that device's backend and measures: the GEMM throughput over sizes and shapes (a
 * table of (m, n, k) -> FLOP/s), and a time curve (seconds by bytes touched) for each op class:
 * elementwise (add), row ops (layernorm), attention (causal softmax of [B, H, T, T] scores),
 * embedding (lookup) and optimizer (AdamW update), then, forward + backward and less the same graph
 * without the op, on CPUs: loss (cross-entropy), gelu (bias + GELU), row_backward (layernorm),
 * fused_attention (its forward run alone) and fused_attention_backward; on CPUs also ps_pull and ps_push (a
 * parameter-server table's pull and push of a batch). The bytes of each point are what the cost model counts for the same node
 * (pdde_cost_program_from_graph), so a curve reads back what it measured.
 * On a device with memory of its own (a GPU), every run's time is less the session run's own cost (a
 * step pays it once, not per op; --run-overhead: on every accelerator), and the GEMM table goes on to
 * GPT-2's training shapes; an accelerator's bf16 fused attention gets curves of its own (the whole op).
 * --devices LIST measures only those families. Every run is the device's own (no CPU fallback): what a
 * device does not run is left out of its figures and said once. Host <-> device writes, each timed alone,
 * give the CPU-device link (unmeasured: an error naming the device, exit 1). Then it forks 2 ranks around a store on
 * 127.0.0.1 and measures allreduce (auto, ring, recursive), allgather, reduce-scatter and send/recv at
 * a small and a large size: latency and bandwidth of each (pdde_collective_calib) and of the
 * machine's shared-memory link. Before the devices, a GEMM, an elementwise and a row op run alone and
 * then once on every core at the same time: the CPU's slowdown per class when ranks share the machine
 * (its spec's "contention").
 *
 * This is how a new accelerator teaches the cost model: fill the backend vtable, pass
 * test_backend_ops, run pdde-bench, hand the cluster file to the planner. */
#define _GNU_SOURCE
#include "pdde.h"
#include "tools/bench/bench_common.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double budget_s = 0.12;  /* per measured point */
static struct run_together *together; /* measuring contention: every copy starts each run at once */
static double max_run_s = 0.25; /* a point whose one run would take longer is left out */
static int quick;
/* An accelerator's fixed cost of a session run (launching the step, the final synchronisation): a training
 * step pays it once, not per op, so it is taken off each measured run (measure_run_overhead) */
static double run_overhead, run_floor; /* (no run comes out below run_floor: half an op of the chain) */
static int force_overhead;
static double deadline = INFINITY; /* --time-limit: past it no more points are measured (the file is written) */ /* --run-overhead: also on a device on the host's cores (PoCL's: not by default) */

/* What the device being measured does not run: set by time_graph when a session refuses an op the
 * device lacks (strict sessions: no CPU fallback), listed by note_not_run, said once a device. */
static int not_run_by_device;
static char not_run[512];
/* The device being measured: its runs that failed (an error, not an op it does not run) and the first
 * one's message (said once; a device whose failures leave it without figures fails the calibration). */
static int device_failures;
static char device_first_error[512];

static void note_run_failure(pdde_context *ctx, int device) {
    if (!device_failures++) {
        snprintf(device_first_error, sizeof device_first_error, "%s", pdde_last_error(ctx));
        fprintf(stderr, "pdde-bench: device %d: run failed: %s (further failures of this device are counted, not printed)\n", device,
                device_first_error);
    }
}

static void note_not_run(const char *what) {
    size_t n = strlen(not_run);
    snprintf(not_run + n, sizeof not_run - n, "%s%s", n ? ", " : "", what);
}

/* Writes a buffer larger than the caches, so that the next run reads its inputs from memory as a
 * training step does (its activations were written long before): run again and again on the same
 * buffers, a memory-bound op ran from the cache up to 10x faster than in the step. */
static void evict_caches(void) {
    static unsigned char *junk;
    static int pass;
    enum { JUNK_BYTES = 64 << 20 };
    if (!junk && !(junk = malloc(JUNK_BYTES))) return;
    memset(junk, ++pass, JUNK_BYTES);
}

/* The forked copies of a contention measurement (in shared memory): a barrier before every run. */
struct run_together {
    atomic_int arrived;      /* arrivals at the barrier so far, all copies and runs */
    int copies;
    int runs;                /* each copy times this many runs a point */
};

/* Seconds: wall-clock time; measuring contention, this process's CPU time, which stalls on memory count
 * in but other programs' turns on the core do not (on a loaded machine they would pass for contention). */
static double run_clock(void) {
    struct timespec ts;
    if (!together || clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts)) return bench_now();
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits until every copy has arrived at this run (10 s at most: a copy that died); 0 when they have. */
static int together_wait(void) {
    int round = atomic_fetch_add(&together->arrived, 1) / together->copies + 1;
    for (double until = bench_now() + 10; atomic_load(&together->arrived) < round * together->copies;)
        if (bench_now() > until) return -1;
        else sched_yield();
    return 0;
}

/* Compiles g on device, fills its inputs and parameters, runs mode once to warm up (kernel builds),
 * then repeatedly until the budget is spent, each run after evict_caches: the median seconds of a
 * run, or with fastest the fastest run's, NaN on failure. A class measured as the difference of two
 * graphs takes their fastest runs: under load one preempted run moves the median of a few by more
 * than the difference itself (a fused attention point 35x its quiet value at load 9). Measuring
 * contention: together->runs runs, each started with the other copies (together_wait), in CPU
 * seconds (run_clock). */
static double time_graph(pdde_context *ctx, pdde_graph *g, int device, pdde_run_mode mode, int fastest) {
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    /* the device's own speed: an op it does not run is not timed on the CPU in its place */
    sp.no_cpu_fallback = 1;
    pdde_session *s = NULL;
    pdde_status st = pdde_graph_status(g);
    if (!st) st = pdde_session_init(g, &sp, &s);
    if (st == PDDE_ERR_UNSUPPORTED) {
        not_run_by_device = 1; /* (said once per class or dtype: note_not_run) */
        return NAN;
    }
    if (st) {
        note_run_failure(ctx, device);
        return NAN;
    }
    uint64_t seed = 88172645463325252ull;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op != PDDE_OP_NONE || !(t->flags & PDDE_TENSOR_INPUT)) continue;
        size_t n = (size_t)pdde_tensor_numel(t);
        void *h = malloc(pdde_tensor_nbytes(t));
        for (size_t j = 0; h && j < n; j++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            if (t->dtype == PDDE_I32) ((int32_t *)h)[j] = (int32_t)(seed % 8192); /* class_graph's table rows and classes */
            else if (t->dtype == PDDE_BF16) ((uint16_t *)h)[j] = (uint16_t)(0x3f00 | (seed >> 57)); /* [0.5, 1) */
            else if (t->dtype == PDDE_F16) ((uint16_t *)h)[j] = (uint16_t)(0x3800 | (seed >> 54));
            else ((float *)h)[j] = (float)((double)(seed >> 40) / 16777216.0 - 0.5);
        }
        if (h) pdde_session_write(s, t, h, pdde_tensor_nbytes(t));
        free(h);
    }
    double v[64];
    int n = 0;
    pdde_device_props props;
    /* (a device with memory of its own: the host's caches are not its) */
    int evict = pdde_device_get_props(ctx, device, &props) || props.kind == PDDE_DEVICE_CPU || props.on_host_cores;
    if (pdde_session_run(s, mode) == PDDE_OK) {
        for (double t_end = bench_now() + budget_s; n < 64 && (together ? n < together->runs : n < 3 || bench_now() < t_end);) {
            if (evict) evict_caches();
            if (together && together_wait()) break;
            double t0 = run_clock();
            if (pdde_session_run(s, mode) != PDDE_OK) break;
            v[n] = run_clock() - t0 - run_overhead;
            if (v[n] < run_floor) v[n] = run_floor;
            n++;
        }
    }
    if (n < 3) note_run_failure(ctx, device);
    pdde_session_free(s);
    double median = n >= 3 ? bench_median(v, n) : NAN; /* (sorts v) */
    /* (with the run's overhead taken off, the fastest run: what an op takes amid a step's others, the
     * device busy; a loaded host's preemptions only ever add) */
    return n >= 3 ? (fastest || run_overhead > 0 ? v[0] : median) : NAN;
}

/* run_overhead of an accelerator: runs of a chain of 1 and of 17 small adds; what the 16 more cost is
 * what ops cost one after another in a step, the rest of the single run is the run's own. */
static void measure_run_overhead(pdde_context *ctx, int device) {
    double t[2];
    run_overhead = run_floor = 0;
    for (int i = 0; i < 2; i++) {
        pdde_graph *g = NULL;
        pdde_graph_init(ctx, &g);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){1024}), *y = x;
        for (int j = 0; j < (i ? 17 : 1); j++) y = pdde_add(g, y, x);
        pdde_mark_output(y);
        t[i] = time_graph(ctx, g, device, PDDE_RUN_FORWARD, 1);
        pdde_graph_free(g);
    }
    double per_op = (t[1] - t[0]) / 16;
    if (t[0] - per_op > 0 && per_op > 0) run_overhead = t[0] - per_op, run_floor = per_op / 2;
    printf("  a session run: %.3g us of its own, %.3g us an op in a chain of small ones (taken off every run below)\n",
           run_overhead * 1e6, per_op * 1e6);
}

/* The bytes the cost model counts for the first node of class k in g. */
static double class_bytes(const pdde_graph *g, pdde_op_class k) {
    pdde_cost_program *p;
    double bytes = 0;
    if (pdde_cost_program_from_graph(g, 0, &p)) return 0;
    for (int i = 0; i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *op = pdde_cost_program_op(p, 0, i);
        if (op->op_class == k) { bytes = op->bytes; break; }
    }
    pdde_cost_program_free(p);
    return bytes;
}

static pdde_graph *new_graph(pdde_context *ctx) {
    pdde_graph *g = NULL;
    pdde_graph_init(ctx, &g);
    return g;
}

/* One GEMM [m, k] x [k, n] of dtype dt (bt > 1: bt batches of m / bt rows). */
static pdde_graph *gemm_graph(pdde_context *ctx, pdde_dtype dt, int64_t bt, int64_t m, int64_t n, int64_t k) {
    pdde_graph *g = new_graph(ctx);
    pdde_tensor *a = bt > 1 ? pdde_input(g, "a", dt, 3, (int64_t[]){bt, m / bt, k}) : pdde_input(g, "a", dt, 2, (int64_t[]){m, k});
    pdde_tensor *b = bt > 1 ? pdde_input(g, "b", dt, 3, (int64_t[]){bt, k, n}) : pdde_input(g, "b", dt, 2, (int64_t[]){k, n});
    pdde_mark_output(pdde_matmul(g, a, b, 0, 0));
    return g;
}

static void measure_gemm(pdde_context *ctx, int device, pdde_device_spec *sp, pdde_dtype dt) {
    /* squares for the size curve, then training shapes: tall activations times square and 4x weights */
    /* batch, m, n, k: batched ones are attention's q k^T and p v per head (the model folds batch into m) */
    static const int64_t shapes[][4] = {{1, 64, 64, 64}, {1, 128, 128, 128}, {1, 256, 256, 256}, {1, 512, 512, 512},
                                        {1, 1024, 1024, 1024}, {1, 2048, 2048, 2048}, {1, 512, 768, 768}, {1, 512, 3072, 768},
                                        {1, 512, 768, 3072}, {1, 2048, 768, 768}, {1, 64, 4096, 1024}, {1, 4096, 64, 1024},
                                        {1, 1024, 1024, 64}, {1, 16, 1024, 1024}, {1, 512, 384, 128}, {1, 512, 128, 512},
                                        {32, 64, 64, 32}, {32, 64, 32, 64}, {32, 128, 128, 64}, {32, 128, 64, 128},
                                        /* small models (width 128-256): their GEMMs are far from the squares */
                                        {1, 512, 128, 128}, {1, 512, 512, 128}, {1, 1024, 192, 192}, {1, 1024, 576, 192},
                                        {1, 1024, 192, 768}, {1, 1024, 768, 192}, {1, 128, 128, 512}, {1, 192, 768, 1024},
                                        {64, 64, 64, 48}, {64, 64, 48, 64}, {64, 48, 64, 64}, {32, 32, 64, 64},
                                        /* accelerators only (a CPU's rate has levelled off by 2048^3; an
                                         * accelerator's still rises): GPT-2's at 8192 tokens, the weight
                                         * gradients' k = 8192 and the 50304-word head's three */
                                        {1, 8192, 768, 768}, {1, 8192, 2304, 768}, {1, 8192, 3072, 768}, {1, 8192, 768, 3072},
                                        {1, 768, 768, 8192}, {1, 768, 2304, 8192}, {1, 768, 3072, 8192}, {1, 3072, 768, 8192},
                                        {1, 8192, 50304, 768}, {1, 8192, 768, 50304}, {1, 50304, 768, 8192}};
    int n = (int)(sizeof shapes / sizeof shapes[0]), n_all_devices = n - 11;
    /* bf16 and f16 (the mixed-precision GEMMs: half inputs, f32 out) at the squares and the training
     * shapes, every other one: the table's room is shared with f32's */
    int half = dt != PDDE_F32, tried[2] = {0, 0}, refused[2] = {0, 0}; /* [batched]: shapes timed, shapes the device does not run */
    for (int i = 0; i < n && sp->n_gemm < PDDE_CLUSTER_MAX_GEMM; i++) {
        int64_t bt = shapes[i][0], m = shapes[i][1] * bt, nn = shapes[i][2], k = shapes[i][3];
        if (i >= n_all_devices && (sp->kind == PDDE_DEVICE_CPU || sp->peak_flops < 1e12)) break; /* (a GPU's) */
        if (bench_now() > deadline) break;
        if (half && ((i % 2 && i < n_all_devices) || bt > 1 || sp->n_gemm + 2 > PDDE_CLUSTER_MAX_GEMM)) continue;
        if (quick && i < n_all_devices && m * nn * k > 2048 * 768 * 768) continue; /* the large squares: the rate has levelled off */
        if (tried[bt > 1] && refused[bt > 1] == tried[bt > 1]) continue; /* (a form the device does not run: said below) */
        double est = 2.0 * (double)m * (double)nn * (double)k / (sp->peak_flops > 0 ? sp->peak_flops : 1e12);
        if (est > max_run_s) { /* a slow device: the table's nearest shapes stand in for this one */
            printf("  gemm %-4s %5lld x %5lld x %5lld  skipped (about %.2g s a run)\n", pdde_dtype_name(dt), (long long)m, (long long)nn,
                   (long long)k, est);
            continue;
        }
        pdde_graph *g = gemm_graph(ctx, dt, bt, m, nn, k);
        not_run_by_device = 0;
        double t = time_graph(ctx, g, device, PDDE_RUN_FORWARD, 0);
        pdde_graph_free(g);
        tried[bt > 1]++, refused[bt > 1] += not_run_by_device;
        if (!(t > 0)) continue; /* (a dtype the device does not run: no point) */
        double flops = 2.0 * (double)m * (double)nn * (double)k / t;
        sp->gemm[sp->n_gemm++] = (pdde_gemm_point){dt, m, nn, k, flops};
        if (!half && flops > sp->peak_flops) sp->peak_flops = flops; /* (peak_flops is f32's) */
        printf("  gemm %-4s %5lld x %5lld x %5lld%s %8.2f GFLOP/s\n", pdde_dtype_name(dt), (long long)m, (long long)nn, (long long)k,
               bt > 1 ? " (batched)" : "           ", flops / 1e9);
    }
    char what[64];
    for (int b = 0; b < 2; b++)
        if (refused[b]) snprintf(what, sizeof what, "%s gemm%s", pdde_dtype_name(dt), b ? " batched" : ""), note_not_run(what);
}

/* The loss of a class graph measured forward + backward: a cross-entropy over the first 8192 values
 * of y (y holds a multiple of 8192), whose backward gives y a gradient of its full size. */
static void bench_row_loss(pdde_graph *g, pdde_tensor *y) {
    int64_t n = pdde_tensor_numel(y);
    pdde_tensor *flat = pdde_reshape(g, y, 2, (int64_t[]){n / 8192, 8192});
    pdde_tensor *ids = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){1});
    pdde_backward(g, pdde_cross_entropy(g, pdde_slice(g, flat, 0, 0, 1), ids));
}

/* The row length the row_backward point of s elements is measured at (class_graph). */
static int64_t row_backward_length(int64_t s) { return s < (1 << 18) ? 128 : 1024; }

/* One graph per size for op class k; size s is the number of f32 elements of the main tensor. For the
 * classes measured forward + backward, bare leaves their op out (the loss takes its input). */
static pdde_graph *class_graph(pdde_context *ctx, pdde_op_class k, int64_t s, int bare) {
    pdde_graph *g = new_graph(ctx);
    switch (k) {
    case PDDE_OPCLASS_ELEMENTWISE: {
        pdde_tensor *a = pdde_input(g, "a", PDDE_F32, 1, (int64_t[]){s});
        pdde_tensor *b = pdde_input(g, "b", PDDE_F32, 1, (int64_t[]){s});
        pdde_mark_output(pdde_add(g, a, b));
        break;
    }
    case PDDE_OPCLASS_ROW: {
        int64_t c = 768, rows = s / c > 0 ? s / c : 1;
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){rows, c});
        pdde_tensor *w = pdde_param(g, "w", 1, (int64_t[]){c}, -1), *bb = pdde_param(g, "b", 1, (int64_t[]){c}, 0);
        pdde_mark_output(pdde_layernorm(g, x, w, bb, 1e-5f));
        break;
    }
    case PDDE_OPCLASS_ATTENTION: { /* scores [B, H, T, T] with T = 256 */
        int64_t t = 256, bh = s / (t * t) > 0 ? s / (t * t) : 1;
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 3, (int64_t[]){bh, t, t});
        pdde_mark_output(pdde_softmax(g, x, 1));
        break;
    }
    case PDDE_OPCLASS_EMBEDDING: { /* rows of 768 from a 8192-row table */
        int64_t c = 768, n = s / c > 0 ? s / c : 1;
        pdde_tensor *w = pdde_param(g, "wte", 2, (int64_t[]){8192, c}, 0.02f);
        pdde_tensor *ids = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){n});
        pdde_mark_output(pdde_embedding(g, w, ids));
        break;
    }
    case PDDE_OPCLASS_OPTIMIZER: {
        pdde_tensor *w = pdde_param(g, "w", 1, (int64_t[]){s}, 0.02f);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){s});
        pdde_tensor *loss = pdde_mean(g, pdde_mul(g, w, x), -1, 0);
        pdde_backward(g, loss);
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        pdde_optimizer_adamw(g, &op);
        break;
    }
    /* the classes split off for their backward: a forward + backward of the op as a model runs it, the
     * loss a cross-entropy over one row of its output (a mean's backward would broadcast through an
     * expand as slow as the op) */
    case PDDE_OPCLASS_LOSS: {
        int64_t c = 8192, rows = s / c > 0 ? s / c : 1;
        pdde_tensor *x = pdde_param(g, "x", 2, (int64_t[]){rows, c}, 1.0f), *ids = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){rows});
        pdde_backward(g, pdde_cross_entropy(g, x, ids));
        break;
    }
    case PDDE_OPCLASS_GELU: { /* the MLP's gelu(x + bias), rows of 1024 */
        int64_t c = 1024, n = s / c / 8 > 0 ? s / c / 8 * 8 : 8; /* bench_row_loss's 8192 values */
        pdde_tensor *x = pdde_param(g, "x", 2, (int64_t[]){n, c}, 1.0f), *b = pdde_param(g, "b", 1, (int64_t[]){c}, 0.02f);
        bench_row_loss(g, bare ? x : pdde_bias_gelu(g, x, b));
        break;
    }
    case PDDE_OPCLASS_ROW_BACKWARD: {
        /* rows as long as the models of that size have: a norm backward's time a byte depends on its row
         * length too (per-row reductions; the gamma gradient sums over rows): measured alone at 0.66 MB,
         * rows of 128 (the small models' width) took 1.2x rows of 1024 */
        int64_t c = row_backward_length(s), per = 8192 / c, n = s / c / per > 0 ? s / c / per * per : per; /* bench_row_loss's 8192 values */
        pdde_tensor *x = pdde_param(g, "x", 2, (int64_t[]){n, c}, 1.0f);
        if (bare) { bench_row_loss(g, x); break; }
        /* the bias an input: its gradient (a sum over rows, the row class's) would be one more node
         * whose model time, the row curve's smallest, is taken off the difference (a third of it at
         * 0.16 MB) */
        pdde_tensor *w = pdde_param(g, "w", 1, (int64_t[]){c}, -1), *bb = pdde_input(g, "b", PDDE_F32, 1, (int64_t[]){c});
        bench_row_loss(g, pdde_layernorm(g, x, w, bb, 1e-5f));
        break;
    }
    case PDDE_OPCLASS_FUSED_ATTENTION: /* q, k, v [1, B H, T, 64] with T = 128: s scores */
    case PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD: {
        int64_t t = 128, bh = s / (t * t) > 0 ? s / (t * t) : 1, shape[4] = {1, bh, t, 64};
        pdde_tensor *q = pdde_param(g, "q", 4, shape, 1.0f);
        if (bare) { bench_row_loss(g, q); break; }
        pdde_tensor *kk = pdde_param(g, "k", 4, shape, 1.0f), *v = pdde_param(g, "v", 4, shape, 1.0f);
        bench_row_loss(g, pdde_attention(g, q, kk, v));
        break;
    }
    /* the same in bf16 (a mixed-precision model's), T = 1024 from 1M scores, with q, k, v packed in qkv
     * [1, T, bh*3*64] (pdde_attention_qkv) as the models' are: a GPU backend picks its path by the layout too */
    case PDDE_OPCLASS_FUSED_ATTENTION_HALF:
    case PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD: {
        int64_t t = s < (1 << 20) ? (int64_t)sqrt((double)s) : 1024, bh = s / (t * t) > 0 ? s / (t * t) : 1, shape[4] = {1, bh, t, 64};
        if (bare) { bench_row_loss(g, pdde_param(g, "q", 4, shape, 1.0f)); break; }
        pdde_tensor *qkv = pdde_param(g, "qkv", 3, (int64_t[]){1, t, 3 * bh * 64}, 1.0f);
        pdde_graph_set_compute_dtype(g, PDDE_BF16);
        pdde_tensor *y = pdde_attention_qkv(g, qkv, (int)bh);
        pdde_graph_set_compute_dtype(g, PDDE_F32);
        bench_row_loss(g, y);
        break;
    }
    default: break;
    }
    return g;
}

/* The fused attention's forward is measured in a forward run, its backward in a forward + backward
 * run less the forward (timed by the curve measured just before). */
static int class_forward_only(int k) { return k == PDDE_OPCLASS_FUSED_ATTENTION || k == PDDE_OPCLASS_FUSED_ATTENTION_HALF; }

/* The class a fused attention op of a cost program is measured in (its softmax bytes'), as the cost
 * model times it: bf16 / f16 ones by the half classes (on accelerators). */
static int softmax_class_of(const pdde_cost_op *op) {
    int half = op->dtype == PDDE_BF16 || op->dtype == PDDE_F16;
    return op->softmax_backward ? (half ? PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD : PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD)
                                : (half ? PDDE_OPCLASS_FUSED_ATTENTION_HALF : PDDE_OPCLASS_FUSED_ATTENTION);
}

/* The half classes time the whole op (GEMMs included), the others what it adds to its GEMMs. */
static int class_whole_op(int k) { return k == PDDE_OPCLASS_FUSED_ATTENTION_HALF || k == PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD; }

/* A class measured inside a forward + backward graph (or its forward alone: class_forward_only): the
 * bytes the cost model counts for all its nodes (for the fused attention, their softmax bytes), and in
 * *others the model's seconds for the graph's other nodes that run and for the attention's GEMMs,
 * timed by the curves measured before this one. */
static double class_bytes_in_step(pdde_context *ctx, const pdde_cluster *c, int device, const pdde_graph *g,
                                  pdde_op_class k, double *others) {
    pdde_cost_program *p;
    double bytes = 0;
    *others = 0;
    if (pdde_cost_program_from_graph(g, device, &p)) return 0;
    for (int i = 0; i < pdde_cost_program_op_count(p, 0); i++) {
        pdde_cost_op op = *pdde_cost_program_op(p, 0, i);
        if (class_forward_only(k) && op.phase != PDDE_PHASE_FORWARD) continue;
        if (op.softmax_bytes > 0 && softmax_class_of(&op) == (int)k) {
            bytes += op.softmax_bytes, op.softmax_bytes = 0;
            if (class_whole_op(k)) continue;
        } else if (op.op_class == k) { bytes += op.bytes; continue; }
        double t = pdde_cost_compute_time(ctx, c, device, &op);
        if (isfinite(t)) *others += t;
    }
    pdde_cost_program_free(p);
    return bytes;
}

/* The curves of sp, the spec of device in c, in the order of the classes. A class measured in a
 * forward + backward graph takes the time of the graph less that of its bare graph (the loss and the
 * gradient's writes, measured alike) and less the model's time for the other nodes its op adds (a
 * bias's sum, a layernorm's forward, an attention's GEMMs), whose classes are measured by then. */
static void measure_curves(pdde_context *ctx, const pdde_cluster *c, int device, pdde_device_spec *sp) {
    /* (a device with memory of its own goes on to 16M values: a GPU is still far from its bandwidth at 4M,
     * and a model's activations are that large; a point takes it well under a millisecond) */
    static const int64_t sizes[] = {1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22, 1 << 24};
    pdde_device_props props;
    int own_memory = sp->kind != PDDE_DEVICE_CPU && !pdde_device_get_props(ctx, device, &props) && !props.on_host_cores;
    /* the half attention's: a head of T = 256, then 1, 4, 16 and 64 heads of T = 1024 (a large GPU fills
     * only from about 64) */
    static const int64_t half_scores[] = {1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26};
    for (int k = PDDE_OPCLASS_ELEMENTWISE; k < PDDE_OPCLASS_PS_PULL; k++) { /* (the table's: measure_ps) */
        int in_step = k >= PDDE_OPCLASS_LOSS, half = class_whole_op(k), n_sizes = half ? 5 : own_memory ? 6 : quick ? 3 : 5;
        if (half && sp->kind == PDDE_DEVICE_CPU) continue; /* (a CPU's bf16 attention: the f32 curves stand for it) */
        /* every class on every device: a device's kernels for these may run far from its memory's
         * speed (a fused attention giving a thread a row) */
        printf("  %-11s", pdde_op_class_name((pdde_op_class)k));
        for (int i = 0; i < n_sizes; i++) {
            int attention = k == PDDE_OPCLASS_ATTENTION || k == PDDE_OPCLASS_FUSED_ATTENTION || k == PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD;
            if (attention && !half && i >= 5) break; /* (4 x 4M scores is as far as they go) */
            if (bench_now() > deadline) break;
            int64_t s = half ? half_scores[i] : sizes[i] * (attention ? 4 : 1);
            pdde_graph *g = class_graph(ctx, (pdde_op_class)k, s, 0);
            /* the loss's graph is its op alone */
            pdde_graph *bare = in_step && k != PDDE_OPCLASS_LOSS ? class_graph(ctx, (pdde_op_class)k, s, 1) : NULL;
            double others = 0, bare_others = 0, t_bare = 0;
            double bytes = in_step ? class_bytes_in_step(ctx, c, device, g, (pdde_op_class)k, &others) : class_bytes(g, (pdde_op_class)k);
            if (bare) class_bytes_in_step(ctx, c, device, bare, (pdde_op_class)k, &bare_others), others -= bare_others;
            int c0 = sp->n_curve[k];
            if (c0 && sp->curve[k][c0 - 1].seconds * bytes / sp->curve[k][c0 - 1].bytes + others > max_run_s) {
                pdde_graph_free(g), pdde_graph_free(bare); /* beyond the last point the model extrapolates its bandwidth anyway */
                break;
            }
            pdde_run_mode step = class_forward_only(k) ? PDDE_RUN_FORWARD : PDDE_RUN_FORWARD_BACKWARD;
            not_run_by_device = 0;
            if (bare) t_bare = time_graph(ctx, bare, device, step, 1), pdde_graph_free(bare);
            double t = time_graph(ctx, g, device, in_step ? step : k == PDDE_OPCLASS_OPTIMIZER ? PDDE_RUN_OPTIMIZER : PDDE_RUN_FORWARD, in_step);
            pdde_graph_free(g);
            if (not_run_by_device) { /* (the class's graphs hold the same ops at every size) */
                char what[64];
                snprintf(what, sizeof what, "%s curve", pdde_op_class_name((pdde_op_class)k));
                note_not_run(what);
                printf(" not run by the device");
                break;
            }
            /* a noisy run whose rest took it all keeps a tenth */
            if (in_step) t = t - t_bare - others > 0.1 * t ? t - t_bare - others : 0.1 * t;
            int n = sp->n_curve[k];
            if (!(t > 0) || !(bytes > 0) || (n && bytes <= sp->curve[k][n - 1].bytes)) continue;
            /* a curve is increasing in bytes; noise may make a larger op faster: keep time monotone,
             * lifting a later point, or for a difference of two runs, which is surest where it is
             * largest, lowering the earlier ones (below) */
            if (n && !in_step && t < sp->curve[k][n - 1].seconds) t = sp->curve[k][n - 1].seconds;
            sp->curve[k][n] = (pdde_curve_point){bytes, t};
            sp->n_curve[k]++;
            if (k == PDDE_OPCLASS_ELEMENTWISE && bytes / t > sp->mem_bandwidth) sp->mem_bandwidth = bytes / t;
        }
        for (int i = sp->n_curve[k] - 2; in_step && i >= 0; i--)
            if (sp->curve[k][i].seconds > sp->curve[k][i + 1].seconds) sp->curve[k][i].seconds = sp->curve[k][i + 1].seconds;
        for (int i = 0; i < sp->n_curve[k]; i++) {
            const pdde_curve_point *p = &sp->curve[k][i];
            printf(" %.3g MB: %.3g ms (%.3g GB/s)", p->bytes / 1e6, p->seconds * 1e3, p->bytes / p->seconds / 1e9);
        }
        printf("\n");
    }
}

/* The parameter-server table's curves on the CPU (ps_pull, ps_push): pdde_sparse_batch_pull of a batch
 * of n ids (made unique, then pulled from the table) and pdde_sparse_batch_push of their rows, on an
 * in-process table of 2^20 rows of 16 floats with Adagrad (larger than the caches, as a recommender's
 * table is), the ids drawn at random from its rows; each point the median of runs, at the bytes
 * pdde_cost_ps_bytes counts. What the cost model's embedding and optimizer curves cannot see: a hash
 * probe per id, a cache miss per row. Timed by the thread's CPU clock: on a quiet machine the same as
 * the wall clock (one thread, no waits), on a loaded one not inflated by other programs' turns, which
 * take a larger share of a longer call. */
static double thread_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void measure_ps(pdde_context *ctx, pdde_device_spec *sp) {
    enum { ROWS = 1 << 20, DIM = 16, FILL = 1 << 14 };
    static const int64_t sizes[] = {1 << 11, 1 << 13, 1 << 15};
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = DIM, pp.table.optimizer = PDDE_PS_ADAGRAD, pp.table.init_std = 0.01f;
    pdde_ps_client *c = NULL;
    uint64_t *ids = malloc(FILL * sizeof *ids);
    float *rows = malloc((size_t)FILL * DIM * sizeof *rows);
    int ok = ids && rows && !pdde_ps_client_init(ctx, NULL, &pp, &c);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; ok && i < ROWS; i += FILL) { /* the table's rows: ids i * odd constant */
        for (int j = 0; j < FILL; j++) ids[j] = (uint64_t)(i + j) * 0xD6E8FEB86659FD93ull;
        ok = !pdde_ps_client_pull(c, FILL, ids, rows);
    }
    printf("  %-11s", "ps_pull/push");
    for (int i = 0; ok && i < 3 && bench_now() < deadline; i++) {
        int64_t n = sizes[i];
        pdde_graph *g = new_graph(ctx);
        pdde_sparse_embedding *e = NULL;
        pdde_sparse_batch *b = NULL;
        pdde_sparse_embedding_init(g, "emb", n, 1, 1, DIM, PDDE_POOL_SUM, &e);
        uint64_t *batch = malloc((size_t)n * sizeof *batch);
        if (!e || !batch || pdde_sparse_batch_init(e, &b)) { pdde_graph_free(g), pdde_sparse_embedding_free(e), free(batch); break; }
        double t[2][64];
        int runs = 0;
        for (double end = bench_now() + budget_s; runs < 64 && (runs < 5 || bench_now() < end) && ok; runs++) {
            for (int64_t j = 0; j < n; j++) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                batch[j] = (seed % ROWS) * 0xD6E8FEB86659FD93ull;
            }
            evict_caches();
            double t0 = thread_now();
            ok = !pdde_sparse_batch_pull(b, c, batch);
            double t1 = thread_now();
            ok = ok && !pdde_sparse_batch_push(b, c);
            t[0][runs] = t1 - t0, t[1][runs] = thread_now() - t1;
        }
        for (int k = 0; ok && k < 2; k++) {
            int cls = k ? PDDE_OPCLASS_PS_PUSH : PDDE_OPCLASS_PS_PULL, m = sp->n_curve[cls];
            double bytes = pdde_cost_ps_bytes(k, (double)n, DIM, PDDE_PS_ADAGRAD), sec = bench_median(t[k], runs);
            if (m && sec < sp->curve[cls][m - 1].seconds) sec = sp->curve[cls][m - 1].seconds; /* (monotone) */
            sp->curve[cls][m] = (pdde_curve_point){bytes, sec};
            sp->n_curve[cls]++;
            printf(" %s %lld ids: %.3g ms (%.0f ns an id)", k ? "push" : "pull", (long long)n, 1e3 * sec, 1e9 * sec / (double)n);
        }
        pdde_sparse_batch_free(b), pdde_sparse_embedding_free(e), pdde_graph_free(g), free(batch);
    }
    printf("\n");
    pdde_ps_client_free(c);
    free(ids), free(rows);
}

/* A graph whose input x of n floats is read by a node of form: 0 scale, 1 add, 2 matmul (x as [n/64, 64]):
 * the link needs x on the device, so its consumer must be an op the device runs (no run happens). */
enum { LINK_FORMS = 3 };
static pdde_graph *link_graph(pdde_context *ctx, int64_t n, int form, pdde_tensor **x) {
    pdde_graph *g = new_graph(ctx);
    *x = pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){n});
    if (form == 0) pdde_mark_output(pdde_scale(g, *x, 1.0f));
    else if (form == 1) pdde_mark_output(pdde_add(g, *x, *x));
    else pdde_mark_output(pdde_matmul(g, pdde_reshape(g, *x, 2, (int64_t[]){n / 64, 64}), pdde_input(g, "w", PDDE_F32, 2, (int64_t[]){64, 1}), 0, 0));
    return g;
}

/* The host -> device link of device (named name): writes of 4 kB and of 64 MB into an input of a session
 * on it, each timed alone (a session write returns once the device's stream has synchronised: the
 * data is there); the bandwidth from the difference, the latency what the small write takes beyond
 * its bytes (at least half its time). 0 on success; -1 said on stderr, naming the device (the link
 * then stays at bandwidth 0, which the planner refuses). */
static int measure_link(pdde_context *ctx, int device, const char *name, pdde_cluster_link *l) {
    double t[2] = {NAN, NAN}, bytes[2] = {4096, 64 << 20};
    char why[512] = "";
    for (int i = 0; i < 2 && !why[0]; i++) {
        pdde_tensor *x = NULL;
        pdde_graph *g = NULL;
        pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
        sp.device = device;
        sp.no_cpu_fallback = 1; /* (x on the device: its consumer runs there) */
        pdde_session *s = NULL;
        void *h = calloc(1, (size_t)bytes[i]);
        double v[32];
        int n = 0;
        pdde_status st = PDDE_ERR_UNSUPPORTED;
        for (int form = 0; form < LINK_FORMS && h && st == PDDE_ERR_UNSUPPORTED; form++) { /* (the first the device runs) */
            pdde_graph_free(g);
            g = link_graph(ctx, (int64_t)bytes[i] / 4, form, &x);
            if (!(st = pdde_graph_status(g))) st = pdde_session_init(g, &sp, &s);
        }
        if (!h) snprintf(why, sizeof why, "out of memory for %.0f bytes", bytes[i]);
        else if (st || pdde_session_write(s, x, h, (size_t)bytes[i]) /* (warm-up) */)
            snprintf(why, sizeof why, "%s%s", pdde_last_error(ctx), st == PDDE_ERR_UNSUPPORTED ? " (the device runs none of scale, add, matmul)" : "");
        for (double end = bench_now() + budget_s; !why[0] && n < 32 && (n < 3 || bench_now() < end);) {
            double t0 = bench_now();
            if (pdde_session_write(s, x, h, (size_t)bytes[i])) snprintf(why, sizeof why, "%s", pdde_last_error(ctx));
            else v[n++] = bench_now() - t0;
        }
        if (!why[0]) t[i] = bench_median(v, n);
        free(h);
        pdde_session_free(s);
        pdde_graph_free(g);
    }
    if (!why[0] && !(t[1] > t[0] && t[0] > 0))
        snprintf(why, sizeof why, "a write of %.0f B took %.3g s and one of %.0f B %.3g s: no bandwidth in that", bytes[0], t[0], bytes[1], t[1]);
    if (why[0]) {
        fprintf(stderr, "pdde-bench: device %d (%s): the host <-> device link was not measured: %s; it stays at bandwidth 0, which the planner "
                        "and the cost model refuse\n", device, name, why);
        return -1;
    }
    l->bandwidth = (bytes[1] - bytes[0]) / (t[1] - t[0]);
    l->latency = t[0] - bytes[0] / l->bandwidth > t[0] / 2 ? t[0] - bytes[0] / l->bandwidth : t[0] / 2;
    printf("host -> device: latency %.3g us, %.3g GB/s\n", l->latency * 1e6, l->bandwidth / 1e9);
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Contention: ranks on a machine's cores share its memory bandwidth and caches. A GEMM, an elementwise
 * and a row op at a small model's sizes, timed by one process alone, then by one copy on every core at
 * once (forked, each pinned to its core, one thread, every run started together): the ratio is each
 * class's slowdown (the spec's "contention"). Forked before any device runtime starts, as the ranks of
 * the collectives are. */

enum { N_CONTENTION = 3, MAX_COPIES = 64 };
static const pdde_op_class contention_classes[N_CONTENTION] = {PDDE_OPCLASS_GEMM, PDDE_OPCLASS_ELEMENTWISE, PDDE_OPCLASS_ROW};

/* In a copy pinned to cpu: the median seconds of each class's op, written to fd; 0 on success. */
static int contention_copy(int cpu, int fd) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) fprintf(stderr, "pdde-bench: contention: cannot pin a copy to cpu %d\n", cpu);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 1;
    double t[N_CONTENTION];
    for (int i = 0; i < N_CONTENTION; i++) { /* the small model's QKV GEMM; 1 MB of activations */
        pdde_op_class k = contention_classes[i];
        pdde_graph *g = k == PDDE_OPCLASS_GEMM ? gemm_graph(ctx, PDDE_F32, 1, 1024, 576, 192) : class_graph(ctx, k, 1 << 18, 0);
        t[i] = time_graph(ctx, g, 0, PDDE_RUN_FORWARD, 0);
        pdde_graph_free(g);
    }
    pdde_context_free(ctx);
    return write(fd, t, sizeof t) != (ssize_t)sizeof t;
}

/* Runs a copy on each of cpus[0..copies) at once: each class's mean time over the copies into t; 0 on
 * success. */
static int contention_run(const int *cpus, int copies, double *t) {
    int fds[2], bad = 0;
    if (pipe(fds)) return -1;
    atomic_store(&together->arrived, 0);
    together->copies = copies;
    fflush(NULL);
    pid_t pids[MAX_COPIES];
    for (int i = 0; i < copies; i++)
        if ((pids[i] = fork()) == 0) {
            close(fds[0]);
            _exit(contention_copy(cpus[i], fds[1]));
        }
    close(fds[1]);
    for (int k = 0; k < N_CONTENTION; k++) t[k] = 0;
    for (int i = 0; i < copies; i++) {
        double one[N_CONTENTION];
        bad |= read(fds[0], one, sizeof one) != (ssize_t)sizeof one;
        for (int k = 0; k < N_CONTENTION && !bad; k++) t[k] += one[k] / copies;
    }
    close(fds[0]);
    for (int i = 0; i < copies; i++) {
        int status = 0;
        double until = bench_now() + 120;
        pid_t w;
        while ((w = waitpid(pids[i], &status, WNOHANG)) == 0 && bench_now() < until) usleep(10000);
        if (w == 0) kill(pids[i], SIGKILL), waitpid(pids[i], &status, 0), bad = 1;
        bad |= !WIFEXITED(status) || WEXITSTATUS(status);
    }
    return bad ? -1 : 0;
}

/* Each class's slowdown with a copy on every core this process may use over one copy alone into
 * slowdown[class] (at least 1; left 0 when it could not be measured or there is one core). */
static void measure_contention(double *slowdown) {
    cpu_set_t set;
    int cpus[MAX_COPIES], copies = 0;
    if (sched_getaffinity(0, sizeof set, &set)) return;
    for (int i = 0; i < CPU_SETSIZE && copies < MAX_COPIES; i++)
        if (CPU_ISSET(i, &set)) cpus[copies++] = i;
    if (copies < 2) return;
    together = mmap(NULL, sizeof *together, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (together == MAP_FAILED) {
        together = NULL;
        return;
    }
    together->runs = quick ? 15 : 40;
    /* alone, together, twice over: a drift of the machine's load between them touches both alike */
    double alone[N_CONTENTION] = {0}, all[N_CONTENTION] = {0}, t[2][N_CONTENTION];
    int bad = 0;
    for (int round = 0; round < 2 && !bad; round++) {
        bad = contention_run(cpus, 1, t[0]) || contention_run(cpus, copies, t[1]);
        for (int i = 0; i < N_CONTENTION; i++) alone[i] += t[0][i], all[i] += t[1][i];
    }
    if (!bad) {
        printf("contention, %d copies (one a core) over one:", copies);
        for (int i = 0; i < N_CONTENTION; i++) {
            if (!(alone[i] > 0) || !(all[i] > 0)) continue;
            slowdown[contention_classes[i]] = all[i] > alone[i] ? all[i] / alone[i] : 1; /* (faster: noise) */
            printf(" %s %.3fx", pdde_op_class_name(contention_classes[i]), all[i] / alone[i]);
        }
        printf("\n");
    } else {
        fprintf(stderr, "pdde-bench: the contention measurement failed; the CPU's contention stays unmeasured\n");
    }
    munmap(together, sizeof *together);
    together = NULL;
}

/* ------------------------------------------------------------------------------------------------
 * Collectives on 2 ranks (forked, CPU-only contexts: device runtimes do not survive fork) */

#ifdef PDDE_HAVE_UCX
enum { N_COLL_CASES = 6 };
static const struct { pdde_collective op; pdde_comm_algo algo; } coll_cases[N_COLL_CASES] = {
    {PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO}, {PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING}, {PDDE_COLL_ALLREDUCE, PDDE_ALGO_RECURSIVE},
    {PDDE_COLL_ALLGATHER, PDDE_ALGO_AUTO}, {PDDE_COLL_REDUCE_SCATTER, PDDE_ALGO_AUTO}, {PDDE_COLL_SENDRECV, PDDE_ALGO_AUTO}};
static const size_t coll_bytes[3] = {8, 8 << 10, 8 << 20}; /* latency, then the bandwidth between the others */

static pdde_status coll_once(pdde_comm *c, int which, size_t bytes, float *a, float *b) {
    size_t n = bytes / 4;
    int rank = pdde_comm_rank(c);
    switch (coll_cases[which].op) {
    case PDDE_COLL_ALLREDUCE: return pdde_comm_allreduce(c, a, a, n, PDDE_F32, PDDE_REDUCE_SUM);
    case PDDE_COLL_ALLGATHER: return pdde_comm_allgather(c, a, b, n / 2, PDDE_F32);
    case PDDE_COLL_REDUCE_SCATTER: return pdde_comm_reduce_scatter(c, a, b, n / 2, PDDE_F32, PDDE_REDUCE_SUM);
    default: { /* a ping-pong: two one-way messages */
        pdde_status st = rank == 0 ? pdde_comm_send(c, a, n, PDDE_F32, 1, 1) : pdde_comm_recv(c, a, n, PDDE_F32, 0, 1);
        if (!st) st = rank == 0 ? pdde_comm_recv(c, a, n, PDDE_F32, 1, 2) : pdde_comm_send(c, a, n, PDDE_F32, 0, 2);
        return st;
    }
    }
}

/* In rank r: times every case at both sizes; rank 0 writes the medians (seconds) to fd. */
static int comm_rank(const char *addr, int r, int fd) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 1;
    pdde_store *store = NULL;
    pdde_comm *c = NULL;
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    p.rank = r, p.world_size = 2, p.prefix = "pdde-bench", p.timeout_s = 60;
    if (pdde_store_connect(ctx, addr, 20, &store) || (p.store = store, pdde_comm_init(ctx, &p, &c))) {
        fprintf(stderr, "pdde-bench: rank %d: %s\n", r, pdde_last_error(ctx));
        pdde_store_close(store), pdde_context_free(ctx);
        return 1;
    }
    double out[N_COLL_CASES][3];
    float *a = calloc(coll_bytes[2], 1), *b = calloc(coll_bytes[2], 1);
    int bad = !a || !b;
    for (int k = 0; k < N_COLL_CASES && !bad; k++) {
        pdde_comm_set_algo(c, coll_cases[k].algo);
        for (int s = 0; s < 3 && !bad; s++) {
            double v[200];
            int n = 0, reps = s == 2 ? (quick ? 5 : 15) : (quick ? 30 : 100);
            /* the smallest size: a run of calls a sample, each waiting for the other rank's part, so that
             * one rank leaving the barrier first does not time only its own half */
            int chain = s == 0 ? 20 : 1;
            bad |= coll_once(c, k, coll_bytes[s], a, b) != PDDE_OK; /* warm-up */
            for (int i = 0; i < reps && !bad; i++) {
                bad |= pdde_comm_barrier(c) != PDDE_OK;
                double t0 = bench_now();
                for (int j = 0; j < chain && !bad; j++) bad |= coll_once(c, k, coll_bytes[s], a, b) != PDDE_OK;
                v[n++] = (bench_now() - t0) / chain;
            }
            /* the ping-pong carried the message twice */
            out[k][s] = n ? bench_median(v, n) / (coll_cases[k].op == PDDE_COLL_SENDRECV ? 2 : 1) : NAN;
        }
    }
    if (bad) fprintf(stderr, "pdde-bench: rank %d: collective failed: %s\n", r, pdde_last_error(ctx));
    if (r == 0 && !bad && write(fd, out, sizeof out) != (ssize_t)sizeof out) bad = 1;
    free(a), free(b);
    pdde_comm_free(c);
    pdde_store_close(store);
    pdde_context_free(ctx);
    return bad;
}

/* Fills the machine's intra link and the calibrations; 0 on success. */
static int measure_comm(pdde_cluster *cl) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_store_server *srv = NULL;
    if (pdde_context_init(&cp, &ctx) || pdde_store_server_init(ctx, "127.0.0.1:0", &srv)) return -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pdde_store_server_port(srv));
    int fds[2];
    if (pipe(fds)) return -1;
    fflush(NULL);
    pid_t pids[2];
    for (int r = 0; r < 2; r++)
        if ((pids[r] = fork()) == 0) {
            close(fds[0]);
            _exit(comm_rank(addr, r, fds[1]));
        }
    close(fds[1]);
    double res[N_COLL_CASES][3];
    ssize_t got = read(fds[0], res, sizeof res);
    close(fds[0]);
    int bad = got != (ssize_t)sizeof res;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        double until = bench_now() + 120;
        pid_t w;
        while ((w = waitpid(pids[r], &status, WNOHANG)) == 0 && bench_now() < until) usleep(10000);
        if (w == 0) kill(pids[r], SIGKILL), waitpid(pids[r], &status, 0), bad = 1;
        bad |= !WIFEXITED(status) || WEXITSTATUS(status);
    }
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    if (bad) return -1;
    printf("collectives on 2 ranks (latency: the time measured at %zu B; fit: a line through %zu B and %zu B):\n", coll_bytes[0], coll_bytes[1],
           coll_bytes[2]);
    for (int k = 0; k < N_COLL_CASES; k++) {
        pdde_collective_calib c = {coll_cases[k].op, coll_cases[k].algo, 2, 1, 0, 0};
        double dt = res[k][2] - res[k][1], db = (double)(coll_bytes[2] - coll_bytes[1]);
        if (!(dt > 0)) continue;
        c.bandwidth = db / dt;
        /* the smallest message's time: the fit's intercept is near 0, while a small collective in a
         * training step costs microseconds of calls and progress */
        double fit_latency = res[k][1] - (double)coll_bytes[1] / c.bandwidth;
        c.latency = res[k][0] > 0 ? res[k][0] : 0;
        pdde_cluster_add_calib(cl, &c);
        static const char *algos[] = {"auto", "ring", "recursive", "two_level"};
        printf("  %-14s %-9s latency %8.2f us   fit %8.2f us + bytes / %7.3f GB/s\n", pdde_collective_name(c.op), algos[c.algo], c.latency * 1e6,
               fit_latency * 1e6, c.bandwidth / 1e9);
        if (c.op == PDDE_COLL_SENDRECV) {
            cl->machines[0].intra.bandwidth = c.bandwidth;
            cl->machines[0].intra.latency = c.latency;
        }
    }
    return 0;
}
#endif

/* Says on stderr what of cluster c (from path) the planner and the cost model need and it lacks: a
 * device with no GEMM figure (no points, peak_flops 0) or no memory bandwidth (no elementwise curve,
 * mem_bandwidth 0), a link with bandwidth 0 (a pdde-bench --devices that left a device out, a link
 * measurement that failed). 1 when something is missing. */
static int check_missing(const char *path, const pdde_cluster *c) {
    char backends[256] = "";
    for (int s = 0, n = 0; s < c->n_specs; s++) /* (every family of the file: what to calibrate) */
        if (!strstr(backends, c->specs[s].backend))
            n += snprintf(backends + n, sizeof backends - (size_t)n, "%s%s", n ? "," : "", c->specs[s].backend);
    int missing = 0;
    for (int m = 0; m < c->n_machines; m++)
        for (int d = 0; d < c->machines[m].n_devices; d++) {
            const pdde_cluster_device *dev = &c->machines[m].devices[d];
            const pdde_device_spec *sp = &c->specs[dev->spec];
            int no_flops = !sp->n_gemm && !(sp->peak_flops > 0), no_bw = !sp->n_curve[PDDE_OPCLASS_ELEMENTWISE] && !(sp->mem_bandwidth > 0);
            if (!no_flops && !no_bw) continue;
            fprintf(stderr, "pdde-bench --check: %s: device %d (\"%s\", %s) has %s%s%s: the planner cannot use it\n", path, dev->id, sp->name,
                    sp->backend, no_flops ? "no GEMM figures (0 GEMM points, peak_flops 0)" : "", no_flops && no_bw ? " and " : "",
                    no_bw ? "no memory bandwidth (no elementwise curve, mem_bandwidth 0)" : "");
            missing = 1;
        }
    for (int i = 0; i < c->n_links; i++)
        if (!(c->links[i].bandwidth > 0)) {
            fprintf(stderr, "pdde-bench --check: %s: the %s link between devices %d and %d has bandwidth 0: the cost model cannot time a copy over it\n",
                    path, pdde_link_kind_name(c->links[i].kind), c->links[i].a, c->links[i].b);
            missing = 1;
        }
    /* a link with bandwidth 0 and no measured allreduce to stand for it: the planner cannot time the
     * ranks' collectives over it and leaves every plan using it out */
    for (int m = 0; m < c->n_machines; m++)
        for (int intra = 1; intra >= 0 && (intra || c->n_machines > 1); intra--) {
            const pdde_cluster_link *l = intra ? &c->machines[m].intra : &c->machines[m].nic;
            int measured = 0;
            for (int i = 0; i < c->n_calibs; i++) measured |= c->calibs[i].intra == intra && c->calibs[i].bandwidth > 0;
            if (l->bandwidth > 0 || measured) continue;
            fprintf(stderr, "pdde-bench --check: %s: machine %d (\"%s\") has %s bandwidth 0 and no collective measured (a file from "
                    "pdde-bench --no-comm): the planner cannot time its ranks' collectives; run pdde-bench without --no-comm\n",
                    path, c->machines[m].id, c->machines[m].name, intra ? "intra" : "nic");
            missing = 1;
        }
    if (missing) fprintf(stderr, "pdde-bench --check: %s is incomplete: measure every device of it at once: pdde-bench --devices %s\n", path, backends);
    return missing;
}

/* Loads a cluster file, says what is in it (or which field is wrong) and what it lacks (exit 1),
 * optionally rewrites it. */
static int check_file(const char *path, int rewrite) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_cluster *c = NULL;
    if (pdde_context_init(&cp, &ctx)) return 1;
    pdde_status st = pdde_cluster_load(ctx, path, &c);
    if (!st) {
        printf("%s: \"%s\": %d machine%s, %d device%s\n", path, c->name, c->n_machines, c->n_machines > 1 ? "s" : "", pdde_cluster_device_count(c),
               pdde_cluster_device_count(c) > 1 ? "s" : "");
        for (int s = 0; s < c->n_specs; s++) {
            int n = 0;
            double mem = 0;
            for (int m = 0; m < c->n_machines; m++)
                for (int d = 0; d < c->machines[m].n_devices; d++)
                    if (c->machines[m].devices[d].spec == s) n++, mem += (double)c->machines[m].devices[d].memory;
            double peak = c->specs[s].peak_flops; /* (a CPU's or PoCL's tens of GFLOP/s are 0.0 TFLOP/s) */
            printf("  %3d x %-24s %-6s %8.1f %s f32 peak, %7.1f GB/s, %.1f GiB total, %d GEMM points\n", n, c->specs[s].name,
                   c->specs[s].backend, peak >= 1e12 ? peak / 1e12 : peak / 1e9, peak >= 1e12 ? "TFLOP/s" : "GFLOP/s",
                   c->specs[s].mem_bandwidth / 1e9, mem / (1 << 30), c->specs[s].n_gemm);
        }
        if (rewrite) st = pdde_cluster_save(ctx, c, path);
    }
    if (st) fprintf(stderr, "pdde-bench: %s\n", pdde_last_error(ctx));
    int missing = !st && check_missing(path, c);
    pdde_cluster_free(c);
    pdde_context_free(ctx);
    return st || missing ? 1 : 0;
}

/* 1, saying why, when the directory of the output file cannot take it */
static int out_dir_unwritable(const char *out) {
    char dir[4096];
    const char *slash = strrchr(out, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) + (slash == out) : 1, slash ? out : ".");
    if (access(dir, W_OK) == 0) return 0;
    fprintf(stderr, "pdde-bench: -o %s: cannot write into %s: %s\n", out, dir, strerror(errno));
    return 1;
}

/* 1, saying why, when a family of --devices (a comma-separated list) has no device in the cluster c detected */
static int devices_missing(pdde_context *ctx, const pdde_cluster *c, const char *devices) {
    char list[256], have[256] = "";
    snprintf(list, sizeof list, "%s", devices);
    for (int s = 0, n = 0; s < c->n_specs; s++)
        if (!strstr(have, c->specs[s].backend)) n += snprintf(have + n, sizeof have - (size_t)n, "%s%s", n ? ", " : "", c->specs[s].backend);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int s = 0; s < c->n_specs && !found; s++) found = !strcmp(c->specs[s].backend, name);
        if (found) continue;
        const char *why = NULL;
        int b = pdde_backend_count(ctx) - 1;
        while (b >= 0 && strcmp(pdde_backend_name(ctx, b), name)) b--;
        if (b >= 0) pdde_backend_status(ctx, b, &why);
        if (b >= 0 && why) fprintf(stderr, "pdde-bench: --devices %s: %s is unavailable: %s\n", devices, name, why[0] ? why : "its init gave no reason");
        else if (b < 0) /* (a plugin's backend is known only once the plugin is loaded) */
            fprintf(stderr, "pdde-bench: --devices %s: no backend named %s (this machine has devices of %s); a plugin's backend needs its library: "
                    "--plugin FILE or PDDE_BACKEND_PLUGINS\n", devices, name, have[0] ? have : "none");
        else fprintf(stderr, "pdde-bench: --devices %s: %s has no device (this machine has devices of %s)\n", devices, name, have[0] ? have : "none");
        return 1;
    }
    return 0;
}

/* The seconds a flag gives: a whole number (no trailing text), finite and > 0; else says so and 0. */
static int seconds_arg(const char *flag, const char *text, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !isfinite(v) || v <= 0) {
        fprintf(stderr, "pdde-bench: %s '%s': want seconds > 0 (a finite number)\n", flag, text);
        return 0;
    }
    *out = v;
    return 1;
}

int main(int argc, char **argv) {
    const char *out = "cluster.json", *devices = NULL, *check = NULL, *plugins = NULL;
    int no_comm = 0, rewrite = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1, budget_s = 0.04;
        else if (!strcmp(argv[i], "--no-comm")) no_comm = 1;
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc) devices = argv[++i];
        else if (!strcmp(argv[i], "--budget") && i + 1 < argc) { if (!seconds_arg("--budget", argv[++i], &budget_s)) return 2; }
        else if (!strcmp(argv[i], "--check") && i + 1 < argc) check = argv[++i];
        else if (!strcmp(argv[i], "--rewrite")) rewrite = 1;
        else if (!strcmp(argv[i], "--run-overhead")) force_overhead = 1;
        else if (!strcmp(argv[i], "--time-limit") && i + 1 < argc) { if (!seconds_arg("--time-limit", argv[++i], &deadline)) return 2; }
        else if (!strcmp(argv[i], "--plugin") && i + 1 < argc) plugins = argv[++i];
        else {
            fprintf(stderr, "usage: %s [-o cluster.json] [--quick] [--no-comm] [--devices cpu,opencl] [--budget seconds per point] [--run-overhead] [--time-limit seconds] [--plugin /path/lib.so]\n"
                            "       %s --check cluster.json [--rewrite]\n", argv[0], argv[0]);
            return 2;
        }
    }
    if (check) return check_file(check, rewrite);
    if (out_dir_unwritable(out)) return 1; /* (before minutes of measuring) */
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress as it comes */
    double t0 = bench_now();
    deadline += t0;
    pdde_cluster *cl = NULL;
    int comm_ok = -1;
#ifdef PDDE_HAVE_UCX
    /* first, before any device runtime starts threads in this process: the ranks are forked */
    pdde_cluster *tmp;
    if (!no_comm && !pdde_cluster_init("", &tmp)) {
        pdde_cluster_machine m = {0};
        pdde_cluster_add_machine(tmp, &m);
        comm_ok = measure_comm(tmp);
        if (comm_ok) fprintf(stderr, "pdde-bench: the collective measurements failed; the links stay uncalibrated\n");
        cl = tmp;
    }
#else
    (void)no_comm;
#endif
    double slowdown[PDDE_OPCLASS_COUNT] = {0};
    if (!devices || strstr(devices, "cpu")) measure_contention(slowdown); /* forks too: before the context */
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = devices;
    cp.backend_plugins = plugins; /* (NULL: PDDE_BACKEND_PLUGINS) */
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) {
        fprintf(stderr, "pdde-bench: no context\n");
        return 1;
    }
    pdde_cluster *c;
    if (pdde_cluster_detect(ctx, &c)) {
        fprintf(stderr, "pdde-bench: %s\n", pdde_last_error(ctx));
        return 1;
    }
    if (devices && devices_missing(ctx, c, devices)) {
        pdde_cluster_free(c);
        pdde_context_free(ctx);
        return 1;
    }
    if (pdde_cluster_validate(ctx, c)) { /* (what a backend reports, e.g. a device of memory 0: said before minutes of measuring) */
        fprintf(stderr, "pdde-bench: this machine's devices, as their backends report them: %s\n", pdde_last_error(ctx));
        pdde_cluster_free(c);
        pdde_context_free(ctx);
        return 1;
    }
    snprintf(c->name, sizeof c->name, "%.48s (pdde-bench)", c->machines[0].name);
    if (cl && comm_ok == 0) {
        c->machines[0].intra = cl->machines[0].intra;
        for (int i = 0; i < cl->n_calibs; i++) pdde_cluster_add_calib(c, &cl->calibs[i]);
    }
    pdde_cluster_free(cl);
    int links_failed = 0, devices_failed = 0;
    printf("machine %s: %d cores, %d NUMA nodes, %.1f GB memory\n", c->machines[0].name, c->machines[0].cores,
           c->machines[0].numa_nodes, (double)c->machines[0].host_memory / 1e9);
    for (int d = 0; d < c->machines[0].n_devices; d++) {
        pdde_cluster_device *dev = &c->machines[0].devices[d];
        pdde_device_spec *sp = &c->specs[dev->spec];
        if (sp->n_gemm) continue; /* a second device of a measured model */
        if (devices && !strstr(devices, sp->backend)) continue; /* (the CPU of a context: --devices did not name it) */
        printf("device %d (%s, %s):\n", dev->id, sp->name, sp->backend);
        device_failures = 0, device_first_error[0] = 0;
        sp->peak_flops = 0, sp->mem_bandwidth = 0; /* measured from here on */
        run_overhead = run_floor = 0;
        pdde_device_props props;
        if (sp->kind != PDDE_DEVICE_CPU && (force_overhead || (!pdde_device_get_props(ctx, dev->id, &props) && !props.on_host_cores)))
            measure_run_overhead(ctx, dev->id);
        measure_gemm(ctx, dev->id, sp, PDDE_F32);
        measure_gemm(ctx, dev->id, sp, PDDE_BF16);
        if (!quick || sp->kind == PDDE_DEVICE_CPU) measure_gemm(ctx, dev->id, sp, PDDE_F16); /* (--quick on an accelerator: bf16's only) */
        measure_curves(ctx, c, dev->id, sp);
        if (sp->kind == PDDE_DEVICE_CPU) measure_ps(ctx, sp);
        if (sp->kind == PDDE_DEVICE_CPU) memcpy(sp->contention, slowdown, sizeof slowdown);
        if (not_run[0]) /* (once a device: what its figures leave out, and what the cost model uses instead) */
            printf("  %s does not run: %s. Left out of its figures: the cost model prices a GEMM of a dtype or form not measured by the "
                   "nearest measured shapes%s, a class with no curve by its broader class's curve or else the elementwise bandwidth (%.3g GB/s)\n",
                   sp->backend, not_run, sp->n_gemm ? "" : " (none here: peak_flops 0)", sp->mem_bandwidth / 1e9);
        not_run[0] = 0;
        /* failures that leave it without a figure the cost model needs: the file marks it unusable (no GEMM figures or no
         * bandwidth, which the planner refuses) and the calibration fails, saying why */
        if (device_failures && (!sp->n_gemm || !(sp->mem_bandwidth > 0))) {
            fprintf(stderr, "pdde-bench: device %d (%s): %d runs failed and it has %s: the planner will not use it; the first error: %s\n",
                    dev->id, sp->name, device_failures, !sp->n_gemm ? "no GEMM figures" : "no memory bandwidth", device_first_error);
            devices_failed = 1;
        } else if (device_failures) {
            printf("  %d runs failed (the first: %s); the figures are the runs that did not\n", device_failures, device_first_error);
        }
    }
    run_overhead = run_floor = 0; /* (a copy's time is its run's) */
    for (int d = 0; d < c->machines[0].n_devices; d++) { /* (every device's: a second one of a model has a link of its own) */
        pdde_cluster_device *dev = &c->machines[0].devices[d];
        const pdde_device_spec *sp = &c->specs[dev->spec];
        if (devices && !strstr(devices, sp->backend)) continue;
        for (int i = 0; i < c->n_links; i++)
            if (c->links[i].b == dev->id && c->links[i].a != dev->id) {
                printf("device %d (%s): ", dev->id, sp->name);
                links_failed |= measure_link(ctx, dev->id, sp->name, &c->links[i]) != 0;
            }
    }
    pdde_status st = pdde_cluster_save(ctx, c, out);
    if (st) fprintf(stderr, "pdde-bench: %s\n", pdde_last_error(ctx));
    else printf("wrote %s in %.1f s%s\n", out, bench_now() - t0, bench_now() > deadline ? " (the time limit cut the measurements short)" : "");
    if (!st && links_failed) fprintf(stderr, "pdde-bench: wrote %s, but a host <-> device link in it is unmeasured (above): exit 1\n", out);
    if (!st && devices_failed) fprintf(stderr, "pdde-bench: wrote %s, but a device in it failed its measurements (above): exit 1\n", out);
    pdde_cluster_free(c);
    pdde_context_free(ctx);
    return st || links_failed || devices_failed ? 1 : 0;
}
