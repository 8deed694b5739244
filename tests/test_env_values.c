/* test_env_values — the library's one policy for a tuning variable's bad value: a value that does not parse
 * whole (trailing text, a sign or overflow outside the range, a word where a number or a switch is expected)
 * is said on stderr, naming the variable, the value, what is expected and the default, once per process for
 * a variable and value, and the default is used; unset or empty is the default without a word. Observed through
 * what each variable sets:
 *  - PDDE_NUM_THREADS (core/context.c): the context's thread count;
 *  - PDDE_MEMORY_HEADROOM and PDDE_MEMORY_AVAILABLE (core/memory_admission.c): what a session may use;
 *  - PDDE_DIRECT_GRADS (planner/lower.c, a switch): the gradient accumulations a step runs;
 *  - PDDE_PROFILE (core/session.c, a word): the per-op profile at a session's end. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* stderr captured around a call (test_util.h's capture) */
static FILE *g_capture;
static int g_saved_fd;
static void capture_begin(void) { g_saved_fd = test_stderr_capture_begin(&g_capture); }
static void capture_end(char *buf, size_t n) { test_stderr_capture_end(g_saved_fd, g_capture, buf, n); }

static int count(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub)) n++;
    return n;
}

/* The thread count a context takes under PDDE_NUM_THREADS=value (NULL: unset), and its stderr in err */
static int threads_under(const char *value, char *err, size_t n) {
    if (value) setenv("PDDE_NUM_THREADS", value, 1);
    else unsetenv("PDDE_NUM_THREADS");
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx = NULL;
    capture_begin();
    pdde_status st = pdde_context_init(&cp, &ctx);
    capture_end(err, n);
    int threads = st ? -1 : pdde_context_thread_count(ctx);
    pdde_context_free(ctx);
    unsetenv("PDDE_NUM_THREADS");
    return threads;
}

static void test_num_threads(void) {
    char err[4096], want[256];
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(threads_under(NULL, err, sizeof err) == cores && !err[0], "unset: one thread a core (%d), nothing said: %s", cores, err);
    CHECK(threads_under("", err, sizeof err) == cores && !err[0], "empty: the default, nothing said: %s", err);
    CHECK(threads_under("2", err, sizeof err) == 2 && !err[0], "PDDE_NUM_THREADS=2 gives 2 threads, nothing said: %s", err);
    const char *bad[] = {"abc", "2x", "2 ", "-1", "0", "99999999999999999999999", "1e3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int threads = threads_under(bad[i], err, sizeof err);
        snprintf(want, sizeof want, "pdde: PDDE_NUM_THREADS=\"%s\": expected a whole number from 1 to 65536; using the default, %d\n", bad[i], cores);
        CHECK(threads == cores && count(err, want) == 1 && count(err, "pdde:") == 1,
              "PDDE_NUM_THREADS=\"%s\": the default %d (got %d), said once naming the value, the range and the default:\n%s", bad[i], cores,
              threads, err);
    }
    /* a second context under the same bad value: not said again */
    CHECK(threads_under("2x", err, sizeof err) == cores && !err[0], "PDDE_NUM_THREADS=\"2x\" a second time: the default, nothing said: %s", err);
}

/* A tiny GPT's training graph (context length 8) on a one-thread CPU context of its own */
static void tiny_gpt(int layers, int batch, pdde_context **ctx, pdde_graph **g, gpt_model *m) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context_init(&cp, ctx);
    gpt_config cfg = {.vocab = 32, .ctx = 8, .layers = layers, .heads = 2, .width = 16, .batch = batch};
    pdde_graph_init(*ctx, g);
    gpt_build(*g, &cfg, m);
    pdde_backward(*g, m->loss);
    pdde_optimizer_adamw(*g, NULL);
}

/* A small GPT's session under the memory variables (NULL: unset): its status, its error and stderr */
static pdde_status session_under(const char *available, const char *headroom, char *error, char *err, size_t n) {
    if (available) setenv("PDDE_MEMORY_AVAILABLE", available, 1);
    if (headroom) setenv("PDDE_MEMORY_HEADROOM", headroom, 1);
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    tiny_gpt(2, 4, &ctx, &g, &m);
    capture_begin();
    pdde_status st = pdde_session_init(g, NULL, &s);
    capture_end(err, n);
    snprintf(error, 1024, "%s", st ? pdde_last_error(ctx) : "");
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    unsetenv("PDDE_MEMORY_AVAILABLE"), unsetenv("PDDE_MEMORY_HEADROOM");
    return st;
}

static void test_memory(void) {
    char error[1024], err[4096];
    /* a stated 100 kB: 90 kB may be used under the default headroom (0.1), 50 kB under 0.5 */
    pdde_status st = session_under("100k", "0.5", error, err, sizeof err);
    CHECK(st == PDDE_ERR_OOM && strstr(error, "50.00 kB may be used") && !err[0], "PDDE_MEMORY_HEADROOM=0.5 is read: %s; said: %s", error, err);
    st = session_under("100k", "0.5x", error, err, sizeof err);
    CHECK(st == PDDE_ERR_OOM && strstr(error, "90.00 kB may be used") &&
              count(err, "pdde: PDDE_MEMORY_HEADROOM=\"0.5x\": expected a number from 0 to 0.999; using the default, 0.1\n") == 1,
          "PDDE_MEMORY_HEADROOM=0.5x: the default headroom, said: %s; said: %s", error, err);
    st = session_under("100k", "2", error, err, sizeof err);
    CHECK(st == PDDE_ERR_OOM && strstr(error, "90.00 kB may be used") && count(err, "PDDE_MEMORY_HEADROOM=\"2\": expected") == 1,
          "PDDE_MEMORY_HEADROOM=2 (out of range): the default headroom, said: %s; said: %s", error, err);
    /* a bad stated figure: the system's (this small model fits), said */
    st = session_under("lots", NULL, error, err, sizeof err);
    CHECK(st == PDDE_OK && count(err, "pdde: PDDE_MEMORY_AVAILABLE=\"lots\": expected a byte count") == 1,
          "PDDE_MEMORY_AVAILABLE=lots: what the system says is used, said: %s; said: %s", error, err);
}

/* The gradient accumulations a training step runs under name=value (NULL: unset), and what the session
 * said on stderr from its start to its end */
static double step_under(const char *name, const char *value, char *err, size_t n) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    tiny_gpt(1, 2, &ctx, &g, &m);
    capture_begin();
    pdde_status st = pdde_session_init(g, NULL, &s);
    int32_t tokens[2 * 8] = {0};
    double runs = -1;
    if (!st && !pdde_session_write(s, m.ids, tokens, sizeof tokens) && !pdde_session_write(s, m.targets, tokens, sizeof tokens) &&
        !pdde_session_run(s, PDDE_RUN_STEP))
        runs = (double)pdde_session_op_runs(s, PDDE_OP_GRAD_ACCUM);
    else
        fprintf(stderr, "session under %s=%s: %s\n", name, value ? value : "(unset)", pdde_last_error(ctx));
    pdde_session_free(s);
    capture_end(err, n);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    unsetenv(name);
    return runs;
}

static double accums_under(const char *value, char *err, size_t n) { return step_under("PDDE_DIRECT_GRADS", value, err, n); }

static void test_switch(void) {
    char err[4096];
    double on = accums_under(NULL, err, sizeof err), off = accums_under("0", err, sizeof err);
    CHECK(on >= 0 && off > on, "PDDE_DIRECT_GRADS=0 accumulates more (%g) than the default (%g)", off, on);
    CHECK(accums_under("off", err, sizeof err) == off && !err[0], "off is 0: %s", err);
    CHECK(accums_under("yes", err, sizeof err) == on && !err[0], "yes is 1: %s", err);
    const char *bad[] = {"2", "-1", "0x", "disable"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[256];
        snprintf(want, sizeof want, "pdde: PDDE_DIRECT_GRADS=\"%s\": expected 1 or 0 (on/off, true/false, yes/no); using the default, on\n", bad[i]);
        double runs = accums_under(bad[i], err, sizeof err);
        CHECK(runs == on && count(err, want) == 1, "PDDE_DIRECT_GRADS=%s: the default (%g accumulations, got %g), said once:\n%s", bad[i], on,
              runs, err);
    }
}

/* A word: PDDE_PROFILE=1 prints the time per op at the session's end; a word it does not know is said, and
 * the default (0: no profile) taken */
static void test_word(void) {
    char err[8192];
    step_under("PDDE_PROFILE", "1", err, sizeof err);
    CHECK(strstr(err, "pdde profile:") && !strstr(err, "expected"), "PDDE_PROFILE=1 profiles: %s", err);
    step_under("PDDE_PROFILE", "host", err, sizeof err);
    CHECK(!strstr(err, "pdde profile:") && count(err, "pdde: PDDE_PROFILE=\"host\": expected one of 0, 1, device; using the default, 0\n") == 1,
          "PDDE_PROFILE=host: no profile, said once: %s", err);
}

int main(void) {
    test_num_threads();
    test_memory();
    test_switch();
    test_word();
    return test_finish();
}
