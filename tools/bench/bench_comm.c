/* bench_comm.c — pdde allreduce against OpenMPI's MPI_Allreduce, 8 B to 256 MiB, on 2 and 4 ranks.
 *
 *   bench_comm [BUILD_DIR] [MAX_BYTES]     the driver (what `make bench-comm` runs): starts
 *       pdde-run -n N bench_comm --worker   and   mpirun -np N mpi_allreduce   for N = 2, 4, and prints
 *       latency and bus bandwidth (algbw * 2(n-1)/n) per size, medians of repeats. The last line:
 *       RESULT allreduce ratio_1m=.. ratio_16m=.. ratio_64m=.. lat_ratio_8b=..
 *       (pdde busbw / MPI busbw at 1, 16, 64 MiB on 2 ranks; pdde latency / MPI latency at 8 B). */
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
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXS 32

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int worker(size_t max) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_comm *c;
    if (pdde_comm_init(ctx, NULL, &c)) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    float *buf = calloc(max / 4 + 1, 4);
    int rc = 0;
    for (size_t bytes = 8; bytes <= max && !rc; bytes = bench_next_size(bytes)) {
        size_t count = bytes / 4;
        int iters = bench_iters(bytes), reps = bench_reps(bytes);
        double t[16];
        rc |= pdde_comm_allreduce(c, buf, buf, count, PDDE_F32, PDDE_REDUCE_SUM); /* warm-up */
        for (int r = 0; r < reps && !rc; r++) {
            rc |= pdde_comm_barrier(c);
            double t0 = now_s();
            for (int i = 0; i < iters && !rc; i++) rc |= pdde_comm_allreduce(c, buf, buf, count, PDDE_F32, PDDE_REDUCE_SUM);
            t[r] = (now_s() - t0) / iters;
        }
        if (rc) fprintf(stderr, "allreduce: %s\n", pdde_last_error(ctx));
        else if (pdde_comm_rank(c) == 0) printf("RES %zu %.9g %s\n", bytes, bench_median(t, reps), pdde_comm_last_algo(c));
        fflush(stdout);
    }
    free(buf);
    pdde_comm_free(c);
    pdde_context_free(ctx);
    return rc ? 1 : 0;
}

/* Runs cmd and collects its "RES bytes seconds" lines (with or without a "[0] " prefix). */
static int collect(const char *cmd, size_t *sizes, double *lat) {
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        char *s = strstr(line, "RES ");
        size_t b;
        double t;
        if (s && n < MAXS && sscanf(s, "RES %zu %lf", &b, &t) == 2) { sizes[n] = b; lat[n++] = t; }
        else fputs(line, stderr);
    }
    int st = pclose(p);
    if (st) fprintf(stderr, "bench_comm: '%s' failed (status 0x%x)\n", cmd, st);
    return n;
}

static double find(const size_t *sizes, const double *v, int n, size_t bytes) {
    for (int i = 0; i < n; i++) if (sizes[i] == bytes) return v[i];
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--worker")) return worker(argc > 2 ? strtoull(argv[2], NULL, 10) : 256u << 20);
    const char *build = argc > 1 ? argv[1] : "build";
    size_t max = argc > 2 ? strtoull(argv[2], NULL, 10) : (size_t)256 << 20;
    double ratio[3] = {0}, lat_ratio = 0;
    for (int n = 2; n <= 4; n += 2) {
        char cmd[1024];
        size_t s1[MAXS], s2[MAXS];
        double l1[MAXS], l2[MAXS];
        snprintf(cmd, sizeof cmd, "%s/pdde-run -n %d %s/bench_comm --worker %zu 2>&1", build, n, build, max);
        int n1 = collect(cmd, s1, l1);
        snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np %d %s/mpi_allreduce %zu 2>&1", n, build, max);
        int n2 = collect(cmd, s2, l2);
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
    printf("RESULT allreduce ratio_1m=%.3f ratio_16m=%.3f ratio_64m=%.3f lat_ratio_8b=%.3f\n", ratio[0], ratio[1], ratio[2],
           lat_ratio);
    return 0;
}
#endif
