/* pdde-run — starts the ranks of a pdde job on this host (like torchrun / mpirun).
 *
 *   pdde-run -n 4 ./prog args...
 *       4 ranks here; pdde-run hosts the bootstrap store on 127.0.0.1 (a free port).
 *   pdde-run -n 2 --nnodes 2 --node-rank 0 --store 10.0.0.1:29500 ./prog      (on host A)
 *   pdde-run -n 2 --nnodes 2 --node-rank 1 --store 10.0.0.1:29500 ./prog      (on host B)
 *       several hosts: run pdde-run on each (by hand, a batch system or ssh); node 0 hosts the store
 *       on the given address, the others connect to it. Node k runs ranks k*n .. k*n+n-1. Every node
 *       needs the same job secret (PDDE_JOB_SECRET_FILE on a shared home, or PDDE_JOB_SECRET); a node whose
 *       secret the store refuses stops at once, before starting its ranks.
 *
 * Each rank gets PDDE_RANK, PDDE_WORLD_SIZE, PDDE_LOCAL_RANK, PDDE_LOCAL_SIZE, PDDE_STORE_ADDR, the
 * job secret (PDDE_JOB_SECRET, made here unless the user gave one) and its share of the cores
 * (PDDE_NUM_THREADS = cores / ranks here, unless set); its output lines are prefixed with "[rank] "
 * (and written unprefixed to DIR/rank<R>.log with --log-dir DIR). --trace FILE has the ranks trace
 * their sessions and merges their files into FILE when they are gone.
 * Each rank runs in a process group of its own, and signals go to the whole group, so a rank's
 * children stop with it. SIGINT and SIGTERM are forwarded; when a rank fails (non-zero exit or
 * signal) the others are stopped (SIGTERM, then SIGKILL after a grace period). Once the ranks are
 * gone pdde-run drains their output for at most a second and exits, even if something they started
 * still holds the pipes. The summary names the root cause: the first failure the store recorded (a
 * rank that died, or stopped answering and lost its lease), not the rank that reported it first.
 *
 *   pdde-run -n 4 --elastic --min 2 --max 4 [--max-restarts K] [--rdzv tcp://HOST:PORT/JOB] ./prog
 *       an elastic job: a rank that dies or is stopped does not stop the others; the program recovers
 *       in process (pdde_elastic_*: the survivors re-form the world and go on). pdde-run tells the
 *       store how each rank ended, a --join or restarted rank's under the member id pdde-run took for
 *       it before starting it (SIGKILL; stopped, once the store wrote it off or it stayed stopped
 *       past the peer timeout: a brief pause is no end), kills ranks left stopped once the others are
 *       done, and succeeds when at least --min ranks finish cleanly. A rank that left at a step boundary
 *       (planned, or a signal to it: gpt exits 128 + the signal) departed, no loss; when every rank left,
 *       or departures would have left fewer than --min and all stopped there, pdde-run exits with their status. SIGINT/SIGTERM to pdde-run stop the
 *       job as without --elastic (128 + the signal): the ranks it then stops are no losses, and a loss
 *       the job went on from is no cause. */
#define _GNU_SOURCE
#include "pdde.h"
#include <sched.h>

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    fprintf(stderr, "this tool needs pdde built with comm (UCX)\n");
    return 1;
}
#else

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/proc_stat.h"

#define MAX_RANKS 256

typedef struct {
    pid_t pid;
    int rank;
    FILE *log;          /* --log-dir: this rank's lines, both streams (NULL: none) */
    int fd[2];          /* stdout, stderr pipes (-1 when closed) */
    char *line[2];      /* a partial line per stream */
    size_t len[2];
    int exited, status;
    double stopped_since; /* --elastic: when it was first seen stopped (0: not stopped) */
    int written_off;      /* --elastic: stopped long enough that the others go on without it */
    int id;               /* --elastic: its member id: its rank, or a joiner's (new_joiner_id); -1: none */
} child;

/* core/elastic.c: joiner k of the job's counter `joined` (from 1) is member 65536 + k - 1 */
#define JOINER_ID0 65536

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pdde-run -n N [--nnodes M --node-rank K] [--store host:port] [--grace S] prog [args...]\n"
            "  -n N           ranks on this host\n"
            "  --nnodes M     hosts in the job (default 1); run pdde-run on each\n"
            "  --node-rank K  this host's index (default 0); node 0 hosts the store\n"
            "  --store A      the store address host:port (default 127.0.0.1 and a free port on one host;\n"
            "                 required with several hosts, unless --rdzv tcp:// gives it: node 0 listens on it,\n"
            "                 the others connect).\n"
            "                 A non-loopback address opens the store to that network: then only the\n"
            "                 job secret keeps others out\n"
            "  --grace S      seconds between SIGTERM and SIGKILL when stopping ranks (default 3)\n"
            "  --log-dir D    also write each rank's output (stdout and stderr, unprefixed) to D/rank<R>.log\n"
            "  --bind cores   pin each rank to its share of the cores this host gives pdde-run (PDDE_NUM_THREADS\n"
            "                 consecutive ones from rank x share); --bind none (the default) leaves them to the OS\n"
            "  --trace FILE   the ranks trace their sessions (PDDE_TRACE: FILE.rank<R> each); once they are\n"
            "                 gone, the ranks' files of this host are merged into FILE (one Chrome/Perfetto trace,\n"
            "                 a process per rank) and removed\n"
            "  --elastic      an elastic job (see pdde_elastic_* in pdde.h): a rank lost does not stop the others,\n"
            "                 the survivors recover in process; success = at least --min ranks exit 0\n"
            "  --min M, --max N   the fewest ranks the job may go on with (default 1), the most (default -n)\n"
            "  --max-restarts K   failures the job recovers from, at most (default 10)\n"
            "  --rdzv URL     tcp://HOST:PORT/JOB: the store (node 0 hosts it on HOST:PORT) and the job's name in it;\n"
            "                 etcd://HOST:PORT/JOB: the membership in that etcd (leases, transactions, watches; each run's\n"
            "                 keys under a run id of its own, deleted when it ends: a JOB name can be used again); an etcd\n"
            "                 that refuses is waited for up to 30 s (said at once), a HOST that does not resolve is an error\n"
            "  --peer-timeout S   failure detection bound in seconds (PDDE_PEER_TIMEOUT; default 5); a rank stopped\n"
            "                 for less (a debugger, SIGSTOP then SIGCONT) stays a member\n"
            "  --restart K    a rank killed by a signal is started again (K times at most in all), as a joiner: the\n"
            "                 members take it in at their next step boundary and hand it their state\n"
            "  --join         these ranks join a running elastic job (its --rdzv, tcp:// or etcd://, and the same\n"
            "                 PDDE_JOB_SECRET): its members take them in at their next step boundary (up to its --max).\n"
            "                 With etcd:// the job's store address is read from etcd, where the job's pdde-run keeps it\n"
            "                 while it runs; a job not found there is an error at once. A job at its --max:\n"
            "                 said at once; the ranks wait for a member to leave (PDDE_ELASTIC_TIMEOUT, default 300 s).\n"
            "                 pdde-run notes how each of them ends, as the job's does its ranks': the members go on\n"
            "                 at once when one is killed, not when its lease ends\n"
            "  -h, --help     this text\n"
            "SIGINT or SIGTERM to pdde-run goes to its ranks (SIGKILL after --grace S); pdde-run then says \"stopped by\n"
            "SIGTERM\" and exits with 128 + the signal (130, 143), also after losses an --elastic job went on from\n"
            "environment: PDDE_JOB_SECRET or PDDE_JOB_SECRET_FILE (required with --nnodes > 1; made here\n"
            "otherwise), PDDE_NUM_THREADS (threads per rank; default: the cores divided among the ranks here)\n");
}

/* --bind cores: local rank r runs on PDDE_NUM_THREADS consecutive cores of those this process may
 * use (in their order; wrapping round when the ranks' shares exceed them). */
static void bind_rank(int r) {
    cpu_set_t allowed, set;
    if (sched_getaffinity(0, sizeof allowed, &allowed)) return;
    const char *threads = getenv("PDDE_NUM_THREADS"); /* (checked in main, and set there where it was not) */
    int cpus[CPU_SETSIZE], n = 0, t = threads ? atoi(threads) : 1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
    if (n == 0) return;
    CPU_ZERO(&set);
    for (int k = 0; k < t; k++) CPU_SET(cpus[((long)r * t + k) % n], &set);
    if (sched_setaffinity(0, sizeof set, &set)) fprintf(stderr, "pdde-run: rank %d: cannot bind: %s\n", r, strerror(errno));
}

/* The shared-memory segments a rank made (comm/shm.c names them /pdde-<pid>-<n> and unlinks them once
 * every peer has mapped them): a rank killed before that leaves them in /dev/shm; no one can use them
 * once it is gone. */
static void remove_shm_of(pid_t pid) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "pdde-%d-", (int)pid);
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d))
        if (!strncmp(e->d_name, prefix, (size_t)n)) {
            char path[300];
            snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
}

/* Parses an integer argument in [lo, hi]; exits 2 naming the argument otherwise. */
static int int_arg(const char *name, const char *v, int lo, int hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "pdde-run: %s '%s': want an integer in [%d, %d]\n", name, v, lo, hi);
        exit(2);
    }
    return (int)x;
}

/* Writes the complete lines of buf with the rank prefix; keeps the rest for later. */
static void emit(child *c, int s, const char *buf, size_t n, int flush) {
    FILE *out = s ? stderr : stdout;
    char *l = realloc(c->line[s], c->len[s] + n + 1);
    if (!l) return;
    memcpy(l + c->len[s], buf, n);
    c->line[s] = l;
    c->len[s] += n;
    size_t start = 0;
    for (size_t i = 0; i < c->len[s]; i++)
        if (l[i] == '\n') {
            fprintf(out, "[%d] %.*s\n", c->rank, (int)(i - start), l + start);
            if (c->log) fprintf(c->log, "%.*s\n", (int)(i - start), l + start);
            start = i + 1;
        }
    if (flush && start < c->len[s]) {
        fprintf(out, "[%d] %.*s\n", c->rank, (int)(c->len[s] - start), l + start);
        if (c->log) fprintf(c->log, "%.*s\n", (int)(c->len[s] - start), l + start);
        start = c->len[s];
    }
    if (c->log) fflush(c->log);
    memmove(l, l + start, c->len[s] - start);
    c->len[s] -= start;
    fflush(out);
}

static void close_stream(child *c, int s) {
    emit(c, s, "", 0, 1);
    close(c->fd[s]);
    c->fd[s] = -1;
}

static void describe(const child *c, char *buf, size_t cap) {
    if (WIFSIGNALED(c->status))
        snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(c->status), strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(c->status));
}

/* Merges the ranks' traces path.rank<first..first+n) into path: the events of each (the lines between
 * the first and the last, as pdde writes them) in one traceEvents array; the parts are removed.
 * Returns how many parts were merged, -1 when path cannot be written. */
static int merge_traces(const char *path, int first, int n) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) return -1;
    fprintf(out, "{\"traceEvents\":[");
    int merged = 0, events = 0;
    for (int r = first; r < first + n; r++) {
        char part[4200], *line = NULL;
        size_t cap = 0;
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        FILE *in = fopen(part, "r");
        if (!in) continue;
        ssize_t len;
        for (int k = 0; (len = getline(&line, &cap, in)) > 0; k++) {
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == ',')) line[--len] = 0;
            if (k == 0 || line[0] != '{') continue; /* the header and the closing "]}" */
            fprintf(out, "%s\n%s", events++ ? "," : "", line);
        }
        free(line);
        fclose(in);
        remove(part);
        merged++;
    }
    fprintf(out, "\n]}\n");
    if (fclose(out) || rename(tmp, path)) return -1;
    return merged;
}

/* Signals a rank's whole process group (its children too); a stopped rank is continued, so that it
 * can die of the signal. */
static void signal_rank(const child *c, int sig) {
    if (c->exited) return;
    if (kill(-c->pid, sig)) kill(c->pid, sig);
    if (sig != SIGKILL) kill(-c->pid, SIGCONT);
}

/* Starts (or, restarted = 1, starts again) local rank r of ch with its own pipes and process group; as
 * a joiner of the elastic job under its member id when that is a joiner's. */
static int spawn_rank(child *ch, int n, int r, char **cmd, const char *log_dir, int bind, int restarted) {
    child *c = &ch[r];
    char v[64];
    if (log_dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/rank%d.log", log_dir, c->rank);
        if (!(c->log = fopen(path, restarted ? "a" : "w"))) { fprintf(stderr, "pdde-run: cannot write %s: %s\n", path, strerror(errno)); return 1; }
    }
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) { perror("pdde-run: pipe"); return 1; }
    fflush(NULL);
    pid_t launcher = getpid();
    c->pid = fork();
    if (c->pid < 0) { perror("pdde-run: fork"); return 1; }
    if (c->pid == 0) {
        /* a launcher killed (SIGKILL: no handler runs) takes its ranks with it: an orphan would train on,
         * holding its peers in the job */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != launcher) _exit(128 + SIGKILL);
        setpgid(0, 0);
        snprintf(v, sizeof v, "%d", c->rank); setenv("PDDE_RANK", v, 1);
        snprintf(v, sizeof v, "%d", r); setenv("PDDE_LOCAL_RANK", v, 1);
        if (c->id >= JOINER_ID0) {
            snprintf(v, sizeof v, "%d", c->id);
            setenv("PDDE_ELASTIC_JOIN", "1", 1), setenv("PDDE_ELASTIC_ID", v, 1);
        }
        if (bind) bind_rank(r);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        for (int k = 0; k < n; k++)
            if (ch[k].log) fclose(ch[k].log); /* (the parent's: a rank writes only its pipes) */
        dup2(out[1], 1); dup2(err[1], 2);
        execvp(cmd[0], cmd);
        fprintf(stderr, "pdde-run: cannot run %s: %s\n", cmd[0], strerror(errno));
        _exit(127);
    }
    setpgid(c->pid, c->pid); /* here too: the group exists before the first signal, whoever runs first */
    close(out[1]); close(err[1]);
    c->fd[0] = out[0]; c->fd[1] = err[0];
    c->exited = 0, c->status = 0, c->stopped_since = 0, c->written_off = 0;
    return 0;
}

/* A member id for a rank started as a joiner (--join, or --restart), taken from the job's counter here
 * before the rank starts (it gets it as PDDE_ELASTIC_ID): then pdde-run can note the rank's end under it
 * however early the rank dies. -1 when the store does not answer. */
static int new_joiner_id(pdde_store *notes, const char *members) {
    char key[300];
    int64_t k = 0;
    snprintf(key, sizeof key, "%s/joined", members);
    if (!notes || pdde_store_add(notes, key, 1, &k) || k < 1 || k > INT_MAX - JOINER_ID0) return -1;
    return JOINER_ID0 + (int)k - 1;
}

/* Whether a rank seen stopped for `stopped_s` is lost to the job: the store wrote it off (its death
 * notice: its lease ran out), or it has been stopped past the peer timeout (a rank that has not yet
 * registered holds no lease). A rank paused for less (a debugger, SIGSTOP then SIGCONT, a freezer)
 * keeps its lease and goes on as a member. */
static int rank_written_off(pdde_store *notes, const char *members, int id, double stopped_s, double peer_timeout_s) {
    if (stopped_s > peer_timeout_s) return 1;
    if (!notes || id < 0) return 0; /* (id < 0: none, no lease of its to end) */
    char key[300];
    void *v = NULL;
    size_t len;
    snprintf(key, sizeof key, "%s/dead/%d", members, id);
    pdde_status st = pdde_store_get(notes, key, &v, &len);
    free(v);
    return st == PDDE_OK;
}

/* An elastic job with its membership in etcd: its ranks' worlds meet at this pdde-run's store, whose
 * address a joiner (pdde-run --join) reads from etcd, and beside it the run's id (its members' keys are
 * under elastic/JOB/<run id>/). Both are put on the lease of the notes connection, so etcd deletes them
 * when this pdde-run, and with it the store it hosts, is gone. */
static pdde_status publish_world_store(pdde_store *notes, const char *job, const char *addr, const char *run_id) {
    char key[300];
    snprintf(key, sizeof key, "elastic/%s/store", job);
    pdde_status st = pdde_store_etcd_set_leased(notes, key, addr, strlen(addr));
    snprintf(key, sizeof key, "elastic/%s/run", job);
    return st ? st : pdde_store_etcd_set_leased(notes, key, run_id, strlen(run_id));
}

/* Node 0 of an etcd job, before its run id is known to anyone: when no run of the job's name is alive (no
 * store address in etcd: that key lives on the running node 0's lease), what earlier runs of the name left
 * (killed ones leave their keys) is deleted. A run's own keys are deleted when it ends. */
static void clear_dead_runs(pdde_context *ctx, pdde_store *notes, const char *job) {
    char key[300];
    void *v = NULL;
    size_t n;
    snprintf(key, sizeof key, "elastic/%s/store", job);
    pdde_status st = pdde_store_get(notes, key, &v, &n);
    free(v);
    snprintf(key, sizeof key, "elastic/%s/", job);
    if (st == PDDE_ERR_NOT_FOUND && pdde_store_etcd_remove_prefix(notes, key))
        fprintf(stderr, "pdde-run: --rdzv etcd: cannot delete what earlier runs of job '%s' left in etcd: %s\n", job, pdde_last_error(ctx));
}

/* A run id no other run of the job's name has: the time, this process, 32 random bits. */
static void make_run_id(char *out, size_t cap) {
    unsigned r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = (unsigned)now_s() ^ (unsigned)getpid() << 16;
    if (fd >= 0) close(fd);
    snprintf(out, cap, "r%lx-%x-%08x", (long)time(NULL), (unsigned)getpid(), r);
}

/* A node other than 0, or a joiner: connects to the job's store before starting ranks, so that another job
 * secret is said at once (the store's handshake proves the secret both ways), not when the ranks start.
 * With etcd (run != NULL) it reads the run id node 0's pdde-run put there (it is there before node 0 starts
 * its ranks). 0; 2 after saying why (another secret, no store answering within timeout_s, no run id). */
static int check_job_store(pdde_context *ctx, const char *addr, const char *job, double timeout_s, int join, char *run, size_t cap) {
    pdde_store *s = NULL;
    double t0 = now_s();
    pdde_status st = pdde_store_connect(ctx, addr, timeout_s, &s);
    double waited = now_s() - t0;
    if (st == PDDE_ERR_ENV || st == PDDE_ERR_INVALID_ARG) { /* (this node's own setting: its job secret, the address) */
        fprintf(stderr, "pdde-run: %s\n", pdde_last_error(ctx));
        return 2;
    }
    if (st == PDDE_ERR_AUTH) {
        fprintf(stderr, "pdde-run: the job store at %s refused this node's job secret: PDDE_JOB_SECRET or PDDE_JOB_SECRET_FILE "
                "here differs from node 0's (%s)\n", addr, pdde_last_error(ctx));
        return 2;
    }
    if (st && join) {
        fprintf(stderr, "pdde-run: --join: no job store at %s answers (%s): the job is not running, or the URL is wrong\n", addr,
                pdde_last_error(ctx));
        return 2;
    }
    if (st) {
        fprintf(stderr, "pdde-run: no job store at %s answered (%.3g s of %.3g waited: %s): node 0's pdde-run is not running there\n", addr,
                waited, timeout_s, pdde_last_error(ctx));
        return 2;
    }
    if (run) {
        char key[300];
        void *v = NULL;
        size_t n = 0;
        snprintf(key, sizeof key, "elastic/%s/run", job);
        st = pdde_store_wait(s, key, timeout_s);
        if (!st) st = pdde_store_get(s, key, &v, &n);
        if (!st && (n == 0 || n >= cap || memchr(v, 0, n) || memchr(v, '/', n)))
            st = pdde_error(ctx, PDDE_ERR_STATE, "%s is not a run id", key);
        if (!st) memcpy(run, v, n), run[n] = 0;
        free(v);
        if (st) {
            fprintf(stderr, "pdde-run: the job store at %s has no run id of job '%s' (%s): another job, or one not started with "
                    "--rdzv etcd://.../%s\n", addr, job, pdde_last_error(ctx), job);
            pdde_store_close(s);
            return 2;
        }
    }
    pdde_store_close(s);
    return 0;
}

/* Connects to the etcd at url ("etcd://HOST:PORT"), waiting up to wait_s for it to answer: etcd may be
 * starting. An endpoint that can never work fails at once (comm/etcd.c: PDDE_ERR_INVALID_ARG). When the
 * first short try finds no etcd, it says so right away, once, and how long it waits; else the silence
 * would last the whole wait. (The store's timeout per request is the connect's, hence a second connect.) */
static pdde_status connect_etcd(pdde_context *ctx, const char *url, double wait_s, pdde_store **out) {
    double t0 = now_s();
    pdde_status st = pdde_store_etcd_connect(ctx, url, 0.5, out);
    if (st == PDDE_OK) pdde_store_close(*out), *out = NULL;
    else if (st == PDDE_ERR_INVALID_ARG) return st;
    else
        fprintf(stderr, "pdde-run: --rdzv etcd: waiting up to %.0f s for etcd at %s (%s)\n", wait_s, url + 7, pdde_last_error(ctx));
    double left = wait_s - (now_s() - t0);
    return pdde_store_etcd_connect(ctx, url, st == PDDE_OK ? wait_s : left > 1 ? left : 1, out);
}

/* pdde-run --join with etcd (etcd_url "etcd://HOST:PORT"): the address of the store where the job's worlds
 * meet, as the job's pdde-run published it (publish_world_store), into addr; 2 (after saying why) when
 * etcd has no such job. It looks once: a job that runs has published it before its ranks started. */
static int find_world_store(const char *etcd_url, const char *job, char *addr, size_t cap) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_store *s = NULL;
    char key[300];
    snprintf(key, sizeof key, "elastic/%s/store", job);
    void *v = NULL;
    size_t n = 0;
    pdde_status st = connect_etcd(ctx, etcd_url, 30, &s);
    if (!st) st = pdde_store_get(s, key, &v, &n);
    int rc = 0;
    if (st == PDDE_ERR_NOT_FOUND)
        fprintf(stderr, "pdde-run: --join: the etcd at %s has no elastic job '%s' (no key %s: the job is not running, or its "
                "pdde-run is gone)\n", etcd_url + 7, job, key), rc = 2;
    else if (st)
        fprintf(stderr, "pdde-run: --join: cannot look up job '%s' in the etcd at %s: %s\n", job, etcd_url + 7, pdde_last_error(ctx)), rc = 2;
    else if (n == 0 || n >= cap || memchr(v, 0, n) || !memchr(v, ':', n))
        fprintf(stderr, "pdde-run: --join: the etcd at %s: %s is not a store address (host:port)\n", etcd_url + 7, key), rc = 2;
    else
        memcpy(addr, v, n), addr[n] = 0;
    free(v);
    pdde_store_close(s);
    pdde_context_free(ctx);
    return rc;
}

/* pdde-run --join: a job with as many members as its --max takes joiners in only once a member leaves,
 * and its ranks wait for that silently: said once, before they start, with how long they wait. The
 * members are those of the newest generation (members/g<k>/members: "<step> <n> <ids>..."), or, before
 * the first change, the ranks the job's node 0 started (members/started, its pdde-run's); the --max is
 * its rank 0's (members/max). Nothing is said when the store does not tell (the job is starting). */
static void say_if_full(pdde_store *s, const char *members, const char *job, int n) {
    char key[300];
    int have = -1, max = 0;
    void *v = NULL;
    size_t len = 0;
    for (int g = 1;; g++) { /* (generations are numbered 1, 2, ... with no gap) */
        snprintf(key, sizeof key, "%s/g%d/members", members, g);
        if (pdde_store_get(s, key, &v, &len)) break;
        long long step;
        char text[64];
        snprintf(text, sizeof text, "%.*s", (int)(len < 63 ? len : 63), (const char *)v);
        if (sscanf(text, "%lld %d", &step, &have) != 2) have = -1;
        free(v), v = NULL;
    }
    const char *names[2] = {"started", "max"};
    int *vals[2] = {&have, &max};
    for (int k = have < 0 ? 0 : 1; k < 2; k++) {
        snprintf(key, sizeof key, "%s/%s", members, names[k]);
        if (pdde_store_get(s, key, &v, &len)) return;
        char text[32];
        snprintf(text, sizeof text, "%.*s", (int)(len < 31 ? len : 31), (const char *)v);
        free(v), v = NULL;
        *vals[k] = atoi(text);
    }
    if (have < 0 || max < 1 || have + n <= max) return;
    const char *t = getenv("PDDE_ELASTIC_TIMEOUT"); /* (the ranks' wait to be taken in: core/elastic.c) */
    double wait_s = t && strtod(t, NULL) > 0 ? strtod(t, NULL) : 300;
    char bound[200];
    if (isinf(wait_s)) snprintf(bound, sizeof bound, "with no time limit (PDDE_ELASTIC_TIMEOUT=%s): Ctrl-C or SIGTERM to pdde-run stops them", t);
    else snprintf(bound, sizeof bound, "for up to %.0f s (PDDE_ELASTIC_TIMEOUT), then fail%s", wait_s, n > 1 ? "" : "s");
    int room = have < max ? max - have : 0;
    if (room == 0)
        fprintf(stderr, "pdde-run: --join: job '%s' is full (%d of --max %d members): %s rank%s wait%s for a free slot (a member "
                "leaving) %s\n", job, have, max, n > 1 ? "these" : "this", n > 1 ? "s" : "", n > 1 ? "" : "s", bound);
    else
        fprintf(stderr, "pdde-run: --join: job '%s' has room for %d more (%d of --max %d members): of these %d ranks, %d wait%s for a "
                "free slot (a member leaving) %s\n", job, room, have, max, n, n - room, n - room > 1 ? "" : "s", bound);
}

/* The rest of a dead rank's output (its group is killed first, so nothing holds the pipes for long). */
static void drain_rank(child *c) {
    kill(-c->pid, SIGKILL);
    for (int s = 0; s < 2; s++) {
        while (c->fd[s] >= 0) {
            struct pollfd q = {c->fd[s], POLLIN, 0};
            char buf[65536];
            ssize_t k = poll(&q, 1, 1000) > 0 ? read(c->fd[s], buf, sizeof buf) : 0;
            if (k > 0) emit(c, s, buf, (size_t)k, 0);
            else if (k == 0 || (errno != EINTR && errno != EAGAIN)) close_stream(c, s);
        }
    }
    if (c->log) fclose(c->log), c->log = NULL;
}

int main(int argc, char **argv) {
    int n = 0, nnodes = 1, node_rank = 0;
    double grace = 3;
    const char *store_addr = NULL, *log_dir = NULL, *trace = NULL;
    int i = 1, bind = 0, elastic = 0, join = 0, etcd = 0, min_ranks = 1, max_ranks = 0, max_restarts = -2, restarts = 0;
    const char *rdzv = NULL, *peer_timeout = NULL;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) { i++; break; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--elastic")) { elastic = 1; continue; }
        if (!strcmp(a, "--join")) { join = 1; continue; }
        int known = !strcmp(a, "-n") || !strcmp(a, "--nproc") || !strcmp(a, "--nnodes") || !strcmp(a, "--node-rank") ||
                    !strcmp(a, "--store") || !strcmp(a, "--grace") || !strcmp(a, "--log-dir") || !strcmp(a, "--trace") ||
                    !strcmp(a, "--bind") || !strcmp(a, "--min") || !strcmp(a, "--max") || !strcmp(a, "--max-restarts") ||
                    !strcmp(a, "--rdzv") || !strcmp(a, "--peer-timeout") || !strcmp(a, "--restart");
        if (!known) { fprintf(stderr, "pdde-run: unknown option '%s' (see --help)\n", a); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "pdde-run: %s needs a value (see --help)\n", a); return 2; }
        const char *v = argv[++i];
        if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) n = int_arg(a, v, 1, MAX_RANKS);
        else if (!strcmp(a, "--nnodes")) nnodes = int_arg(a, v, 1, 65536);
        else if (!strcmp(a, "--node-rank")) node_rank = int_arg(a, v, 0, 65535);
        else if (!strcmp(a, "--store")) store_addr = v;
        else if (!strcmp(a, "--log-dir")) log_dir = v;
        else if (!strcmp(a, "--trace")) trace = v;
        else if (!strcmp(a, "--min")) min_ranks = int_arg(a, v, 1, 65536);
        else if (!strcmp(a, "--max")) max_ranks = int_arg(a, v, 1, 65536);
        else if (!strcmp(a, "--max-restarts")) max_restarts = int_arg(a, v, -1, 1000000);
        else if (!strcmp(a, "--rdzv")) rdzv = v;
        else if (!strcmp(a, "--restart")) restarts = int_arg(a, v, 0, 1000000);
        else if (!strcmp(a, "--peer-timeout")) {
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end || !(t > 0 && t <= 3600)) { fprintf(stderr, "pdde-run: --peer-timeout '%s': want seconds in (0, 3600]\n", v); return 2; }
            peer_timeout = v;
        }
        else if (!strcmp(a, "--bind")) {
            if (strcmp(v, "cores") && strcmp(v, "none")) { fprintf(stderr, "pdde-run: --bind '%s': want cores or none\n", v); return 2; }
            bind = !strcmp(v, "cores");
        }
        else {
            char *end;
            grace = strtod(v, &end);
            if (end == v || *end || !(grace >= 0 && grace <= 3600)) {
                fprintf(stderr, "pdde-run: --grace '%s': want seconds in [0, 3600]\n", v);
                return 2;
            }
        }
    }
    if (!n) { fprintf(stderr, "pdde-run: -n N (ranks on this host) is required (see --help)\n"); return 2; }
    if (getenv("PDDE_NUM_THREADS")) int_arg("PDDE_NUM_THREADS", getenv("PDDE_NUM_THREADS"), 1, 1 << 16); /* (--bind cores reads it) */
    if (i >= argc) { fprintf(stderr, "pdde-run: no program to run (see --help)\n"); return 2; }
    if (node_rank >= nnodes) {
        fprintf(stderr, "pdde-run: --node-rank %d is not below --nnodes %d\n", node_rank, nnodes);
        return 2;
    }
    char **cmd = argv + i;
    char job[200];
    snprintf(job, sizeof job, "job-%d", (int)getpid());
    static char rdzv_store[300];
    if (rdzv) {
        const char *path;
        if (!strncmp(rdzv, "tcp://", 6)) {
            const char *hp = rdzv + 6;
            path = strchr(hp, '/');
            snprintf(rdzv_store, sizeof rdzv_store, "%.*s", path ? (int)(path - hp) : (int)strlen(hp), hp);
            if (!strchr(rdzv_store, ':')) { fprintf(stderr, "pdde-run: --rdzv %s: want tcp://HOST:PORT/JOB\n", rdzv); return 2; }
            store_addr = rdzv_store;
        } else if (!strncmp(rdzv, "etcd://", 7)) {
            /* membership through etcd; the ranks' worlds still meet at this pdde-run's store */
            const char *hp = rdzv + 7;
            path = strchr(hp, '/');
            snprintf(rdzv_store, sizeof rdzv_store, "etcd://%.*s", path ? (int)(path - hp) : (int)strlen(hp), hp);
            if (!strchr(rdzv_store + 7, ':')) { fprintf(stderr, "pdde-run: --rdzv %s: want etcd://HOST:PORT/JOB\n", rdzv); return 2; }
            setenv("PDDE_RDZV", rdzv_store, 1);
            etcd = 1;
        } else {
            fprintf(stderr, "pdde-run: --rdzv '%s': want tcp://HOST:PORT/JOB or etcd://HOST:PORT/JOB\n", rdzv);
            return 2;
        }
        if (path && path[1]) snprintf(job, sizeof job, "%.190s", path + 1);
        if (!elastic && etcd) { fprintf(stderr, "pdde-run: --rdzv etcd:// is for --elastic jobs (else --rdzv tcp://HOST:PORT/JOB or --store)\n"); return 2; }
    }
    if (nnodes > 1 && !store_addr) { /* (--rdzv tcp://HOST:PORT/JOB gives it too) */
        fprintf(stderr, "pdde-run: --store host:port (or --rdzv tcp://HOST:PORT/JOB) is required with --nnodes > 1\n");
        return 2;
    }
    if (join) {
        if (!elastic || !rdzv) { fprintf(stderr, "pdde-run: --join needs --elastic and the job's --rdzv (tcp://HOST:PORT/JOB or etcd://HOST:PORT/JOB)\n"); return 2; }
        if (!getenv("PDDE_JOB_SECRET") && !getenv("PDDE_JOB_SECRET_FILE")) {
            fprintf(stderr, "pdde-run: --join: set the job's secret (PDDE_JOB_SECRET or PDDE_JOB_SECRET_FILE)\n");
            return 2;
        }
        static char job_store[300];
        if (etcd) { /* (the membership in etcd; the worlds at the job's pdde-run's store) */
            if (find_world_store(rdzv_store, job, job_store, sizeof job_store)) return 2;
            store_addr = job_store;
        }
        setenv("PDDE_ELASTIC_JOIN", "1", 1);
        node_rank = 1, nnodes = 2; /* (connects to the job's store, hosts none) */
    }
    if (elastic) {
        if (!max_ranks) max_ranks = join ? 65536 : n * nnodes;
        if (!join && (min_ranks > max_ranks || n * nnodes < min_ranks || n * nnodes > max_ranks)) {
            fprintf(stderr, "pdde-run: --elastic: want --min %d <= ranks started %d <= --max %d\n", min_ranks, n * nnodes, max_ranks);
            return 2;
        }
        char v[64];
        setenv("PDDE_ELASTIC", "1", 1);
        setenv("PDDE_ELASTIC_JOB", job, 1);
        snprintf(v, sizeof v, "%d", min_ranks); setenv("PDDE_ELASTIC_MIN", v, 1);
        snprintf(v, sizeof v, "%d", max_ranks); setenv("PDDE_ELASTIC_MAX", v, 1);
        if (max_restarts != -2) { snprintf(v, sizeof v, "%d", max_restarts); setenv("PDDE_ELASTIC_MAX_RESTARTS", v, 1); }
        if (peer_timeout) setenv("PDDE_PEER_TIMEOUT", peer_timeout, 1);
    } else if (min_ranks != 1 || max_ranks || max_restarts != -2 || restarts) {
        fprintf(stderr, "pdde-run: --min, --max, --max-restarts and --restart are for --elastic jobs\n");
        return 2;
    }
    if (log_dir && mkdir(log_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "pdde-run: --log-dir %s: %s\n", log_dir, strerror(errno));
        return 2;
    }
    if (trace) setenv("PDDE_TRACE", trace, 1);

    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    /* the job secret: the user's (needed with several hosts: every node must know it) or a new one */
    if (!getenv("PDDE_JOB_SECRET") && !getenv("PDDE_JOB_SECRET_FILE")) {
        if (nnodes > 1) {
            fprintf(stderr, "pdde-run: with --nnodes > 1 every node needs the same job secret: set PDDE_JOB_SECRET_FILE "
                            "(a 0600 file on a shared home) or PDDE_JOB_SECRET\n");
            return 2;
        }
        char secret[80];
        if (pdde_job_secret_generate(ctx, secret, sizeof secret)) {
            fprintf(stderr, "pdde-run: %s\n", pdde_last_error(ctx));
            return 1;
        }
        setenv("PDDE_JOB_SECRET", secret, 1);
    }
    pdde_store_server *srv = NULL;
    char addr[300];
    if (node_rank == 0) {
        if (pdde_store_server_init(ctx, store_addr ? store_addr : "127.0.0.1:0", &srv)) {
            fprintf(stderr, "pdde-run: %s\n", pdde_last_error(ctx));
            return 1;
        }
        const char *colon = store_addr ? strrchr(store_addr, ':') : NULL;
        int hostlen = colon ? (int)(colon - store_addr) : 0;
        /* ranks here reach a wildcard listener through loopback */
        if (!store_addr || hostlen == 0 || !strncmp(store_addr, "0.0.0.0", 7))
            snprintf(addr, sizeof addr, "127.0.0.1:%d", pdde_store_server_port(srv));
        else
            snprintf(addr, sizeof addr, "%.*s:%d", hostlen, store_addr, pdde_store_server_port(srv));
    } else {
        snprintf(addr, sizeof addr, "%s", store_addr);
    }
    /* The run: with etcd a run id of node 0's, under which every member's keys go (etcd outlives a run, and
     * another run of the job's name must not read this one's notes); node 0 puts it in its store, and the
     * other nodes and joiners read it there. A joiner's job store answers now, or there is no job to join;
     * another node's store proves now that the secrets agree. */
    char run_id[64] = "";
    if (etcd && elastic && node_rank == 0) make_run_id(run_id, sizeof run_id);
    /* (a node waits for node 0's store as long as its ranks would: the communicator's 300 s to set up) */
    if (node_rank > 0 && check_job_store(ctx, addr, job, join ? 5 : 300, join, etcd && elastic ? run_id : NULL, sizeof run_id))
        return 2;
    char members[160]; /* the prefix of the members' keys, as theirs (core/elastic.c: the job's name cut at 100 bytes) */
    snprintf(members, sizeof members, "elastic/%.100s%s%.40s", job, run_id[0] ? "/" : "", run_id);
    if (run_id[0]) setenv("PDDE_ELASTIC_RUN", run_id, 1);
    if (join) { /* (the membership: in etcd, or in the job's store) */
        pdde_store *m = NULL;
        if (!(etcd ? connect_etcd(ctx, rdzv_store, 10, &m) : pdde_store_connect(ctx, addr, 5, &m))) say_if_full(m, members, job, n);
        pdde_store_close(m);
    }

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    child *ch = calloc((size_t)n, sizeof *ch);
    pdde_store *notes = NULL; /* --elastic: where pdde-run tells the ranks how one of them ended (a joiner's too) */
    pdde_status notes_st = elastic ? (etcd ? connect_etcd(ctx, rdzv_store, 30, &notes) : pdde_store_connect(ctx, addr, 30, &notes)) : PDDE_OK;
    if (notes_st) {
        fprintf(stderr, "pdde-run: --elastic: %s\n", pdde_last_error(ctx));
        return notes_st == PDDE_ERR_INVALID_ARG ? 2 : 1; /* (2: the command line's URL, as other bad arguments) */
    }
    /* The notes connection holds a lease (renewed below), which bounds the wait for each reply (twice
     * the lease, not 30 s): on a host cut off from the store pdde-run must not wait that long for every
     * note after its ranks stopped. Its notice (set if this pdde-run vanishes) is read by nobody. */
    const char *peer_env = getenv("PDDE_PEER_TIMEOUT"); /* (the ranks' peer timeout: --peer-timeout sets it) */
    double peer_timeout_s = peer_env && atof(peer_env) > 0 ? atof(peer_env) : 5;
    double notes_lease = peer_timeout_s, notes_ping = 0;
    int publish = etcd && notes && node_rank == 0; /* (then the lease also keeps the store's address in etcd) */
    if (publish) clear_dead_runs(ctx, notes, job); /* (before this run registers anything there) */
    for (int r = 0; r < n; r++) {
        ch[r].rank = node_rank * n + r;
        ch[r].id = join ? new_joiner_id(notes, members) : ch[r].rank;
        if (ch[r].id < 0) {
            fprintf(stderr, "pdde-run: --join: cannot take member ids from the job's counter %s/joined: %s\n", members, pdde_last_error(ctx));
            return 1;
        }
    }
    if (notes) {
        char key[300]; /* (a joiner's agent: its node number is no one's, its first rank's id is its own) */
        if (join) snprintf(key, sizeof key, "%s/agent/join%d", members, ch[0].id);
        else snprintf(key, sizeof key, "%s/agent/%d", members, node_rank);
        if (pdde_store_set_liveness(notes, key, "gone", 4, notes_lease)) notes_lease = 0;
        if (node_rank == 0) { /* (the members before the first change, for a joiner's pdde-run: say_if_full) */
            snprintf(key, sizeof key, "%s/started", members);
            char count[16];
            snprintf(count, sizeof count, "%d", n * nnodes);
            pdde_store_set(notes, key, count, strlen(count));
        }
    }
    if (run_id[0] && node_rank == 0) { /* (for the other nodes and joiners: check_job_store) */
        pdde_store *own = NULL;
        char key[300];
        snprintf(key, sizeof key, "elastic/%s/run", job);
        if (pdde_store_connect(ctx, addr, 30, &own) || pdde_store_set(own, key, run_id, strlen(run_id))) {
            fprintf(stderr, "pdde-run: cannot put the run id in this job's store at %s: %s\n", addr, pdde_last_error(ctx));
            return 1;
        }
        pdde_store_close(own);
    }
    if (publish && (!notes_lease || publish_world_store(notes, job, addr, run_id)))
        fprintf(stderr, "pdde-run: --rdzv etcd: cannot keep this job's store address in etcd (pdde-run --join will not find "
                "the job): %s\n", pdde_last_error(ctx));
    char v[64];
    setenv("PDDE_STORE_ADDR", addr, 1);
    snprintf(v, sizeof v, "%d", n * nnodes); setenv("PDDE_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", n); setenv("PDDE_LOCAL_SIZE", v, 1);
    /* each rank's share of the cores: 8 ranks must not each start a thread per core */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(v, sizeof v, "%ld", cores > n ? cores / n : 1);
    setenv("PDDE_NUM_THREADS", v, 0);
    setenv("OPENBLAS_NUM_THREADS", getenv("PDDE_NUM_THREADS"), 0);
    setenv("OMP_NUM_THREADS", getenv("PDDE_NUM_THREADS"), 0);
    fflush(NULL);
    for (int r = 0; r < n; r++)
        if (spawn_rank(ch, n, r, cmd, log_dir, bind, 0)) return 1;

    int running = n, failed = -1, forwarded = 0, stopped_rank = -1, finished_ok = 0, lost = 0;
    int departed = 0, departed_status = 0; /* --elastic: ranks that left at a step boundary (planned, or asked by a signal); the last one's exit status */
    int below_min = 0; /* --elastic: of them, those that stopped because departures would leave fewer than --min */
    char cause[700] = ""; /* the store's first recorded failure: when the first rank ended (--elastic: at the end) */
    double next_stop_check = 0;
    double stop_at = 0;     /* when to SIGKILL after a SIGTERM */
    double drain_until = 0; /* once every rank is gone: how long their leftovers may hold the pipes */
    struct pollfd pfd[2 * MAX_RANKS];
    for (;;) {
        int np = 0;
        for (int r = 0; r < n; r++)
            for (int s = 0; s < 2; s++)
                if (ch[r].fd[s] >= 0) pfd[np++] = (struct pollfd){ch[r].fd[s], POLLIN, 0};
        if (!running && !np) break;
        if (!running && !drain_until) drain_until = now_s() + 1.0;
        if (!running && now_s() > drain_until) {
            /* the ranks are gone and what they started still holds the pipes: stop listening */
            for (int r = 0; r < n; r++)
                for (int s = 0; s < 2; s++)
                    if (ch[r].fd[s] >= 0) close_stream(&ch[r], s);
            break;
        }
        poll(pfd, (nfds_t)np, 50);
        for (int r = 0; r < n; r++)
            for (int s = 0; s < 2; s++) {
                child *c = &ch[r];
                if (c->fd[s] < 0) continue;
                struct pollfd q = {c->fd[s], POLLIN, 0};
                if (poll(&q, 1, 0) <= 0) continue;
                char buf[65536];
                ssize_t k = read(c->fd[s], buf, sizeof buf);
                if (k > 0) emit(c, s, buf, (size_t)k, 0);
                else if (k == 0 || (errno != EINTR && errno != EAGAIN)) close_stream(c, s);
            }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int r = 0; r < n; r++) {
                if (ch[r].pid != pid) continue;
                ch[r].exited = 1; ch[r].status = status; running--;
                remove_shm_of(pid);
                int bad = !WIFEXITED(status) || WEXITSTATUS(status);
                if (elastic) {
                    char key[300], how[128];
                    if (WIFSIGNALED(status)) snprintf(how, sizeof how, "SIG%s", sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?");
                    else snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
                    int id = ch[r].id;
                    snprintf(key, sizeof key, "%s/exit/%d", members, id);
                    if (notes && id >= 0) pdde_store_set(notes, key, how, strlen(how));
                    /* a rank that left at a step boundary (core/elastic.c notes it under left/) departed: the
                     * others went on without a loss, whatever its exit status (128 + the signal it was asked by) */
                    void *note = NULL;
                    size_t note_len;
                    snprintf(key, sizeof key, "%s/left/%d", members, id);
                    int left = notes && id >= 0 && pdde_store_get(notes, key, &note, &note_len) == PDDE_OK;
                    int stopping = left && note_len == 9 && !memcmp(note, "below-min", 9); /* (all stop: too few would stay) */
                    below_min += stopping;
                    free(note);
                    if (left) {
                        departed++, departed_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                        if (bad) fprintf(stderr, "pdde-run: rank %d (pid %d) left the job at a step boundary (%s)%s\n", ch[r].rank, (int)pid,
                                         how, running && !stopping ? "; --elastic: the others go on" : "");
                    } else if (!bad) finished_ok++;
                    else if (!forwarded) { /* (once pdde-run forwarded a stop: that stop, no loss, no one goes on) */
                        lost++;
                        if (failed < 0) failed = r;
                        describe(&ch[r], how, sizeof how);
                        if (id >= 0 && id != ch[r].rank) fprintf(stderr, "pdde-run: rank %d (member %d, pid %d) %s; --elastic: the others go on\n", ch[r].rank, id, (int)pid, how);
                        else fprintf(stderr, "pdde-run: rank %d (pid %d) %s; --elastic: the others go on\n", ch[r].rank, (int)pid, how);
                        /* --restart: a rank killed by a signal (not by one pdde-run forwards) comes back as a
                         * joiner while others are still running to take it in */
                        if (restarts > 0 && WIFSIGNALED(status) && !got_signal && running > 0) {
                            restarts--;
                            drain_rank(&ch[r]);
                            if ((ch[r].id = new_joiner_id(notes, members)) < 0)
                                fprintf(stderr, "pdde-run: rank %d not restarted: cannot take a member id from the job's counter "
                                        "%s/joined: %s\n", ch[r].rank, members, pdde_last_error(ctx));
                            else if (spawn_rank(ch, n, r, cmd, log_dir, bind, 1) == 0) {
                                running++;
                                fprintf(stderr, "pdde-run: rank %d restarted (pid %d): it joins at the members' next step boundary\n",
                                        ch[r].rank, (int)ch[r].pid);
                            }
                        }
                    }
                    continue;
                }
                if (bad && failed < 0 && !got_signal) {
                    failed = r;
                    /* what the store had recorded when the first rank ended, before pdde-run stopped the others
                     * (their ends come later: none of them is the cause) */
                    pdde_store_server_first_failure(srv, cause, sizeof cause);
                    char how[128];
                    describe(&ch[r], how, sizeof how);
                    for (int k = 0; k < n && stopped_rank < 0; k++)
                        if (!ch[k].exited && proc_is_stopped(ch[k].pid)) stopped_rank = k;
                    fprintf(stderr, "pdde-run: rank %d (pid %d) %s; stopping the other ranks\n", ch[r].rank, (int)pid, how);
                }
            }
        }
        if (notes && notes_lease > 0 && now_s() > notes_ping) {
            /* (etcd ended the lease, this pdde-run having been starved or etcd down past it: a new one,
             * and the store's address on it again) */
            if (pdde_store_ping(notes) == PDDE_ERR_PEER_LOST && publish) {
                char key[300];
                snprintf(key, sizeof key, "%s/agent/%d", members, node_rank);
                if (!pdde_store_set_liveness(notes, key, "gone", 4, notes_lease)) publish_world_store(notes, job, addr, run_id);
            }
            notes_ping = now_s() + notes_lease / 4;
        }
        if (elastic && running && now_s() > next_stop_check) {
            /* A rank written off (rank_written_off) is noted once, "SIGSTOP": a world forming counts it
             * as ended, and the others' log line names the cause. If it continues it stays written off
             * (its lease ran out: it finds itself fenced). Ranks all written off with no one else left
             * would wait forever: they are killed. */
            int stuck = 0;
            double now = now_s();
            for (int r = 0; r < n; r++) {
                child *c = &ch[r];
                if (c->exited || !proc_is_stopped(c->pid)) {
                    c->stopped_since = 0;
                    continue;
                }
                if (!c->stopped_since) c->stopped_since = now;
                if (c->written_off) {
                    stuck++;
                    continue;
                }
                int id = c->id;
                if (rank_written_off(notes, members, id, now - c->stopped_since, peer_timeout_s)) {
                    c->written_off = 1;
                    char key[300];
                    snprintf(key, sizeof key, "%s/exit/%d", members, id);
                    void *old = NULL;
                    size_t ol;
                    if (notes && id >= 0 && pdde_store_get(notes, key, &old, &ol) != PDDE_OK) pdde_store_set(notes, key, "SIGSTOP", 7);
                    free(old);
                }
                stuck += c->written_off;
            }
            if (stuck == running && stuck && (finished_ok || lost || departed)) {
                fprintf(stderr, "pdde-run: --elastic: the %d rank%s left %s stopped and the others are gone: killing %s\n", stuck,
                        stuck > 1 ? "s" : "", stuck > 1 ? "are" : "is", stuck > 1 ? "them" : "it");
                for (int r = 0; r < n; r++) signal_rank(&ch[r], SIGKILL);
            }
            next_stop_check = now_s() + 0.1;
        }
        if (!elastic && (failed >= 0 || got_signal) && !forwarded) {
            int sig = got_signal ? got_signal : SIGTERM;
            for (int r = 0; r < n; r++) signal_rank(&ch[r], sig);
            forwarded = 1;
            stop_at = now_s() + grace;
        }
        if (elastic && got_signal && !forwarded) {
            int sig = got_signal ? got_signal : SIGTERM;
            for (int r = 0; r < n; r++) signal_rank(&ch[r], sig);
            forwarded = 1;
            stop_at = now_s() + grace;
        }
        if (forwarded && running && now_s() > stop_at) {
            for (int r = 0; r < n; r++) signal_rank(&ch[r], SIGKILL);
            stop_at = now_s() + 1e9;
        }
    }
    for (int r = 0; r < n; r++) kill(-ch[r].pid, SIGKILL); /* what the ranks left in their groups goes too */
    int rc = 0;
    /* An elastic job stopped by a signal to pdde-run: the stop ended it, not a loss it had gone on after */
    if (elastic && got_signal) failed = -1;
    if (elastic && !got_signal) {
        if (departed && !finished_ok && !lost) { /* every rank left (the whole job preempted), or too few would have stayed */
            if (below_min)
                fprintf(stderr, "pdde-run: --elastic: stopped cleanly at a step boundary: fewer than --min %d ranks would remain (exit status %d)\n",
                        min_ranks, departed_status);
            else
                fprintf(stderr, "pdde-run: --elastic: every rank left the job at a step boundary: it stopped cleanly (exit status %d)\n", departed_status);
            failed = -1, rc = departed_status;
        } else if (finished_ok >= min_ranks) {
            if (lost || departed) {
                fprintf(stderr, "pdde-run: --elastic: %d rank%s finished", finished_ok, finished_ok > 1 ? "s" : "");
                if (lost) fprintf(stderr, ", %d lost on the way", lost);
                if (departed) fprintf(stderr, "%s %d left at a step boundary", lost ? " and" : ",", departed);
                fprintf(stderr, "\n");
            }
            failed = -1;
        } else {
            fprintf(stderr, "pdde-run: --elastic: job failed: %d rank%s finished cleanly, fewer than --min %d\n", finished_ok,
                    finished_ok == 1 ? "" : "s", min_ranks);
            if (failed < 0) rc = 1;
        }
    }
    if (failed >= 0) {
        char how[128];
        describe(&ch[failed], how, sizeof how);
        if (elastic) pdde_store_server_first_failure(srv, cause, sizeof cause);
        int has_cause = cause[0] != 0, cause_rank = -1;
        /* a rank that quit with an error status of its own also drops its store connection, which the store records as
         * a death: then its own exit (and its message, above) is the cause, not that record */
        if (has_cause && sscanf(cause, "rank %d", &cause_rank) == 1)
            for (int r = 0; r < n; r++)
                if (ch[r].rank == cause_rank && ch[r].exited && WIFEXITED(ch[r].status) && WEXITSTATUS(ch[r].status)) has_cause = 0;
        if (has_cause)
            fprintf(stderr, "pdde-run: job failed: root cause: %s; first to exit: rank %d, which %s\n", cause,
                    ch[failed].rank, how);
        else if (stopped_rank >= 0)
            fprintf(stderr, "pdde-run: job failed: root cause: rank %d (pid %d) was stopped (SIGSTOP or a debugger) "
                    "and stopped answering; first to exit: rank %d, which %s\n", ch[stopped_rank].rank,
                    (int)ch[stopped_rank].pid, ch[failed].rank, how);
        else
            fprintf(stderr, "pdde-run: job failed: rank %d %s\n", ch[failed].rank, how);
        rc = WIFEXITED(ch[failed].status) ? WEXITSTATUS(ch[failed].status) : 128 + WTERMSIG(ch[failed].status);
    } else if (got_signal) {
        const char *name = sigabbrev_np(got_signal);
        fprintf(stderr, "pdde-run: stopped by SIG%s (signal %d)", name ? name : "?", (int)got_signal);
        if (elastic && lost) fprintf(stderr, "; before it, %d rank%s lost, which the job went on without", lost, lost > 1 ? "s" : "");
        fprintf(stderr, "\n");
        rc = 128 + got_signal;
    }
    if (trace) {
        int merged = merge_traces(trace, node_rank * n, n);
        if (merged < 0) fprintf(stderr, "pdde-run: --trace: cannot write %s: %s\n", trace, strerror(errno));
        else if (merged < n) fprintf(stderr, "pdde-run: --trace: %d of %d ranks wrote a trace (%s)\n", merged, n, trace);
    }
    for (int r = 0; r < n; r++) {
        free(ch[r].line[0]), free(ch[r].line[1]);
        if (ch[r].log) fclose(ch[r].log);
    }
    free(ch);
    if (publish && run_id[0]) { /* this run's keys: nobody reads them once its node 0 is done */
        char prefix[320];
        snprintf(prefix, sizeof prefix, "%s/", members);
        if (pdde_store_etcd_remove_prefix(notes, prefix))
            fprintf(stderr, "pdde-run: --rdzv etcd: cannot delete this run's keys (%s*) from etcd: %s\n", prefix, pdde_last_error(ctx));
    }
    pdde_store_close(notes);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return rc;
}
#endif
