/* bench_ocl_gemm — the host's cost of a GEMM on the OpenCL backend: CLBlast (the default where the build
 * has it) against pdde's own tiled k_gemm (PDDE_OPENCL_GEMM=builtin), in the same run on the same graph:
 * a chain of L square matmuls y = x W1 ... WL ([n, n] each), forward only, run step after step on the
 * first OpenCL device (PoCL here: its kernels run on the CPU's threads, so wall time is the device's
 * too). Per matmul: host_us, the calling thread's CPU time (what enqueueing costs the host: CLBlast
 * builds a routine object, a kernel and its arguments at every call); wall_us, the step's wall time.
 * Medians of R repeats; both paths alternate within each repeat. The outputs of the two paths are
 * compared (the kernels sum in other orders: the largest difference over the largest value is printed,
 * not asserted).
 * Last line:
 *   RESULT ocl_gemm n=<n> host_us_clblast=.. host_us_builtin=.. host_ratio=<builtin / clblast>
 *          wall_us_clblast=.. wall_us_builtin=.. wall_ratio=<builtin / clblast> (then the same for the next n)
 *
 *   bench_ocl_gemm [--sizes 16,64] [--layers L] [--steps S] [--reps R] */
#define _POSIX_C_SOURCE 200809L
#include "pdde.h"
#include "bench_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct { pdde_graph *g; pdde_session *s; pdde_tensor *x, *y; } chain;

static pdde_status chain_open(pdde_context *ctx, int dev, int n, int layers, int builtin, chain *c) {
    memset(c, 0, sizeof *c);
    pdde_status st = pdde_graph_init(ctx, &c->g);
    if (st) return st;
    int64_t shape[2] = {n, n};
    c->x = pdde_input(c->g, "x", PDDE_F32, 2, shape);
    pdde_tensor *h = c->x;
    for (int l = 0; l < layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "w%d", l);
        h = pdde_matmul(c->g, h, pdde_param(c->g, name, 2, shape, 1.0f / sqrtf((float)n)), 0, l & 1); /* (NN and NT) */
    }
    c->y = h;
    pdde_mark_output(c->y);
    if ((st = pdde_graph_status(c->g))) return st;
    /* the switch is read when the session's stream is made */
    if (builtin) setenv("PDDE_OPENCL_GEMM", "builtin", 1);
    else unsetenv("PDDE_OPENCL_GEMM");
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev, sp.no_cpu_fallback = 1;
    st = pdde_session_init(c->g, &sp, &c->s);
    unsetenv("PDDE_OPENCL_GEMM");
    if (st) return st;
    float *xv = malloc((size_t)n * n * sizeof *xv);
    if (!xv) return PDDE_ERR_OOM;
    for (int i = 0; i < n * n; i++) xv[i] = (float)((i * 7919) % 101) / 101.0f - 0.5f;
    st = pdde_session_write(c->s, c->x, xv, (size_t)n * n * sizeof *xv);
    free(xv);
    for (int i = 0; i < 3 && !st; i++) st = pdde_session_run(c->s, PDDE_RUN_FORWARD); /* (CLBlast compiles at its first call) */
    return st;
}

static void chain_close(chain *c) {
    pdde_session_free(c->s);
    pdde_graph_free(c->g);
}

/* one repeat: steps forward runs; *host and *wall per matmul in microseconds */
static pdde_status chain_time(chain *c, int steps, int layers, double *host, double *wall) {
    double w0 = bench_now(), h0 = thread_s();
    pdde_status st = PDDE_OK;
    for (int i = 0; i < steps && !st; i++) st = pdde_session_run(c->s, PDDE_RUN_FORWARD);
    *host = 1e6 * (thread_s() - h0) / ((double)steps * layers);
    *wall = 1e6 * (bench_now() - w0) / ((double)steps * layers);
    return st;
}

int main(int argc, char **argv) {
    const char *sizes = "16,64";
    int layers = 32, steps = 50, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "bench_ocl_gemm: unknown option %s\n", argv[i]); return 2; }
    }
    if (layers < 1 || steps < 1 || reps < 1 || reps > 64) { fprintf(stderr, "bench_ocl_gemm: bad --layers, --steps or --reps\n"); return 2; }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu,opencl";
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) { fprintf(stderr, "bench_ocl_gemm: no context\n"); return 1; }
    int dev = pdde_device_find(ctx, "opencl", 0);
    if (dev < 0) {
        printf("no OpenCL device\nRESULT ocl_gemm n=nan host_us_clblast=nan host_us_builtin=nan host_ratio=nan wall_us_clblast=nan wall_us_builtin=nan wall_ratio=nan\n");
        pdde_context_free(ctx);
        return 0;
    }
    pdde_device_props props;
    pdde_device_get_props(ctx, dev, &props);
    printf("bench_ocl_gemm: %s, %d square matmuls a step, %d steps, %d reps (medians); host = the calling thread's CPU time\n", props.name, layers,
           steps, reps);
    char result[2048] = "RESULT ocl_gemm";
    const char *p = sizes;
    int rc = 0;
    while (*p) {
        int n = atoi(p);
        p += strcspn(p, ",");
        if (*p) p++;
        if (n < 1) continue;
        chain c[2];
        pdde_status st = chain_open(ctx, dev, n, layers, 0, &c[0]);
        if (!st) st = chain_open(ctx, dev, n, layers, 1, &c[1]);
        double host[2][64], wall[2][64];
        for (int r = 0; r < reps && !st; r++)
            for (int k = 0; k < 2 && !st; k++) st = chain_time(&c[k], steps, layers, &host[k][r], &wall[k][r]);
        float *y0 = malloc((size_t)n * n * sizeof *y0), *y1 = malloc((size_t)n * n * sizeof *y1);
        double diff = NAN;
        if (!st && y0 && y1 && !(st = pdde_session_read(c[0].s, c[0].y, y0, (size_t)n * n * sizeof *y0)) &&
            !(st = pdde_session_read(c[1].s, c[1].y, y1, (size_t)n * n * sizeof *y1))) {
            double big = 0, d = 0;
            for (int i = 0; i < n * n; i++) {
                if (!(fabs((double)y0[i] - y1[i]) <= d)) d = fabs((double)y0[i] - y1[i]);
                if (fabs((double)y0[i]) > big) big = fabs((double)y0[i]);
            }
            diff = d / big;
        }
        free(y0), free(y1);
        chain_close(&c[0]), chain_close(&c[1]);
        if (st) {
            fprintf(stderr, "bench_ocl_gemm: n %d: %s\n", n, pdde_last_error(ctx));
            rc = 1;
            break;
        }
        double hc = bench_median(host[0], reps), hb = bench_median(host[1], reps), wc = bench_median(wall[0], reps), wb = bench_median(wall[1], reps);
        printf("n %4d  CLBlast: host %7.2f us  wall %8.2f us   k_gemm: host %7.2f us  wall %8.2f us   (a matmul; outputs differ by %.2g of the largest)\n", n,
               hc, wc, hb, wb, diff);
        size_t at = strlen(result);
        snprintf(result + at, sizeof result - at, " n=%d host_us_clblast=%.2f host_us_builtin=%.2f host_ratio=%.2f wall_us_clblast=%.2f wall_us_builtin=%.2f wall_ratio=%.2f",
                 n, hc, hb, hb / hc, wc, wb, wb / wc);
    }
    printf("%s\n", result);
    pdde_context_free(ctx);
    return rc;
}
