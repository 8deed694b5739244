/* comm_test_util.h — runs a function as N rank processes (fork) around a store server in the parent,
 * and sums the ranks' CHECK counts into the parent's. Include after test_util.h. */
#ifndef PDDE_COMM_TEST_UTIL_H
#define PDDE_COMM_TEST_UTIL_H
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef void (*test_rank_fn)(pdde_context *ctx, pdde_comm *comm, void *arg);

typedef struct {
    const char *addr;       /* the store, "127.0.0.1:port" */
    const char *prefix;     /* one per run, so the keys of several runs do not meet */
    double timeout_s, peer_timeout_s;
    int no_comm;            /* 1: fn gets comm = NULL and makes its own */
    unsigned killed_ok;     /* bit r: rank r is meant to die (the test kills it) */
} test_ranks_params;

/* Forks n ranks that connect to the store, init a world comm and run fn; waits for all of them (or
 * kills them after limit_s). Returns the number of ranks that did not exit cleanly. */
static pid_t test_pids[64]; /* of the current run, for tests that kill a rank */

static int test_run_ranks(int n, const test_ranks_params *tp, test_rank_fn fn, void *arg, double limit_s) {
    int fds[64][2];
    pid_t *pids = test_pids;
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        if (pipe(fds[r])) return n;
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[r][0]);
            test_passed = test_failed = 0;
            pdde_context *ctx;
            pdde_context_init(NULL, &ctx);
            pdde_comm *comm = NULL;
            pdde_store *store = NULL;
            if (!tp->no_comm) {
                pdde_status st = pdde_store_connect(ctx, tp->addr, 10, &store);
                pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
                p.store = store; p.rank = r; p.world_size = n; p.prefix = tp->prefix;
                p.timeout_s = tp->timeout_s; p.peer_timeout_s = tp->peer_timeout_s;
                if (!st) st = pdde_comm_init(ctx, &p, &comm);
                CHECK(st == PDDE_OK, "rank %d: comm init: %s", r, pdde_last_error(ctx));
            }
            if (tp->no_comm || comm) fn(ctx, comm, arg);
            pdde_comm_free(comm);
            pdde_store_free(store);
            pdde_context_free(ctx);
            char buf[64];
            int len = snprintf(buf, sizeof buf, "%d %d\n", test_passed, test_failed);
            if (write(fds[r][1], buf, (size_t)len) != len) _exit(3);
            fflush(NULL);
            _exit(0);
        }
        close(fds[r][1]);
    }
    int bad = 0;
    double deadline = test_now() + limit_s;
    for (int r = 0; r < n; r++) {
        int status = 0;
        pid_t got;
        while ((got = waitpid(pids[r], &status, WNOHANG)) == 0 && test_now() < deadline) usleep(2000);
        if (got == 0) {
            fprintf(stderr, "FAIL: rank %d did not finish within %.0f s: killed\n", r, limit_s);
            for (int k = 0; k < n; k++) kill(pids[k], SIGKILL);
            waitpid(pids[r], &status, 0);
        }
        char buf[64] = {0};
        ssize_t len = read(fds[r][0], buf, sizeof buf - 1);
        close(fds[r][0]);
        int p = 0, f = 0;
        if (len > 0 && sscanf(buf, "%d %d", &p, &f) == 2) { test_passed += p; test_failed += f; }
        if ((!WIFEXITED(status) || WEXITSTATUS(status)) && !(tp->killed_ok >> r & 1)) {
            bad++;
            test_failed++;
            fprintf(stderr, "FAIL: rank %d exited badly (status 0x%x)\n", r, status);
        }
    }
    return bad;
}
#endif
