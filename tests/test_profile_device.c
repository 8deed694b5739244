/* test_profile_device — PDDE_PROFILE=device on the OpenCL device (PoCL in CI): a training step of an MLP
 * whose one large matmul ([256, 512] x [512, 1024], and its two gradients) sits among small ops (bias
 * add, relu, a [256, 16] head, cross-entropy, AdamW), timed by events on the device's stream.
 *  - every op kind the step runs has device time > 0; their sum is the busy time (one in-order queue:
 *    no overlaps), which is at most the run's wall time (PoCL's device clock is the host's: 2% and
 *    0.2 ms of tolerance); the matmul has the largest share;
 *  - the losses are those of the same steps without profiling, bit for bit;
 *  - no wait per node: the host waits for the device as often as without profiling (PDDE_PROFILE=1, which
 *    waits after every node, waits more), and the host's issue time is below half the device's busy time;
 *    without a norm to clip, the step's wait before its first update (for the loss) is reported as a wait
 *    (at least half the matmuls' device time, most of which runs before it), not as issue time, and the
 *    device's longest idle is before that update (it waited for the host's wait), not inside it;
 *  - the figures leave the first run out, and the report at pdde_session_free prints them in its
 *    "PROFILE device ..." line;
 *  - under a trace (PDDE_TRACE) too the host waits no more, and the trace's node events are the device's
 *    intervals: on the device's lane, as many as the nodes timed, their durations summing to the busy time;
 *  - on the CPU, which cannot time on a device, the session says so once and profiles with host timers.
 */
#define _GNU_SOURCE /* setenv, dup */
#include "pdde.h"
#include "tests/test_util.h"
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 5
#define B 256
#define K 512
#define H 1024
#define CLASSES 16

typedef struct {
    float loss[STEPS];
    int64_t syncs, runs[PDDE_OP_COUNT];
    int profiled;                       /* pdde_session_device_profile answered */
    pdde_device_profile prof;
    double op_ms[PDDE_OP_COUNT];
    char report[8192];                  /* what pdde_session_free wrote to stderr */
    char init_err[2048];                /* what pdde_session_init wrote to stderr */
} run_result;

/* STEPS training steps under PDDE_PROFILE=profile (NULL: unset) on device */
static int train(pdde_context *ctx, int device, const char *profile, int clip, run_result *r) {
    memset(r, 0, sizeof *r);
    if (profile) setenv("PDDE_PROFILE", profile, 1);
    else unsetenv("PDDE_PROFILE");
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    int64_t xs[2] = {B, K}, w1s[2] = {K, H}, b1s[1] = {H}, w2s[2] = {H, CLASSES}, ys[1] = {B};
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, xs), *y = pdde_input(g, "y", PDDE_I32, 1, ys);
    pdde_tensor *w1 = pdde_param(g, "w1", 2, w1s, 0.05f), *b1 = pdde_param(g, "b1", 1, b1s, PDDE_INIT_ZEROS);
    pdde_tensor *w2 = pdde_param(g, "w2", 2, w2s, 0.05f);
    pdde_tensor *h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1));
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), y);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f, op.clip_norm = clip ? 1.0f : 0; /* (with a norm the step waits once, at its end; else before
                                                      its first update too: README "Non-finite guard") */
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    pdde_session *s = NULL;
    int ok = pdde_backward(g, loss) == PDDE_OK && pdde_optimizer_adamw(g, &op) == PDDE_OK;
    FILE *f;
    int saved = test_stderr_capture_begin(&f);
    ok = ok && pdde_session_init(g, &sp, &s) == PDDE_OK;
    test_stderr_capture_end(saved, f, r->init_err, sizeof r->init_err);
    float *xd = malloc(sizeof(float) * B * K);
    int32_t yd[B];
    for (int step = 0; ok && step < STEPS; step++) {
        for (int i = 0; i < B * K; i++) xd[i] = (float)((i * 37 + step * 11) % 97) / 97.0f - 0.5f;
        for (int i = 0; i < B; i++) yd[i] = (i * 5 + step) % CLASSES;
        ok = pdde_session_write(s, x, xd, sizeof(float) * B * K) == PDDE_OK && pdde_session_write(s, y, yd, sizeof yd) == PDDE_OK;
        int64_t before = s ? pdde_session_host_syncs(s) : 0;
        ok = ok && pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK;
        if (ok) r->loss[step] = pdde_session_loss(s), r->syncs += pdde_session_host_syncs(s) - before;
    }
    if (!ok) fprintf(stderr, "train (%s): %s\n", profile ? profile : "no profile", pdde_last_error(ctx));
    if (ok) {
        r->profiled = pdde_session_device_profile(s, &r->prof) == PDDE_OK;
        for (int o = 0; o < PDDE_OP_COUNT; o++)
            r->op_ms[o] = pdde_session_device_op_ms(s, (pdde_op)o), r->runs[o] = pdde_session_op_runs(s, (pdde_op)o);
    }
    free(xd);
    saved = test_stderr_capture_begin(&f);
    pdde_session_free(s);
    test_stderr_capture_end(saved, f, r->report, sizeof r->report);
    pdde_graph_free(g);
    unsetenv("PDDE_PROFILE");
    return ok ? 0 : -1;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void test_opencl(pdde_context *ctx) {
    int device = pdde_device_find(ctx, "opencl", 0);
    if (device < 0) {
        test_skip("opencl", "no OpenCL device (PoCL in CI)");
        return;
    }
    run_result plain, dev, host;
    int ok = train(ctx, device, NULL, 1, &plain) == 0 && train(ctx, device, "device", 1, &dev) == 0 && train(ctx, device, "1", 1, &host) == 0;
    CHECK(ok, "the three runs train");
    if (!ok) return;
    CHECK(!memcmp(plain.loss, dev.loss, sizeof plain.loss) && isfinite(dev.loss[STEPS - 1]), "losses as without profiling: %.9g %.9g (last)",
          plain.loss[STEPS - 1], dev.loss[STEPS - 1]);
    CHECK(dev.profiled && dev.prof.runs == STEPS - 1, "the figures of %lld runs (the first left out)", (long long)dev.prof.runs);
    double sum = 0;
    int kinds = 0, all_timed = 1, matmul_largest = 1;
    for (int o = 0; o < PDDE_OP_COUNT; o++) {
        if (!dev.runs[o]) continue;
        kinds++, sum += dev.op_ms[o];
        if (!(dev.op_ms[o] > 0)) all_timed = 0, fprintf(stderr, "  %s ran %lld times, device ms %g\n", pdde_op_name((pdde_op)o), (long long)dev.runs[o], dev.op_ms[o]);
        if (o != PDDE_OP_MATMUL && !(dev.op_ms[PDDE_OP_MATMUL] > dev.op_ms[o])) matmul_largest = 0;
    }
    CHECK(kinds >= 5 && all_timed, "every one of the %d op kinds run has device time > 0", kinds);
    CHECK(matmul_largest, "the matmul has the largest share: %.3f ms of %.3f", dev.op_ms[PDDE_OP_MATMUL], sum);
    CHECK(sum <= dev.prof.wall_ms * 1.02 + 0.2 && dev.prof.busy_ms <= dev.prof.wall_ms * 1.02 + 0.2,
          "the device time (ops %.3f ms, busy %.3f ms) within the wall time (%.3f ms)", sum, dev.prof.busy_ms, dev.prof.wall_ms);
    CHECK(fabs(dev.prof.busy_ms - sum) <= 1e-6 * sum + 1e-3, "one in-order queue: busy %.3f ms = the ops' sum %.3f ms", dev.prof.busy_ms, sum);
    CHECK(dev.prof.ops >= kinds && dev.prof.span_ms >= dev.prof.busy_ms - 1e-3 && dev.prof.idle_pct >= -2 && dev.prof.idle_pct < 100,
          "ops %.0f, span %.3f ms, idle %.1f%%", dev.prof.ops, dev.prof.span_ms, dev.prof.idle_pct);
    /* no wait per node */
    CHECK(dev.syncs == plain.syncs, "the host waits as often as without profiling: %lld, %lld", (long long)dev.syncs, (long long)plain.syncs);
    CHECK(host.syncs >= plain.syncs + (int64_t)dev.prof.ops * (STEPS - 1), "PDDE_PROFILE=1 waits after each node: %lld waits",
          (long long)host.syncs);
    CHECK(dev.prof.host_issue_ms < 0.5 * dev.prof.busy_ms && dev.prof.host_waits == 0 && dev.prof.host_wait_ms == 0,
          "the host issues in %.3f ms what the device runs in %.3f ms, without waiting (%.1f waits, %.3f ms)", dev.prof.host_issue_ms,
          dev.prof.busy_ms, dev.prof.host_waits, dev.prof.host_wait_ms);
    /* without a norm to clip, the host waits for the loss before the first update: a wait, not issue */
    run_result wait;
    CHECK(train(ctx, device, "device", 0, &wait) == 0 && wait.prof.host_waits >= 1 && wait.prof.host_wait_ms > 0.5 * wait.op_ms[PDDE_OP_MATMUL] &&
              wait.prof.host_issue_ms < 0.5 * wait.prof.busy_ms,
          "a wait before the update: %.1f waits, %.3f ms, issue %.3f ms, busy %.3f ms", wait.prof.host_waits, wait.prof.host_wait_ms,
          wait.prof.host_issue_ms, wait.prof.busy_ms);
    const char *gaps = strstr(wait.report, "longest idles on a device, before: ");
    if (gaps) gaps = strstr(gaps, "before: ") + 8;
    CHECK(gaps && strstr(gaps, "(adamw_update)") && strstr(gaps, "(adamw_update)") < strchr(gaps, ','),
          "the device idles longest before the update that waited: %.200s", gaps ? gaps : wait.report);
    /* the report */
    const char *line = strstr(dev.report, "PROFILE device busy_ms=");
    double busy = -1, wall = -1, idle = -1, issue = -1, ops = -1;
    CHECK(line && sscanf(line, "PROFILE device busy_ms=%lf wall_ms=%lf idle_pct=%lf host_issue_ms=%lf ops=%lf host_wait_ms=", &busy, &wall, &idle, &issue, &ops) == 5 &&
              fabs(busy - dev.prof.busy_ms) < 2e-3 && fabs(wall - dev.prof.wall_ms) < 2e-3 && fabs(ops - dev.prof.ops) < 0.6,
          "the report's line: %.80s", line ? line : dev.report);
    CHECK(strstr(dev.report, "matmul") && !strstr(plain.report, "PROFILE") && strstr(host.report, "pdde profile:"), "the reports:\n%s", dev.report);
    CHECK(!dev.init_err[0], "nothing said at init: %s", dev.init_err);
    /* under a trace */
    char path[] = "/tmp/pdde_test_profile_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    setenv("PDDE_TRACE", path, 1);
    run_result traced;
    int traced_ok = train(ctx, device, "device", 1, &traced) == 0;
    unsetenv("PDDE_TRACE");
    FILE *tf = fopen(path, "r");
    char ln[4096], lane[32];
    snprintf(lane, sizeof lane, "\"tid\":%d,", device);
    int events = 0, later = 0, ordered = 1;
    double dur_later = 0, last_ts = -1;
    while (tf && fgets(ln, sizeof ln, tf)) {
        const char *c = strstr(ln, "\"cat\":\"op\""), *ts = strstr(ln, "\"ts\":"), *du = strstr(ln, "\"dur\":"), *stp = strstr(ln, "\"step\":");
        if (!c || !ts || !du || !stp || !strstr(ln, lane)) continue;
        double t = atof(ts + 5), d = atof(du + 6);
        events++;
        if (t < last_ts) ordered = 0;
        last_ts = t;
        if (atoi(stp + 7) >= 1) later++, dur_later += d; /* (the runs the figures count) */
    }
    if (tf) fclose(tf);
    unlink(path);
    CHECK(traced_ok && traced.syncs == plain.syncs, "traced: the host waits as often as without: %lld, %lld", (long long)traced.syncs,
          (long long)plain.syncs);
    CHECK(traced_ok && events == (int)(traced.prof.ops + 0.5) * STEPS && later == (int)(traced.prof.ops + 0.5) * (STEPS - 1) && ordered,
          "the trace's device events: %d (%d after the first run), %.0f nodes a run", events, later, traced.prof.ops);
    CHECK(traced_ok && fabs(dur_later - 1e3 * traced.prof.busy_ms * (STEPS - 1)) <= 1e-4 * dur_later + 0.01 * later,
          "their durations sum to the busy time: %.3f us, %.3f us", dur_later, 1e3 * traced.prof.busy_ms * (STEPS - 1));
    pdde_device_profile none;
    CHECK(pdde_session_device_profile(NULL, &none) == PDDE_ERR_INVALID_ARG, "NULL session");
}

/* The CPU cannot time on a device: said once, host timers instead, and no device figures. */
static void test_cpu_fallback(pdde_context *ctx) {
    int device = pdde_device_find(ctx, "cpu", 0);
    run_result plain, dev;
    int ok = train(ctx, device, NULL, 1, &plain) == 0 && train(ctx, device, "device", 1, &dev) == 0;
    CHECK(ok, "the CPU runs train");
    if (!ok) return;
    CHECK(count(dev.init_err, "cannot time on the device") == 1 && count(dev.report, "cannot time") == 0, "said once: %s", dev.init_err);
    CHECK(!dev.profiled && strstr(dev.report, "pdde profile:") && !strstr(dev.report, "PROFILE device"), "host timers' report:\n%s", dev.report);
    CHECK(!memcmp(plain.loss, dev.loss, sizeof plain.loss), "the same losses");
}

int main(void) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) {
        printf("context: failed\n");
        return 1;
    }
    test_opencl(ctx);
    test_cpu_fallback(ctx);
    pdde_context_free(ctx);
    return test_finish();
}
