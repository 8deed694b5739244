/* test_dispatch_env — no operation of a training step reads the environment: the switches that the
 * dispatchers take from PDDE_* variables (backends/gpu_dispatch.h's memory-bound kernels, the CUDA
 * backend's GEMM switches) are read when a session's stream is made, so a step of many small ops pays no
 * getenv per op, and a later session still sees a variable set in between (one process can measure
 * every path). getenv is this program's own (it counts the PDDE_* names asked, then looks them up),
 * which the library, linked statically, calls.
 *
 * On the CPU and on the OpenCL and CUDA devices (each skipped where there is none): a deep, narrow MLP
 * trained a few steps; the steps after the first ask for no PDDE_* variable; a session made after the
 * device's COLSUM2 switch is set reads it; the losses of two sessions of the same model are equal bit
 * for bit (the same switches, read once or not); on OpenCL with CLBlast, a session made under
 * PDDE_OPENCL_GEMM=builtin runs k_gemm (losses within 1e-5, not CLBlast's bits). */
#define _GNU_SOURCE /* (setenv) */
#include "pdde.h"
#include "tests/test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;
static int counting, pdde_asked, colsum2_asked;
static const char *colsum2_var = "PDDE_OPENCL_COLSUM2"; /* (the device's own: PDDE_CUDA_COLSUM2 on CUDA) */

/* (the library's getenv: this definition comes before the C library's at link time) */
char *getenv(const char *name) {
    if (counting && !strncmp(name, "PDDE_", 5)) pdde_asked++;
    if (!strcmp(name, colsum2_var)) colsum2_asked++;
    size_t n = strlen(name);
    for (char **e = environ; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

enum { WIDTH = 8, DEPTH = 6, BATCH = 4, STEPS = 4 };

/* The MLP on device dev, trained STEPS steps from the context's seed: the per-step losses into loss[],
 * the PDDE_* variables the steps after the first asked for into *asked. 0 on success. */
static int train(pdde_context *ctx, int dev, float *loss, int *asked) {
    pdde_graph *g;
    if (pdde_graph_init(ctx, &g)) return 1;
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){BATCH, WIDTH}), *tg = pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){BATCH});
    pdde_tensor *h = x;
    for (int l = 0; l < DEPTH; l++) {
        char wn[16], bn[16];
        snprintf(wn, sizeof wn, "w%d", l), snprintf(bn, sizeof bn, "b%d", l);
        h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, h, pdde_param(g, wn, 2, (int64_t[]){WIDTH, WIDTH}, 0.5f), 0, 0),
                                       pdde_param(g, bn, 1, (int64_t[]){WIDTH}, 0.1f)));
    }
    pdde_tensor *l = pdde_cross_entropy(g, pdde_matmul(g, h, pdde_param(g, "wo", 2, (int64_t[]){WIDTH, 3}, 0.5f), 0, 0), tg);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    pdde_session *s = NULL;
    int rc = pdde_graph_status(g) || pdde_backward(g, l) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s);
    float xs[BATCH * WIDTH];
    int32_t ts[BATCH];
    for (int i = 0; i < BATCH * WIDTH; i++) xs[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < BATCH; i++) ts[i] = i % 3;
    rc = rc || pdde_session_write(s, x, xs, sizeof xs) || pdde_session_write(s, tg, ts, sizeof ts);
    *asked = 0;
    for (int i = 0; i < STEPS && !rc; i++) {
        counting = i > 0, pdde_asked = 0;
        rc = pdde_session_run(s, PDDE_RUN_STEP);
        counting = 0, *asked += pdde_asked;
        loss[i] = pdde_session_loss(s);
    }
    if (rc) printf("train: %s\n", pdde_last_error(ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
    return rc;
}

static void check_device(pdde_context *ctx, int dev, const char *what) {
    float a[STEPS], b[STEPS];
    int asked = -1, asked_b = -1;
    colsum2_var = strcmp(what, "cuda") ? "PDDE_OPENCL_COLSUM2" : "PDDE_CUDA_COLSUM2";
    unsetenv(colsum2_var);
    int rc = train(ctx, dev, a, &asked);
    CHECK(rc == 0, "%s: training failed", what);
    if (rc) return;
    printf("%s: losses %.7g .. %.7g; PDDE_* variables asked in %d steps: %d\n", what, a[0], a[STEPS - 1], STEPS - 1, asked);
    CHECK(asked == 0, "%s: the steps after the first asked for %d PDDE_* variables (a getenv in a per-op path)", what, asked);
    CHECK(isfinite(a[STEPS - 1]) && a[STEPS - 1] < a[0], "%s: the loss did not fall: %g -> %g", what, a[0], a[STEPS - 1]);
    /* a variable set between sessions is read by the next one (the value "0": the same kernels, so equal losses) */
    setenv(colsum2_var, "0", 1);
    colsum2_asked = 0;
    rc = train(ctx, dev, b, &asked_b);
    unsetenv(colsum2_var);
    CHECK(rc == 0 && asked_b == 0, "%s: second session: rc %d, %d PDDE_* variables asked by its steps", what, rc, asked_b);
    if (strcmp(what, "cpu")) CHECK(colsum2_asked > 0, "%s: a session made after %s was set did not read it", what, colsum2_var);
    for (int i = 0; i < STEPS && !rc; i++)
        CHECK(!memcmp(&a[i], &b[i], sizeof a[i]), "%s: step %d: losses of two sessions differ: %.9g vs %.9g", what, i, a[i], b[i]);
    if (strcmp(what, "opencl") || !(pdde_features() & PDDE_FEATURE_CLBLAST)) return; /* (without CLBlast: k_gemm either way) */
    /* PDDE_OPENCL_GEMM=builtin: the GEMMs on k_gemm rather than CLBlast, read when the stream is made: the
     * same losses but for the float order of other kernels (so not the same bits at every step) */
    setenv("PDDE_OPENCL_GEMM", "builtin", 1);
    rc = train(ctx, dev, b, &asked_b);
    unsetenv("PDDE_OPENCL_GEMM");
    CHECK(rc == 0 && asked_b == 0, "%s, k_gemm: rc %d, %d PDDE_* variables asked by its steps", what, rc, asked_b);
    int close = !rc, same = !rc;
    for (int i = 0; i < STEPS && !rc; i++) close &= test_close(b[i], a[i], 1e-5, 1e-6), same &= !memcmp(&a[i], &b[i], sizeof a[i]);
    CHECK(close, "%s, k_gemm: the losses equal CLBlast's within 1e-5 (%.9g vs %.9g at the last step)", what, b[STEPS - 1], a[STEPS - 1]);
    CHECK(!same, "%s, k_gemm: the losses are CLBlast's bit for bit at every step: PDDE_OPENCL_GEMM=builtin took no effect", what);
}

int main(void) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) {
        printf("no context\n");
        return 1;
    }
    check_device(ctx, 0, "cpu");
    int cl = pdde_device_find(ctx, "opencl", 0);
    if (cl >= 0) check_device(ctx, cl, "opencl");
    else test_skip("opencl", "no OpenCL device: %s", pdde_last_error(ctx));
    int cu = pdde_device_find(ctx, "cuda", 0);
    if (cu >= 0) check_device(ctx, cu, "cuda");
    else test_skip("cuda", "no CUDA device");
    pdde_context_free(ctx);
    return test_finish();
}
