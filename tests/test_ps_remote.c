/* test_ps_remote — several threads of a worker process pulling and pushing through one client of
 * parameter servers in other processes (real processes around a TCP store this test hosts on
 * 127.0.0.1), the servers serving with several threads: async, sync and geo jobs of 2 workers x 4
 * threads end with the table of the closed form, every pull of a thread's own rows reads exactly its
 * pushes so far and no pull reads a torn row; with a fast and a slow worker every pull is within the
 * staleness bound of the puller's acknowledged pushes; pulls beside sync rounds read whole rounds; a
 * worker stopped in the middle of its push holds one server thread while another worker's calls go
 * through; a thread's push goes through while another thread's pull waits on the staleness bound;
 * threads pulling 6000 and 800 ids at once from 2 servers all get their rows; and a server SIGKILLed
 * while 4 threads push fails every thread within the peer timeout with an error that names the server
 * and the request, its checkpoint holding every acknowledged push. */
#define _GNU_SOURCE
#include "pdde.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const pdde_store_server *g_server;
static char g_addr[64], g_dir[256];

static test_ranks_params ranks_params(void) {
    /* (a short timeout: a reply that goes to the wrong thread leaves its own waiting, and fails here) */
    test_ranks_params tp = test_ranks_served(g_server, g_addr, "psr", 20);
    if (getenv("PDDE_TEST_SLOW")) tp.timeout_s = 120, tp.peer_timeout_s = 10; /* (under a sanitizer: 5-15x slower) */
    return tp;
}

/* SGD with lr 1/4 on rows that start at zero, gradients (c + 1) in column c: every row is
 * -(c + 1) x lr x (its pushes) exactly, so the closed form is exact and a torn row shows. */
#define DIM 4
#define LR 0.25f
#define THREADS 4
#define WORKERS 2
#define STEPS 150
#define SHARED 8
#define OWN 4
#define STALENESS 2

static pdde_ps_params job_params(pdde_ps_mode mode) {
    pdde_ps_params p = PDDE_PS_PARAMS_INIT;
    p.mode = mode, p.staleness = STALENESS, p.server_threads = 4; /* (servers serve requests at once unless a case says otherwise) */
    p.table.dim = DIM, p.table.optimizer = PDDE_PS_SGD, p.table.lr = LR, p.table.init_std = 0;
    return p;
}

static uint64_t own_id(int g, int k) { return 1000 + (uint64_t)g * 16 + (uint64_t)k; }

/* The pushes a row holds (its column 0 / -lr), or -1 when the row is not -(c + 1) lr k for one whole k
 * (torn, or another row's). scale: sync's 1/workers. */
static double row_pushes(const float *row, double scale) {
    double k = -row[0] / (LR * scale);
    if (!(k >= 0) || k != floor(k)) return -1;
    for (int c = 1; c < DIM; c++)
        if (row[c] != (float)(-(c + 1) * LR * scale * k)) return -1;
    return k;
}

typedef struct {
    pdde_ps_client *c;
    pdde_context *ctx;
    int g;                  /* the thread, over all workers */
    double scale;
    int bad_own, bad_shared, steps_done;
    int64_t first_bad_own_got, first_bad_own_want;
    char err[256];
} worker_thread;

static void *worker_loop(void *arg) {
    worker_thread *t = arg;
    uint64_t ids[OWN + SHARED];
    float rows[(OWN + SHARED) * DIM], grads[(OWN + SHARED) * DIM], last_shared[SHARED];
    for (int k = 0; k < OWN; k++) ids[k] = own_id(t->g, k);
    for (int k = 0; k < SHARED; k++) ids[OWN + k] = 1 + (uint64_t)k, last_shared[k] = 0;
    for (int i = 0; i < OWN + SHARED; i++)
        for (int c = 0; c < DIM; c++) grads[i * DIM + c] = (float)(c + 1);
    pdde_status st = PDDE_OK;
    for (int step = 0; step < STEPS && !st; step++) {
        /* the ids in another order each step (own and shared mixed), so rows land in other places */
        uint64_t order[OWN + SHARED];
        int perm[OWN + SHARED];
        for (int i = 0; i < OWN + SHARED; i++) perm[i] = (i * 5 + step) % (OWN + SHARED), order[i] = ids[perm[i]];
        st = pdde_ps_client_pull(t->c, OWN + SHARED, order, rows);
        for (int i = 0; i < OWN + SHARED && !st; i++) {
            int k = perm[i];
            double got = row_pushes(rows + i * DIM, t->scale);
            if (k < OWN) { /* only this thread pushes it: exactly its pushes so far */
                if (got != step && !t->bad_own++) t->first_bad_own_got = (int64_t)got, t->first_bad_own_want = step;
            } else { /* whole, at least this thread's pushes, never going back */
                int j = k - OWN;
                if (got < 0 || got < step || got < last_shared[j]) t->bad_shared++;
                if (got > last_shared[j]) last_shared[j] = (float)got;
            }
        }
        if (!st) st = pdde_ps_client_push(t->c, OWN + SHARED, order, grads);
        if (!st) t->steps_done++;
    }
    if (st) snprintf(t->err, sizeof t->err, "%s", pdde_last_error(t->ctx));
    return NULL;
}

typedef struct {
    int64_t pushes, max_staleness;
    int table_ok, bad_rows, ok;
} job_result;

typedef struct { pdde_ps_mode mode; int server_threads; } job_kind;
#define GEO_STEPS 3 /* (geo: an exchange every 3 pushes of a worker's threads) */
static const char *mode_name(pdde_ps_mode mode) { return mode == PDDE_PS_SYNC ? "sync" : mode == PDDE_PS_ASYNC ? "async" : "geo"; }

/* Rank 0 serves (with server_threads threads); ranks 1..WORKERS run THREADS threads on one client each. */
static void job_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    job_kind kind = *(job_kind *)arg;
    pdde_ps_mode mode = kind.mode;
    pdde_ps_params p = job_params(mode);
    p.server_threads = kind.server_threads, p.geo_steps = GEO_STEPS;
    int rank = pdde_comm_rank(world);
    double scale = mode == PDDE_PS_SYNC ? 1.0 / WORKERS : 1.0;
    const char *name = mode_name(mode);
    if (rank == 0) {
        job_result *out = test_rank_result;
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        CHECK(st == PDDE_OK, "%s server: %s", name, pdde_last_error(ctx));
        if (st) { pdde_ps_server_free(srv); return; }
        pdde_ps_server_stats ss;
        pdde_ps_server_stats_get(srv, &ss);
        out->pushes = ss.pushes, out->max_staleness = ss.max_staleness, out->ok = 1;
        /* the closed form: a thread's own rows hold its STEPS pushes, the shared rows every thread's */
        pdde_ps_table *t = pdde_ps_server_table(srv);
        float row[DIM];
        for (int g = 0; g < WORKERS * THREADS; g++)
            for (int k = 0; k < OWN; k++)
                if (pdde_ps_table_get(t, own_id(g, k), row) || row_pushes(row, scale) != STEPS) out->bad_rows++;
        /* sync: a round's push is the mean over the workers of W x THREADS x STEPS / W pushes */
        for (int k = 0; k < SHARED; k++)
            if (pdde_ps_table_get(t, 1 + (uint64_t)k, row) || row_pushes(row, scale) != (double)WORKERS * THREADS * STEPS) out->bad_rows++;
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    CHECK(st == PDDE_OK, "%s client: %s", name, pdde_last_error(ctx));
    if (st) return;
    worker_thread t[THREADS];
    pthread_t th[THREADS];
    memset(t, 0, sizeof t);
    for (int i = 0; i < THREADS; i++) {
        t[i].c = c, t[i].ctx = ctx, t[i].g = (rank - 1) * THREADS + i, t[i].scale = scale;
        pthread_create(&th[i], NULL, worker_loop, &t[i]);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK(t[i].steps_done == STEPS, "%s worker %d thread %d: %d of %d steps (%s)", name, rank, i, t[i].steps_done, STEPS, t[i].err);
        CHECK(t[i].bad_own == 0, "%s worker %d thread %d: %d pulls of its own rows did not read exactly its pushes (first: %lld, "
              "expected %lld)", name, rank, i, t[i].bad_own, (long long)t[i].first_bad_own_got, (long long)t[i].first_bad_own_want);
        CHECK(t[i].bad_shared == 0, "%s worker %d thread %d: %d shared rows torn, behind its own pushes or going back", name, rank, i,
              t[i].bad_shared);
    }
    pdde_ps_client_free(c);
}

static void test_job(pdde_ps_mode mode, int server_threads) {
    job_kind kind = {mode, server_threads};
    job_result res[1 + WORKERS];
    double t0 = test_now();
    test_run_ranks_into(1 + WORKERS, ranks_params(), res, sizeof *res, job_rank, &kind, 90);
    const char *name = mode_name(mode);
    /* (geo: the server counts a worker's exchanges, one every GEO_STEPS pushes and the last at its goodbye) */
    int64_t want = mode == PDDE_PS_GEO ? (int64_t)WORKERS * (THREADS * STEPS / GEO_STEPS + 1) : (int64_t)WORKERS * THREADS * STEPS;
    CHECK(res[0].ok && res[0].pushes == want, "%s, %d server threads: %d workers x %d threads: every push served (%lld of %lld)", name,
          server_threads, WORKERS, THREADS, (long long)res[0].pushes, (long long)want);
    CHECK(res[0].ok && res[0].bad_rows == 0, "%s, %d server threads: the table equals the closed form (%d rows differ)", name,
          server_threads, res[0].bad_rows);
    if (mode == PDDE_PS_ASYNC)
        CHECK(res[0].ok && res[0].max_staleness <= STALENESS, "async, %d server threads: staleness %lld <= bound %d with %d threads a worker",
              server_threads, (long long)res[0].max_staleness, STALENESS, THREADS);
    printf("%s job, %d server threads: %d workers x %d threads x %d steps in %.2f s\n", name, server_threads, WORKERS, THREADS, STEPS,
           test_now() - t0);
}

/* ------------------------------------------------------------------------------------------------
 * The staleness bound with the server's threads serving at once: a fast worker and a slow one (a
 * pause a step), THREADS threads each, staleness BOUND_K. Every thread pushes its own row and its
 * worker's row each step; a pull of the other worker's row must show at least (the pushes this worker
 * had acknowledged before the pull) - BOUND_K of it: the server answers a pull only once the slowest
 * worker is within the bound, and only after the push that brought it there is in the table. */

#define BOUND_K 2
#define BOUND_STEPS 40
#define BOUND_SLOW_US 3000
static uint64_t worker_row(int worker) { return 500 + (uint64_t)worker; }

typedef struct {
    pdde_ps_client *c;
    pdde_context *ctx;
    int worker, i, slow, steps_done, behind, bad_own;
    _Atomic int64_t *acked;  /* this worker's pushes acknowledged so far (its threads') */
    int64_t worst_gap;       /* the largest (acknowledged before the pull - the other worker's pushes seen) */
    char err[256];
} bound_thread;

static void *bound_loop(void *arg) {
    bound_thread *t = arg;
    int g = (t->worker - 1) * THREADS + t->i;
    uint64_t ids[3] = {own_id(g, 0), worker_row(t->worker), worker_row(3 - t->worker)};
    float rows[3 * DIM], grads[2 * DIM];
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < DIM; c++) grads[k * DIM + c] = (float)(c + 1);
    pdde_status st = PDDE_OK;
    t->worst_gap = INT64_MIN;
    for (int step = 0; step < BOUND_STEPS && !st; step++) {
        int64_t acked = atomic_load(t->acked);
        st = pdde_ps_client_pull(t->c, 3, ids, rows);
        if (!st) {
            double own = row_pushes(rows, 1.0), other = row_pushes(rows + 2 * DIM, 1.0);
            if (own != step) t->bad_own++;
            if (other < 0 || acked - (int64_t)other > BOUND_K) t->behind++;
            if (other >= 0 && acked - (int64_t)other > t->worst_gap) t->worst_gap = acked - (int64_t)other;
        }
        if (!st) st = pdde_ps_client_push(t->c, 2, ids, grads); /* (its own row and its worker's) */
        if (!st) atomic_fetch_add(t->acked, 1), t->steps_done++;
        if (t->slow) usleep(BOUND_SLOW_US);
    }
    if (st) snprintf(t->err, sizeof t->err, "%s", pdde_last_error(t->ctx));
    return NULL;
}

typedef struct { int64_t max_staleness, deferred, worker_rows[2]; int ok; } bound_result;

static void bound_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = job_params(PDDE_PS_ASYNC);
    p.staleness = BOUND_K, p.server_threads = 8;
    int rank = pdde_comm_rank(world);
    if (rank == 0) {
        bound_result *out = test_rank_result;
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        CHECK(st == PDDE_OK, "bound: server: %s", pdde_last_error(ctx));
        if (!st) {
            pdde_ps_server_stats ss;
            pdde_ps_server_stats_get(srv, &ss);
            float row[DIM];
            for (int k = 0; k < 2; k++)
                out->worker_rows[k] = pdde_ps_table_get(pdde_ps_server_table(srv), worker_row(1 + k), row) ? -1 : (int64_t)row_pushes(row, 1.0);
            out->max_staleness = ss.max_staleness, out->deferred = ss.deferred_pulls, out->ok = 1;
        }
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    CHECK(st == PDDE_OK, "bound: client: %s", pdde_last_error(ctx));
    if (st) return;
    _Atomic int64_t acked;
    atomic_init(&acked, 0);
    bound_thread t[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        t[i] = (bound_thread){.c = c, .ctx = ctx, .worker = rank, .i = i, .slow = rank == 2, .acked = &acked};
        pthread_create(&th[i], NULL, bound_loop, &t[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(t[i].steps_done == BOUND_STEPS && !t[i].bad_own && !t[i].behind,
              "bound: %s worker thread %d: %d of %d steps, %d pulls of its own row not exactly its pushes, %d pulls of the other "
              "worker's row more than %d behind this worker's acknowledged pushes (worst %lld) (%s)", rank == 2 ? "slow" : "fast", i,
              t[i].steps_done, BOUND_STEPS, t[i].bad_own, t[i].behind, BOUND_K, (long long)t[i].worst_gap, t[i].err);
    }
    pdde_ps_client_free(c);
}

static void test_bound_under_load(void) {
    bound_result res[3];
    double t0 = test_now();
    test_run_ranks_into(3, ranks_params(), res, sizeof *res, bound_rank, NULL, 90);
    bound_result *r = &res[0];
    CHECK(r->ok && r->max_staleness <= BOUND_K, "bound: 8 server threads served no pull more than %d ahead (%lld)", BOUND_K,
          (long long)r->max_staleness);
    CHECK(r->ok && r->deferred > 0, "bound: the fast worker's pulls were held back (%lld)", (long long)r->deferred);
    CHECK(r->ok && r->worker_rows[0] == THREADS * BOUND_STEPS && r->worker_rows[1] == THREADS * BOUND_STEPS,
          "bound: each worker's row holds its %d pushes exactly (%lld, %lld)", THREADS * BOUND_STEPS, (long long)r->worker_rows[0],
          (long long)r->worker_rows[1]);
    printf("bound: fast and slow worker x %d threads, staleness %d: %lld pulls held back, largest staleness served %lld, %.2f s\n", THREADS,
           BOUND_K, (long long)r->deferred, (long long)r->max_staleness, test_now() - t0);
}

/* ------------------------------------------------------------------------------------------------
 * Sync rounds are whole to a pull: in each worker one thread pushes ROUND_ROWS rows a step (the same
 * gradient on both workers, so a round adds one (c + 1) to every row) while its other threads pull
 * them all, over and over; with 8 server threads, every pull reads every row at one count of rounds
 * (never some rows of a round and not others), and the counts never go back. */

#define ROUND_ROWS 4096
#define ROUND_STEPS 40
typedef struct {
    pdde_ps_client *c;
    pdde_context *ctx;
    int pusher;
    _Atomic int *pushing;   /* the worker's pusher has steps left */
    int done, pulls, mixed, back;
    char err[256];
} round_thread;

static void *round_loop(void *arg) {
    round_thread *t = arg;
    uint64_t *ids = malloc(ROUND_ROWS * sizeof *ids);
    float *rows = malloc((size_t)ROUND_ROWS * DIM * sizeof *rows);
    for (int k = 0; k < ROUND_ROWS; k++) ids[k] = 20000 + (uint64_t)k;
    pdde_status st = PDDE_OK;
    if (t->pusher) {
        for (int k = 0; k < ROUND_ROWS; k++)
            for (int c = 0; c < DIM; c++) rows[(size_t)k * DIM + c] = (float)(c + 1);
        for (int step = 0; step < ROUND_STEPS && !st; step++)
            if (!(st = pdde_ps_client_push(t->c, ROUND_ROWS, ids, rows))) t->done++;
        atomic_store(t->pushing, 0);
    } else {
        double last = 0;
        while (!st && atomic_load(t->pushing)) {
            if ((st = pdde_ps_client_pull(t->c, ROUND_ROWS, ids, rows))) break;
            double first = row_pushes(rows, 1.0);
            int mixed = first < 0;
            for (int k = 1; k < ROUND_ROWS && !mixed; k++) mixed = row_pushes(rows + (size_t)k * DIM, 1.0) != first;
            t->mixed += mixed, t->back += first < last, t->pulls++;
            if (first > last) last = first;
        }
    }
    if (st) snprintf(t->err, sizeof t->err, "%s", pdde_last_error(t->ctx));
    free(ids), free(rows);
    return NULL;
}

typedef struct { int64_t rounds; int ok; } round_result;

static void round_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = job_params(PDDE_PS_SYNC);
    p.server_threads = 8;
    int rank = pdde_comm_rank(world);
    if (rank == 0) {
        round_result *out = test_rank_result;
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        CHECK(st == PDDE_OK, "whole rounds: server: %s", pdde_last_error(ctx));
        float row[DIM];
        out->rounds = -1;
        for (int k = 0; k < ROUND_ROWS && !st; k++) { /* (every row: the closed form, or -2) */
            double got = pdde_ps_table_get(pdde_ps_server_table(srv), 20000 + (uint64_t)k, row) ? -1 : row_pushes(row, 1.0);
            if (k == 0) out->rounds = (int64_t)got;
            else if (got != out->rounds) out->rounds = -2;
        }
        out->ok = !st;
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    CHECK(st == PDDE_OK, "whole rounds: client: %s", pdde_last_error(ctx));
    if (st) return;
    _Atomic int pushing;
    atomic_init(&pushing, 1);
    round_thread t[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        t[i] = (round_thread){.c = c, .ctx = ctx, .pusher = i == 0, .pushing = &pushing};
        pthread_create(&th[i], NULL, round_loop, &t[i]);
    }
    int pulls = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        pulls += t[i].pulls;
        CHECK(t[i].err[0] == 0 && (!t[i].pusher || t[i].done == ROUND_STEPS) && !t[i].mixed && !t[i].back,
              "whole rounds: worker %d thread %d: %d of %d pushes, %d of %d pulls read rows of different rounds, %d went back (%s)", rank,
              i, t[i].done, t[i].pusher ? ROUND_STEPS : 0, t[i].mixed, t[i].pulls, t[i].back, t[i].err);
    }
    printf("whole rounds: worker %d: %d pulls of %d rows beside %d sync rounds\n", rank, pulls, ROUND_ROWS, ROUND_STEPS);
    pdde_ps_client_free(c);
}

static void test_whole_rounds(void) {
    round_result res[3];
    test_run_ranks_into(3, ranks_params(), res, sizeof *res, round_rank, NULL, 90);
    CHECK(res[0].ok && res[0].rounds == ROUND_STEPS, "whole rounds: every row holds the %d rounds (%lld)", ROUND_STEPS,
          (long long)res[0].rounds);
}

/* ------------------------------------------------------------------------------------------------
 * A worker stopped (SIGSTOP) in the middle of a push, its header and ids sent and its values not,
 * holds one server thread, not the server: another worker's pulls and pushes go through meanwhile;
 * once continued, its push completes. (One thread serving would wait on the stopped worker's values.) */

#define STOP_STEPS 50
typedef struct { int64_t rows[2]; int ok; } stop_server_result;
typedef struct { int stopped_seen, still_stopped, done; double s; int ok; } stop_result;

static char proc_state(pid_t pid) { /* the state letter of /proc/<pid>/stat ('T': stopped) */
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' ? paren[2] : '?';
}

static void stop_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = job_params(PDDE_PS_ASYNC);
    p.staleness = 1000, p.server_threads = 4;
    int rank = pdde_comm_rank(world);
    uint64_t id = own_id(rank, 0);
    float g[DIM] = {1, 2, 3, 4}, row[DIM];
    if (rank == 0) {
        stop_server_result *out = test_rank_result;
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        CHECK(st == PDDE_OK, "stopped worker: server: %s", pdde_last_error(ctx));
        for (int k = 0; k < 2 && !st; k++)
            out->rows[k] = pdde_ps_table_get(pdde_ps_server_table(srv), own_id(1 + k, 0), row) ? -1 : (int64_t)row_pushes(row, 1.0);
        out->ok = !st;
        pdde_ps_server_free(srv);
        return;
    }
    if (rank == 1) setenv("PDDE_TEST_PS_STOP_AT_PUSH", "3", 1); /* (this process only: the ranks are forked) */
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    unsetenv("PDDE_TEST_PS_STOP_AT_PUSH");
    CHECK(st == PDDE_OK, "stopped worker: client: %s", pdde_last_error(ctx));
    if (st) return;
    if (rank == 1) { /* stops itself inside its third push; rank 2 continues it */
        for (int k = 0; k < 3 && !st; k++) st = pdde_ps_client_push(c, 1, &id, g);
        CHECK(st == PDDE_OK, "stopped worker: its pushes, stopped and continued: %s", pdde_last_error(ctx));
        pdde_ps_client_free(c);
        return;
    }
    stop_result *out = test_rank_result;
    pid_t stopped = test_pids[1]; /* (forked before this rank) */
    double t0 = test_now();
    while (proc_state(stopped) != 'T' && test_now() - t0 < 20) usleep(1000);
    out->stopped_seen = proc_state(stopped) == 'T';
    t0 = test_now();
    for (int k = 0; k < STOP_STEPS && !st && out->stopped_seen; k++) {
        st = pdde_ps_client_pull(c, 1, &id, row);
        if (!st) st = pdde_ps_client_push(c, 1, &id, g);
        if (!st) out->done++;
    }
    out->s = test_now() - t0;
    out->still_stopped = proc_state(stopped) == 'T';
    kill(stopped, SIGCONT);
    CHECK(st == PDDE_OK, "stopped worker: the other worker's calls: %s", pdde_last_error(ctx));
    out->ok = 1;
    pdde_ps_client_free(c);
}

static void test_stopped_worker(void) {
    union { stop_server_result srv; stop_result w; } res[3];
    test_run_ranks_into(3, ranks_params(), res, sizeof *res, stop_rank, NULL, 60);
    stop_result *w = &res[2].w;
    CHECK(w->ok && w->stopped_seen, "stopped worker: worker 1 stopped itself inside its push");
    CHECK(w->ok && w->done == STOP_STEPS && w->still_stopped, "stopped worker: worker 2's %d pulls and pushes all went through while "
          "worker 1 stayed stopped mid-push (%d, %.3f s)", STOP_STEPS, w->done, w->s);
    CHECK(res[0].srv.ok && res[0].srv.rows[0] == 3 && res[0].srv.rows[1] == STOP_STEPS,
          "stopped worker: the stopped push was applied once continued (rows hold %lld of 3 and %lld of %d pushes)",
          (long long)res[0].srv.rows[0], (long long)res[0].srv.rows[1], STOP_STEPS);
    printf("stopped worker: another worker's %d pulls and pushes took %.3f s while it was stopped mid-push\n", w->done, w->s);
}

/* ------------------------------------------------------------------------------------------------
 * In flight at once: worker 1 runs ahead (one push) with staleness 0, so its next pull waits on the
 * server until worker 2 pushes (HOLD_S later); meanwhile another thread of worker 1 pushes, and its
 * push must not wait behind that pull. */

#define HOLD_S 1.5
typedef struct { double pull_s, push_s; int ok; } overlap_result;
typedef struct { pdde_ps_client *c; pdde_context *ctx; double s; pdde_status st; char err[256]; } overlap_thread;

static void *overlap_pull(void *arg) {
    overlap_thread *t = arg;
    uint64_t id = 7;
    float row[DIM];
    double t0 = test_now();
    t->st = pdde_ps_client_pull(t->c, 1, &id, row);
    t->s = test_now() - t0;
    if (t->st) snprintf(t->err, sizeof t->err, "%s", pdde_last_error(t->ctx));
    return NULL;
}

static void overlap_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = job_params(PDDE_PS_ASYNC);
    p.staleness = 0;
    int rank = pdde_comm_rank(world);
    if (rank == 0) {
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        CHECK(st == PDDE_OK, "overlap server: %s", pdde_last_error(ctx));
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    uint64_t id = 7;
    float g[DIM] = {1, 2, 3, 4};
    if (rank == 2) { /* the slow worker: its push releases worker 1's pull */
        usleep((useconds_t)(HOLD_S * 1e6));
        if (!st) st = pdde_ps_client_push(c, 1, &id, g);
        CHECK(st == PDDE_OK, "overlap slow worker: %s", pdde_last_error(ctx));
        pdde_ps_client_free(c);
        return;
    }
    overlap_result *out = test_rank_result;
    if (!st) st = pdde_ps_client_push(c, 1, &id, g); /* one ahead */
    overlap_thread pt = {c, ctx, 0, 0, ""};
    pthread_t th;
    int pulling = !st && pthread_create(&th, NULL, overlap_pull, &pt) == 0;
    usleep(200000); /* the pull is at the server, held back */
    double t0 = test_now();
    if (!st) st = pdde_ps_client_push(c, 1, &id, g);
    out->push_s = test_now() - t0;
    CHECK(st == PDDE_OK, "overlap: push beside a held pull: %s", pdde_last_error(ctx));
    if (pulling) pthread_join(th, NULL);
    CHECK(pulling && pt.st == PDDE_OK, "overlap: the held pull: %s", pulling ? pt.err : "not started");
    out->pull_s = pt.s, out->ok = !st && !pt.st;
    pdde_ps_client_free(c);
}

static void test_overlap(void) {
    overlap_result res[3];
    test_run_ranks_into(3, ranks_params(), res, sizeof *res, overlap_rank, NULL, 60);
    CHECK(res[1].ok && res[1].pull_s > HOLD_S - 0.5, "overlap: the pull was held back by the staleness bound (%.3f s)", res[1].pull_s);
    CHECK(res[1].ok && res[1].push_s < 0.5 * (HOLD_S - 0.2), "overlap: another thread's push went through meanwhile (%.3f s, "
          "the pull held %.3f s)", res[1].push_s, res[1].pull_s);
    printf("overlap: a push took %.3f s beside a pull held %.3f s\n", res[1].push_s, res[1].pull_s);
}

/* ------------------------------------------------------------------------------------------------
 * Two servers, threads pulling batches of very different sizes: small requests go eagerly and large
 * replies by rendezvous, so a server that sent a reply to a thread not yet receiving it would wait on
 * that thread while the thread waits on the other server. Every pull must read its rows. */

#define MIX_THREADS 4
#define MIX_STEPS 40
typedef struct { pdde_ps_client *c; pdde_context *ctx; int i, done, bad; char err[256]; } mix_thread;

static void *mix_loop(void *arg) {
    mix_thread *t = arg;
    int n = t->i % 2 ? 800 : 6000; /* ids a pull: small and large */
    uint64_t *ids = malloc((size_t)n * sizeof *ids);
    float *rows = malloc((size_t)n * DIM * sizeof *rows);
    pdde_status st = PDDE_OK;
    for (int step = 0; step < MIX_STEPS && !st; step++) {
        for (int k = 0; k < n; k++) ids[k] = 100000 + (uint64_t)((k * 7 + step * 13 + t->i * 1000) % 20000);
        st = pdde_ps_client_pull(t->c, (size_t)n, ids, rows);
        for (int k = 0; k < n && !st; k++) t->bad += row_pushes(rows + (size_t)k * DIM, 1.0) != 0; /* (never pushed: zeros) */
        if (!st) t->done++;
    }
    if (st) snprintf(t->err, sizeof t->err, "%s", pdde_last_error(t->ctx));
    free(ids), free(rows);
    return NULL;
}

static void mix_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = job_params(PDDE_PS_ASYNC);
    p.n_servers = 2;
    int rank = pdde_comm_rank(world);
    if (rank < 2) {
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, rank, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        CHECK(st == PDDE_OK, "mixed sizes: server %d: %s", rank, pdde_last_error(ctx));
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    CHECK(st == PDDE_OK, "mixed sizes: client: %s", pdde_last_error(ctx));
    if (st) return;
    mix_thread t[MIX_THREADS];
    pthread_t th[MIX_THREADS];
    for (int i = 0; i < MIX_THREADS; i++) {
        t[i] = (mix_thread){c, ctx, i, 0, 0, ""};
        pthread_create(&th[i], NULL, mix_loop, &t[i]);
    }
    for (int i = 0; i < MIX_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(t[i].done == MIX_STEPS && !t[i].bad, "mixed sizes: worker %d thread %d: %d of %d pulls, %d rows not zero (%s)", rank, i,
              t[i].done, MIX_STEPS, t[i].bad, t[i].err);
    }
    pdde_ps_client_free(c);
}

static void test_mixed_sizes(void) {
    test_ranks_params tp = ranks_params();
    double t0 = test_now();
    test_run_ranks(4, &tp, mix_rank, NULL, 90);
    printf("mixed sizes: 2 servers, 2 workers x %d threads x %d pulls (6000 and 800 ids) in %.2f s\n", MIX_THREADS, MIX_STEPS, test_now() - t0);
}

/* ------------------------------------------------------------------------------------------------
 * A server SIGKILLed while 4 threads push: every thread fails (no hang) within the peer timeout, naming
 * the server and the request, and the server's checkpoint (written before each acknowledgement) holds
 * every push a thread saw acknowledged and at most the one it had in flight besides. */

#define KILL_AFTER_S 0.4
typedef struct { int64_t acked[THREADS]; int failed[THREADS], named[THREADS]; double fail_s; int ok; } kill_result;
typedef struct { pdde_ps_client *c; pdde_context *ctx; int i; int64_t acked; int failed, named; double end; } kill_thread;

static void *kill_loop(void *arg) {
    kill_thread *t = arg;
    uint64_t id = own_id(t->i, 0);
    float g[DIM] = {1, 2, 3, 4}, row[DIM];
    pdde_status st = PDDE_OK;
    for (int64_t k = 0; !st && k < 1000000; k++) {
        st = k % 4 == 3 ? pdde_ps_client_pull(t->c, 1, &id, row) : pdde_ps_client_push(t->c, 1, &id, g);
        if (!st && k % 4 != 3) t->acked++;
    }
    t->end = test_now();
    t->failed = st != PDDE_OK;
    const char *e = pdde_last_error(t->ctx);
    t->named = st && strstr(e, "server 0") && (strstr(e, "push of") || strstr(e, "pull of")) && strstr(e, "request");
    if (st && !t->named) fprintf(stderr, "kill: thread %d's error: %s\n", t->i, e);
    return NULL;
}

static void kill_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = job_params(PDDE_PS_ASYNC);
    p.staleness = 1000, p.checkpoint_dir = g_dir, p.checkpoint_every = 1;
    if (pdde_comm_rank(world) == 0) {
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world); /* (killed in there) */
        pdde_ps_server_free(srv);
        return;
    }
    kill_result *out = test_rank_result;
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    CHECK(st == PDDE_OK, "kill: client: %s", pdde_last_error(ctx));
    if (st) return;
    kill_thread t[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        t[i] = (kill_thread){c, ctx, i, 0, 0, 0, 0};
        pthread_create(&th[i], NULL, kill_loop, &t[i]);
    }
    usleep((useconds_t)(KILL_AFTER_S * 1e6));
    double killed = test_now();
    kill(test_pids[0], SIGKILL); /* (the server rank, forked before this one) */
    double last = killed;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        out->acked[i] = t[i].acked, out->failed[i] = t[i].failed, out->named[i] = t[i].named;
        if (t[i].end > last) last = t[i].end;
    }
    out->fail_s = last - killed, out->ok = 1;
    pdde_ps_client_free(c);
}

static void test_server_killed(pdde_context *ctx) {
    kill_result res[2];
    test_ranks_params tp = ranks_params();
    tp.killed_ok = 1;
    test_run_ranks_into(2, tp, res, sizeof *res, kill_rank, NULL, 60);
    kill_result *r = &res[1];
    CHECK(r->ok, "kill: the worker finished");
    if (!r->ok) return;
    CHECK(r->fail_s < 2 * tp.peer_timeout_s + 2, "kill: every thread returned within %.1f s of the kill (%.2f s)",
          2 * tp.peer_timeout_s + 2, r->fail_s);
    pdde_ps_params p = job_params(PDDE_PS_ASYNC);
    pdde_ps_table *t = NULL;
    char path[512];
    pdde_ps_shard_path(path, sizeof path, g_dir, 0, 1);
    pdde_status st = pdde_ps_table_init(ctx, &p.table, &t);
    if (!st) st = pdde_ps_table_load(t, path);
    CHECK(st == PDDE_OK, "kill: the server's checkpoint loads: %s", pdde_last_error(ctx));
    int64_t total = 0;
    for (int i = 0; i < THREADS && !st; i++) {
        float row[DIM];
        pdde_ps_table_get(t, own_id(i, 0), row);
        double applied = row_pushes(row, 1.0);
        total += r->acked[i];
        CHECK(r->failed[i] && r->named[i], "kill: thread %d failed with an error naming the server and the request", i);
        CHECK(applied >= (double)r->acked[i] && applied <= (double)r->acked[i] + 1,
              "kill: thread %d: the checkpoint holds its %lld acknowledged pushes, and at most the one in flight (%.0f)", i,
              (long long)r->acked[i], applied);
    }
    CHECK(total >= THREADS, "kill: the threads pushed before the kill (%lld acknowledged)", (long long)total);
    printf("server killed: %lld pushes acknowledged by %d threads before; every thread failed %.2f s after the kill\n", (long long)total,
           THREADS, r->fail_s);
    pdde_ps_table_free(t);
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    cp.n_threads = 1;
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    unsetenv("PDDE_PS_LANES"), unsetenv("PDDE_PS_SERVER_THREADS"); /* (the test is of requests in flight at once) */
    snprintf(g_dir, sizeof g_dir, "/tmp/pdde_test_ps_remote_%d", (int)getpid());
    mkdir(g_dir, 0700);
    pdde_store_server *srv = NULL;
    /* PDDE_TEST_STORE_PROCESS=1: the store in a process of its own, so this one forks the ranks with no
     * thread running (ThreadSanitizer cannot follow a fork of a process with threads) */
    pid_t store_pid = -1;
    int store_port = 0;
    if (getenv("PDDE_TEST_STORE_PROCESS")) {
        int fd[2];
        char secret[128];
        if (pipe(fd) || pdde_job_secret_generate(ctx, secret, sizeof secret)) return 1;
        setenv("PDDE_JOB_SECRET", secret, 1); /* (the store and the ranks share it) */
        if ((store_pid = fork()) == 0) {
            close(fd[0]);
            int port = pdde_store_server_init(ctx, "127.0.0.1:0", &srv) == PDDE_OK ? pdde_store_server_port(srv) : 0;
            if (write(fd[1], &port, sizeof port) != sizeof port || !port) _exit(1);
            pause(); /* (killed when the test ends) */
            _exit(0);
        }
        close(fd[1]);
        if (read(fd[0], &store_port, sizeof store_port) != sizeof store_port) store_port = 0;
        close(fd[0]);
    } else if (pdde_store_server_init(ctx, "127.0.0.1:0", &srv) == PDDE_OK) store_port = pdde_store_server_port(srv);
    if (store_port) {
        g_server = srv;
        snprintf(g_addr, sizeof g_addr, "127.0.0.1:%d", store_port);
        test_job(PDDE_PS_ASYNC, 8);
        test_job(PDDE_PS_SYNC, 8);
        test_job(PDDE_PS_ASYNC, 1); /* (one request at a time, as PDDE_PS_SERVER_THREADS=1 gives) */
        test_job(PDDE_PS_GEO, 8);
        test_bound_under_load();
        test_whole_rounds();
        test_stopped_worker();
        test_overlap();
        test_mixed_sizes();
        test_server_killed(ctx);
    } else CHECK(0, "store server: %s", pdde_last_error(ctx));
    pdde_store_server_free(srv);
    if (store_pid > 0) kill(store_pid, SIGKILL), waitpid(store_pid, NULL, 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {}
    pdde_context_free(ctx);
    return test_finish();
}
