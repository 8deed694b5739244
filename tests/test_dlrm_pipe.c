/* test_dlrm_pipe — the recommender pipeline's sparse stages with several workers each (real threads on
 * one in-process table), and their sizing by the cost model:
 *  - the table under threads: pushers and pullers of the same rows at once lose no update, read no
 *    torn row, and count every step;
 *  - the pipeline with 3 workers in stages 1 (pull) and 3 (push) leaves the table bit for bit as with
 *    1 worker and as the closed form; each batch's loss is what its pulled rows allow, each pulled row
 *    is whole, and no pull starts with more than slots - 1 batches begun and not yet pushed;
 *  - a cluster whose table calls (ps_pull curve) and parsing make stage 1 the slowest gives it more
 *    than one worker, priced by those curves (not the embedding curve), which a cluster file keeps.
 * SGD with lr 2^-4 and gradients that are counts: every value is a multiple of 2^-4, every sum exact,
 * so the order the threads apply pushes in cannot change a bit. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/dlrm.h"
#include "tests/test_util.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#define LR 0.0625f
enum { DIM = 8, B = 32, VOCAB = 40, N_BATCHES = 48 };

static pdde_ps_client *new_table(pdde_context *ctx) {
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = DIM, pp.table.optimizer = PDDE_PS_SGD, pp.table.lr = LR; /* (init_std 0: rows start at zeros) */
    pdde_ps_client *c = NULL;
    return pdde_ps_client_init(ctx, NULL, &pp, &c) ? NULL : c;
}

/* 1 when every column of the row is the same multiple of LR in [lo, 0]. */
static int row_whole(const float *r, double lo) {
    for (int c = 0; c < DIM; c++)
        if (r[c] != r[0] || !(r[c] <= 0 && r[c] >= lo) || r[c] / LR != floorf(r[c] / LR)) return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------------
 * The table under threads */

enum { STRESS_IDS = 2000, STRESS_ROUNDS = 300, STRESS_PUSHERS = 2, STRESS_PULLERS = 2 };
typedef struct {
    pdde_ps_client *c;
    const uint64_t *ids;
    int pusher;
    long torn;
    pdde_status st;
} stress_arg;

static void *stress_main(void *u) {
    stress_arg *a = u;
    float *v = malloc((size_t)STRESS_IDS * DIM * sizeof *v);
    if (!v) { a->st = PDDE_ERR_OOM; return NULL; }
    for (int i = 0; i < STRESS_IDS * DIM; i++) v[i] = 1.0f;
    for (int r = 0; r < STRESS_ROUNDS && !a->st; r++) {
        if (a->pusher) a->st = pdde_ps_client_push(a->c, STRESS_IDS, a->ids, v);
        else {
            a->st = pdde_ps_client_pull(a->c, STRESS_IDS, a->ids, v);
            for (int i = 0; i < STRESS_IDS && !a->st; i++) a->torn += !row_whole(v + i * DIM, -LR * STRESS_PUSHERS * STRESS_ROUNDS);
        }
    }
    free(v);
    return NULL;
}

static void test_table_threads(pdde_context *ctx) {
    pdde_ps_client *c = new_table(ctx);
    uint64_t *ids = malloc(STRESS_IDS * sizeof *ids);
    float *rows = malloc((size_t)STRESS_IDS * DIM * sizeof *rows);
    if (!c || !ids || !rows) { CHECK(0, "table: set up"); return; }
    for (int i = 0; i < STRESS_IDS; i++) ids[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull + 7;
    pthread_t th[STRESS_PUSHERS + STRESS_PULLERS];
    stress_arg a[STRESS_PUSHERS + STRESS_PULLERS];
    for (int t = 0; t < STRESS_PUSHERS + STRESS_PULLERS; t++) {
        a[t] = (stress_arg){c, ids, t < STRESS_PUSHERS, 0, PDDE_OK};
        pthread_create(&th[t], NULL, stress_main, &a[t]);
    }
    long torn = 0;
    pdde_status st = PDDE_OK;
    for (int t = 0; t < STRESS_PUSHERS + STRESS_PULLERS; t++) {
        pthread_join(th[t], NULL);
        torn += a[t].torn;
        if (!st) st = a[t].st;
    }
    if (!st) st = pdde_ps_client_pull(c, STRESS_IDS, ids, rows);
    long wrong = 0;
    float want = -LR * STRESS_PUSHERS * STRESS_ROUNDS;
    for (int i = 0; i < STRESS_IDS * DIM; i++) wrong += rows[i] != want;
    pdde_ps_server_stats ss;
    pdde_ps_client_server_stats(c, 0, &ss);
    CHECK(!st && wrong == 0, "table: %d threads pushing %d rows %d times each lose no update (%ld values off %g; %s)", STRESS_PUSHERS,
          STRESS_IDS, STRESS_ROUNDS, wrong, want, st ? pdde_last_error(ctx) : "ok");
    CHECK(!st && torn == 0, "table: %d threads pulling beside them read no torn row (%ld)", STRESS_PULLERS, torn);
    CHECK(ss.table.step == STRESS_PUSHERS * STRESS_ROUNDS && ss.table.rows == STRESS_IDS, "table: %lld steps (want %d), %lld rows",
          (long long)ss.table.step, STRESS_PUSHERS * STRESS_ROUNDS, (long long)ss.table.rows);
    pdde_ps_client_free(c);
    free(ids), free(rows);
}

/* ------------------------------------------------------------------------------------------------
 * The pipeline with several sparse workers. The model: loss = the sum of the batch's pulled rows, so
 * a row's gradient is how often the batch holds its id (in every column), whatever its values. */

static dlrm_sample *g_samples;
static long g_n_samples;

static pdde_status batch_of(void *u, int64_t k, dlrm_sample *out) {
    (void)u;
    memcpy(out, g_samples + (k % (g_n_samples / B)) * B, B * sizeof *out);
    return PDDE_OK;
}

typedef struct {
    dlrm_stages d;
    pdde_tensor *loss, *rows;   /* rows: the pulled rows as fed ("emb.rows") */
    int n_slots;
    double loss_of[N_BATCHES];
    long torn;
    float *fed;
    atomic_long pushed;         /* pushes done */
    atomic_long over_bound;     /* pulls that began with slots or more batches begun and not pushed */
} sum_model;

static pdde_status sum_pull(void *u, void *slot, int64_t k, int worker) {
    sum_model *m = u;
    /* batches 0..k-1 have begun (stage 1 takes them in order); at most slots - 1 of them unpushed */
    if (k - atomic_load(&m->pushed) > m->n_slots - 1) atomic_fetch_add(&m->over_bound, 1);
    return dlrm_stage_pull(&m->d, slot, k, worker);
}
static pdde_status sum_dense(void *u, void *slot, int64_t k, int worker) {
    sum_model *m = u;
    dlrm_slot *sl = slot;
    (void)worker;
    float loss = NAN;
    int64_t n = pdde_tensor_numel(m->rows);
    pdde_status st = pdde_sparse_batch_feed(sl->sb, m->d.s);
    if (!st) st = pdde_session_run(m->d.s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_session_read(m->d.s, m->loss, &loss, sizeof loss);
    if (!st) st = pdde_session_read(m->d.s, m->rows, m->fed, (size_t)n * sizeof(float));
    for (int64_t r = 0; !st && r < n / DIM; r++) m->torn += !row_whole(m->fed + r * DIM, -1e6);
    if (!st) st = pdde_sparse_batch_collect(sl->sb, m->d.s);
    if (k < N_BATCHES) m->loss_of[k] = loss;
    return st;
}
static pdde_status sum_push(void *u, void *slot, int64_t k, int worker) {
    sum_model *m = u;
    pdde_status st = dlrm_stage_push(&m->d, slot, k, worker);
    atomic_fetch_add(&m->pushed, 1);
    return st;
}

/* N_BATCHES through the pipeline with `workers` in stages 1 and 3; the final rows of ids[0..n) into rows. */
static pdde_status sum_train(pdde_context *ctx, int workers, const uint64_t *ids, int n, float *rows, sum_model *m, pdde_pipeline_stats *ps) {
    memset(m, 0, sizeof *m);
    dlrm_model dm;
    memset(&dm, 0, sizeof dm);
    dm.cfg = (dlrm_config){B, DIM, 1, 0, DLRM_DENSE_SGD};
    pdde_graph *g = NULL;
    pdde_graph_init(ctx, &g);
    pdde_tensor *emb = pdde_sparse_embedding_init(g, "emb", B, DLRM_SPARSE, 1, DIM, PDDE_POOL_SUM, &dm.emb);
    m->loss = pdde_sum(g, emb, -1, 0);
    pdde_status st = pdde_graph_status(g);
    if (!st) st = pdde_backward(g, m->loss);
    for (int i = 0; !st && i < pdde_graph_tensor_count(g); i++)
        if (!strcmp(pdde_graph_tensor(g, i)->name, "emb.rows")) m->rows = pdde_graph_tensor(g, i);
    if (!st && !(m->fed = malloc((size_t)pdde_tensor_numel(m->rows) * sizeof(float)))) st = PDDE_ERR_OOM;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    pdde_session *s = NULL;
    pdde_ps_client *c = new_table(ctx);
    if (!st) st = c ? pdde_session_init(g, &sp, &s) : PDDE_ERR_OOM;
    m->d = (dlrm_stages){&dm, s, c, NULL, batch_of, NULL};
    m->n_slots = 2 * workers + 2;
    dlrm_slot sl[8];
    void *slot_ptr[8];
    memset(sl, 0, sizeof sl);
    for (int i = 0; i < m->n_slots && !st; i++) st = dlrm_slot_init(&sl[i], &dm), slot_ptr[i] = &sl[i];
    pdde_pipeline_stage stages[3] = {{"pull", sum_pull, m, workers, 0, 0}, {"dense", sum_dense, m, 1, 1, 0}, {"push", sum_push, m, workers, 0, 0}};
    pdde_pipeline *pl = NULL;
    pdde_pipeline_params plp = PDDE_PIPELINE_PARAMS_INIT;
    plp.n_stages = 3, plp.stages = stages, plp.slots = slot_ptr, plp.n_slots = m->n_slots;
    if (!st) st = pdde_pipeline_init(ctx, &plp, &pl);
    if (!st) st = pdde_pipeline_run(pl, 0, N_BATCHES);
    if (!st) pdde_pipeline_stats_get(pl, ps);
    if (!st) st = pdde_ps_client_pull(c, (size_t)n, ids, rows);
    pdde_pipeline_free(pl);
    for (int i = 0; i < 8; i++) dlrm_slot_free(&sl[i]);
    pdde_ps_client_free(c);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(dm.emb);
    free(m->fed);
    return st;
}

static void test_pipeline_workers(pdde_context *ctx) {
    /* the batches' distinct ids and how often each occurs in all N_BATCHES */
    int cap = VOCAB * DLRM_SPARSE, n = 0;
    uint64_t *ids = malloc((size_t)cap * sizeof *ids);
    long *count = calloc((size_t)cap, sizeof *count);
    float *r1 = malloc((size_t)cap * DIM * sizeof *r1), *r3 = malloc((size_t)cap * DIM * sizeof *r3);
    if (!ids || !count || !r1 || !r3) { CHECK(0, "pipeline: set up"); return; }
    double loss_lo[N_BATCHES]; /* the lowest loss a batch can have: every other batch's push seen */
    for (int k = 0; k < N_BATCHES; k++) {
        dlrm_sample b[B];
        batch_of(NULL, k, b);
        for (int i = 0; i < B; i++)
            for (int f = 0; f < DLRM_SPARSE; f++) {
                int j = 0;
                while (j < n && ids[j] != b[i].ids[f]) j++;
                if (j == n && n < cap) ids[n++] = b[i].ids[f];
                if (j < n) count[j]++;
            }
    }
    for (int k = 0; k < N_BATCHES; k++) {
        dlrm_sample b[B];
        batch_of(NULL, k, b);
        loss_lo[k] = 0;
        for (int i = 0; i < B; i++)
            for (int f = 0; f < DLRM_SPARSE; f++) {
                int j = 0;
                while (ids[j] != b[i].ids[f]) j++;
                long in_k = 0; /* (its occurrences in batch k itself: not pushed before k's pull) */
                for (int ii = 0; ii < B; ii++)
                    for (int ff = 0; ff < DLRM_SPARSE; ff++) in_k += b[ii].ids[ff] == ids[j];
                loss_lo[k] -= (double)LR * DIM * (double)(count[j] - in_k);
            }
    }
    static sum_model m1, m3;
    pdde_pipeline_stats ps1, ps3;
    memset(&ps1, 0, sizeof ps1), memset(&ps3, 0, sizeof ps3);
    pdde_status a = sum_train(ctx, 1, ids, n, r1, &m1, &ps1);
    pdde_status b = sum_train(ctx, 3, ids, n, r3, &m3, &ps3);
    CHECK(!a && !b && ps1.stage[0].workers == 1 && ps3.stage[0].workers == 3 && ps3.stage[2].workers == 3 &&
          ps3.stage[0].batches == N_BATCHES && ps3.stage[2].batches == N_BATCHES,
          "pipeline: %d batches through 1 and 3 sparse workers (%d, %d; %s)", N_BATCHES, ps3.stage[0].workers, ps3.stage[2].workers,
          a || b ? pdde_last_error(ctx) : "ok");
    long off = 0;
    for (int j = 0; j < n; j++)
        for (int c = 0; c < DIM; c++) off += r1[j * DIM + c] != -LR * (float)count[j];
    CHECK(!a && off == 0, "pipeline, 1 worker: every row is -lr x its id's count (%ld values off, %d ids)", off, n);
    CHECK(!a && !b && memcmp(r1, r3, (size_t)n * DIM * sizeof *r1) == 0, "pipeline: 3 sparse workers leave the table bit for bit as 1 does");
    long bad_loss = 0;
    for (int k = 0; k < N_BATCHES; k++)
        for (int w = 0; w < 2; w++) {
            double l = (w ? m3 : m1).loss_of[k];
            bad_loss += !(l <= 0 && l >= loss_lo[k] - 1e-6 && l / LR == floor(l / LR));
        }
    CHECK(!a && !b && bad_loss == 0, "pipeline: every batch's loss is a multiple of lr between all others' pushes seen and none (%ld off)", bad_loss);
    CHECK(!a && !b && m1.torn == 0 && m3.torn == 0, "pipeline: every pulled row is whole (%ld, %ld torn)", m1.torn, m3.torn);
    CHECK(!a && !b && atomic_load(&m1.over_bound) == 0 && atomic_load(&m3.over_bound) == 0,
          "pipeline: no pull began with slots or more batches unpushed (%ld, %ld)", atomic_load(&m1.over_bound), atomic_load(&m3.over_bound));
    free(ids), free(count), free(r1), free(r3);
}

/* ------------------------------------------------------------------------------------------------
 * Sizing: a cluster whose CPU has ps_pull / ps_push curves and a fast accelerator */

static pdde_cluster *ps_cluster(double pull_s_per_id, double push_s_per_id) {
    pdde_cluster *c;
    if (pdde_cluster_init("ps sizing", &c)) return NULL;
    pdde_device_spec cpu = {.name = "cpu", .kind = PDDE_DEVICE_CPU, .backend = "cpu", .peak_flops = 1e11, .mem_bandwidth = 1e10};
    cpu.n_curve[PDDE_OPCLASS_EMBEDDING] = 1; /* a graph's lookups: 10 GB/s */
    cpu.curve[PDDE_OPCLASS_EMBEDDING][0] = (pdde_curve_point){1e6, 1e-4};
    double ids[2] = {1000, 100000};
    for (int k = 0; k < 2; k++) {
        int cls = k ? PDDE_OPCLASS_PS_PUSH : PDDE_OPCLASS_PS_PULL;
        cpu.n_curve[cls] = 2;
        for (int i = 0; i < 2; i++)
            cpu.curve[cls][i] = (pdde_curve_point){pdde_cost_ps_bytes(k, ids[i], 16, PDDE_PS_ADAGRAD), ids[i] * (k ? push_s_per_id : pull_s_per_id)};
    }
    pdde_device_spec acc = {.name = "accel", .kind = PDDE_DEVICE_ACCEL, .backend = "opencl", .peak_flops = 1e15, .mem_bandwidth = 1e13};
    pdde_cluster_machine mm = {.id = 0, .name = "m"};
    int sc = pdde_cluster_add_spec(c, &cpu), sa = pdde_cluster_add_spec(c, &acc), mi = pdde_cluster_add_machine(c, &mm);
    pdde_cluster_add_device(c, mi, &(pdde_cluster_device){0, sc, 1ull << 32});
    pdde_cluster_add_device(c, mi, &(pdde_cluster_device){1, sa, 1ull << 32});
    return c;
}

static pdde_status no_op(void *u, void *slot, int64_t k, int worker) {
    (void)u, (void)slot, (void)k, (void)worker;
    return PDDE_OK;
}

/* The workers pdde_pipeline gives the three stages sized at st's predictions (max_threads 8): by
 * pdde_pipeline_size (run = 0) or by a run of 4 batches through stages that do nothing (run = 1). */
static pdde_status size_stages(pdde_context *ctx, const pdde_pipeline_stage *predicted, int run, pdde_pipeline_stats *ps) {
    pdde_pipeline_stage st[3];
    memcpy(st, predicted, sizeof st);
    for (int k = 0; k < 3; k++) st[k].fn = no_op;
    int dummy[4];
    void *slots[4] = {&dummy[0], &dummy[1], &dummy[2], &dummy[3]};
    pdde_pipeline_params p = PDDE_PIPELINE_PARAMS_INIT;
    p.n_stages = 3, p.stages = st, p.slots = slots, p.n_slots = 4, p.max_threads = 8;
    pdde_pipeline *pl = NULL;
    pdde_status s = pdde_pipeline_init(ctx, &p, &pl);
    if (!s) s = run ? pdde_pipeline_run(pl, 0, 4) : pdde_pipeline_size(pl);
    if (!s) pdde_pipeline_stats_get(pl, ps);
    pdde_pipeline_free(pl);
    return s;
}

static void test_cost_sizing(pdde_context *ctx, const char *dir) {
    enum { BB = 512 };
    pdde_cluster *c = ps_cluster(200e-9, 50e-9); /* 200 ns an id pulled, 50 pushed */
    pdde_graph *g = NULL;
    dlrm_model m;
    dlrm_config cfg = {BB, 16, 64, 0.01f, DLRM_DENSE_ADAMW};
    pdde_graph_init(ctx, &g);
    pdde_status st = c ? dlrm_build(g, &cfg, &m) : PDDE_ERR_OOM;
    pdde_pipeline_stage s[3], plain[3];
    dlrm_stages d;
    memset(&d, 0, sizeof d);
    dlrm_stages_fill(&d, s);
    dlrm_stages_fill(&d, plain);
    double parse_s = 2e-6; /* a line */
    int known = st ? 0 : dlrm_stages_predict(ctx, c, g, &m, PDDE_PS_ADAGRAD, 0, 1, parse_s, s);
    double ids = (double)BB * DLRM_SPARSE, want_pull = BB * parse_s + ids * 200e-9, want_push = ids * 50e-9;
    CHECK(known == 3 && test_close(s[0].predicted_s, want_pull, 1e-9, 0) && test_close(s[2].predicted_s, want_push, 1e-9, 0),
          "sizing: pull predicted %.3f ms (%d lines parsed + %.0f ids on the ps_pull curve: %.3f), push %.3f (%.3f) (%s)", 1e3 * s[0].predicted_s,
          BB, ids, 1e3 * want_pull, 1e3 * s[2].predicted_s, 1e3 * want_push, known == 3 ? "ok" : pdde_last_error(ctx));
    pdde_pipeline_stats ps;
    memset(&ps, 0, sizeof ps);
    pdde_status sz = known == 3 ? size_stages(ctx, s, 1, &ps) : PDDE_ERR_NO_PLAN;
    printf("sized: %s\n", ps.sizing);
    CHECK(!sz && s[0].predicted_s > s[1].predicted_s && s[0].predicted_s > s[2].predicted_s && ps.stage[0].workers > 1 &&
          ps.stage[0].workers > ps.stage[2].workers,
          "sizing: the slowest stage, parse + pull, gets %d workers (push %d, dense %d)", ps.stage[0].workers, ps.stage[2].workers, ps.stage[1].workers);
    /* sized without a run (a planner's prediction): the same workers and text as the run's */
    pdde_pipeline_stats unrun;
    memset(&unrun, 0, sizeof unrun);
    pdde_status usz = known == 3 ? size_stages(ctx, s, 0, &unrun) : PDDE_ERR_NO_PLAN;
    CHECK(!usz && unrun.batches == 0 && !strcmp(unrun.sizing, ps.sizing) && unrun.stage[0].workers == ps.stage[0].workers &&
          unrun.stage[2].workers == ps.stage[2].workers, "pdde_pipeline_size sizes as a run does, running nothing (%s)", unrun.sizing);
    pdde_pipeline_stage none[3];
    memcpy(none, s, sizeof none);
    none[2].predicted_s = 0;
    usz = size_stages(ctx, none, 0, &unrun);
    CHECK(usz == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "stage 2 (push) has no predicted_s"),
          "pdde_pipeline_size without a stage's prediction names the stage (%s)", pdde_last_error(ctx));
    /* the same cluster without the table's curves prices pulling as a graph's lookup (bytes only) */
    pdde_cluster *old = ps_cluster(200e-9, 50e-9);
    if (old) old->specs[0].n_curve[PDDE_OPCLASS_PS_PULL] = old->specs[0].n_curve[PDDE_OPCLASS_PS_PUSH] = 0;
    if (old && !st) dlrm_stages_predict(ctx, old, g, &m, PDDE_PS_ADAGRAD, 0, 1, 0, plain);
    CHECK(old && !st && plain[0].predicted_s > 0 && plain[0].predicted_s < 0.2 * (s[0].predicted_s - BB * parse_s),
          "sizing: the embedding curve alone prices the pull at %.3f ms (the table's curve %.3f)", 1e3 * plain[0].predicted_s,
          1e3 * (s[0].predicted_s - BB * parse_s));
    /* a cluster file keeps the table's curves */
    char path[300];
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    pdde_cluster *back = NULL;
    pdde_status io = c ? pdde_cluster_save(ctx, c, path) : PDDE_ERR_OOM;
    if (!io) io = pdde_cluster_load(ctx, path, &back);
    CHECK(!io && back->specs[0].n_curve[PDDE_OPCLASS_PS_PULL] == 2 && back->specs[0].curve[PDDE_OPCLASS_PS_PUSH][1].seconds == c->specs[0].curve[PDDE_OPCLASS_PS_PUSH][1].seconds,
          "sizing: the ps_pull and ps_push curves survive a cluster file (%s)", io ? pdde_last_error(ctx) : "ok");
    unlink(path);
    pdde_cluster_free(back), pdde_cluster_free(old), pdde_cluster_free(c);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(m.emb);
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    cp.n_threads = 1;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) { CHECK(0, "context"); return test_finish(); }
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "/tmp/pdde_test_dlrm_pipe_%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/data.tsv", dir);
    long bad = 0;
    if (dlrm_synthesize(path, (long)B * N_BATCHES, VOCAB, 21, NULL) == 0) g_samples = dlrm_load(path, &g_n_samples, &bad);
    unlink(path);
    CHECK(g_samples && g_n_samples == (long)B * N_BATCHES && bad == 0, "data: %ld samples", g_n_samples);
    test_table_threads(ctx);
    if (g_samples && g_n_samples == (long)B * N_BATCHES) test_pipeline_workers(ctx);
    test_cost_sizing(ctx, dir);
    rmdir(dir);
    free(g_samples);
    pdde_context_free(ctx);
    return test_finish();
}
