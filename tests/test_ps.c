/* test_ps — the parameter server: sparse tables (rows on first touch, per-row SGD / Adagrad / Adam
 * against a reference, admission, eviction, atomic save/load, bytes per id as ids grow), and jobs of
 * server and worker ranks (real processes around a TCP store this test hosts on 127.0.0.1): sync
 * training of the DLRM model equals one process, async never exceeds its staleness bound, geo deltas
 * add up to the local copies' change, a SIGKILLed server restarted from its checkpoint serves its
 * rows, a worker killed mid-push leaves no half-applied update; and the DLRM model reaches the
 * ground-truth AUC of synthetic data within 0.01; the deadline the timed waits end at. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/dlrm.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include "backends/deadline.h"
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Internal (comm/ps.c, not in pdde.h): GEO's sum of every delta value a client has pushed. */
double pdde_ps_client_geo_delta_sum(const pdde_ps_client *c);

static const pdde_store_server *g_server;
static char g_addr[64], g_dir[256];

static test_ranks_params ranks_params(void) { return test_ranks_served(g_server, g_addr, "ps", 60); }

static pdde_ps_table_params table_params(int dim, pdde_ps_optimizer opt) {
    pdde_ps_table_params p = PDDE_PS_TABLE_PARAMS_INIT;
    p.dim = dim, p.optimizer = opt, p.lr = 0.1f, p.init_std = 0.1f, p.seed = 7;
    return p;
}

/* ------------------------------------------------------------------------------------------------
 * Tables */

static void test_table_rows(pdde_context *ctx) {
    pdde_ps_table_params p = table_params(4, PDDE_PS_SGD);
    pdde_ps_table *a, *b;
    pdde_ps_table_init(ctx, &p, &a), pdde_ps_table_init(ctx, &p, &b);
    uint64_t ids[3] = {5, 1ull << 60, 5};
    float ra[12], rb[12], one[4];
    CHECK(pdde_ps_table_get(a, 5, one) == PDDE_ERR_NOT_FOUND, "an untouched id has no row");
    pdde_ps_table_pull(a, 3, ids, ra);
    pdde_ps_table_pull(b, 1, ids + 1, rb);
    pdde_ps_table_stats st;
    pdde_ps_table_stats_get(a, &st);
    CHECK(st.rows == 2, "rows created on first touch: %lld", (long long)st.rows);
    CHECK(memcmp(ra, ra + 8, 16) == 0 && ra[0] != 0, "the same id reads the same (non-zero) row");
    CHECK(memcmp(ra + 4, rb, 16) == 0, "another table (another shard) creates the same row for an id");
    CHECK(pdde_ps_shard_of(12345, 4) == pdde_ps_shard_of(12345, 4) && pdde_ps_shard_of(7, 1) == 0, "shards are a function of the id");
    int per[4] = {0};
    for (uint64_t i = 0; i < 4000; i++) per[pdde_ps_shard_of(i * 4, 4)]++; /* ids with a common stride still spread */
    CHECK(per[0] > 800 && per[1] > 800 && per[2] > 800 && per[3] > 800, "shards balanced: %d %d %d %d", per[0], per[1], per[2], per[3]);
    pdde_ps_table_free(a), pdde_ps_table_free(b);

    /* new rows are normal(0, init_std): 6000 ids of an odd width (the last column is a pair's first) */
    p = table_params(5, PDDE_PS_SGD);
    pdde_ps_table_init(ctx, &p, &a);
    enum { N_INIT = 6000 };
    uint64_t *many = malloc(N_INIT * sizeof *many);
    float *vals = malloc(N_INIT * 5 * sizeof *vals);
    for (int i = 0; i < N_INIT; i++) many[i] = 77 + (uint64_t)i * 3;
    pdde_ps_table_pull(a, N_INIT, many, vals);
    double sum = 0, sq = 0, within = 0, last_sq = 0;
    for (int i = 0; i < N_INIT * 5; i++) sum += vals[i], sq += (double)vals[i] * vals[i], within += fabsf(vals[i]) < p.init_std;
    for (int i = 0; i < N_INIT; i++) last_sq += (double)vals[i * 5 + 4] * vals[i * 5 + 4];
    double n = N_INIT * 5.0, mean = sum / n, sd = sqrt(sq / n - mean * mean), last_sd = sqrt(last_sq / N_INIT);
    CHECK(fabs(mean) < 0.004 && fabs(sd / p.init_std - 1) < 0.03 && fabs(within / n - 0.6827) < 0.015 && fabs(last_sd / p.init_std - 1) < 0.05,
          "new rows are normal(0, %g): mean %.4f, sd %.4f, %.3f within one sd (want 0.683), last column's sd %.4f", p.init_std, mean, sd,
          within / n, last_sd);
    free(many), free(vals);
    pdde_ps_table_free(a);
}

static void test_table_optimizers(pdde_context *ctx) {
    for (int o = PDDE_PS_SGD; o <= PDDE_PS_ADAM; o++) {
        pdde_ps_table_params p = table_params(3, (pdde_ps_optimizer)o);
        pdde_ps_table *t, *dup;
        pdde_ps_table_init(ctx, &p, &t), pdde_ps_table_init(ctx, &p, &dup);
        uint64_t id = 42, twice[2] = {42, 42};
        double w[3], m[3] = {0}, v[3] = {0};
        float row[3];
        pdde_ps_table_pull(t, 1, &id, row);
        pdde_ps_table_pull(dup, 1, &id, row);
        for (int c = 0; c < 3; c++) w[c] = row[c];
        for (int step = 1; step <= 3; step++) {
            float g[3], halves[6];
            for (int c = 0; c < 3; c++) g[c] = 0.5f * (float)(c + 1) - 0.3f * (float)step, halves[c] = 0.25f * g[c], halves[3 + c] = 0.75f * g[c];
            pdde_ps_table_push(t, 1, &id, g, 2.0f);
            pdde_ps_table_push(dup, 2, twice, halves, 2.0f); /* one step with the summed gradient */
            for (int c = 0; c < 3; c++) {
                double gc = 2.0 * g[c];
                if (o == PDDE_PS_SGD) w[c] -= 0.1 * gc;
                else if (o == PDDE_PS_ADAGRAD) v[c] += gc * gc, w[c] -= 0.1 * gc / (sqrt(v[c]) + 1e-8);
                else {
                    m[c] = 0.9 * m[c] + 0.1 * gc, v[c] = 0.999 * v[c] + 0.001 * gc * gc;
                    w[c] -= 0.1 * (m[c] / (1 - pow(0.9, step))) / (sqrt(v[c] / (1 - pow(0.999, step))) + 1e-8);
                }
            }
        }
        float got[3], got_dup[3];
        pdde_ps_table_get(t, id, got), pdde_ps_table_get(dup, id, got_dup);
        int ok = 1, ok_dup = 1;
        for (int c = 0; c < 3; c++) ok &= test_close(got[c], w[c], 1e-5, 1e-6), ok_dup &= test_close(got_dup[c], got[c], 1e-5, 1e-6);
        CHECK(ok, "optimizer %d: row %g %g %g, reference %g %g %g", o, got[0], got[1], got[2], w[0], w[1], w[2]);
        CHECK(ok_dup, "optimizer %d: an id twice in a push is one step with the summed gradient", o);
        pdde_ps_table_free(t), pdde_ps_table_free(dup);
    }
}

static void test_table_admission_eviction(pdde_context *ctx) {
    pdde_ps_table_params p = table_params(2, PDDE_PS_SGD);
    p.admit_after = 3;
    pdde_ps_table *t;
    pdde_ps_table_init(ctx, &p, &t);
    uint64_t id = 9;
    float r[2], g[2] = {1, 1};
    pdde_ps_table_pull(t, 1, &id, r);
    pdde_ps_table_push(t, 1, &id, g, 1);
    pdde_ps_table_pull(t, 1, &id, r);
    pdde_ps_table_stats st;
    pdde_ps_table_stats_get(t, &st);
    CHECK(st.rows == 0 && st.not_admitted == 1 && r[0] == 0 && r[1] == 0, "seen twice of 3: no row, zeros (%lld rows)", (long long)st.rows);
    pdde_ps_table_pull(t, 1, &id, r);
    pdde_ps_table_stats_get(t, &st);
    CHECK(st.rows == 1 && st.not_admitted == 0 && r[0] != 0, "admitted at the third pull, with its initial row");
    pdde_ps_table_free(t);

    p = table_params(2, PDDE_PS_SGD);
    p.evict_after = 8;
    pdde_ps_table_init(ctx, &p, &t);
    uint64_t hot[2] = {1, 2}, cold[100]; /* hot[1]: pulled once, then only pushed (an asynchronous worker's) */
    float rows[200] = {0}, g2[4] = {1, 1, 1, 1};
    for (int i = 0; i < 100; i++) cold[i] = 1000 + (uint64_t)i;
    pdde_ps_table_pull(t, 100, cold, rows);
    pdde_ps_table_pull(t, 1, &hot[1], r);
    for (int step = 0; step < 20; step++) pdde_ps_table_pull(t, 1, &hot[0], r), pdde_ps_table_push(t, 2, hot, g2, 1);
    pdde_ps_table_stats_get(t, &st);
    CHECK(st.rows == 2 && st.evicted == 100, "rows unseen for 8 steps are evicted: %lld rows, %lld evicted", (long long)st.rows, (long long)st.evicted);
    CHECK(pdde_ps_table_get(t, hot[0], r) == PDDE_OK && pdde_ps_table_get(t, hot[1], r) == PDDE_OK && pdde_ps_table_get(t, cold[50], r) == PDDE_ERR_NOT_FOUND,
          "the hot rows stay (a push touches its rows), a cold one is gone");
    pdde_ps_table_free(t);
}

static void test_table_save_load(pdde_context *ctx) {
    pdde_ps_table_params p = table_params(5, PDDE_PS_ADAM);
    pdde_ps_table *t, *u;
    pdde_ps_table_init(ctx, &p, &t), pdde_ps_table_init(ctx, &p, &u);
    enum { N = 3000 };
    static uint64_t ids[N];
    static float rows[N * 5], back[5], grads[N * 5];
    for (int i = 0; i < N; i++) ids[i] = (uint64_t)i * 7919 + 3;
    for (int i = 0; i < N * 5; i++) grads[i] = sinf((float)i);
    pdde_ps_table_pull(t, N, ids, rows);
    pdde_ps_table_push(t, N, ids, grads, 1);
    char path[300];
    snprintf(path, sizeof path, "%s/table.bin", g_dir);
    CHECK(pdde_ps_table_save(t, path) == PDDE_OK, "save: %s", pdde_last_error(ctx));
    char tmp[310];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "no temporary file left");
    CHECK(pdde_ps_table_load(u, path) == PDDE_OK, "load: %s", pdde_last_error(ctx));
    int same = 1;
    for (int i = 0; i < N; i++) {
        float a[5];
        pdde_ps_table_get(t, ids[i], a);
        same &= pdde_ps_table_get(u, ids[i], back) == PDDE_OK && memcmp(a, back, sizeof a) == 0;
    }
    CHECK(same, "every row loads back bit for bit");
    /* Adam's state came back too: one more identical push keeps them identical */
    pdde_ps_table_push(t, 1, ids, grads, 1), pdde_ps_table_push(u, 1, ids, grads, 1);
    float a[5];
    pdde_ps_table_get(t, ids[0], a), pdde_ps_table_get(u, ids[0], back);
    CHECK(memcmp(a, back, sizeof a) == 0, "optimizer state restored");
    /* a corrupt file fails and changes nothing */
    FILE *f = fopen(path, "r+b");
    fseek(f, 200, SEEK_SET), fputc(0x5a, f), fclose(f);
    pdde_ps_table_stats before, after;
    pdde_ps_table_stats_get(u, &before);
    CHECK(pdde_ps_table_load(u, path) == PDDE_ERR_CORRUPT, "a flipped byte is found");
    pdde_ps_table_stats_get(u, &after);
    CHECK(after.rows == before.rows && pdde_ps_table_get(u, ids[0], a) == PDDE_OK && memcmp(a, back, sizeof a) == 0, "the failed load changed nothing");
    pdde_ps_table_params q = table_params(6, PDDE_PS_ADAM);
    pdde_ps_table *w;
    pdde_ps_table_init(ctx, &q, &w);
    pdde_ps_table_save(t, path);
    CHECK(pdde_ps_table_load(w, path) == PDDE_ERR_MISMATCH, "another dim is refused");
    pdde_ps_table_free(t), pdde_ps_table_free(u), pdde_ps_table_free(w);
}

/* Heap bytes per touched id, measured by the allocator (mallinfo2), as ids grow. */
#define BYTES_PER_ID_BOUND 128.0 /* dim 16, SGD: a row is 16 + 64 bytes; the index at most ~34 more */
static void test_bytes_per_id(pdde_context *ctx) {
    pdde_ps_table_params p = table_params(16, PDDE_PS_SGD);
    enum { CHUNK = 4096 };
    static uint64_t ids[CHUNK];
    static float out[CHUNK * 16];
    double worst = 0;
    for (long n = 10000; n <= 10000000; n *= 10) { /* (10^7 ids: about 1 GB) */
        size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
        pdde_ps_table *t;
        pdde_ps_table_init(ctx, &p, &t);
        for (long i = 0; i < n; i += CHUNK) {
            long m = n - i < CHUNK ? n - i : CHUNK;
            for (long k = 0; k < m; k++) ids[k] = (uint64_t)(i + k) * 0x9E3779B97F4A7C15ull; /* spread over 2^64 */
            pdde_ps_table_pull(t, (size_t)m, ids, out);
        }
        size_t used = mallinfo2().uordblks + mallinfo2().hblkhd - before;
        if (!used) { /* another allocator (the sanitizers') that mallinfo2 does not see */
            test_skip("asan", "bytes per id: mallinfo2 sees no allocation (not glibc's allocator)");
            pdde_ps_table_free(t);
            return;
        }
        double per = (double)used / (double)n;
        printf("ps table: %ld ids, %.1f bytes per id (allocator)\n", n, per);
        if (per > worst) worst = per;
        pdde_ps_table_free(t);
    }
    CHECK(worst <= BYTES_PER_ID_BOUND, "bytes per id %.1f <= %.0f from 1e4 to 1e7 ids", worst, BYTES_PER_ID_BOUND);
}

/* ------------------------------------------------------------------------------------------------
 * The worker glue: multi-hot bags pooled by mean, empty slots, an id repeated across bags */

static void test_sparse_pooling(pdde_context *ctx) {
    enum { B = 2, F = 2, K = 3, C = 2 };
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_sparse_embedding *e = NULL;
    pdde_sparse_batch *sb = NULL;
    pdde_ps_client *c = NULL;
    pdde_graph_init(ctx, &g);
    pdde_tensor *pooled = pdde_sparse_embedding_init(g, "e", B, F, K, C, PDDE_POOL_MEAN, &e);
    pdde_tensor *loss = pdde_mean(g, pooled, -1, 0);
    pdde_mark_output(pooled);
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table = table_params(C, PDDE_PS_SGD);
    pp.table.lr = 1.0f;
    const uint64_t N = PDDE_SPARSE_NO_ID;
    uint64_t ids[B * F * K] = {7, 8, N, 9, N, N, 7, 7, 10, N, N, N}; /* the last bag is empty */
    pdde_status st = pdde_graph_status(g);
    if (!st) st = pdde_backward(g, loss);
    if (!st) st = pdde_session_init(g, NULL, &s);
    if (!st) st = pdde_ps_client_init(ctx, NULL, &pp, &c);
    if (!st) st = pdde_sparse_batch_init(e, &sb);
    float init[4 * C], out[B * F * C], after[4 * C];
    uint64_t uniq[4] = {7, 8, 9, 10};
    if (!st) st = pdde_ps_client_pull(c, 4, uniq, init);
    if (!st) st = pdde_sparse_batch_pull(sb, c, ids);
    if (!st) st = pdde_sparse_batch_feed(sb, s);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_session_read(s, pooled, out, sizeof out);
    if (!st) st = pdde_sparse_batch_collect(sb, s);
    if (!st) st = pdde_sparse_batch_push(sb, c);
    if (!st) st = pdde_ps_client_pull(c, 4, uniq, after);
    CHECK(st == PDDE_OK, "sparse pooling: %s", pdde_last_error(ctx));
    CHECK(!st && pdde_sparse_batch_unique_count(sb) == 4, "4 unique ids in the batch");
    /* bags: {7, 8}, {9}, {7, 7, 10}, {} */
    float want[B * F * C], grad[4 * C] = {0};
    for (int k = 0; k < C; k++) {
        float r7 = init[k], r8 = init[C + k], r9 = init[2 * C + k], r10 = init[3 * C + k];
        want[k] = (r7 + r8) / 2, want[C + k] = r9, want[2 * C + k] = (2 * r7 + r10) / 3, want[3 * C + k] = 0;
        float d = 1.0f / (B * F * C); /* d loss / d pooled */
        grad[k] = d / 2 + 2 * d / 3, grad[C + k] = d / 2, grad[2 * C + k] = d, grad[3 * C + k] = d / 3;
    }
    int ok = !st, ok_grad = !st;
    for (int i = 0; i < B * F * C; i++) ok &= test_close(out[i], want[i], 1e-6, 1e-7);
    for (int i = 0; i < 4 * C; i++) ok_grad &= test_close(init[i] - after[i], grad[i], 1e-5, 1e-7);
    CHECK(ok, "mean pooling over the non-empty slots (%g %g %g, want %g %g %g)", out[0], out[2], out[4], want[0], want[2], want[4]);
    CHECK(ok_grad, "row gradients pushed: id 7 gets both of its bags' (%g, want %g)", init[0] - after[0], grad[0]);
    /* the gradient accumulator was zeroed: a second step pushes the same gradient again, not twice it */
    float again[4 * C];
    if (!st) st = pdde_sparse_batch_pull(sb, c, ids);
    if (!st) st = pdde_sparse_batch_feed(sb, s);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_sparse_batch_collect(sb, s);
    if (!st) st = pdde_sparse_batch_push(sb, c);
    if (!st) st = pdde_ps_client_pull(c, 4, uniq, again);
    CHECK(!st && test_close(after[0] - again[0], grad[0], 1e-5, 1e-7), "the next step's gradient starts from zero (%g, want %g)", after[0] - again[0], grad[0]);
    pdde_sparse_batch_free(sb);
    pdde_ps_client_free(c);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(e);
}

/* ------------------------------------------------------------------------------------------------
 * Sync PS training equals one process */

#define SYNC_STEPS 8
#define SYNC_B 8
#define SYNC_SERVERS 2
#define SYNC_WORKERS 2
#define SYNC_PROBE 24
static const dlrm_config sync_cfg = {SYNC_B, 4, 8, 0.02f, DLRM_DENSE_ADAMW};
static dlrm_sample *g_samples;
static long g_n_samples;

#define SYNC_DENSE 594 /* the dense parameters' values: bottom 13x4+4, top1 (the first 512 of 108x8)+8, top2 8x2+2
                          (a rank's result is one pipe write) */
typedef struct { float losses[SYNC_STEPS]; float rows[SYNC_PROBE * 4]; float dense[SYNC_DENSE]; int ok; } sync_result;

/* dense_on_servers: the dense network's parameters are rows on the servers too, updated by their SGD
 * (lr 0.5, like the one process's graph SGD), instead of AdamW data-parallel over the workers. */
static pdde_ps_params sync_params(int dense_on_servers) {
    pdde_ps_params p = PDDE_PS_PARAMS_INIT;
    p.mode = PDDE_PS_SYNC, p.n_servers = SYNC_SERVERS;
    p.table = table_params(4, PDDE_PS_SGD); /* (not Adagrad or Adam: they would hide a wrongly scaled gradient) */
    p.table.lr = dense_on_servers ? 0.5f : 2.0f;
    return p;
}

static void probe_ids(uint64_t *ids) {
    for (int i = 0; i < SYNC_PROBE; i++) ids[i] = g_samples[i / DLRM_SPARSE].ids[i % DLRM_SPARSE];
}

/* Trains SYNC_STEPS steps of global batch SYNC_B x workers: worker w takes its slice of each global
 * batch (comm NULL: one process takes all of it, with its dense update in the graph: SGD when the
 * distributed run holds the dense parameters on the servers). */
static void sync_train(pdde_context *ctx, pdde_comm *world, pdde_comm *workers, pdde_ps_client *c, int w, int nw, int dense_on_servers,
                       sync_result *out) {
    dlrm_config cfg = sync_cfg;
    cfg.batch = SYNC_B * (world ? 1 : nw);
    if (dense_on_servers) cfg.dense = world ? DLRM_DENSE_ON_SERVERS : DLRM_DENSE_SGD, cfg.lr = sync_params(1).table.lr;
    int on_servers = cfg.dense == DLRM_DENSE_ON_SERVERS;
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_sparse_batch *sb = NULL;
    dlrm_model m = {0};
    pdde_graph_init(ctx, &g);
    uint64_t ids[SYNC_B * SYNC_WORKERS * DLRM_SPARSE];
    pdde_status st = dlrm_build(g, &cfg, &m);
    if (!st) st = pdde_session_init(g, NULL, &s);
    if (!st) st = pdde_sparse_batch_init(m.emb, &sb);
    if (!st && on_servers) st = pdde_sparse_batch_hold_dense(sb, s, c, w == 0); /* worker 0 seeds the servers */
    if (!st && on_servers) st = pdde_comm_barrier(workers);
    for (int step = 0; step < SYNC_STEPS && !st; step++) {
        const dlrm_sample *b = g_samples + (long)step * SYNC_B * nw + (world ? (long)w * SYNC_B : 0);
        st = dlrm_train_step(s, &m, sb, c, on_servers ? NULL : workers, b, ids);
        float loss = pdde_session_loss(s);
        if (workers) pdde_comm_allreduce(workers, &loss, &loss, 1, PDDE_F32, PDDE_REDUCE_AVG);
        out->losses[step] = loss;
    }
    uint64_t probe[SYNC_PROBE];
    probe_ids(probe);
    if (!st) st = pdde_ps_client_pull(c, SYNC_PROBE, probe, out->rows);
    if (!st && on_servers) { /* the servers' dense values into the session */
        dlrm_batch_ids(g_samples, cfg.batch, ids);
        st = pdde_sparse_batch_pull(sb, c, ids);
        if (!st) st = pdde_sparse_batch_feed(sb, s);
    }
    static const char *names[6] = {"bottom.w", "bottom.b", "top1.w", "top1.b", "top2.w", "top2.b"};
    size_t off = 0;
    static float whole[(DLRM_SPARSE + 1) * 4 * 8];
    for (int i = 0; i < 6 && !st; i++) {
        pdde_tensor *t = pdde_graph_find(g, names[i]);
        size_t n = t ? (size_t)pdde_tensor_numel(t) : 0, keep = i == 2 ? 512 : n;
        if (!t || n > sizeof whole / sizeof *whole || off + keep > SYNC_DENSE) st = PDDE_ERR_NOT_FOUND;
        else st = pdde_session_read(s, t, whole, n * sizeof(float));
        if (!st) memcpy(out->dense + off, whole, keep * sizeof(float));
        off += keep;
    }
    CHECK(st == PDDE_OK && off == SYNC_DENSE, "sync training: %s", pdde_last_error(ctx));
    out->ok = st == PDDE_OK;
    pdde_sparse_batch_free(sb);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(m.emb);
}

static void sync_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    int dense_on_servers = *(const int *)arg;
    pdde_ps_params p = sync_params(dense_on_servers);
    int rank = pdde_comm_rank(world);
    pdde_comm *workers = NULL;
    pdde_comm_split(world, rank < SYNC_SERVERS ? PDDE_COMM_NO_COLOR : 1, rank, &workers);
    if (rank < SYNC_SERVERS) { /* (each writing a checkpoint every 2 steps, as a sync round closes: the results stay the same) */
        char dir[300];
        snprintf(dir, sizeof dir, "%s/sync%d", g_dir, dense_on_servers);
        mkdir(dir, 0755);
        p.checkpoint_dir = dir, p.checkpoint_every = 2;
        pdde_ps_server *srv;
        pdde_ps_server_stats stats = {0};
        pdde_status st = pdde_ps_server_init(ctx, &p, rank, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        if (!st) pdde_ps_server_stats_get(srv, &stats);
        CHECK(st == PDDE_OK && stats.checkpoints >= SYNC_STEPS / 2, "server %d: %lld automatic checkpoints in %d sync steps: %s", rank,
              (long long)stats.checkpoints, SYNC_STEPS, pdde_last_error(ctx));
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    if (pdde_ps_client_init(ctx, world, &p, &c)) { CHECK(0, "client: %s", pdde_last_error(ctx)); return; }
    sync_train(ctx, world, workers, c, rank - SYNC_SERVERS, SYNC_WORKERS, dense_on_servers, test_rank_result);
    pdde_ps_client_free(c);
    pdde_comm_free(workers);
}

/* Sync PS training of 2 workers x batch B on 2 servers equals one process of batch 2B: losses, the
 * rows and the dense parameters (1e-4; NaN fails). */
static void test_sync_equals_one_process(pdde_context *ctx, int dense_on_servers) {
    const char *what = dense_on_servers ? "dense on the servers" : "dense data-parallel";
    static sync_result one, ranks[SYNC_SERVERS + SYNC_WORKERS];
    memset(&one, 0, sizeof one);
    pdde_ps_params p = sync_params(dense_on_servers);
    pdde_ps_client *local;
    pdde_ps_client_init(ctx, NULL, &p, &local);
    sync_train(ctx, NULL, NULL, local, 0, SYNC_WORKERS, dense_on_servers, &one);
    pdde_ps_client_free(local);
    test_run_ranks_into(SYNC_SERVERS + SYNC_WORKERS, ranks_params(), ranks, sizeof *ranks, sync_rank, &dense_on_servers, 120);
    sync_result *w0 = &ranks[SYNC_SERVERS];
    int ok = one.ok && w0->ok;
    double worst = 0;
    for (int i = 0; i < SYNC_STEPS; i++) {
        ok &= test_close(w0->losses[i], one.losses[i], 1e-4, 1e-6);
        if (fabs(w0->losses[i] - one.losses[i]) > worst) worst = fabs(w0->losses[i] - one.losses[i]);
    }
    for (int i = 0; i < SYNC_PROBE * 4; i++) ok &= test_close(w0->rows[i], one.rows[i], 1e-4, 1e-6);
    CHECK(ok, "sync PS (2 servers, 2 workers, %s) equals one process: loss %g vs %g at step %d, worst diff %g", what,
          w0->losses[SYNC_STEPS - 1], one.losses[SYNC_STEPS - 1], SYNC_STEPS, worst);
    char what_dense[96];
    snprintf(what_dense, sizeof what_dense, "sync PS (%s): the dense parameters after %d steps", what, SYNC_STEPS);
    double worst_dense = test_close_all(what_dense, w0->dense, one.dense, SYNC_DENSE, 1e-2, 1e-4);
    printf("sync PS (%s) vs one process: worst loss diff %.3g, worst dense parameter diff %.3g (relative)\n", what, worst, worst_dense);
    CHECK(w0->ok && memcmp(w0->dense, ranks[SYNC_SERVERS + 1].dense, sizeof w0->dense) == 0, "both workers hold the same dense parameters");
    CHECK(one.losses[SYNC_STEPS - 1] != one.losses[0], "training changes the loss");
    int moved = 0;
    pdde_ps_table_params tpp = p.table;
    pdde_ps_table *fresh;
    pdde_ps_table_init(ctx, &tpp, &fresh);
    uint64_t probe[SYNC_PROBE];
    float init[SYNC_PROBE * 4];
    probe_ids(probe);
    pdde_ps_table_pull(fresh, SYNC_PROBE, probe, init);
    for (int i = 0; i < SYNC_PROBE * 4; i++) moved += init[i] != one.rows[i];
    CHECK(moved > SYNC_PROBE, "the probed rows were trained (%d values moved)", moved);
    pdde_ps_table_free(fresh);
}

/* ------------------------------------------------------------------------------------------------
 * Async: bounded staleness */

#define ASYNC_K 1
#define ASYNC_STEPS 12
typedef struct { int64_t max_staleness, deferred, pushes, seen_ahead; int ok; } async_result;

static void async_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = PDDE_PS_PARAMS_INIT;
    p.mode = PDDE_PS_ASYNC, p.staleness = ASYNC_K, p.table = table_params(2, PDDE_PS_SGD);
    int rank = pdde_comm_rank(world);
    async_result *out = test_rank_result;
    if (rank == 0) {
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        pdde_ps_server_stats ss;
        if (!st) pdde_ps_server_stats_get(srv, &ss);
        CHECK(st == PDDE_OK, "async server: %s", pdde_last_error(ctx));
        if (!st) out->max_staleness = ss.max_staleness, out->deferred = ss.deferred_pulls, out->pushes = ss.pushes, out->ok = 1;
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    uint64_t ids[2] = {1, (uint64_t)rank * 100};
    float rows[4], g[4] = {0.1f, 0.1f, 0.1f, 0.1f}, init[2];
    /* Seen from the fast worker, not the server's counter: the shared row 1 moves by lr x 0.1 per push
     * of either worker, so a pull after its own `step` pushes tells how many the slow one has made. */
    pdde_ps_table *fresh;
    pdde_ps_table_init(ctx, &p.table, &fresh);
    pdde_ps_table_pull(fresh, 1, ids, init);
    pdde_ps_table_free(fresh);
    for (int step = 0; step < ASYNC_STEPS && !st; step++) {
        st = pdde_ps_client_pull(c, 2, ids, rows);
        int64_t applied = (int64_t)lround((init[0] - rows[0]) / (p.table.lr * g[0])), slow_pushes = applied - step;
        if (step - slow_pushes > out->seen_ahead) out->seen_ahead = step - slow_pushes;
        if (rank == 1) usleep(20000); /* the slow worker */
        if (!st) st = pdde_ps_client_push(c, 2, ids, g);
    }
    CHECK(st == PDDE_OK, "async worker %d: %s", rank, pdde_last_error(ctx));
    pdde_ps_client_free(c);
}

static void test_async_staleness(void) {
    async_result res[3];
    test_run_ranks_into(3, ranks_params(), res, sizeof *res, async_rank, NULL, 60);
    CHECK(res[0].ok && res[0].pushes == 2 * ASYNC_STEPS, "async: every push applied (%lld)", (long long)res[0].pushes);
    CHECK(res[0].ok && res[0].max_staleness <= ASYNC_K, "async: staleness %lld <= bound %d", (long long)res[0].max_staleness, ASYNC_K);
    CHECK(res[0].deferred > 0, "async: the bound held the fast worker back (%lld pulls deferred)", (long long)res[0].deferred);
    CHECK(res[2].seen_ahead > 0 && res[2].seen_ahead <= ASYNC_K, "async: the rows the fast worker pulled were at most %d of the slow one's pushes "
          "behind its own (seen: %lld)", ASYNC_K, (long long)res[2].seen_ahead);
}

/* ------------------------------------------------------------------------------------------------
 * Geo: the deltas pushed sum to the local copies' change */

#define GEO_STEPS 10
#define GEO_K 3
#define GEO_IDS 4
typedef struct { double delta_sum, expected; float server[GEO_IDS * 3]; int ok; } geo_result;

static float geo_grad(int rank, int step, int i) { return 0.05f * (float)((rank * 7 + step * 3 + i) % 11) - 0.2f; }

static void geo_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = PDDE_PS_PARAMS_INIT;
    p.mode = PDDE_PS_GEO, p.geo_steps = GEO_K, p.table = table_params(3, PDDE_PS_SGD);
    int rank = pdde_comm_rank(world);
    geo_result *out = test_rank_result;
    uint64_t ids[GEO_IDS] = {11, 12, 13, 14};
    if (rank == 0) {
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        for (int i = 0; i < GEO_IDS && !st; i++) st = pdde_ps_table_get(pdde_ps_server_table(srv), ids[i], out->server + 3 * i);
        CHECK(st == PDDE_OK, "geo server: %s", pdde_last_error(ctx));
        out->ok = !st;
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    float rows[GEO_IDS * 3], g[GEO_IDS * 3];
    for (int step = 0; step < GEO_STEPS && !st; step++) {
        st = pdde_ps_client_pull(c, GEO_IDS, ids, rows);
        for (int i = 0; i < GEO_IDS * 3; i++) g[i] = geo_grad(rank, step, i), out->expected -= 0.1 * g[i];
        if (!st) st = pdde_ps_client_push(c, GEO_IDS, ids, g);
    }
    if (!st) st = pdde_ps_client_flush(c);
    out->delta_sum = pdde_ps_client_geo_delta_sum(c);
    CHECK(st == PDDE_OK, "geo worker %d: %s", rank, pdde_last_error(ctx));
    out->ok = !st;
    pdde_ps_client_free(c);
}

static void test_geo(pdde_context *ctx) {
    geo_result res[3];
    test_run_ranks_into(3, ranks_params(), res, sizeof *res, geo_rank, NULL, 60);
    for (int w = 1; w <= 2; w++)
        CHECK(res[w].ok && test_close(res[w].delta_sum, res[w].expected, 1e-4, 1e-5),
              "geo worker %d: deltas pushed sum to %g, its local updates to %g", w, res[w].delta_sum, res[w].expected);
    /* the server's rows moved by exactly both workers' updates */
    pdde_ps_table_params p = table_params(3, PDDE_PS_SGD);
    pdde_ps_table *fresh;
    pdde_ps_table_init(ctx, &p, &fresh);
    uint64_t ids[GEO_IDS] = {11, 12, 13, 14};
    float init[GEO_IDS * 3];
    pdde_ps_table_pull(fresh, GEO_IDS, ids, init);
    int ok = res[0].ok;
    for (int i = 0; i < GEO_IDS * 3; i++) {
        double want = init[i];
        for (int w = 1; w <= 2; w++) for (int s = 0; s < GEO_STEPS; s++) want -= 0.1 * geo_grad(w, s, i);
        ok &= test_close(res[0].server[i], want, 1e-4, 1e-5);
    }
    CHECK(ok, "geo: the server's rows = initial + both workers' deltas (%g, want %g)", res[0].server[0], init[0]);
    pdde_ps_table_free(fresh);
}

/* ------------------------------------------------------------------------------------------------
 * Failures */

#define KILL_IDS 64
#define AUTO_EVERY 4
#define AUTO_STEPS 10
#define KILL_ADMIT 3   /* ids get a row at their third pull */
#define KILL_PENDING 8 /* ids pulled KILL_ADMIT - 1 times before the checkpoint: admitted at the first pull after the restart */
typedef struct {
    float rows[KILL_IDS * 2], at_end[KILL_IDS * 2], pending[KILL_PENDING * 2];
    int ok, failed_fast;
    double detect_s;
    int64_t checkpoints;
} kill_result;
static int g_restart; /* 0: first life (train, checkpoint, kill the server); 1: restarted from the checkpoint */
static int g_auto;    /* 0: the worker asks for a checkpoint after 3 steps; 1: the server writes one every
                         AUTO_EVERY steps by itself, and is killed after AUTO_STEPS */

static pdde_ps_params kill_params(void) {
    pdde_ps_params p = PDDE_PS_PARAMS_INIT;
    p.mode = PDDE_PS_ASYNC, p.staleness = 4, p.table = table_params(2, PDDE_PS_ADAGRAD);
    p.table.admit_after = KILL_ADMIT;
    static char auto_dir[300];
    snprintf(auto_dir, sizeof auto_dir, "%s/auto", g_dir);
    if (g_auto) p.checkpoint_dir = auto_dir, p.checkpoint_every = AUTO_EVERY;
    if (g_restart) p.load_dir = g_auto ? auto_dir : g_dir;
    return p;
}

/* Rank 0 serves (its stats into *stats when not NULL); returns the server's status. */
static pdde_status serve(pdde_context *ctx, pdde_comm *world, const pdde_ps_params *p, pdde_ps_server_stats *stats) {
    pdde_ps_server *srv;
    pdde_status st = pdde_ps_server_init(ctx, p, 0, &srv);
    if (!st) st = pdde_ps_server_run(srv, world);
    if (!st && stats) pdde_ps_server_stats_get(srv, stats);
    pdde_ps_server_free(srv);
    return st;
}

/* First life: train, have a checkpoint written (asked for, or automatic), note the rows it holds
 * (rows) and, automatic, those of the last step (at_end), kill the server and time how soon the
 * worker knows. Restarted: pull the rows. */
static void kill_server_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = kill_params();
    kill_result *out = test_rank_result;
    uint64_t ids[KILL_IDS], pending[KILL_PENDING];
    for (int i = 0; i < KILL_IDS; i++) ids[i] = (uint64_t)i * 1000003;
    for (int i = 0; i < KILL_PENDING; i++) pending[i] = 77 + (uint64_t)i;
    if (pdde_comm_rank(world) == 0) {
        pdde_ps_server_stats ss = {0};
        pdde_status st = serve(ctx, world, &p, &ss);
        CHECK(st == PDDE_OK, "server: %s", pdde_last_error(ctx));
        out->checkpoints = ss.checkpoints, out->ok = !st;
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    float g[KILL_IDS * 2];
    for (int i = 0; i < KILL_IDS * 2; i++) g[i] = 0.01f * (float)(i % 13) - 0.05f;
    if (!g_restart) {
        int steps = g_auto ? AUTO_STEPS : 3;
        float r[KILL_IDS * 2];
        for (int step = 1; step <= steps && !st; step++) {
            st = pdde_ps_client_pull(c, KILL_IDS, ids, r);
            if (!st) st = pdde_ps_client_push(c, KILL_IDS, ids, g);
            if (!st && g_auto && step == 2 * AUTO_EVERY) st = pdde_ps_client_pull(c, KILL_IDS, ids, out->rows);
        }
        for (int i = 0; i < KILL_ADMIT - 1 && !st && !g_auto; i++) st = pdde_ps_client_pull(c, KILL_PENDING, pending, out->pending);
        if (!st && !g_auto) st = pdde_ps_client_save(c, g_dir);
        if (!st) st = pdde_ps_client_pull(c, KILL_IDS, ids, g_auto ? out->at_end : out->rows);
        CHECK(st == PDDE_OK, "first life: %s", pdde_last_error(ctx));
        out->ok = !st;
        kill(test_pids[0], SIGKILL); /* the server, mid-job: no goodbye, no last checkpoint */
        double t0 = test_now();
        pdde_status lost = pdde_ps_client_pull(c, KILL_IDS, ids, r);
        out->detect_s = test_now() - t0;
        out->failed_fast = lost != PDDE_OK;
    } else {
        st = pdde_ps_client_pull(c, KILL_IDS, ids, out->rows);
        if (!st && !g_auto) st = pdde_ps_client_pull(c, KILL_PENDING, pending, out->pending);
        CHECK(st == PDDE_OK, "restarted: %s", pdde_last_error(ctx));
        out->ok = !st;
    }
    pdde_ps_client_free(c);
}

/* A server SIGKILLed and restarted from its checkpoint serves the rows it had: one the worker asked
 * for (auto 0), or the last one it wrote by itself (auto 1: of step 8, not the 10 it had done). */
static void test_server_restart(pdde_context *ctx, int automatic) {
    kill_result res[2];
    char dir[300], path[400], tmp[410];
    snprintf(dir, sizeof dir, "%s/auto", g_dir);
    if (automatic) mkdir(dir, 0700);
    test_ranks_params tp = ranks_params();
    tp.killed_ok = 1;
    g_restart = 0, g_auto = automatic;
    test_run_ranks_into(2, tp, res, sizeof *res, kill_server_rank, NULL, 60);
    CHECK(res[1].ok && res[1].failed_fast && res[1].detect_s < 10, "the killed server is an error at the worker (after %.2f s)", res[1].detect_s);
    float saved[KILL_IDS * 2];
    memcpy(saved, res[1].rows, sizeof saved);
    float none[KILL_PENDING * 2] = {0};
    if (!automatic) CHECK(memcmp(res[1].pending, none, sizeof none) == 0, "ids pulled %d times of %d have no row yet", KILL_ADMIT - 1, KILL_ADMIT);
    if (automatic) {
        pdde_ps_shard_path(path, sizeof path, dir, 0, 1);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && stat(tmp, &sb) != 0, "the server wrote %s by itself (and no .tmp is left)", path);
        CHECK(memcmp(res[1].at_end, saved, sizeof saved) != 0, "steps 9 and 10 changed the rows");
    }
    g_restart = 1;
    test_run_ranks_into(2, ranks_params(), res, sizeof *res, kill_server_rank, NULL, 60);
    CHECK(res[1].ok && memcmp(res[1].rows, saved, sizeof saved) == 0, "the restarted server serves the rows of its %s checkpoint (%g, want %g)",
          automatic ? "last automatic" : "", res[1].rows[0], saved[0]);
    if (!automatic) { /* the admission counts came back with the rows: the ids counted twice before the kill are in at their third pull */
        int admitted = 0;
        for (int i = 0; i < KILL_PENDING; i++) admitted += res[1].pending[2 * i] != 0 || res[1].pending[2 * i + 1] != 0;
        CHECK(res[1].ok && admitted == KILL_PENDING, "admission counts survive the restart: %d of %d ids pulled %d times before it have rows "
              "at the first pull after it", admitted, KILL_PENDING, KILL_ADMIT - 1);
    }
    if (automatic) CHECK(res[0].ok && res[0].checkpoints == 0, "a run that changes nothing writes no checkpoint (%lld)", (long long)res[0].checkpoints);
    /* and they are trained rows, not fresh ones (a load that did nothing would fail above) */
    pdde_ps_params p = kill_params();
    pdde_ps_table *fresh;
    pdde_ps_table_init(ctx, &p.table, &fresh);
    uint64_t id0 = 0;
    float init[2];
    pdde_ps_table_pull(fresh, 1, &id0, init);
    CHECK(init[0] != saved[0] || init[1] != saved[1], "the saved rows differ from initial ones");
    pdde_ps_table_free(fresh);
    g_restart = g_auto = 0;
}

#define PUSHES_BEFORE 3
typedef struct { int ok, failed, same_as_before, differs_from_after; } midpush_result;

static void midpush_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    pdde_ps_params p = kill_params();
    char kill_at[16];
    snprintf(kill_at, sizeof kill_at, "%d", PUSHES_BEFORE + 1);
    setenv("PDDE_TEST_PS_KILL_AT_PUSH", kill_at, 1); /* the client reads it at init: the worker dies mid-push */
    uint64_t ids[KILL_IDS];
    float g[KILL_IDS * 2], rows[KILL_IDS * 2];
    for (int i = 0; i < KILL_IDS; i++) ids[i] = (uint64_t)i * 1000003;
    for (int i = 0; i < KILL_IDS * 2; i++) g[i] = 0.01f * (float)(i % 13) - 0.05f;
    if (pdde_comm_rank(world) == 0) {
        midpush_result *out = test_rank_result;
        pdde_ps_server *srv;
        pdde_status st = pdde_ps_server_init(ctx, &p, 0, &srv);
        if (!st) st = pdde_ps_server_run(srv, world);
        out->failed = st != PDDE_OK; /* the worker died */
        /* the reference: the same table after exactly PUSHES_BEFORE pushes, and after one more */
        pdde_ps_table *ref;
        pdde_ps_table_init(ctx, &p.table, &ref);
        float a[KILL_IDS * 2], b[KILL_IDS * 2], got[KILL_IDS * 2];
        for (int k = 0; k < PUSHES_BEFORE; k++) pdde_ps_table_pull(ref, KILL_IDS, ids, rows), pdde_ps_table_push(ref, KILL_IDS, ids, g, 1);
        pdde_ps_table_pull(ref, KILL_IDS, ids, a);
        pdde_ps_table_push(ref, KILL_IDS, ids, g, 1);
        pdde_ps_table_pull(ref, KILL_IDS, ids, b);
        for (int i = 0; i < KILL_IDS; i++) pdde_ps_table_get(pdde_ps_server_table(srv), ids[i], got + 2 * i);
        out->same_as_before = memcmp(a, got, sizeof a) == 0;
        out->differs_from_after = memcmp(b, got, sizeof b) != 0;
        out->ok = 1;
        pdde_ps_table_free(ref);
        pdde_ps_server_free(srv);
        return;
    }
    pdde_ps_client *c;
    pdde_status st = pdde_ps_client_init(ctx, world, &p, &c);
    for (int step = 0; step <= PUSHES_BEFORE && !st; step++) { /* dies inside the last push */
        st = pdde_ps_client_pull(c, KILL_IDS, ids, rows);
        if (!st) st = pdde_ps_client_push(c, KILL_IDS, ids, g);
    }
    CHECK(0, "the worker should have died mid-push (%s)", pdde_last_error(ctx));
    pdde_ps_client_free(c);
}

static void test_worker_killed_mid_push(void) {
    midpush_result res[2];
    test_ranks_params tp = ranks_params();
    tp.killed_ok = 2;
    test_run_ranks_into(2, tp, res, sizeof *res, midpush_rank, NULL, 60);
    CHECK(res[0].ok && res[0].failed, "the server reports the worker lost");
    CHECK(res[0].same_as_before && res[0].differs_from_after, "no half-applied push: the rows are those after %d pushes", PUSHES_BEFORE);
}

/* ------------------------------------------------------------------------------------------------
 * The asynchronous pipeline */

#define PIPE_N 20
#define PIPE_SLOTS 3
typedef struct {
    pthread_mutex_t mu;
    int seen[3][PIPE_N];          /* times stage k ran batch i */
    int order_ok, in_flight, max_in_flight;
    int sleep_us[3];
    int64_t fail_at, slow_at;     /* stage 1 fails at / stage 0 sleeps 1.5 s at this batch (-1: never) */
    int slot_used[PIPE_SLOTS];
} pipe_probe;

typedef struct { pipe_probe *pr; int k; } pipe_stage_arg;

static pdde_status pipe_stage_fn(void *u, void *slot, int64_t i, int worker) {
    pipe_stage_arg *a = u;
    pipe_probe *pr = a->pr;
    (void)worker;
    pthread_mutex_lock(&pr->mu);
    if (i < 0 || i >= PIPE_N) pr->order_ok = 0;
    else {
        if (a->k > 0 && pr->seen[a->k - 1][i] != 1) pr->order_ok = 0; /* the stage before has not finished it */
        if (a->k == 0 && ++pr->in_flight > pr->max_in_flight) pr->max_in_flight = pr->in_flight;
        *(int *)slot += 1;
    }
    pthread_mutex_unlock(&pr->mu);
    usleep((useconds_t)pr->sleep_us[a->k]);
    if (a->k == 0 && i == pr->slow_at) usleep(1500000);
    if (a->k == 1 && i == pr->fail_at) return PDDE_ERR_IO;
    pthread_mutex_lock(&pr->mu);
    if (i >= 0 && i < PIPE_N) pr->seen[a->k][i]++;
    if (a->k == 2) pr->in_flight--;
    pthread_mutex_unlock(&pr->mu);
    return PDDE_OK;
}

/* A pipeline of three stages over a probe (workers: each stage's, 0 = sized). */
static pdde_status pipe_make(pdde_context *ctx, pipe_probe *pr, pipe_stage_arg *a, pdde_pipeline_stage *st, void **slots,
                             const int *workers, int max_threads, double timeout_s, pdde_pipeline **out) {
    static const char *names[3] = {"a", "b", "c"};
    for (int k = 0; k < 3; k++) {
        a[k] = (pipe_stage_arg){pr, k};
        st[k] = (pdde_pipeline_stage){names[k], pipe_stage_fn, &a[k], workers[k], 0, 0};
    }
    for (int i = 0; i < PIPE_SLOTS; i++) slots[i] = &pr->slot_used[i];
    pdde_pipeline_params p = PDDE_PIPELINE_PARAMS_INIT;
    p.n_stages = 3, p.stages = st, p.slots = slots, p.n_slots = PIPE_SLOTS, p.max_threads = max_threads, p.timeout_s = timeout_s;
    return pdde_pipeline_init(ctx, &p, out);
}

static void pipe_probe_init(pipe_probe *pr, int s0, int s1, int s2) {
    memset(pr, 0, sizeof *pr);
    pthread_mutex_init(&pr->mu, NULL);
    pr->order_ok = 1, pr->fail_at = pr->slow_at = -1;
    pr->sleep_us[0] = s0, pr->sleep_us[1] = s1, pr->sleep_us[2] = s2;
}

/* The deadline every timed wait here ends at (the pipeline's queues, the client's lanes; comm's service
 * thread too): s seconds from now, whole seconds and fraction, a valid timespec; no wait for a
 * negative or NaN s; a "forever" that does not wrap round. */
static void test_cond_deadline(void) {
    const double waits[] = {0.3, 1.7, 2.999999999, 12.5, 0, -1, NAN, 1e12};
    for (int i = 0; i < 8; i++) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        struct timespec d = cond_deadline(waits[i]);
        double ahead = (double)(d.tv_sec - now.tv_sec) + 1e-9 * (double)(d.tv_nsec - now.tv_nsec);
        double want = waits[i] > 0 ? (waits[i] < 1e9 ? waits[i] : 1e9) : 0;
        CHECK(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L && ahead >= want - 1e-6 && ahead < want + 0.05,
              "cond_deadline(%g): %.6f s ahead (want %g), tv_nsec %ld", waits[i], ahead, want, (long)d.tv_nsec);
    }
}

static void test_pipeline(pdde_context *ctx) {
    pipe_probe pr;
    pipe_stage_arg a[3];
    pdde_pipeline_stage st[3];
    void *slots[PIPE_SLOTS];
    pdde_pipeline *pl = NULL;
    /* every batch through every stage once, in stage order, at most PIPE_SLOTS in flight, overlapped */
    pipe_probe_init(&pr, 20000, 20000, 20000); /* (long sleeps: a loaded machine's wake-up delays matter less) */
    pdde_status s = pipe_make(ctx, &pr, a, st, slots, (int[]){1, 1, 1}, 3, 10, &pl);
    double t0 = test_now();
    if (!s) s = pdde_pipeline_run(pl, 0, PIPE_N);
    double wall = test_now() - t0;
    int once = 1, uses = 0;
    for (int k = 0; k < 3; k++) for (int i = 0; i < PIPE_N; i++) once &= pr.seen[k][i] == 1;
    for (int i = 0; i < PIPE_SLOTS; i++) uses += pr.slot_used[i] > 0;
    CHECK(s == PDDE_OK && once && pr.order_ok, "pipeline: every batch once through every stage, in order (%s)", pdde_last_error(ctx));
    CHECK(pr.max_in_flight <= PIPE_SLOTS && pr.max_in_flight >= 2 && uses == PIPE_SLOTS, "pipeline: %d batches in flight (bound %d), %d slots used",
          pr.max_in_flight, PIPE_SLOTS, uses);
    /* in turn it would take the stages' busy times summed (20 x 60 ms, more on a loaded machine);
     * overlapped, about a third of that */
    pdde_pipeline_stats ps;
    pdde_pipeline_stats_get(pl, &ps);
    double in_turn = ps.stage[0].busy_s + ps.stage[1].busy_s + ps.stage[2].busy_s;
    CHECK(wall < 0.75 * in_turn, "pipeline: stages overlap: %.3f s for %d batches that take %.3f s in turn", wall, PIPE_N, in_turn);
    CHECK(ps.batches == PIPE_N && ps.stage[1].batches == PIPE_N && ps.stage[1].busy_s > 0.3 && !strcmp(ps.sizing, "as given"),
          "pipeline stats: %lld batches, stage b busy %.3f s, sized %s", (long long)ps.batches, ps.stage[1].busy_s, ps.sizing);
    /* an error in a stage ends the run with it; the next run has every slot again */
    memset(pr.seen, 0, sizeof pr.seen), pr.fail_at = 5;
    s = pdde_pipeline_run(pl, 0, PIPE_N);
    CHECK(s == PDDE_ERR_IO && pr.seen[2][PIPE_N - 1] == 0, "pipeline: a stage's error is returned and stops the run (%d)", (int)s);
    CHECK(strstr(pdde_last_error(ctx), "stage 1 (b), batch 5") != NULL, "pipeline: the error names the stage and batch: %s", pdde_last_error(ctx));
    memset(pr.seen, 0, sizeof pr.seen), pr.fail_at = -1, pr.in_flight = 0;
    s = pdde_pipeline_run(pl, 0, PIPE_N);
    once = 1;
    for (int i = 0; i < PIPE_N; i++) once &= pr.seen[2][i] == 1;
    CHECK(s == PDDE_OK && once, "pipeline: runs again after an error (%s)", pdde_last_error(ctx));
    pdde_pipeline_free(pl);

    /* a stage that never delivers is a timeout naming the stage that waited, not a hang */
    pipe_probe_init(&pr, 0, 0, 0);
    pr.slow_at = 2;
    pipe_make(ctx, &pr, a, st, slots, (int[]){1, 1, 1}, 3, 0.3, &pl);
    t0 = test_now();
    s = pdde_pipeline_run(pl, 0, PIPE_N);
    CHECK(s == PDDE_ERR_TIMEOUT && strstr(pdde_last_error(ctx), "waited 0.3 s for a batch from the stage before") && test_now() - t0 < 10,
          "pipeline: a starved stage times out (%d: %s)", (int)s, pdde_last_error(ctx));
    pdde_pipeline_free(pl);

    /* sizing: the slow stage gets the threads, from a measured balance or from predictions */
    pipe_probe_init(&pr, 3000, 60000, 3000); /* (b far the slowest even when a loaded machine stretches the sleeps) */
    pipe_make(ctx, &pr, a, st, slots, (int[]){0, 0, 0}, 5, 10, &pl);
    s = pdde_pipeline_run(pl, 0, PIPE_N);
    pdde_pipeline_stats_get(pl, &ps);
    once = 1;
    for (int i = 0; i < PIPE_N; i++) once &= pr.seen[2][i] == 1;
    CHECK(s == PDDE_OK && once && ps.stage[1].workers == 3 && ps.stage[0].workers == 1 && strstr(ps.sizing, "measured"),
          "pipeline: measured sizing gives the slow stage 3 of 5 threads (%d %d %d: %s)", ps.stage[0].workers, ps.stage[1].workers,
          ps.stage[2].workers, ps.sizing);
    pdde_pipeline_free(pl);
    pipe_probe_init(&pr, 0, 0, 0);
    pipe_make(ctx, &pr, a, st, slots, (int[]){0, 0, 0}, 4, 10, &pl);
    st[0].predicted_s = 0.001, st[1].predicted_s = 0.001, st[2].predicted_s = 0.004;
    pdde_pipeline_free(pl);
    pdde_pipeline_params pp = PDDE_PIPELINE_PARAMS_INIT;
    pp.n_stages = 3, pp.stages = st, pp.slots = slots, pp.n_slots = PIPE_SLOTS, pp.max_threads = 4;
    pdde_pipeline_init(ctx, &pp, &pl);
    s = pdde_pipeline_run(pl, 0, PIPE_N);
    pdde_pipeline_stats_get(pl, &ps);
    CHECK(s == PDDE_OK && ps.stage[2].workers == 2 && strstr(ps.sizing, "predictions"), "pipeline: sized from predictions (%d %d %d: %s)",
          ps.stage[0].workers, ps.stage[1].workers, ps.stage[2].workers, ps.sizing);
    pdde_pipeline_free(pl);
    pp.n_slots = 0;
    CHECK(pdde_pipeline_init(ctx, &pp, &pl) == PDDE_ERR_INVALID_ARG && !pl, "pipeline: no slots is an error");
    pthread_mutex_destroy(&pr.mu);
}

/* ------------------------------------------------------------------------------------------------
 * The reader and AUC on synthetic data */

static void test_reader(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/bad.tsv", g_dir);
    FILE *f = fopen(path, "w");
    char good[512] = "1", *p = good + 1;
    for (int j = 0; j < DLRM_DENSE; j++) p += sprintf(p, j == 2 ? "\t" : "\t%d", j);
    for (int j = 0; j < DLRM_SPARSE; j++) p += sprintf(p, j == 5 ? "\t" : "\t%x", 0xabc + j);
    fprintf(f, "%s\n", good);
    fprintf(f, "1\t2\t3\n");                    /* too few fields */
    fprintf(f, "%s\textra\n", good);            /* too many */
    fprintf(f, "2%s\n", good + 1);              /* bad label */
    fprintf(f, "0\tx%s\n", strchr(good + 2, '\t')); /* bad integer */
    for (int i = 0; i < 5000; i++) fputc('7', f); /* over-long */
    fputc('\n', f);
    fprintf(f, "%s\r\n", good);                 /* CRLF is fine */
    /* over-long with a NUL byte in it, a good line in its rest past the reader's buffer: one malformed line */
    fputc('x', f), fputc(0, f);
    for (int i = 2; i < DLRM_LINE_MAX + 2; i++) fputc('7', f);
    fprintf(f, "%s\n", good);
    /* a field's edges, each a line with field `field` (0: the label, 1..13 integers, 14.. ids) replaced */
    static const struct { int field; const char *text; int ok; } edge[] = {
        {3, "9223372036854775807", 1}, {3, "-9223372036854775808", 1}, {3, "+7", 1}, {3, "-3", 1}, {15, "ABCDEF01", 1},
        {3, "9223372036854775808", 0}, {3, "99999999999999999999999", 0}, {3, "-", 0}, {3, "+", 0}, {3, "4 ", 0},
        {3, "1.5", 0}, {15, "123456789", 0}, {15, "0x12", 0}, {15, "12g", 0}, {15, "-1", 0}, {0, "10", 0}, {0, "", 0}};
    int n_edge = (int)(sizeof edge / sizeof *edge), edge_ok = 0;
    for (int e = 0; e < n_edge; e++) {
        const char *q = good;
        for (int k = 0; k < edge[e].field; k++) q = strchr(q, '\t') + 1;
        const char *tail = strchr(q, '\t');
        fprintf(f, "%.*s%s%s\n", (int)(q - good), good, edge[e].text, tail ? tail : "");
        edge_ok += edge[e].ok;
    }
    fclose(f);
    long n = 0, bad = 0;
    dlrm_sample *s = dlrm_load(path, &n, &bad);
    CHECK(s && n == 2 + edge_ok && bad == 6 + n_edge - edge_ok, "reader: %ld samples, %ld malformed (want %d, %d)", n, bad, 2 + edge_ok,
          6 + n_edge - edge_ok);
    if (s && n >= 1) {
        CHECK(s[0].label == 1 && s[0].dense[2] == 0 && fabsf(s[0].dense[3] - logf(4)) < 1e-6f, "dense fields parsed (empty = 0)");
        CHECK(s[0].ids[5] == PDDE_SPARSE_NO_ID && s[0].ids[6] == ((uint64_t)6 << 32 | 0xac2), "ids keyed by field, empty = none");
    }
    if (s && n == 2 + edge_ok) { /* the accepted edges in order, after the two good lines */
        const dlrm_sample *v = s + 2;
        CHECK(v[0].dense[2] == (float)log1p(9223372036854775807.0) && v[1].dense[2] == 0 && v[2].dense[2] == (float)log1p(7.0) &&
                  v[3].dense[2] == 0 && v[4].ids[1] == ((uint64_t)1 << 32 | 0xabcdef01u),
              "integer and id edges: int64's ends, a sign, upper-case hex (%g %g %g %g %llx)", v[0].dense[2], v[1].dense[2], v[2].dense[2],
              v[3].dense[2], (unsigned long long)v[4].ids[1]);
    }
    free(s);
}

/* Batch k of an array of samples (wrapping around). */
typedef struct { const dlrm_sample *v; long n; int batch; } sample_source;
static pdde_status source_batch(void *u, int64_t k, dlrm_sample *out) {
    const sample_source *src = u;
    long per = src->n / src->batch;
    memcpy(out, src->v + (k % per) * src->batch, (size_t)src->batch * sizeof *out);
    return PDDE_OK;
}

/* Trains a DLRM model on src for n batches, in turn (slots 0) or through the pipeline with n_slots,
 * then predicts the first n_eval samples of eval (p) and pulls the probe rows (rows). cluster: the
 * stages sized by the cost model on it (CPU device 0, dense device 1; up to 5 threads, stats into ps). */
static pdde_status pipe_train(pdde_context *ctx, const dlrm_config *cfg, const pdde_ps_params *pp, sample_source *src, long n, int n_slots,
                              const dlrm_sample *eval, long n_eval, double *p, float *rows, const pdde_cluster *cluster,
                              pdde_pipeline_stats *ps) {
    pdde_graph *g;
    pdde_session *s = NULL;
    dlrm_model m = {0};
    pdde_ps_client *c = NULL;
    dlrm_slot sl[4] = {{0}};
    void *slot_ptr[4];
    pdde_pipeline *pl = NULL;
    pdde_graph_init(ctx, &g);
    pdde_status st = dlrm_build(g, cfg, &m);
    if (!st) st = pdde_session_init(g, NULL, &s);
    if (!st) st = pdde_ps_client_init(ctx, NULL, pp, &c);
    for (int i = 0; i < (n_slots ? n_slots : 1) && !st; i++) st = dlrm_slot_init(&sl[i], &m), slot_ptr[i] = &sl[i];
    dlrm_stages d = {&m, s, c, NULL, source_batch, src};
    pdde_pipeline_stage stages[3];
    dlrm_stages_fill(&d, stages);
    if (!st && cluster && dlrm_stages_predict(ctx, cluster, g, &m, pp->table.optimizer, 0, 1, 0, stages) != 3)
        st = pdde_error(ctx, PDDE_ERR_NO_PLAN, "the cost model predicted %g %g %g s for the stages", stages[0].predicted_s,
                        stages[1].predicted_s, stages[2].predicted_s);
    if (!st && n_slots) {
        pdde_pipeline_params plp = PDDE_PIPELINE_PARAMS_INIT;
        plp.n_stages = 3, plp.stages = stages, plp.slots = slot_ptr, plp.n_slots = n_slots, plp.max_threads = cluster ? 5 : 3;
        st = pdde_pipeline_init(ctx, &plp, &pl);
        if (!st) st = pdde_pipeline_run(pl, 0, n);
        if (!st && ps) pdde_pipeline_stats_get(pl, ps);
    }
    for (long k = 0; k < n && !st && !n_slots; k++)
        for (int i = 0; i < 3 && !st; i++) st = stages[i].fn(stages[i].user, &sl[0], k, 0);
    if (!st) st = dlrm_predict(s, &m, sl[0].sb, c, eval, n_eval, p, sl[0].ids);
    uint64_t probe[SYNC_PROBE];
    probe_ids(probe);
    if (!st && rows) st = pdde_ps_client_pull(c, SYNC_PROBE, probe, rows);
    pdde_pipeline_free(pl);
    for (int i = 0; i < 4; i++) dlrm_slot_free(&sl[i]);
    pdde_ps_client_free(c);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(m.emb);
    return st;
}

/* One slot: the pipeline is the step in turn, bit for bit (the stages hand the same buffers on). */
static void test_pipeline_one_slot(pdde_context *ctx) {
    pdde_ps_params pp = sync_params(0);
    sample_source src = {g_samples, g_n_samples, SYNC_B};
    double p1[64], p2[64];
    float r1[SYNC_PROBE * 4], r2[SYNC_PROBE * 4];
    pdde_status a = pipe_train(ctx, &sync_cfg, &pp, &src, 12, 0, g_samples, 64, p1, r1, NULL, NULL);
    pdde_status b = pipe_train(ctx, &sync_cfg, &pp, &src, 12, 1, g_samples, 64, p2, r2, NULL, NULL);
    CHECK(!a && !b && memcmp(p1, p2, sizeof p1) == 0 && memcmp(r1, r2, sizeof r1) == 0 && !isnan(p1[0]),
          "dlrm through a one-slot pipeline = in turn: p %g vs %g (%s)", p1[0], p2[0], pdde_last_error(ctx));
}

/* A cluster of a CPU (device 0) and an accelerator (device 1) known by peak figures only, the CPU's
 * lookups (the embedding curve) taking lookup_s per byte. */
static pdde_cluster *sizing_cluster(double lookup_s) {
    pdde_cluster *c;
    if (pdde_cluster_init("sizing", &c)) return NULL;
    pdde_device_spec cpu = {.name = "cpu", .kind = PDDE_DEVICE_CPU, .backend = "cpu", .peak_flops = 1e11, .mem_bandwidth = 1e10};
    cpu.n_curve[PDDE_OPCLASS_EMBEDDING] = 1;
    cpu.curve[PDDE_OPCLASS_EMBEDDING][0] = (pdde_curve_point){1, lookup_s}; /* (beyond its one point: its bandwidth) */
    pdde_device_spec acc = {.name = "accel", .kind = PDDE_DEVICE_ACCEL, .backend = "opencl", .peak_flops = 1e10, .mem_bandwidth = 1e10};
    pdde_cluster_machine mm = {.id = 0, .name = "m"};
    int sc = pdde_cluster_add_spec(c, &cpu), sa = pdde_cluster_add_spec(c, &acc), mi = pdde_cluster_add_machine(c, &mm);
    pdde_cluster_add_device(c, mi, &(pdde_cluster_device){0, sc, 1ull << 32});
    pdde_cluster_add_device(c, mi, &(pdde_cluster_device){1, sa, 1ull << 32});
    return c;
}

/* The planner's cost model sizes the pipeline: predictions from the cluster's device figures, and a
 * stage whose device is made slower gets more workers. */
static void test_pipeline_cost_sizing(pdde_context *ctx) {
    pdde_ps_params pp = sync_params(0);
    sample_source src = {g_samples, g_n_samples, SYNC_B};
    double p[SYNC_B];
    pdde_pipeline_stats fast, slow;
    memset(&fast, 0, sizeof fast), memset(&slow, 0, sizeof slow);
    pdde_cluster *c = sizing_cluster(1e-10); /* lookups at 10 GB/s: the dense step on the slow accelerator is the longest */
    pdde_status a = c ? pipe_train(ctx, &sync_cfg, &pp, &src, 6, 3, g_samples, SYNC_B, p, NULL, c, &fast) : PDDE_ERR_OOM;
    pdde_cluster_free(c);
    c = sizing_cluster(1e-6); /* lookups at 1 MB/s: pulling is the longest */
    pdde_status b = c ? pipe_train(ctx, &sync_cfg, &pp, &src, 6, 3, g_samples, SYNC_B, p, NULL, c, &slow) : PDDE_ERR_OOM;
    pdde_cluster_free(c);
    printf("sized by the cost model: fast lookups %s\n  slow lookups %s\n", fast.sizing, slow.sizing);
    CHECK(!a && !b && strstr(fast.sizing, "predictions") && strstr(slow.sizing, "predictions"), "the cost model's predictions size the pipeline (%s)",
          pdde_last_error(ctx));
    CHECK(fast.stage[1].predicted_s > fast.stage[0].predicted_s && fast.stage[0].workers == 1 && fast.stage[2].workers == 1,
          "fast lookups: the dense stage (%.3g ms) is the longest, pull and push keep 1 worker (%d, %d)", 1e3 * fast.stage[1].predicted_s,
          fast.stage[0].workers, fast.stage[2].workers);
    CHECK(slow.stage[0].predicted_s > 100 * fast.stage[0].predicted_s && slow.stage[1].predicted_s == fast.stage[1].predicted_s,
          "slow lookups: only the pull stage's prediction grows (%.3g -> %.3g ms)", 1e3 * fast.stage[0].predicted_s, 1e3 * slow.stage[0].predicted_s);
    CHECK(slow.stage[0].workers == 3 && slow.stage[2].workers == 1, "slow lookups: the pull stage gets the spare threads (%d workers, push %d)",
          slow.stage[0].workers, slow.stage[2].workers);
}

static void test_auc(pdde_context *ctx) {
    enum { TRAIN = 49152, TEST = 8192, VOCAB = 20, EPOCHS = 3 };
    char path[300];
    snprintf(path, sizeof path, "%s/synth.tsv", g_dir);
    double *p_true = malloc((size_t)(TRAIN + TEST) * sizeof *p_true), *p = malloc((size_t)TEST * sizeof *p);
    int *y = malloc(TEST * sizeof *y);
    long n = 0, bad = 0;
    dlrm_sample *s = NULL;
    if (dlrm_synthesize(path, TRAIN + TEST, VOCAB, 3, p_true) == 0) s = dlrm_load(path, &n, &bad);
    CHECK(s && n == TRAIN + TEST && bad == 0, "synthetic data read back: %ld samples, %ld malformed", n, bad);
    if (!s || n != TRAIN + TEST) { free(s), free(p_true), free(p), free(y); return; }
    for (int i = 0; i < TEST; i++) y[i] = s[TRAIN + i].label;
    double ceiling = dlrm_auc(p_true + TRAIN, y, TEST);
    dlrm_config cfg = {256, 4, 16, 0.01f, DLRM_DENSE_ADAMW};
    pdde_graph *g;
    pdde_session *ss = NULL;
    pdde_sparse_batch *sb = NULL;
    dlrm_model m = {0};
    pdde_graph_init(ctx, &g);
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table = table_params(cfg.dim, PDDE_PS_ADAGRAD);
    pp.table.lr = 0.05f, pp.table.init_std = 0.01f;
    pdde_ps_client *c = NULL;
    static uint64_t ids[256 * DLRM_SPARSE];
    pdde_status st = dlrm_build(g, &cfg, &m);
    if (!st) st = pdde_session_init(g, NULL, &ss);
    if (!st) st = pdde_sparse_batch_init(m.emb, &sb);
    if (!st) st = pdde_ps_client_init(ctx, NULL, &pp, &c);
    double t0 = test_now();
    for (int epoch = 0; epoch < EPOCHS && !st; epoch++)
        for (int i = 0; i + cfg.batch <= TRAIN && !st; i += cfg.batch) st = dlrm_train_step(ss, &m, sb, c, NULL, s + i, ids);
    if (!st) st = dlrm_predict(ss, &m, sb, c, s + TRAIN, TEST, p, ids);
    CHECK(st == PDDE_OK, "dlrm training: %s", pdde_last_error(ctx));
    double auc = st ? NAN : dlrm_auc(p, y, TEST), ll = st ? NAN : dlrm_logloss(p, y, TEST), best_ll = dlrm_logloss(p_true + TRAIN, y, TEST);
    printf("dlrm synthetic: AUC %.4f (ceiling %.4f), logloss %.4f (ceiling %.4f), %.1f s\n", auc, ceiling, ll, best_ll, test_now() - t0);
    CHECK(auc >= ceiling - 0.01, "AUC %.4f within 0.01 of the ground truth's %.4f", auc, ceiling);
    /* the same through the asynchronous pipeline, 4 batches in flight (rows up to 3 pushes stale) */
    sample_source src = {s, TRAIN, cfg.batch};
    t0 = test_now();
    st = pipe_train(ctx, &cfg, &pp, &src, (long)EPOCHS * (TRAIN / cfg.batch), 4, s + TRAIN, TEST, p, NULL, NULL, NULL);
    double auc_pipe = st ? NAN : dlrm_auc(p, y, TEST);
    printf("dlrm synthetic, pipelined (4 slots): AUC %.4f, %.1f s\n", auc_pipe, test_now() - t0);
    CHECK(auc_pipe >= ceiling - 0.01, "pipelined: AUC %.4f within 0.01 of the ground truth's %.4f (%s)", auc_pipe, ceiling, st ? pdde_last_error(ctx) : "");
    pdde_ps_client_free(c);
    pdde_sparse_batch_free(sb);
    pdde_session_free(ss);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(m.emb);
    free(s), free(p_true), free(p), free(y);
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    cp.n_threads = 1;
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    snprintf(g_dir, sizeof g_dir, "/tmp/pdde_test_ps_%d", (int)getpid());
    mkdir(g_dir, 0700);
    test_table_rows(ctx);
    test_table_optimizers(ctx);
    test_table_admission_eviction(ctx);
    test_table_save_load(ctx);
    test_bytes_per_id(ctx);
    test_sparse_pooling(ctx);
    test_reader();
    test_cond_deadline();
    test_pipeline(ctx);

    char synth[300];
    snprintf(synth, sizeof synth, "%s/sync.tsv", g_dir);
    long bad;
    if (dlrm_synthesize(synth, SYNC_B * SYNC_WORKERS * SYNC_STEPS + 64, 30, 11, NULL) == 0) g_samples = dlrm_load(synth, &g_n_samples, &bad);
    pdde_store_server *srv = NULL;
    if (pdde_store_server_init(ctx, "127.0.0.1:0", &srv) == PDDE_OK && g_samples) {
        g_server = srv;
        snprintf(g_addr, sizeof g_addr, "127.0.0.1:%d", pdde_store_server_port(srv));
        test_sync_equals_one_process(ctx, 0);
        test_sync_equals_one_process(ctx, 1);
        test_pipeline_one_slot(ctx);
        test_pipeline_cost_sizing(ctx);
        test_async_staleness();
        test_geo(ctx);
        test_server_restart(ctx, 0);
        test_server_restart(ctx, 1);
        test_worker_killed_mid_push();
    } else CHECK(0, "store server / sample data: %s", pdde_last_error(ctx));
    pdde_store_server_free(srv);
    test_auc(ctx);
    free(g_samples);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {}
    pdde_context_free(ctx);
    return test_finish();
}
