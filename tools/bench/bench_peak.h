/* bench_peak.h — this machine's floating-point limit: FMA throughput on T threads, f32 and bf16, so that
 * GEMM results can be stated as a fraction of it (bench_peak prints it; bench_ops divides by it).
 *
 * Each thread runs independent chains of fused multiply-adds on registers only (no memory traffic):
 * f32 with AVX-512 vfmadd231ps (32 flops per instruction), else AVX2 FMA (16); bf16 with AVX512-BF16
 * vdpbf16ps (32 bf16 products summed into 16 f32 lanes: 64 flops). Enough chains cover the latency of
 * two FMA pipes. A processor without the instructions reports NaN for what it cannot measure. */
#ifndef PDDE_BENCH_PEAK_H
#define PDDE_BENCH_PEAK_H
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define PEAK_CHAINS 16

static inline double peak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The kernels are compiled for their instruction sets whatever the build's -march (the default build
 * targets baseline x86-64) and run only where the processor has them (peak_has_*, from cpuid). */
#define PEAK_AVX512 __attribute__((target("avx512f,fma")))
#define PEAK_AVX2 __attribute__((target("avx2,fma")))
#define PEAK_BF16 __attribute__((target("avx512f,avx512bf16")))

static inline int peak_has_avx512(void) { return __builtin_cpu_supports("avx512f"); }
static inline int peak_has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
static inline int peak_has_bf16(void) {
    unsigned a, b, c, d; /* cpuid leaf 7 subleaf 1, eax bit 5: AVX512_BF16 (older compilers cannot name it) */
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    return peak_has_avx512() && (a >> 5 & 1);
}

PEAK_AVX512 static double peak_f32_avx512(int64_t iters, float *sink) {
    __m512 acc[PEAK_CHAINS], m = _mm512_set1_ps(0.999f), a = _mm512_set1_ps(1e-3f);
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (int64_t i = 0; i < iters; i++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    for (int c = 1; c < PEAK_CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    *sink = _mm512_reduce_add_ps(acc[0]);
    return 32.0 * PEAK_CHAINS * (double)iters;
}

PEAK_AVX2 static double peak_f32_avx2(int64_t iters, float *sink) {
    __m256 acc[PEAK_CHAINS], m = _mm256_set1_ps(0.999f), a = _mm256_set1_ps(1e-3f);
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    for (int64_t i = 0; i < iters; i++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    float out[8];
    for (int c = 1; c < PEAK_CHAINS; c++) acc[0] = _mm256_add_ps(acc[0], acc[c]);
    _mm256_storeu_ps(out, acc[0]);
    *sink = out[0] + out[7];
    return 16.0 * PEAK_CHAINS * (double)iters;
}

PEAK_BF16 static double peak_bf16_avx512(int64_t iters, float *sink) {
    __m512 acc[PEAK_CHAINS];
    __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
    __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
    for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (int64_t i = 0; i < iters; i++)
        for (int c = 0; c < PEAK_CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
    for (int c = 1; c < PEAK_CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    *sink = _mm512_reduce_add_ps(acc[0]);
    return 64.0 * PEAK_CHAINS * (double)iters;
}

/* f32: returns the flops done (0 when the processor has no FMA) and a value that depends on every result */
static double peak_f32_kernel(int64_t iters, float *sink) {
    if (peak_has_avx512()) return peak_f32_avx512(iters, sink);
    if (peak_has_avx2()) return peak_f32_avx2(iters, sink);
    *sink = 0;
    return 0;
}

static double peak_bf16_kernel(int64_t iters, float *sink) {
    if (peak_has_bf16()) return peak_bf16_avx512(iters, sink);
    *sink = 0;
    return 0;
}

typedef struct {
    int bf16;
    int64_t iters;
    double flops;
    float sink;
    int *go; /* 0: wait, 1: run, -1: give up (not every thread could start) */
} peak_thread;

static void *peak_thread_main(void *arg) {
    peak_thread *p = arg;
    int go;
    while ((go = __atomic_load_n(p->go, __ATOMIC_ACQUIRE)) == 0) _mm_pause();
    if (go > 0) p->flops = p->bf16 ? peak_bf16_kernel(p->iters, &p->sink) : peak_f32_kernel(p->iters, &p->sink);
    return NULL;
}

/* GFLOP/s of `threads` threads running the kernel together (each about `seconds` long on an idle
 * core), best of `reps` runs: the limit is what the hardware can do, so the best run measures it. */
static double peak_gflops(int bf16, int threads, double seconds, int reps) {
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    float sink;
    int64_t iters = 1 << 12;
    for (;;) { /* calibrate on one thread */
        double t0 = peak_now(), f = bf16 ? peak_bf16_kernel(iters, &sink) : peak_f32_kernel(iters, &sink);
        double dt = peak_now() - t0;
        if (f == 0) return NAN;
        if (dt > seconds / 8 || iters > (int64_t)1 << 40) { iters = (int64_t)((double)iters * seconds / dt) + 1; break; }
        iters *= 4;
    }
    double best = 0;
    for (int r = 0; r < reps; r++) {
        peak_thread pt[256];
        pthread_t th[256];
        int go = 0, started = 0;
        for (int i = 0; i < threads; i++) {
            pt[i] = (peak_thread){.bf16 = bf16, .iters = iters, .go = &go};
            if (pthread_create(&th[i], NULL, peak_thread_main, &pt[i]) != 0) break;
            started++;
        }
        double t0 = peak_now();
        __atomic_store_n(&go, started == threads ? 1 : -1, __ATOMIC_RELEASE);
        double flops = 0;
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL), flops += pt[i].flops;
        if (started < threads) return NAN;
        double g = flops / (peak_now() - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}
#endif
