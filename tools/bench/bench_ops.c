/* bench_ops — pdde's op kernels against the vendor libraries called directly, in the same run.
 *
 * GEMM at training shapes (M x N x K: 512x768x768, 256x3072x768, 256x50257x768) through a pdde session
 * on the OpenCL device and on the CPU, next to CLBlast and OpenBLAS called directly on the same device
 * with the same shapes (measurements interleaved, medians); then the main elementwise / row kernels
 * through pdde on every backend, in GB/s.
 *
 *   bench_ops [--reps N] [--quick]
 *
 * Last line: RESULT backend_ops opencl_gemm_ratio=<pdde GFLOP/s / direct CLBlast>
 *            cpu_gemm_ratio=<pdde / direct OpenBLAS>   (geometric means over the shapes; nan = not run) */
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

#ifdef PDDE_HAVE_CLBLAST
#define CL_TARGET_OPENCL_VERSION 120
#include <clblast_c.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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
    for (int i = 0; i < pdde_graph_n_tensors(b->g); i++) {
        pdde_tensor *t = pdde_graph_tensor(b->g, i);
        if (t->op != PDDE_OP_NONE || !(t->flags & (PDDE_TENSOR_INPUT | PDDE_TENSOR_PARAM)) || t->dtype != PDDE_F32) continue;
        size_t n = (size_t)pdde_tensor_numel(t);
        float *h = malloc(n * sizeof *h);
        fill_random(h, n, (uint64_t)i + 1);
        pdde_session_write(b->s, t, h, n * sizeof *h);
        free(h);
    }
    return 0;
}

static double time_run(bench_graph *b) {
    double t0 = now_s();
    if (pdde_session_run(b->s, PDDE_RUN_FORWARD) != PDDE_OK) return NAN;
    return now_s() - t0;
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

/* ------------------------------------------------------------------------------------------------ */

typedef struct { int64_t M, N, K; } gemm_shape;

static const gemm_shape shapes[] = {{512, 768, 768}, {256, 3072, 768}, {256, 50257, 768}};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

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
    int n_threads = pdde_context_n_threads(ctx);
    int cl_dev = pdde_device_find(ctx, "opencl", 0);
    pdde_device_props clp = {0};
    if (cl_dev >= 0) pdde_device_get_props(ctx, cl_dev, &clp);
    printf("bench_ops: %d CPU threads; opencl device: %s\n", n_threads, cl_dev >= 0 ? clp.name : "none");
#ifdef PDDE_HAVE_CLBLAST
    direct_cl dcl;
    int have_dcl = cl_dev >= 0 && direct_cl_open(&dcl, clp.name) == 0;
#endif
    double log_ratio[2] = {0, 0};
    int n_ratio[2] = {0, 0};
    double *tp = malloc((size_t)reps * sizeof *tp), *td = malloc((size_t)reps * sizeof *td);

    printf("\nGEMM (M x N x K), median of %d, GFLOP/s:\n", reps);
    printf("  %-20s %-8s %10s %10s %8s\n", "shape", "device", "pdde", "direct", "ratio");
    for (int si = 0; si < N_SHAPES; si++) {
        gemm_shape sh = shapes[si];
        if (quick && si == N_SHAPES - 1) sh.N = 5021; /* a tenth of the vocabulary */
        double flops = 2.0 * (double)sh.M * (double)sh.N * (double)sh.K;
        char label[64];
        snprintf(label, sizeof label, "%lldx%lldx%lld", (long long)sh.M, (long long)sh.N, (long long)sh.K);
        for (int which = 0; which < 2; which++) { /* 0 opencl, 1 cpu */
            int device = which == 0 ? cl_dev : 0;
            if (device < 0) continue;
            bench_graph b = {0};
            pdde_graph_init(ctx, &b.g);
            int64_t sa[2] = {sh.M, sh.K}, sb[2] = {sh.K, sh.N};
            pdde_mark_output(pdde_matmul(b.g, pdde_param(b.g, "a", 2, sa, 0), pdde_param(b.g, "b", 2, sb, 0), 0, 0));
            if (bench_graph_compile(ctx, &b, device)) { bench_graph_free(&b); continue; }
            int have_direct = 0;
#ifdef PDDE_HAVE_CLBLAST
            cl_mem A = NULL, B = NULL, C = NULL;
            if (which == 0 && have_dcl) {
                A = direct_cl_buffer(&dcl, (size_t)(sh.M * sh.K), 1);
                B = direct_cl_buffer(&dcl, (size_t)(sh.K * sh.N), 2);
                C = direct_cl_buffer(&dcl, (size_t)(sh.M * sh.N), 3);
                have_direct = A && B && C;
            }
#endif
#ifdef PDDE_HAVE_OPENBLAS
            float *hA = NULL, *hB = NULL, *hC = NULL;
            if (which == 1) {
                hA = malloc((size_t)(sh.M * sh.K) * sizeof *hA), hB = malloc((size_t)(sh.K * sh.N) * sizeof *hB);
                hC = malloc((size_t)(sh.M * sh.N) * sizeof *hC);
                fill_random(hA, (size_t)(sh.M * sh.K), 1), fill_random(hB, (size_t)(sh.K * sh.N), 2);
                have_direct = hA && hB && hC;
            }
#endif
            /* warm-up (kernel builds, CLBlast's program cache, page faults), then interleaved runs */
            for (int r = -1; r < reps; r++) {
                double t_p = time_run(&b), t_d = NAN;
#ifdef PDDE_HAVE_CLBLAST
                if (which == 0 && have_direct) {
                    double t0 = now_s();
                    CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo,
                                                        (size_t)sh.M, (size_t)sh.N, (size_t)sh.K, 1.0f, A, 0, (size_t)sh.K, B,
                                                        0, (size_t)sh.N, 0.0f, C, 0, (size_t)sh.N, &dcl.q, NULL);
                    dcl.Finish(dcl.q);
                    t_d = st == CLBlastSuccess ? now_s() - t0 : NAN;
                }
#endif
#ifdef PDDE_HAVE_OPENBLAS
                if (which == 1 && have_direct) {
                    openblas_set_num_threads(n_threads); /* OpenBLAS at its best: its own threads */
                    double t0 = now_s();
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)sh.M, (int)sh.N, (int)sh.K, 1.0f, hA,
                                (int)sh.K, hB, (int)sh.N, 0.0f, hC, (int)sh.N);
                    t_d = now_s() - t0;
                    openblas_set_num_threads(1); /* as pdde's CPU backend keeps it */
                }
#endif
                if (r >= 0) tp[r] = t_p, td[r] = t_d;
            }
            double mp = median(tp, reps), md = have_direct ? median(td, reps) : NAN;
            double gp = flops / mp * 1e-9, gd = flops / md * 1e-9, ratio = gp / gd;
            printf("  %-20s %-8s %10.2f %10.2f %8.3f\n", label, which == 0 ? "opencl" : "cpu", gp, gd, ratio);
            fflush(stdout);
            if (isfinite(ratio) && ratio > 0) log_ratio[which] += log(ratio), n_ratio[which]++;
#ifdef PDDE_HAVE_CLBLAST
            if (A) dcl.ReleaseMemObject(A);
            if (B) dcl.ReleaseMemObject(B);
            if (C) dcl.ReleaseMemObject(C);
#endif
#ifdef PDDE_HAVE_OPENBLAS
            free(hA), free(hB), free(hC);
#endif
            bench_graph_free(&b);
        }
    }

    /* row and elementwise kernels at GPT-2 small activations: [4096, 768] (and [512, 50257] logits) */
    printf("\nelementwise and row kernels through pdde, median of %d, GB/s (bytes read + written):\n", reps);
    const char *ops[] = {"add", "gelu", "layernorm", "softmax", "cross_entropy", "adamw_update"};
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
                double t0 = now_s();
                pdde_status st = pdde_session_run(b.s, (pdde_run_mode)mode);
                if (r >= 0) tp[r] = st == PDDE_OK ? now_s() - t0 : NAN;
            }
            double m = median(tp, reps);
            printf("  %-14s %-8s %9.3f ms %8.2f GB/s\n", op, which == 0 ? "opencl" : "cpu", m * 1e3, bytes / m * 1e-9);
            fflush(stdout);
            bench_graph_free(&b);
        }
    }
#ifdef PDDE_HAVE_CLBLAST
    if (have_dcl) direct_cl_close(&dcl);
#endif
    free(tp), free(td);
    pdde_context_free(ctx);
    printf("RESULT backend_ops opencl_gemm_ratio=%.3f cpu_gemm_ratio=%.3f\n",
           n_ratio[0] ? exp(log_ratio[0] / n_ratio[0]) : NAN, n_ratio[1] ? exp(log_ratio[1] / n_ratio[1]) : NAN);
    return 0;
}
