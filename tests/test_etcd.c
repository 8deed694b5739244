/* test_etcd.c — etcd as the store (comm/etcd.c) against a real etcd (Debian's etcd-server) started here
 * on 127.0.0.1 with free ports and a temporary data folder, and stopped at the end:
 *  - set/get/remove, a missing key, compare_set, add from 4 processes at once (no update lost), wait
 *    (woken by a watch when another process sets the key; a timeout when nobody does);
 *  - death notices from leases: a process killed (SIGKILL) or frozen (SIGSTOP) with a notice
 *    registered: the notice appears within its lease (2 s) + 2 s; one that closes cleanly leaves none;
 *  - nothing listening: a clear error within the timeout;
 *  - an elastic job with --rdzv etcd://: a rank killed, the others finish on 3 ranks, re-formed within 2 s
 *    (the launcher's exit note, not the lease's end); etcd frozen past the leases and resumed: the ranks
 *    register again and finish with the losses of a run without the freeze; a member stalled past its
 *    lease, and a rank stopped (SIGSTOP) past it, are fenced, not registered again; etcd killed and
 *    restarted mid-job: the job carries on; etcd killed and a rank lost while it is down: the job stops
 *    with a message saying the store cannot be reached, within a bound (never a hang);
 *  - a rank killed before it registers (with etcd and with the built-in store): the others, forming
 *    the world, report it within 5 s (not at the 60 s timeout), naming it;
 *  - pdde-run --restart 1 with etcd: a rank killed, started again, taken in, killed again (its end noted
 *    under its member id, and it is not taken in again while its lease lasts); the restarted rank killed
 *    before it registered: its end noted under the member id pdde-run took for it;
 *  - growing with etcd: a job of 2 ranks grows to 3 by a pdde-run --join that finds the job's store
 *    through etcd (the address its pdde-run keeps there on a lease, gone once the job ends); the
 *    losses go on as a run of 2 ranks without changes; a join to a job etcd does not know fails at
 *    once, naming etcd and the job; a rank started by --join and killed once taken in: its pdde-run's
 *    exit note has the members re-form within 3 s, not at its lease's end (4.5 s or more);
 *  - one job name, several runs: twice in a row, then after a run killed by SIGKILL (its keys left in
 *    etcd): each trains with the losses of a fresh name; a run's keys are gone from etcd after it ends
 *    cleanly, and a killed run's after the next run that starts once its lease has ended;
 *  - a joiner waiting to be taken in while etcd stops answering (SIGSTOP): it stops within a few of
 *    its leases saying it is cut off, not at its timeout; etcd then resumes (SIGCONT);
 *  - what pdde-run says: an etcd endpoint that can never work (a port past 65535, a host that does not
 *    resolve) fails at once (exit 2); one that refuses (nothing there yet) is waited for, said within 3 s with the
 *    wait's length; a --join to a job at its --max says at once that it is full (N of --max M) and how long
 *    its ranks wait; SIGTERM to a joiner's pdde-run and to a job's after a loss it recovered from: "stopped
 *    by SIGTERM", exit 143 (as without --elastic), neither the old loss as the cause nor "the others go on"
 *    for the ranks it stopped; a joiner given a member id no joiner has (PDDE_ELASTIC_ID=12): a clear
 *    error. (`test_etcd messages` runs this part alone, `test_etcd restart` the --restart one,
 *    `test_etcd join-lost` the killed joiner.) */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM) || !defined(PDDE_HAVE_CURL)
#include <stdio.h>
int main(void) {
    printf("SKIP curl: pdde was built without comm (UCX) or without libcurl\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "test_util.h"
#include "job_util.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_tmp[256], g_url[128], g_dir[512];
static int g_client_port, g_peer_port;
static pid_t g_etcd = -1;

static int etcd_answers(void);

/* Starts etcd (the same ports and data folder each time: a restart keeps the data). 0 when it answers. */
static int etcd_start(void) {
    char client[64], peer[64], data[300], cluster[128], log[300];
    snprintf(client, sizeof client, "http://127.0.0.1:%d", g_client_port);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", g_peer_port);
    snprintf(cluster, sizeof cluster, "default=%s", peer);
    snprintf(data, sizeof data, "%s/etcd-data", g_tmp);
    snprintf(log, sizeof log, "%s/etcd.log", g_tmp);
    fflush(NULL);
    g_etcd = fork();
    if (g_etcd == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execlp("etcd", "etcd", "--data-dir", data, "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster, (char *)NULL);
        _exit(127);
    }
    return etcd_answers();
}

/* 0 when etcd answers within 15 s. */
static int etcd_answers(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_store *s = NULL;
    pdde_status st = pdde_store_etcd_connect(ctx, g_url, 15, &s);
    pdde_store_close(s);
    pdde_context_free(ctx);
    return st == PDDE_OK ? 0 : -1;
}

static void etcd_stop(int sig) {
    if (g_etcd <= 0) return;
    kill(-g_etcd, sig), kill(g_etcd, sig);
    waitpid(g_etcd, NULL, 0);
    g_etcd = -1;
}

/* ---- the store's operations ---- */

static void test_ops(pdde_context *ctx) {
    pdde_store *s = NULL;
    pdde_status st = pdde_store_etcd_connect(ctx, g_url, 5, &s);
    CHECK(st == PDDE_OK, "connect: %s", pdde_last_error(ctx));
    if (st) return;
    void *v = NULL;
    size_t n = 0;
    CHECK(pdde_store_set(s, "t/a", "hello\0x", 7) == PDDE_OK, "set");
    st = pdde_store_get(s, "t/a", &v, &n);
    CHECK(st == PDDE_OK && n == 7 && !memcmp(v, "hello\0x", 7), "get gives the bytes set back (n %zu)", n);
    free(v), v = NULL;
    CHECK(pdde_store_get(s, "t/missing", &v, &n) == PDDE_ERR_NOT_FOUND && !v, "a missing key: NOT_FOUND");
    int swapped = -1;
    CHECK(pdde_store_compare_set(s, "t/c", "", 0, "one", 3, &swapped) == PDDE_OK && swapped == 1, "cas on a missing key");
    CHECK(pdde_store_compare_set(s, "t/c", "two", 3, "three", 5, &swapped) == PDDE_OK && swapped == 0, "cas with the wrong value: no swap");
    CHECK(pdde_store_compare_set(s, "t/c", "one", 3, "three", 5, &swapped) == PDDE_OK && swapped == 1, "cas with the right value");
    st = pdde_store_get(s, "t/c", &v, &n);
    CHECK(st == PDDE_OK && n == 5 && !memcmp(v, "three", 5), "cas wrote its value");
    free(v), v = NULL;
    CHECK(pdde_store_remove(s, "t/c") == PDDE_OK && pdde_store_get(s, "t/c", &v, &n) == PDDE_ERR_NOT_FOUND, "remove");
    CHECK(pdde_store_remove(s, "t/c") == PDDE_ERR_NOT_FOUND, "remove of a missing key: NOT_FOUND");
    /* 4 processes add 25 times each at once: no update is lost */
    pid_t kids[4];
    fflush(NULL);
    for (int k = 0; k < 4; k++)
        if ((kids[k] = fork()) == 0) {
            pdde_context *c2;
            pdde_context_init(NULL, &c2);
            pdde_store *s2;
            if (pdde_store_etcd_connect(c2, g_url, 5, &s2)) _exit(2);
            for (int i = 0; i < 25; i++)
                if (pdde_store_add(s2, "t/count", 1, NULL)) _exit(3);
            pdde_store_close(s2);
            _exit(0);
        }
    int bad = 0;
    for (int k = 0; k < 4; k++) {
        int status;
        waitpid(kids[k], &status, 0);
        bad += !WIFEXITED(status) || WEXITSTATUS(status);
    }
    int64_t total = 0;
    CHECK(!bad && pdde_store_add(s, "t/count", 0, &total) == PDDE_OK && total == 100, "4 x 25 concurrent adds give 100: %lld",
          (long long)total);
    CHECK(pdde_store_add(s, "t/count", INT64_MAX, &total) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "overflows") &&
              pdde_store_add(s, "t/count", 0, &total) == PDDE_OK && total == 100,
          "an add past 64 bits is refused, the counter unchanged: %s, %lld", pdde_last_error(ctx), (long long)total);
    /* wait: a watch wakes it when another process sets the key */
    fflush(NULL);
    pid_t setter = fork();
    if (setter == 0) {
        usleep(400000);
        pdde_context *c2;
        pdde_context_init(NULL, &c2);
        pdde_store *s2;
        if (pdde_store_etcd_connect(c2, g_url, 5, &s2) || pdde_store_set(s2, "t/later", "x", 1)) _exit(2);
        pdde_store_close(s2);
        _exit(0);
    }
    double t0 = test_now();
    st = pdde_store_wait(s, "t/later", 10);
    double dt = test_now() - t0;
    waitpid(setter, NULL, 0);
    CHECK(st == PDDE_OK && dt < 2.5, "wait returns when another process sets the key: %s after %.2f s", pdde_status_str(st), dt);
    t0 = test_now();
    st = pdde_store_wait(s, "t/never", 0.5);
    dt = test_now() - t0;
    CHECK(st == PDDE_ERR_TIMEOUT && dt >= 0.45 && dt < 3, "wait for a key nobody sets: TIMEOUT after %.2f s", dt);
    pdde_store_close(s);
}

/* A process registers a death notice (lease 2 s), then dies, freezes or closes; the notice appears
 * within the lease + 2 s for the first two, never for the third. */
static void test_notices(pdde_context *ctx) {
    const char *how[] = {"SIGKILL", "SIGSTOP", "close"};
    for (int k = 0; k < 3; k++) {
        char key[64];
        snprintf(key, sizeof key, "t/dead/%d", k);
        int ready[2];
        if (pipe(ready)) return;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            close(ready[0]);
            pdde_context *c2;
            pdde_context_init(NULL, &c2);
            pdde_store *s2;
            if (pdde_store_etcd_connect(c2, g_url, 5, &s2) || pdde_store_set_liveness(s2, key, "gone", 4, 2)) _exit(2);
            if (write(ready[1], "x", 1) != 1) _exit(3);
            if (k == 2) { pdde_store_close(s2); _exit(0); }
            for (;;) { pdde_store_ping(s2); usleep(200000); } /* (heartbeats, as a member keeps them) */
        }
        close(ready[1]);
        char x;
        int ok = read(ready[0], &x, 1) == 1;
        close(ready[0]);
        pdde_store *s = NULL;
        if (!ok || pdde_store_etcd_connect(ctx, g_url, 5, &s)) { CHECK(0, "%s: the child did not register", how[k]); kill(pid, SIGKILL); waitpid(pid, NULL, 0); continue; }
        usleep(500000); /* alive for a while: no notice */
        void *v = NULL;
        size_t n;
        CHECK(pdde_store_get(s, key, &v, &n) == PDDE_ERR_NOT_FOUND, "%s: no notice while the process lives", how[k]);
        free(v), v = NULL;
        double t0 = test_now();
        if (k == 0) kill(pid, SIGKILL);
        if (k == 1) kill(pid, SIGSTOP);
        pdde_status st = PDDE_ERR_NOT_FOUND;
        while (st == PDDE_ERR_NOT_FOUND && test_now() - t0 < (k == 2 ? 5 : 8)) {
            st = pdde_store_get(s, key, &v, &n);
            if (st == PDDE_ERR_NOT_FOUND) usleep(50000);
        }
        double dt = test_now() - t0;
        if (k < 2)
            CHECK(st == PDDE_OK && n == 4 && !memcmp(v, "gone", 4) && dt <= 4.0, "%s: the notice appears within the lease + 2 s: %s after %.2f s",
                  how[k], pdde_status_str(st), dt);
        else
            CHECK(st == PDDE_ERR_NOT_FOUND, "a clean close leaves no notice (%s after %.1f s)", pdde_status_str(st), dt);
        printf("notice: %s: %s after %.2f s\n", how[k], st == PDDE_OK ? "set" : "none", dt);
        free(v);
        kill(pid, SIGKILL), kill(pid, SIGCONT);
        waitpid(pid, NULL, 0);
        pdde_store_close(s);
    }
    pdde_store *s = NULL;
    double t0 = test_now();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", job_free_port());
    pdde_status st = pdde_store_etcd_connect(ctx, url, 1, &s);
    CHECK(st != PDDE_OK && !s && test_now() - t0 < 5 && strstr(pdde_last_error(ctx), "etcd"), "nothing listening: %s after %.1f s: %s",
          pdde_status_str(st), test_now() - t0, pdde_last_error(ctx));
}

/* ---- an elastic job with its membership in etcd ---- */

static job job_start_env(const char *rdzv, const char *metrics, int steps, const char *const *env);
static void compare_losses(const char *what, const char *got_path, const char *want_path, int to, double tol);
static job job_start(const char *rdzv, const char *metrics, int steps) {
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=10", NULL};
    return job_start_env(rdzv, metrics, steps, env);
}

static job job_start_env(const char *rdzv, const char *metrics, int steps, const char *const *env) {
    char run[600], gpt[600], st[16];
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    snprintf(st, sizeof st, "%d", steps);
    char *argv[] = {run, "-n", "4", "--elastic", "--min", "2", "--peer-timeout", "1.5", "--grace", "1", "--rdzv", (char *)rdzv, gpt,
                    "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", st, "--val-every", "0",
                    "--sample-len", "0", "--threads", "1", "--metrics", (char *)metrics, NULL};
    return job_spawn(argv, env);
}

/* Kills rank `rank` of the job (when it is there). */
static void kill_rank(const job *j, int rank) {
    pid_t pids[8];
    job_ranks(j->pid, pids, 8);
    if (pids[rank] > 0) kill(pids[rank], SIGKILL);
}

/* Runs the job to its end within limit_s from now (killed after); the exit code, -1 when killed. */
static int job_end(job *j, double limit_s) {
    j->t0 = test_now();
    return job_finish(j, limit_s);
}

/* A job as job_start's with a peer timeout of its own (and so a lease: peer_timeout - 0.25 s). */
static job job_start_peer(const char *rdzv, const char *metrics, int steps, double peer_timeout) {
    char run[600], gpt[600], st[16], peer[16];
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    snprintf(st, sizeof st, "%d", steps);
    snprintf(peer, sizeof peer, "%.2f", peer_timeout);
    char *argv[] = {run, "-n", "4", "--elastic", "--min", "2", "--peer-timeout", peer, "--grace", "1", "--rdzv", (char *)rdzv, gpt,
                    "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", st, "--val-every", "0",
                    "--sample-len", "0", "--threads", "1", "--metrics", (char *)metrics, NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=30", NULL};
    return job_spawn(argv, env);
}

static void test_job(void) {
    char rdzv[160], m[300];
    snprintf(m, sizeof m, "%s/kill.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/kill", g_client_port);
    /* (a peer timeout of 4 s: etcd ends a killed rank's lease of 3.75 s after 4 s, its TTL, so the old
     * wait for it cannot pass for the exit note's) */
    job j = job_start_peer(rdzv, m, 300, 4);
    if (!job_wait_step(&j, m, 40, 30)) kill_rank(&j, 2);
    int rc = job_end(&j, 50);
    CHECK(rc == 0 && strstr(job_text(&j), "rank 2 lost (SIGKILL)") && strstr(job_text(&j), "re-plan 4 -> 3 ranks") &&
          strstr(job_text(&j), "3 ranks finished, 1 lost"), "--rdzv etcd: a rank killed, the job finishes on 3: rc %d\n%s", rc, job_text(&j));
    /* the launcher's exit note tells the others at once; etcd's death notice waits for the lease to end */
    const char *resumed = strstr(job_text(&j), "resumed at step ");
    double took = -1;
    int at = -1;
    if (resumed && sscanf(resumed, "resumed at step %d in %lf s", &at, &took) != 2) took = -1;
    CHECK(took >= 0 && took < 3, "--rdzv etcd: a rank killed: the others re-form within 3 s, before the lease's end could tell them "
          "(3.5-4.5 s; about 1 s on an idle machine): %.2f s", took);
    printf("--rdzv etcd, a rank killed: resumed at step %d in %.2f s\n", at, took);
    free(j.out);

    /* etcd killed and restarted while the job trains: it carries on */
    snprintf(m, sizeof m, "%s/restart.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/restart", g_client_port);
    j = job_start(rdzv, m, 2000);
    int ok = !job_wait_step(&j, m, 30, 30);
    etcd_stop(SIGKILL);
    int during = metrics_last_step(m);
    for (double t0 = test_now(); test_now() - t0 < 1.0;) job_poll(&j, 20);
    int after = metrics_last_step(m);
    ok = ok && !etcd_start();
    rc = job_end(&j, 60);
    CHECK(ok && rc == 0 && after > during && metrics_last_step(m) == 2000, "etcd killed and restarted mid-job: it trains on (step %d -> %d while etcd was "
          "down) and finishes: rc %d\n%s", during, after, rc, job_text(&j));
    free(j.out);

    /* etcd down and a rank lost: the survivors cannot agree on a new world: a clear message, no hang */
    snprintf(m, sizeof m, "%s/down.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/down", g_client_port);
    j = job_start(rdzv, m, 3000);
    ok = !job_wait_step(&j, m, 30, 30);
    etcd_stop(SIGKILL);
    double t0 = test_now();
    if (ok) kill_rank(&j, 1);
    rc = job_end(&j, 45);
    double dt = test_now() - t0;
    CHECK(ok && rc != 0 && rc != -1 && strstr(job_text(&j), "cannot reach the store") && strstr(job_text(&j), "etcd"),
          "etcd down and a rank lost: the job stops with a clear message in %.1f s: rc %d\n%s", dt, rc, job_text(&j));
    const char *why = strstr(job_text(&j), "cannot reach the store");
    if (why) printf("etcd down, a rank lost: stopped after %.1f s: ...%.*s\n", dt, (int)strcspn(why, "\n"), why);
    free(j.out);
    etcd_start(); /* (for a clean stop) */
}

/* etcd frozen (SIGSTOP: no reply, no error) past the members' leases while a job of 4 ranks trains, then resumed
 * (SIGCONT): etcd then ends the leases overdue, as if the members had died. They ran all along (their
 * renewals were sent and went unanswered), so the store was at fault, as when it restarts: each registers
 * again and the job goes on, finishing on all its ranks with the losses of a run without the freeze
 * (1e-6). A run of the same job without the freeze first (the reference, and the time it takes). */
static void test_frozen(void) {
    char rdzv[160], ref_rdzv[160], m[300], m_ref[300];
    snprintf(m, sizeof m, "%s/frozen.jsonl", g_tmp);
    snprintf(m_ref, sizeof m_ref, "%s/frozen_ref.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/frozen", g_client_port);
    snprintf(ref_rdzv, sizeof ref_rdzv, "tcp://127.0.0.1:%d/frozen-ref", job_free_port());
    /* (a peer timeout the load keeps: a rank starved past its lease is rightly fenced; the freeze outlasts
     * etcd's TTL, the lease rounded up to whole seconds and 2 at least, by 2 s; enough steps to train on
     * for a while after etcd resumes: 700-1500 steps/s unloaded) */
    double peer = job_peer_timeout(1.5), lease = peer - 0.25, ttl = ceil(lease > 2 ? lease : 2), freeze = ttl + 2;
    double limit = 60 * test_load_factor();
    /* the steps: those of the freeze and 2.5 s more at the rate of a probe run (steps 30 to 300) */
    job probe = job_start_peer(ref_rdzv, m_ref, 100000, peer);
    double t30 = job_wait_step(&probe, m_ref, 30, limit) ? 0 : test_now();
    double t300 = t30 > 0 && !job_wait_step(&probe, m_ref, 300, limit) ? test_now() : 0;
    job_kill(&probe), free(probe.out);
    /* (at least the unloaded rate: a probe measured under load that lifts later made too few steps, all
     * trained while etcd was frozen) */
    double rate = t300 > t30 && t30 > 0 && 270 / (t300 - t30) > 1500 ? 270 / (t300 - t30) : 1500;
    int steps = 30 + (int)(rate * (freeze + 2.5));
    if (steps < 3000) steps = 3000;
    if (steps > 60000) steps = 60000;
    unlink(m_ref);
    job j = job_start_peer(rdzv, m, steps, peer);
    int ok = !job_wait_step(&j, m, 30, limit), ws = 0;
    if (ok) kill(-g_etcd, SIGSTOP), kill(g_etcd, SIGSTOP), waitpid(g_etcd, &ws, WUNTRACED);
    int during = metrics_last_step(m);
    for (double t_stop = test_now(); test_now() - t_stop < freeze;) job_poll(&j, 20);
    kill(-g_etcd, SIGCONT), kill(g_etcd, SIGCONT);
    int resumed = metrics_last_step(m);
    double t0 = test_now();
    int rc = job_end(&j, limit);
    const char *t = job_text(&j);
    CHECK(ok && rc == 0 && resumed < steps - 500 && !strstr(t, "lost") && !strstr(t, "fenced") && !strstr(t, "re-plan") &&
              strstr(t, "registers again"), "etcd frozen %.0f s mid-job (steps %d -> %d of %d: 500 left at least; peer timeout %.2f s), "
          "then resumed: every rank registers again and the job finishes on all 4 in %.1f s: rc %d\n%s", freeze, during, resumed, steps,
          peer, test_now() - t0, rc, t);
    printf("etcd frozen %.0f s at step %d (peer timeout %.2f s): trained to step %d meanwhile, finished %.1f s after etcd resumed\n",
           freeze, during, peer, resumed, test_now() - t0);
    free(j.out);
    CHECK(!etcd_answers(), "etcd answers again after SIGCONT");
    /* the losses: those of the same job without the freeze (the built-in store), up to 1000 steps past
     * etcd's resume (that run is stopped there) */
    int to = resumed + 1000 < steps ? resumed + 1000 : steps;
    job ref = job_start_peer(ref_rdzv, m_ref, steps, peer);
    int ok_ref = !job_wait_step(&ref, m_ref, to, limit);
    job_kill(&ref);
    CHECK(ok_ref, "etcd frozen: the run without the freeze reaches step %d:\n%s", to, job_text(&ref));
    free(ref.out);
    if (rc == 0 && ok_ref) compare_losses("etcd frozen", m, m_ref, to, 1e-6);
}

/* A member stalled past its lease (PDDE_TEST_ELASTIC_STALL: its heartbeat and the member pause, as in a
 * process starved of the CPU) with its membership in etcd: etcd ends its lease, and when it runs again
 * its renewal is refused after a gap of its own, not a silent store: it stops, fenced, and does not
 * register again; the others finish on 2 ranks. (A lease of 2.25 s, 3 s in etcd: the stall of 5 s
 * outlasts it well on a loaded machine.) */
static void test_stalled(void) {
    char rdzv[160], m[300], run[600], gpt[600];
    snprintf(m, sizeof m, "%s/stalled.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/stalled", g_client_port);
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    char *argv[] = {run, "-n", "3", "--elastic", "--min", "2", "--peer-timeout", "2.5", "--grace", "1", "--rdzv", rdzv, gpt,
                    "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", "300", "--val-every", "0",
                    "--sample-len", "0", "--threads", "1", "--metrics", m, NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=30", "PDDE_TEST_ELASTIC_STALL=2@40", NULL};
    job j = job_spawn(argv, env);
    int rc = job_end(&j, 60 * test_load_factor());
    const char *t = job_text(&j);
    CHECK(rc == 0 && strstr(t, "rank 2 lost") && strstr(t, "dropped by the store") && strstr(t, "fenced") &&
              !strstr(t, "registers again") && strstr(t, "2 ranks finished, 1 lost"),
          "--rdzv etcd: a member stalled past its lease is fenced (no registering again) and the others finish on 2: rc %d\n%s", rc, t);
    free(j.out);
    /* a rank stopped (SIGSTOP) 4 s, past its lease and etcd's TTL of 2 s, then continued: its heartbeat
     * sees the gap in itself, so it does not register again: fenced */
    snprintf(m, sizeof m, "%s/stopped.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/stopped", g_client_port);
    j = job_start_peer(rdzv, m, 3000, 1.5);
    pid_t pids[8];
    int ok = !job_wait_step(&j, m, 40, 60 * test_load_factor()) && job_ranks(j.pid, pids, 8) && pids[2] > 0;
    if (ok) job_signal_rank(pids[2], SIGSTOP);
    for (double t0 = test_now(); ok && test_now() - t0 < 4;) job_poll(&j, 20);
    if (ok) job_signal_rank(pids[2], SIGCONT);
    rc = job_end(&j, 60 * test_load_factor());
    t = job_text(&j);
    const char *said = strstr(t, "[2] gpt: elastic: member 2");
    CHECK(ok && rc == 0 && strstr(t, "rank 2 lost") && said && strstr(said, "fenced") && !strstr(t, "registers again") &&
              strstr(t, "3 ranks finished, 1 lost"),
          "--rdzv etcd: a rank stopped 4 s and continued is fenced (no registering again), the others finish on 3: rc %d\n%s", rc, t);
    free(j.out);
}

/* A rank killed before it registers with the store (it holds there, PDDE_TEST_ELASTIC_HOLD, until the
 * SIGKILL): no lease of its ever ends, but pdde-run notes how it ended, and the others, forming the
 * world, report it within seconds, not at the rendezvous timeout (60 s here), naming the rank. With
 * the membership in etcd and in the built-in store. */
static void test_forming(const char *rdzv_kind) {
    char rdzv[160], m[300];
    snprintf(m, sizeof m, "%s/forming.jsonl", g_tmp);
    if (!strcmp(rdzv_kind, "etcd")) snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/forming", g_client_port);
    else snprintf(rdzv, sizeof rdzv, "tcp://127.0.0.1:%d/forming", job_free_port());
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=60", "PDDE_TEST_ELASTIC_HOLD=3", NULL};
    job j = job_start_env(rdzv, m, 300, env);
    int held = 0;
    while (!job_poll(&j, 10) && test_now() - j.t0 < 30 && !(held = strstr(job_text(&j), "member 3 holds before it registers") != NULL)) {}
    double t_kill = test_now();
    if (held) kill_rank(&j, 3);
    int rc = job_end(&j, 30);
    double dt = test_now() - t_kill;
    const char *why = strstr(job_text(&j), "rank 3 (member 3) ended (SIGKILL");
    CHECK(held && rc != 0 && rc != -1 && why && dt < 5 && strstr(job_text(&j), "cannot form the world of 4 ranks"),
          "--rdzv %s: rank 3 killed before it registers: the others report it within 5 s (the timeout is 60 s): %.1f s, rc %d\n%s",
          rdzv_kind, dt, rc, job_text(&j));
    if (why) printf("--rdzv %s: rank 3 killed before it registered: the others stopped %.2f s after: ...%.*s\n", rdzv_kind, dt,
                    (int)strcspn(why, "\n"), why);
    free(j.out);
}

/* A rank killed and started again by pdde-run --restart 1 with the membership in etcd: it joins as a
 * new member (its id from etcd's counter, taken by pdde-run) and the job finishes on 3 ranks again.
 * Killed again once a member, it is lost once: the members do not take it in again as a joiner while
 * its lease lasts (its launcher noted its end). The waits grow with the machine's load. */
static int count_of(const char *text, const char *what);
static int job_says(job *j, const char *text, double limit_s);
static void test_restart(void) {
    char rdzv[160], m[300], run[600], gpt[600];
    snprintf(m, sizeof m, "%s/restart_rank.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/restart-rank", g_client_port);
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    /* (3000 steps: the restarted rank must be taken in, and run 20 steps, before the job ends) */
    char *argv[] = {run, "-n", "3", "--elastic", "--min", "2", "--peer-timeout", "1.5", "--grace", "1", "--restart", "1", "--rdzv", rdzv, gpt,
                    "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", "3000", "--val-every", "0",
                    "--sample-len", "0", "--threads", "1", "--metrics", m, NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=60", NULL};
    double limit = 60 * test_load_factor();
    job j = job_spawn(argv, env);
    if (!job_wait_step(&j, m, 40, limit)) kill_rank(&j, 2);
    /* killed again once it is a member (its id is etcd's, not its rank): pdde-run's note of its end names
     * that member, so the others know at once how it ended ("lost (SIGKILL)"), not when its lease ends */
    job_says(&j, "1 rank joined", limit);
    int joined_at = metrics_last_step(m), again = strstr(job_text(&j), "1 rank joined") && !job_wait_step(&j, m, joined_at + 20, limit);
    if (again) kill_rank(&j, 2);
    int rc = job_end(&j, limit);
    const char *t = job_text(&j), *first = strstr(t, "lost (SIGKILL)"), *second = first ? strstr(first + 1, "lost (SIGKILL)") : NULL;
    CHECK(again && rc == 0 && strstr(t, "rank 2 restarted") && strstr(t, "1 rank joined") && strstr(t, "rank 2 (member 65536, pid") && second &&
              count_of(t, "rank joined") == 1,
          "--rdzv etcd, --restart 1: rank 2 killed, started again, taken in (once), killed again, each end noted: rc %d\n%s", rc, t);
    const char *line = strstr(t, "1 rank joined");
    if (line) printf("--rdzv etcd, --restart 1: ...%.*s\n", (int)strcspn(line, "\n"), line);
    free(j.out);
}

/* A rank started again by pdde-run --restart and killed at once, before it could register: pdde-run
 * took its member id before starting it, so it notes its end under that id (its line names the member),
 * and the job finishes on the other 2 ranks without taking it in. */
static void test_restart_early(void) {
    char rdzv[160], m[300], run[600], gpt[600];
    snprintf(m, sizeof m, "%s/restart_early.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/restart-early", g_client_port);
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    char *argv[] = {run, "-n", "3", "--elastic", "--min", "2", "--peer-timeout", "1.5", "--grace", "1", "--restart", "1", "--rdzv", rdzv, gpt,
                    "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", "300", "--val-every", "0",
                    "--sample-len", "0", "--threads", "1", "--metrics", m, NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=60", NULL};
    double limit = 60 * test_load_factor();
    job j = job_spawn(argv, env);
    if (!job_wait_step(&j, m, 20, limit)) kill_rank(&j, 2);
    int pid = 0;
    const char *said = job_says(&j, "rank 2 restarted (pid ", limit) ? strstr(job_text(&j), "rank 2 restarted (pid ") : NULL;
    if (said) pid = atoi(said + strlen("rank 2 restarted (pid "));
    if (pid > 0) kill(pid, SIGKILL); /* (it is still loading: gpt has not reached the store yet) */
    int rc = job_end(&j, limit);
    char want[96];
    snprintf(want, sizeof want, "rank 2 (member 65536, pid %d) was killed by signal 9", pid);
    const char *t = job_text(&j);
    CHECK(pid > 0 && rc == 0 && strstr(t, want) && !strstr(t, "rank joined") && strstr(t, "2 ranks finished, 2 lost"),
          "--rdzv etcd, --restart 1: the restarted rank killed before it registered: its end noted under its member id: rc %d\n%s", rc, t);
    free(j.out);
}

/* The losses of steps 1..to in two gpt metrics files agree within tol (relative; NaN or a missing step fails). */
static void compare_losses(const char *what, const char *got_path, const char *want_path, int to, double tol) {
    double *got = malloc((size_t)(to + 1) * sizeof *got), *want = malloc((size_t)(to + 1) * sizeof *want);
    if (!got || !want) { CHECK(0, "%s: out of memory", what); free(got), free(want); return; }
    metrics_losses(got_path, got, to), metrics_losses(want_path, want, to);
    double worst = 0;
    int bad = -1;
    for (int s = 1; s <= to; s++) {
        double d = isfinite(got[s]) && isfinite(want[s]) ? fabs(got[s] - want[s]) / fabs(want[s]) : INFINITY;
        if (d > worst) worst = d;
        if (!(d <= tol) && bad < 0) bad = s;
    }
    CHECK(bad < 0, "%s: step %d's loss %.9g differs from %s's %.9g (tolerance %.3g relative; NaN: no loss)", what, bad,
          bad > 0 ? got[bad] : 0, want_path, bad > 0 ? want[bad] : 0, tol);
    printf("%s: the losses of steps 1..%d equal %s's within %.3g (relative; tolerance %.3g)\n", what, to, want_path, worst, tol);
    free(got), free(want);
}

/* Grow through etcd: a job of 2 ranks (--max 3, membership in etcd), then pdde-run --join -n 1 with the
 * same --rdzv etcd://: it reads the job's store address from etcd, and the members take it in at a step
 * boundary and hand it the state, as with tcp://. Checked as the tcp grow test does: both finish, the
 * job's transition says so (dp=3), nothing is lost, and the losses up to 10 steps after the join equal
 * those of 2 ranks without changes (1e-4: the ranks there are change only the rounding; that run is
 * stopped once past them). The address is gone from etcd once the job ends (its pdde-run's lease). A join to a
 * job etcd has not heard of stops at once, naming etcd and the job. */
static void test_grow(void) {
    char rdzv[160], m[300], m_base[300], m_join[300], run[600], gpt[600], peer[16];
    snprintf(m, sizeof m, "%s/grow.jsonl", g_tmp);
    snprintf(m_base, sizeof m_base, "%s/grow_base.jsonl", g_tmp);
    snprintf(m_join, sizeof m_join, "%s/grow_joiner.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/grow", g_client_port);
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    /* (planned changes measure no detection: a peer timeout a loaded machine keeps, as test_elastic's grow) */
    snprintf(peer, sizeof peer, "%.1f", job_peer_timeout(10));
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=60", "PDDE_JOB_SECRET=test-etcd-grow-secret-0123456789abcdef", NULL};
    /* (1500 steps: the joiner's process must start and be taken in before the job ends, and a loaded
     * machine slows both; the limits grow with the load) */
    double limit = 60 * test_load_factor();
#define GROW_GPT(steps) gpt, "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", steps, \
                        "--val-every", "0", "--sample-len", "0", "--threads", "1", "--metrics"
    char *job_argv[] = {run, "-n", "2", "--elastic", "--min", "1", "--max", "3", "--peer-timeout", peer, "--grace", "1", "--rdzv", rdzv,
                        GROW_GPT("1500"), m, NULL};
    char *join_argv[] = {run, "-n", "1", "--elastic", "--join", "--min", "1", "--peer-timeout", peer, "--grace", "1", "--rdzv", rdzv,
                         GROW_GPT("1500"), m_join, NULL};
    char *base_argv[] = {run, "-n", "2", "--elastic", "--peer-timeout", peer, "--grace", "1", GROW_GPT("1500"), m_base, NULL};
#undef GROW_GPT
    job a = job_spawn(job_argv, env);
    int ok = !job_wait_step(&a, m, 20, limit);
    job b = job_spawn(join_argv, env);
    int rc_b = job_end(&b, 2 * limit), rc_a = job_end(&a, limit);
    const char *t = job_text(&a), *line = strstr(t, "1 rank joined at step ");
    int at = line ? atoi(line + strlen("1 rank joined at step ")) : -1;
    CHECK(ok && rc_a == 0 && rc_b == 0 && line && strstr(line, "re-plan 2 -> 3 ranks: dp=3") && !strstr(t, "lost"),
          "grow 2 -> 3 through etcd: rc %d and %d (joiner)\n%s\n--- joiner:\n%s", rc_a, rc_b, t, job_text(&b));
    if (line) printf("grow (etcd): ...%.*s\n", (int)strcspn(line, "\n"), line);
    if (at > 0) { /* (the same --steps: the learning rate's schedule follows them) */
        job base = job_spawn(base_argv, env);
        int ok_base = !job_wait_step(&base, m_base, at + 11, limit);
        job_kill(&base);
        CHECK(ok_base, "grow (etcd): the run of 2 ranks without changes reaches step %d:\n%s", at + 11, job_text(&base));
        free(base.out);
        compare_losses("grow (etcd)", m, m_base, at + 10, 1e-4);
    }
    free(a.out), free(b.out);
    if (rc_a == 0) { /* (a job killed leaves its lease to run out) */
        pdde_context *ctx;
        pdde_context_init(NULL, &ctx);
        pdde_store *s = NULL;
        void *v = NULL;
        size_t n = 0;
        pdde_status st = pdde_store_etcd_connect(ctx, g_url, 10, &s);
        if (!st) st = pdde_store_get(s, "elastic/grow/store", &v, &n);
        CHECK(st == PDDE_ERR_NOT_FOUND, "grow (etcd): the job's store address left etcd with the job: %s", pdde_status_str(st));
        free(v);
        pdde_store_close(s);
        pdde_context_free(ctx);
    }

    /* a job etcd does not know */
    char nowhere[160];
    snprintf(nowhere, sizeof nowhere, "etcd://127.0.0.1:%d/no-such-job", g_client_port);
    char *lost_argv[] = {run, "-n", "1", "--elastic", "--join", "--rdzv", nowhere, gpt, "--steps", "10", NULL};
    job c = job_spawn(lost_argv, env);
    int rc_c = job_end(&c, 30);
    double took = job_now() - c.t0;
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", g_client_port);
    CHECK(rc_c == 2 && took < 5 && strstr(job_text(&c), "no elastic job 'no-such-job'") && strstr(job_text(&c), where),
          "--join to a job etcd does not know: a clear error at once: rc %d after %.2f s:\n%s", rc_c, took, job_text(&c));
    printf("--join, no such job in etcd: rc %d after %.2f s: %.*s\n", rc_c, took, (int)strcspn(job_text(&c), "\n"), job_text(&c));
    free(c.out);
}

/* A rank started by pdde-run --join and killed once the job took it in: that pdde-run notes its end
 * under the rank's member id, so the members re-form at once naming it "lost (SIGKILL)", well before
 * its lease ends: within 3 s, which leaves a loaded machine room (a peer timeout of 6 s: etcd ends the
 * lease of 5.75 s once its TTL, 6 s, has passed since the last renewal, at most 1.44 s before the kill). */
static void test_join_lost(void) {
    char rdzv[160], m[300], m_join[300], run[600], gpt[600];
    snprintf(m, sizeof m, "%s/join_lost.jsonl", g_tmp);
    snprintf(m_join, sizeof m_join, "%s/join_lost_joiner.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/join-lost", g_client_port);
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=60", "PDDE_JOB_SECRET=test-etcd-joinlost-secret-0123456789abcdef", NULL};
    double limit = 60 * test_load_factor();
#define JL_GPT(steps) gpt, "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", steps, \
                      "--val-every", "0", "--sample-len", "0", "--threads", "1", "--metrics"
    /* (3000 steps: the joiner must start, be taken in and run 20 steps before the job ends) */
    char *job_argv[] = {run, "-n", "2", "--elastic", "--min", "1", "--max", "3", "--peer-timeout", "6", "--grace", "1", "--rdzv", rdzv,
                        JL_GPT("3000"), m, NULL};
    char *join_argv[] = {run, "-n", "1", "--elastic", "--join", "--min", "1", "--peer-timeout", "6", "--grace", "1", "--rdzv", rdzv,
                         JL_GPT("3000"), m_join, NULL};
#undef JL_GPT
    job a = job_spawn(job_argv, env);
    int ok = !job_wait_step(&a, m, 20, limit);
    job b = job_spawn(join_argv, env);
    ok = ok && job_says(&a, "1 rank joined", limit);
    int joined_at = metrics_last_step(m);
    ok = ok && !job_wait_step(&a, m, joined_at + 20, limit);
    pid_t pids[8];
    job_ranks(b.pid, pids, 8); /* (its pdde-run is node 1 of one rank: the rank is PDDE_RANK 1) */
    ok = ok && job_signal_rank(pids[1], SIGKILL) == 0;
    int rc_b = job_end(&b, limit), rc_a = job_end(&a, limit);
    const char *t = job_text(&a), *lost = strstr(t, "rank 2 lost (SIGKILL)"), *resumed = lost ? strstr(lost, "resumed at step ") : NULL;
    double took = -1;
    int at = -1;
    if (resumed && sscanf(resumed, "resumed at step %d in %lf s", &at, &took) != 2) took = -1;
    CHECK(ok && rc_a == 0 && lost && took >= 0 && took < 3 && strstr(job_text(&b), "(member 65536, pid") && rc_b != 0,
          "--join, the joined rank killed: its pdde-run notes its end, the members re-form within 3 s (its lease ends after 4.5 s or more): "
          "%.2f s; rc %d, %d (joiner)\n%s\n--- joiner:\n%s", took, rc_a, rc_b, t, job_text(&b));
    if (lost) printf("--join, the joined rank killed: ...%.*s\n", (int)strcspn(lost, "\n"), lost);
    free(a.out), free(b.out);
}

/* Polls the job until its output has `text` or limit_s passed; 1 when it has. */
static int job_says(job *j, const char *text, double limit_s) {
    for (double t0 = test_now(); !strstr(job_text(j), text) && test_now() - t0 < limit_s;)
        if (job_poll(j, 50)) break;
    return strstr(job_text(j), text) != NULL;
}

static int count_of(const char *text, const char *what) {
    int k = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) k++;
    return k;
}

static void test_messages(void) {
    char run[600], gpt[600], url[160];
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=20", "PDDE_JOB_SECRET=test-etcd-msgs-secret-0123456789abcdef", NULL};

    /* endpoints that can never work: at once */
    const char *never[] = {"etcd://127.0.0.1:99999/j", "etcd://nosuchhost.invalid:2379/j"}, *why[] = {"port 1..65535", "resolve host"};
    for (int k = 0; k < 2; k++) {
        char *argv[] = {run, "-n", "2", "--elastic", "--rdzv", (char *)never[k], gpt, "--steps", "2", NULL};
        job j = job_spawn(argv, env);
        int rc = job_end(&j, 40);
        double took = job_now() - j.t0;
        CHECK(rc == 2 && took < 5 && strstr(job_text(&j), why[k]), "--rdzv %s: fails at once (%.2f s, exit 2), saying why: rc %d\n%s",
              never[k], took, rc, job_text(&j));
        free(j.out);
    }
    /* nothing listening (etcd may be starting): waited for, and said at once */
    int port = job_free_port();
    snprintf(url, sizeof url, "etcd://127.0.0.1:%d/j", port);
    char want[160];
    snprintf(want, sizeof want, "waiting up to 30 s for etcd at 127.0.0.1:%d (", port);
    char *refused_argv[] = {run, "-n", "2", "--elastic", "--rdzv", url, gpt, "--steps", "2", NULL};
    job r = job_spawn(refused_argv, env);
    int said = job_says(&r, want, 3), exited = r.exited;
    job_kill(&r);
    CHECK(said && !exited, "--rdzv to an etcd that refuses: says it waits within 3 s (and waits):\n%s", job_text(&r));
    free(r.out);

    /* a job at its --max: a joiner is told it is full, and how long its ranks wait */
    char m[300], m_join[300], rdzv[160];
    snprintf(m, sizeof m, "%s/full.jsonl", g_tmp);
    snprintf(m_join, sizeof m_join, "%s/full_joiner.jsonl", g_tmp);
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/full", g_client_port);
    double limit = 60 * test_load_factor();
#define MSG_GPT gpt, "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", "100000", "--val-every", \
                "0", "--sample-len", "0", "--threads", "1", "--metrics"
    char *job_argv[] = {run, "-n", "2", "--elastic", "--min", "1", "--max", "2", "--peer-timeout", "1.5", "--grace", "1", "--rdzv", rdzv,
                        MSG_GPT, m, NULL};
    char *join_argv[] = {run, "-n", "1", "--elastic", "--join", "--peer-timeout", "1.5", "--grace", "1", "--rdzv", rdzv, MSG_GPT, m_join, NULL};
#undef MSG_GPT
    job a = job_spawn(job_argv, env);
    int ok = !job_wait_step(&a, m, 20, limit);
    job b = job_spawn(join_argv, env);
    said = job_says(&b, "job 'full' is full (2 of --max 2 members)", 10) && strstr(job_text(&b), "for up to 20 s");
    const char *full = strstr(job_text(&b), "pdde-run: --join: job 'full' is full");
    if (full) printf("--join to a full job: %.*s\n", (int)strcspn(full, "\n"), full);
    CHECK(ok && said, "--join to a job at its --max: says it is full and how long it waits:\n%s\n--- job:\n%s", job_text(&b), job_text(&a));
    /* SIGTERM to the joiner's pdde-run, once its rank runs (it handles signals by then): a stop, not a failure */
    pid_t joiner[8] = {0};
    for (double t0 = test_now(); !job_ranks(b.pid, joiner, 8) && test_now() - t0 < 10;) job_poll(&b, 50);
    kill(b.pid, SIGTERM);
    int rc_b = job_end(&b, 20);
    CHECK(rc_b == 143 && strstr(job_text(&b), "stopped by SIGTERM") && !strstr(job_text(&b), "job failed") &&
          !strstr(job_text(&b), "the others go on"), "SIGTERM to a joiner's pdde-run: stopped by SIGTERM, 143: rc %d\n%s", rc_b, job_text(&b));
    /* a loss the job recovers from, then SIGTERM to its pdde-run: the stop is what ended it */
    kill_rank(&a, 1);
    ok = job_says(&a, "re-plan 2 -> 1 ranks", limit);
    kill(a.pid, SIGTERM);
    int rc_a = job_end(&a, limit);
    const char *t = job_text(&a);
    CHECK(ok && rc_a == 143 && strstr(t, "stopped by SIGTERM") && count_of(t, "the others go on") == 1 && !strstr(t, "root cause") &&
          !strstr(t, "job failed"), "SIGTERM to an elastic job after a loss it went on from: stopped by SIGTERM, 143: rc %d\n%s", rc_a, t);
    const char *line = strstr(t, "pdde-run: stopped by");
    if (line) printf("SIGTERM after a recovered loss: rc %d: %.*s\n", rc_a, (int)strcspn(line, "\n"), line);
    free(a.out), free(b.out);
}

/* etcd's value of key (malloc'ed, NUL-terminated) or NULL when it has none. */
static char *etcd_value(const char *key) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_store *s = NULL;
    void *v = NULL;
    size_t n = 0;
    char *out = NULL;
    if (!pdde_store_etcd_connect(ctx, g_url, 10, &s) && !pdde_store_get(s, key, &v, &n) && (out = malloc(n + 1)))
        memcpy(out, v, n), out[n] = 0;
    free(v);
    pdde_store_close(s);
    pdde_context_free(ctx);
    return out;
}

/* Node `node` of 2 (2 ranks each, one pdde-run each, node 0's store on 127.0.0.1:port) of the job of
 * job_start. */
static job job_start_node(const char *rdzv, const char *metrics, int steps, int node, int port) {
    char run[600], gpt[600], st[16], store[32];
    snprintf(run, sizeof run, "%s/pdde-run", g_dir);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    snprintf(st, sizeof st, "%d", steps);
    snprintf(store, sizeof store, "127.0.0.1:%d", port);
    char *argv[] = {run, "-n", "2", "--nnodes", "2", "--node-rank", node ? "1" : "0", "--store", store, "--elastic", "--min", "2",
                    "--peer-timeout", "1.5", "--grace", "1", "--rdzv", (char *)rdzv, gpt, "--layers", "1", "--width", "32", "--heads",
                    "2", "--ctx", "16", "--batch", "12", "--steps", st, "--val-every", "0", "--sample-len", "0", "--threads", "1",
                    "--metrics", (char *)metrics, NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC_TIMEOUT=10", "PDDE_JOB_SECRET=test-etcd-nodes-secret-0123456789abcdef", NULL};
    return job_spawn(argv, env);
}

/* One job name, several runs: etcd keeps what a run wrote (exit notes, death notices, generations) after
 * it, and a run must not read an earlier one's. The same --rdzv etcd://.../again twice in a row (the
 * second on two nodes: node 1's pdde-run reads the run id from node 0's store), then a
 * run killed by SIGKILL (its keys stay, its store address too until its lease ends), then at once a
 * third: each trains to the end and gives the losses of a run of a fresh name (1e-6). A run that ends
 * cleanly leaves no keys of its run (its id: etcd's elastic/again/run while it runs); one started once
 * the killed run's lease has ended deletes what that run left. */
static void test_same_name(void) {
    char rdzv[160], fresh[160], m[3][300], m_fresh[300], m_killed[300], key[400];
    snprintf(rdzv, sizeof rdzv, "etcd://127.0.0.1:%d/again", g_client_port);
    snprintf(fresh, sizeof fresh, "etcd://127.0.0.1:%d/again-fresh", g_client_port);
    snprintf(m_fresh, sizeof m_fresh, "%s/again_fresh.jsonl", g_tmp);
    snprintf(m_killed, sizeof m_killed, "%s/again_killed.jsonl", g_tmp);
    const int steps = 12;
    double limit = 60 * test_load_factor();
    job f = job_start(fresh, m_fresh, steps);
    int rc = job_end(&f, limit);
    CHECK(rc == 0, "job 'again-fresh' trains: rc %d\n%s", rc, job_text(&f));
    free(f.out);
    char *run_ids[3] = {0}, *killed_run = NULL;
    for (int k = 0; k < 3; k++) {
        if (k == 2) { /* a run killed (pdde-run and its ranks, SIGKILL) once it trains: its keys stay in etcd */
            job c = job_start(rdzv, m_killed, 3000);
            int trained = !job_wait_step(&c, m_killed, 3, limit);
            killed_run = etcd_value("elastic/again/run");
            job_kill(&c);
            CHECK(trained && killed_run, "the run of 'again' to be killed trains and its run id is in etcd:\n%s", job_text(&c));
            free(c.out);
            snprintf(key, sizeof key, "elastic/again/%s/max", killed_run ? killed_run : "?");
            char *left = etcd_value(key);
            CHECK(left != NULL, "the killed run's keys stay in etcd (%s)", key);
            free(left);
        }
        snprintf(m[k], sizeof m[k], "%s/again%d.jsonl", g_tmp, k);
        char m_node1[300];
        snprintf(m_node1, sizeof m_node1, "%s/again%d_node1.jsonl", g_tmp, k);
        int port = job_free_port(), rc_node1 = 0;
        job j = k == 1 ? job_start_node(rdzv, m[k], steps, 0, port) : job_start(rdzv, m[k], steps), j1 = {0};
        if (k == 1) j1 = job_start_node(rdzv, m_node1, steps, 1, port);
        while (!run_ids[k] && !job_poll(&j, 20) && test_now() - j.t0 < limit) {
            char *id = etcd_value("elastic/again/run");
            if (id && (!killed_run || strcmp(id, killed_run))) run_ids[k] = id;
            else free(id);
        }
        rc = job_end(&j, limit);
        if (k == 1) rc_node1 = job_end(&j1, limit);
        CHECK(rc == 0 && rc_node1 == 0 && run_ids[k], "run %d of job 'again'%s trains to the end: rc %d (node 1: %d), run id %s\n%s\n%s", k + 1,
              k == 1 ? " (on 2 nodes)" : k == 2 ? " (right after one killed)" : "", rc, rc_node1, run_ids[k] ? run_ids[k] : "(none seen)",
              job_text(&j), job_text(&j1));
        free(j.out), free(j1.out);
        char what[64];
        snprintf(what, sizeof what, "job 'again', run %d", k + 1);
        if (rc == 0) compare_losses(what, m[k], m_fresh, steps, 1e-6);
        snprintf(key, sizeof key, "elastic/again/%s/max", run_ids[k] ? run_ids[k] : "?");
        char *left = etcd_value(key);
        CHECK(run_ids[k] && !left, "run %d of job 'again' ended cleanly and left no keys of its run in etcd (%s)", k + 1, key);
        free(left);
    }
    /* once the killed run's lease has ended (2 s, etcd's least), the next run deletes what it left */
    for (double t0 = test_now(); test_now() - t0 < 10;) {
        char *store = etcd_value("elastic/again/store");
        free(store);
        if (!store) break;
        usleep(100000);
    }
    job e = job_start(rdzv, m[0], 2);
    rc = job_end(&e, limit);
    snprintf(key, sizeof key, "elastic/again/%s/max", killed_run ? killed_run : "?");
    char *left = etcd_value(key);
    CHECK(rc == 0 && killed_run && !left, "a run of 'again' after the killed run's lease ended deleted that run's keys (%s): rc %d\n%s",
          key, rc, job_text(&e));
    free(left), free(e.out), free(killed_run);
    for (int k = 0; k < 3; k++) free(run_ids[k]);
}

/* A joiner (PDDE_ELASTIC_JOIN=1) waiting to be taken in, whose etcd stops answering (SIGSTOP: no reply, no
 * error, as a host cut off from it sees it), stops within a few leases saying it is cut off, not at its
 * timeout (100 s) nor at its requests' (10 s each): holding a lease, it waits for a reply at most twice
 * the lease. etcd is then resumed (SIGCONT). */
static void test_joiner_cut_off(pdde_context *ctx) {
    char m[300], gpt[600];
    snprintf(m, sizeof m, "%s/cut_joiner.jsonl", g_tmp);
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    double lease_s = 1.0 - 0.25; /* (PDDE_PEER_TIMEOUT less its margin) */
    pdde_store *s = NULL;
    int ok = pdde_store_etcd_connect(ctx, g_url, 10, &s) == PDDE_OK && pdde_store_set(s, "elastic/cut/max", "4", 1) == PDDE_OK;
    CHECK(ok, "etcd joiner cut off: the job's maximum set in etcd");
    /* (the joiner is gpt with the environment pdde-run --restart gives a rank it starts again: its
     * membership in etcd, its world at a store it never reaches here; no job's pdde-run is running) */
    char rdzv_env[160], job_env[64];
    snprintf(rdzv_env, sizeof rdzv_env, "PDDE_RDZV=etcd://127.0.0.1:%d", g_client_port);
    snprintf(job_env, sizeof job_env, "PDDE_ELASTIC_JOB=cut");
    char *argv[] = {gpt, "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", "100",
                    "--val-every", "0", "--sample-len", "0", "--threads", "1", "--metrics", m, NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC=1", "PDDE_ELASTIC_JOIN=1", rdzv_env, job_env, "PDDE_ELASTIC_MIN=1",
                         "PDDE_ELASTIC_MAX=65536", "PDDE_PEER_TIMEOUT=1.0", "PDDE_ELASTIC_TIMEOUT=100", "PDDE_STORE_ADDR=127.0.0.1:1",
                         "PDDE_WORLD_SIZE=1", "PDDE_RANK=0", "PDDE_LOCAL_RANK=0", "PDDE_LOCAL_SIZE=1",
                         "PDDE_JOB_SECRET=test-etcd-secret-0123456789abcdef", NULL};
    job j = job_spawn(argv, env);
    int asked = 0; /* its request to join is in etcd: it waits to be taken in */
    while (ok && !asked && !job_poll(&j, 20) && test_now() - j.t0 < 30) {
        void *v = NULL;
        size_t n = 0;
        asked = pdde_store_get(s, "elastic/cut/join/65536", &v, &n) == PDDE_OK;
        free(v);
    }
    pdde_store_close(s);
    CHECK(asked, "etcd joiner cut off: the joiner asked to join:\n%s", job_text(&j));
    if (!asked) { job_kill(&j), free(j.out); return; }
    int ws = 0;
    kill(-g_etcd, SIGSTOP), kill(g_etcd, SIGSTOP);
    waitpid(g_etcd, &ws, WUNTRACED); /* (stopped now, not soon) */
    /* its stop: a renewal and a read in flight, then at exit the heartbeat's renewal and the clean close's
     * two requests (1 s each) may each wait out etcd's silence: 6 leases and 3 s, and 1 s for the process
     * to end and be reaped (measured: 8.06 s at worst, 5.07 s mostly), times the load; under 10 s: without
     * a lease its requests wait 10 s each, so one that waits a request out fails here */
    double t_stop = test_now(), bound = (6 * lease_s + 3 + 1) * test_load_factor();
    if (bound > 9.5) bound = 9.5;
    int rc = job_end(&j, bound + 15);
    double took = test_now() - t_stop;
    kill(-g_etcd, SIGCONT), kill(g_etcd, SIGCONT);
    CHECK(rc > 0 && took < bound && strstr(job_text(&j), "has had no reply from the store") && strstr(job_text(&j), "cut off or the store is down"),
          "etcd joiner cut off: the joiner stops within %.2f s of etcd stopping (6 leases of %.2f s and 4 s, times the load, "
          "under 10 s), saying it is cut off: rc %d after %.2f s:\n%s", bound, lease_s, rc, took, job_text(&j));
    printf("etcd joiner cut off: stopped %.2f s after etcd did (lease %.2f s, bound %.2f s)\n", took, lease_s, bound);
    free(j.out);
    CHECK(!etcd_answers(), "etcd answers again after SIGCONT");
}

/* A joiner given a member id that is no joiner's (PDDE_ELASTIC_ID, which pdde-run sets): it stops at
 * once naming the variable and what it must be. */
static void test_bad_joiner_id(void) {
    char gpt[600], rdzv_env[160];
    snprintf(gpt, sizeof gpt, "%s/gpt", g_dir);
    snprintf(rdzv_env, sizeof rdzv_env, "PDDE_RDZV=etcd://127.0.0.1:%d", g_client_port);
    char *argv[] = {gpt, "--layers", "1", "--width", "32", "--heads", "2", "--ctx", "16", "--batch", "12", "--steps", "10",
                    "--val-every", "0", "--sample-len", "0", "--threads", "1", NULL};
    const char *env[] = {"PDDE_BACKENDS=cpu", "PDDE_ELASTIC=1", "PDDE_ELASTIC_JOIN=1", "PDDE_ELASTIC_ID=12", rdzv_env, "PDDE_ELASTIC_JOB=badid",
                         "PDDE_PEER_TIMEOUT=1.0", "PDDE_ELASTIC_TIMEOUT=20", "PDDE_STORE_ADDR=127.0.0.1:1", "PDDE_WORLD_SIZE=1", "PDDE_RANK=0",
                         "PDDE_LOCAL_RANK=0", "PDDE_LOCAL_SIZE=1", "PDDE_JOB_SECRET=test-etcd-secret-0123456789abcdef", NULL};
    job j = job_spawn(argv, env);
    int rc = job_end(&j, 30);
    double took = job_now() - j.t0;
    CHECK(rc > 0 && took < 10 && strstr(job_text(&j), "PDDE_ELASTIC_ID=12 is not a joiner's member id (an integer from 65536 up"),
          "a joiner with PDDE_ELASTIC_ID=12: a clear error at once: rc %d after %.2f s:\n%s", rc, took, job_text(&j));
    free(j.out);
}

int main(int argc, char **argv) {
    test_binary_dir(argv[0], g_dir, sizeof g_dir);
    if (system("command -v etcd >/dev/null 2>&1")) {
        test_skip("etcd", "no etcd on PATH (Debian: etcd-server; tools/install-deps.sh installs it)");
        return test_finish();
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/pdde-etcd.XXXXXX");
    if (!mkdtemp(g_tmp)) { perror("mkdtemp"); return 1; }
    g_client_port = job_free_port(), g_peer_port = job_free_port();
    snprintf(g_url, sizeof g_url, "http://127.0.0.1:%d", g_client_port);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    if (etcd_start()) {
        CHECK(0, "etcd did not start on %s (see %s/etcd.log)", g_url, g_tmp);
    } else {
        test_ops(ctx);
        test_notices(ctx);
        char run[600];
        snprintf(run, sizeof run, "%s/pdde-run", g_dir);
        if (access(run, X_OK)) test_skip("build", "%s is not built", run);
        else if (argc > 1 && !strcmp(argv[1], "same-name")) test_same_name(); /* (one test alone, while working on it) */
        else if (argc > 1 && !strcmp(argv[1], "cut-off")) test_joiner_cut_off(ctx);
        else if (argc > 1 && !strcmp(argv[1], "messages")) test_messages(), test_bad_joiner_id();
        else if (argc > 1 && !strcmp(argv[1], "restart")) test_restart(), test_restart_early();
        else if (argc > 1 && !strcmp(argv[1], "join-lost")) test_join_lost();
        else if (argc > 1 && !strcmp(argv[1], "job")) test_job();
        else if (argc > 1 && !strcmp(argv[1], "frozen")) test_frozen(), test_stalled();
        else test_messages(), test_bad_joiner_id(), test_job(), test_frozen(), test_stalled(), test_forming("etcd"), test_forming("tcp"), test_restart(), test_restart_early(), test_grow(), test_join_lost(),
                 test_same_name(), test_joiner_cut_off(ctx);
    }
    etcd_stop(SIGTERM);
    pdde_context_free(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd)) {}
    return test_finish();
}
#endif
