/* test_util.h — the tiny test harness every test uses: CHECK counts, test_skip records what was not
 * run and why, test_close_all compares runs (NaN fails), and the last line is
 * "N passed, N failed, N skipped" (tests/run_tests.sh sums them). */
#ifndef PDDE_TEST_UTIL_H
#define PDDE_TEST_UTIL_H
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int test_passed, test_failed, test_skipped;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (cond) test_passed++;                                                  \
        else {                                                                    \
            test_failed++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
        }                                                                         \
    } while (0)

/* Relative-or-absolute closeness: |a-b| <= atol + rtol*|b|. */
static inline int test_close(double a, double b, double rtol, double atol) {
    return isfinite(a) && fabs(a - b) <= atol + rtol * fabs(b);
}

/* How much slower than an idle machine this one may run a process: the last minute's load per core
 * where above 1, at most 4 (1 when unknown). Bounds on detection times scale by it, so that a loaded
 * machine's scheduling delays do not decide a verdict, while a hang (an operation timeout of a minute)
 * still stands apart. */
static inline double test_load_factor(void) {
    double load = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    FILE *f = fopen("/proc/loadavg", "r");
    int ok = f && fscanf(f, "%lf", &load) == 1 && cores > 0;
    if (f) fclose(f);
    double per_core = ok ? load / (double)cores : 1;
    return per_core < 1 ? 1 : per_core > 4 ? 4 : per_core;
}

/* A part of the test that did not run. kind names what was missing, so that CI can refuse some:
 * run_tests.sh fails "opencl" and "netns" skips when PDDE_REQUIRE_ALL=1 (CI has PoCL and namespaces);
 * others ("asan", "cuda", "ucx", ...) are only reported. Prints "SKIP kind: reason". */
static inline void test_skip(const char *kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP %s: ", kind);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    test_skipped++;
}

/* The worst element of a comparison of got against want: e[i] = |got - want| / max(|want|, floor)
 * (relative, absolute below floor). A non-finite value on either side makes e infinite, so NaN can
 * never pass. */
typedef struct { double worst, got, want; size_t index; } test_diff;

static inline test_diff test_diff_f32(const float *got, const float *want, size_t n, double floor) {
    test_diff d = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i], den = fabs(w) > floor ? fabs(w) : floor;
        double e = !isfinite(g) || !isfinite(w) ? INFINITY : g == w ? 0 : fabs(g - w) / den; /* (den 0: any difference is infinite) */
        if (i == 0 || e > d.worst) d.worst = e, d.got = g, d.want = w, d.index = i;
    }
    return d;
}

/* One CHECK that every element of got is within tol of want (as test_diff_f32 measures it); the
 * message names the worst element, its index, both values and the tolerance. Returns the worst
 * difference (infinity when a value is not finite), for the test to print what it measured. */
static inline double test_close_all_at(const char *file, int line, const char *what, const float *got, const float *want,
                                       size_t n, double floor, double tol) {
    test_diff d = test_diff_f32(got, want, n, floor);
    if (d.worst <= tol) test_passed++;
    else {
        test_failed++;
        fprintf(stderr, "FAIL %s:%d: %s: element %zu is %.9g, expected %.9g: difference %.3g > tolerance %.3g (relative, absolute below %.3g)\n",
                file, line, what, d.index, d.got, d.want, d.worst, tol, floor);
    }
    return d.worst;
}
#define test_close_all(what, got, want, n, floor, tol) test_close_all_at(__FILE__, __LINE__, what, got, want, n, floor, tol)

/* A checkpoint file read whole (format in README.md), to compare the tensors two runs saved: every
 * tensor is whole in the file whatever plan wrote it, so this is how a test gathers a distributed
 * run's parameters and optimizer state. */
typedef struct { char *buf; size_t len; uint32_t version, n_tensors; uint64_t step, data_position; } test_ckpt;

static inline int test_ckpt_read(const char *path, test_ckpt *c) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    c->buf = len > 44 ? malloc((size_t)len) : NULL;
    int ok = c->buf && fread(c->buf, 1, (size_t)len, f) == (size_t)len && !memcmp(c->buf, "PDDECKPT", 8);
    fclose(f);
    if (!ok) { free(c->buf); c->buf = NULL; return -1; }
    c->len = (size_t)len;
    memcpy(&c->version, c->buf + 8, 4), memcpy(&c->n_tensors, c->buf + 12, 4);
    memcpy(&c->step, c->buf + 16, 8), memcpy(&c->data_position, c->buf + 24, 8);
    return 0;
}

/* Tensor i of the file: its name (not NUL-terminated: name_len), dtype and data. */
typedef struct { const char *name; int name_len, dtype; const void *data; uint64_t nbytes; } test_ckpt_tensor;

static inline int test_ckpt_tensor_at(const test_ckpt *c, uint32_t i, test_ckpt_tensor *t) {
    size_t o = 48 + (c->version >= 3 ? 28 : 0); /* (version 3 added the learning-rate schedule) */
    for (uint32_t k = 0; k <= i; k++) {
        uint16_t nl, al = 0;
        uint8_t ndim;
        if (o + 2 > c->len) return -1;
        memcpy(&nl, c->buf + o, 2);
        t->name = c->buf + o + 2, t->name_len = nl, o += 2 + nl;
        if (o + 2 > c->len) return -1;
        t->dtype = (unsigned char)c->buf[o], ndim = (uint8_t)c->buf[o + 1], o += 2 + 8 * (size_t)ndim;
        if (c->version >= 2) {
            if (o + 2 > c->len) return -1;
            memcpy(&al, c->buf + o, 2), o += 2 + al;
        }
        if (o + 8 > c->len) return -1;
        memcpy(&t->nbytes, c->buf + o, 8), o += 8;
        if (t->nbytes > c->len - o) return -1;
        t->data = c->buf + o, o += t->nbytes;
    }
    return 0;
}

/* Elements whose value is rounding noise by construction (a parameter whose exact gradient is zero,
 * which Adam's normalisation turns into full-size steps): noise(name, index) says which; they are
 * compared with the absolute tolerance noise_atol instead (still finite), and left out of the rest. */
typedef int (*test_noise_fn)(const char *name, int name_len, size_t index);

/* Compares every tensor of checkpoint `got` with the same-named one of `want` (f32 element-wise as
 * test_close_all, other dtypes bit for bit) and the step: one CHECK per tensor. Returns the worst
 * f32 difference over all tensors (infinity when a file, a tensor or a value is missing or bad). */
static inline double test_ckpt_compare_noise(const char *what, const char *got_path, const char *want_path, double floor, double tol,
                                             test_noise_fn noise, double noise_atol) {
    test_ckpt got, want;
    int rg = test_ckpt_read(got_path, &got), rw = test_ckpt_read(want_path, &want);
    double worst = INFINITY;
    if (rg || rw || got.n_tensors != want.n_tensors || got.n_tensors == 0) {
        test_failed++;
        fprintf(stderr, "FAIL %s: checkpoints %s (%s, %u tensors) and %s (%s, %u tensors) do not compare\n", what, got_path,
                rg ? "unreadable" : "read", rg ? 0 : got.n_tensors, want_path, rw ? "unreadable" : "read", rw ? 0 : want.n_tensors);
        free(got.buf), free(want.buf);
        return worst;
    }
    worst = got.step == want.step ? 0 : INFINITY;
    if (got.step != want.step) fprintf(stderr, "FAIL %s: step %llu, expected %llu\n", what, (unsigned long long)got.step, (unsigned long long)want.step);
    for (uint32_t i = 0; i < want.n_tensors; i++) {
        test_ckpt_tensor w, g = {0};
        int found = 0;
        if (test_ckpt_tensor_at(&want, i, &w)) { worst = INFINITY; break; }
        for (uint32_t k = 0; k < got.n_tensors && !found; k++)
            found = !test_ckpt_tensor_at(&got, k, &g) && g.name_len == w.name_len && !memcmp(g.name, w.name, (size_t)w.name_len);
        char label[256];
        snprintf(label, sizeof label, "%s: %.*s", what, w.name_len, w.name);
        if (!found || g.nbytes != w.nbytes || g.dtype != w.dtype) {
            test_failed++, worst = INFINITY;
            fprintf(stderr, "FAIL %s: %s in %s\n", label, found ? "a different size or dtype" : "missing", got_path);
            continue;
        }
        if (w.dtype != 0) { /* (PDDE_F32 is 0) */
            CHECK(!memcmp(g.data, w.data, (size_t)w.nbytes), "%s: differs", label);
            continue;
        }
        size_t n = (size_t)w.nbytes / 4;
        float *gv = malloc(n * 4 + 4), *wv = malloc(n * 4 + 4); /* (the file's data is unaligned) */
        memcpy(gv, g.data, n * 4), memcpy(wv, w.data, n * 4);
        int n_noise = 0, noise_ok = 1;
        for (size_t k = 0; noise && k < n; k++)
            if (noise(w.name, w.name_len, k)) {
                n_noise++, noise_ok &= fabs((double)gv[k] - wv[k]) <= noise_atol; /* (false for NaN) */
                gv[k] = wv[k] = 0;
            }
        if (n_noise) CHECK(noise_ok, "%s: %d rounding-noise elements differ by more than %.3g", label, n_noise, noise_atol);
        double e = test_close_all(label, gv, wv, n, floor, tol);
        if (!(e <= worst)) worst = e;
        free(gv), free(wv);
    }
    free(got.buf), free(want.buf);
    return worst;
}

static inline double test_ckpt_compare(const char *what, const char *got_path, const char *want_path, double floor, double tol) {
    return test_ckpt_compare_noise(what, got_path, want_path, floor, tol, NULL, 0);
}

#ifdef CLOCK_MONOTONIC /* (a POSIX clock: where the test defines _GNU_SOURCE) */
/* Seconds on the monotonic clock, for deadlines and the durations a test prints. */
static inline double test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

/* The folder of the test binary at argv0 ("." when it has none), where make also puts the tools. */
static inline void test_binary_dir(const char *argv0, char *dir, size_t cap) {
    snprintf(dir, cap, "%s", argv0);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
}

static inline int test_finish(void) {
    printf("%d passed, %d failed, %d skipped\n", test_passed, test_failed, test_skipped);
    return test_failed ? 1 : 0;
}

/* stderr into a temporary file while a part under test runs (what a library call said): begin returns
 * the saved descriptor, end restores it and copies what was written into out (at most cap - 1 bytes). */
static inline int test_stderr_capture_begin(FILE **f) {
    fflush(stderr);
    *f = tmpfile();
    int saved = dup(2);
    if (*f) dup2(fileno(*f), 2);
    return saved;
}

static inline void test_stderr_capture_end(int saved, FILE *f, char *out, size_t cap) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    out[0] = 0;
    if (!f) return;
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

#endif
