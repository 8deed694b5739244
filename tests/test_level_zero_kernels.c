/* test_level_zero_kernels — the Level Zero backend's kernels and the shared GPU op dispatch, run where
 * no Level Zero driver is: through OpenCL (pocl on CI) against the CPU backend.
 *
 * backends/gpu_kernels.cl is OpenCL C; the Level Zero backend ships it compiled to SPIR-V with device
 * pointers as kernel arguments (the OpenCL backend builds it with buffer + offset arguments instead,
 * which test_backend_ops covers). Here the pointer form is built by the OpenCL implementation at hand
 * (the text embedded in the library) and driven by backends/gpu_dispatch.h exactly as level_zero.c
 * drives it (same kernels, arguments, group sizes), with shared virtual memory standing in for Level
 * Zero's device pointers. Two training graphs (a small GPT with AdamW and clipping; an MLP touching the
 * remaining ops with SGD) run node by node on both; every f32 node is compared. Skipped (0 checks)
 * where there is no OpenCL device with fine-grained SVM. */
#define _GNU_SOURCE
#include "pdde_extension.h"
#include "examples/gpt.h"
#include "tests/test_util.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "backends/gpu_dispatch.h"
#include "backends/gpu_kernels_cl.h"

extern const pdde_backend_iface pdde_backend_cpu;

/* ---- the few OpenCL declarations used (no OpenCL headers needed) ---- */
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFFull
#define CL_DEVICE_SVM_CAPABILITIES 0x1053
#define CL_DEVICE_SVM_FINE_GRAIN_BUFFER (1 << 1)
#define CL_MEM_READ_WRITE (1 << 0)
#define CL_MEM_SVM_FINE_GRAIN_BUFFER (1 << 10)
#define CL_PROGRAM_BUILD_LOG 0x1183

static struct {
    cl_int (*GetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
    cl_int (*GetDeviceIDs)(cl_platform_id, cl_ulong, cl_uint, cl_device_id *, cl_uint *);
    cl_int (*GetDeviceInfo)(cl_device_id, cl_uint, size_t, void *, size_t *);
    cl_context (*CreateContext)(const intptr_t *, cl_uint, const cl_device_id *, void *, void *, cl_int *);
    cl_command_queue (*CreateCommandQueue)(cl_context, cl_device_id, cl_ulong, cl_int *);
    cl_program (*CreateProgramWithSource)(cl_context, cl_uint, const char **, const size_t *, cl_int *);
    cl_int (*BuildProgram)(cl_program, cl_uint, const cl_device_id *, const char *, void *, void *);
    cl_int (*GetProgramBuildInfo)(cl_program, cl_device_id, cl_uint, size_t, void *, size_t *);
    cl_kernel (*CreateKernel)(cl_program, const char *, cl_int *);
    cl_int (*SetKernelArg)(cl_kernel, cl_uint, size_t, const void *);
    cl_int (*SetKernelArgSVMPointer)(cl_kernel, cl_uint, const void *);
    cl_int (*EnqueueNDRangeKernel)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, const size_t *,
                                   cl_uint, const void *, void *);
    cl_int (*Finish)(cl_command_queue);
    void *(*SVMAlloc)(cl_context, cl_ulong, size_t, cl_uint);
    void (*SVMFree)(cl_context, void *);
} cl;

typedef struct {
    pdde_context *ctx;
    cl_device_id dev;
    cl_context context;
    cl_command_queue queue;
    cl_kernel kern[PGD_K_COUNT];
    void *scratch;
    size_t scratch_bytes;
} clrun;

/* 0: ready; 1: skipped (printed why) */
static int cl_open(clrun *r) {
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW);
    if (!lib) { printf("SKIP opencl: no OpenCL ICD loader\n"); return 1; }
    void **slots = (void **)&cl;
    const char *names[] = {"clGetPlatformIDs", "clGetDeviceIDs", "clGetDeviceInfo", "clCreateContext", "clCreateCommandQueue",
                           "clCreateProgramWithSource", "clBuildProgram", "clGetProgramBuildInfo", "clCreateKernel",
                           "clSetKernelArg", "clSetKernelArgSVMPointer", "clEnqueueNDRangeKernel", "clFinish",
                           "clSVMAlloc", "clSVMFree"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i]))) { printf("SKIP opencl: OpenCL loader lacks %s\n", names[i]); return 1; }
    cl_platform_id plats[8];
    cl_uint np = 0;
    if (cl.GetPlatformIDs(8, plats, &np) != 0 || !np) { printf("SKIP opencl: no OpenCL platform\n"); return 1; }
    r->dev = NULL;
    for (cl_uint p = 0; p < np && !r->dev; p++) {
        cl_device_id devs[8];
        cl_uint nd = 0;
        if (cl.GetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 8, devs, &nd) != 0) continue;
        for (cl_uint d = 0; d < nd && !r->dev; d++) {
            cl_ulong caps = 0;
            if (cl.GetDeviceInfo(devs[d], CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL) == 0 &&
                (caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER))
                r->dev = devs[d];
        }
    }
    if (!r->dev) { printf("SKIP opencl: no OpenCL device with fine-grained SVM\n"); return 1; }
    cl_int err;
    r->context = cl.CreateContext(NULL, 1, &r->dev, NULL, NULL, &err);
    if (!r->context) { printf("SKIP opencl: clCreateContext %d\n", err); return 1; }
    r->queue = cl.CreateCommandQueue(r->context, r->dev, 0, &err);
    cl_uint nparts = 0;
    while (pdde_gpu_kernels_cl_parts[nparts]) nparts++;
    cl_program prog = cl.CreateProgramWithSource(r->context, nparts, (const char **)pdde_gpu_kernels_cl_parts, NULL, &err);
    err = cl.BuildProgram(prog, 1, &r->dev, "-cl-std=CL2.0", NULL, NULL);
    if (err != 0) {
        char log[8192] = "";
        cl.GetProgramBuildInfo(prog, r->dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        CHECK(0, "gpu_kernels.cl does not build with OpenCL (%d): %s", err, log);
        return 2;
    }
    for (int k = 0; k < PGD_K_COUNT; k++) {
        r->kern[k] = cl.CreateKernel(prog, pgd_kernel_names[k], &err);
        CHECK(r->kern[k] != NULL, "kernel %s: %d", pgd_kernel_names[k], err);
        if (!r->kern[k]) return 2;
    }
    return 0;
}

/* ---- the dispatch callbacks, over OpenCL with SVM pointers ---- */
static int cb_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     int nargs, const pgd_arg *args) {
    clrun *r = impl;
    (void)stream;
    for (int i = 0; i < nargs; i++) {
        cl_int e = args[i].is_ptr ? cl.SetKernelArgSVMPointer(r->kern[k], (cl_uint)i,
                                                              (void *)(uintptr_t)pgd_addr(*(const pgd_ptr *)args[i].p))
                                  : cl.SetKernelArg(r->kern[k], (cl_uint)i, args[i].size, args[i].p);
        if (e) return pdde_error(r->ctx, PDDE_ERR_BACKEND, "%s arg %d: %d", pgd_kernel_names[k], i, e);
    }
    size_t global[3] = {(size_t)gx * bx, (size_t)gy * by, gz}, local[3] = {bx, by, 1};
    cl_int e = cl.EnqueueNDRangeKernel(r->queue, r->kern[k], 3, NULL, global, local, 0, NULL, NULL);
    if (!e) e = cl.Finish(r->queue); /* kernel by kernel: PoCL's SVM pipelining made results flaky */
    return e ? pdde_error(r->ctx, PDDE_ERR_BACKEND, "%s launch: %d", pgd_kernel_names[k], e) : PDDE_OK;
}

static int cb_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    clrun *r = impl;
    (void)stream;
    if (r->scratch_bytes < nbytes) {
        cl.Finish(r->queue);
        if (r->scratch) cl.SVMFree(r->context, r->scratch);
        r->scratch = cl.SVMAlloc(r->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, nbytes, 0);
        r->scratch_bytes = r->scratch ? nbytes : 0;
        if (!r->scratch) return pdde_error(r->ctx, PDDE_ERR_DEVICE_OOM, "scratch of %zu bytes", nbytes);
    }
    *out = (pgd_ptr){(uintptr_t)r->scratch, 0};
    return PDDE_OK;
}

static int cb_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    clrun *r = impl;
    (void)stream;
    cl.Finish(r->queue);
    for (size_t i = 0; i < count; i++) memcpy((char *)(uintptr_t)pgd_addr(dst) + 4 * i, &value, 4);
    return PDDE_OK;
}

static int cb_copy(void *impl, void *stream, pgd_ptr dst, pgd_ptr src, size_t nbytes) {
    clrun *r = impl;
    (void)stream;
    cl.Finish(r->queue);
    memmove((void *)(uintptr_t)pgd_addr(dst), (const void *)(uintptr_t)pgd_addr(src), nbytes);
    return PDDE_OK;
}

/* ---- graphs, run node by node ---- */

static void fill_leaf(pdde_tensor *t, void *buf, int64_t vocab) {
    int64_t n = pdde_tensor_numel(t);
    uint32_t s = 2166136261u;
    for (const char *c = t->name; *c; c++) s = (s ^ (uint8_t)*c) * 16777619u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f;
        if (t->dtype == PDDE_I32) ((int32_t *)buf)[i] = (i % 13 == 7 && strstr(t->name, "target")) ? -1 : (int32_t)((s >> 8) % (uint32_t)vocab);
        else if (t->flags & PDDE_TENSOR_CONST) ((float *)buf)[i] = pdde_op_f32(t, PDDE_P_CONST_VALUE);
        else if (t->flags & PDDE_TENSOR_STATE) ((float *)buf)[i] = 0.0f;
        else ((float *)buf)[i] = (u - 0.5f) * 0.5f;
    }
}

static pdde_tensor *root(pdde_tensor *t) {
    while (t->nsrc > 0 && (t->flags & (PDDE_TENSOR_VIEW | PDDE_TENSOR_INPLACE))) t = t->src[0];
    return t;
}

/* Gives every tensor memory from alloc (aliasing views and in-place nodes to their root) and fills the
 * leaves; returns the buffers (one per tensor id, NULL for aliases). */
static void **assign(pdde_graph *g, void *(*alloc)(void *, size_t), void *arg, int64_t vocab) {
    int n = pdde_graph_tensor_count(g);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        t->offset = 0;
        if (root(t) != t) continue;
        size_t nb = pdde_tensor_nbytes(t);
        bufs[i] = alloc(arg, nb ? nb : 4);
        t->data = bufs[i];
        if (t->op == PDDE_OP_NONE) fill_leaf(t, t->data, vocab);
    }
    for (int i = 0; i < n; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (root(t) != t) t->data = root(t)->data;
    }
    return bufs;
}

static void *host_alloc(void *arg, size_t n) { (void)arg; return calloc(1, n); }
static void *svm_alloc(void *arg, size_t n) {
    clrun *r = arg;
    void *p = cl.SVMAlloc(r->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, n, 0);
    if (p) memset(p, 0, n);
    return p;
}

/* the executor's per-run settings of update nodes */
static void prepare(pdde_graph *g) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_ADAMW_UPDATE || t->op == PDDE_OP_SGD_UPDATE) pdde_op_set_f32(t, PDDE_P_UPDATE_LR, 0.01f), pdde_op_set_i32(t, PDDE_P_UPDATE_STEP, 2);
        if (t->op == PDDE_OP_DROPOUT || t->op == PDDE_OP_DROPOUT_BACK) pdde_op_set_i32(t, PDDE_P_DROPOUT_COUNTER, 3);
    }
}

static int op_seen[PDDE_OP_COUNT];

static void check_graph(pdde_context *ctx, clrun *r, pdde_graph *g, const char *what, int64_t vocab) {
    int n = pdde_graph_tensor_count(g);
    prepare(g);
    void *cpu_fam = NULL, *cpu_dev = NULL, *cpu_stream = NULL;
    int nd = 0;
    pdde_backend_cpu.init(ctx, &cpu_fam, &nd);
    pdde_backend_cpu.device_open(cpu_fam, 0, &cpu_dev);
    pdde_backend_cpu.stream_create(cpu_dev, &cpu_stream);
    /* CPU: the reference; keep a copy of every f32 node's value (in-place nodes: after them) */
    void **hb = assign(g, host_alloc, NULL, vocab);
    float **ref = calloc((size_t)n, sizeof *ref);
    int st = PDDE_OK;
    for (int i = 0; i < n && !st; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_NONE) continue;
        st = pdde_backend_cpu.compute(cpu_dev, cpu_stream, t);
        if (!st && t->dtype == PDDE_F32) {
            ref[i] = malloc(pdde_tensor_nbytes(t) + 4);
            memcpy(ref[i], t->data, pdde_tensor_nbytes(t));
        }
    }
    CHECK(st == PDDE_OK, "%s: cpu: %s", what, pdde_last_error(ctx));
    /* the kernels under test */
    void **db = assign(g, svm_alloc, r, vocab);
    pgd_ctx pg = {.ctx = ctx, .name = "level_zero(opencl)", .impl = r, .stream = NULL, .units = 16, .max_block = 1024,
                  .launch = cb_launch, .scratch = cb_scratch, .fill32 = cb_fill32, .copy = cb_copy, .gemm = NULL,
                  .embedding_back = PGD_EMB_SORTED}; /* (level_zero.c's) */
    int worst_id = -1;
    double worst = 0;
    for (int i = 0; i < n && !st; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_NONE) continue;
        CHECK(pgd_supports_op(t), "%s: %s (%s) is supported", what, t->name, pdde_op_name(t->op));
        st = pgd_compute(&pg, t);
        cl.Finish(r->queue);
        op_seen[t->op] = 1;
        if (st || !ref[i]) continue;
        const float *got = t->data;
        int64_t m = pdde_tensor_numel(t);
        /* the difference relative to the largest magnitude among the output and the f32 inputs (a sum
         * that cancels to ~0 is judged against what it summed) */
        double num = 0, den = 1e-6;
        for (int64_t k = 0; k < m; k++) {
            double d = fabs((double)got[k] - ref[i][k]);
            if (!(d <= num)) num = d;
            if (fabs(ref[i][k]) > den) den = fabs(ref[i][k]);
        }
        for (int q = 0; q < t->nsrc; q++) {
            const pdde_tensor *u = t->src[q];
            if (u->dtype != PDDE_F32 || u == root(t)) continue; /* in place: the input is gone */
            for (int64_t k = 0, mu = pdde_tensor_numel(u); k < mu; k++)
                if (fabs(((const float *)u->data)[k]) > den) den = fabs(((const float *)u->data)[k]);
        }
        double tol = t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_GRAD_NORM_SQ ? 1e-4 : 2e-4;
        char shapes[160] = "";
        for (int q = -1; q < t->nsrc; q++) {
            const pdde_tensor *u = q < 0 ? t : t->src[q];
            size_t l = strlen(shapes);
            snprintf(shapes + l, sizeof shapes - l, "%s[", q < 0 ? "" : q == 0 ? " <- " : ", ");
            for (int d = 0; d < u->ndim; d++)
                l = strlen(shapes), snprintf(shapes + l, sizeof shapes - l, "%s%lld", d ? "," : "", (long long)u->shape[d]);
            l = strlen(shapes), snprintf(shapes + l, sizeof shapes - l, "]");
        }
        CHECK(num / den <= tol, "%s: node %d %s (%s) %s: max diff %.3g of the largest value", what, i, t->name,
              pdde_op_name(t->op), shapes, num / den);
        if (num / den > worst) worst = num / den, worst_id = i;
    }
    CHECK(st == PDDE_OK, "%s: kernels: %s", what, pdde_last_error(ctx));
    printf("%s: %d nodes, largest relative difference %.2g (%s)\n", what, n, worst,
           worst_id >= 0 ? pdde_op_name(pdde_graph_tensor(g, worst_id)->op) : "-");
    for (int i = 0; i < n; i++) {
        free(hb[i]);
        free(ref[i]);
        if (db[i]) cl.SVMFree(r->context, db[i]);
    }
    free(hb), free(ref), free(db);
    pdde_backend_cpu.stream_free(cpu_dev, cpu_stream);
    pdde_backend_cpu.free(cpu_fam);
}

static void test_gpt(pdde_context *ctx, clrun *r) {
    gpt_config c = {.vocab = 37, .ctx = 12, .layers = 2, .heads = 2, .width = 24, .batch = 3};
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.clip_norm = 0.5f;
    op.weight_decay = 0.1f;
    int ok = gpt_build(g, &c, &m) == PDDE_OK && pdde_backward(g, m.loss) == PDDE_OK && pdde_optimizer_adamw(g, &op) == PDDE_OK;
    CHECK(ok, "gpt graph: %s", pdde_last_error(ctx));
    if (ok) check_graph(ctx, r, g, "gpt + adamw", c.vocab);
    pdde_graph_free(g);
}

static void test_mlp(pdde_context *ctx, clrun *r) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    int64_t B = 6, D = 20, H = 33, V = 11;
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){B, D});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){D, H}, 0.1f), *s = pdde_param(g, "s", 1, (int64_t[]){H}, 0.1f);
    pdde_tensor *h = pdde_silu(g, pdde_mul(g, pdde_matmul(g, x, w1, 0, 0), s));
    h = pdde_rmsnorm(g, h, pdde_param(g, "rg", 1, (int64_t[]){H}, -1.0f), 1e-6f);
    h = pdde_dropout(g, h, 0.25f, 99);
    pdde_tensor *parts[2];
    pdde_split(g, pdde_relu(g, pdde_sub(g, h, pdde_param(g, "c", 2, (int64_t[]){1, H}, 0.1f))), 1, 1, parts);
    pdde_tensor *cat = pdde_concat(g, 2, (pdde_tensor *[]){pdde_slice(g, h, 1, 3, 20), pdde_gelu(g, pdde_slice(g, h, 1, 0, 13))}, 1);
    pdde_tensor *mean = pdde_mean(g, cat, 1, 1); /* [B, 1] */
    pdde_tensor *z = pdde_mul(g, cat, pdde_scale(g, mean, 0.5f)); /* (an add would make the gradient of mean a sum that cancels) */
    pdde_tensor *perm = pdde_transpose(g, pdde_reshape(g, z, 3, (int64_t[]){B, 3, 11}), 1, 2); /* [B, 11, 3] */
    pdde_tensor *logits = pdde_sum(g, perm, 2, 0); /* [B, 11] */
    pdde_tensor *sm = pdde_softmax(g, logits, 0);
    pdde_tensor *loss = pdde_add(g, pdde_cross_entropy(g, logits, pdde_input(g, "targets", PDDE_I32, 1, (int64_t[]){B})),
                                 pdde_mean(g, pdde_mul(g, sm, sm), -1, 0));
    pdde_tensor *ln = pdde_layernorm(g, parts[0], pdde_param(g, "lg", 1, (int64_t[]){H}, -1.0f),
                                     pdde_param(g, "lb", 1, (int64_t[]){H}, 0.0f), 1e-5f);
    loss = pdde_add(g, loss, pdde_sum(g, pdde_mul(g, ln, ln), -1, 0));
    pdde_mark_output(pdde_cast(g, logits, PDDE_F16));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.momentum = 0.9f;
    op.weight_decay = 0.01f;
    op.clip_norm = 1.0f;
    int ok = loss && pdde_backward(g, loss) == PDDE_OK && pdde_optimizer_sgd(g, &op) == PDDE_OK;
    CHECK(ok, "mlp graph: %s", pdde_last_error(ctx));
    if (ok) check_graph(ctx, r, g, "mlp + sgd", V);
    pdde_graph_free(g);
}

int main(void) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) return 1;
    clrun r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    int st = cl_open(&r);
    if (st == 0) {
        test_gpt(ctx, &r);
        test_mlp(ctx, &r);
        printf("ops not covered here (test_backend_ops covers them on real devices):");
        for (int op = 1; op < PDDE_OP_COUNT; op++) /* (copies, collectives and sends are the core's) */
            if ((op < PDDE_OP_COPY || op > PDDE_OP_RECV) && !op_seen[op]) printf(" %s", pdde_op_name((pdde_op)op));
        printf("\n");
    }
    pdde_context_free(ctx);
    return test_finish();
}
