/* test_util.h — the tiny test harness every test uses: CHECK counts, the last line is "N passed, N failed". */
#ifndef PDDE_TEST_UTIL_H
#define PDDE_TEST_UTIL_H
#include <stdio.h>
#include <math.h>

static int test_passed, test_failed;

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

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}
#endif
