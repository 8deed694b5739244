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
    for (long i = 0, start = 1; i < n; i++) {
        if (start) c->line[c->n_lines++] = i;
        start = c->text[i] == '\n';
        if (start) c->text[i] = 0;
    }
    return c->n_lines > 0 ? 0 : -1;
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
    double stage_s[3];         /* time in each stage, summed over batches (sequential runs) */
} runner;

static pdde_status stage1(runner *r, slot *sl, long k) {
    char buf[DLRM_LINE_MAX + 1];
    long first = (k * r->batch) % (r->data->n_lines - r->batch);
    for (int i = 0; i < r->batch; i++) {
        snprintf(buf, sizeof buf, "%s", r->data->text + r->data->line[first + i]);
        if (!dlrm_parse_line(&r->parse_errors, buf, &sl->samples[i])) return PDDE_ERR_CORRUPT; /* (the data is ours) */
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
        double t0 = now_s();
        if (!st && !a->r->st) st = a->stage == 1 ? stage1(a->r, s, k) : a->stage == 2 ? stage2(a->r, s) : stage3(a->r, s);
        a->r->stage_s[a->stage - 1] += now_s() - t0; /* (each stage's own slot: no race) */
        if (st && !a->r->st) a->r->st = st;
        if (!s || q_put(a->out, s)) { a->r->st = PDDE_ERR_TIMEOUT; break; }
    }
    return NULL;
}

#define SLOTS (getenv("BENCH_SLOTS") ? atoi(getenv("BENCH_SLOTS")) : 4)

/* samples/s of n batches, either each batch through the three stages in turn or pipelined. */
static double run(runner *r, slot *slots, long n, int pipelined) {
    double t0 = now_s();
    if (!pipelined) {
        for (long k = 0; k < n && !r->st; k++) {
            double t1 = now_s();
            r->st = stage1(r, &slots[0], k);
            double t2 = now_s();
            if (!r->st) r->st = stage2(r, &slots[0]);
            double t3 = now_s();
            if (!r->st) r->st = stage3(r, &slots[0]);
            r->stage_s[0] += t2 - t1, r->stage_s[1] += t3 - t2, r->stage_s[2] += now_s() - t3;
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

/* One of the three configurations: the model with its dense layer on device (-1: the CPU), its
 * in-process table and the slots of the batches in flight. */
typedef struct {
    runner r;
    pdde_graph *g;
    slot slots[8];
    int pipelined;
    double times[16];
} setup;

static void setup_free(setup *su) {
    for (int i = 0; i < SLOTS; i++) free(su->slots[i].samples), free(su->slots[i].ids), pdde_sparse_batch_free(su->slots[i].sb);
    pdde_ps_client_free(su->r.c);
    pdde_session_free(su->r.s);
    pdde_graph_free(su->g);
    pdde_sparse_embedding_free(su->r.m.emb);
}

static void report_stages(const char *name, const setup *su, long n) {
    printf("%-12s per batch: stage 1 (parse, pull) %.2f ms, stage 2 (dense) %.2f ms, stage 3 (push) %.2f ms\n", name,
           1e3 * su->r.stage_s[0] / (double)n, 1e3 * su->r.stage_s[1] / (double)n, 1e3 * su->r.stage_s[2] / (double)n);
}

static pdde_status setup_init(setup *su, pdde_context *ctx, const corpus *data, int batch, int device, int pipelined) {
    memset(su, 0, sizeof *su);
    runner *r = &su->r;
    r->ctx = ctx, r->data = data, r->batch = batch;
    su->pipelined = pipelined;
    snprintf(r->parse_errors.path, sizeof r->parse_errors.path, "bench data");
    dlrm_config cfg = {batch, 16, 256, 0.01f};
    pdde_graph_init(ctx, &su->g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int layer_dev[2] = {0, device < 0 ? 0 : device};
    sp.layer_devices = layer_dev, sp.n_layer_devices = 2;
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = cfg.dim, pp.table.optimizer = PDDE_PS_ADAGRAD, pp.table.lr = 0.05f, pp.table.init_std = 0.01f;
    r->st = dlrm_build(su->g, &cfg, &r->m);
    if (!r->st) r->st = pdde_session_init(su->g, &sp, &r->s);
    if (!r->st) r->st = pdde_ps_client_init(ctx, NULL, &pp, &r->c);
    for (int i = 0; i < SLOTS && !r->st; i++) {
        su->slots[i].samples = malloc((size_t)batch * sizeof(dlrm_sample));
        su->slots[i].ids = malloc((size_t)batch * DLRM_SPARSE * sizeof(uint64_t));
        r->st = pdde_sparse_batch_init(r->m.emb, &su->slots[i].sb);
    }
    if (!r->st) run(r, su->slots, 4, pipelined); /* warm up: kernels built, first rows created */
    memset(r->stage_s, 0, sizeof r->stage_s);
    if (r->st) fprintf(stderr, "bench_dlrm: %s\n", pdde_last_error(ctx));
    return r->st;
}

/* The table's heap bytes per touched id (the allocator's count), the largest from 10^4 to max_ids. */
static double bytes_per_id(pdde_context *ctx, long max_ids) {
    pdde_ps_table_params p = PDDE_PS_TABLE_PARAMS_INIT;
    p.dim = 16, p.optimizer = PDDE_PS_SGD, p.init_std = 0.01f;
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
        printf("table, dim 16, SGD: %9ld ids  %6.1f bytes per id (allocator; a row's values are 64)  %.2f M ids/s\n",
               n, per, (double)n / (now_s() - t0) / 1e6);
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
    if (dlrm_synthesize(path, lines, 100000, 5, NULL) || corpus_load(path, &data) || data.n_lines != lines) { fprintf(stderr, "bench_dlrm: cannot make %s\n", path); return 1; }
    int accel = pdde_device_find(ctx, "cuda", 0);
    if (accel < 0) accel = pdde_device_find(ctx, "opencl", 0);
    pdde_device_props props = {0};
    if (accel >= 0) pdde_device_get_props(ctx, accel, &props);
    printf("dlrm: batch %d, %ld batches per run, median of %d (the three kinds interleaved); accelerator: %s\n", batch, batches, reps,
           accel >= 0 ? props.name : "none");
    /* the pipeline's CPU dense stage leaves the threads of stages 1 and 3 a core: its own context with
     * one thread fewer than the cores (a dense stage on an accelerator needs none) */
    pdde_context *het_ctx = ctx;
    pdde_context_params hp = PDDE_CONTEXT_PARAMS_INIT;
    hp.n_threads = pdde_context_n_threads(ctx) > 1 ? pdde_context_n_threads(ctx) - 1 : 1;
    hp.backends = "cpu"; /* (another device runtime's threads would only compete for the cores) */
    if (getenv("BENCH_DLRM_HETERO_THREADS")) hp.n_threads = atoi(getenv("BENCH_DLRM_HETERO_THREADS"));
    static setup su[3];
    const char *names[3] = {"cpu only", "accel only", "hetero"};
    int ok[3] = {0, 0, 0};
    double rate[3] = {NAN, NAN, NAN};
    /* the accelerator alone first, and freed before the others run: its runtime's threads (PoCL's on
     * these same cores) would take from them */
    if (accel >= 0 && (ok[1] = setup_init(&su[1], ctx, &data, batch, accel, 0) == PDDE_OK)) {
        for (int i = 0; i < reps; i++) su[1].times[i] = run(&su[1].r, su[1].slots, batches, 0);
        rate[1] = su[1].r.st ? NAN : bench_median(su[1].times, reps);
    }
    ok[0] = setup_init(&su[0], ctx, &data, batch, -1, 0) == PDDE_OK;
    double first_cpu = ok[0] ? run(&su[0].r, su[0].slots, batches, 0) : NAN;
    /* the pipeline puts the dense stage on the faster kind */
    int dense = !isnan(rate[1]) && !(rate[1] < first_cpu) ? accel : -1;
    if (dense < 0 && pdde_context_init(&hp, &het_ctx)) het_ctx = ctx;
    if (dense < 0 && ok[1]) {
        report_stages(names[1], &su[1], batches * reps);
        setup_free(&su[1]), ok[1] = 0;
    }
    ok[2] = setup_init(&su[2], het_ctx, &data, batch, dense, 1) == PDDE_OK;
    if (ok[2]) run(&su[2].r, su[2].slots, batches, 1); /* as CPU only's first run: every batch's rows exist */
    memset(su[0].r.stage_s, 0, sizeof su[0].r.stage_s), memset(su[2].r.stage_s, 0, sizeof su[2].r.stage_s);
    for (int i = 0; i < reps; i++) /* CPU only and the pipeline interleaved: both see the same load */
        for (int k = 0; k < 3; k += 2) su[k].times[i] = ok[k] ? run(&su[k].r, su[k].slots, batches, k == 2) : NAN;
    for (int k = 0; k < 3; k += 2) rate[k] = ok[k] && !su[k].r.st ? bench_median(su[k].times, reps) : NAN;
    if (getenv("BENCH_DLRM_VERBOSE")) for (int i = 0; i < reps; i++) printf("rep %d: cpu %.0f hetero %.0f\n", i, su[0].times[i], su[2].times[i]);
    if (ok[0]) report_stages(names[0], &su[0], batches * reps);
    if (ok[2]) report_stages("hetero busy", &su[2], batches * reps);
    for (int k = 0; k < 3; k++) {
        printf("%-12s %9.0f samples/s", names[k], rate[k]);
        if (k == 2) printf("  (dense stage on %s, %d threads)", dense >= 0 ? props.name : "the CPU", dense >= 0 ? 0 : hp.n_threads);
        printf("\n");
        if (ok[k]) setup_free(&su[k]);
    }
    if (het_ctx != ctx) pdde_context_free(het_ctx);
    double cpu = rate[0], acc = rate[1], het = rate[2], best = isnan(acc) || cpu > acc ? cpu : acc;
    const char *max_env = getenv("BENCH_DLRM_MAX_IDS");
    double bpi = bytes_per_id(ctx, max_env ? atol(max_env) : 10000000);
    printf("RESULT dlrm cpu_only=%.0f accel_only=%.0f hetero=%.0f hetero_ratio=%.2f bytes_per_id=%.1f\n", cpu, acc, het, het / best, bpi);
    free(data.text), free(data.line);
    pdde_context_free(ctx);
    return 0;
}
