/* bench_ops — pdde's op kernels against the vendor libraries called directly, in the same run.
 *
 * GEMM at training shapes (M x N x K: 1024^3 and GPT-2 small's 256x3072x768, 256x768x3072, and the
 * logits 256x50304x768) through a pdde session on the CPU, f32 and bf16 (bf16 in, f32 out), next to
 * oneDNN called directly with its own OpenMP threads (f32 also next to OpenBLAS with its own threads),
 * and on the OpenCL device next to CLBlast; measurements interleaved, medians. CPU results are also
 * stated as a percentage of this machine's FMA peak on the same threads (bench_peak.h, measured first).
 * Then the main elementwise / row kernels through pdde on every backend, in GB/s (bias add + gelu
 * unfused and fused among them).
 *
 *   bench_ops [--reps N] [--quick]
 *
 * Last line: RESULT backend_ops opencl_gemm_ratio=<pdde GFLOP/s / direct CLBlast>
 *   cpu_gemm_ratio=<pdde f32 / oneDNN direct f32> cpu_gemm_peak_pct=<pdde f32, % of the f32 FMA peak>
 *   cpu_bf16_gemm_ratio=<> cpu_bf16_gemm_peak_pct=<> cpu_openblas_ratio=<pdde f32 / OpenBLAS direct>
 *   f32_peak_gflops=<> bf16_peak_gflops=<>   (geometric means over the shapes; nan = not run) */
#define _GNU_SOURCE
#include "pdde.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef PDDE_HAVE_OPENBLAS
#ifdef PDDE_OPENBLAS_SUBDIR
#include <openblas/cblas.h>
#else
#include <cblas.h>
#endif
void openblas_set_num_threads(int n);
#endif

#ifdef PDDE_HAVE_DNNL
#include <dnnl.h>
#include <omp.h>
#endif

#include "tools/bench/bench_peak.h"
#include "bench_common.h"

#ifdef PDDE_HAVE_CLBLAST
#define CL_TARGET_OPENCL_VERSION 120
#include <clblast_c.h>
#endif

static void fill_random(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / 16777216.0 - 0.5);
    }
}

/* ------------------------------------------------------------------------------------------------
 * pdde: a one-op graph compiled on a device; each timed run is one pdde_session_run (it synchronises). */

typedef struct {
    pdde_graph *g;
    pdde_session *s;
} bench_graph;

static void bench_graph_free(bench_graph *b) {
    pdde_session_free(b->s);
    pdde_graph_free(b->g);
    memset(b, 0, sizeof *b);
}

static int bench_graph_compile(pdde_context *ctx, bench_graph *b, int device) {
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    if (pdde_graph_status(b->g) != PDDE_OK || pdde_session_init(b->g, &sp, &b->s) != PDDE_OK) {
        fprintf(stderr, "bench_ops: device %d: %s\n", device, pdde_last_error(ctx));
        return -1;
    }
    /* random inputs */
    for (int i = 0; i < pdde_graph_tensor_count(b->g); i++) {
        pdde_tensor *t = pdde_graph_tensor(b->g, i);
        if (t->op != PDDE_OP_NONE || !(t->flags & (PDDE_TENSOR_INPUT | PDDE_TENSOR_PARAM))) continue;
        if (t->dtype != PDDE_F32 && t->dtype != PDDE_BF16) continue;
        size_t n = (size_t)pdde_tensor_numel(t);
        float *h = malloc(n * sizeof *h);
        fill_random(h, n, (uint64_t)i + 1);
        if (t->dtype == PDDE_BF16) {
            uint16_t *hb = (uint16_t *)h; /* narrowed in place: element i is read before it is written */
            for (size_t k = 0; k < n; k++) hb[k] = pdde_f32_to_bf16(h[k]);
        }
        pdde_session_write(b->s, t, h, n * pdde_dtype_size(t->dtype));
        free(h);
    }
    return 0;
}

static double time_run(bench_graph *b) {
    double t0 = bench_now();
    if (pdde_session_run(b->s, PDDE_RUN_FORWARD) != PDDE_OK) return NAN;
    return bench_now() - t0;
}

/* ------------------------------------------------------------------------------------------------
 * CLBlast called directly: its own context and queue on the same OpenCL device. */

#ifdef PDDE_HAVE_CLBLAST
typedef struct {
    void *lib;
    cl_int (*GetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
    cl_int (*GetDeviceIDs)(cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *);
    cl_int (*GetDeviceInfo)(cl_device_id, cl_device_info, size_t, void *, size_t *);
    cl_context (*CreateContext)(const cl_context_properties *, cl_uint, const cl_device_id *, void *, void *, cl_int *);
    cl_command_queue (*CreateCommandQueue)(cl_context, cl_device_id, cl_command_queue_properties, cl_int *);
    cl_mem (*CreateBuffer)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
    cl_int (*EnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,
                                 const cl_event *, cl_event *);
    cl_int (*Finish)(cl_command_queue);
    cl_int (*ReleaseMemObject)(cl_mem);
    cl_int (*ReleaseCommandQueue)(cl_command_queue);
    cl_int (*ReleaseContext)(cl_context);
    cl_context ctx;
    cl_command_queue q;
} direct_cl;

static int direct_cl_open(direct_cl *c, const char *device_name) {
    memset(c, 0, sizeof *c);
    if (!(c->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL))) return -1;
#define SYM(f) if (!(*(void **)&c->f = dlsym(c->lib, "cl" #f))) return -1
    SYM(GetPlatformIDs); SYM(GetDeviceIDs); SYM(GetDeviceInfo); SYM(CreateContext); SYM(CreateCommandQueue);
    SYM(CreateBuffer); SYM(EnqueueWriteBuffer); SYM(Finish); SYM(ReleaseMemObject); SYM(ReleaseCommandQueue);
    SYM(ReleaseContext);
#undef SYM
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (c->GetPlatformIDs(16, plats, &np) != CL_SUCCESS) return -1;
    for (cl_uint p = 0; p < np; p++) {
        cl_device_id devs[16];
        cl_uint nd = 0;
        if (c->GetDeviceIDs(plats[p], CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR | CL_DEVICE_TYPE_CPU, 16, devs, &nd) != CL_SUCCESS) continue;
        for (cl_uint d = 0; d < nd; d++) {
            char name[256] = {0};
            c->GetDeviceInfo(devs[d], CL_DEVICE_NAME, sizeof name - 1, name, NULL);
            if (strncmp(name, device_name, strlen(device_name)) != 0) continue;
            cl_context_properties cp[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[p], 0};
            cl_int e;
            c->ctx = c->CreateContext(cp, 1, &devs[d], NULL, NULL, &e);
            if (!c->ctx) return -1;
            c->q = c->CreateCommandQueue(c->ctx, devs[d], 0, &e);
            return c->q ? 0 : -1;
        }
    }
    return -1;
}

static void direct_cl_close(direct_cl *c) {
    if (c->q) c->ReleaseCommandQueue(c->q);
    if (c->ctx) c->ReleaseContext(c->ctx);
    if (c->lib) dlclose(c->lib);
}

static cl_mem direct_cl_buffer(direct_cl *c, size_t n, uint64_t seed) {
    cl_int e;
    cl_mem m = c->CreateBuffer(c->ctx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &e);
    if (!m) return NULL;
    float *h = malloc(n * sizeof *h);
    fill_random(h, n, seed);
    c->EnqueueWriteBuffer(c->q, m, CL_TRUE, 0, n * sizeof *h, h, 0, NULL, NULL);
    free(h);
    return m;
}
#endif

/* ------------------------------------------------------------------------------------------------
 * oneDNN called directly: one matmul primitive per shape on dense row-major operands, on an OpenMP
 * team of the same thread count (oneDNN as its users run it). */

#ifdef PDDE_HAVE_DNNL
typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
    void *buf[3];
} direct_dnnl;

static void direct_dnnl_free(direct_dnnl *d) {
    for (int i = 0; i < 3; i++) {
        if (d->mem[i]) dnnl_memory_destroy(d->mem[i]);
        free(d->buf[i]);
    }
    if (d->prim) dnnl_primitive_destroy(d->prim);
    if (d->stream) dnnl_stream_destroy(d->stream);
    if (d->engine) dnnl_engine_destroy(d->engine);
    memset(d, 0, sizeof *d);
}

static int direct_dnnl_init(direct_dnnl *d, int64_t M, int64_t N, int64_t K, int bf16) {
    memset(d, 0, sizeof *d);
    dnnl_dims_t dims[3] = {{M, K}, {K, N}, {M, N}}, strides[3] = {{K, 1}, {N, 1}, {N, 1}};
    dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t md[3];
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_engine_create(&d->engine, dnnl_cpu, 0) == dnnl_success &&
             dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags) == dnnl_success;
    for (int i = 0; ok && i < 3; i++) {
        size_t n = (size_t)(dims[i][0] * dims[i][1]);
        ok = dnnl_memory_desc_init_by_strides(&md[i], 2, dims[i], i < 2 ? dt : dnnl_f32, strides[i]) == dnnl_success &&
             (d->buf[i] = malloc(n * sizeof(float))) != NULL;
        if (ok) fill_random(d->buf[i], n, (uint64_t)i + 1);
        if (ok && i < 2 && bf16)
            for (size_t k = 0; k < n; k++) ((uint16_t *)d->buf[i])[k] = pdde_f32_to_bf16(((float *)d->buf[i])[k]);
        ok = ok && dnnl_memory_create(&d->mem[i], &md[i], d->engine, d->buf[i]) == dnnl_success;
    }
    ok = ok && dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) == dnnl_success &&
         dnnl_primitive_desc_create(&pd, &desc, NULL, d->engine, NULL) == dnnl_success &&
         dnnl_primitive_create(&d->prim, pd) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!ok) direct_dnnl_free(d);
    return ok ? 0 : -1;
}

static double direct_dnnl_time(direct_dnnl *d, int threads) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, d->mem[0]}, {DNNL_ARG_WEIGHTS, d->mem[1]}, {DNNL_ARG_DST, d->mem[2]}};
    omp_set_num_threads(threads);
    double t0 = bench_now();
    int ok = dnnl_primitive_execute(d->prim, d->stream, 3, args) == dnnl_success && dnnl_stream_wait(d->stream) == dnnl_success;
    double t = bench_now() - t0;
    /* libgomp's idle team threads spin for a while after a call: let them sleep before pdde runs */
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    return ok ? t : NAN;
}
#endif

/* ------------------------------------------------------------------------------------------------ */

typedef struct { int64_t M, N, K; } gemm_shape;

static const gemm_shape shapes[] = {{1024, 1024, 1024}, {256, 3072, 768}, {256, 768, 3072}, {256, 50304, 768}};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* geometric means over the shapes of each GEMM row's figures */
typedef struct { double log_sum; int n; } geo_mean;
static void geo_add(geo_mean *g, double v) { if (isfinite(v) && v > 0) g->log_sum += log(v), g->n++; }
static double geo_get(const geo_mean *g) { return g->n ? exp(g->log_sum / g->n) : NAN; }

enum { ROW_OPENCL, ROW_CPU_F32, ROW_CPU_BF16, N_ROWS };
static const char *const row_names[N_ROWS] = {"opencl f32", "cpu f32", "cpu bf16"};

int main(int argc, char **argv) {
    int reps = 7, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) return 1;
    int n_threads = pdde_context_thread_count(ctx);
    int cl_dev = pdde_device_find(ctx, "opencl", 0);
    pdde_device_props clp = {0}, cpup = {0};
    if (cl_dev >= 0) pdde_device_get_props(ctx, cl_dev, &clp);
    pdde_device_get_props(ctx, 0, &cpup);
    printf("bench_ops: %s; opencl device: %s\n", cpup.name, cl_dev >= 0 ? clp.name : "none");
    double peak[2] = {peak_gflops(0, n_threads, 0.2, 5), peak_gflops(1, n_threads, 0.2, 5)};
    printf("FMA peak on %d threads (best of 5): f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", n_threads, peak[0], peak[1]);
#ifdef PDDE_HAVE_CLBLAST
    direct_cl dcl;
    int have_dcl = cl_dev >= 0 && direct_cl_open(&dcl, clp.name) == 0;
#endif
    geo_mean g_ratio[N_ROWS] = {{0}}, g_pdde[N_ROWS] = {{0}}, g_blas_ratio = {0};
    double *tp = malloc((size_t)reps * sizeof *tp), *td = malloc((size_t)reps * sizeof *td), *tb = malloc((size_t)reps * sizeof *tb);

    printf("\nGEMM (M x N x K), median of %d, GFLOP/s (%% of the FMA peak); direct = oneDNN (CPU) or CLBlast (OpenCL):\n", reps);
    printf("  %-18s %-10s %16s %16s %7s %9s\n", "shape", "device", "pdde", "direct", "ratio", "OpenBLAS");
    for (int si = 0; si < N_SHAPES; si++) {
        gemm_shape sh = shapes[si];
        if (quick && sh.N > 10000) sh.N /= 10; /* a tenth of the vocabulary */
        double flops = 2.0 * (double)sh.M * (double)sh.N * (double)sh.K;
        char label[64];
        snprintf(label, sizeof label, "%lldx%lldx%lld", (long long)sh.M, (long long)sh.N, (long long)sh.K);
        for (int row = 0; row < N_ROWS; row++) {
            int device = row == ROW_OPENCL ? cl_dev : 0, bf16 = row == ROW_CPU_BF16;
            if (device < 0) continue;
            bench_graph b = {0};
            pdde_graph_init(ctx, &b.g);
            int64_t sa[2] = {sh.M, sh.K}, sb[2] = {sh.K, sh.N};
            pdde_dtype dt = bf16 ? PDDE_BF16 : PDDE_F32;
            pdde_mark_output(pdde_matmul(b.g, pdde_input(b.g, "a", dt, 2, sa), pdde_input(b.g, "b", dt, 2, sb), 0, 0));
            if (bench_graph_compile(ctx, &b, device)) { bench_graph_free(&b); continue; }
            int have_direct = 0, have_blas = 0;
#ifdef PDDE_HAVE_CLBLAST
            cl_mem A = NULL, B = NULL, C = NULL;
            if (row == ROW_OPENCL && have_dcl) {
                A = direct_cl_buffer(&dcl, (size_t)(sh.M * sh.K), 1);
                B = direct_cl_buffer(&dcl, (size_t)(sh.K * sh.N), 2);
                C = direct_cl_buffer(&dcl, (size_t)(sh.M * sh.N), 3);
                have_direct = A && B && C;
            }
#endif
#ifdef PDDE_HAVE_DNNL
            direct_dnnl dd = {0};
            if (row != ROW_OPENCL) have_direct = direct_dnnl_init(&dd, sh.M, sh.N, sh.K, bf16) == 0;
#endif
#ifdef PDDE_HAVE_OPENBLAS
            float *hA = NULL, *hB = NULL, *hC = NULL;
            if (row == ROW_CPU_F32) {
                hA = malloc((size_t)(sh.M * sh.K) * sizeof *hA), hB = malloc((size_t)(sh.K * sh.N) * sizeof *hB);
                hC = malloc((size_t)(sh.M * sh.N) * sizeof *hC);
                have_blas = hA && hB && hC;
                if (have_blas) fill_random(hA, (size_t)(sh.M * sh.K), 1), fill_random(hB, (size_t)(sh.K * sh.N), 2);
            }
#endif
            /* warm-up (kernel builds, primitive creation, page faults), then interleaved runs */
            for (int r = -1; r < reps; r++) {
                double t_p = time_run(&b), t_d = NAN, t_b = NAN;
#ifdef PDDE_HAVE_CLBLAST
                if (row == ROW_OPENCL && have_direct) {
                    double t0 = bench_now();
                    CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo,
                                                        (size_t)sh.M, (size_t)sh.N, (size_t)sh.K, 1.0f, A, 0, (size_t)sh.K, B,
                                                        0, (size_t)sh.N, 0.0f, C, 0, (size_t)sh.N, &dcl.q, NULL);
                    dcl.Finish(dcl.q);
                    t_d = st == CLBlastSuccess ? bench_now() - t0 : NAN;
                }
#endif
#ifdef PDDE_HAVE_DNNL
                if (row != ROW_OPENCL && have_direct) t_d = direct_dnnl_time(&dd, n_threads);
#endif
#ifdef PDDE_HAVE_OPENBLAS
                if (have_blas) {
                    openblas_set_num_threads(n_threads); /* OpenBLAS at its best: its own threads */
                    double t0 = bench_now();
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)sh.M, (int)sh.N, (int)sh.K, 1.0f, hA,
                                (int)sh.K, hB, (int)sh.N, 0.0f, hC, (int)sh.N);
                    t_b = bench_now() - t0;
                    openblas_set_num_threads(1); /* as pdde's CPU backend keeps it */
                }
#endif
                if (r >= 0) tp[r] = t_p, td[r] = t_d, tb[r] = t_b;
            }
            double gp = flops / bench_median(tp, reps) * 1e-9, gd = have_direct ? flops / bench_median(td, reps) * 1e-9 : NAN;
            double gb = have_blas ? flops / bench_median(tb, reps) * 1e-9 : NAN, ratio = gp / gd;
            char sp[32] = "", sd[32] = "";
            if (row != ROW_OPENCL) {
                snprintf(sp, sizeof sp, " (%3.0f%%)", 100 * gp / peak[bf16]);
                snprintf(sd, sizeof sd, " (%3.0f%%)", 100 * gd / peak[bf16]);
            }
            printf("  %-18s %-10s %9.1f%-7s %9.1f%-7s %7.3f %9.1f\n", label, row_names[row], gp, sp, gd, sd, ratio, gb);
            fflush(stdout);
            geo_add(&g_ratio[row], ratio), geo_add(&g_pdde[row], gp);
            if (have_blas) geo_add(&g_blas_ratio, gp / gb);
#ifdef PDDE_HAVE_CLBLAST
            if (A) dcl.ReleaseMemObject(A);
            if (B) dcl.ReleaseMemObject(B);
            if (C) dcl.ReleaseMemObject(C);
#endif
#ifdef PDDE_HAVE_DNNL
            if (row != ROW_OPENCL) direct_dnnl_free(&dd);
#endif
#ifdef PDDE_HAVE_OPENBLAS
            free(hA), free(hB), free(hC);
#endif
            bench_graph_free(&b);
        }
    }

    /* row and elementwise kernels at GPT-2 small activations: [4096, 768] (and [512, 50257] logits) */
    printf("\nelementwise and row kernels through pdde, median of %d, GB/s (bytes read + written):\n", reps);
    /* bias+gelu (bias_add then gelu) against the fused bias_gelu: both counted as one read of x and one
     * write of y, so their GB/s compare the time directly */
    const char *ops[] = {"add", "gelu", "bias+gelu", "bias_gelu", "layernorm", "softmax", "cross_entropy", "adamw_update"};
    for (int oi = 0; oi < (int)(sizeof ops / sizeof ops[0]); oi++) {
        for (int which = 0; which < 2; which++) {
            int device = which == 0 ? cl_dev : 0;
            if (device < 0) continue;
            bench_graph b = {0};
            pdde_graph_init(ctx, &b.g);
            int64_t R = quick ? 1024 : 4096, C = 768, x_shape[2] = {R, C}, c_shape[1] = {C};
            double bytes = 0;
            pdde_tensor *x = pdde_param(b.g, "x", 2, x_shape, 0), *y = NULL;
            const char *op = ops[oi];
            if (!strcmp(op, "add")) y = pdde_add(b.g, x, pdde_param(b.g, "b", 2, x_shape, 0)), bytes = 3.0 * R * C * 4;
            else if (!strcmp(op, "gelu")) y = pdde_gelu(b.g, x), bytes = 2.0 * R * C * 4;
            else if (!strcmp(op, "bias+gelu")) y = pdde_gelu(b.g, pdde_bias_add(b.g, x, pdde_param(b.g, "b", 1, c_shape, 0))), bytes = 2.0 * R * C * 4;
            else if (!strcmp(op, "bias_gelu")) y = pdde_bias_gelu(b.g, x, pdde_param(b.g, "b", 1, c_shape, 0)), bytes = 2.0 * R * C * 4;
            else if (!strcmp(op, "layernorm"))
                y = pdde_layernorm(b.g, x, pdde_param(b.g, "g", 1, c_shape, 0), pdde_param(b.g, "be", 1, c_shape, 0), 1e-5f),
                bytes = 2.0 * R * C * 4;
            else if (!strcmp(op, "softmax")) y = pdde_softmax(b.g, x, 0), bytes = 2.0 * R * C * 4;
            else if (!strcmp(op, "cross_entropy")) {
                int64_t N = quick ? 128 : 512, V = 50257, ls[2] = {N, V}, ts[1] = {N};
                pdde_tensor *logits = pdde_param(b.g, "logits", 2, ls, 0);
                y = pdde_cross_entropy(b.g, logits, pdde_input(b.g, "t", PDDE_I32, 1, ts));
                bytes = (double)N * V * 4;
            } else {
                /* one AdamW step of a [R, C] parameter: reads p, g, m, v; writes p, g, m, v */
                pdde_tensor *w = pdde_param(b.g, "w", 2, x_shape, 0);
                pdde_tensor *loss = pdde_sum(b.g, pdde_mul(b.g, w, x), -1, 0);
                pdde_backward(b.g, loss);
                pdde_optimizer_adamw(b.g, NULL);
                bytes = 8.0 * R * C * 4;
            }
            if (y) pdde_mark_output(y);
            if (bench_graph_compile(ctx, &b, device)) { bench_graph_free(&b); continue; }
            int mode = strcmp(op, "adamw_update") ? PDDE_RUN_FORWARD : PDDE_RUN_OPTIMIZER;
            for (int r = -1; r < reps; r++) {
                double t0 = bench_now();
                pdde_status st = pdde_session_run(b.s, (pdde_run_mode)mode);
                if (r >= 0) tp[r] = st == PDDE_OK ? bench_now() - t0 : NAN;
            }
            double m = bench_median(tp, reps);
            printf("  %-14s %-8s %9.3f ms %8.2f GB/s\n", op, which == 0 ? "opencl" : "cpu", m * 1e3, bytes / m * 1e-9);
            fflush(stdout);
            bench_graph_free(&b);
        }
    }
#ifdef PDDE_HAVE_CLBLAST
    if (have_dcl) direct_cl_close(&dcl);
#endif
    free(tp), free(td), free(tb);
    pdde_context_free(ctx);
    printf("RESULT backend_ops opencl_gemm_ratio=%.3f cpu_gemm_ratio=%.3f cpu_gemm_peak_pct=%.1f cpu_bf16_gemm_ratio=%.3f "
           "cpu_bf16_gemm_peak_pct=%.1f cpu_openblas_ratio=%.3f f32_peak_gflops=%.1f bf16_peak_gflops=%.1f\n",
           geo_get(&g_ratio[ROW_OPENCL]), geo_get(&g_ratio[ROW_CPU_F32]), 100 * geo_get(&g_pdde[ROW_CPU_F32]) / peak[0],
           geo_get(&g_ratio[ROW_CPU_BF16]), 100 * geo_get(&g_pdde[ROW_CPU_BF16]) / peak[1], geo_get(&g_blas_ratio), peak[0], peak[1]);
    return 0;
}
