/* test_elastic_netns.c — a host cut off from the network: two emulated hosts (network namespaces A
 * and B, each joined by a veth pair to a bridge in a third namespace, the switch; made and removed
 * here; needs root, skipped when `ip netns` is not permitted). Host A runs `pdde-run --elastic` with 2 ranks and the job's TCP store (the rendezvous on
 * A's address), host B 2 more (--nnodes 2 --node-rank 1): gpt (a tiny model) data parallel on 4 ranks.
 * At a random step B's port on the switch goes down (B's link loses its carrier and its packets are
 * dropped: silence, no error; A's link stays up). Checked:
 *  - A's ranks notice within the peer timeout plus the lease, re-form as 2 ranks and finish; their
 *    pids do not change; at most one step is done again;
 *  - every loss equals (1e-6 relative, NaN fails) that of a run on the same two hosts where B's ranks
 *    leave at the step the recovery resumed at (PDDE_ELASTIC_LEAVE);
 *  - B's ranks stop on their own within a bound, saying why (fenced, or the store unreachable);
 *  - the jobs are killed and the namespaces removed whatever happens (a watchdog bounds the test).
 * A cut that comes after the training ended (a loaded machine held the test back longer than the job
 * took) tests nothing: that try is said and repeated at another step (3 tries). The seed of the random step is printed (PDDE_TEST_SEED repeats it). */
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
#include "netns_util.h"
#include <signal.h>
#include <string.h>

#define STEPS 600 /* (long enough that the cut, a subprocess after step 20..100, comes before the end on a loaded machine) */
#define WATCHDOG_S 200 /* the whole test, whatever hangs */

/* The peer timeout: 1.5 s, times the machine's load per core when that is above 1 (job_peer_timeout).
 * The bounds checked derive from it (the peer timeout plus the lease for noticing the cut), so they say
 * the same on any machine, while a loaded machine does not starve a member past its lease at the store
 * (which then drops it as frozen: a member of host A fenced, the job lost before the cut). */
static double g_pt = 1.5;
#define PEER_TIMEOUT g_pt
#define LEASE (PEER_TIMEOUT - 0.25) /* the lease a member holds at the store (core/elastic.c) */

static char g_run[600], g_gpt[600], g_tmp[256], g_ip[64];
static netns_pair g_np;
static job *g_jobs[2]; /* the jobs running now (killed by the cleanup) */

/* Kills what runs and removes the namespaces: at the end, and from the watchdog. */
static void cleanup(void) {
    for (int k = 0; k < 2; k++)
        if (g_jobs[k]) job_kill(g_jobs[k]), g_jobs[k] = NULL;
    netns_pair_remove(&g_np);
}

static void on_watchdog(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: test_elastic_netns did not end within its watchdog: the jobs are killed\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    cleanup(); /* (system() from a handler: the test is over, nothing else runs) */
    printf("%d passed, %d failed\n", test_passed, test_failed + 1);
    fflush(stdout);
    _exit(1);
}

/* pdde-run on host k (0: A, with the store; 1: B), 2 ranks of a 4-rank elastic job. */
static job host_start(int k, const char *leave, const char *metrics) {
    static char ns[2][32], tls[] = "UCX_TLS=tcp", dev[2][64], pt[16], steps[16], node[2][4] = {"0", "1"};
    snprintf(ns[k], sizeof ns[k], "%s", g_np.ns[k]);
    snprintf(dev[k], sizeof dev[k], "UCX_NET_DEVICES=%s", g_np.dev[k]);
    snprintf(pt, sizeof pt, "%.2f", PEER_TIMEOUT);
    snprintf(steps, sizeof steps, "%d", STEPS);
    char *argv[] = {g_ip, "netns", "exec", ns[k], g_run, "-n", "2", "--nnodes", "2", "--node-rank", node[k], "--elastic", "--min", "2",
                    "--peer-timeout", pt, "--grace", "1", "--rdzv", "tcp://10.231.77.1:29518/cut", g_gpt, "--layers", "1", "--width",
                    "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", steps, "--val-every", "0", "--sample-len", "0",
                    "--threads", "1", "--metrics", (char *)metrics, NULL};
    char leave_env[300];
    snprintf(leave_env, sizeof leave_env, "PDDE_ELASTIC_LEAVE=%s", leave ? leave : "");
    /* TCP over the veth only: UCX would otherwise see one machine and use shared memory across the cut */
    const char *env[] = {leave ? leave_env : "PDDE_ELASTIC_LEAVE", "PDDE_BACKENDS=cpu", tls, dev[k], "UCX_WARN_UNUSED_ENV_VARS=n", NULL};
    return job_spawn(argv, env);
}

/* Parses the transition line: the step it resumed at and the seconds the recovery took; -1 when absent. */
static int parse_resumed(const char *text, int *step, double *secs, char *line, size_t cap) {
    const char *r = strstr(text, "resumed at step ");
    if (!r || !strchr(r, '\n')) return -1;
    const char *p = r;
    while (p > text && p[-1] != '\n') p--;
    if (sscanf(r, "resumed at step %d in %lf s", step, secs) != 2) return -1;
    snprintf(line, cap, "%.*s", (int)(strchr(r, '\n') - p), p);
    return 0;
}

/* One try; 1 when the cut came after the training ended (the test was held back longer than the job
 * took: nothing to check; the caller tries again at another step). */
static int test_cut(unsigned seed, int tries) {
    char m_cut[300], m_cut_b[300], m_ref[300], m_ref_b[300];
    snprintf(m_cut, sizeof m_cut, "%s/cut.jsonl", g_tmp), snprintf(m_cut_b, sizeof m_cut_b, "%s/cut_b.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/ref.jsonl", g_tmp), snprintf(m_ref_b, sizeof m_ref_b, "%s/ref_b.jsonl", g_tmp);
    unlink(m_cut), unlink(m_cut_b); /* (an earlier try's: the wait for a step reads this file) */
    srand(seed);
    int at = 20 + rand() % 80;
    for (int k = 0; k < tries; k++) at = 20 + rand() % 80;
    job a = host_start(0, NULL, m_cut), b = host_start(1, NULL, m_cut_b);
    g_jobs[0] = &a, g_jobs[1] = &b;
    if (job_wait_step(&a, m_cut, at, JOB_STEP_LIMIT_S)) {
        job_poll(&b, 10);
        CHECK(0, "cut: the job did not reach step %d:\n%s\n--- host B:\n%s", at, job_text(&a), job_text(&b));
        cleanup();
        free(a.out), free(b.out);
        return 0;
    }
    pid_t before[8], after[8] = {0};
    job_ranks(a.pid, before, 8);
    int step_hit = metrics_last_step(m_cut);
    double t_cut = test_now();
    int down = netns_sh("ip -n %s link set %s down", g_np.sw, g_np.port[1]);
    CHECK(down == 0, "cut: cannot bring %s down", g_np.port[1]);
    /* host A resumes on 2 ranks; host B's ranks stop by themselves */
    int resumed = -1, b_done = 0, alive = 0;
    double secs = -1, seen_at = 0, b_end = 0;
    char line[800] = "";
    int a_done = 0;
    while (test_now() - t_cut < 30 + 4 * PEER_TIMEOUT && (resumed < 0 || !b_done) && !(a_done && b_done)) {
        if (resumed < 0 && ((a_done = job_poll(&a, 5)), parse_resumed(job_text(&a), &resumed, &secs, line, sizeof line) == 0)) {
            seen_at = test_now();
            job_ranks(a.pid, after, 8); /* (at once: the job may end soon after) */
            alive = proc_is_running(before[0]) && proc_is_running(before[1]);
        }
        if (!b_done && job_poll(&b, 5)) b_done = 1, b_end = test_now();
    }
    if (resumed < 0 && b_done && WIFEXITED(b.status) && WEXITSTATUS(b.status) == 0 && metrics_last_step(m_cut) == STEPS &&
        !strstr(job_text(&b), "fenced")) {
        if (job_finish(&a, JOB_LIMIT_S) == 0 && !strstr(job_text(&a), "resumed at")) {
            printf("cut: the link went down after the training ended (the test was held back): trying again at another step\n");
            cleanup();
            free(a.out), free(b.out);
            return netns_pair_permitted(&g_np) && netns_pair_connect_switched(&g_np) ? 1 : 0;
        }
    }
    double detect = seen_at - t_cut - secs, bound = PEER_TIMEOUT + LEASE;
    CHECK(resumed >= 0, "cut: host A did not resume within %.0f s of the cut:\n%s", 30 + 4 * PEER_TIMEOUT, job_text(&a));
    if (resumed >= 0) {
        CHECK(detect <= bound && seen_at - t_cut <= bound + 5,
              "cut: host A noticed the loss %.2f s after the cut (bound %.2f s: the peer timeout plus the lease) and resumed %.2f s "
              "after it (bound %.2f s)", detect, bound, seen_at - t_cut, bound + 5);
        CHECK(strstr(line, "rank 2 lost") && strstr(line, "rank 3 lost") && strstr(line, "re-plan 4 -> 2 ranks: dp=2"),
              "cut: the log line names the lost ranks and the plan: %s", line);
        CHECK(after[0] == before[0] && after[1] == before[1] && alive,
              "cut: host A's pids changed: before %d %d, after %d %d", before[0], before[1], after[0], after[1]);
        printf("cut: host B cut off at step ~%d (seed %u): %s (noticed %.2f s after the cut, resumed after %.2f s)\n", step_hit, seed,
               line, detect, seen_at - t_cut);
    }
    /* host B: its ranks stop within the bound, saying why; pdde-run there fails (fewer than --min
     * finished). The bound: a client holding a lease waits at most twice the lease for the store's
     * reply (the ranks' store pings every peer timeout / 4, then the fencing; pdde-run's own ping),
     * and 4 s to exit. */
    double b_bound = PEER_TIMEOUT / 4 + 2 * 2 * LEASE + 4;
    const char *tb = job_text(&b);
    int b_rc = b_done && WIFEXITED(b.status) ? WEXITSTATUS(b.status) : -1;
    CHECK(b_done && b_end - t_cut <= b_bound, "cut: host B's job ended %.2f s after the cut (bound %.1f s)%s:\n%s", b_done ? b_end - t_cut : -1,
          b_bound, b_done ? "" : " (it did not end: killed)", tb);
    int said = 0;
    for (int r = 2; r < 4; r++) {
        char tag[16];
        snprintf(tag, sizeof tag, "[%d] ", r);
        const char *p = tb;
        int why = 0;
        while ((p = strstr(p, tag))) {
            const char *eol = strchr(p, '\n');
            size_t n = eol ? (size_t)(eol - p) : strlen(p);
            char l[1024];
            snprintf(l, sizeof l, "%.*s", (int)(n < sizeof l - 1 ? n : sizeof l - 1), p);
            why |= strstr(l, "fenced") || strstr(l, "store");
            p += n;
        }
        said += why;
    }
    CHECK(b_done && b_rc != 0 && said == 2 && !strstr(tb, "resumed at"),
          "cut: host B's 2 ranks stop, each saying it was fenced or lost the store (%d did), pdde-run fails (rc %d):\n%s", said, b_rc, tb);
    if (b_done) printf("cut: host B's job ended %.2f s after the cut (rc %d)\n", b_end - t_cut, b_rc);
    int rc = job_finish(&a, JOB_LIMIT_S);
    CHECK(rc == 0 && !strstr(job_text(&a), "lost on the way"), "cut: host A finishes on 2 ranks: rc %d\n%s", rc, job_text(&a));
    cleanup();
    double loss[STEPS + 1], want[STEPS + 1];
    int again = metrics_losses(m_cut, loss, STEPS);
    CHECK(again >= 0 && again <= 1, "cut: %d steps done again (snapshot interval 1)", again);
    free(a.out), free(b.out);
    if (resumed < 0 || rc) return 0;
    /* the reference: the same two hosts, no cut, B's ranks leave at the resume step */
    if (!netns_pair_permitted(&g_np) || !netns_pair_connect_switched(&g_np)) {
        CHECK(0, "cut: network namespace setup for the reference run");
        return 0;
    }
    char leave[32];
    snprintf(leave, sizeof leave, "2@%d,3@%d", resumed, resumed);
    job ra = host_start(0, leave, m_ref), rb = host_start(1, leave, m_ref_b);
    g_jobs[0] = &ra, g_jobs[1] = &rb;
    int rc_a = job_finish(&ra, JOB_LIMIT_S), rc_b = job_finish(&rb, JOB_LIMIT_S);
    CHECK(rc_a == 0 && rc_b == 0 && strstr(job_text(&ra), "rank 2 left, rank 3 left"),
          "cut: the reference run (leave %s): rc %d and %d\n%s\n--- host B:\n%s", leave, rc_a, rc_b, job_text(&ra), job_text(&rb));
    cleanup();
    metrics_losses(m_ref, want, STEPS);
    double worst = 0;
    int bad = -1;
    for (int s = 1; s <= STEPS; s++) {
        double d = isfinite(loss[s]) && isfinite(want[s]) ? fabs(loss[s] - want[s]) / fabs(want[s]) : INFINITY;
        if (d > worst) worst = d;
        if (!(d <= 1e-6) && bad < 0) bad = s;
    }
    CHECK(bad < 0, "cut: step %d's loss %.9g differs from the reference's %.9g (tolerance 1e-6 relative)", bad, bad > 0 ? loss[bad] : 0,
          bad > 0 ? want[bad] : 0);
    printf("cut: the losses of steps 1..%d equal the reference's (B leaving at step %d) within %.3g (relative; tolerance 1e-6)\n", STEPS,
           resumed, worst);
    free(ra.out), free(rb.out);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    unsigned seed = 0;
    int setup = job_gpt_test_setup(argv[0], g_run, g_gpt, sizeof g_run, g_tmp, sizeof g_tmp, "/tmp/pdde-elastic-netns.XXXXXX", &seed);
    if (setup >= 0) return setup;
    const char *ips[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
    for (int i = 0; i < 4 && !g_ip[0]; i++)
        if (!access(ips[i], X_OK)) snprintf(g_ip, sizeof g_ip, "%s", ips[i]);
    netns_pair_name(&g_np);
    if (!g_ip[0] || !netns_pair_permitted(&g_np)) {
        test_skip("netns", "cannot create network namespaces (needs root and `ip netns`)");
        rmdir(g_tmp);
        return test_finish();
    }
    signal(SIGALRM, on_watchdog), signal(SIGTERM, on_watchdog), signal(SIGINT, on_watchdog);
    alarm(WATCHDOG_S);
    int ok = netns_pair_connect_switched(&g_np);
    CHECK(ok, "network namespace setup");
    if (ok) {
        char secret[80];
        if (!pdde_job_secret_generate(NULL, secret, sizeof secret)) setenv("PDDE_JOB_SECRET", secret, 1); /* (both hosts know it) */
        g_pt = job_peer_timeout(1.5);
        printf("peer timeout %.2f s (1.5 s times the load per core above 1)\n", g_pt);
        int again = 1;
        for (int t = 0; t < 3 && again; t++) again = test_cut(seed, t);
        CHECK(!again, "cut: in 3 tries the link went down after the training ended");
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
        if (system(cmd)) {}
    } else {
        rmdir(g_tmp);
    }
    cleanup();
    alarm(0);
    return test_finish();
}
#endif
