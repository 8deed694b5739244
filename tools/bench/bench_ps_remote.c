/* bench_ps_remote — N threads in each of W worker processes pulling and pushing through one parameter-server
 * client a process, against servers in processes of their own (127.0.0.1, async mode), in one run:
 *   serial      the server serves one request at a time (server_threads 1: the server before it had threads)
 *   threads     the server serves with --server-threads threads at once (the default server)
 *   in-process  the same threads on an in-process client in each worker (comm NULL: no transport, no
 *               server), the ceiling a remote client can approach
 * The client keeps up to 8 requests in flight in both remote configurations. Each thread runs steps of
 * (pull B ids, push B gradients) over a vocabulary of V ids (dim 16, SGD); the rate is steps/s of all
 * threads of all workers (the workers start together); every figure is the median of R repeats, the
 * configurations interleaved repeat by repeat so that they see the same load.
 *
 *   bench_ps_remote [--ids B] [--vocab V] [--steps S] [--reps R] [--threads 1,2,4,8] [--workers W (1)]
 *                   [--servers N (1)] [--server-threads K (4)]
 * Last line: RESULT ps_remote t<N>_serial=<steps/s> t<N>_threads=<steps/s> t<N>_inproc=<steps/s> (each N)
 *   speedup_t<max>=<threads / serial> ceiling_t<max>=<threads / in-process> cpu_us_serial_t<max>= cpu_us_threads_t<max>=<the
 *   first worker process's CPU time a step, medians> load=<1-minute load average> */
#define _GNU_SOURCE
#include "pdde.h"
#include "tools/bench/bench_common.h"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define DIM 16
#define MAX_T 16
enum { SERIAL, THREADS, INPROC, N_KINDS };
static const char *const kind_name[N_KINDS] = {"serial", "threads", "inproc"};

static int g_ids = 512, g_vocab = 100000, g_steps = 200, g_reps = 5, g_threads[8] = {1, 2, 4, 8}, g_nthreads = 4, g_servers = 1,
           g_workers = 1, g_server_threads = 4;

typedef struct { pdde_ps_client *c; int t, steps; pdde_status st; } job;

static void *job_run(void *arg) {
    job *j = arg;
    uint64_t *ids = malloc((size_t)g_ids * sizeof *ids), x = 0x9e3779b97f4a7c15ull * (uint64_t)(j->t + 1);
    float *rows = malloc((size_t)g_ids * DIM * sizeof *rows), *grads = malloc((size_t)g_ids * DIM * sizeof *grads);
    for (int i = 0; i < g_ids * DIM; i++) grads[i] = 1e-3f * (float)(i % 7);
    for (int s = 0; s < j->steps && !j->st; s++) {
        for (int i = 0; i < g_ids; i++) { /* (distinct within a batch: a batch's unique ids) */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[i] = (x % (uint64_t)(g_vocab / g_ids)) * (uint64_t)g_ids + (uint64_t)i;
        }
        j->st = pdde_ps_client_pull(j->c, (size_t)g_ids, ids, rows);
        if (!j->st) j->st = pdde_ps_client_push(j->c, (size_t)g_ids, ids, grads);
    }
    free(ids), free(rows), free(grads);
    return NULL;
}

static double cpu_now(void) { /* this process's CPU time, all threads */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* steps/s of n threads on c; *cpu_us: the worker process's CPU time a step */
static double run_threads(pdde_ps_client *c, int n, pdde_context *ctx, double *cpu_us) {
    job j[MAX_T];
    pthread_t th[MAX_T];
    double t0 = bench_now(), c0 = cpu_now();
    for (int i = 0; i < n; i++) {
        j[i] = (job){c, i, g_steps, PDDE_OK};
        pthread_create(&th[i], NULL, job_run, &j[i]);
    }
    pdde_status st = PDDE_OK;
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL), st = st ? st : j[i].st;
    double s = bench_now() - t0;
    *cpu_us = (cpu_now() - c0) * 1e6 / ((double)n * g_steps);
    if (st) { fprintf(stderr, "bench_ps_remote: %s\n", pdde_last_error(ctx)); return -1; }
    return (double)n * g_steps / s;
}

static pdde_ps_params params(void) {
    pdde_ps_params p = PDDE_PS_PARAMS_INIT;
    p.mode = PDDE_PS_ASYNC, p.staleness = 1 << 30, p.n_servers = g_servers;
    p.table.dim = DIM, p.table.optimizer = PDDE_PS_SGD, p.table.lr = 0.01f, p.table.init_std = 0.01f;
    return p;
}

/* Ranks below g_servers serve one session per round of clients the workers make (a serial server and a
 * threaded one, as the schedule says); the workers measure, rank g_servers reports. */
static int rank_main(int rank, const char *addr, int pipe_fd) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 1;
    pdde_store *store;
    pdde_comm *world;
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    if (pdde_store_connect(ctx, addr, 10, &store)) { fprintf(stderr, "rank %d: %s\n", rank, pdde_last_error(ctx)); return 1; }
    p.store = store, p.rank = rank, p.world_size = g_servers + g_workers, p.prefix = "bench_ps_remote", p.timeout_s = 60;
    if (pdde_comm_init(ctx, &p, &world)) { fprintf(stderr, "rank %d: %s\n", rank, pdde_last_error(ctx)); return 1; }
    pdde_comm *workers = NULL; /* (the workers start each configuration together and add up their rates) */
    if (pdde_comm_split(world, rank < g_servers ? PDDE_COMM_NO_COLOR : 0, rank, &workers)) {
        fprintf(stderr, "rank %d: %s\n", rank, pdde_last_error(ctx));
        return 1;
    }
    pdde_ps_params pp = params();
    unsetenv("PDDE_PS_LANES"); /* (8 requests in flight) */
    int rc = 0;
    if (rank < g_servers) {
        pdde_ps_server *srv[2] = {NULL, NULL}; /* serial, threaded: each its own table (warmed by repeat 0) */
        pdde_status st = PDDE_OK;
        for (int k = 0; k < 2 && !st; k++) pp.server_threads = k == SERIAL ? 1 : g_server_threads, st = pdde_ps_server_init(ctx, &pp, rank, &srv[k]);
        for (int r = 0; r <= g_reps && !st; r++) /* the workers' schedule: a session a client round (their goodbyes end it) */
            for (int ti = 0; ti < g_nthreads && !st; ti++)
                for (int k = 0; k < 2 && !st; k++) st = pdde_ps_server_run(srv[k], world);
        if (st) fprintf(stderr, "bench_ps_remote server: %s\n", pdde_last_error(ctx)), rc = 1;
        pdde_ps_server_free(srv[0]), pdde_ps_server_free(srv[1]);
    } else {
        /* rate[kind][threads][rep]; repeat 0 is a warm-up (rows created, connections warm) */
        double rate[2][N_KINDS][8][16]; /* steps/s of all workers, then CPU us a step of this one */
        for (int r = 0; r <= g_reps && !rc; r++)
            for (int ti = 0; ti < g_nthreads && !rc; ti++)
                for (int k = 0; k < N_KINDS && !rc; k++) {
                    pdde_ps_client *c;
                    if (pdde_ps_client_init(ctx, k == INPROC ? NULL : world, &pp, &c) || pdde_comm_barrier(workers)) { rc = 1; break; }
                    double cpu, v = run_threads(c, g_threads[ti], ctx, &cpu);
                    pdde_ps_client_free(c);
                    float mine = (float)v, all = 0;
                    if (v < 0 || pdde_comm_allreduce(workers, &mine, &all, 1, PDDE_F32, PDDE_REDUCE_SUM)) rc = 1;
                    else if (r > 0) rate[0][k][ti][r - 1] = all, rate[1][k][ti][r - 1] = cpu;
                }
        if (rc) fprintf(stderr, "bench_ps_remote worker %d: %s\n", rank, pdde_last_error(ctx));
        if (!rc && rank == g_servers && write(pipe_fd, rate, sizeof rate) != (ssize_t)sizeof rate) rc = 1;
    }
    pdde_comm_free(workers);
    pdde_comm_free(world);
    pdde_store_close(store);
    pdde_context_free(ctx);
    return rc;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ids")) g_ids = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab")) g_vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) g_steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) g_reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--servers")) g_servers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--workers")) g_workers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--server-threads")) g_server_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) {
            g_nthreads = 0;
            for (char *s = argv[i + 1]; *s && g_nthreads < 8; s += strspn(s, ",")) g_threads[g_nthreads++] = (int)strtol(s, &s, 10);
        } else { fprintf(stderr, "bench_ps_remote: unknown option %s\n", argv[i]); return 2; }
    }
    if (g_ids < 1 || g_vocab < g_ids || g_steps < 1 || g_reps < 1 || g_reps > 16 || g_nthreads < 1 || g_servers < 1 || g_servers > 8 ||
        g_workers < 1 || g_workers > 8 || g_server_threads < 2 || g_server_threads > 64) {
        fprintf(stderr, "bench_ps_remote: --ids >= 1, --vocab >= ids, --steps >= 1, --reps in [1, 16], --threads a list, --servers in [1, 8], "
                        "--workers in [1, 8], --server-threads in [2, 64]\n");
        return 2;
    }
    for (int i = 0; i < g_nthreads; i++)
        if (g_threads[i] < 1 || g_threads[i] > MAX_T) { fprintf(stderr, "bench_ps_remote: threads in [1, %d]\n", MAX_T); return 2; }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    pdde_store_server *srv;
    if (pdde_context_init(&cp, &ctx) || pdde_store_server_init(ctx, "127.0.0.1:0", &srv)) {
        fprintf(stderr, "bench_ps_remote: store server: %s\n", pdde_last_error(ctx));
        return 1;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pdde_store_server_port(srv));
    int fds[2];
    if (pipe(fds)) return 1;
    fflush(NULL);
    pid_t pid[16];
    for (int r = 0; r < g_servers + g_workers; r++)
        if ((pid[r] = fork()) == 0) { close(fds[0]); _exit(rank_main(r, addr, fds[1])); }
    close(fds[1]);
    double rate[2][N_KINDS][8][16];
    ssize_t got = read(fds[0], rate, sizeof rate);
    int bad = 0;
    for (int r = 0; r < g_servers + g_workers; r++) {
        int status;
        waitpid(pid[r], &status, 0);
        bad |= !WIFEXITED(status) || WEXITSTATUS(status);
    }
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    if (bad || got != (ssize_t)sizeof rate) { fprintf(stderr, "bench_ps_remote: a rank failed\n"); return 1; }
    double load[3] = {0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("bench_ps_remote: %d ids a pull and a push, dim %d, vocab %d, %d steps a thread, median of %d; servers: %d (a process each), "
           "%d server threads against 1; workers: %d (a process each); async; 1-minute load %.2f on %ld cores\n", g_ids, DIM, g_vocab,
           g_steps, g_reps, g_servers, g_server_threads, g_workers, load[0], sysconf(_SC_NPROCESSORS_ONLN));
    printf("%8s %14s %14s %14s %9s %9s   %s\n", "threads", "serial st/s", "threads st/s", "inproc st/s", "thr/ser", "thr/inp",
           "worker CPU us a step: serial threads inproc");
    char result[1024];
    int k = snprintf(result, sizeof result, "RESULT ps_remote");
    double med[N_KINDS][8], cpu[N_KINDS][8];
    for (int ti = 0; ti < g_nthreads; ti++) {
        for (int kind = 0; kind < N_KINDS; kind++)
            med[kind][ti] = bench_median(rate[0][kind][ti], g_reps), cpu[kind][ti] = bench_median(rate[1][kind][ti], g_reps);
        printf("%8d %14.0f %14.0f %14.0f %9.2f %9.2f   %6.0f %6.0f %6.0f\n", g_threads[ti], med[SERIAL][ti], med[THREADS][ti], med[INPROC][ti],
               med[THREADS][ti] / med[SERIAL][ti], med[THREADS][ti] / med[INPROC][ti], cpu[SERIAL][ti], cpu[THREADS][ti], cpu[INPROC][ti]);
        for (int kind = 0; kind < N_KINDS; kind++)
            k += snprintf(result + k, sizeof result - (size_t)k, " t%d_%s=%.0f", g_threads[ti], kind_name[kind], med[kind][ti]);
    }
    int last = g_nthreads - 1;
    snprintf(result + k, sizeof result - (size_t)k, " speedup_t%d=%.2f ceiling_t%d=%.2f cpu_us_serial_t%d=%.0f cpu_us_threads_t%d=%.0f load=%.2f",
             g_threads[last], med[THREADS][last] / med[SERIAL][last], g_threads[last], med[THREADS][last] / med[INPROC][last], g_threads[last],
             cpu[SERIAL][last], g_threads[last], cpu[THREADS][last], load[0]);
    printf("%s\n", result);
    return 0;
}
