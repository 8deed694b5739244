/* test_checkpoint_shard — sharded checkpoints, with real rank processes under build/pdde-run:
 *  - saved under dp=4 and loaded under tp=2 x pp=2, and saved under ZeRO-3 (2 ranks) and loaded by one
 *    process: every parameter and optimizer state tensor, read whole afterwards (gathered by the
 *    single-file save, code of its own), is bit-identical to the one saved; the loading runs start
 *    from another seed, and the step and data position come back;
 *  - the sharded save of a tp=2 x pp=2 session, converted to one file, equals its gathered single file
 *    (each rank's blocks are where they belong);
 *  - a shard writer killed with SIGKILL half-way through its file, and rank 0 killed with the manifest
 *    written but not renamed: the previous checkpoint verifies and loads, bit-identical to what it
 *    was; the next save then succeeds and removes the dead save's files;
 *  - a flipped byte in a shard and a missing shard file are refused, naming the file and the tensor,
 *    by a load (on every rank of a 2-rank load: none loads anything) and by pdde_checkpoint_verify.
 * The kills use PDDE_CHECKPOINT_PAUSE, a pause point the test sets in the ranks' environment. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 8};
static char g_self[512], g_run[600], g_ckpt_tool[600], g_tmp[256];

static void batch(int64_t step, int32_t *x, int32_t *y) {
    for (int i = 0; i < cfg.batch * cfg.ctx; i++) x[i] = (int)((i * 7 + step * 13 + i / 5) % cfg.vocab), y[i] = (int)((i * 3 + step * 5 + 1) % cfg.vocab);
}

/* ---- a rank: worker PLAN SEED STEPS [dir=D every=K] [file=F at=K] [load=D] [expect=STEP,POS] [fail=TEXT] ---- */

/* Restores s from the snapshots whose bytes are in files (comma-separated list). */
static pdde_status restore_from(pdde_context *ctx, pdde_session *s, const char *files, pdde_checkpoint_extra *ex) {
    pdde_snapshot *set[8];
    int n = 0;
    pdde_status st = PDDE_OK;
    for (const char *f = files; *f && n < 8 && !st;) {
        size_t len = strcspn(f, ",");
        char path[600];
        snprintf(path, sizeof path, "%.*s", (int)len, f);
        f += len + (f[len] == ',');
        FILE *fp = fopen(path, "rb");
        long size = -1;
        if (fp && fseek(fp, 0, SEEK_END) == 0) size = ftell(fp), rewind(fp);
        char *buf = size > 0 ? malloc((size_t)size) : NULL;
        if (!buf || fread(buf, 1, (size_t)size, fp) != (size_t)size) st = PDDE_ERR_IO, fprintf(stderr, "worker: cannot read %s\n", path);
        if (fp) fclose(fp);
        if (!st) st = pdde_snapshot_from_data(ctx, buf, (size_t)size, &set[n]);
        if (!st) n++;
        free(buf);
    }
    if (!st) st = pdde_snapshot_restore(s, (const pdde_snapshot *const *)set, n, ex);
    for (int i = 0; i < n; i++) pdde_snapshot_free(set[i]);
    return st;
}

static int worker(int argc, char **argv) {
    const char *plan_text = argv[2], *dir = NULL, *file = NULL, *load = NULL, *fail = NULL, *snap = NULL, *restore = NULL;
    uint64_t seed = strtoull(argv[3], NULL, 10);
    long steps = strtol(argv[4], NULL, 10), every = 0, at = -1, expect_step = -1, expect_pos = -1;
    for (int i = 5; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "dir=", 4)) dir = a + 4;
        else if (!strncmp(a, "every=", 6)) every = strtol(a + 6, NULL, 10);
        else if (!strncmp(a, "file=", 5)) file = a + 5;
        else if (!strncmp(a, "at=", 3)) at = strtol(a + 3, NULL, 10);
        else if (!strncmp(a, "load=", 5)) load = a + 5;
        else if (!strncmp(a, "fail=", 5)) fail = a + 5;
        else if (!strncmp(a, "expect=", 7)) sscanf(a + 7, "%ld,%ld", &expect_step, &expect_pos);
        else if (!strncmp(a, "snap=", 5)) snap = a + 5;
        else if (!strncmp(a, "restore=", 8)) restore = a + 8;
    }
    pdde_plan parsed;
    if (pdde_plan_parse(plan_text, &parsed)) { fprintf(stderr, "worker: plan %s: %s\n", plan_text, parsed.why); return 2; }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1, cp.seed = seed;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 2;
    pdde_comm *comm = NULL;
    int ranks = parsed.dp * parsed.tp * parsed.pp, rank = 0;
    int rc = 1; /* (every way out frees what it made: the sanitizers' leak check runs the ranks too) */
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    int32_t *x = NULL, *y = NULL;
#define W(call)                                                                                     \
    do {                                                                                            \
        pdde_status st_ = (call);                                                                   \
        if (st_) { fprintf(stderr, "worker: %s: %s\n", #call, pdde_last_error(ctx)); goto out; } \
    } while (0)
    if (ranks > 1) {
        pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
        p.timeout_s = 30, p.peer_timeout_s = 2;
        W(pdde_comm_init(ctx, &p, &comm));
        rank = pdde_comm_rank(comm);
    }
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f;
    gpt_plan gp = gpt_plan_of(&parsed);
    W(pdde_graph_init(ctx, &g));
    W(gpt_build_plan(g, &cfg, &gp, &op, &m));
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    W(pdde_session_init(g, &sp, &s));
    if (load || restore) {
        pdde_checkpoint_extra ex = {0};
        pdde_status st = load ? pdde_checkpoint_load(s, load, &ex) : restore_from(ctx, s, restore, &ex);
        if (fail) { /* the load must fail, saying so */
            int ok = 0; /* fail=A|B: the message holds A or B */
            for (const char *f = fail; st != PDDE_OK && *f && !ok;) {
                size_t len = strcspn(f, "|");
                char part[400];
                snprintf(part, sizeof part, "%.*s", (int)len, f);
                ok = strstr(pdde_last_error(ctx), part) != NULL;
                f += len + (f[len] == '|');
            }
            printf("load refused: %s: %s\n", pdde_status_str(st), st ? pdde_last_error(ctx) : "(it loaded)");
            printf("refusal %s\n", ok ? "as expected" : "NOT AS EXPECTED");
            rc = !ok;
            goto out;
        }
        W(st);
        if (pdde_session_step(s) != expect_step || (long)ex.data_position != expect_pos) {
            fprintf(stderr, "worker: loaded step %lld, data position %llu; want %ld, %ld\n", (long long)pdde_session_step(s),
                    (unsigned long long)ex.data_position, expect_step, expect_pos);
            goto out;
        }
    }
    size_t bt = (size_t)cfg.batch * cfg.ctx;
    x = malloc(bt * sizeof *x), y = malloc(bt * sizeof *y);
    for (int64_t step = pdde_session_step(s); step < steps; step++) {
        batch(step, x, y);
        W(gpt_write_batch(s, &m, &gp, rank / (parsed.tp * parsed.pp), x, y));
        W(pdde_session_run(s, PDDE_RUN_STEP));
        pdde_checkpoint_extra ex = {.data_position = 1000 + 8 * (uint64_t)(step + 1)};
        if (dir && every && (step + 1) % every == 0) W(pdde_checkpoint_save(s, dir, &ex));
        if (file && step + 1 == at) W(pdde_checkpoint_save(s, file, &ex));
    }
    if (snap) { /* a snapshot with replicas, its bytes kept in a file (as a peer would keep them) */
        pdde_snapshot_params spp = PDDE_SNAPSHOT_PARAMS_INIT;
        spp.replicas = 1;
        pdde_checkpoint_extra ex = {.data_position = 1000 + 8 * (uint64_t)steps};
        pdde_snapshot *sn;
        W(pdde_snapshot_take(s, &spp, &ex, &sn));
        char fp[600];
        size_t n;
        const void *bytes = pdde_snapshot_data(sn, &n);
        snprintf(fp, sizeof fp, "%s/r%d.bin", snap, rank);
        FILE *f = fopen(fp, "wb");
        bool ok = f && fwrite(bytes, 1, n, f) == n;
        if (f && fclose(f)) ok = false;
        pdde_snapshot_free(sn);
        if (!ok) { fprintf(stderr, "worker: cannot write %s\n", fp); goto out; }
    }
    if ((load || restore) && steps == expect_step) { /* nothing trained: it saves what it loaded */
        pdde_checkpoint_extra ex = {.data_position = (uint64_t)expect_pos};
        if (file) W(pdde_checkpoint_save(s, file, &ex));
        if (dir) W(pdde_checkpoint_save(s, dir, &ex));
    }
    if (rank == 0) printf("worker %s: done at step %lld\n", plan_text, (long long)pdde_session_step(s));
    rc = 0;
out:
    free(x), free(y);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_comm_free(comm);
    pdde_context_free(ctx);
    return rc;
}

/* ---- the driver ---- */

typedef struct {
    pid_t pid;
    int fd;
    double t0;
    char out[1 << 16];
    size_t n;
} proc;

static void start(proc *p, char *const *argv, const char *env) {
    int fds[2];
    p->pid = -1, p->fd = -1, p->t0 = test_now(), p->n = 0, p->out[0] = 0;
    if (pipe(fds)) return;
    fflush(NULL);
    p->pid = fork();
    if (p->pid == 0) {
        if (env) putenv((char *)env);
        dup2(fds[1], 1), dup2(fds[1], 2);
        close(fds[0]), close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    p->fd = fds[0];
}

/* Reads output for up to wait_s (or until the process ends: then its exit code, else -2). */
static int pump(proc *p, double wait_s) {
    double until = test_now() + wait_s;
    int status;
    for (;;) {
        struct pollfd q = {p->fd, POLLIN, 0};
        if (p->fd >= 0 && poll(&q, 1, 20) == 1) {
            char buf[4096];
            ssize_t r = read(p->fd, buf, sizeof buf);
            if (r <= 0) close(p->fd), p->fd = -1;
            for (ssize_t i = 0; i < r && p->n + 1 < sizeof p->out; i++) p->out[p->n++] = buf[i];
            p->out[p->n] = 0;
        } else if (p->fd < 0) {
            usleep(10000);
        }
        if (p->fd < 0 && waitpid(p->pid, &status, WNOHANG) == p->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (test_now() > until) return -2;
    }
}

static int run_job(proc *p, int n, char *const *args, const char *env, double limit_s) {
    char *argv[32], ns[8];
    int k = 0;
    snprintf(ns, sizeof ns, "%d", n);
    argv[k++] = g_run, argv[k++] = "-n", argv[k++] = ns, argv[k++] = g_self, argv[k++] = "worker";
    for (int i = 0; args[i] && k < 31; i++) argv[k++] = args[i];
    argv[k] = NULL;
    start(p, argv, env);
    limit_s *= test_load_factor(); /* (a job of 4 ranks on a loaded machine takes longer; a hang still ends) */
    int rc = pump(p, limit_s);
    if (rc == -2) kill(p->pid, SIGKILL), waitpid(p->pid, NULL, 0), fprintf(stderr, "job timed out after %.0f s:\n%s\n", limit_s, p->out);
    if (rc) fprintf(stderr, "job exit %d:\n%s\n", rc, p->out);
    return rc;
}

static int tool(const char *a, const char *b, const char *c, char *out, size_t cap) {
    char *argv[] = {g_ckpt_tool, (char *)a, (char *)b, (char *)c, NULL};
    proc *p = malloc(sizeof *p);
    start(p, argv, NULL);
    int rc = pump(p, 30);
    size_t n = p->n < cap - 1 ? p->n : cap - 1;
    memcpy(out, p->out, n), out[n] = 0;
    free(p);
    return rc;
}

static void path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_tmp, name); }

/* pdde-ckpt diff a b: the same tensors bit for bit, step and data position */
static void check_identical(const char *a, const char *b, const char *what) {
    char out[4096];
    int rc = tool("diff", a, b, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "identical:"), "%s: %s and %s: %s", what, a, b, out);
    if (rc == 0) printf("ok: %s: %s", what, out);
}

static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

/* The first block line of a manifest: its file's name and the block's offset. */
static int first_block(const char *dir, int file, char *name, size_t n, unsigned long long *offset) {
    char mp[600], line[1024], want[32];
    snprintf(mp, sizeof mp, "%s/manifest", dir);
    FILE *f = fopen(mp, "r");
    int found = 0;
    snprintf(want, sizeof want, "file %d ", file);
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, want, strlen(want))) sscanf(line + strlen(want), "%255s", name);
        int ti, fi;
        if (!found && sscanf(line, "block %d %d %llu", &ti, &fi, offset) == 3 && fi == file) found = 1;
    }
    if (f) fclose(f);
    (void)n;
    return found ? 0 : -1;
}

static void flip_byte(const char *file, unsigned long long at) {
    FILE *f = fopen(file, "r+b");
    int c = -1;
    if (f && fseek(f, (long)at, SEEK_SET) == 0) c = fgetc(f);
    if (c >= 0 && fseek(f, (long)at, SEEK_SET) == 0) fputc(c ^ 0x40, f);
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "worker")) return worker(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    char *slash = strrchr(argv[0], '/');
    int dn = slash ? (int)(slash - argv[0]) : 1;
    snprintf(g_self, sizeof g_self, "%s", argv[0]);
    snprintf(g_run, sizeof g_run, "%.*s/pdde-run", dn, slash ? argv[0] : ".");
    snprintf(g_ckpt_tool, sizeof g_ckpt_tool, "%.*s/pdde-ckpt", dn, slash ? argv[0] : ".");
    if (access(g_run, X_OK) != 0 || access(g_ckpt_tool, X_OK) != 0) {
        test_skip("ucx", "%s or %s not built (this build has no UCX)", g_run, g_ckpt_tool);
        return test_finish();
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/pdde-test-ckshard.XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char A[300], Afile[300], B[300], Bfile[300], C[300], Cfile[300], Dfile[300], K[300], Kfile[300], out[8192];
    path(A, sizeof A, "dp4/"), path(Afile, sizeof Afile, "dp4.ckpt"), path(B, sizeof B, "tp2pp2/"), path(Bfile, sizeof Bfile, "tp2pp2.ckpt");
    path(C, sizeof C, "zero3/"), path(Cfile, sizeof Cfile, "zero3.ckpt"), path(Dfile, sizeof Dfile, "dp1.ckpt");
    path(K, sizeof K, "kill/"), path(Kfile, sizeof Kfile, "kill-step2.ckpt");
    static proc p;
    double t0 = test_now();

    /* dp=4 -> tp=2 x pp=2 */
    char *save_dp4[] = {"dp=4", "1", "3", "dir=", "every=3", "file=", "at=3", NULL};
    char dirarg[400], filearg[400], loadarg[400];
    snprintf(dirarg, sizeof dirarg, "dir=%s", A), snprintf(filearg, sizeof filearg, "file=%s", Afile);
    save_dp4[3] = dirarg, save_dp4[5] = filearg;
    CHECK(run_job(&p, 4, save_dp4, NULL, 60) == 0, "dp=4 trains 3 steps and saves");
    CHECK(count_files(A, "s1-r") == 1, "under dp=4 every tensor is replicated: rank 0 alone writes a shard (%d files)", count_files(A, "s1-r"));
    check_identical(A, Afile, "dp=4: the sharded checkpoint holds what the gathered single file does");
    snprintf(dirarg, sizeof dirarg, "dir=%s", B), snprintf(filearg, sizeof filearg, "file=%s", Bfile), snprintf(loadarg, sizeof loadarg, "load=%s", A);
    char *load_tp[] = {"tp=2,pp=2", "77", "3", loadarg, "expect=3,1024", dirarg, filearg, NULL};
    CHECK(run_job(&p, 4, load_tp, NULL, 60) == 0, "tp=2 x pp=2 (seed 77) loads the dp=4 checkpoint: step 3, data position 1024");
    check_identical(Afile, Bfile, "dp=4 -> tp=2 x pp=2: every tensor read whole after the load");
    check_identical(B, Bfile, "tp=2 x pp=2: its sharded save equals its gathered single file");
    CHECK(count_files(B, "s1-r") == 4, "tp=2 x pp=2: each of the 4 ranks writes the blocks it alone holds (%d files)", count_files(B, "s1-r"));
    CHECK(tool("verify", B, NULL, out, sizeof out) == 0, "pdde-ckpt verify %s: %s", B, out);

    /* ZeRO-3 on 2 ranks -> one process */
    snprintf(dirarg, sizeof dirarg, "dir=%s", C), snprintf(filearg, sizeof filearg, "file=%s", Cfile);
    char *save_z3[] = {"dp=2,zero=3", "1", "3", dirarg, "every=3", filearg, "at=3", NULL};
    CHECK(run_job(&p, 2, save_z3, NULL, 60) == 0, "dp=2 ZeRO-3 trains 3 steps and saves");
    CHECK(count_files(C, "s1-r") == 2, "ZeRO-3: both ranks write their shards (%d files)", count_files(C, "s1-r"));
    check_identical(C, Cfile, "ZeRO-3: the sharded checkpoint holds what the gathered single file does");
    snprintf(loadarg, sizeof loadarg, "load=%s", C), snprintf(filearg, sizeof filearg, "file=%s", Dfile);
    char *load_dp1[] = {"dp=1", "99", "3", loadarg, "expect=3,1024", filearg, NULL};
    CHECK(run_job(&p, 1, load_dp1, NULL, 60) == 0, "one process (seed 99) loads the ZeRO-3 checkpoint");
    check_identical(Cfile, Dfile, "ZeRO-3 -> dp=1: every tensor after the load");

    /* kills: a shard writer half-way, then rank 0 before the manifest's rename (ZeRO-1: both ranks
     * write shards); each job saves at steps 2 and 4, the single file at step 2 */
    snprintf(dirarg, sizeof dirarg, "dir=%s", K), snprintf(filearg, sizeof filearg, "file=%s", Kfile);
    const char *pauses[2] = {"PDDE_CHECKPOINT_PAUSE=shard:1:2", "PDDE_CHECKPOINT_PAUSE=manifest:2"};
    const char *who[2] = {"rank 1 killed half-way through its shard", "rank 0 killed before renaming the manifest"};
    for (int k = 0; k < 2; k++) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s %s", K, Kfile);
        if (system(cmd)) {}
        char *job[] = {"dp=2,zero=1", "5", "4", dirarg, "every=2", filearg, "at=2", NULL};
        char *argv2[16] = {g_run, "-n", "2", g_self, "worker"};
        for (int i = 0; job[i]; i++) argv2[5 + i] = job[i];
        start(&p, argv2, pauses[k]);
        char *at = NULL;
        for (double until = test_now() + 40; !(at = strstr(p.out, "checkpoint paused at")) && test_now() < until;)
            if (pump(&p, 0.1) != -2) break;
        int pid = 0;
        char *q = at ? strstr(at, "(pid ") : NULL;
        if (q) pid = atoi(q + 5);
        CHECK(pid > 0, "%s: the save pauses (%s)", who[k], p.out);
        if (pid > 0) kill(pid, SIGKILL);
        int rc = pump(&p, 30);
        if (rc == -2) kill(p.pid, SIGKILL), waitpid(p.pid, NULL, 0);
        CHECK(rc != 0 && rc != -2, "%s: the job fails promptly (exit %d)", who[k], rc);
        CHECK(tool("verify", K, NULL, out, sizeof out) == 0, "%s: the previous checkpoint verifies: %s", who[k], out);
        check_identical(K, Kfile, who[k]);
        if (k == 1) {
            struct stat sb;
            char mt[400];
            snprintf(mt, sizeof mt, "%s/manifest.tmp", K);
            CHECK(stat(mt, &sb) == 0 && count_files(K, "s2-r") == 2, "the dead save left its files (manifest.tmp, 2 shards of generation 2)");
        }
        snprintf(loadarg, sizeof loadarg, "load=%s", K);
        char *resume[] = {"dp=2,zero=1", "6", "4", loadarg, "expect=2,1016", dirarg, "every=2", NULL};
        CHECK(run_job(&p, 2, resume, NULL, 60) == 0, "%s: the job resumes from step 2 and saves at step 4", who[k]);
        CHECK(count_files(K, "s2-r") == 0 && count_files(K, "s3-r") == 2, "%s: the next save is generation 3 and removed generation 2's files", who[k]);
        CHECK(tool("verify", K, NULL, out, sizeof out) == 0, "%s: the new checkpoint verifies: %s", who[k], out);
    }

    /* in-memory snapshots (with replicas) of dp=2 ZeRO-1, restored by one process: both ranks' snapshots
     * make the whole state; rank 1's alone lacks rank 0's optimizer state shard */
    char S[300], Sfile[300], Rfile[300], snaparg[400], restarg[1400];
    path(S, sizeof S, "snaps"), path(Sfile, sizeof Sfile, "snap.ckpt"), path(Rfile, sizeof Rfile, "restored.ckpt");
    mkdir(S, 0755);
    snprintf(snaparg, sizeof snaparg, "snap=%s", S), snprintf(filearg, sizeof filearg, "file=%s", Sfile);
    char *snap_job[] = {"dp=2,zero=1", "1", "3", snaparg, filearg, "at=3", NULL};
    CHECK(run_job(&p, 2, snap_job, NULL, 60) == 0, "dp=2 ZeRO-1 trains 3 steps and takes snapshots with replicas");
    snprintf(restarg, sizeof restarg, "restore=%s/r1.bin,%s/r0.bin", S, S), snprintf(filearg, sizeof filearg, "file=%s", Rfile);
    char *restore_job[] = {"dp=1", "42", "3", restarg, "expect=3,1024", filearg, NULL};
    CHECK(run_job(&p, 1, restore_job, NULL, 60) == 0, "one process (seed 42) restores from the two snapshots");
    check_identical(Sfile, Rfile, "snapshots of dp=2 ZeRO-1 -> one process");
    snprintf(restarg, sizeof restarg, "restore=%s/r1.bin", S);
    char *restore_part[] = {"dp=1", "42", "3", restarg, "fail=in none of its blocks", NULL};
    CHECK(run_job(&p, 1, restore_part, NULL, 60) == 0 && strstr(p.out, "refusal as expected") && strstr(p.out, "adam"),
          "rank 1's snapshot alone is refused, naming an optimizer state tensor it lacks (%s)", p.out);

    /* a flipped byte, a missing shard */
    char name[256] = "", shard[600], moved[700];
    unsigned long long off = 0;
    CHECK(first_block(C, 1, name, sizeof name, &off) == 0, "the ZeRO-3 manifest names a block in file 1");
    snprintf(shard, sizeof shard, "%s/%s", C, name);
    flip_byte(shard, off + 5);
    int rc = tool("verify", C, NULL, out, sizeof out);
    CHECK(rc == 1 && strstr(out, name) && strstr(out, "CRC") && strstr(out, "tensor"), "verify refuses the flipped byte naming %s and the tensor: %s", name, out);
    snprintf(loadarg, sizeof loadarg, "load=%s", C);
    char failarg[400];
    /* under the saving plan rank 1 alone reads file 1: rank 0 refuses too (no rank loads anything) */
    snprintf(failarg, sizeof failarg, "fail=%s|rank 1 could not read its part", name);
    char *load_bad[] = {"dp=2,zero=3", "3", "3", loadarg, failarg, NULL};
    CHECK(run_job(&p, 2, load_bad, NULL, 60) == 0 && strstr(p.out, "[0] refusal as expected") && strstr(p.out, "[1] refusal as expected") &&
              strstr(p.out, "[1] load refused: corrupt file") && strstr(p.out, "fails its CRC") && strstr(p.out, "of tensor") &&
              strstr(p.out, "[0] load refused: corrupt file") && strstr(p.out, "rank 1 could not read its part"),
          "a 2-rank ZeRO-3 load refuses the flipped byte in rank 1's shard on both ranks, naming the shard and the tensor (%s)", p.out);
    snprintf(failarg, sizeof failarg, "fail=%s", name);
    flip_byte(shard, off + 5); /* whole again */
    snprintf(moved, sizeof moved, "%s.away", shard);
    rename(shard, moved);
    rc = tool("verify", C, NULL, out, sizeof out);
    CHECK(rc == 1 && strstr(out, name) && strstr(out, "missing") && strstr(out, "tensor"), "verify refuses the missing shard naming it: %s", out);
    char *load_missing[] = {"dp=1", "3", "3", loadarg, failarg, NULL};
    char damaged[64]; /* (a missing shard is a damaged checkpoint, not an absent one: a resume must not start afresh over it) */
    snprintf(damaged, sizeof damaged, "load refused: %s:", pdde_status_str(PDDE_ERR_CORRUPT));
    CHECK(run_job(&p, 1, load_missing, NULL, 60) == 0 && strstr(p.out, "refusal as expected") && strstr(p.out, "missing") && strstr(p.out, damaged),
          "a load refuses the missing shard naming it and the tensor (%s)", p.out);
    rename(moved, shard);
    CHECK(tool("verify", C, NULL, out, sizeof out) == 0, "restored, it verifies again: %s", out);

    printf("test_checkpoint_shard: %.1f s\n", test_now() - t0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (test_failed == 0 && system(cmd)) {}
    return test_finish();
}
