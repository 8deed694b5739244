/* bench_dispatch — the host's cost per executed op: a deep, narrow MLP (width 16, 48 layers, batch 8 by
 * default: relu(x W + b) per layer, cross-entropy, AdamW) trained step after step, so every kernel is
 * tiny and a step's time is the executor's and the backend's dispatch. pdde and PyTorch eager
 * (tools/bench/dispatch_torch.py: the same model, the same sizes, on the CPU, one thread each) in the
 * same run.
 *
 * us_per_op: the median step's wall time over the nodes the step ran (pdde_session_op_runs: forward,
 * backward and update nodes; a multi-tensor update counts every node it takes). torch_us_per_op: torch's
 * median step over the same count (the same model's work), so ratio = us_per_op / torch_us_per_op is
 * the ratio of the steps; torch_aten_us_per_op: torch's step over the aten ops it dispatches (counted
 * once, untimed, with a TorchDispatchMode: its own granularity, AdamW's per-parameter ops included).
 * cpu_us_per_op: us_per_op on the process's CPU time, steadier on a loaded machine; host_us_per_op: on the
 * calling thread's CPU time: the host's own cost of enqueueing an op where a device (PoCL's threads)
 * runs the kernels. --device opencl runs pdde's step on the first OpenCL device (PoCL
 * here: its launch path, kernels and all; the torch peer stays on the CPU). Last line:
 *   RESULT dispatch us_per_op=.. torch_us_per_op=.. ratio=.. torch_aten_us_per_op=.. ops_per_step=..
 *          cpu_us_per_op=.. host_us_per_op=.. device=..
 *
 *   bench_dispatch [--width W] [--depth L] [--batch B] [--steps N] [--reps R] [--device cpu|opencl]
 *                  [--threads T] [--no-torch] [--python /usr/bin/python3] */
#include "pdde.h"
#include "bench_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t ops_run(const pdde_session *s) {
    int64_t n = 0;
    for (int op = 0; op < PDDE_OP_COUNT; op++) n += pdde_session_op_runs(s, (pdde_op)op);
    return n;
}

typedef struct {
    int width, depth, batch, steps, reps, threads, torch;
    const char *device, *python;
} options;

/* The torch peer: its median step (us) and its aten ops per step; 0 on success. */
static int run_torch(const options *o, double *step_us, double *ops) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d %s tools/bench/dispatch_torch.py --width %d --depth %d --batch %d --steps %d --reps %d --threads %d 2>&1",
             o->threads, o->python, o->width, o->depth, o->batch, o->steps, o->reps, o->threads);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    char line[512];
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        if (sscanf(line, "TORCH step_us=%lf ops=%lf", step_us, ops) == 2) got = 1;
    }
    return pclose(p) != 0 || !got;
}

int main(int argc, char **argv) {
    options o = {.width = 16, .depth = 48, .batch = 8, .steps = 100, .reps = 9, .threads = 1, .torch = 1, .device = "cpu",
                 .python = "/usr/bin/python3"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-torch")) { o.torch = 0; continue; }
        if (!v) { fprintf(stderr, "bench_dispatch: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--width")) o.width = atoi(v);
        else if (!strcmp(a, "--depth")) o.depth = atoi(v);
        else if (!strcmp(a, "--batch")) o.batch = atoi(v);
        else if (!strcmp(a, "--steps")) o.steps = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--python")) o.python = v;
        else { fprintf(stderr, "bench_dispatch: unknown option %s\n", a); return 2; }
    }
    if (o.width < 1 || o.depth < 1 || o.batch < 1 || o.steps < 1 || o.reps < 1 || o.reps > 64 || o.threads < 1) {
        fprintf(stderr, "bench_dispatch: width, depth, batch, steps, threads >= 1 and reps in 1..64 expected\n");
        return 2;
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = o.threads;
    cp.backends = strcmp(o.device, "cpu") ? "cpu,opencl" : "cpu";
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) { fprintf(stderr, "bench_dispatch: no context\n"); return 1; }
    int device = 0;
    if (strcmp(o.device, "cpu")) {
        device = pdde_device_find(ctx, o.device, 0);
        if (device < 0) {
            printf("bench_dispatch: no %s device: %s\n", o.device, pdde_last_error(ctx));
            pdde_context_free(ctx);
            return 1;
        }
    }
    const int classes = 4;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){o.batch, o.width});
    pdde_tensor *tg = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){o.batch});
    pdde_tensor *h = x;
    for (int l = 0; l < o.depth; l++) {
        char wn[32], bn[32];
        snprintf(wn, sizeof wn, "w%d", l), snprintf(bn, sizeof bn, "b%d", l);
        pdde_tensor *w = pdde_param(g, wn, 2, (int64_t[]){o.width, o.width}, sqrtf(2.0f / (float)o.width));
        pdde_tensor *b = pdde_param(g, bn, 1, (int64_t[]){o.width}, 0.0f);
        h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, h, w, 0, 0), b));
    }
    pdde_tensor *wo = pdde_param(g, "wo", 2, (int64_t[]){o.width, classes}, sqrtf(2.0f / (float)o.width));
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, h, wo, 0, 0), tg);
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = 1e-3f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    pdde_session *s = NULL;
    if (pdde_graph_status(g) || pdde_backward(g, loss) || pdde_optimizer_adamw(g, &opt) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "bench_dispatch: %s\n", pdde_last_error(ctx));
        return 1;
    }
    float *xs = malloc(sizeof(float) * (size_t)o.batch * (size_t)o.width);
    int32_t *ts = malloc(sizeof(int32_t) * (size_t)o.batch);
    for (int i = 0; i < o.batch * o.width; i++) xs[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < o.batch; i++) ts[i] = i % classes;
    int rc = pdde_session_write(s, x, xs, sizeof(float) * (size_t)o.batch * (size_t)o.width) ||
             pdde_session_write(s, tg, ts, sizeof(int32_t) * (size_t)o.batch);
    for (int i = 0; i < 10 && !rc; i++) rc = pdde_session_run(s, PDDE_RUN_STEP); /* warm-up: kernels built, caches */
    int64_t ops0 = ops_run(s);
    double wall[64], cpu[64], host[64];
    for (int r = 0; r < o.reps && !rc; r++) {
        double t0 = bench_now(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), h0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < o.steps && !rc; i++) rc = pdde_session_run(s, PDDE_RUN_STEP);
        wall[r] = (bench_now() - t0) / o.steps, cpu[r] = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / o.steps;
        host[r] = (clock_s(CLOCK_THREAD_CPUTIME_ID) - h0) / o.steps;
    }
    if (rc) {
        fprintf(stderr, "bench_dispatch: %s\n", pdde_last_error(ctx));
        return 1;
    }
    double ops = (double)(ops_run(s) - ops0) / ((double)o.steps * o.reps);
    double step_us = bench_median(wall, o.reps) * 1e6, cpu_us = bench_median(cpu, o.reps) * 1e6, host_us = bench_median(host, o.reps) * 1e6;
    double us_per_op = step_us / ops;
    printf("bench_dispatch: MLP width %d, depth %d, batch %d, AdamW; %s, %d thread(s); %d reps of %d steps\n", o.width, o.depth, o.batch,
           o.device, o.threads, o.reps, o.steps);
    float lv = pdde_session_loss(s);
    printf("  pdde   step %9.1f us  ops/step %6.0f  us/op %7.3f  (CPU time: process %7.3f, calling thread %7.3f us/op)  loss %.9g (%a)\n",
           step_us, ops, us_per_op, cpu_us / ops, host_us / ops, lv, lv);
    double t_step = NAN, t_ops = NAN;
    if (o.torch && run_torch(&o, &t_step, &t_ops)) printf("bench_dispatch: the torch peer did not run (%s)\n", o.python), t_step = NAN;
    double t_per_op = t_step / ops;
    if (o.torch && !isnan(t_step))
        printf("  torch  step %9.1f us  aten ops/step %6.0f  us/aten op %7.3f\n", t_step, t_ops, t_step / t_ops);
    printf("RESULT dispatch us_per_op=%.3f torch_us_per_op=%.3f ratio=%.3f torch_aten_us_per_op=%.3f ops_per_step=%.0f cpu_us_per_op=%.3f "
           "host_us_per_op=%.3f device=%s\n",
           us_per_op, t_per_op, us_per_op / t_per_op, t_step / t_ops, ops, cpu_us / ops, host_us / ops, o.device);
    free(xs), free(ts);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return 0;
}
