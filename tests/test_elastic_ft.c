/* test_elastic_ft.c — a replica that comes back (gpt --ft-replicas under pdde-run --elastic --restart 1),
 * with real processes and a real SIGKILL: 3 replicas (4 rows each of a 12-row batch), one killed at a
 * random step. Checked:
 *  - the survivors (the same processes: their pids do not change) go on with their 8 rows, pdde-run
 *    starts the killed rank again, and the members take it in at a step boundary with a member's state
 *    ("1 rank joined", "re-plan 2 -> 3 ranks"); the job finishes on 3 ranks;
 *  - every step's loss (NaN fails) equals, at 1e-6 relative, that of a failure-free reference run in
 *    which the replica leaves at the step the survivors resumed at (PDDE_ELASTIC_LEAVE) and a process
 *    started with pdde-run --join is taken in at the step the restarted one was
 *    (PDDE_TEST_ELASTIC_ADMIT): the same samples dropped at the same steps. (The run with the kill takes
 *    the restarted rank in from 150 steps after the kill on, PDDE_TEST_ELASTIC_ADMIT, so that steps
 *    run without it: a restart is often faster than the survivors' recovery);
 *  - where no step ran without it (the restart was taken in with the recovery), the losses equal a run
 *    without any change, up to the reductions' rounding (1e-4);
 *  - the same with gpt --zero 1 (plain data parallelism, the optimizer state split over the ranks: the
 *    joiner takes part in making it whole), whose losses up to 10 steps after the join also equal a
 *    run that never takes the rank in again (1e-4: the ranks there are change only the rounding);
 *  - a rank paused briefly (SIGSTOP for 0.3 s, then SIGCONT) stays a member: a later loss re-forms
 *    the world with it in one recovery (test_brief_stop);
 *  - a joiner whose store stops answering (SIGSTOP) while it waits to be taken in, or at init for the
 *    job's maximum, stops within a few leases saying it is cut off, not at its timeout
 *    (test_joiner_cut_off); and one whose store falls silent just as it registers its lease (a relay
 *    in front of the store holds that request: test_joiner_cut_off_registering).
 * The seed of the random step is printed (PDDE_TEST_SEED repeats it). */
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
#include "comm_test_util.h"
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>

#define STEPS 4000
#define COMPARED 600 /* the steps compared: the kill comes by step 100, the restart within seconds */

static char g_run[600], g_gpt[600], g_tmp[256];

/* pdde-run [run_args] gpt (3 replicas of a tiny model, --ft-replicas) with env (NULL-terminated). */
static job ft_start(const char *const *run_args, const char *metrics, const char *const *env, const char *const *gpt_extra) {
    char *argv[64];
    int a = 0;
    static char steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    argv[a++] = g_run;
    for (int i = 0; run_args[i]; i++) argv[a++] = (char *)run_args[i];
    argv[a++] = g_gpt;
    const char *gpt[] = {"--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", steps,
                         "--val-every", "0", "--sample-len", "0", "--threads", "1", "--metrics", metrics, NULL};
    for (int i = 0; gpt[i]; i++) argv[a++] = (char *)gpt[i];
    for (int i = 0; gpt_extra[i]; i++) argv[a++] = (char *)gpt_extra[i];
    argv[a] = NULL;
    return job_spawn(argv, env);
}

/* The step of the first transition line that contains `what`; -1 when none. */
static int resumed_step(const char *text, const char *what, char *line, size_t cap) {
    for (const char *p = strstr(text, "elastic: "); p; p = strstr(p + 1, "elastic: ")) {
        const char *eol = strchr(p, '\n'), *r = strstr(p, "resumed at step ");
        if (!eol || !r || r > eol) continue;
        const char *w = strstr(p, what);
        if (!w || w > eol) continue;
        snprintf(line, cap, "%.*s", (int)(eol - p), p);
        return atoi(r + strlen("resumed at step "));
    }
    return -1;
}

static void compare(const char *what, const char *got_path, const char *want_path, int to, double tol) {
    static double got[STEPS + 1], want[STEPS + 1];
    double worst = 0;
    if (to > STEPS) to = STEPS;
    metrics_losses(got_path, got, to), metrics_losses(want_path, want, to);
    int bad = -1;
    for (int s = 1; s <= to; s++) {
        double d = isfinite(got[s]) && isfinite(want[s]) ? fabs(got[s] - want[s]) / fabs(want[s]) : INFINITY;
        if (d > worst) worst = d;
        if (!(d <= tol) && bad < 0) bad = s;
    }
    CHECK(bad < 0, "%s: step %d's loss %.9g differs from %.9g (%s; tolerance %.3g relative)", what, bad, bad > 0 ? got[bad] : 0,
          bad > 0 ? want[bad] : 0, want_path, tol);
    printf("%s: the losses of steps 1..%d equal %s's within %.3g (relative; tolerance %.3g)\n", what, to, want_path, worst, tol);
}

/* One rank of 3 killed at a random step and restarted (pdde-run --restart 1), gpt with `gpt` arguments;
 * the reference makes the same changes at the same steps and must give the same losses (1e-6). With
 * same_math (plain data parallelism: the ranks there are change only the reductions' rounding), the
 * losses up to 10 steps after the join also equal those of a run that never takes the rank in again
 * (1e-4): a joiner given wrong state would show there. */
static void test_rejoin(const char *name, int k, unsigned seed, const char *const *gpt, int same_math) {
    srand(seed * 7 + (unsigned)k);
    int victim = 1 + rand() % 2, at = 20 + rand() % 80;
    char m_fail[300], m_ref[300], m_base[300], m_join[300];
    snprintf(m_fail, sizeof m_fail, "%s/fail%d.jsonl", g_tmp, k);
    snprintf(m_ref, sizeof m_ref, "%s/ref%d.jsonl", g_tmp, k);
    snprintf(m_base, sizeof m_base, "%s/base%d.jsonl", g_tmp, k);
    snprintf(m_join, sizeof m_join, "%s/joiner%d.jsonl", g_tmp, k);
    const char *env[] = {"PDDE_ELASTIC_LEAVE", "PDDE_TEST_ELASTIC_ADMIT", "PDDE_BACKENDS=cpu", NULL};

    /* the run with the kill */
    /* (the peer timeout grows with the machine's load: a starved member would lose its lease; job_peer_timeout) */
    char peer[32];
    snprintf(peer, sizeof peer, "%.2f", job_peer_timeout(1.5));
    const char *run[] = {"-n", "3", "--elastic", "--min", "2", "--peer-timeout", peer, "--grace", "1", "--restart", "1", NULL};
    /* (the restarted rank is taken in from step at + 150 on, so that steps run without it: a restart
     * here is often faster than the survivors' recovery) */
    char admit_fail[80];
    snprintf(admit_fail, sizeof admit_fail, "PDDE_TEST_ELASTIC_ADMIT=%d", at + 150);
    const char *fail_env[] = {"PDDE_ELASTIC_LEAVE", admit_fail, "PDDE_BACKENDS=cpu", NULL};
    job j = ft_start(run, m_fail, fail_env, gpt);
    if (job_test_wait_step(&j, m_fail, at, name)) return;
    pid_t before[8], after[8];
    job_ranks(j.pid, before, 8);
    job_signal_rank(before[victim], SIGKILL);
    double t_kill = test_now();
    char lost_line[800] = "", join_line[800] = "";
    int lost_at = -1, join_at = -1;
    while (!job_poll(&j, 5) && test_now() - t_kill < JOB_STEP_LIMIT_S) {
        lost_at = resumed_step(job_text(&j), "lost (SIGKILL)", lost_line, sizeof lost_line);
        join_at = resumed_step(job_text(&j), "1 rank joined", join_line, sizeof join_line);
        if (lost_at >= 0 && join_at >= 0) break;
    }
    job_ranks(j.pid, after, 8);
    int same = 1;
    for (int r = 0; r < 3; r++)
        if (r != victim) same &= after[r] == before[r] && proc_is_running(before[r]);
    CHECK(same && after[victim] && after[victim] != before[victim],
          "%s: the survivors keep their pids and the killed rank runs again: before %d %d %d, after %d %d %d", name, before[0], before[1],
          before[2], after[0], after[1], after[2]);
    int rc = job_finish(&j, t_kill - j.t0 + JOB_LIMIT_S);
    const char *t = job_text(&j);
    char want[80], restarted[80];
    snprintf(want, sizeof want, "rank %d lost (SIGKILL)", victim);
    snprintf(restarted, sizeof restarted, "rank %d restarted", victim);
    /* (replicas: the line says the batch is not re-split and whose samples are dropped) */
    char dropped[160];
    snprintf(dropped, sizeof dropped, "each replica's rows kept (the batch not re-split), batch 8: the samples of replica %d dropped", victim);
    CHECK(rc == 0 && lost_at >= 0 && join_at >= lost_at && strstr(lost_line, want) && (same_math || strstr(lost_line, dropped)) && strstr(t, restarted) &&
              strstr(t, "re-plan 2 -> 3 ranks") && strstr(t, "3 ranks finished, 1 lost"),
          "%s: rank %d killed at step ~%d: restarted, taken in again, the job finishes on 3 ranks: rc %d (lost at %d, joined at %d)\n%s", name, victim,
          at, rc, lost_at, join_at, t);
    if (rc || lost_at < 0 || join_at < 0) { free(j.out); return; }
    printf("%s: rank %d killed at step ~%d (seed %u): %s\n  then %s\n  %d step%s without it\n", name, victim, at, seed, lost_line, join_line,
           join_at - lost_at, join_at - lost_at == 1 ? "" : "s");

    /* the reference: the replica leaves at lost_at, a process joining with pdde-run --join is taken in at join_at */
    char rdzv[128], leave[80], admit[80];
    snprintf(rdzv, sizeof rdzv, "tcp://127.0.0.1:%d/ref%d", job_free_port(), k);
    snprintf(leave, sizeof leave, "PDDE_ELASTIC_LEAVE=%d@%d", victim, lost_at);
    snprintf(admit, sizeof admit, "PDDE_TEST_ELASTIC_ADMIT=%d", join_at);
    /* (a planned leave and join: nothing to detect, so a peer timeout no load can starve) */
    const char *ref_run[] = {"-n", "3", "--elastic", "--min", "2", "--peer-timeout", "10", "--grace", "1", "--rdzv", rdzv, NULL};
    const char *join_run[] = {"-n", "1", "--elastic", "--join", "--min", "1", "--peer-timeout", "10", "--rdzv", rdzv, NULL};
    const char *ref_env[] = {leave, admit, "PDDE_BACKENDS=cpu", NULL};
    job ref = ft_start(ref_run, m_ref, ref_env, gpt);
    int started = !job_wait_step(&ref, m_ref, 1, JOB_STEP_LIMIT_S); /* (its store is up: the joiner connects to it) */
    job joiner = ft_start(join_run, m_join, ref_env, gpt);
    int rc_ref = job_finish(&ref, JOB_LIMIT_S), rc_join = job_finish(&joiner, JOB_LIMIT_S);
    CHECK(started && rc_ref == 0 && rc_join == 0 && strstr(job_text(&ref), "left") && strstr(job_text(&ref), "1 rank joined"),
          "%s: the reference (%s, %s): rc %d, joiner %d\n%s\n--- joiner:\n%s", name, leave, admit, rc_ref, rc_join, job_text(&ref),
          job_text(&joiner));
    compare(name, m_fail, m_ref, COMPARED, 1e-6);
    if (same_math) { /* the replica leaves and never comes back */
        char m_gone[300];
        snprintf(m_gone, sizeof m_gone, "%s/gone%d.jsonl", g_tmp, k);
        const char *gone_env[] = {leave, "PDDE_TEST_ELASTIC_ADMIT", "PDDE_BACKENDS=cpu", NULL};
        job gone = ft_start((const char *[]){"-n", "3", "--elastic", "--min", "2", NULL}, m_gone, gone_env, gpt);
        rc = job_finish(&gone, JOB_LIMIT_S);
        CHECK(rc == 0, "%s: a run whose rank leaves at step %d: rc %d\n%s", name, lost_at, rc, job_text(&gone));
        compare(name, m_fail, m_gone, join_at + 10, 1e-4);
        free(gone.out);
    }
    if (join_at == lost_at) { /* no step ran without it: the training of a run without changes */
        job base = ft_start((const char *[]){"-n", "3", "--elastic", NULL}, m_base, env, gpt);
        rc = job_finish(&base, JOB_LIMIT_S);
        CHECK(rc == 0, "%s: a run without changes: rc %d\n%s", name, rc, job_text(&base));
        compare(name, m_fail, m_base, COMPARED, 1e-4); /* (taken in with the recovery) */
        free(base.out);
    }
    free(j.out), free(ref.out), free(joiner.out);
}

/* A rank paused briefly is no loss: rank 1 of 3 stopped for 0.3 s (SIGSTOP, then SIGCONT) at a random
 * step goes on as a member. Then rank 2 is stopped for good: it is lost ("lost (SIGSTOP)"), and the
 * others, rank 1 among them (a note of its pause would make the new world's forming count it as
 * ended), re-form as 2 ranks in one recovery and finish; pdde-run kills the rank left stopped. The
 * losses equal, at 1e-6 relative, those of a run without the pause where rank 2 leaves at the step the
 * recovery resumed at. */
static void test_brief_stop(unsigned seed) {
    srand(seed * 11 + 5);
    int pause_at = 20 + rand() % 80;
    char m_stop[300], m_ref[300], peer[32];
    snprintf(m_stop, sizeof m_stop, "%s/brief_stop.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/brief_stop_ref.jsonl", g_tmp);
    snprintf(peer, sizeof peer, "%.2f", job_peer_timeout(1.5));
    const char *run[] = {"-n", "3", "--elastic", "--min", "2", "--peer-timeout", peer, "--grace", "1", NULL}, *none[] = {NULL};
    const char *env[] = {"PDDE_ELASTIC_LEAVE", "PDDE_TEST_ELASTIC_ADMIT", "PDDE_BACKENDS=cpu", NULL};
    job j = ft_start(run, m_stop, env, none);
    if (job_wait_step(&j, m_stop, pause_at, JOB_STEP_LIMIT_S)) {
        CHECK(0, "brief stop: the job did not reach step %d:\n%s", pause_at, job_text(&j));
        job_kill(&j);
        free(j.out);
        return;
    }
    pid_t before[8] = {0}, after[8] = {0};
    job_ranks(j.pid, before, 8);
    job_signal_rank(before[1], SIGSTOP);
    usleep(300 * 1000);
    job_signal_rank(before[1], SIGCONT);
    int step_paused = metrics_last_step(m_stop);
    usleep(500 * 1000); /* (pdde-run looks at stopped ranks every 0.1 s: it saw the pause end) */
    job_signal_rank(before[2], SIGSTOP);
    double t_stop = test_now();
    char line[800] = "";
    int resumed = -1;
    while (!job_poll(&j, 5) && test_now() - t_stop < JOB_STEP_LIMIT_S)
        if ((resumed = resumed_step(job_text(&j), "resumed", line, sizeof line)) >= 0) break;
    job_ranks(j.pid, after, 8);
    int rc = job_finish(&j, JOB_LIMIT_S);
    const char *t = job_text(&j), *second = strstr(t, "resumed at step ");
    second = second ? strstr(second + 1, "resumed at step ") : NULL;
    CHECK(rc == 0 && resumed >= 0 && strstr(line, "rank 2 lost (SIGSTOP)") && !strstr(line, "rank 1 lost") &&
              strstr(line, "re-plan 3 -> 2 ranks") && !second && strstr(t, "2 ranks finished, 1 lost") && after[0] == before[0] &&
              after[1] == before[1],
          "brief stop: rank 1 paused 0.3 s at step ~%d stays a member, rank 2 stopped for good is lost, one recovery, the job "
          "finishes on 2 ranks: rc %d, pids before %d %d %d, after %d %d %d:\n%s", step_paused, rc, before[0], before[1], before[2],
          after[0], after[1], after[2], t);
    if (rc || resumed < 0) { free(j.out); return; }
    printf("brief stop: rank 1 paused 0.3 s at step ~%d (seed %u), then %s\n", step_paused, seed, line);
    /* the reference: no pause, rank 2 leaves at the step the recovery resumed at */
    char leave[80];
    snprintf(leave, sizeof leave, "PDDE_ELASTIC_LEAVE=2@%d", resumed);
    const char *ref_run[] = {"-n", "3", "--elastic", "--min", "2", "--peer-timeout", "10", "--grace", "1", NULL};
    const char *ref_env[] = {leave, "PDDE_TEST_ELASTIC_ADMIT", "PDDE_BACKENDS=cpu", NULL};
    job ref = ft_start(ref_run, m_ref, ref_env, none);
    int rc_ref = job_finish(&ref, JOB_LIMIT_S);
    CHECK(rc_ref == 0 && strstr(job_text(&ref), "left"), "brief stop: the reference (%s): rc %d\n%s", leave, rc_ref, job_text(&ref));
    compare("brief stop", m_stop, m_ref, STEPS, 1e-6);
    free(j.out), free(ref.out);
}

/* A joiner whose store stops answering stops within a few leases, saying it is cut off, not at its
 * timeout: a `pdde-run --join` process waits in the store (its own process, used by it alone), which
 * is then stopped for good (SIGSTOP). Its client times out once and then fails at once ("still no
 * reply"), so only the time since the store last answered tells it is cut off. max_known: the job's
 * maximum is in the store, so the joiner asks to join and waits to be taken in; else it waits at init
 * for the maximum (which the job's member 0 sets; there is none here). */
static void test_joiner_cut_off(int max_known) {
    const char *what = max_known ? "joiner cut off" : "joiner cut off before the job's maximum is known";
    int port = 0;
    pid_t host = test_store_process(&port);
    CHECK(host > 0 && port > 0, "%s: the store host started", what);
    if (host <= 0 || port <= 0) { if (host > 0) kill(host, SIGKILL), waitpid(host, NULL, 0); return; }
    const char *job_name = max_known ? "cut" : "cut-init";
    char addr[64], rdzv[96], peer[32], m_join[300], key[128];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    snprintf(rdzv, sizeof rdzv, "tcp://%s/%s", addr, job_name);
    snprintf(m_join, sizeof m_join, "%s/%s_joiner.jsonl", g_tmp, job_name);
    double peer_s = job_peer_timeout(1.0), lease_s = peer_s - (peer_s / 4 < 0.25 ? peer_s / 4 : 0.25);
    snprintf(peer, sizeof peer, "%.2f", peer_s);
    pdde_store *s = NULL;
    int ok = pdde_store_connect(NULL, addr, 10, &s) == PDDE_OK;
    if (max_known) {
        snprintf(key, sizeof key, "elastic/%s/max", job_name);
        ok = ok && pdde_store_set(s, key, "4", 1) == PDDE_OK;
    }
    CHECK(ok, "%s: the store reached%s", what, max_known ? ", the job's maximum set in it" : "");
    /* (a timeout far past the bound below: the joiner must not be the one that waits it out) */
    const char *join_run[] = {"-n", "1", "--elastic", "--join", "--min", "1", "--peer-timeout", peer, "--rdzv", rdzv, NULL};
    const char *env[] = {"PDDE_ELASTIC_TIMEOUT=100", "PDDE_ELASTIC_LEAVE", "PDDE_TEST_ELASTIC_ADMIT", "PDDE_BACKENDS=cpu", NULL};
    static const char *const none[] = {NULL};
    job j = ft_start(join_run, m_join, env, none);
    /* waiting: its request to join is in the store; or (no maximum) it took its id, the call before
     * it registers its lease and starts to wait for the maximum */
    snprintf(key, sizeof key, max_known ? "elastic/%s/join/65536" : "elastic/%s/joined", job_name);
    int waiting = 0;
    for (double until = job_now() + JOB_STEP_LIMIT_S; ok && !waiting && !job_poll(&j, 20) && job_now() < until;) {
        void *v = NULL;
        size_t n = 0;
        waiting = pdde_store_get(s, key, &v, &n) == PDDE_OK;
        free(v);
    }
    pdde_store_close(s);
    CHECK(waiting, "%s: the joiner waits in the store:\n%s", what, job_text(&j));
    if (!waiting) { job_kill(&j), free(j.out), kill(host, SIGKILL), waitpid(host, NULL, 0); return; }
    /* (its lease registered before the store stops: a registration cut off would wait out the timeout) */
    if (!max_known)
        for (double until = job_now() + 0.5 * test_load_factor(); !job_poll(&j, 20) && job_now() < until;) {}
    int ws = 0;
    kill(host, SIGSTOP);
    waitpid(host, &ws, WUNTRACED); /* (stopped now, not soon) */
    double t_stop = job_now(), bound = (4 * lease_s + 1) * test_load_factor();
    int rc = job_finish(&j, t_stop - j.t0 + bound + 5);
    double took = job_now() - t_stop;
    CHECK(rc > 0 && took < bound && strstr(job_text(&j), "has had no reply from the store") && strstr(job_text(&j), "cut off or the store is down"),
          "%s: the joiner stops within %.2f s of its store stopping (4 leases of %.2f s and 1 s, times the load), "
          "saying it is cut off: rc %d after %.2f s:\n%s", what, bound, lease_s, rc, took, job_text(&j));
    printf("%s: stopped %.2f s after its store did (lease %.2f s, bound %.2f s)\n", what, took, lease_s, bound);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    free(j.out);
}

/* A store that falls silent just as a client registers its lease: a relay on 127.0.0.1 (*port, a free
 * port) in a process of its own, in front of the store at upstream_port. It passes bytes both ways
 * until a client sends a liveness registration (a request frame is a u32 body length, then the op:
 * comm/store.c's STORE_OP_LIVENESS is 6); from then on it passes nothing on that connection and
 * answers nothing, the connection left open: to the client the store went silent right then. It then
 * writes a byte to the pipe *held_fd reads. The caller kills it (SIGKILL) and reaps it. */
#define RELAY_OP_LIVENESS 6
static void relay_write_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return;
        p += w, n -= (size_t)w;
    }
}

static pid_t silent_at_registration(int upstream_port, int *port, int *held_fd) {
    int hp[2];
    *port = 0, *held_fd = -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 16) || getsockname(lfd, (struct sockaddr *)&sa, &sl) ||
        pipe(hp)) {
        if (lfd >= 0) close(lfd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(hp[0]);
        enum { MAXC = 8, CAP = 1 << 16 };
        static struct { int c, s, held; size_t n; unsigned char buf[CAP]; } conn[MAXC];
        int nc = 0;
        for (;;) {
            struct pollfd pf[1 + 2 * MAXC];
            int np = 0, who[1 + 2 * MAXC];
            pf[np] = (struct pollfd){lfd, POLLIN, 0}, who[np++] = -1;
            for (int k = 0; k < nc; k++)
                if (conn[k].c >= 0 && !conn[k].held) {
                    pf[np] = (struct pollfd){conn[k].c, POLLIN, 0}, who[np++] = 2 * k;
                    pf[np] = (struct pollfd){conn[k].s, POLLIN, 0}, who[np++] = 2 * k + 1;
                }
            if (poll(pf, (nfds_t)np, 1000) <= 0) continue;
            for (int i = 0; i < np; i++) {
                if (!pf[i].revents) continue;
                if (who[i] < 0) {
                    int c = accept(lfd, NULL, NULL), s = socket(AF_INET, SOCK_STREAM, 0);
                    struct sockaddr_in up = {.sin_family = AF_INET, .sin_port = htons((uint16_t)upstream_port),
                                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
                    if (c < 0 || s < 0 || nc == MAXC || connect(s, (struct sockaddr *)&up, sizeof up)) {
                        if (c >= 0) close(c);
                        if (s >= 0) close(s);
                        continue;
                    }
                    conn[nc].c = c, conn[nc].s = s, conn[nc].held = 0, conn[nc].n = 0, nc++;
                    continue;
                }
                int k = who[i] / 2;
                if (conn[k].c < 0 || conn[k].held) continue;
                if (who[i] % 2) { /* the store's replies, as they come */
                    unsigned char b[4096];
                    ssize_t r = read(conn[k].s, b, sizeof b);
                    if (r <= 0) { close(conn[k].c), close(conn[k].s), conn[k].c = -1; continue; }
                    relay_write_all(conn[k].c, b, (size_t)r);
                    continue;
                }
                ssize_t r = read(conn[k].c, conn[k].buf + conn[k].n, CAP - conn[k].n);
                if (r <= 0) { close(conn[k].c), close(conn[k].s), conn[k].c = -1; continue; }
                conn[k].n += (size_t)r;
                while (conn[k].n >= 5) { /* whole requests on, up to a registration */
                    uint32_t len = (uint32_t)conn[k].buf[0] | (uint32_t)conn[k].buf[1] << 8 | (uint32_t)conn[k].buf[2] << 16 |
                                   (uint32_t)conn[k].buf[3] << 24;
                    if (conn[k].buf[4] == RELAY_OP_LIVENESS) {
                        conn[k].held = 1;
                        if (write(hp[1], "h", 1) != 1) _exit(3);
                        break;
                    }
                    if (conn[k].n < 4 + (size_t)len) break;
                    relay_write_all(conn[k].s, conn[k].buf, 4 + (size_t)len);
                    memmove(conn[k].buf, conn[k].buf + 4 + len, conn[k].n - 4 - len);
                    conn[k].n -= 4 + (size_t)len;
                }
            }
        }
    }
    close(lfd), close(hp[1]);
    if (pid < 0) { close(hp[0]); return -1; }
    *held_fd = hp[0];
    return pid;
}

/* A joiner whose store falls silent just as it registers its lease (the relay above: the store itself
 * runs on, so nothing but that request goes unanswered) stops within a few leases, saying it is cut
 * off, not at its timeout (100 s): the registration waits for its reply at most twice the lease. (Its
 * pdde-run --join registers its own lease first, for the notes of its ranks' ends, and waits for that
 * reply at most twice the peer timeout before it starts the joiner.) */
static void test_joiner_cut_off_registering(void) {
    const char *what = "joiner cut off while it registers its lease";
    int store_port = 0, port = 0, held_fd = -1;
    pid_t host = test_store_process(&store_port);
    pid_t relay = host > 0 && store_port > 0 ? silent_at_registration(store_port, &port, &held_fd) : -1;
    CHECK(relay > 0 && port > 0, "%s: the store and the relay in front of it started", what);
    if (relay <= 0 || port <= 0) {
        if (host > 0) kill(host, SIGKILL), waitpid(host, NULL, 0);
        return;
    }
    char rdzv[96], peer[32], m_join[300];
    snprintf(rdzv, sizeof rdzv, "tcp://127.0.0.1:%d/cut-registering", port);
    snprintf(m_join, sizeof m_join, "%s/cut_registering_joiner.jsonl", g_tmp);
    double peer_s = job_peer_timeout(1.0), lease_s = peer_s - (peer_s / 4 < 0.25 ? peer_s / 4 : 0.25);
    snprintf(peer, sizeof peer, "%.2f", peer_s);
    const char *join_run[] = {"-n", "1", "--elastic", "--join", "--min", "1", "--peer-timeout", peer, "--rdzv", rdzv, NULL};
    const char *env[] = {"PDDE_ELASTIC_TIMEOUT=100", "PDDE_ELASTIC_LEAVE", "PDDE_TEST_ELASTIC_ADMIT", "PDDE_BACKENDS=cpu", NULL};
    static const char *const none[] = {NULL};
    job j = ft_start(join_run, m_join, env, none);
    int held = 0;
    for (double until = job_now() + JOB_STEP_LIMIT_S; !held && !job_poll(&j, 20) && job_now() < until;) {
        struct pollfd q = {held_fd, POLLIN, 0};
        held = poll(&q, 1, 0) > 0;
    }
    double t_held = job_now(), bound = (3 * lease_s + 1 + 2 * peer_s) * test_load_factor();
    CHECK(held, "%s: the joiner sent its registration (held by the relay):\n%s", what, job_text(&j));
    int rc = held ? job_finish(&j, t_held - j.t0 + bound + 5) : (job_kill(&j), -1);
    double took = job_now() - t_held;
    if (held)
        CHECK(rc > 0 && took < bound && strstr(job_text(&j), "has had no reply from the store") &&
              strstr(job_text(&j), "cut off or the store is down"),
              "%s: the joiner stops within %.2f s of its registration going unanswered (its launcher's wait of 2 peer timeouts, 3 "
              "leases of %.2f s and 1 s, times the load), saying it is cut off: rc %d after %.2f s:\n%s", what, bound, lease_s, rc, took,
              job_text(&j));
    printf("%s: stopped %.2f s after its registration went unanswered (lease %.2f s, bound %.2f s)\n", what, took, lease_s, bound);
    kill(relay, SIGKILL), waitpid(relay, NULL, 0);
    kill(host, SIGKILL), waitpid(host, NULL, 0);
    close(held_fd);
    free(j.out);
}

int main(int argc, char **argv) {
    (void)argc;
    unsigned seed = 0;
    int setup = job_gpt_test_setup(argv[0], g_run, g_gpt, sizeof g_run, g_tmp, sizeof g_tmp, "/tmp/pdde-elastic-ft.XXXXXX", &seed);
    if (setup >= 0) return setup;
    setenv("PDDE_JOB_SECRET", "test-elastic-ft-secret-0123456789abcdef", 1); /* (the reference's joiner must know it) */
    static const char *const ft[] = {"--ft-replicas", NULL}, *const zero1[] = {"--zero", "1", NULL};
    test_joiner_cut_off(1);
    test_joiner_cut_off(0);
    test_joiner_cut_off_registering();
    test_rejoin("ft replicas", 0, seed, ft, 0);
    test_rejoin("ZeRO-1", 1, seed, zero1, 1);
    test_brief_stop(seed);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd)) {}
    return test_finish();
}
#endif
