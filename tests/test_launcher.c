/* test_launcher.c — starting jobs: pdde-run's --help and argument errors, its prompt exit after
 * SIGTERM while a rank's grandchild (in a session of its own) holds the output pipe, a summary that
 * blames a frozen (SIGSTOPped) rank rather than the rank that noticed, each rank's share of the cores;
 * and jobs with no glue: `mpirun -n 2` and a hand-made Slurm environment (one host, and two "hosts"
 * with the store on the first host of the node list) without PDDE_STORE_ADDR or a secret. */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIPPED: pdde was built without comm (no UCX)\n0 passed, 0 failed\n");
    return 0;
}
#else
#include "test_util.h"
#include "tools/proc_stat.h"
#include "job_util.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_dir[512], g_self[512], g_run[600]; /* this binary's folder, itself, pdde-run */

/* ---- the ranks ---- */

static int child_main(const char *mode) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    if (!strcmp(mode, "threads")) {
        printf("threads %d\n", pdde_context_thread_count(ctx));
        pdde_context_free(ctx);
        return 0;
    }
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    p.timeout_s = 20;
    p.peer_timeout_s = 1;
    pdde_comm *comm;
    pdde_status st = pdde_comm_init(ctx, &p, &comm);
    if (st) { fprintf(stderr, "init: %s\n", pdde_last_error(ctx)); pdde_context_free(ctx); return 3; }
    int me = pdde_comm_rank(comm);
    int32_t v = me + 1;
    st = pdde_comm_allreduce(comm, &v, &v, 1, PDDE_I32, PDDE_REDUCE_SUM);
    printf("rank %d sum %d\n", me, v);
    fflush(stdout);
    if (!strcmp(mode, "freeze")) {
        if (me == 1) raise(SIGSTOP); /* frozen: alive, silent */
        double t0 = test_now();
        while (!st && test_now() - t0 < 20) st = pdde_comm_allreduce(comm, &v, &v, 1, PDDE_I32, PDDE_REDUCE_SUM);
        fprintf(stderr, "rank %d: %s\n", me, st ? pdde_last_error(ctx) : "no failure seen");
        st = st ? st : PDDE_ERR_STATE;
    }
    pdde_comm_free(comm);
    pdde_context_free(ctx);
    return st ? 1 : 0;
}

/* ---- running a command and collecting its output (job_util.h) ---- */

/* Reads the job's output until it ends (killed after limit_s): its exit code (-1 killed or signalled),
 * its output in out (cut at cap) and how long it ran in *dt. */
static int finish(job *j, char *out, size_t cap, double limit_s, double *dt) {
    int rc = job_finish(j, limit_s);
    snprintf(out, cap, "%s", job_text(j));
    *dt = job_now() - j->t0;
    free(j->out);
    return rc;
}

static int run(char *const *argv, const char *const *env, char *out, size_t cap, double limit_s, double *dt) {
    job j = job_spawn(argv, env);
    return finish(&j, out, cap, limit_s, dt);
}

/* ---- pdde-run ---- */

static void test_pdde_run_args(void) {
    char out[8192];
    double dt;
    char *help[] = {g_run, "--help", NULL};
    int rc = run(help, (const char *const[]){NULL}, out, sizeof out, 10, &dt);
    CHECK(rc == 0 && strstr(out, "usage: pdde-run"), "--help exits 0: rc %d\n%s", rc, out);
    /* stdout only: run it again with stderr closed off */
    int fds[2];
    if (!pipe(fds)) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fds[1], 1);
            int nul = open("/dev/null", O_WRONLY);
            dup2(nul, 2);
            execv(g_run, help);
            _exit(127);
        }
        close(fds[1]);
        ssize_t r = read(fds[0], out, sizeof out - 1);
        out[r > 0 ? r : 0] = 0;
        close(fds[0]);
        waitpid(pid, NULL, 0);
        CHECK(strstr(out, "usage: pdde-run") != NULL, "--help goes to stdout");
    }
    struct { char *args[4]; const char *names; } bad[] = {
        {{"-n", "abc", "true", NULL}, "-n"},
        {{"-n", "0", "true", NULL}, "-n"},
        {{"--bogus", "1", "true", NULL}, "--bogus"},
        {{"-n", "2", "--grace", NULL}, "--grace"},
        {{"-n", "1", "--nnodes", "x"}, "--nnodes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *argv[6] = {g_run};
        for (int k = 0; k < 4; k++) argv[1 + k] = bad[i].args[k];
        rc = run(argv, NULL, out, sizeof out, 10, &dt);
        CHECK(rc == 2 && strstr(out, bad[i].names), "bad argument %s: rc %d, message: %s", bad[i].names, rc, out);
    }
    char *one_rank[] = {g_run, "-n", "1", "true", NULL};
    rc = run(one_rank, (const char *const[]){"PDDE_NUM_THREADS=abc", NULL}, out, sizeof out, 10, &dt);
    CHECK(rc == 2 && strstr(out, "PDDE_NUM_THREADS 'abc'"), "a bad PDDE_NUM_THREADS: rc %d, message: %s", rc, out);
}

/* What pdde-run reads of a rank (tools/proc_stat.h), on a child whose command name holds ") R (", as
 * a program's name may: stopped by SIGSTOP it is stopped, continued it is not, killed (a zombie until
 * reaped) it is no longer running, reaped it is gone. */
static void test_proc_stat(void) {
    int ready[2];
    if (pipe(ready)) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_NAME, "rank) R (0");
        if (write(ready[1], "x", 1) != 1) _exit(1);
        for (;;) pause();
    }
    char x;
    close(ready[1]);
    if (read(ready[0], &x, 1) != 1) { CHECK(0, "the child did not start"); close(ready[0]); return; }
    close(ready[0]);
    int stopped = 0, dead = 0;
    proc_stat ps = {0, 0};
    kill(pid, SIGSTOP);
    for (double t0 = test_now(); !stopped && test_now() - t0 < 5; usleep(2000)) stopped = proc_is_stopped(pid);
    CHECK(stopped && proc_is_running(pid), "a stopped child is stopped (%d) and still running (%d)", stopped, proc_is_running(pid));
    kill(pid, SIGCONT);
    for (double t0 = test_now(); stopped && test_now() - t0 < 5; usleep(2000)) stopped = proc_is_stopped(pid);
    CHECK(!stopped && proc_is_running(pid), "a continued child is not stopped (%d) and runs (%d)", stopped, proc_is_running(pid));
    kill(pid, SIGKILL);
    for (double t0 = test_now(); !dead && test_now() - t0 < 5; usleep(2000)) dead = !proc_is_running(pid);
    CHECK(dead && proc_stat_read(pid, &ps) == 0 && ps.state == 'Z', "a killed child, not yet reaped, is a zombie: state %c", ps.state);
    waitpid(pid, NULL, 0);
    CHECK(proc_stat_read(pid, &ps) == -1, "a reaped child has no /proc entry");
}

static void test_pdde_run_grandchild(void) {
    char out[8192], pidfile[600], groupfile[700], script[2000];
    double dt;
    snprintf(pidfile, sizeof pidfile, "%s/test_launcher.grandchild.%d", g_dir, (int)getpid());
    snprintf(groupfile, sizeof groupfile, "%s.group", pidfile);
    unlink(pidfile);
    unlink(groupfile);
    /* the rank starts two grandchildren that hold its output pipe: one in its process group, one in a
     * session of its own (out of reach of any group signal), then waits */
    snprintf(script, sizeof script,
             "sleep 60 & echo $! > %s; setsid sh -c 'echo $$ > %s; exec sleep 60' & echo started; exec sleep 60",
             groupfile, pidfile);
    char *argv[] = {g_run, "-n", "2", "--grace", "1", "sh", "-c", script, NULL};
    job p = job_spawn(argv, NULL);
    for (double t0 = test_now(); test_now() - t0 < 10 && access(pidfile, F_OK);) usleep(20000);
    usleep(200000);
    double t_sig = test_now();
    kill(p.pid, SIGTERM);
    int rc = finish(&p, out, sizeof out, 20, &dt);
    double took = test_now() - t_sig;
    CHECK(rc == 128 + SIGTERM && took < 4, "pdde-run exits promptly after SIGTERM with a grandchild holding the pipe: "
          "rc %d after %.1f s\n%s", rc, took, out);
    int gpid[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(k ? pidfile : groupfile, "r");
        if (f) { if (fscanf(f, "%d", &gpid[k]) != 1) gpid[k] = 0; fclose(f); }
    }
    int alive = 1;
    for (double t0 = test_now(); alive && test_now() - t0 < 2; usleep(20000)) alive = gpid[0] > 0 && proc_is_running(gpid[0]);
    CHECK(gpid[0] > 0 && !alive, "the grandchild in the rank's process group was stopped with it (pid %d)", gpid[0]);
    for (int k = 0; k < 2; k++)
        if (gpid[k] > 0) kill(gpid[k], SIGKILL);
    unlink(pidfile);
    unlink(groupfile);
}

static void test_pdde_run_frozen(void) {
    char out[16384];
    double dt;
    char *argv[] = {g_run, "-n", "2", "--grace", "1", g_self, "--child", "freeze", NULL};
    int rc = run(argv, NULL, out, sizeof out, 40, &dt);
    char *cause = strstr(out, "root cause:");
    char *end = cause ? strstr(cause, "; first to exit") : NULL;
    if (end) *end = 0;
    CHECK(rc != 0 && cause && strstr(cause, "rank 1"), "the summary blames the frozen rank 1 (rc %d, %.1f s):\n%s", rc,
          dt, cause ? cause : out);
}

static void test_pdde_run_threads(void) {
    char out[8192];
    double dt;
    char *argv[] = {g_run, "-n", "2", g_self, "--child", "threads", NULL};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char want[64];
    snprintf(want, sizeof want, "threads %ld\n", cores >= 2 ? cores / 2 : 1);
    int rc = run(argv, (const char *const[]){"PDDE_NUM_THREADS", NULL}, out, sizeof out, 20, &dt);
    CHECK(rc == 0 && strstr(out, want), "each of 2 ranks gets half the %ld cores (want '%.20s'):\n%s", cores, want, out);
}

/* A rank killed before its shared-memory segments were unlinked (comm/shm.c names them /pdde-<pid>-<n>)
 * leaves them in /dev/shm: pdde-run removes a rank's when it ends, however it ended. Each rank here makes
 * one and ends without removing it, as a rank killed in that window would. */
static void test_pdde_run_shm_cleanup(void) {
    char out[8192];
    double dt;
    char *argv[] = {g_run, "-n", "2", "sh", "-c", "touch /dev/shm/pdde-$$-7 && echo made /dev/shm/pdde-$$-7", NULL};
    run(argv, NULL, out, sizeof out, 20, &dt);
    int made = 0, left = 0;
    for (const char *p = strstr(out, "made "); p; p = strstr(p + 1, "made ")) {
        char path[64];
        if (sscanf(p, "made %63s", path) == 1) made++, left += access(path, F_OK) == 0;
    }
    CHECK(made == 2 && left == 0, "the segments 2 ranks left are gone after the job (made %d, left %d):\n%s", made, left, out);
}

/* A launcher killed by SIGKILL (no handler of its own runs) takes its ranks with it: an orphaned rank would
 * train on, holding its peers (here: one rank sleeping 60 s; gone within 5 s of the kill) */
static void test_pdde_run_killed_launcher(void) {
    char *argv[] = {g_run, "-n", "1", "sleep", "60", NULL};
    job j = job_spawn(argv, NULL);
    pid_t rank[1] = {0};
    for (double t0 = test_now(); !rank[0] && test_now() - t0 < 10;) {
        job_ranks(j.pid, rank, 1);
        if (!rank[0]) usleep(20000);
    }
    kill(j.pid, SIGKILL);
    double t_kill = test_now();
    while (rank[0] && proc_is_running(rank[0]) && test_now() - t_kill < 5) usleep(20000);
    int orphan = rank[0] && proc_is_running(rank[0]);
    CHECK(rank[0] && !orphan, "the rank (pid %d) ends with its launcher: %s after %.1f s", (int)rank[0], orphan ? "still running" : "gone",
          test_now() - t_kill);
    if (orphan) kill(rank[0], SIGKILL);
    job_finish(&j, 10);
    free(j.out);
}

/* ---- launchers without glue ---- */

static const char *const NO_GLUE[] = {"PDDE_STORE_ADDR", "PDDE_JOB_SECRET", "PDDE_JOB_SECRET_FILE", "PDDE_RANK",
                                      "PDDE_WORLD_SIZE", "PDDE_LOCAL_RANK", "PDDE_STORE_PORT", NULL};

static void test_mpirun(void) {
    if (system("command -v mpirun >/dev/null 2>&1")) {
        printf("SKIPPED: mpirun not found\n");
        return;
    }
    char out[16384];
    double dt;
    char *argv[] = {"mpirun", "--oversubscribe", "-n", "2", g_self, "--child", "ok", NULL, NULL};
    if (geteuid() == 0) { /* mpirun refuses root without it */
        memmove(argv + 2, argv + 1, 7 * sizeof *argv);
        argv[1] = "--allow-run-as-root";
    }
    int rc = run(argv, NO_GLUE, out, sizeof out, 60, &dt);
    CHECK(rc == 0 && strstr(out, "rank 0 sum 3") && strstr(out, "rank 1 sum 3"),
          "mpirun -n 2 without PDDE_STORE_ADDR or a secret: rc %d (%.1f s)\n%s", rc, dt, out);
}

/* Two ranks with the variables srun gives them (and nothing of pdde's). */
static void test_slurm(const char *nodes, const char *nodelist, const char *job_id) {
    char dir[700], out[2][8192], env[10][800];
    double dt;
    snprintf(dir, sizeof dir, "%s/test_launcher.secrets.%d", g_dir, (int)getpid());
    mkdir(dir, 0700);
    job p[2];
    for (int r = 0; r < 2; r++) {
        snprintf(env[0], sizeof env[0], "SLURM_PROCID=%d", r);
        snprintf(env[1], sizeof env[1], "SLURM_LOCALID=%d", r);
        snprintf(env[2], sizeof env[2], "SLURM_NTASKS=2");
        snprintf(env[3], sizeof env[3], "SLURM_JOB_ID=%s", job_id);
        snprintf(env[4], sizeof env[4], "SLURM_STEP_ID=0");
        snprintf(env[5], sizeof env[5], "SLURM_NNODES=%s", nodes);
        snprintf(env[6], sizeof env[6], "SLURM_JOB_NODELIST=%s", nodelist);
        snprintf(env[7], sizeof env[7], "PDDE_SECRET_DIR=%s", dir);
        const char *e[20];
        int k = 0;
        for (int i = 0; i < 8; i++) e[k++] = env[i];
        for (int i = 0; NO_GLUE[i]; i++) e[k++] = NO_GLUE[i];
        e[k++] = "OMPI_COMM_WORLD_RANK";
        e[k++] = "OMPI_COMM_WORLD_SIZE";
        e[k] = NULL;
        char *argv[] = {g_self, "--child", "ok", NULL};
        p[r] = job_spawn(argv, e);
    }
    int rc[2];
    for (int r = 0; r < 2; r++) rc[r] = finish(&p[r], out[r], sizeof out[r], 40, &dt);
    CHECK(rc[0] == 0 && rc[1] == 0 && strstr(out[0], "rank 0 sum 3") && strstr(out[1], "rank 1 sum 3"),
          "Slurm environment (%s nodes, %s) without PDDE_STORE_ADDR: rc %d %d\n%s\n%s", nodes, nodelist, rc[0], rc[1],
          out[0], out[1]);
    DIR *d = opendir(dir);
    int left = 0;
    for (struct dirent *de; d && (de = readdir(d));) left += de->d_name[0] != '.';
    if (d) closedir(d);
    CHECK(left == 0, "rank 0 removed the secret file it made (%d left in %s)", left, dir);
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child_main(argv[2]);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    setenv("PDDE_BACKENDS", "cpu", 0);
    if (!realpath(argv[0], g_self)) snprintf(g_self, sizeof g_self, "%s", argv[0]);
    test_binary_dir(g_self, g_dir, sizeof g_dir);
    snprintf(g_run, sizeof g_run, "%.500s/pdde-run", g_dir);
    test_proc_stat();
    test_pdde_run_args();
    test_pdde_run_threads();
    test_pdde_run_grandchild();
    test_pdde_run_frozen();
    test_pdde_run_shm_cleanup();
    test_pdde_run_killed_launcher();
    test_mpirun();
    char job_id[64];
    snprintf(job_id, sizeof job_id, "%d", 100000 + (int)getpid());
    test_slurm("1", "vm", job_id);
    snprintf(job_id, sizeof job_id, "%d", 200000 + (int)getpid());
    test_slurm("2", "127.0.0.[1-4],node9", job_id); /* two hosts: the store on the first, open to the network */
    return test_finish();
}
#endif
