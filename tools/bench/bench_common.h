/* bench_common.h — what bench_comm.c (pdde) and mpi_allreduce.c (OpenMPI) share, so that both sides
 * measure exactly the same way: message sizes, iterations per sample, repeats and the median; the
 * clock and the sort order of times of pdde-bench and the other benchmarks. */
#ifndef PDDE_BENCH_COMMON_H
#define PDDE_BENCH_COMMON_H
#include <math.h>
#include <stdlib.h>
#include <time.h>

/* 8 B, then 64 B and powers of 4 from there: 1 MiB, 16 MiB, 64 MiB and 256 MiB are among them. */
static inline size_t bench_next_size(size_t bytes) { return bytes == 8 ? 64 : bytes * 4; }
/* enough operations per sample to last a few milliseconds at least */
static inline int bench_iters(size_t bytes) {
    size_t it = bytes >= (32u << 20) ? 1 : (32u << 20) / bytes;
    return it > 1000 ? 1000 : (int)it;
}
static inline int bench_reps(size_t bytes) { return bytes >= (64u << 20) ? 3 : 7; }

static inline int bench_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* the median of t[n] (sorts t; an even n: the mean of the middle two; none: NaN) */
static inline double bench_median(double *t, int n) {
    if (n <= 0) return NAN;
    qsort(t, (size_t)n, sizeof *t, bench_cmp);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}
/* seconds on the monotonic clock */
static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif
