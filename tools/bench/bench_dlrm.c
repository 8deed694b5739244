/* bench_dlrm — DLRM training throughput on the same Criteo-format data, in one run: CPU only (every
 * stage in turn, the dense network on the CPU), accelerator only (every stage in turn, the dense
 * network on the OpenCL device), and the asynchronous heterogeneous pipeline (stage 1: parse the TSV
 * lines and pull the rows, on a CPU thread; stage 2: the dense forward and backward on the
 * accelerator; stage 3: push the rows' gradients, on a CPU thread; bounded queues between them, so a
 * batch is pulled while the one before it trains and the one before that is pushed — a staleness of
 * at most the queue depth, like async mode). Then the table's heap bytes per touched id as ids grow
 * from 10^4 to 10^7 (BENCH_DLRM_MAX_IDS lowers the top).
 *
 *   bench_dlrm [--batches N] [--reps R] [--batch B]
 * Last line: RESULT dlrm cpu_only=<samples/s> accel_only=<samples/s> hetero=<samples/s>
 *            hetero_ratio=<hetero / best single kind> bytes_per_id=<largest measured> (medians of R) */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/dlrm.h"
#include "tools/bench/bench_common.h"
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The data: the TSV file in memory, parsed batch by batch inside the timed runs (parsing is stage 1's
 * work as much as pulling is). */
typedef struct { char *text; long *line; long n_lines; } corpus;

static int corpus_load(const char *path, corpus *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    c->text = malloc((size_t)n + 1);
    c->line = malloc(((size_t)n / 40 + 1) * sizeof *c->line);
    if (!c->text || !c->line || fread(c->text, 1, (size_t)n, f) != (size_t)n) { fclose(f); return -1; }
    fclose(f);
    c->text[n] = 0;
    c->n_lines = 0;
    for (long i = 0; i < n; i++) {
        if (i == 0 || c->text[i - 1] == '\n') c->line[c->n_lines++] = i;
        if (c->text[i] == '\n') c->text[i] = 0;
    }
    return 0;
}

typedef struct {
    dlrm_sample *samples;
    uint64_t *ids;
    pdde_sparse_batch *sb;
    long index;
} slot;

typedef struct {
    pdde_context *ctx;
    const corpus *data;
    dlrm_model m;
    pdde_session *s;
    pdde_ps_client *c;
    dlrm_reader parse_errors;
    int batch;
    pdde_status st;
} runner;

static pdde_status stage1(runner *r, slot *sl, long k) {
    char buf[DLRM_LINE_MAX + 1];
    long first = (k * r->batch) % (r->data->n_lines - r->batch);
    for (int i = 0; i < r->batch; i++) {
        snprintf(buf, sizeof buf, "%s", r->data->text + r->data->line[first + i]);
        if (!dlrm_parse_line(&r->parse_errors, buf, &sl->samples[i])) memset(&sl->samples[i], 0, sizeof sl->samples[i]);
    }
    sl->index = k;
    dlrm_batch_ids(sl->samples, r->batch, sl->ids);
    return pdde_sparse_batch_pull(sl->sb, r->c, sl->ids);
}

static pdde_status stage2(runner *r, slot *sl) {
    pdde_status st = pdde_sparse_batch_feed(sl->sb, r->s);
    if (!st) st = dlrm_feed_dense(r->s, &r->m, sl->samples);
    if (!st) st = pdde_session_run(r->s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_sparse_batch_collect(sl->sb, r->s);
    if (!st) st = pdde_session_run(r->s, PDDE_RUN_OPTIMIZER);
    return st;
}

static pdde_status stage3(runner *r, slot *sl) { return pdde_sparse_batch_push(sl->sb, r->c); }

/* A bounded queue of slots; every wait gives up after 60 s. */
#define QCAP 8
typedef struct {
    slot *v[QCAP];
    int head, n, cap;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} queue;

static void q_init(queue *q, int cap) {
    memset(q, 0, sizeof *q);
    q->cap = cap;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}

static int q_wait(queue *q, int want_space) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    while (want_space ? q->n == q->cap : q->n == 0)
        if (pthread_cond_timedwait(&q->cv, &q->mu, &dl)) return -1;
    return 0;
}

static int q_put(queue *q, slot *s) {
    pthread_mutex_lock(&q->mu);
    int rc = q_wait(q, 1);
    if (!rc) q->v[(q->head + q->n++) % QCAP] = s;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static slot *q_get(queue *q) {
    pthread_mutex_lock(&q->mu);
    slot *s = NULL;
    if (!q_wait(q, 0)) s = q->v[q->head], q->head = (q->head + 1) % QCAP, q->n--;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return s;
}

typedef struct { runner *r; queue *in, *out; long n; int stage; } stage_arg;

static void *stage_thread(void *p) {
    stage_arg *a = p;
    for (long k = 0; k < a->n; k++) {
        slot *s = q_get(a->in);
        pdde_status st = s ? PDDE_OK : PDDE_ERR_TIMEOUT;
        if (!st && !a->r->st) st = a->stage == 1 ? stage1(a->r, s, k) : a->stage == 2 ? stage2(a->r, s) : stage3(a->r, s);
        if (st && !a->r->st) a->r->st = st;
        if (!s || q_put(a->out, s)) { a->r->st = PDDE_ERR_TIMEOUT; break; }
    }
    return NULL;
}

#define SLOTS 4

/* samples/s of n batches, either each batch through the three stages in turn or pipelined. */
static double run(runner *r, slot *slots, long n, int pipelined) {
    double t0 = now_s();
    if (!pipelined) {
        for (long k = 0; k < n && !r->st; k++) {
            r->st = stage1(r, &slots[0], k);
            if (!r->st) r->st = stage2(r, &slots[0]);
            if (!r->st) r->st = stage3(r, &slots[0]);
        }
    } else {
        queue free_q, q12, q23;
        q_init(&free_q, SLOTS), q_init(&q12, 2), q_init(&q23, 2);
        for (int i = 0; i < SLOTS; i++) q_put(&free_q, &slots[i]);
        stage_arg a[3] = {{r, &free_q, &q12, n, 1}, {r, &q12, &q23, n, 2}, {r, &q23, &free_q, n, 3}};
        pthread_t th[3];
        for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, stage_thread, &a[i]);
        for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    }
    return r->st ? NAN : (double)n * r->batch / (now_s() - t0);
}

/* Builds the model with its dense layer on device (-1: the CPU) and measures. */
static double measure(pdde_context *ctx, const corpus *data, int batch, int device, int pipelined, long n, int reps) {
    runner r = {.ctx = ctx, .data = data, .batch = batch};
    snprintf(r.parse_errors.path, sizeof r.parse_errors.path, "bench data");
    dlrm_config cfg = {batch, 16, 256, 0.01f};
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int layer_dev[2] = {0, device < 0 ? 0 : device};
    sp.layer_devices = layer_dev, sp.n_layer_devices = 2;
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = cfg.dim, pp.table.optimizer = PDDE_PS_ADAGRAD, pp.table.lr = 0.05f, pp.table.init_std = 0.01f;
    slot slots[SLOTS] = {0};
    double times[16], result = NAN;
    r.st = dlrm_build(g, &cfg, &r.m);
    if (!r.st) r.st = pdde_session_init(g, &sp, &r.s);
    if (!r.st) r.st = pdde_ps_client_init(ctx, NULL, &pp, &r.c);
    for (int i = 0; i < SLOTS && !r.st; i++) {
        slots[i].samples = malloc((size_t)batch * sizeof(dlrm_sample));
        slots[i].ids = malloc((size_t)batch * DLRM_SPARSE * sizeof(uint64_t));
        r.st = pdde_sparse_batch_init(r.m.emb, &slots[i].sb);
    }
    if (!r.st) run(&r, slots, 4, pipelined); /* warm up: kernels built, rows created */
    for (int i = 0; i < reps && !r.st; i++) times[i] = run(&r, slots, n, pipelined);
    if (r.st) fprintf(stderr, "bench_dlrm: %s\n", pdde_last_error(ctx));
    else result = bench_median(times, reps);
    for (int i = 0; i < SLOTS; i++) free(slots[i].samples), free(slots[i].ids), pdde_sparse_batch_free(slots[i].sb);
    pdde_ps_client_free(r.c);
    pdde_session_free(r.s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(r.m.emb);
    return result;
}

/* The table's heap bytes per touched id (the allocator's count), the largest from 10^4 to max_ids. */
static double bytes_per_id(pdde_context *ctx, long max_ids) {
    pdde_ps_table_params p = PDDE_PS_TABLE_PARAMS_INIT;
    p.dim = 16, p.init_std = 0.01f;
    enum { CHUNK = 8192 };
    uint64_t *ids = malloc(CHUNK * sizeof *ids);
    float *out = malloc(CHUNK * 16 * sizeof *out);
    double worst = 0;
    for (long n = 10000; n <= max_ids && ids && out; n *= 10) {
        size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
        pdde_ps_table *t;
        if (pdde_ps_table_init(ctx, &p, &t)) break;
        double t0 = now_s();
        for (long i = 0; i < n; i += CHUNK) {
            long m = n - i < CHUNK ? n - i : CHUNK;
            for (long k = 0; k < m; k++) ids[k] = (uint64_t)(i + k) * 0x9E3779B97F4A7C15ull;
            pdde_ps_table_pull(t, (size_t)m, ids, out);
        }
        double per = (double)(mallinfo2().uordblks + mallinfo2().hblkhd - before) / (double)n;
        printf("table, dim 16, Adagrad: %9ld ids  %6.1f bytes per id (allocator; a row's values and state are %d)  %.2f M ids/s\n",
               n, per, 2 * 16 * 4, (double)n / (now_s() - t0) / 1e6);
        if (per > worst) worst = per;
        pdde_ps_table_free(t);
    }
    free(ids), free(out);
    return worst;
}

int main(int argc, char **argv) {
    long batches = 40;
    int reps = 3, batch = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batches")) batches = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
    }
    if (reps < 1 || reps > 16 || batches < 1 || batch < 1) { fprintf(stderr, "bench_dlrm: bad arguments\n"); return 2; }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) { fprintf(stderr, "bench_dlrm: no context\n"); return 1; }
    const char *path = "build/bench-dlrm.tsv";
    long lines = batches * batch + batch;
    corpus data = {0};
    if (dlrm_synthesize(path, lines, 100000, 5, NULL) || corpus_load(path, &data)) { fprintf(stderr, "bench_dlrm: cannot make %s\n", path); return 1; }
    int accel = pdde_device_find(ctx, "cuda", 0);
    if (accel < 0) accel = pdde_device_find(ctx, "opencl", 0);
    pdde_device_props props = {0};
    if (accel >= 0) pdde_device_get_props(ctx, accel, &props);
    printf("dlrm: batch %d, %ld batches per run, median of %d; accelerator: %s\n", batch, batches, reps, accel >= 0 ? props.name : "none");
    double cpu = measure(ctx, &data, batch, -1, 0, batches, reps);
    printf("cpu only     %9.0f samples/s\n", cpu);
    double acc = accel >= 0 ? measure(ctx, &data, batch, accel, 0, batches, reps) : NAN;
    printf("accel only   %9.0f samples/s\n", acc);
    /* the pipeline puts the dense stage on the faster kind */
    int dense = accel >= 0 && !(acc < cpu) ? accel : -1;
    double het = measure(ctx, &data, batch, dense, 1, batches, reps);
    double best = isnan(acc) || cpu > acc ? cpu : acc;
    printf("hetero       %9.0f samples/s (dense stage on %s)\n", het, dense >= 0 ? props.name : "the CPU");
    const char *max_env = getenv("BENCH_DLRM_MAX_IDS");
    double bpi = bytes_per_id(ctx, max_env ? atol(max_env) : 10000000);
    printf("RESULT dlrm cpu_only=%.0f accel_only=%.0f hetero=%.0f hetero_ratio=%.2f bytes_per_id=%.1f\n", cpu, acc, het, het / best, bpi);
    free(data.text), free(data.line);
    pdde_context_free(ctx);
    return 0;
}
