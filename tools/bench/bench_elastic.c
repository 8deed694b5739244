/* bench_elastic.c — what a lost rank costs a job under pdde-run --elastic: GPT-small (gpt's default
 * model, a global batch of 12) data parallel on 4 ranks, one rank killed (SIGKILL) and, in another run,
 * one frozen (SIGSTOP) at step 15; REPEATS runs of each, medians reported:
 *   detect_s     the signal to the survivors noticing (the "resumed" line's arrival less the recovery
 *                time it states)
 *   recover_s    the signal to the first step completed after the resume (its metrics line)
 *   lost_steps   steps done again after the resume (metrics lines written twice)
 *   snapshot_overhead_pct   the time the step's thread spends on the in-memory snapshot (gpt's own count:
 *                setting it up, waiting for its copy before the first update) over the median step;
 *                copy_pct: the copy itself, which a thread of its own does while the step runs
 * The peer is the same job without a failure (its step time). Last line:
 *   RESULT elastic detect_s=.. detect_frozen_s=.. recover_s=.. lost_steps=.. snapshot_overhead_pct=..
 *
 *   bench_elastic [BUILD_DIR] [REPEATS]   (make bench-elastic; default build, 3) */
#define _GNU_SOURCE
#include "pdde.h"
#include <math.h>
#include <stdio.h>

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
int main(void) {
    fprintf(stderr, "this tool needs pdde built with comm (UCX)\n");
    return 1;
}
#else
#include "tests/job_util.h"
#include "bench_common.h"

#define STEPS 40
#define KILL_AT 15
#define PEER_TIMEOUT "1.5"

static char g_run[600], g_gpt[600];

static job job_start(const char *leave, const char *metrics, const char *const *extra_run, const char *const *extra_gpt) {
    (void)leave;
    char *argv[64];
    int a = 0;
    argv[a++] = g_run;
    const char *base_run[] = {"-n", "4", "--elastic", "--min", "2", "--peer-timeout", PEER_TIMEOUT, "--grace", "1", NULL};
    for (int i = 0; base_run[i]; i++) argv[a++] = (char *)base_run[i];
    for (int i = 0; extra_run && extra_run[i]; i++) argv[a++] = (char *)extra_run[i];
    argv[a++] = g_gpt;
    static char steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    /* GPT-small (gpt's default model), a global batch of 12 rows (4 and 3 ranks divide it) */
    const char *base_gpt[] = {"--batch", "12", "--steps", steps, "--val-every", "0", "--sample-len", "0", "--threads", "1",
                              "--metrics", metrics, NULL};
    for (int i = 0; base_gpt[i]; i++) argv[a++] = (char *)base_gpt[i];
    for (int i = 0; extra_gpt && extra_gpt[i]; i++) argv[a++] = (char *)extra_gpt[i];
    argv[a] = NULL;
    const char *env[] = {"PDDE_BACKENDS=cpu", NULL};
    return job_spawn(argv, env);
}

/* The median step time of a metrics file (steps 3.. first_bad-1) */
static double metrics_step_s(const char *path, int upto) {
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    char line[512];
    double v[STEPS + 1];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        int s;
        double l, lr, tps, st;
        if (sscanf(line, "{\"step\":%d,\"loss\":%lf,\"lr\":%lf,\"tokens_per_s\":%lf,\"step_s\":%lf", &s, &l, &lr, &tps, &st) == 5 &&
            s > 3 && s < upto && n < STEPS)
            v[n++] = st;
    }
    fclose(f);
    return bench_median(v, n);
}

typedef struct { double detect_s, recover_s, lost, snap_ms, copy_ms, step_s; int ok; } outcome;

static outcome run_once(int sig, const char *metrics) {
    outcome o = {NAN, NAN, NAN, NAN, NAN, NAN, 0};
    remove(metrics);
    job j = job_start(NULL, metrics, NULL, NULL);
    while (metrics_last_step(metrics) < KILL_AT)
        if (job_poll(&j, 2) || job_now() - j.t0 > 300) { job_kill(&j); fprintf(stderr, "%s", job_text(&j)); return o; }
    pid_t pids[8];
    job_ranks(j.pid, pids, 8);
    int before = metrics_last_step(metrics);
    double t_sig = job_now();
    kill(pids[3], sig);
    const char *r = NULL;
    double t_line = 0, t_step = 0;
    int resumed = -1;
    while (!job_poll(&j, 1) && job_now() - t_sig < 120) {
        if (!r && (r = strstr(job_text(&j), "resumed at step ")) && strchr(r, '\n')) {
            double in_s = 0;
            sscanf(r, "resumed at step %d in %lf s", &resumed, &in_s);
            t_line = job_now();
            o.detect_s = t_line - t_sig - in_s;
        } else if (r && !t_line) {
            r = NULL; /* (the line is not whole yet) */
        }
        if (resumed >= 0 && !t_step) {
            /* the first step after the resume: a line for step resumed + 1 written after the resume */
            double loss[STEPS + 1];
            int again = metrics_losses(metrics, loss, STEPS);
            if (metrics_last_step(metrics) >= resumed + 1 && (metrics_last_step(metrics) > before || again > 0)) t_step = job_now();
        }
    }
    if (sig == SIGSTOP) kill(pids[3], SIGKILL);
    job_finish(&j, 300);
    double loss[STEPS + 1];
    o.lost = metrics_losses(metrics, loss, STEPS);
    o.recover_s = t_step ? t_step - t_sig : NAN;
    o.step_s = metrics_step_s(metrics, KILL_AT);
    const char *sn = strstr(job_text(&j), "snapshots of ");
    const char *ms = sn ? strstr(sn, "MB, ") : NULL;
    if (ms) o.snap_ms = atof(ms + 4);
    const char *cp = ms ? strstr(ms, "in the step, ") : NULL;
    if (cp) o.copy_ms = atof(cp + 13);
    o.ok = resumed >= 0 && t_step > 0;
    if (!o.ok) fprintf(stderr, "%s", job_text(&j));
    free(j.out);
    return o;
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "build";
    job_who = "bench_elastic";
    int repeats = argc > 2 ? atoi(argv[2]) : 3;
    if (repeats < 1) repeats = 1;
    snprintf(g_run, sizeof g_run, "%s/pdde-run", build);
    snprintf(g_gpt, sizeof g_gpt, "%s/gpt", build);
    char metrics[] = "/tmp/pdde-bench-elastic.jsonl";
    double dk[16], df[16], rc[16], lost[16], ov[16], st[16], cp[16];
    int n = 0;
    printf("GPT-small (gpt's default model, batch 12), data parallel on 4 ranks under pdde-run --elastic --peer-timeout %s;\n"
           "rank 3 killed (SIGKILL), then frozen (SIGSTOP), at step %d of %d; %d repeat%s\n", PEER_TIMEOUT, KILL_AT, STEPS, repeats,
           repeats > 1 ? "s" : "");
    for (int k = 0; k < repeats && k < 16; k++) {
        outcome a = run_once(SIGKILL, metrics), b = run_once(SIGSTOP, metrics);
        if (!a.ok || !b.ok) { fprintf(stderr, "bench_elastic: run %d did not recover\n", k); return 1; }
        printf("  run %d: killed: detect %.3f s, recover %.3f s, lost %.0f; frozen: detect %.3f s, recover %.3f s, lost %.0f; "
               "snapshot %.2f ms in the step (%.2f ms copying beside it) per step of %.1f ms\n", k, a.detect_s, a.recover_s, a.lost,
               b.detect_s, b.recover_s, b.lost, a.snap_ms, a.copy_ms, 1e3 * a.step_s);
        dk[n] = a.detect_s, df[n] = b.detect_s, rc[n] = a.recover_s;
        lost[n] = a.lost > b.lost ? a.lost : b.lost, ov[n] = 100 * a.snap_ms / (1e3 * a.step_s), st[n] = a.step_s;
        cp[n] = 100 * a.copy_ms / (1e3 * a.step_s);
        n++;
    }
    remove(metrics);
    double mdk = bench_median(dk, n), mdf = bench_median(df, n), mrc = bench_median(rc, n), ml = bench_median(lost, n), mov = bench_median(ov, n), mcp = bench_median(cp, n);
    printf("medians: detect %.3f s killed, %.3f s frozen (targets <= 2); recover %.3f s (<= 5); lost steps %.0f (<= 1); snapshot "
           "overhead %.2f%% of a %.1f ms step (<= 1%%; the copy beside it %.2f%%)\n", mdk, mdf, mrc, ml, mov, 1e3 * bench_median(st, n), mcp);
    printf("RESULT elastic detect_s=%.3f detect_frozen_s=%.3f recover_s=%.3f lost_steps=%.0f snapshot_overhead_pct=%.2f copy_pct=%.2f\n",
           mdk, mdf, mrc, ml, mov, mcp);
    return 0;
}
#endif
