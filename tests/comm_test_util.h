/* comm_test_util.h — runs a function as N rank processes (fork) around a store server in the parent
 * (test_store_serve) or in a process of its own (test_store_process), sums the ranks' CHECK counts into the parent's and hands each rank's result back
 * (test_session_hash: a rank's parameters in a few bytes). Include after test_util.h. */
#ifndef PDDE_COMM_TEST_UTIL_H
#define PDDE_COMM_TEST_UTIL_H
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef void (*test_rank_fn)(pdde_context *ctx, pdde_comm *comm, void *arg);

typedef struct {
    const char *addr;       /* the store, "127.0.0.1:port" */
    const char *prefix;     /* one per run, so the keys of several runs do not meet */
    double timeout_s, peer_timeout_s;
    double init_timeout_s;  /* forming the world (0: timeout_s) */
    int no_comm;            /* 1: fn gets comm = NULL and makes its own */
    unsigned killed_ok;     /* bit r: rank r is meant to die (the test kills it) */
    int n_threads;          /* each rank's context (0: the default) */
    uint64_t seed;          /* each rank's context seed (initial parameters; 0: the default) */
    int device_runtimes;    /* 1: the ranks may start device runtimes (PDDE_BACKENDS unset in them) */
    void *results;          /* n * result_size bytes: rank r's test_rank_result lands at r * result_size */
    size_t result_size;     /* at most PIPE_BUF - 8 (one atomic pipe write) */
    const pdde_store_server *server; /* the store served from this process (NULL: elsewhere) */
    int hosts;              /* > 1: the ranks as that many hosts, rank r on host r / (n / hosts) (their host ids) */
} test_ranks_params;

/* Serves the store the ranks meet at from this process, on a free port of 127.0.0.1, and writes its
 * address ("127.0.0.1:port") into addr. NULL, the reason in pdde_last_error(ctx), when it cannot. */
static inline pdde_store_server *test_store_serve(pdde_context *ctx, char *addr, size_t addr_cap) {
    pdde_store_server *srv;
    if (pdde_store_server_init(ctx, "127.0.0.1:0", &srv) != PDDE_OK) return NULL;
    snprintf(addr, addr_cap, "127.0.0.1:%d", pdde_store_server_port(srv));
    return srv;
}

/* Waits (up to max_s) until every other thread of this process sleeps, before a fork. A thread running
 * at the fork may hold a lock of the sanitizers' allocators, which have no fork handlers: the child
 * inherits it held and hangs at its first malloc. Seen with PoCL's worker threads still freeing a
 * finished command's memory. Returns 0 when they all sleep, 1 at max_s. */
static inline int test_threads_quiet(double max_s) {
    long self = syscall(SYS_gettid);
    for (double until = test_now() + max_s;; usleep(500)) {
        int busy = 0;
        DIR *d = opendir("/proc/self/task");
        for (struct dirent *e; d && !busy && (e = readdir(d));) {
            if (e->d_name[0] == '.' || atol(e->d_name) == self) continue;
            char path[288], st[512]; /* (d_name: up to 255 bytes) */
            snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
            FILE *f = fopen(path, "r");
            size_t n = f ? fread(st, 1, sizeof st - 1, f) : 0;
            if (f) fclose(f);
            st[n] = 0;
            const char *state = strrchr(st, ')'); /* (the thread's name may hold spaces and parentheses) */
            busy = state && state[1] == ' ' && state[2] != 'S';
        }
        if (d) closedir(d);
        if (!busy) return 0;
        if (test_now() > until) return 1;
    }
}

/* Serves a store from a process of its own (the secret: the environment's or this process's), so that
 * a test can stop it (SIGSTOP: to its clients, as a store starved, or a host cut off from it: no reply,
 * no error) or kill it; *port: where it listens on 127.0.0.1 (0 when it did not start). The caller
 * kills it (SIGKILL) and reaps it. Fork it while no thread of this process allocates (see
 * test_run_ranks). */
static inline pid_t test_store_process(int *port) {
    int pp[2];
    *port = 0;
    if (pipe(pp)) return -1;
    test_threads_quiet(2);
    fflush(NULL);
    pid_t host = fork();
    if (host == 0) {
        pdde_store_server *srv;
        if (pdde_store_server_init(NULL, "127.0.0.1:0", &srv)) _exit(1);
        int p = pdde_store_server_port(srv);
        if (write(pp[1], &p, sizeof p) != sizeof p) _exit(1);
        for (;;) pause(); /* until the test kills it */
    }
    if (host < 0 || read(pp[0], port, sizeof *port) != sizeof *port) *port = 0;
    close(pp[0]), close(pp[1]);
    return host;
}

/* The ranks of one run around the store this process serves (server, at addr): their keys under a
 * prefix of their own (tag and a count of this process's runs; the next call reuses its buffer), one
 * thread a rank, timeout_s a call, a peer lost after 2 s of silence. */
static inline test_ranks_params test_ranks_served(const pdde_store_server *server, const char *addr, const char *tag, double timeout_s) {
    static char prefix[32];
    static int runs;
    snprintf(prefix, sizeof prefix, "%s%d", tag, runs++);
    test_ranks_params tp = {0};
    tp.addr = addr, tp.prefix = prefix, tp.timeout_s = timeout_s, tp.peer_timeout_s = 2, tp.server = server, tp.n_threads = 1;
    return tp;
}

/* A rank's tensors as its session holds them (its parts), hashed (FNV-1a) into *hash, to compare ranks'
 * parameters bit for bit through a small result. PDDE_OK, or the read's error. */
static inline pdde_status test_session_hash(pdde_session *s, pdde_tensor *const *tensors, int n, uint64_t *hash) {
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < n; k++) {
        size_t bytes = pdde_tensor_nbytes(pdde_session_tensor(s, tensors[k]));
        unsigned char *buf = malloc(bytes);
        pdde_status st = buf ? pdde_session_read(s, tensors[k], buf, bytes) : PDDE_ERR_OOM;
        for (size_t i = 0; st == PDDE_OK && i < bytes; i++) h = (h ^ buf[i]) * 1099511628211ull;
        free(buf);
        if (st != PDDE_OK) return st;
    }
    *hash = h;
    return PDDE_OK;
}

/* In a rank: result_size zeroed bytes for the rank function to fill (NULL without results). */
static void *test_rank_result;
/* In a rank: its rank (for functions run with no_comm, which make their own communicator). */
static int test_rank_me;

/* Forks n ranks that connect to the store, init a world comm and run fn; waits for all of them (or
 * kills them after limit_s). No fork may race another thread of this process allocating (see
 * test_threads_quiet): the forks wait until the last run's clients are gone and the other threads sleep,
 * and the ranks start together after the last fork. Returns
 * the number of ranks that did not exit cleanly. */
static pid_t test_pids[64]; /* of the current run, for tests that kill a rank */

static inline int test_run_ranks(int n, const test_ranks_params *tp, test_rank_fn fn, void *arg, double limit_s) {
    int fds[64][2], gate[2];
    pid_t *pids = test_pids;
    if (pipe(gate)) return n;
    for (double until = test_now() + 10; tp->server && pdde_store_server_n_clients(tp->server) > 0 && test_now() < until;) usleep(1000);
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        if (pipe(fds[r])) return n;
        test_threads_quiet(2);
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[r][0]), close(gate[1]);
            char go;
            if (read(gate[0], &go, 1) != 0) _exit(5); /* EOF: every rank is forked */
            test_passed = test_failed = 0;
            test_rank_me = r;
            if (tp->device_runtimes) unsetenv("PDDE_BACKENDS");
            if (tp->result_size) test_rank_result = calloc(1, tp->result_size);
            pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
            cp.n_threads = tp->n_threads, cp.seed = tp->seed;
            if (!tp->device_runtimes) cp.backends = "cpu"; /* (a device runtime per rank only when asked) */
            pdde_context *ctx;
            pdde_context_init(&cp, &ctx);
            pdde_comm *comm = NULL;
            pdde_store *store = NULL;
            if (!tp->no_comm) {
                pdde_status st = pdde_store_connect(ctx, tp->addr, 10, &store);
                pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
                p.store = store; p.rank = r; p.world_size = n; p.prefix = tp->prefix;
                p.timeout_s = tp->timeout_s; p.peer_timeout_s = tp->peer_timeout_s; p.init_timeout_s = tp->init_timeout_s;
                char host[32];
                snprintf(host, sizeof host, "test-host-%d", r / (n / (tp->hosts > 1 ? tp->hosts : 1)));
                if (tp->hosts > 1) p.host_id = host;
                if (!st) st = pdde_comm_init(ctx, &p, &comm);
                CHECK(st == PDDE_OK, "rank %d: comm init: %s", r, pdde_last_error(ctx));
            }
            if (tp->no_comm || comm) fn(ctx, comm, arg);
            pdde_comm_free(comm);
            pdde_store_close(store);
            pdde_context_free(ctx);
            char buf[PIPE_BUF];
            int counts[2] = {test_passed, test_failed};
            memcpy(buf, counts, sizeof counts);
            if (tp->result_size) memcpy(buf + sizeof counts, test_rank_result, tp->result_size);
            size_t len = sizeof counts + tp->result_size;
            if (write(fds[r][1], buf, len) != (ssize_t)len) _exit(3);
            fflush(NULL);
            _exit(0);
        }
        close(fds[r][1]);
    }
    close(gate[0]), close(gate[1]); /* go */
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
        char buf[PIPE_BUF];
        int counts[2] = {0, 0};
        ssize_t len = read(fds[r][0], buf, sizeof buf);
        close(fds[r][0]);
        if (len == (ssize_t)(sizeof counts + tp->result_size)) {
            memcpy(counts, buf, sizeof counts);
            if (tp->result_size) memcpy((char *)tp->results + (size_t)r * tp->result_size, buf + sizeof counts, tp->result_size);
            test_passed += counts[0], test_failed += counts[1];
        }
        if ((!WIFEXITED(status) || WEXITSTATUS(status)) && !(tp->killed_ok >> r & 1)) {
            bad++;
            test_failed++;
            fprintf(stderr, "FAIL: rank %d exited badly (status 0x%x)\n", r, status);
        }
    }
    return bad;
}

/* test_run_ranks with rank r's result of result_size bytes at results + r x result_size (zeroed first). */
static inline int test_run_ranks_into(int n, test_ranks_params tp, void *results, size_t result_size, test_rank_fn fn, void *arg,
                                      double limit_s) {
    memset(results, 0, (size_t)n * result_size);
    tp.results = results, tp.result_size = result_size;
    return test_run_ranks(n, &tp, fn, arg, limit_s);
}
#endif
