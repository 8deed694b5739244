/* bench_sparse_feed — pdde_sparse_batch_feed (the rows the batch reads: its unique ids' rows and the zero row)
 * against writing the whole local table and the ids, as a feed of every row does, in the same run on the same
 * batches, alternating which goes first. DLRM's shape by default: batch 256, 26 fields, one id a bag, dim 16
 * (a [6657, 16] table), ids drawn from 20000 (about 5700 unique a batch); --ids-from 1000 gives about 1000.
 * Medians over the batches, then over R repeats.
 * Last line:
 *   RESULT sparse_feed device=<backend> unique=.. table_rows=.. us_feed=.. us_whole_table=.. ratio=<feed / whole>
 *
 *   bench_sparse_feed [--backend cpu|opencl|cuda] [--ids-from N] [--batches N] [--reps R] */
#include "pdde.h"
#include "bench_common.h"
#include "bench_sparse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 256, F = 26, C = 16, ROWS = B * F + 1 };

int main(int argc, char **argv) {
    const char *fam = "opencl";
    int from = 20000, batches = 200, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend")) fam = argv[i + 1];
        else if (!strcmp(argv[i], "--ids-from")) from = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batches")) batches = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--backend cpu|opencl|cuda] [--ids-from N] [--batches N] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (from < 1 || batches < 1 || reps < 1) {
        fprintf(stderr, "bench_sparse_feed: --ids-from, --batches and --reps must be positive\n");
        return 2;
    }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) return 1;
    int dev = pdde_device_find(ctx, fam, 0);
    if (dev < 0) {
        fprintf(stderr, "bench_sparse_feed: no %s device\n", fam);
        return 1;
    }
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = C, pp.table.init_std = 0.1f, pp.table.seed = 1;
    bench_sparse b;
    pdde_status st = bench_sparse_init(ctx, dev, B, F, C, &pp, &b);
    pdde_tensor *table = pdde_graph_find(b.g, "e.rows"), *ids_in = pdde_graph_find(b.g, "e.ids");
    uint64_t *ids = malloc((size_t)B * F * sizeof *ids);
    int32_t *local = malloc((size_t)B * F * sizeof *local);
    float *whole = malloc((size_t)ROWS * C * sizeof *whole);
    double *tf = malloc((size_t)batches * sizeof *tf), *tw = malloc((size_t)batches * sizeof *tw);
    double *mf = malloc((size_t)reps * sizeof *mf), *mw = malloc((size_t)reps * sizeof *mw);
    if (!ids || !local || !whole || !tf || !tw || !mf || !mw) return 1;
    for (int i = 0; i < ROWS * C; i++) whole[i] = (float)i * 1e-6f;
    for (int i = 0; i < B * F; i++) local[i] = i;
    uint32_t r = 12345;
    for (int rep = 0; rep < reps && !st; rep++) {
        for (int i = 0; i < batches && !st; i++) {
            bench_sparse_ids(&r, ids, B * F, (uint32_t)from);
            st = pdde_sparse_batch_pull(b.sb, b.c, ids);
            for (int k = 0; k < 2 && !st; k++) {
                int feed = (k + i) % 2;
                double t0 = bench_now();
                if (feed) st = pdde_sparse_batch_feed(b.sb, b.s);
                else {
                    st = pdde_session_write(b.s, table, whole, (size_t)ROWS * C * sizeof *whole);
                    if (!st) st = pdde_session_write(b.s, ids_in, local, (size_t)B * F * sizeof *local);
                }
                (feed ? tf : tw)[i] = 1e6 * (bench_now() - t0);
            }
        }
        if (!st) mf[rep] = bench_median(tf, batches), mw[rep] = bench_median(tw, batches);
    }
    if (st) {
        fprintf(stderr, "bench_sparse_feed: %s\n", pdde_last_error(ctx));
        return 1;
    }
    double f = bench_median(mf, reps), w = bench_median(mw, reps);
    printf("%s: feed of %lld unique rows %.1f us, the whole table [%d, %d] and the ids %.1f us\n", fam,
           (long long)pdde_sparse_batch_unique_count(b.sb), f, ROWS, C, w);
    printf("RESULT sparse_feed device=%s unique=%lld table_rows=%d us_feed=%.1f us_whole_table=%.1f ratio=%.3f\n", fam,
           (long long)pdde_sparse_batch_unique_count(b.sb), ROWS, f, w, f / w);
    free(ids), free(local), free(whole), free(tf), free(tw), free(mf), free(mw);
    bench_sparse_free(&b);
    pdde_context_free(ctx);
    return 0;
}
