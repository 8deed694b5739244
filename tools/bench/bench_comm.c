/* bench_comm.c — pdde allreduce against OpenMPI's MPI_Allreduce, 8 B to 256 MiB, on 2 and 4 ranks;
 * pdde's reduce-scatter, allgather and broadcast on the one-host shared-memory channel against the
 * same on the transport (PDDE_COMM_SHM=0, what they ran on before the channel served them).
 *
 *   bench_comm [BUILD_DIR] [MAX_BYTES]     the driver (what `make bench-comm` runs): starts
 *       pdde-run -n N bench_comm --worker   and   mpirun -np N mpi_allreduce   for N = 2, 4, and prints
 *       latency and bus bandwidth (algbw * 2(n-1)/n) per size, medians of repeats; then
 *       pdde-run -n N bench_comm --worker MAX COLLECTIVE with and without PDDE_COMM_SHM=0 (sizes up to
 *       16 MiB: the whole message, NCCL-tests' convention: a reduce-scatter's input, an allgather's
 *       output). The last line:
 *       RESULT allreduce ratio_1m=.. ratio_16m=.. ratio_64m=.. lat_ratio_8b=.. rs_shm_64k=.. rs_shm_16m=..
 *              ag_shm_64k=.. ag_shm_16m=.. bc_shm_64k=.. bc_shm_16m=..
 *       (pdde busbw / MPI busbw at 1, 16, 64 MiB on 2 ranks; pdde latency / MPI latency at 8 B;
 *       transport time / shared-memory time of reduce-scatter, allgather, broadcast on 2 ranks). */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    fprintf(stderr, "this tool needs pdde built with comm (UCX)\n");
    return 1;
}
#else
#include "bench_common.h"
#include "bench_collect.h"
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXS 32

static const char *const COLLECTIVES[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

/* One collective of `bytes` (the whole message; per rank count / n for reduce-scatter and allgather). */
static pdde_status run_one(pdde_comm *c, int coll, float *buf, float *out, size_t count) {
    size_t part = count / (size_t)pdde_comm_size(c) ? count / (size_t)pdde_comm_size(c) : 1;
    switch (coll) {
    case 0: return pdde_comm_allreduce(c, buf, buf, count, PDDE_F32, PDDE_REDUCE_SUM);
    case 1: return pdde_comm_reduce_scatter(c, buf, out, part, PDDE_F32, PDDE_REDUCE_SUM);
    case 2: return pdde_comm_allgather(c, buf, out, part, PDDE_F32);
    default: return pdde_comm_broadcast(c, buf, count, PDDE_F32, 0);
    }
}

static int worker(size_t max, const char *what) {
    int coll = 0;
    while (what && coll < 3 && strcmp(what, COLLECTIVES[coll])) coll++;
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_comm *c;
    if (pdde_comm_init(ctx, NULL, &c)) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    size_t room = max / 4 + (size_t)pdde_comm_size(c); /* (a part of at least one element per rank) */
    float *buf = calloc(room, 4), *out = calloc(room, 4);
    int rc = 0;
    for (size_t bytes = 8; bytes <= max && !rc; bytes = bench_next_size(bytes)) {
        size_t count = bytes / 4;
        int iters = bench_iters(bytes), reps = bench_reps(bytes);
        double t[16];
        rc |= run_one(c, coll, buf, out, count); /* warm-up */
        for (int r = 0; r < reps && !rc; r++) {
            rc |= pdde_comm_barrier(c);
            double t0 = bench_now();
            for (int i = 0; i < iters && !rc; i++) rc |= run_one(c, coll, buf, out, count);
            t[r] = (bench_now() - t0) / iters;
        }
        if (rc) fprintf(stderr, "%s: %s\n", COLLECTIVES[coll], pdde_last_error(ctx));
        else if (pdde_comm_rank(c) == 0) printf("RES %zu %.9g %s\n", bytes, bench_median(t, reps), pdde_comm_last_algo(c));
        fflush(stdout);
    }
    free(buf), free(out);
    pdde_comm_free(c);
    pdde_context_free(ctx);
    return rc ? 1 : 0;
}

static double find(const size_t *sizes, const double *v, int n, size_t bytes) {
    for (int i = 0; i < n; i++) if (sizes[i] == bytes) return v[i];
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--worker"))
        return worker(argc > 2 ? strtoull(argv[2], NULL, 10) : 256u << 20, argc > 3 ? argv[3] : NULL);
    const char *build = argc > 1 ? argv[1] : "build";
    size_t max = argc > 2 ? strtoull(argv[2], NULL, 10) : (size_t)256 << 20;
    double ratio[3] = {0}, lat_ratio = 0;
    for (int n = 2; n <= 4; n += 2) {
        char cmd[1024];
        size_t s1[MAXS], s2[MAXS];
        double l1[MAXS], l2[MAXS];
        snprintf(cmd, sizeof cmd, "%s/pdde-run -n %d %s/bench_comm --worker %zu 2>&1", build, n, build, max);
        int n1 = bench_collect("bench_comm", cmd, s1, l1, MAXS);
        snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np %d %s/mpi_allreduce %zu 2>&1", n, build, max);
        int n2 = bench_collect("bench_comm", cmd, s2, l2, MAXS);
        double f = 2.0 * (n - 1) / n;
        printf("\nallreduce f32 sum, %d ranks (one host, %ld cores)\n", n, sysconf(_SC_NPROCESSORS_ONLN));
        printf("%12s %12s %12s %12s %12s %8s\n", "bytes", "pdde us", "mpi us", "pdde GB/s", "mpi GB/s", "ratio");
        for (int i = 0; i < n1; i++) {
            double lm = find(s2, l2, n2, s1[i]);
            double bp = s1[i] / l1[i] * f / 1e9, bm = lm > 0 ? s1[i] / lm * f / 1e9 : 0;
            printf("%12zu %12.2f %12.2f %12.3f %12.3f %8.2f\n", s1[i], l1[i] * 1e6, lm * 1e6, bp, bm, bm > 0 ? bp / bm : 0);
            if (n == 2) {
                double r = bm > 0 ? bp / bm : 0;
                if (s1[i] == 1u << 20) ratio[0] = r;
                if (s1[i] == 16u << 20) ratio[1] = r;
                if (s1[i] == 64u << 20) ratio[2] = r;
                if (s1[i] == 8 && lm > 0) lat_ratio = l1[i] / lm;
            }
        }
        fflush(stdout);
    }
    /* reduce-scatter, allgather, broadcast: shared memory against the transport */
    double shm_gain[3][2] = {{0}};
    size_t small_max = max < (16u << 20) ? max : 16u << 20;
    for (int coll = 1; coll < 4; coll++)
        for (int n = 2; n <= 4; n += 2) {
            char cmd[1024];
            size_t s1[MAXS], s2[MAXS];
            double l1[MAXS], l2[MAXS];
            snprintf(cmd, sizeof cmd, "%s/pdde-run -n %d %s/bench_comm --worker %zu %s 2>&1", build, n, build, small_max, COLLECTIVES[coll]);
            int n1 = bench_collect("bench_comm", cmd, s1, l1, MAXS);
            snprintf(cmd, sizeof cmd, "PDDE_COMM_SHM=0 %s/pdde-run -n %d %s/bench_comm --worker %zu %s 2>&1", build, n, build, small_max,
                     COLLECTIVES[coll]);
            int n2 = bench_collect("bench_comm", cmd, s2, l2, MAXS);
            printf("\n%s f32, %d ranks: shared memory against the transport\n", COLLECTIVES[coll], n);
            printf("%12s %12s %12s %8s\n", "bytes", "shm us", "ucx us", "ucx/shm");
            for (int i = 0; i < n1; i++) {
                double lu = find(s2, l2, n2, s1[i]), gain = lu > 0 ? lu / l1[i] : 0;
                printf("%12zu %12.2f %12.2f %8.2f\n", s1[i], l1[i] * 1e6, lu * 1e6, gain);
                if (n == 2 && s1[i] == 64u << 10) shm_gain[coll - 1][0] = gain;
                if (n == 2 && s1[i] == 16u << 20) shm_gain[coll - 1][1] = gain;
            }
            fflush(stdout);
        }
    printf("RESULT allreduce ratio_1m=%.3f ratio_16m=%.3f ratio_64m=%.3f lat_ratio_8b=%.3f rs_shm_64k=%.3f rs_shm_16m=%.3f "
           "ag_shm_64k=%.3f ag_shm_16m=%.3f bc_shm_64k=%.3f bc_shm_16m=%.3f\n",
           ratio[0], ratio[1], ratio[2], lat_ratio, shm_gain[0][0], shm_gain[0][1], shm_gain[1][0], shm_gain[1][1], shm_gain[2][0],
           shm_gain[2][1]);
    return 0;
}
#endif
