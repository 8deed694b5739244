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
#include <unistd.h>

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

/* Stage 1's source of batches: batch k's lines parsed out of the corpus. */
typedef struct { const corpus *data; int batch; dlrm_reader errors; } parser;

static pdde_status parse_batch(void *u, int64_t k, dlrm_sample *out) {
    parser *p = u;
    char buf[DLRM_LINE_MAX + 1];
    long first = (long)(k * p->batch) % (p->data->n_lines - p->batch);
    for (int i = 0; i < p->batch; i++) {
        snprintf(buf, sizeof buf, "%s", p->data->text + p->data->line[first + i]);
        if (!dlrm_parse_line(&p->errors, buf, &out[i])) return PDDE_ERR_CORRUPT; /* (the data is ours) */
    }
    return PDDE_OK;
}

#define MAX_SLOTS 8
#define SLOTS (getenv("BENCH_SLOTS") ? atoi(getenv("BENCH_SLOTS")) : 4)

/* One of the three configurations: the model with its dense layer on a device, its in-process table,
 * the slots of the batches in flight and (hetero) the pipeline. */
typedef struct {
    pdde_context *ctx;
    pdde_graph *g;
    dlrm_model m;
    parser parse;
    dlrm_stages d;
    pdde_pipeline_stage stages[3];
    dlrm_slot slots[MAX_SLOTS];
    void *slot_ptr[MAX_SLOTS];
    int n_slots;
    pdde_pipeline *pl;         /* NULL: the stages in turn */
    int64_t next;              /* the next batch */
    double stage_s[3];         /* time in each stage, summed over batches (in turn) */
    double stage_cpu[3];       /* the process's CPU time in each stage (in turn: pool threads included) */
    double cpu_s;              /* the process's CPU time in run() */
    long batches;              /* batches timed */
    double times[16];
    pdde_status st;
} setup;

/* samples/s of n batches, each through the three stages in turn, or pipelined. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double run(setup *su, long n) {
    double t0 = bench_now(), c0 = cpu_now();
    if (su->pl) su->st = pdde_pipeline_run(su->pl, su->next, n);
    else
        for (long k = 0; k < n && !su->st; k++)
            for (int i = 0; i < 3 && !su->st; i++) {
                double t1 = bench_now(), c1 = cpu_now();
                su->st = su->stages[i].fn(su->stages[i].user, &su->slots[0], su->next + k, 0);
                su->stage_s[i] += bench_now() - t1, su->stage_cpu[i] += cpu_now() - c1;
            }
    su->next += n, su->batches += n, su->cpu_s += cpu_now() - c0;
    if (su->st) fprintf(stderr, "bench_dlrm: %s\n", pdde_last_error(su->ctx));
    return su->st ? NAN : (double)n * su->m.cfg.batch / (bench_now() - t0);
}

static void reset_counts(setup *su) {
    memset(su->stage_s, 0, sizeof su->stage_s), memset(su->stage_cpu, 0, sizeof su->stage_cpu);
    su->cpu_s = 0, su->batches = 0;
    if (su->pl) pdde_pipeline_stats_reset(su->pl);
}

static void setup_free(setup *su) {
    pdde_pipeline_free(su->pl);
    for (int i = 0; i < su->n_slots; i++) dlrm_slot_free(&su->slots[i]);
    pdde_ps_client_free(su->d.c);
    pdde_session_free(su->d.s);
    pdde_graph_free(su->g);
    pdde_sparse_embedding_free(su->m.emb);
}

static void report_stages(const char *name, const setup *su) {
    double n = (double)su->batches;
    printf("%-12s per batch: stage 1 (parse, pull) %.2f ms, stage 2 (dense) %.2f ms, stage 3 (push) %.2f ms; CPU time %.2f + %.2f + %.2f ms\n",
           name, 1e3 * su->stage_s[0] / n, 1e3 * su->stage_s[1] / n, 1e3 * su->stage_s[2] / n, 1e3 * su->stage_cpu[0] / n,
           1e3 * su->stage_cpu[1] / n, 1e3 * su->stage_cpu[2] / n);
}

/* The pipeline's own account: sizing, and per stage its workers, busy time and the fraction of a core
 * its threads used; the rest of the process's CPU time went to pool threads and device runtimes. */
static void report_pipeline(setup *su) {
    pdde_pipeline_stats ps;
    pdde_pipeline_stats_get(su->pl, &ps);
    printf("hetero       sized from %s\n", ps.sizing);
    double stage_cpu = 0;
    for (int k = 0; k < ps.n_stages; k++) {
        const pdde_pipeline_stage_stats *s = &ps.stage[k];
        stage_cpu += s->cpu_s;
        double nb = (double)(s->batches ? s->batches : 1);
        printf("hetero       stage %d (%s) x%d: busy %.2f ms per batch, CPU %.2f ms per batch = %.2f of a core (its threads), starved %.0f%%, blocked %.0f%%\n",
               k + 1, su->stages[k].name, s->workers, 1e3 * s->busy_s / nb, 1e3 * s->cpu_s / nb, s->cpu_s / ps.wall_s,
               100 * s->starved_s / ps.wall_s / s->workers, 100 * s->blocked_s / ps.wall_s / s->workers);
        su->stage_cpu[k] = s->cpu_s / nb;
    }
    su->stage_cpu[1] += (ps.process_cpu_s - stage_cpu) / (double)ps.batches; /* the pool's and runtime's threads work for the dense stage */
    printf("hetero       other threads (kernel pool, device runtime): %.2f of a core; whole process %.2f cores\n",
           (ps.process_cpu_s - stage_cpu) / ps.wall_s, ps.process_cpu_s / ps.wall_s);
}

static pdde_status setup_init(setup *su, pdde_context *ctx, const corpus *data, int batch, int device, int pipelined) {
    memset(su, 0, sizeof *su);
    su->ctx = ctx;
    su->parse = (parser){data, batch, {0}};
    snprintf(su->parse.errors.path, sizeof su->parse.errors.path, "bench data");
    dlrm_config cfg = {batch, 16, 256, 0.01f, DLRM_DENSE_ADAMW};
    pdde_graph_init(ctx, &su->g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int layer_dev[2] = {0, device < 0 ? 0 : device};
    sp.layer_devices = layer_dev, sp.n_layer_devices = 2;
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = cfg.dim, pp.table.optimizer = PDDE_PS_ADAGRAD, pp.table.lr = 0.05f, pp.table.init_std = 0.01f;
    su->d = (dlrm_stages){&su->m, NULL, NULL, NULL, parse_batch, &su->parse};
    dlrm_stages_fill(&su->d, su->stages);
    su->n_slots = pipelined ? SLOTS : 1;
    if (su->n_slots < 1 || su->n_slots > MAX_SLOTS) su->n_slots = 4;
    pdde_status st = dlrm_build(su->g, &cfg, &su->m);
    if (!st) st = pdde_session_init(su->g, &sp, &su->d.s);
    if (!st) st = pdde_ps_client_init(ctx, NULL, &pp, &su->d.c);
    for (int i = 0; i < su->n_slots && !st; i++) st = dlrm_slot_init(&su->slots[i], &su->m), su->slot_ptr[i] = &su->slots[i];
    if (!st && pipelined) {
        pdde_pipeline_params plp = PDDE_PIPELINE_PARAMS_INIT;
        plp.n_stages = 3, plp.stages = su->stages, plp.slots = su->slot_ptr, plp.n_slots = su->n_slots;
        plp.max_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        st = pdde_pipeline_init(ctx, &plp, &su->pl);
    }
    su->st = st;
    if (!st) run(su, 4); /* warm up: kernels built, first rows created, the pipeline sized */
    reset_counts(su);
    if (su->st) fprintf(stderr, "bench_dlrm: %s\n", pdde_last_error(ctx));
    return su->st;
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
        double t0 = bench_now();
        for (long i = 0; i < n; i += CHUNK) {
            long m = n - i < CHUNK ? n - i : CHUNK;
            for (long k = 0; k < m; k++) ids[k] = (uint64_t)(i + k) * 0x9E3779B97F4A7C15ull;
            pdde_ps_table_pull(t, (size_t)m, ids, out);
        }
        double per = (double)(mallinfo2().uordblks + mallinfo2().hblkhd - before) / (double)n;
        printf("table, dim 16, SGD: %9ld ids  %6.1f bytes per id (allocator; a row's values are 64)  %.2f M ids/s\n",
               n, per, (double)n / (bench_now() - t0) / 1e6);
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
        run(&su[1], batches); /* untimed, as for the others: every batch's rows exist */
        reset_counts(&su[1]);
        for (int i = 0; i < reps; i++) su[1].times[i] = run(&su[1], batches);
        rate[1] = su[1].st ? NAN : bench_median(su[1].times, reps);
    }
    ok[0] = setup_init(&su[0], ctx, &data, batch, -1, 0) == PDDE_OK;
    double first_cpu = ok[0] ? run(&su[0], batches) : NAN;
    /* the pipeline puts the dense stage on the faster kind */
    int dense = !isnan(rate[1]) && !(rate[1] < first_cpu) ? accel : -1;
    if (dense < 0 && pdde_context_init(&hp, &het_ctx)) het_ctx = ctx;
    if (dense < 0 && ok[1]) {
        report_stages(names[1], &su[1]);
        setup_free(&su[1]), ok[1] = 0;
    }
    ok[2] = setup_init(&su[2], het_ctx, &data, batch, dense, 1) == PDDE_OK;
    if (ok[2]) run(&su[2], batches); /* as CPU only's first run: every batch's rows exist */
    reset_counts(&su[0]), reset_counts(&su[2]);
    for (int i = 0; i < reps; i++) /* CPU only and the pipeline interleaved: both see the same load */
        for (int k = 0; k < 3; k += 2) su[k].times[i] = ok[k] ? run(&su[k], batches) : NAN;
    for (int k = 0; k < 3; k += 2) rate[k] = ok[k] && !su[k].st ? bench_median(su[k].times, reps) : NAN;
    if (getenv("BENCH_DLRM_VERBOSE")) for (int i = 0; i < reps; i++) printf("rep %d: cpu %.0f hetero %.0f\n", i, su[0].times[i], su[2].times[i]);
    if (ok[0]) report_stages(names[0], &su[0]);
    if (ok[2]) report_pipeline(&su[2]);
    /* What an idle machine would give, from the CPU time each stage used (the shared machine's load
     * skews wall-clock ratios: a process with more runnable threads gets a larger share of the cores):
     * in turn, the dense stage on the context's threads; pipelined, the busiest stage per worker or
     * all the work spread over the cores, whichever is longer (ideal scaling in both). */
    double projected = NAN;
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ok[0] && ok[2] && dense < 0) {
        double nb = (double)su[0].batches, *a = su[0].stage_cpu, *h = su[2].stage_cpu;
        int dt = pdde_context_n_threads(ctx) < cores ? pdde_context_n_threads(ctx) : cores;
        double turn = (a[0] + a[2] + a[1] / dt) / nb;
        pdde_pipeline_stats ps;
        pdde_pipeline_stats_get(su[2].pl, &ps);
        double het = fmax(fmax(h[0] / ps.stage[0].workers, h[2] / ps.stage[2].workers), fmax(h[1] / hp.n_threads, (h[0] + h[1] + h[2]) / cores));
        projected = turn / het;
        printf("projected for an idle %d-core machine from each stage's CPU time (ideal scaling): in turn %.2f ms, hetero %.2f ms per batch: ratio %.2f\n",
               cores, 1e3 * turn, 1e3 * het, projected);
        printf("CPU time per batch, whole process: cpu only %.2f ms, hetero %.2f ms\n", 1e3 * su[0].cpu_s / nb,
               1e3 * ps.process_cpu_s / (double)ps.batches);
    }
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
    double load = NAN;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) { if (fscanf(la, "%lf", &load) != 1) load = NAN; fclose(la); }
    printf("RESULT dlrm cpu_only=%.0f accel_only=%.0f hetero=%.0f hetero_ratio=%.2f bytes_per_id=%.1f projected_ratio=%.2f load=%.1f\n", cpu, acc,
           het, het / best, bpi, projected, load);
    free(data.text), free(data.line);
    pdde_context_free(ctx);
    return 0;
}
