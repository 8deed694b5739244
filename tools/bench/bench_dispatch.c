/* bench_dispatch — the host's cost per executed op: a deep, narrow MLP (width 16, 48 layers, batch 8 by
 * default: relu(x W + b) per layer, cross-entropy, AdamW) trained step after step, so every kernel is
 * tiny and a step's time is the executor's and the backend's dispatch. pdde and PyTorch eager
 * (tools/bench/dispatch_torch.py: the same model, the same sizes, one thread each) in the same run.
 *
 * us_per_op: the median step's wall time over the nodes the step ran (pdde_session_op_runs: forward,
 * backward and update nodes; a multi-tensor update counts every node it takes). torch_us_per_op: torch's
 * median step over the same count (the same model's work), so ratio = us_per_op / torch_us_per_op is
 * the ratio of the steps; torch_aten_us_per_op: torch's step over the aten ops it dispatches (counted
 * once, untimed, with a TorchDispatchMode: its own granularity, AdamW's per-parameter ops included).
 * cpu_us_per_op: us_per_op on the process's CPU time, steadier on a loaded machine; host_us_per_op: on the
 * calling thread's CPU time: the host's own cost of enqueueing an op where a device runs the kernels.
 *
 * --gpt: the GPT of examples/gpt.h at tiny sizes instead (V 64, T 16, 4 layers, 2 heads, C 32, B 2;
 * --bf16: under compute dtype bf16, as tools/gpu-check.sh runs it), the peer tools/bench/gpt_torch.py
 * (torch_aten_us_per_op: nan; on cuda with --sdpa, and autocast under --bf16).
 *
 * --device: where pdde's step runs: cpu (default); opencl, the first OpenCL device (PoCL here: its launch
 * path, CLBlast and kernels on the CPU's threads; the torch peer stays on the CPU); cuda, the first CUDA
 * device (the torch peer there too; each step ends in reading the loss on both sides); null, a device of
 * host memory whose ops go through the GPU dispatcher (backends/gpu_dispatch.h: argument packing, path
 * selection) to launches that do nothing: the host's cost of the GPU path that is pdde's own (executor,
 * dispatcher) without a vendor runtime's (its losses mean nothing). Last line:
 *   RESULT dispatch us_per_op=.. torch_us_per_op=.. ratio=.. torch_aten_us_per_op=.. ops_per_step=..
 *          cpu_us_per_op=.. host_us_per_op=.. device=..
 *
 *   bench_dispatch [--width W] [--depth L] [--batch B] [--steps N] [--reps R] [--device cpu|opencl|cuda|null]
 *                  [--gpt] [--bf16] [--threads T] [--no-torch] [--python /usr/bin/python3] */
#include "pdde_extension.h"
#include "bench_common.h"
#include "examples/gpt.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "backends/gpu_moe.h" /* (and gpu_dispatch.h: the null device's dispatcher) */
#pragma GCC diagnostic pop

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

/* ---- the null device: one device of host memory; compute runs the GPU dispatcher with launches that do nothing */
static int null_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, int nargs,
                       const pgd_arg *args) {
    (void)impl, (void)stream, (void)k, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)nargs, (void)args;
    return 0;
}
static int null_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    (void)impl, (void)stream, (void)nbytes;
    *out = (pgd_ptr){4096, 0};
    return 0;
}
static int null_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    (void)impl, (void)stream, (void)dst, (void)value, (void)count;
    return 0;
}
static int null_copy(void *impl, void *stream, pgd_ptr dst, pgd_ptr src, size_t nbytes) {
    (void)impl, (void)stream, (void)dst, (void)src, (void)nbytes;
    return 0;
}
static int null_gemm(void *impl, void *stream, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a, int64_t sA, pgd_ptr b,
                     int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    (void)impl, (void)stream, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)sA, (void)b, (void)sB, (void)c, (void)sC, (void)batch;
    return 0;
}
static pdde_status null_init(pdde_context *ctx, void **family, int *n) {
    *family = ctx, *n = 1;
    return PDDE_OK;
}
static void null_free(void *family) { (void)family; }
static pdde_status null_props(void *family, int index, pdde_device_props *out) {
    (void)family, (void)index;
    memset(out, 0, sizeof *out);
    out->kind = PDDE_DEVICE_ACCEL;
    strcpy(out->name, "null (host memory, launches that do nothing)");
    strcpy(out->backend, "null");
    out->memory_total = (uint64_t)1 << 30;
    out->compute_units = 1;
    return PDDE_OK;
}
static pdde_status null_open(void *family, int index, void **dev) {
    (void)index;
    *dev = family;
    return PDDE_OK;
}
static void null_close(void *dev) { (void)dev; }
static int null_supports(void *dev, const pdde_tensor *t) {
    (void)dev;
    return pgd_supports_op(t);
}
static pdde_status null_alloc(void *dev, size_t nbytes, void **handle) {
    (void)dev;
    *handle = calloc(1, nbytes ? nbytes : 1);
    return *handle ? PDDE_OK : PDDE_ERR_OOM;
}
static void null_buffer_free(void *dev, void *handle) { (void)dev, free(handle); }
static pdde_status null_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    (void)dev, (void)stream;
    memcpy((char *)handle + offset, src, n);
    return PDDE_OK;
}
static pdde_status null_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    (void)dev, (void)stream;
    memcpy(dst, (const char *)handle + offset, n);
    return PDDE_OK;
}
static pdde_status null_stream_create(void *dev, void **stream) {
    *stream = dev;
    return PDDE_OK;
}
static void null_stream_free(void *dev, void *stream) { (void)dev, (void)stream; }
static pdde_status null_sync(void *dev, void *stream) { (void)dev, (void)stream; return PDDE_OK; }
static pgd_ctx null_dispatcher(void *dev) {
    return (pgd_ctx){.ctx = dev, .name = "null", .units = 132, .max_block = 1024, .launch = null_launch, .scratch = null_scratch,
                     .fill32 = null_fill32, .copy = null_copy, .gemm = null_gemm, .attention_default = PGD_ATT_UNFUSED};
}
static pdde_status null_compute(void *dev, void *stream, pdde_tensor *t) {
    (void)stream;
    pgd_ctx g = null_dispatcher(dev);
    return pgd_compute_any(&g, t);
}
static pdde_status null_compute_group(void *dev, void *stream, pdde_tensor *const *nodes, int n) {
    (void)stream;
    pgd_ctx g = null_dispatcher(dev);
    return pgd_compute_group(&g, nodes, n);
}
static const pdde_backend_iface null_backend = {
    .api_version = PDDE_BACKEND_API_VERSION, .struct_size = sizeof(pdde_backend_iface), .name = "null", .init = null_init,
    .free = null_free, .device_props = null_props, .device_open = null_open, .device_close = null_close, .supports_op = null_supports,
    .buffer_alloc = null_alloc, .buffer_free = null_buffer_free, .write = null_write, .read = null_read,
    .stream_create = null_stream_create, .stream_free = null_stream_free, .stream_sync = null_sync, .compute = null_compute,
    .compute_group = null_compute_group,
};

typedef struct {
    int width, depth, batch, steps, reps, threads, torch, gpt, bf16;
    const char *device, *python;
} options;

static const gpt_config tiny_gpt = {.vocab = 64, .ctx = 16, .layers = 4, .heads = 2, .width = 32, .batch = 2};

/* The torch peer: its median step (us) and its aten ops per step (NaN: not counted); 0 on success. */
static int run_torch(const options *o, double *step_us, double *ops) {
    char cmd[512];
    int cuda = !strcmp(o->device, "cuda");
    if (o->gpt) {
        const gpt_config *c = &tiny_gpt;
        snprintf(cmd, sizeof cmd,
                 "OMP_NUM_THREADS=%d %s tools/bench/gpt_torch.py --vocab %d --layers %d --heads %d --width %d --ctx %d --batch %d "
                 "--steps %d --warmup 10 --threads %d --device %s --dtype %s%s 2>/dev/null",
                 o->threads, o->python, c->vocab, c->layers, c->heads, c->width, c->ctx, c->batch, o->steps * o->reps, o->threads,
                 cuda ? "cuda" : "cpu", o->bf16 ? "bf16" : "f32", cuda ? " --sdpa" : "");
        fflush(stdout);
        FILE *p = popen(cmd, "r");
        if (!p) return 1;
        char line[512];
        int got = 0;
        double ms;
        while (fgets(line, sizeof line, p))
            if (strstr(line, "TORCH ") && sscanf(strstr(line, "step_ms="), "step_ms=%lf", &ms) == 1) got = 1, *step_us = ms * 1e3, *ops = NAN;
        return pclose(p) != 0 || !got;
    }
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d %s tools/bench/dispatch_torch.py --width %d --depth %d --batch %d --steps %d --reps %d --threads %d --device %s 2>&1",
             o->threads, o->python, o->width, o->depth, o->batch, o->steps, o->reps, o->threads, strcmp(o->device, "cuda") ? "cpu" : "cuda");
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
        if (!strcmp(a, "--gpt")) { o.gpt = 1; continue; }
        if (!strcmp(a, "--bf16")) { o.bf16 = 1; continue; }
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
    char backends[64];
    snprintf(backends, sizeof backends, "cpu,%s", o.device);
    cp.backends = backends;
    const pdde_backend_iface *extra[] = {&null_backend};
    if (!strcmp(o.device, "null")) cp.extra_backends = extra, cp.n_extra_backends = 1;
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
    pdde_tensor *x = NULL, *tg = NULL, *loss = NULL, *h = NULL;
    gpt_model m;
    if (o.gpt) {
        if (o.bf16) pdde_graph_set_compute_dtype(g, PDDE_BF16);
        gpt_build(g, &tiny_gpt, &m);
        x = m.ids, tg = m.targets, loss = m.loss;
    } else {
        x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){o.batch, o.width});
        tg = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){o.batch});
        h = x;
    }
    for (int l = 0; l < o.depth && !o.gpt; l++) {
        char wn[32], bn[32];
        snprintf(wn, sizeof wn, "w%d", l), snprintf(bn, sizeof bn, "b%d", l);
        pdde_tensor *w = pdde_param(g, wn, 2, (int64_t[]){o.width, o.width}, sqrtf(2.0f / (float)o.width));
        pdde_tensor *b = pdde_param(g, bn, 1, (int64_t[]){o.width}, 0.0f);
        h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, h, w, 0, 0), b));
    }
    if (!o.gpt) loss = pdde_cross_entropy(g, pdde_matmul(g, h, pdde_param(g, "wo", 2, (int64_t[]){o.width, classes}, sqrtf(2.0f / (float)o.width)), 0, 0), tg);
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = 1e-3f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    pdde_session *s = NULL;
    if (pdde_graph_status(g) || pdde_backward(g, loss) || pdde_optimizer_adamw(g, &opt) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "bench_dispatch: %s\n", pdde_last_error(ctx));
        return 1;
    }
    size_t nx = (size_t)pdde_tensor_numel(x), nt = (size_t)pdde_tensor_numel(tg);
    float *xs = malloc(sizeof(float) * nx);
    int32_t *ts = malloc(sizeof(int32_t) * (nx + nt + 1));
    for (size_t i = 0; i < nx; i++) xs[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < nx + nt + 1; i++) ts[i] = (int32_t)((i * 7 + 3) % (size_t)(o.gpt ? tiny_gpt.vocab : classes));
    int rc = o.gpt ? pdde_session_write(s, x, ts, sizeof(int32_t) * nx) || pdde_session_write(s, tg, ts + 1, sizeof(int32_t) * nt)
                   : pdde_session_write(s, x, xs, sizeof(float) * nx) || pdde_session_write(s, tg, ts, sizeof(int32_t) * nt);
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
    if (o.gpt)
        printf("bench_dispatch: GPT V %d T %d L %d H %d C %d B %d (%s), AdamW; %s, %d thread(s); %d reps of %d steps\n", tiny_gpt.vocab,
               tiny_gpt.ctx, tiny_gpt.layers, tiny_gpt.heads, tiny_gpt.width, tiny_gpt.batch, o.bf16 ? "bf16" : "f32", o.device, o.threads,
               o.reps, o.steps);
    else
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
