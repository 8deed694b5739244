/* bench_sparse_collect — pdde_sparse_batch_collect with the sparse table's gradient on an accelerator: the
 * accumulator zeroed by the backend's zero slot (a device fill) against the same backend without the slot
 * (the session writes zeros from the host: the table's bytes over the bus every batch), in the same run on
 * the same batches. DLRM's shape by default: batch 256, 26 fields, one id a bag, dim 16 (a [6657, 16]
 * table, 426 KB), ids drawn from 20000 (about 5700 unique a batch). Per collect: wall and the calling
 * thread's CPU time, medians over the batches, then over R repeats (the two alternate).
 * Last line:
 *   RESULT sparse_collect device=<backend> us_zero_slot=.. us_host_zeros=.. ratio=<zero slot / host zeros>
 *          host_us_zero_slot=.. host_us_host_zeros=.. table_kb=..
 *
 *   bench_sparse_collect [--backend opencl|cuda] [--batch B] [--fields F] [--dim C] [--batches N] [--reps R]
 * (CUDA: its zero slot runs under PDDE_CUDA_ZERO=1; without it both sides write zeros from the host) */
#include "pdde_extension.h"
#include "bench_common.h"
#include "bench_sparse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* one repeat on context ctx's first device of backend fam: medians of collect's wall and host time (us) */
static pdde_status run(pdde_context *ctx, const char *fam, int B, int F, int C, int batches, double *wall, double *host) {
    int dev = pdde_device_find(ctx, fam, 0);
    if (dev < 0) return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no %s device", fam);
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = C, pp.table.optimizer = PDDE_PS_SGD, pp.table.lr = 0.1f, pp.table.init_std = 0.1f, pp.table.seed = 1;
    bench_sparse b;
    pdde_status st = bench_sparse_init(ctx, dev, B, F, C, &pp, &b);
    uint64_t *ids = malloc((size_t)B * F * sizeof *ids);
    double *tw = malloc((size_t)batches * sizeof *tw), *th = malloc((size_t)batches * sizeof *th);
    if (!st && (!ids || !tw || !th)) st = PDDE_ERR_OOM;
    uint32_t r = 12345;
    for (int i = 0; i < batches + 3 && !st; i++) { /* (3 warm-up batches) */
        bench_sparse_ids(&r, ids, B * F, 20000);
        st = pdde_sparse_batch_pull(b.sb, b.c, ids);
        if (!st) st = pdde_sparse_batch_feed(b.sb, b.s);
        if (!st) st = pdde_session_run(b.s, PDDE_RUN_FORWARD_BACKWARD);
        double w0 = bench_now(), h0 = thread_s();
        if (!st) st = pdde_sparse_batch_collect(b.sb, b.s);
        if (i >= 3) tw[i - 3] = 1e6 * (bench_now() - w0), th[i - 3] = 1e6 * (thread_s() - h0);
        if (!st) st = pdde_sparse_batch_push(b.sb, b.c);
    }
    if (!st) *wall = bench_median(tw, batches), *host = bench_median(th, batches);
    free(ids), free(tw), free(th);
    bench_sparse_free(&b);
    return st;
}

int main(int argc, char **argv) {
    const char *fam = "opencl";
    int B = 256, F = 26, C = 16, batches = 30, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend")) fam = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--fields")) F = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) C = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batches")) batches = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "bench_sparse_collect: unknown option %s\n", argv[i]); return 2; }
    }
    if (B < 1 || F < 1 || C < 1 || batches < 1 || reps < 1 || reps > 64 || (strcmp(fam, "opencl") && strcmp(fam, "cuda"))) {
        fprintf(stderr, "bench_sparse_collect: bad arguments\n");
        return 2;
    }
    /* the backend as it is, and the same backend under another name without its zero slot */
    char list[64], plain_name[32];
    snprintf(list, sizeof list, "cpu,%s", fam);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = list, cp.n_threads = 1;
    pdde_context *ctx = NULL, *plain_ctx = NULL;
    if (pdde_context_init(&cp, &ctx)) { fprintf(stderr, "bench_sparse_collect: no context\n"); return 1; }
    const pdde_backend_iface *iface = NULL;
    void *dev = NULL;
    int at = pdde_device_find(ctx, fam, 0);
    if (at < 0 || pdde_device_backend(ctx, at, &iface, &dev)) {
        printf("no %s device\nRESULT sparse_collect device=%s us_zero_slot=nan us_host_zeros=nan ratio=nan host_us_zero_slot=nan host_us_host_zeros=nan table_kb=nan\n",
               fam, fam);
        pdde_context_free(ctx);
        return 0;
    }
    static pdde_backend_iface plain;
    plain = *iface, plain.zero = NULL;
    snprintf(plain_name, sizeof plain_name, "%s_plain", fam);
    plain.name = plain_name;
    const pdde_backend_iface *extra[1] = {&plain};
    snprintf(list, sizeof list, "cpu,%s", plain_name);
    pdde_context_params cp2 = cp;
    cp2.backends = list, cp2.extra_backends = extra, cp2.n_extra_backends = 1;
    if (pdde_context_init(&cp2, &plain_ctx)) { fprintf(stderr, "bench_sparse_collect: no second context\n"); return 1; }
    double kb = (double)((int64_t)B * F + 1) * C * 4 / 1e3;
    printf("bench_sparse_collect: %s, table [%lld, %d] (%.0f KB), %d batches, %d reps (medians)\n", fam, (long long)B * F + 1, C, kb, batches, reps);
    double w[2][64], h[2][64];
    pdde_status st = PDDE_OK;
    for (int rep = 0; rep < reps && !st; rep++) {
        st = run(ctx, fam, B, F, C, batches, &w[0][rep], &h[0][rep]);
        if (!st) st = run(plain_ctx, plain_name, B, F, C, batches, &w[1][rep], &h[1][rep]);
        if (st) fprintf(stderr, "bench_sparse_collect: %s / %s\n", pdde_last_error(ctx), pdde_last_error(plain_ctx));
    }
    int rc = st != PDDE_OK;
    if (!st) {
        double wz = bench_median(w[0], reps), wh = bench_median(w[1], reps), hz = bench_median(h[0], reps), hh = bench_median(h[1], reps);
        printf("collect: zero slot %.1f us (host %.1f us), zeros from the host %.1f us (host %.1f us)\n", wz, hz, wh, hh);
        printf("RESULT sparse_collect device=%s us_zero_slot=%.1f us_host_zeros=%.1f ratio=%.2f host_us_zero_slot=%.1f host_us_host_zeros=%.1f table_kb=%.0f\n",
               fam, wz, wh, wz / wh, hz, hh, kb);
    }
    pdde_context_free(plain_ctx);
    pdde_context_free(ctx);
    return rc;
}
