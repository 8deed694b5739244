/* test_elastic.c — a job that survives: gpt (a tiny model, data parallel) on 4 ranks under
 * `pdde-run --elastic`, with real processes and real signals:
 *  - one rank killed with SIGKILL at a random step: the survivors (the same processes: their pids do
 *    not change) re-form the world on 3 ranks and finish; at most one step is lost (snapshot interval
 *    1); every step's loss equals (1e-6 relative, NaN fails) that of a failure-free run that makes the
 *    same plan change at the same step (rank 3 leaving there on purpose, PDDE_ELASTIC_LEAVE);
 *  - the same with ZeRO-1 (optimizer state split over the ranks): the lost rank's blocks come from the
 *    copy the next rank holds (at most 2 steps lost: the newest copy may not have arrived);
 *  - the same with one survivor a step behind the others when the failure reaches it
 *    (PDDE_TEST_ELASTIC_LAG): the survivors agree on their snapshots again and finish;
 *  - re-planning (gpt --plan auto): the planner's plan for 4 ranks, then for the 3 left after a kill;
 *    the losses equal a run making the same re-plan at the same step;
 *  - fault-tolerant data parallelism without re-splitting the batch (gpt --ft-replicas): a killed replica's
 *    samples are dropped and the survivors average over theirs (see test_ft_replicas);
 *  - one rank frozen with SIGSTOP: detected within the peer timeout plus the recovery, handled as a
 *    death; continued (SIGCONT) afterwards, it finds itself fenced and stops, and the new world's
 *    losses are still the reference's;
 *  - two failures in a row (4 -> 3 -> 2 ranks), a planned shrink 4 -> 2 and 2 -> 1, a member lost while the next
 *    world forms (the others form the one after), growing 2 -> 4 (two ranks started later with
 *    pdde-run --join get the state from a member; the losses go on as a run without changes);
 *  - errors that would repeat stop the job: --max-restarts 0 and a kill; a non-finite loss; fewer
 *    ranks than --min.
 *  - a rank asked to leave by SIGTERM leaves at the next step boundary (exit 143), the others go on with no
 *    step lost, as a run where it leaves there on purpose; SIGTERM to every rank stops the job there, saved;
 *    SIGTERM to one rank of three under --min 3 stops all three there, saved (fewer than --min would remain);
 *  - a program that is not gpt (examples/elastic.c, an MLP on the pdde_elastic_* calls) survives a kill.
 * The seed of the random steps is printed (PDDE_TEST_SEED repeats it). */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIP ucx: pdde was built without comm (no UCX)\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "test_util.h"
#include "tools/proc_stat.h"
#include "job_util.h"
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define STEPS 240
/* 1.5 s on a quiet machine, more under load (job_peer_timeout: a lease the machine can keep); the
 * bounds checked derive from it */
static char g_pt[16] = "1.5";
#define PEER_TIMEOUT g_pt
/* Planned changes (leaves, joins) measure no detection: a generous peer timeout there. A member holds
 * a lease of about the peer timeout at the store, and a loaded machine (a load of 10 on 2 cores) can
 * starve a process past 1.25 s; the store then drops it as frozen and the change fences it. */
#define PEER_TIMEOUT_PLANNED "10"

static char g_run[600], g_gpt[600], g_tmp[256];

static job job_start(const char *leave, const char *metrics, const char *const *extra_run, const char *const *extra_gpt) {
    char *argv[64];
    int a = 0;
    argv[a++] = g_run;
    const char *base_run[] = {"-n", "4", "--elastic", "--min", "2", "--peer-timeout", PEER_TIMEOUT, "--grace", "1", NULL};
    for (int i = 0; base_run[i]; i++) argv[a++] = (char *)base_run[i];
    for (int i = 0; extra_run && extra_run[i]; i++) argv[a++] = (char *)extra_run[i];
    argv[a++] = g_gpt;
    static char steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    const char *base_gpt[] = {"--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", steps,
                              "--val-every", "0", "--sample-len", "0", "--threads", "1", "--metrics", metrics, NULL};
    for (int i = 0; base_gpt[i]; i++) argv[a++] = (char *)base_gpt[i];
    for (int i = 0; extra_gpt && extra_gpt[i]; i++) argv[a++] = (char *)extra_gpt[i];
    argv[a] = NULL;
    char leave_env[300];
    snprintf(leave_env, sizeof leave_env, "PDDE_ELASTIC_LEAVE=%s", leave ? leave : "");
    const char *env[] = {leave ? leave_env : "PDDE_ELASTIC_LEAVE", "PDDE_BACKENDS=cpu", NULL};
    return job_spawn(argv, env);
}

/* Parses the transition line: the step it resumed at and the seconds it took; -1 when absent. */
static int parse_resumed(const char *text, const char *after, int *step, double *secs, char *line, size_t cap) {
    const char *r = strstr(after ? after : text, "resumed at step ");
    if (!r) return -1;
    const char *p = r;
    while (p > text && p[-1] != '\n') p--;
    const char *eol = strchr(r, '\n');
    if (!eol) return -1; /* (the whole line first) */
    if (strstr(p, "elastic: ") && strstr(p, "elastic: ") < r) p = strstr(p, "elastic: ");
    if (sscanf(r, "resumed at step %d in %lf s", step, secs) != 2) return -1;
    snprintf(line, cap, "%.*s", eol ? (int)(eol - p) : (int)strlen(p), p);
    return 0;
}

static char g_base[300], g_base_zero[300]; /* the losses of runs without any change (4 ranks throughout; ZeRO-1) */

/* Compares two runs' losses step by step (NaN fails) at tolerance tol (relative); prints the worst
 * difference. */
static void compare_losses(const char *what, const char *got_path, const char *want_path, int from, int to, double tol) {
    double *got = malloc((size_t)(to + 1) * sizeof *got), *want = malloc((size_t)(to + 1) * sizeof *want);
    if (!got || !want) { CHECK(0, "%s: out of memory", what); free(got), free(want); return; }
    metrics_losses(got_path, got, to), metrics_losses(want_path, want, to);
    double worst = 0;
    int bad = -1;
    for (int s = from; s <= to; s++) {
        double d = isfinite(got[s]) && isfinite(want[s]) ? fabs(got[s] - want[s]) / fabs(want[s]) : INFINITY;
        if (d > worst) worst = d;
        if (!(d <= tol) && bad < 0) bad = s;
    }
    /* (NaN is also how metrics_losses marks a step that was never written) */
    if (bad > 0 && (isnan(got[bad]) || isnan(want[bad])))
        CHECK(0, "%s: step %d has no finite loss in %s (%s): a NaN, or the run stopped before it", what, bad,
              isnan(got[bad]) ? got_path : want_path, isnan(got[bad]) ? "this run" : "the reference");
    else
        CHECK(bad < 0, "%s: step %d's loss %.9g differs from %s's %.9g (tolerance %.3g relative)", what, bad, bad > 0 ? got[bad] : 0,
              want_path, bad > 0 ? want[bad] : 0, tol);
    printf("%s: the losses of steps %d..%d equal %s's within %.3g (relative; tolerance %.3g)\n", what, from, to, want_path, worst, tol);
    free(got), free(want);
}

/* The reference of a recovery: the same job (gpt_args) without the failure, rank `victim` leaving on
 * purpose at the step the recovery resumed at. It must finish (saying must_say where not NULL), and the
 * recovered run's losses (m_fail) must equal its own (m_ref) step by step. */
static void compare_with_leave(const char *name, int victim, int resumed, const char *const *gpt_args, const char *must_say,
                               const char *m_fail, const char *m_ref) {
    char leave[32];
    snprintf(leave, sizeof leave, "%d@%d", victim, resumed);
    job ref = job_start(leave, m_ref, NULL, gpt_args);
    int rc = job_finish(&ref, JOB_LIMIT_S);
    CHECK(rc == 0 && (!must_say || strstr(job_text(&ref), must_say)), "%s: the reference run (leave %s)%s%s: rc %d\n%s", name, leave,
          must_say ? " says " : "", must_say ? must_say : "", rc, job_text(&ref));
    compare_losses(name, m_fail, m_ref, 1, STEPS, 1e-6);
    free(ref.out);
}

/* Kills (SIGKILL) or freezes (SIGSTOP) rank `victim` at a random step; checks the recovery. */
static void test_lose_one(unsigned seed, int sig, int zero) {
    const char *name = zero ? "kill (ZeRO-1)" : sig == SIGKILL ? "kill" : "freeze";
    const char *zero_gpt[] = {"--zero", "1", NULL}, *const *gpt_args = zero ? zero_gpt : NULL;
    char m_fail[300], m_ref[300];
    snprintf(m_fail, sizeof m_fail, "%s/%s%s.jsonl", g_tmp, sig == SIGKILL ? "kill" : "freeze", zero ? "_zero" : "");
    snprintf(m_ref, sizeof m_ref, "%s/%s%s_ref.jsonl", g_tmp, sig == SIGKILL ? "kill" : "freeze", zero ? "_zero" : "");
    srand(seed);
    int victim = 1 + rand() % 3, at = 20 + rand() % 100;
    job j = job_start(NULL, m_fail, NULL, gpt_args);
    if (job_test_wait_step(&j, m_fail, at, name)) return;
    pid_t before[8], after[8];
    job_ranks(j.pid, before, 8);
    int step_hit = metrics_last_step(m_fail);
    double t_sig = test_now();
    kill(before[victim], sig);
    /* the survivors resume: their processes are the ones that ran before */
    int resumed = -1;
    double secs = -1, seen_at = 0;
    char line[800] = "";
    double wait_s = 20 + 3 * atof(PEER_TIMEOUT);
    while (!job_poll(&j, 5) && test_now() - t_sig < wait_s)
        if (parse_resumed(job_text(&j), NULL, &resumed, &secs, line, sizeof line) == 0) { seen_at = test_now(); break; }
    CHECK(resumed >= 0, "%s: no recovery line within %.0f s of the signal:\n%s", name, wait_s, job_text(&j));
    if (resumed < 0) { job_kill(&j); return; }
    job_ranks(j.pid, after, 8);
    int same = 1;
    for (int r = 0; r < 4; r++)
        if (r != victim) same &= after[r] == before[r] && proc_is_running(before[r]);
    CHECK(same, "%s: the survivors' pids changed: before %d %d %d %d, after %d %d %d %d", name, before[0], before[1], before[2],
          before[3], after[0], after[1], after[2], after[3]);
    /* pdde_elastic_step_begin's bound on agreeing the new world: 2 x peer_timeout_s + 2 s after the failure is
     * known (a SIGKILL at once, a SIGSTOP when its lease of peer_timeout_s ends) */
    double detect_bound = (sig == SIGKILL ? 0 : atof(PEER_TIMEOUT)) + 2 * atof(PEER_TIMEOUT) + 2.0;
    CHECK(seen_at - t_sig <= detect_bound, "%s: resumed %.2f s after the signal (bound %.1f s)", name, seen_at - t_sig, detect_bound);
    char want[64];
    snprintf(want, sizeof want, "rank %d lost (%s)", victim, sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
    CHECK(strstr(line, want) && strstr(line, "re-plan 4 -> 3 ranks: dp=3"), "%s: the log line names the cause and the plan: %s",
          name, line);
    printf("%s: rank %d at step ~%d (seed %u): %s (seen %.2f s after the signal)\n", name, victim, step_hit, seed, line,
           seen_at - t_sig);
    if (sig == SIGSTOP) {
        job_signal_rank(before[victim], SIGCONT); /* the stale rank comes back: it must find itself fenced */
        int waited = 0;
        while (!job_poll(&j, 20) && proc_is_running(before[victim]) && waited++ < 400) {}
    }
    int rc = job_finish(&j, JOB_LIMIT_S);
    CHECK(rc == 0 && strstr(job_text(&j), "3 ranks finished, 1 lost"), "%s: the job finishes on 3 ranks: rc %d\n%s", name, rc,
          job_text(&j));
    if (sig == SIGSTOP)
        CHECK(strstr(job_text(&j), "fenced") != NULL, "freeze: the continued rank says it was fenced:\n%s", job_text(&j));
    double loss[STEPS + 1];
    int again = metrics_losses(m_fail, loss, STEPS);
    /* (split state: the newest snapshot whose copy reached the next rank, one step older at worst) */
    CHECK(again >= 0 && again <= 1 + zero, "%s: %d steps lost and done again (snapshot interval 1)", name, again);
    compare_with_leave(name, victim, resumed, gpt_args, "left at step", m_fail, m_ref);
    /* and a run that never changed (4 ranks throughout): the same training up to the reductions'
     * rounding, which the training then amplifies: the steps up to 10 after the resume */
    compare_losses(name, m_fail, zero ? g_base_zero : g_base, 1, resumed + 10, 1e-4);
    free(j.out);
}

/* A survivor a step behind: under ZeRO-1, member `lag` waits at the boundary before step `at`
 * (PDDE_TEST_ELASTIC_LAG) while the others begin that step (and take its snapshot); a rank killed
 * then reaches it before it begins the step. The survivors resume at the step before, all with the
 * same snapshots (none newer kept), take the next one together (their ring copies meet) and finish:
 * within a bound (a member waiting for a copy that never comes would wait for the world's timeout),
 * with the losses of a run where the killed rank leaves at the resume step. */
static void test_lagging_survivor(unsigned seed) {
    char m_fail[300], m_ref[300], lag[32];
    snprintf(m_fail, sizeof m_fail, "%s/lag.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/lag_ref.jsonl", g_tmp);
    srand(seed * 5 + 3);
    int victim = 1 + rand() % 3, lagging = victim % 3 + 1, at = 20 + rand() % 60;
    const char *zero_gpt[] = {"--zero", "1", NULL};
    snprintf(lag, sizeof lag, "%d@%d", lagging, at);
    setenv("PDDE_TEST_ELASTIC_LAG", lag, 1);
    job j = job_start(NULL, m_fail, NULL, zero_gpt);
    unsetenv("PDDE_TEST_ELASTIC_LAG");
    if (job_test_wait_step(&j, m_fail, at, "lagging survivor")) return;
    pid_t pids[8];
    job_ranks(j.pid, pids, 8);
    usleep(300000); /* (the others are inside step `at`; the lagging one waits before it) */
    double t_kill = test_now();
    job_signal_rank(pids[victim], SIGKILL);
    int rc = job_finish(&j, t_kill - j.t0 + JOB_LIMIT_S);
    int resumed = -1, again = -1;
    double secs;
    char line[800] = "", line2[800];
    parse_resumed(job_text(&j), NULL, &resumed, &secs, line, sizeof line);
    const char *first = strstr(job_text(&j), "resumed at step ");
    if (first) parse_resumed(job_text(&j), first + 1, &again, &secs, line2, sizeof line2);
    /* one recovery, in step: members out of step (their ring copies do not meet) wait out the copy's bound
     * and re-form again (elastic_exchange_end's "out of step" line), however fast the machine */
    CHECK(again < 0 && !strstr(job_text(&j), "out of step"), "lagging survivor: one recovery, the members in step after it:\n%s",
          job_text(&j));
    CHECK(rc == 0 && strstr(job_text(&j), "3 ranks finished, 1 lost") && resumed == at - 1,
          "lagging survivor (rank %d behind, rank %d killed at step %d): the job finishes on 3 ranks, resumed at step %d (want %d), "
          "%.1f s after the kill: rc %d\n%s", lagging, victim, at, resumed, at - 1, test_now() - t_kill, rc, job_text(&j));
    printf("lagging survivor: rank %d behind, rank %d killed at step %d (seed %u): %s; finished %.1f s after the kill\n", lagging,
           victim, at, seed, line, test_now() - t_kill);
    if (rc || resumed < 0) { free(j.out); return; }
    compare_with_leave("lagging survivor", victim, resumed, zero_gpt, NULL, m_fail, m_ref);
    free(j.out);
}

/* A member stalled longer than its lease (a process starved of the CPU; PDDE_TEST_ELASTIC_STALL pauses
 * its heartbeat and the member at a random step): the store drops it and sets its death notice while
 * its world stays up. When it runs again its renewal is refused: it stops at that step boundary,
 * saying it was fenced, and the others re-form without it at once (not at the next change, where a
 * planned leave or join would then fail for everyone); the losses equal a run where it leaves at the
 * resume step. */
static void test_stalled_member(unsigned seed) {
    char m_fail[300], m_ref[300], stall[32];
    snprintf(m_fail, sizeof m_fail, "%s/stall.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/stall_ref.jsonl", g_tmp);
    srand(seed * 11 + 7);
    int victim = 1 + rand() % 3, at = 20 + rand() % 80;
    snprintf(stall, sizeof stall, "%d@%d", victim, at);
    setenv("PDDE_TEST_ELASTIC_STALL", stall, 1);
    job j = job_start(NULL, m_fail, NULL, NULL);
    unsetenv("PDDE_TEST_ELASTIC_STALL");
    int rc = job_finish(&j, JOB_LIMIT_S), resumed = -1;
    double secs;
    char line[800] = "", want[64], fenced[32];
    parse_resumed(job_text(&j), NULL, &resumed, &secs, line, sizeof line);
    snprintf(want, sizeof want, "rank %d lost", victim);
    snprintf(fenced, sizeof fenced, "[%d] gpt: ", victim);
    const char *said = strstr(job_text(&j), fenced);
    while (said && !strstr(said, "fenced")) said = strstr(said + 1, fenced);
    CHECK(rc == 0 && strstr(line, want) && strstr(line, "re-plan 4 -> 3 ranks") && strstr(job_text(&j), "3 ranks finished, 1 lost") &&
          said && strstr(job_text(&j), "dropped by the store"),
          "stalled member (rank %d at step %d): the store drops it, it stops (fenced) and the others finish on 3 ranks: rc %d\n%s",
          victim, at, rc, job_text(&j));
    printf("stalled member: rank %d stalled at step %d (seed %u): %s\n", victim, at, seed, line);
    if (rc || resumed < 0) { free(j.out); return; }
    compare_with_leave("stalled member", victim, resumed, NULL, NULL, m_fail, m_ref);
    free(j.out);
}

/* Re-planning (gpt --plan auto under --elastic): the planner picks the plan for 4 ranks at the start
 * and, after a rank is killed, the plan for the 3 left (pdde_plan_replan on the devices of a cluster
 * file: one machine's CPU); the transition's line names that plan, and the losses equal those of a
 * run where the killed rank leaves at the resume step (the same re-plan there). */
static void test_replan(unsigned seed) {
    char m_fail[300], m_ref[300], cluster[300];
    snprintf(m_fail, sizeof m_fail, "%s/replan.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/replan_ref.jsonl", g_tmp);
    snprintf(cluster, sizeof cluster, "%s/cluster.json", g_tmp);
    FILE *f = fopen(cluster, "w");
    if (!f) { CHECK(0, "replan: cannot write %s", cluster); return; }
    fputs("{\"format\": \"pdde-cluster\", \"version\": 1, \"name\": \"test\",\n"
          " \"specs\": [{\"name\": \"cpu\", \"kind\": \"cpu\", \"backend\": \"cpu\", \"peak_flops\": 5e10, \"mem_bandwidth\": 1e10, \"gemm\": [],\n"
          "  \"curves\": {\"elementwise\": [[49152, 2e-5]], \"row\": [], \"attention\": [], \"embedding\": [], \"optimizer\": []}}],\n"
          " \"machines\": [{\"id\": 0, \"name\": \"host\", \"cores\": 2, \"numa_nodes\": 1, \"host_memory\": 8000000000, \"l3_cache\": 0,\n"
          "  \"intra\": {\"kind\": \"shm\", \"bandwidth\": 5e9, \"latency\": 2e-6, \"group\": -1},\n"
          "  \"nic\": {\"kind\": \"net\", \"bandwidth\": 0, \"latency\": 0, \"group\": -1},\n"
          "  \"devices\": [{\"id\": 0, \"spec\": \"cpu\", \"memory\": 8000000000}]}],\n"
          " \"links\": [], \"collectives\": []}\n", f);
    fclose(f);
    const char *auto_gpt[] = {"--plan", "auto", "--cluster", cluster, NULL};
    srand(seed * 11 + 7);
    int victim = 1 + rand() % 3, at = 20 + rand() % 80;
    job j = job_start(NULL, m_fail, NULL, auto_gpt);
    if (job_test_wait_step(&j, m_fail, at, "replan")) return;
    pid_t pids[8];
    job_ranks(j.pid, pids, 8);
    job_signal_rank(pids[victim], SIGKILL);
    int rc = job_finish(&j, JOB_LIMIT_S), resumed = -1;
    double secs;
    char line[800] = "", chose4[200] = "", chose3[200] = "", want[240];
    parse_resumed(job_text(&j), NULL, &resumed, &secs, line, sizeof line);
    const char *t = job_text(&j), *c4 = strstr(t, "the planner chose "), *c3 = c4 ? strstr(c4 + 1, "the planner chose ") : NULL;
    if (c4) sscanf(c4, "the planner chose %199s for 4 ranks", chose4);
    if (c3) sscanf(c3, "the planner chose %199s for 3 ranks", chose3);
    snprintf(want, sizeof want, "re-plan 4 -> 3 ranks: %s;", chose3);
    CHECK(rc == 0 && !strncmp(chose4, "dp=4,", 5) && !strncmp(chose3, "dp=3,", 5) && strstr(line, want) &&
          strstr(t, "3 ranks finished, 1 lost"), "replan: the planner's plans for 4 ranks (%s) and, after rank %d was killed, for 3 (%s) "
          "run and the transition names the new one: rc %d\n%s", chose4, victim, chose3, rc, t);
    printf("replan: rank %d killed at step ~%d (seed %u): the planner chose %s for 4 ranks, %s for 3: %s\n", victim, at, seed, chose4,
           chose3, line);
    if (rc || resumed < 0) { free(j.out); return; }
    compare_with_leave("replan", victim, resumed, auto_gpt, want, m_fail, m_ref); /* (the same re-plan) */
    free(j.out);
}

/* The loss of step `step` in a metrics file (NaN when none). */
static double metrics_loss_at(const char *path, int step) {
    double loss[STEPS + 1];
    metrics_losses(path, loss, STEPS);
    return step >= 1 && step <= STEPS ? loss[step] : NAN;
}

/* Fault-tolerant data parallelism without re-splitting the batch (gpt --ft-replicas): each of the 4 ranks keeps
 * its replica's 3 rows of every 12-row batch; rank `victim` (1 or 2: not the last rows) is killed; the
 * survivors redo the step from its snapshot over their own 9 rows and go on with them. Checked:
 *  - the losses equal a run where the replica leaves at the resume step (1e-6);
 *  - a replica set averages over exactly its samples: at the resume step, the losses of two runs that
 *    keep 2 replicas each (the victim's and replica 3's; the other two), half and half, are the loss
 *    of the run without changes over all 12 rows (1e-5). */
static void test_ft_replicas(unsigned seed) {
    char m_fail[300], m_ref[300], m_alone[300];
    snprintf(m_fail, sizeof m_fail, "%s/ft.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/ft_ref.jsonl", g_tmp);
    snprintf(m_alone, sizeof m_alone, "%s/ft_alone.jsonl", g_tmp);
    srand(seed * 17 + 5);
    int victim = 1 + rand() % 2, at = 20 + rand() % 80;
    const char *ft_gpt[] = {"--ft-replicas", NULL};
    job j = job_start(NULL, m_fail, NULL, ft_gpt);
    if (job_test_wait_step(&j, m_fail, at, "ft replicas")) return;
    pid_t pids[8];
    job_ranks(j.pid, pids, 8);
    job_signal_rank(pids[victim], SIGKILL);
    int rc = job_finish(&j, JOB_LIMIT_S), resumed = -1;
    double secs;
    char line[800] = "", want[64];
    parse_resumed(job_text(&j), NULL, &resumed, &secs, line, sizeof line);
    snprintf(want, sizeof want, "batch 9: the samples of replica %d dropped", victim);
    CHECK(rc == 0 && strstr(line, want) && strstr(job_text(&j), "3 ranks finished, 1 lost"),
          "ft replicas: rank %d killed: the survivors go on with their rows (%s): rc %d\n%s", victim, want, rc, job_text(&j));
    printf("ft replicas: rank %d killed at step ~%d (seed %u): %s\n", victim, at, seed, line);
    if (rc || resumed < 0) { free(j.out); return; }
    compare_with_leave("ft replicas", victim, resumed, ft_gpt, want, m_fail, m_ref);
    /* two runs of 2 replicas each from the resume step: P keeps the victim's and replica 3's rows, Q the
     * other two; together their rows are all 12 */
    int q0 = -1, q1 = -1;
    for (int r = 0; r < 3; r++)
        if (r != victim) { if (q0 < 0) q0 = r; else q1 = r; }
    char left_p[64], left_q[64], m_q[300];
    snprintf(left_p, sizeof left_p, "%d@%d,%d@%d", q0, resumed, q1, resumed);
    snprintf(left_q, sizeof left_q, "%d@%d,%d@%d", victim, resumed, 3, resumed);
    snprintf(m_q, sizeof m_q, "%s/ft_q.jsonl", g_tmp);
    job alone = job_start(left_p, m_alone, NULL, ft_gpt), q = job_start(left_q, m_q, NULL, ft_gpt);
    int rc_p = job_finish(&alone, JOB_LIMIT_S), rc_q = job_finish(&q, JOB_LIMIT_S);
    double lp = metrics_loss_at(m_alone, resumed + 1), lq = metrics_loss_at(m_q, resumed + 1), l12 = metrics_loss_at(g_base, resumed + 1);
    double mix = (6 * lp + 6 * lq) / 12, d = fabs(mix - l12) / fabs(l12);
    CHECK(rc_p == 0 && rc_q == 0 && d <= 1e-5, "ft replicas: at step %d, 6/12 x the loss of replicas %d and 3 alone %.9g + 6/12 x that of "
          "replicas %d and %d %.9g = %.9g, the loss over all 12 rows %.9g (difference %.3g, tolerance 1e-5): rc %d %d\n%s\n%s", resumed + 1,
          victim, lp, q0, q1, lq, mix, l12, d, rc_p, rc_q, rc_p ? job_text(&alone) : "", rc_q ? job_text(&q) : "");
    printf("ft replicas: step %d: (6 x %.7f + 6 x %.7f) / 12 = %.7f; all 12 rows %.7f (difference %.2g relative); the survivors' 9 rows %.7f\n",
           resumed + 1, lp, lq, mix, l12, d, metrics_loss_at(m_fail, resumed + 1));
    free(q.out);
    free(j.out), free(alone.out);
}

/* A signal asks a rank to leave (SIGTERM, as a scheduler preempting one node): gpt under pdde-run --elastic
 * leaves at the next step boundary, exit 143; the others, told at that boundary, re-form from its snapshot
 * (taken for the leave: snapshots every 1000 steps here) with no step lost or done again, and finish
 * (--max-restarts 0: a leave taken for a failure would stop the job); pdde-run counts it as left, not
 * lost. The losses equal (1e-6 relative) a run where it leaves at that step on purpose (PDDE_ELASTIC_LEAVE).
 * Then SIGTERM to every rank: each leaves at a boundary, the last together stop (PDDE_ELASTIC_STOP),
 * saving a checkpoint there, and the job exits 143; gpt --resume goes on from that step. */
#define LEAVE_STEPS 2000
/* gpt --resume on one process (no launcher) from the checkpoint a stopped job saved in ck goes on from step stopped_at. */
static void check_resumes_from(const char *what, const char *ck, int stopped_at) {
    char steps[16], want[400], m_resume[300];
    snprintf(steps, sizeof steps, "%d", stopped_at + 2);
    snprintf(m_resume, sizeof m_resume, "%s.resume.jsonl", ck);
    char *argv[] = {g_gpt, "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", steps, "--val-every",
                    "0", "--sample-len", "0", "--threads", "1", "--metrics", m_resume, "--ckpt-dir", (char *)ck, "--resume", NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", NULL};
    job r = job_spawn(argv, env);
    int rc = job_finish(&r, JOB_LIMIT_S);
    snprintf(want, sizeof want, "resumed from %s at step %d", ck, stopped_at);
    CHECK(rc == 0 && strstr(job_text(&r), want), "%s: gpt --resume goes on from step %d: rc %d\n%s", what, stopped_at, rc, job_text(&r));
    free(r.out);
}

static void test_signal_leave(unsigned seed) {
    const char *run3[] = {"-n", "3", "--min", "1", "--max-restarts", "0", "--peer-timeout", PEER_TIMEOUT_PLANNED, NULL};
    const char *longer[] = {"--steps", "2000", NULL};
    char m[300], m_ref[300], said[96], want_exit[160], want_line[160], line[800] = "";
    snprintf(m, sizeof m, "%s/sigleave.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/sigleave_ref.jsonl", g_tmp);
    srand(seed * 5 + 3);
    int victim = 1 + rand() % 2, at = 50 + rand() % 150, left_at = -1, resumed = -1;
    setenv("PDDE_ELASTIC_SNAPSHOT_EVERY", "1000", 1);
    job j = job_start(NULL, m, run3, longer);
    if (job_test_wait_step(&j, m, at, "signal leave")) { unsetenv("PDDE_ELASTIC_SNAPSHOT_EVERY"); return; }
    pid_t pids[8];
    job_ranks(j.pid, pids, 8);
    int signalled_at = metrics_last_step(m);
    job_signal_rank(pids[victim], SIGTERM);
    int rc = job_finish(&j, JOB_LIMIT_S);
    const char *t = job_text(&j), *p;
    snprintf(said, sizeof said, "gpt: rank %d leaves the job at step ", victim);
    if ((p = strstr(t, said))) left_at = atoi(p + strlen(said));
    snprintf(want_exit, sizeof want_exit, "rank %d (pid %d) left the job at a step boundary (exit status 143)", victim, (int)pids[victim]);
    snprintf(want_line, sizeof want_line, "elastic: rank %d left at step %d; re-plan 3 -> 2 ranks: dp=2", victim, left_at);
    double secs;
    parse_resumed(t, NULL, &resumed, &secs, line, sizeof line);
    CHECK(rc == 0 && left_at >= signalled_at && strstr(t, "asked by") && strstr(t, want_exit) && strstr(line, want_line) &&
          resumed == left_at && !strstr(t, "lost") && strstr(t, "2 ranks finished, 1 left at a step boundary"),
          "signal leave: rank %d signalled at step ~%d leaves at %d, the others resume there: rc %d, resumed at %d\n%s", victim,
          signalled_at, left_at, rc, resumed, t);
    double loss[LEAVE_STEPS + 1];
    int again = metrics_losses(m, loss, LEAVE_STEPS), all = 1;
    for (int s = 1; s <= LEAVE_STEPS; s++) all &= isfinite(loss[s]);
    CHECK(again == 0 && all, "signal leave: no step done again (%d) and every step's loss finite (%d)", again, all);
    printf("signal leave: rank %d, SIGTERM at step ~%d (seed %u): %s\n", victim, signalled_at, seed, line);
    if (left_at > 0) {
        char leave[32];
        snprintf(leave, sizeof leave, "%d@%d", victim, left_at);
        job ref = job_start(leave, m_ref, run3, longer);
        rc = job_finish(&ref, JOB_LIMIT_S);
        CHECK(rc == 0 && strstr(job_text(&ref), "left at step"), "signal leave: the reference (leave %s): rc %d\n%s", leave, rc, job_text(&ref));
        compare_losses("signal leave", m, m_ref, 1, LEAVE_STEPS, 1e-6);
        free(ref.out);
    }
    unsetenv("PDDE_ELASTIC_SNAPSHOT_EVERY");
    free(j.out);
    /* every rank signalled: a clean stop, saved */
    char ck[300], m_all[300];
    snprintf(ck, sizeof ck, "%s/sigleave_ckpt", g_tmp);
    snprintf(m_all, sizeof m_all, "%s/sigleave_all.jsonl", g_tmp);
    const char *endless_ckpt[] = {"--steps", "20000", "--ckpt-dir", ck, NULL}; /* (running when signalled; ending if never stopped) */
    job a = job_start(NULL, m_all, run3, endless_ckpt);
    if (job_test_wait_step(&a, m_all, 30, "signal all")) return;
    job_ranks(a.pid, pids, 8);
    for (int r = 0; r < 3; r++) job_signal_rank(pids[r], SIGTERM);
    rc = job_finish(&a, JOB_LIMIT_S);
    t = job_text(&a);
    int stopped_at = -1;
    if ((p = strstr(t, "gpt: Terminated: stopped after step "))) stopped_at = atoi(p + strlen("gpt: Terminated: stopped after step "));
    CHECK(rc == 143 && stopped_at > 0 && strstr(t, "saved a checkpoint in") && !strstr(t, "lost") &&
          strstr(t, "every rank left the job at a step boundary: it stopped cleanly (exit status 143)"),
          "signal all: every rank stops at a boundary, saved: rc %d, stopped after step %d\n%s", rc, stopped_at, t);
    if (stopped_at > 0) check_resumes_from("signal all", ck, stopped_at); /* the checkpoint holds that step */
    free(a.out);
}

/* SIGTERM to one rank of three under --min 3: its departure would leave fewer than --min, so every rank stops at
 * that boundary (PDDE_ELASTIC_STOP) instead of re-forming into the "fewer than the minimum" error: the survivors
 * save a checkpoint of that step, every rank exits 143 (the signal the leaver was asked by: the others learn it
 * at the boundary), and pdde-run says why the job stopped; gpt --resume goes on from that step. */
static void test_signal_below_min(unsigned seed) {
    const char *run3_min3[] = {"-n", "3", "--min", "3", "--max-restarts", "0", "--peer-timeout", PEER_TIMEOUT_PLANNED, NULL};
    char ck[300], m[300], want_exit[160];
    snprintf(ck, sizeof ck, "%s/belowmin_ckpt", g_tmp);
    snprintf(m, sizeof m, "%s/belowmin.jsonl", g_tmp);
    const char *endless_ckpt[] = {"--steps", "20000", "--ckpt-dir", ck, NULL}; /* (running when signalled; ending if never stopped) */
    srand(seed * 11 + 5);
    int victim = rand() % 3;
    job j = job_start(NULL, m, run3_min3, endless_ckpt);
    if (job_test_wait_step(&j, m, 20, "signal below min")) return;
    pid_t pids[8];
    job_ranks(j.pid, pids, 8);
    job_signal_rank(pids[victim], SIGTERM);
    int rc = job_finish(&j, JOB_LIMIT_S), stopped_at = -1, all_143 = 1;
    const char *t = job_text(&j), *p, *said = "gpt: Terminated: stopped after step ";
    if ((p = strstr(t, said))) stopped_at = atoi(p + strlen(said));
    for (int r = 0; r < 3; r++) {
        snprintf(want_exit, sizeof want_exit, "rank %d (pid %d) left the job at a step boundary (exit status 143)", r, (int)pids[r]);
        all_143 &= strstr(t, want_exit) != NULL;
    }
    CHECK(rc == 143 && stopped_at > 0 && all_143 && strstr(t, "saved a checkpoint in") && strstr(t, "fewer than --min ranks would remain") &&
          strstr(t, "stopped cleanly at a step boundary: fewer than --min 3 ranks would remain (exit status 143)") && !strstr(t, "lost") &&
          !strstr(t, "fewer than the minimum") && !strstr(t, "the others go on"),
          "signal below min: SIGTERM to rank %d of 3 under --min 3: every rank stops at one boundary, saved, exit 143 each: rc %d, "
          "stopped after step %d\n%s", victim, rc, stopped_at, t);
    printf("signal below min: SIGTERM to rank %d (seed %u): all 3 stopped after step %d, saved, exit 143\n", victim, seed, stopped_at);
    if (stopped_at > 0) check_resumes_from("signal below min", ck, stopped_at); /* the checkpoint holds that step */
    free(j.out);
    /* a planned departure alone (no signal) below --min: the same stop, saved, exit 75 (the job did not finish) */
    char ck_planned[300];
    snprintf(ck_planned, sizeof ck_planned, "%s/belowmin_planned_ckpt", g_tmp);
    const char *planned_ckpt[] = {"--steps", "200", "--ckpt-dir", ck_planned, NULL};
    job pl = job_start("2@20", m, run3_min3, planned_ckpt);
    rc = job_finish(&pl, JOB_LIMIT_S);
    t = job_text(&pl);
    CHECK(rc == 75 && strstr(t, "gpt: fewer than --min ranks would remain: stopped after step 20, saved a checkpoint in") &&
          strstr(t, "fewer than --min 3 ranks would remain (exit status 75)") && !strstr(t, "lost") && !strstr(t, "fewer than the minimum"),
          "planned below min: rank 2 leaving at step 20 under --min 3: every rank stops there, saved, exit 75: rc %d\n%s", rc, t);
    check_resumes_from("planned below min", ck_planned, 20);
    free(pl.out);
}

/* Two failures in a row: 4 -> 3 -> 2 ranks; and planned shrinks 4 -> 2 and 2 -> 1 at one step. */
static void test_two_failures(unsigned seed) {
    char m[300];
    snprintf(m, sizeof m, "%s/two.jsonl", g_tmp);
    srand(seed * 7 + 1);
    int at1 = 20 + rand() % 40, at2 = at1 + 30 + rand() % 40;
    job j = job_start(NULL, m, NULL, NULL);
    pid_t pids[8];
    int ok = !job_wait_step(&j, m, at1, JOB_STEP_LIMIT_S);
    job_ranks(j.pid, pids, 8);
    if (ok) job_signal_rank(pids[2], SIGKILL);
    ok = ok && !job_wait_step(&j, m, at2, JOB_STEP_LIMIT_S) && strstr(job_text(&j), "resumed at step");
    job_ranks(j.pid, pids, 8);
    if (ok && pids[1]) job_signal_rank(pids[1], SIGKILL);
    int rc = job_finish(&j, JOB_LIMIT_S);
    const char *t = job_text(&j), *first = strstr(t, "re-plan 4 -> 3"), *second = strstr(t, "re-plan 3 -> 2");
    CHECK(ok && rc == 0 && first && second && strstr(t, "2 ranks finished, 2 lost"),
          "two failures: 4 -> 3 -> 2 ranks and the job finishes: rc %d\n%s", rc, t);
    double loss[STEPS + 1];
    int again = metrics_losses(m, loss, STEPS), all = 1;
    for (int s = 1; s <= STEPS; s++) all &= isfinite(loss[s]);
    CHECK(all && again <= 2, "two failures: every step has a finite loss, %d done again", again);
    free(j.out);
    /* planned: ranks 1 and 3 leave at step 30 */
    snprintf(m, sizeof m, "%s/shrink.jsonl", g_tmp);
    const char *planned[] = {"--peer-timeout", PEER_TIMEOUT_PLANNED, NULL};
    job s = job_start("1@30,3@30", m, planned, NULL);
    rc = job_finish(&s, JOB_LIMIT_S);
    CHECK(rc == 0 && strstr(job_text(&s), "rank 1 left, rank 3 left at step 30; re-plan 4 -> 2 ranks: dp=2"),
          "shrink 4 -> 2 at step 30: rc %d\n%s", rc, job_text(&s));
    free(s.out);
    /* down to one rank (it runs as one process), under ZeRO-1: the split state made whole there; the
     * losses go on as those of 2 ranks without changes */
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/shrink1.jsonl", g_tmp);
    snprintf(m2, sizeof m2, "%s/two_zero.jsonl", g_tmp);
    const char *two[] = {"-n", "2", "--min", "1", "--peer-timeout", PEER_TIMEOUT_PLANNED, NULL}, *zero_gpt[] = {"--zero", "1", NULL};
    job one = job_start("0@30", m1, two, zero_gpt), base = job_start(NULL, m2, two, zero_gpt);
    rc = job_finish(&one, JOB_LIMIT_S);
    int rc_base = job_finish(&base, JOB_LIMIT_S);
    CHECK(rc == 0 && rc_base == 0 && strstr(job_text(&one), "rank 0 left at step 30; re-plan 2 -> 1 ranks: dp=1"),
          "shrink 2 -> 1 at step 30 (ZeRO-1): rc %d (base %d)\n%s", rc, rc_base, job_text(&one));
    compare_losses("shrink 2 -> 1", m1, m2, 1, 40, 1e-4);
    free(one.out), free(base.out);
}

/* Grow: a job of 2 ranks (--max 4), then 2 more with pdde-run --join: the members take them in at a
 * step boundary and hand them the state; the losses continue as a run of 4 ranks throughout. */
static void test_grow(void) {
    char m[300], rdzv[128];
    snprintf(m, sizeof m, "%s/grow.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "tcp://127.0.0.1:%d/grow", job_free_port());
    /* (job_start passes -n 4 --min 2: the last of each wins) */
    const char *two[] = {"-n", "2", "--max", "4", "--min", "1", "--rdzv", rdzv, "--peer-timeout", PEER_TIMEOUT_PLANNED, NULL};
    char m_base2[300];
    snprintf(m_base2, sizeof m_base2, "%s/base2.jsonl", g_tmp);
    const char *two_alone[] = {"-n", "2", NULL};
    /* (a longer job than the others: 240 steps take well under a second, and the joiners' processes must
     * start and register before it ends) */
    const char *longer[] = {"--steps", "3000", NULL};
    job base2 = job_start(NULL, m_base2, two_alone, longer);
    int rc_base = job_finish(&base2, JOB_LIMIT_S);
    free(base2.out);
    job a = job_start(NULL, m, two, longer);
    int ok = !job_wait_step(&a, m, 20, JOB_STEP_LIMIT_S) && rc_base == 0;
    char m2[300];
    snprintf(m2, sizeof m2, "%s/grow_joiners.jsonl", g_tmp);
    const char *joiners[] = {"-n", "2", "--join", "--min", "1", "--rdzv", rdzv, "--peer-timeout", PEER_TIMEOUT_PLANNED, NULL};
    job b = job_start(NULL, m2, joiners, longer);
    int rc_b = job_finish(&b, JOB_LIMIT_S), rc_a = job_finish(&a, JOB_LIMIT_S);
    const char *t = job_text(&a);
    int at = -1;
    double secs;
    char line[800] = "";
    parse_resumed(t, NULL, &at, &secs, line, sizeof line);
    /* (the two may be taken in together or one after the other) */
    CHECK(ok && rc_a == 0 && rc_b == 0 && strstr(line, "joined at step") && strstr(t, "ranks: dp=4") && !strstr(t, "lost"),
          "grow 2 -> 4: rc %d and %d (joiners)\n%s\n--- joiners:\n%s", rc_a, rc_b, t, job_text(&b));
    printf("grow: %s\n", line);
    /* the same training as 2 ranks without changes, up to the reductions' rounding (4 ranks after) */
    if (at > 0) compare_losses("grow", m, m_base2, 1, at + 10, 1e-4);
    free(a.out), free(b.out);
    /* a joiner whose job is not there (nothing listens at its --rdzv): an error within seconds, no rank started */
    char nojob[128], m3[300];
    snprintf(nojob, sizeof nojob, "tcp://127.0.0.1:%d/none", job_free_port());
    snprintf(m3, sizeof m3, "%s/nojob.jsonl", g_tmp);
    const char *lone[] = {"-n", "1", "--join", "--rdzv", nojob, NULL};
    double t0 = test_now();
    job c = job_start(NULL, m3, lone, NULL);
    int rc_c = job_finish(&c, JOB_LIMIT_S);
    CHECK(rc_c == 2 && strstr(job_text(&c), "no job store at") && test_now() - t0 < 20, "a joiner with no job: rc %d in %.1f s\n%s", rc_c,
          test_now() - t0, job_text(&c));
    free(c.out);
}

/* A member lost while the next world forms: member 2 dies right after the members of the generation
 * after a kill are agreed; the others see its death notice while that world forms (no timeout) and
 * form the next without it, within seconds. */
static void test_lost_while_forming(unsigned seed) {
    char m[300];
    snprintf(m, sizeof m, "%s/forming.jsonl", g_tmp);
    setenv("PDDE_TEST_ELASTIC_DIE_FORMING", "2", 1);
    job j = job_start(NULL, m, NULL, NULL);
    unsetenv("PDDE_TEST_ELASTIC_DIE_FORMING");
    srand(seed * 3 + 11);
    pid_t pids[8];
    double t_kill = 0, t_resumed = 0;
    if (!job_wait_step(&j, m, 15 + rand() % 30, JOB_STEP_LIMIT_S)) {
        job_ranks(j.pid, pids, 8);
        job_signal_rank(pids[3], SIGKILL);
        t_kill = test_now();
        while (!job_poll(&j, 5) && !strstr(job_text(&j), "resumed at step") && test_now() - t_kill < 30) {}
        t_resumed = test_now();
    }
    int rc = job_finish(&j, JOB_LIMIT_S);
    const char *t = job_text(&j);
    double bound = 2 * atof(PEER_TIMEOUT) + 2; /* (the agreement's bound on members not heard from: none here) */
    CHECK(t_kill && t_resumed - t_kill < bound, "a member lost while the world forms: resumed %.2f s after the first kill (bound %.1f s)",
          t_resumed - t_kill, bound);
    CHECK(rc == 0 && strstr(t, "rank 3 lost (SIGKILL)") && strstr(t, "then rank 2 lost") && strstr(t, "re-plan 4 -> 2 ranks") &&
          strstr(t, "2 ranks finished, 2 lost"), "a member lost while the next world forms: rc %d\n%s", rc, t);
    double loss[STEPS + 1];
    int again = metrics_losses(m, loss, STEPS), all = 1;
    for (int s = 1; s <= STEPS; s++) all &= isfinite(loss[s]);
    CHECK(all && again <= 1, "lost while forming: every step has a finite loss, %d done again", again);
    free(j.out);
}

/* Errors that would repeat stop the job, with a message saying why. */
static void test_stops(unsigned seed) {
    char m[300];
    snprintf(m, sizeof m, "%s/stop.jsonl", g_tmp);
    const char *no_restarts[] = {"--max-restarts", "0", NULL};
    /* (steps enough that the job cannot end before the kill, however late the kill comes: it stops at it) */
    const char *endless[] = {"--steps", "1000000", NULL};
    job j = job_start(NULL, m, no_restarts, endless);
    pid_t pids[8];
    srand(seed * 13 + 5);
    if (!job_wait_step(&j, m, 10 + rand() % 20, JOB_STEP_LIMIT_S)) {
        job_ranks(j.pid, pids, 8);
        job_signal_rank(pids[3], SIGKILL);
    }
    int rc = job_finish(&j, JOB_LIMIT_S);
    CHECK(rc != 0 && strstr(job_text(&j), "more than --max-restarts 0") && !strstr(job_text(&j), "resumed at"),
          "--max-restarts 0: one kill stops the job: rc %d\n%s", rc, job_text(&j));
    free(j.out);
    const char *huge_lr[] = {"--lr", "1e30", "--clip", "0", NULL};
    job n = job_start(NULL, m, NULL, huge_lr);
    rc = job_finish(&n, JOB_LIMIT_S);
    CHECK(rc != 0 && strstr(job_text(&n), "not finite") && strstr(job_text(&n), "the job stops") && !strstr(job_text(&n), "resumed at"),
          "a non-finite loss stops the job (no restart loop): rc %d\n%s", rc, job_text(&n));
    free(n.out);
    const char *min4[] = {"--min", "4", NULL};
    job k = job_start(NULL, m, min4, endless);
    if (!job_wait_step(&k, m, 15, JOB_STEP_LIMIT_S)) {
        job_ranks(k.pid, pids, 8);
        job_signal_rank(pids[1], SIGKILL);
    }
    rc = job_finish(&k, JOB_LIMIT_S);
    CHECK(rc != 0 && strstr(job_text(&k), "fewer than the minimum 4"), "--min 4 and a rank lost: the job stops: rc %d\n%s", rc,
          job_text(&k));
    free(k.out);
}

/* The library's example, a program that is not gpt, under a kill: it finishes on 3 ranks. */
static void test_example(const char *dir) {
    char prog[600];
    snprintf(prog, sizeof prog, "%s/elastic", dir);
    if (access(prog, X_OK)) { test_skip("build", "%s is not built", prog); return; }
    char *argv[] = {g_run, "-n", "4", "--elastic", "--min", "2", "--peer-timeout", PEER_TIMEOUT, prog, "6000", NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_NUM_THREADS=1", NULL};
    job j = job_spawn(argv, env);
    if (j.pid < 0) return;
    pid_t pids[8];
    while (job_ranks(j.pid, pids, 8) < 4 && test_now() - j.t0 < JOB_STEP_LIMIT_S) job_poll(&j, 10);
    while (!strstr(job_text(&j), "step 1000 loss") && test_now() - j.t0 < JOB_STEP_LIMIT_S) job_poll(&j, 5); /* on its way */
    job_signal_rank(pids[2], SIGKILL);
    int rc = job_finish(&j, JOB_LIMIT_S);
    CHECK(rc == 0 && strstr(job_text(&j), "rank 2 lost (SIGKILL)") && strstr(job_text(&j), "after 6000 steps on 3 ranks"),
          "examples/elastic.c: a rank killed, the job finishes on 3 ranks: rc %d\n%s", rc, job_text(&j));
    free(j.out);
}

int main(int argc, char **argv) {
    (void)argc;
    unsigned seed = 0;
    int setup = job_gpt_test_setup(argv[0], g_run, g_gpt, sizeof g_run, g_tmp, sizeof g_tmp, "/tmp/pdde-elastic.XXXXXX", &seed);
    if (setup >= 0) return setup;
    setenv("PDDE_JOB_SECRET", "test-elastic-secret-0123456789abcdef", 1); /* (the joiners must know the job's) */
    snprintf(g_pt, sizeof g_pt, "%.2f", job_peer_timeout(1.5));
    printf("peer timeout %s s (1.5 s times the load per core above 1)\n", g_pt);
    test_signal_below_min(seed);
    snprintf(g_base, sizeof g_base, "%s/base.jsonl", g_tmp);
    job base = job_start(NULL, g_base, NULL, NULL);
    int rc = job_finish(&base, JOB_LIMIT_S);
    CHECK(rc == 0 && !strstr(job_text(&base), "elastic: rank"), "a run without failures: rc %d\n%s", rc, job_text(&base));
    free(base.out);
    test_signal_leave(seed);
    test_lose_one(seed, SIGKILL, 0);
    test_lose_one(seed + 1, SIGSTOP, 0);
    snprintf(g_base_zero, sizeof g_base_zero, "%s/base_zero.jsonl", g_tmp);
    const char *zero_gpt[] = {"--zero", "1", NULL};
    job bz = job_start(NULL, g_base_zero, NULL, zero_gpt);
    rc = job_finish(&bz, JOB_LIMIT_S);
    CHECK(rc == 0, "a ZeRO-1 run without failures: rc %d\n%s", rc, job_text(&bz));
    free(bz.out);
    test_lose_one(seed + 2, SIGKILL, 1);
    test_lagging_survivor(seed);
    test_stalled_member(seed);
    test_replan(seed);
    test_ft_replicas(seed);
    test_two_failures(seed);
    test_stops(seed);
    {
        char dir[512];
        test_binary_dir(argv[0], dir, sizeof dir);
        test_example(dir);
    }
    test_grow();
    test_lost_while_forming(seed);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd)) {}
    return test_finish();
}
#endif
