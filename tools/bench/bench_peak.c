/* bench_peak — this machine's FMA limit, f32 and bf16, on 1 thread and on T threads (bench_peak.h).
 *
 *   bench_peak [--threads T] [--seconds S] [--reps N]     (defaults: all cores, 0.2 s, 5)
 *
 * Best of N runs (the limit is what the best run reaches; a loaded machine only lowers it). Last line:
 * RESULT peak_fma threads=T f32_gflops=<T threads> bf16_gflops=<T threads> f32_1t=<1 thread> bf16_1t=<> */
#define _GNU_SOURCE
#include "tools/bench/bench_peak.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), reps = 5;
    double seconds = 0.2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads T] [--seconds S] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    if (reps < 1) reps = 1;
    double f1 = peak_gflops(0, 1, seconds, reps), b1 = peak_gflops(1, 1, seconds, reps);
    double ft = peak_gflops(0, threads, seconds, reps), bt = peak_gflops(1, threads, seconds, reps);
    printf("FMA peak, best of %d, GFLOP/s:   1 thread   %d threads\n", reps, threads);
    printf("  f32  (%-20s) %9.1f %11.1f\n", peak_has_avx512() ? "AVX-512 vfmadd231ps" : "AVX2 vfmadd231ps", f1, ft);
    printf("  bf16 (%-20s) %9.1f %11.1f\n", "AVX512-BF16 vdpbf16ps", b1, bt);
    printf("RESULT peak_fma threads=%d f32_gflops=%.1f bf16_gflops=%.1f f32_1t=%.1f bf16_1t=%.1f\n", threads, ft, bt, f1, b1);
    return 0;
}
