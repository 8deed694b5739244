/* test_rank_agreement — ranks that build different graphs or plans are refused at session init.
 * This program runs itself under pdde-run (real processes, UCX): each rank builds a small MLP as its
 * case says for its rank. Mismatches (rank 0 data parallel beside rank 1 tensor parallel; two plans
 * through pdde_plan_apply; another width; another learning rate; the last of four ranks; three of four) fail
 * pdde_session_init on every rank with PDDE_ERR_MISMATCH and a message naming the ranks and what
 * differs, before any step. Matching ranks (dp, tp, plans dp=2 and tp=2, ranks placing their nodes on
 * different devices) train to one process's loss. A rank that fails at session init on its own (its memory) fails
 * the others there too, with its status and message. */
#define _GNU_SOURCE
#include "pdde.h"
#include "tests/test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { B = 32, IN = 8, C = 4, STEPS = 20 };

/* The MLP: x [B, IN] -> linear(H) -> gelu -> linear(C) -> cross-entropy; layer 0 and layer 1. */
typedef struct {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_tensor *x, *t, *w1, *b1, *w2, *b2, *loss;
} mlp;

static int mlp_build(mlp *m, int hidden) {
    if (pdde_context_init(NULL, &m->ctx) || pdde_graph_init(m->ctx, &m->g)) return 1;
    pdde_graph *g = m->g;
    m->x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){B, IN});
    m->t = pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){B});
    pdde_graph_set_layer(g, 0);
    m->w1 = pdde_param(g, "w1", 2, (int64_t[]){IN, hidden}, 0.3f);
    m->b1 = pdde_param(g, "b1", 1, (int64_t[]){hidden}, PDDE_INIT_ZEROS);
    pdde_tensor *h = pdde_gelu(g, pdde_bias_add(g, pdde_matmul(g, m->x, m->w1, 0, 0), m->b1));
    pdde_graph_set_layer(g, 1);
    m->w2 = pdde_param(g, "w2", 2, (int64_t[]){hidden, C}, 0.3f);
    m->b2 = pdde_param(g, "b2", 1, (int64_t[]){C}, PDDE_INIT_ZEROS);
    m->loss = pdde_cross_entropy(g, pdde_bias_add(g, pdde_matmul(g, h, m->w2, 0, 0), m->b2), m->t);
    return pdde_graph_status(g) != PDDE_OK;
}

/* STEPS steps on fixed data; the last loss */
static pdde_status mlp_train(mlp *m, pdde_session *s, float *last) {
    float xs[B * IN];
    int32_t ts[B];
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < IN; j++) xs[i * IN + j] = (float)((i * 7 + j * 3) % 11) / 11.0f - 0.5f;
        ts[i] = (i * 5) % C;
    }
    pdde_status st = PDDE_OK;
    for (int step = 0; step < STEPS && !st; step++) {
        st = pdde_session_write_global(s, m->x, xs, sizeof xs);
        if (!st) st = pdde_session_write_global(s, m->t, ts, sizeof ts);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
    }
    *last = pdde_session_loss(s);
    return st;
}

/* ---- one rank of a case (under pdde-run) ----
 * A case names what rank 0 builds and what the others build, "A/B" (B only on the last rank with
 * "A/B@last"): "dp", "tp" (strategies by hand), "plan:TEXT" (pdde_plan_apply), "h24" (width 24 instead
 * of 16, data parallel), "lr2" (data parallel at twice the learning rate), "dev" (data parallel, the
 * first layer's nodes on this rank's device, the CPU: placement is the rank's own). */
static int rank_main(const char *cas) {
    int rank = atoi(getenv("PDDE_RANK") ? getenv("PDDE_RANK") : "0"), size = atoi(getenv("PDDE_WORLD_SIZE") ? getenv("PDDE_WORLD_SIZE") : "1");
    char mine[128];
    snprintf(mine, sizeof mine, "%s", cas);
    char *other = strchr(mine, '/'), *at = other ? strstr(other, "@last") : NULL;
    if (at) *at = 0;
    if (other) *other++ = 0;
    const char *what = other && rank > 0 && (!at || rank == size - 1) ? other : mine;
    mlp m;
    if (mlp_build(&m, !strcmp(what, "h24") ? 24 : 16)) { fprintf(stderr, "rank %d: build failed\n", rank); return 2; }
    pdde_comm *world = NULL;
    pdde_status st = pdde_comm_init(m.ctx, NULL, &world);
    if (st) { /* (a peer that failed while the world formed: reported as any other failure) */
        printf("rank %d: status %d: %s\n", rank, st, pdde_last_error(m.ctx));
        pdde_graph_free(m.g), pdde_context_free(m.ctx);
        return 0;
    }
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = !strcmp(what, "lr2") ? 2e-2f : 1e-2f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = world;
    int layer_devices[2] = {0, -1};
    if (!strcmp(what, "dev")) sp.layer_devices = layer_devices, sp.n_layer_devices = 2;
    if (!strcmp(what, "mem")) sp.memory_headroom = 0.9999999999; /* (a failure of this rank's own: its memory) */
    pdde_session *s = NULL;
    if (!strncmp(what, "plan:", 5)) {
        pdde_plan p;
        st = pdde_plan_parse(what + 5, &p);
        if (!st) st = pdde_plan_apply(m.g, &p, m.loss, &opt, &sp, &s);
    } else {
        const pdde_mesh *mesh = pdde_mesh_create(m.g, 1, (int[]){size}, (const char *[]){strcmp(what, "tp") ? "dp" : "tp"}, NULL);
        if (strcmp(what, "tp")) st = pdde_strategy_data_parallel(m.g, mesh, "dp");
        else {
            st = pdde_strategy_tensor_parallel_linear(m.g, m.w1, m.b1, mesh, "tp", PDDE_TP_COLUMN);
            if (!st) st = pdde_strategy_tensor_parallel_linear(m.g, m.w2, m.b2, mesh, "tp", PDDE_TP_ROW);
        }
        if (!st) st = pdde_backward(m.g, m.loss);
        if (!st) st = pdde_optimizer_adamw(m.g, &opt);
        if (!st) st = pdde_complete_dist_attrs(m.g);
        if (!st) st = pdde_session_init(m.g, &sp, &s);
    }
    /* a failure before the session (this rank's plan): abort the world, so that the others, waiting in
     * their session init, fail at once instead of at PDDE_COMM_TIMEOUT (a clean free is no failure) */
    if (st && !s) pdde_comm_abort(world);
    float last = NAN;
    if (!st) st = mlp_train(&m, s, &last);
    if (st) printf("rank %d: status %d: %s\n", rank, st, pdde_last_error(m.ctx));
    else printf("rank %d: loss %.6f\n", rank, last);
    pdde_session_free(s);
    pdde_graph_free(m.g);
    pdde_comm_free(world);
    pdde_context_free(m.ctx);
    return 0; /* (refused too: pdde-run would stop the other ranks before they print theirs) */
}

/* ---- the driver ---- */

static char g_self[512], g_dir[512], g_tmp[256];

/* pdde-run -n n this program's rank side for case cas; its exit status and output */
static int job(int n, const char *cas, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "PDDE_COMM_TIMEOUT=30 timeout 120 %s/pdde-run -n %d %s --rank '%s' > %s/out.txt 2>&1", g_dir, n, g_self, cas, g_tmp);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/out.txt", g_tmp);
    FILE *f = fopen(cmd, "r");
    size_t k = f ? fread(out, 1, cap - 1, f) : 0;
    out[k] = 0;
    if (f) fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* every one of n ranks printed the refusal, with the text `want` */
static int all_refused(const char *out, int n, const char *want) {
    for (int r = 0; r < n; r++) {
        char line[64];
        snprintf(line, sizeof line, "rank %d: status %d: session: ", r, PDDE_ERR_MISMATCH);
        const char *p = strstr(out, line), *end = p ? strchr(p, '\n') : NULL;
        if (!p || !end) return 0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%.*s", (int)(end - p), p);
        if (!strstr(msg, want)) return 0;
    }
    return !strstr(out, "loss ");
}

/* A rank's line (from "rank r: ") says rank 3's abort failed it: in its session init (aborted), or while
 * the world formed (a lost peer). */
static int aborted_by_rank3(const char *line) {
    char aborted[32], lost[32];
    snprintf(aborted, sizeof aborted, "status %d: ", PDDE_ERR_ABORTED), snprintf(lost, sizeof lost, "status %d: comm: ", PDDE_ERR_PEER_LOST);
    const char *end = strchr(line, '\n'), *why = strstr(line, "rank 3 aborted the communicator");
    return why && (!end || why < end) && (!strncmp(line + 8, aborted, strlen(aborted)) || !strncmp(line + 8, lost, strlen(lost)));
}

/* every one of n ranks trained to loss `want` (the ranks print 6 decimals) */
static int all_trained(const char *out, int n, float want) {
    for (int r = 0; r < n; r++) {
        char line[32];
        snprintf(line, sizeof line, "rank %d: loss ", r);
        const char *p = strstr(out, line);
        if (!p || fabsf(strtof(p + strlen(line), NULL) - want) > 1e-5f * fabsf(want) + 1e-6f) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--rank")) return rank_main(argv[2]);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    if (!(pdde_features() & PDDE_FEATURE_COMM)) {
        test_skip("ucx", "pdde was built without comm: no ranks");
        return test_finish();
    }
    if (!realpath(argv[0], g_self)) snprintf(g_self, sizeof g_self, "%s", argv[0]);
    test_binary_dir(g_self, g_dir, sizeof g_dir);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/pdde-rank-agreement.XXXXXX");
    if (!mkdtemp(g_tmp)) { fprintf(stderr, "no temporary folder\n"); return 1; }
    /* one process's loss */
    mlp m;
    pdde_session *s = NULL;
    float ref = NAN;
    pdde_optimizer_params opt = PDDE_OPTIMIZER_PARAMS_INIT;
    opt.lr = 1e-2f;
    CHECK(!mlp_build(&m, 16) && !pdde_backward(m.g, m.loss) && !pdde_optimizer_adamw(m.g, &opt) && !pdde_session_init(m.g, NULL, &s) &&
          !mlp_train(&m, s, &ref), "one process trains: %s", pdde_last_error(m.ctx));
    pdde_session_free(s), pdde_graph_free(m.g), pdde_context_free(m.ctx);

    static char out[1 << 16];
    static const struct { int n; const char *cas, *want; } refused[] = {
        {2, "dp/tp", "rank 1 runs another program than rank 0: the meshes differ ([2 dp] vs [2 tp])"},
        {2, "plan:dp=2/plan:tp=2", "the plans differ ('dp=2,tp=1,pp=1,mb=1,zero=0,recompute=0' vs 'dp=1,tp=2,pp=1,mb=1,zero=0,recompute=0')"},
        {2, "plan:dp=2/plan:dp=2,zero=1", "the plans differ"},
        {2, "dp/h24", "the graphs differ (node 2: leaf 'w1' f32 [8,16] vs 'w1' f32 [8,24])"},
        {2, "dp/lr2", "rank 1 runs another program than rank 0: the graphs differ (node"},
        {4, "dp/h24@last", "rank 3 runs another program than rank 0"},
        {4, "dp/h24", "ranks 1, 2, 3 run another program than rank 0"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        int rc = job(refused[i].n, refused[i].cas, out, sizeof out);
        CHECK(rc == 0 && all_refused(out, refused[i].n, refused[i].want),
              "%d ranks '%s': every rank refused at session init with '%s', nothing trained: rc %d\n%s", refused[i].n, refused[i].cas, refused[i].want,
              rc, out);
    }
    /* a failure of one rank's own at session init (its memory): the others fail at once with its status and message,
     * not at their first collective (PDDE_COMM_TIMEOUT later, "did not finish", a peer's unrelated bucket) */
    int rc = job(4, "dp/mem@last", out, sizeof out);
    char want[160];
    snprintf(want, sizeof want, "status %d: session: rank 3 could not start its session: session: the plan needs", PDDE_ERR_OOM);
    const char *r0 = strstr(out, "rank 0: "), *r1 = strstr(out, "rank 1: ");
    CHECK(rc == 0 && r0 && r1 && !strncmp(r0 + 8, want, strlen(want)) && !strncmp(r1 + 8, want, strlen(want)) && strstr(out, "rank 3: status") &&
              !strstr(out, "loss "),
          "4 ranks, the last one out of memory at session init: the others fail at once with its status and message: rc %d\n%s", rc, out);
    /* a failure of one rank's own before its session (a plan it cannot parse) and its world aborted:
     * the others fail in their session init at once, not at PDDE_COMM_TIMEOUT (30 s here); a rank still
     * forming the world when the abort comes fails there, as a lost peer, naming the abort */
    double t0 = test_now();
    rc = job(4, "dp/plan:dp=4,bogus=1@last", out, sizeof out);
    double took = test_now() - t0;
    r0 = strstr(out, "rank 0: "), r1 = strstr(out, "rank 1: ");
    CHECK(rc == 0 && r0 && r1 && aborted_by_rank3(r0) && aborted_by_rank3(r1) && strstr(out, "rank 3: status") && !strstr(out, "loss ") &&
              took < 15,
          "4 ranks, the last one's plan refused and its world aborted: the others fail at once (%.1f s) as aborted: rc %d\n%s", took, rc, out);
    static const struct { int n; const char *cas; } trained[] = {{2, "dp"}, {2, "tp"}, {2, "plan:dp=2"}, {2, "plan:tp=2"}, {2, "dp/dev"}};
    for (size_t i = 0; i < sizeof trained / sizeof *trained; i++) {
        int rc = job(trained[i].n, trained[i].cas, out, sizeof out);
        CHECK(rc == 0 && all_trained(out, trained[i].n, ref), "%d ranks '%s' train to one process's loss %.6f: rc %d\n%s", trained[i].n,
              trained[i].cas, ref, rc, out);
    }
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", g_tmp);
    if (system(rm)) {}
    return test_finish();
}
