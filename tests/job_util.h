/* job_util.h — job control for the tests and benchmarks that start `pdde-run` jobs and other programs
 * (test_elastic*, test_etcd, test_launcher, bench_elastic): start a job with its output captured, poll
 * the output, find the ranks it started, kill everything, run it to its end within a limit; read gpt's
 * --metrics file; a free port; a gpt job test's setup (job_gpt_setup; job_gpt_test_setup in a test's
 * main). Header-only (static inline functions): include it once per program, after <stdio.h>. */
#ifndef PDDE_JOB_UTIL_H
#define PDDE_JOB_UTIL_H
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Seconds a test's gpt job may take to its end, and to reach a step before an event: guards against a
 * hang (a stall waits for the world's timeout of 300 s), not timings: at a load of 6-13 on 2 cores
 * 200 steps on 3 ranks took 31 s, a rejoin job over 50 s. */
#define JOB_LIMIT_S 120
#define JOB_STEP_LIMIT_S 60

typedef struct {
    pid_t pid;
    int fd, exited, status;
    char *out; /* stdout and stderr so far, NUL-terminated (NULL before any) */
    size_t len, cap;
    double t0; /* when it started (job_now) */
} job;

static const char *job_who = "FAIL"; /* the prefix of job_finish's message when it kills a job */

static inline double job_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Starts argv[0] (looked up in PATH when it names no folder) with argv, stdout and stderr into a pipe the
 * job's functions read; env: "NAME=VALUE" set, "NAME" unset in the child (NULL-terminated; NULL for
 * none). pid -1 when it could not start. */
static inline job job_spawn(char *const *argv, const char *const *env) {
    job j = {.pid = -1, .fd = -1, .t0 = job_now()};
    int fds[2];
    if (pipe(fds)) return j;
    fflush(NULL);
    j.pid = fork();
    if (j.pid == 0) {
        for (int i = 0; env && env[i]; i++) {
            const char *eq = strchr(env[i], '=');
            if (!eq) { unsetenv(env[i]); continue; }
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
            setenv(name, eq + 1, 1);
        }
        dup2(fds[1], 1), dup2(fds[1], 2);
        close(fds[0]), close(fds[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    if (j.pid < 0) { close(fds[0]); return j; }
    j.fd = fds[0];
    fcntl(j.fd, F_SETFL, O_NONBLOCK);
    return j;
}

/* The ranks pdde-run started (its children), by PDDE_RANK: pids[rank], 0 where none. */
static inline int job_ranks(pid_t runner, pid_t *pids, int cap) {
    memset(pids, 0, (size_t)cap * sizeof *pids);
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int found = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        pid_t pid = atoi(de->d_name);
        if (pid <= 0) continue;
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')');
        int ppid = 0;
        if (!p || sscanf(p + 2, "%*c %d", &ppid) != 1 || ppid != runner) continue;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        for (ssize_t i = 0; i < k;) {
            const char *var = buf + i;
            if (!strncmp(var, "PDDE_RANK=", 10)) {
                int r = atoi(var + 10);
                if (r >= 0 && r < cap) pids[r] = pid, found++;
            }
            i += (ssize_t)strnlen(var, (size_t)(k - i)) + 1;
        }
    }
    closedir(d);
    return found;
}

/* Signals a rank found by job_ranks; a rank not found (pid 0) is not signalled: kill(0, sig) would signal
 * the caller's own process group, the test among it. -1 then. */
static inline int job_signal_rank(pid_t pid, int sig) { return pid > 0 ? kill(pid, sig) : -1; }

/* Reads what is there (waiting up to ms); 1 once the job has exited and its output is read. */
static inline int job_poll(job *j, int ms) {
    if (j->fd >= 0) {
        struct pollfd q = {j->fd, POLLIN, 0};
        if (poll(&q, 1, ms) > 0) {
            char buf[8192];
            ssize_t r;
            while ((r = read(j->fd, buf, sizeof buf)) > 0) {
                if (j->len + (size_t)r + 1 > j->cap) {
                    j->cap = (j->len + (size_t)r + 1) * 2;
                    j->out = realloc(j->out, j->cap);
                }
                memcpy(j->out + j->len, buf, (size_t)r);
                j->len += (size_t)r;
                j->out[j->len] = 0;
            }
            if (r == 0) close(j->fd), j->fd = -1;
        }
    } else {
        usleep((useconds_t)ms * 1000);
    }
    if (!j->exited && waitpid(j->pid, &j->status, WNOHANG) == j->pid) j->exited = 1;
    return j->exited && j->fd < 0;
}

/* Stops the job and every rank it started, whatever state they are in (SIGKILL). */
static inline void job_kill(job *j) {
    pid_t pids[8];
    if (!j->exited) {
        job_ranks(j->pid, pids, 8);
        kill(j->pid, SIGKILL);
        for (int r = 0; r < 8; r++)
            if (pids[r]) kill(-pids[r], SIGKILL), kill(pids[r], SIGKILL);
        waitpid(j->pid, &j->status, 0);
        j->exited = 1;
    }
    if (j->fd >= 0) close(j->fd), j->fd = -1;
}

/* Runs the job to its end, killed limit_s after it started; its exit code, -1 when killed. */
static inline int job_finish(job *j, double limit_s) {
    while (!job_poll(j, 50))
        if (job_now() - j->t0 > limit_s) {
            fprintf(stderr, "%s: the job did not finish within %.0f s: killed\n", job_who, limit_s);
            job_kill(j);
            return -1;
        }
    return WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -1;
}

static inline const char *job_text(const job *j) { return j->out ? j->out : ""; }

/* The newest step in a gpt --metrics file (0 if none). */
static inline int metrics_last_step(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[512];
    int last = 0;
    while (fgets(line, sizeof line, f)) {
        int s;
        if (sscanf(line, "{\"step\":%d,\"loss\"", &s) == 1) last = s;
    }
    fclose(f);
    return last;
}

/* Every step's loss (the last line written for it; NaN when none) and how many steps were written
 * twice (done again after a recovery); -1 when the file cannot be read. */
static inline int metrics_losses(const char *path, double *loss, int n) {
    for (int i = 0; i <= n; i++) loss[i] = NAN;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int again = 0;
    while (fgets(line, sizeof line, f)) {
        int s;
        double l;
        if (sscanf(line, "{\"step\":%d,\"loss\":%lf", &s, &l) != 2 || s < 1 || s > n) continue;
        if (!isnan(loss[s])) again++;
        loss[s] = l;
    }
    fclose(f);
    return again;
}

/* Waits until the metrics file reaches step, within limit_s, reading the job's output; 0 ok, -1 when
 * the job ended or the time ran out first. */
static inline int job_wait_step(job *j, const char *metrics, int step, double limit_s) {
    double t0 = job_now();
    while (metrics_last_step(metrics) < step) {
        if (job_poll(j, 2) || job_now() - t0 > limit_s) return -1;
    }
    return 0;
}

/* A free TCP port on 127.0.0.1 (bound and released: another process may take it in between); 0 if none. */
static inline int job_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int port = 0;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&sa, sizeof sa) && !getsockname(fd, (struct sockaddr *)&sa, &sl)) port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* What a test of gpt jobs needs before it starts one: pdde-run and gpt beside the test (run, gpt: cap
 * bytes each), gpt's default data file, a new temporary folder made from tmp_template (into tmp) and the
 * seed of its random steps (PDDE_TEST_SEED, else the time; printed). 0 when ready; 1 when the test
 * cannot run here, why saying what is missing; -1 when the folder cannot be made. */
static inline int job_gpt_setup(const char *argv0, char *run, char *gpt, size_t cap, char *tmp, size_t tmp_cap,
                                const char *tmp_template, unsigned *seed, char *why, size_t why_cap) {
    const char *slash = strrchr(argv0, '/');
    int dir_len = slash ? (int)(slash - argv0) : 1;
    const char *dir = slash ? argv0 : ".";
    snprintf(run, cap, "%.*s/pdde-run", dir_len, dir);
    snprintf(gpt, cap, "%.*s/gpt", dir_len, dir);
    if (access(run, X_OK) || access(gpt, X_OK)) {
        snprintf(why, why_cap, "%s or %s is not built (make builds them)", run, gpt);
        return 1;
    }
    if (access("/usr/share/games/fortunes/songs-poems", R_OK)) {
        snprintf(why, why_cap, "gpt's default data file /usr/share/games/fortunes/songs-poems is missing (fortunes-min)");
        return 1;
    }
    snprintf(tmp, tmp_cap, "%s", tmp_template);
    if (!mkdtemp(tmp)) {
        snprintf(why, why_cap, "mkdtemp %s: %s", tmp_template, strerror(errno));
        return -1;
    }
    *seed = getenv("PDDE_TEST_SEED") ? (unsigned)atoi(getenv("PDDE_TEST_SEED")) : (unsigned)time(NULL);
    printf("seed %u\n", *seed);
    return 0;
}

#ifdef PDDE_TEST_UTIL_H
/* The peer timeout for a test's elastic jobs: base seconds times test_util.h's test_load_factor (the load per core
 * above 1, at most 4). A member renews a lease of about the peer timeout at the store every quarter of
 * it, and a loaded machine can starve a process past a short one: the store then drops the member as
 * frozen. Bounds a test derives from it keep their meaning. */
static inline double job_peer_timeout(double base) { return base * test_load_factor(); }

/* job_wait_step in a test, with JOB_STEP_LIMIT_S: 0 once the job reaches step; else a failed check
 * ("what: the job did not reach step N" and its output), the job killed, -1. */
static inline int job_test_wait_step(job *j, const char *metrics, int step, const char *what) {
    if (!job_wait_step(j, metrics, step, JOB_STEP_LIMIT_S)) return 0;
    CHECK(0, "%s: the job did not reach step %d:\n%s", what, step, job_text(j));
    job_kill(j);
    return -1;
}

/* job_gpt_setup for a test's main (test_util.h included before this header): -1 when ready; else what
 * main returns: a skip saying what is missing (test_finish's code), 1 when the folder cannot be made. */
static inline int job_gpt_test_setup(const char *argv0, char *run, char *gpt, size_t cap, char *tmp, size_t tmp_cap,
                                     const char *tmp_template, unsigned *seed) {
    char why[1400];
    int ready = job_gpt_setup(argv0, run, gpt, cap, tmp, tmp_cap, tmp_template, seed, why, sizeof why);
    if (ready < 0) { fprintf(stderr, "%s\n", why); return 1; }
    if (ready) { test_skip("setup", "%s", why); return test_finish(); }
    return -1;
}
#endif

#endif
