/* bench_dlrm — DLRM training throughput on the same Criteo-format data, in one run:
 *   cpu only      every stage in turn on the CPU (parse + pull, dense forward/backward/update, push);
 *   accel only    every stage in turn, the dense network on the accelerator (CUDA, else OpenCL: PoCL here);
 *   hetero        the asynchronous heterogeneous pipeline: stage 1 (parse the TSV lines, pull the rows)
 *                 and stage 3 (push the rows' gradients) on CPU threads, stage 2 (dense) on the
 *                 accelerator, bounded queues between them (a batch is pulled while the one before it
 *                 trains and the one before that is pushed: a staleness of at most the slots, like
 *                 async mode; 4 slots, or a slot for every worker the sizing gives and 2 more;
 *                 BENCH_SLOTS=N: N);
 *   cpu pipeline  the same pipeline with stage 2 on the CPU (what runs best where the accelerator is
 *                 slower than the CPU).
 * The pipelines' stages are sized by the planner's cost model on the cluster file (pdde-bench's
 * measurements; `make bench-dlrm` writes build/cluster.json with pdde-bench --quick when it is missing),
 * else by a measured balance (stage 1's price: the parsing of a line, timed on the data's first lines,
 * and the table's pull by pdde-bench's ps_pull curve); each stage's predicted and measured time per
 * batch and its busy, starved and blocked shares are printed, and the prediction of stages 1 and 3
 * against the stages in turn (cpu only). Then the sparse stages alone (the dense stage empty) with 1, 2
 * and half the cores' workers each, and the table's heap bytes per touched id as ids grow from 10^4 to
 * 10^7 (BENCH_DLRM_MAX_IDS lowers the top).
 *
 *   bench_dlrm [--batches N] [--reps R] [--batch B] [--cluster FILE]
 * Last line (medians of R): RESULT dlrm cpu_only=<samples/s> accel_only=<samples/s> hetero=<samples/s>
 *   hetero_ratio=<hetero / the better of cpu_only and accel_only> bytes_per_id=<largest measured>
 *   cpu_pipeline=<samples/s> cpu_pipeline_ratio=<cpu_pipeline / the same> pull_pred_ms=<stage 1 predicted>
 *   pull_ms=<stage 1 in turn> pull_pred_ratio=<the two's ratio> pull_cpu_ms=<its CPU time> sparse_w1=<samples/s, sparse stages alone, 1 worker
 *   each> sparse_w2=<2 workers> sparse_wmax=<sparse_wmax_n workers, at most 8; nan under 6 cores> load=<1-minute load average> */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/dlrm.h"
#include "tools/bench/bench_common.h"
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
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

/* Stage 1's source of batches: batch k's lines parsed out of the corpus (by several workers at once:
 * nothing shared is written, a malformed line's count is the call's own). */
typedef struct { const corpus *data; int batch; } parser;

static pdde_status parse_batch(void *u, int64_t k, dlrm_sample *out) {
    const parser *p = u;
    dlrm_reader errors = {.path = "bench data"};
    long first = (long)(k * p->batch) % (p->data->n_lines - p->batch);
    for (int i = 0; i < p->batch; i++)
        if (!dlrm_parse_line(&errors, p->data->text + p->data->line[first + i], &out[i])) return PDDE_ERR_CORRUPT; /* (the data is ours) */
    return PDDE_OK;
}

#define MAX_SLOTS 32
#define SLOTS (getenv("BENCH_SLOTS") ? atoi(getenv("BENCH_SLOTS")) : 4) /* (more where the sizing gives more workers) */

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

static double wall_now(void) { return dlrm_seconds(CLOCK_MONOTONIC); }
static double cpu_now(void) { return dlrm_seconds(CLOCK_PROCESS_CPUTIME_ID); }

/* samples/s of n batches, each through the three stages in turn, or pipelined. */
static double run(setup *su, long n) {
    double t0 = wall_now(), c0 = cpu_now();
    if (su->pl) su->st = pdde_pipeline_run(su->pl, su->next, n);
    else
        for (long k = 0; k < n && !su->st; k++)
            for (int i = 0; i < 3 && !su->st; i++) {
                double t1 = wall_now(), c1 = cpu_now();
                su->st = su->stages[i].fn(su->stages[i].user, &su->slots[0], su->next + k, 0);
                su->stage_s[i] += wall_now() - t1, su->stage_cpu[i] += cpu_now() - c1;
            }
    su->next += n, su->batches += n, su->cpu_s += cpu_now() - c0;
    if (su->st) fprintf(stderr, "bench_dlrm: %s\n", pdde_last_error(su->ctx));
    return su->st ? NAN : (double)n * su->m.cfg.batch / (wall_now() - t0);
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

/* The pipeline's own account (dlrm_pipeline_report: each stage sized at vs took, busy, starved and
 * blocked), and the CPU the process used: its stage threads, and the rest (the kernel pool, the device
 * runtime's threads). */
static void report_pipeline(const char *name, setup *su) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%-12s ", name);
    dlrm_pipeline_report(stdout, prefix, su->pl, su->stages);
    pdde_pipeline_stats ps;
    pdde_pipeline_stats_get(su->pl, &ps);
    double stage_cpu = 0;
    for (int k = 0; k < ps.n_stages; k++) stage_cpu += ps.stage[k].cpu_s;
    printf("%sCPU: the stage threads %.2f cores, other threads (kernel pool, device runtime) %.2f, the whole process %.2f of %ld; %d slots\n", prefix,
           stage_cpu / ps.wall_s, (ps.process_cpu_s - stage_cpu) / ps.wall_s, ps.process_cpu_s / ps.wall_s, sysconf(_SC_NPROCESSORS_ONLN), su->n_slots);
}

/* dense: the context's device index of the dense layer (-1: the CPU); pipelined: through the pipeline,
 * its stages sized by the cost model on cluster (CPU device cpu_id, dense device dense_id) when it can
 * time them all, else by a balance measured on the first batches. */
/* Seconds to parse a line (dlrm_parse_seconds on the corpus's first lines): stage 1's parsing, priced. */
static double parse_s;

/* The sparse stages alone: a dense stage that does nothing (the pulled rows go back as gradients). */
static pdde_status no_dense(void *u, void *slot, int64_t k, int worker) {
    (void)u, (void)slot, (void)k, (void)worker;
    return PDDE_OK;
}

/* dense: the context's device index of the dense layer (-1: the CPU); pipelined: through the pipeline,
 * its stages sized by the cost model on cluster (CPU device cpu_id, dense device dense_id) when it can
 * time them all, else by a balance measured on the first batches; sparse_workers > 0: the dense stage
 * empty and stages 1 and 3 with that many workers each. */
static pdde_status setup_init(setup *su, pdde_context *ctx, const corpus *data, int batch, int dense, int pipelined,
                              const pdde_cluster *cluster, int cpu_id, int dense_id, int sparse_workers) {
    memset(su, 0, sizeof *su);
    su->ctx = ctx;
    su->parse = (parser){data, batch};
    dlrm_config cfg = {batch, 16, 256, 0.01f, DLRM_DENSE_ADAMW};
    pdde_graph_init(ctx, &su->g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int layer_dev[2] = {0, dense < 0 ? 0 : dense};
    sp.layer_devices = layer_dev, sp.n_layer_devices = 2;
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = cfg.dim, pp.table.optimizer = PDDE_PS_ADAGRAD, pp.table.lr = 0.05f, pp.table.init_std = 0.01f;
    su->d = (dlrm_stages){&su->m, NULL, NULL, NULL, parse_batch, &su->parse};
    dlrm_stages_fill(&su->d, su->stages);
    su->n_slots = pipelined ? SLOTS : 1;
    if (su->n_slots < 1 || su->n_slots > MAX_SLOTS) su->n_slots = 4;
    if (sparse_workers > 0) { /* a slot for every worker, and one waiting */
        su->stages[0].workers = su->stages[2].workers = sparse_workers, su->stages[1].fn = no_dense;
        su->n_slots = 2 * sparse_workers + 2 < MAX_SLOTS ? 2 * sparse_workers + 2 : MAX_SLOTS;
    }
    pdde_status st = dlrm_build(su->g, &cfg, &su->m);
    if (!st) st = pdde_session_init(su->g, &sp, &su->d.s);
    if (!st) st = pdde_ps_client_init(ctx, NULL, &pp, &su->d.c);
    for (int i = 0; i < su->n_slots && !st; i++) st = dlrm_slot_init(&su->slots[i], &su->m), su->slot_ptr[i] = &su->slots[i];
    if (!st && cluster && cpu_id >= 0) dlrm_stages_predict(ctx, cluster, su->g, &su->m, pp.table.optimizer, cpu_id, dense_id, parse_s, su->stages);
    if (!st && pipelined) {
        pdde_pipeline_params plp = PDDE_PIPELINE_PARAMS_INIT;
        plp.n_stages = 3, plp.stages = su->stages, plp.slots = su->slot_ptr, plp.n_slots = su->n_slots;
        plp.max_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        st = pdde_pipeline_init(ctx, &plp, &su->pl);
    }
    su->st = st;
    if (!st) run(su, 4); /* warm up: kernels built, first rows created, the pipeline sized */
    /* a slot for every worker the sizing gave and one waiting before each of the two queues (unless
     * BENCH_SLOTS says): the same stages, sized again from the same predictions, with more slots */
    pdde_pipeline_stats ps;
    int want = 2;
    if (su->pl && !su->st && !sparse_workers && !getenv("BENCH_SLOTS")) {
        pdde_pipeline_stats_get(su->pl, &ps);
        for (int k = 0; k < ps.n_stages; k++) want += ps.stage[k].workers;
    }
    if (su->pl && want > su->n_slots && want <= MAX_SLOTS) {
        for (int i = su->n_slots; i < want && !st; i++) st = dlrm_slot_init(&su->slots[i], &su->m), su->slot_ptr[i] = &su->slots[i];
        pdde_pipeline_free(su->pl), su->pl = NULL;
        pdde_pipeline_params plp = PDDE_PIPELINE_PARAMS_INIT;
        plp.n_stages = 3, plp.stages = su->stages, plp.slots = su->slot_ptr, plp.n_slots = su->n_slots = want;
        plp.max_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (!st) st = pdde_pipeline_init(ctx, &plp, &su->pl);
        su->st = st;
        if (!st) run(su, 4);
    }
    reset_counts(su);
    if (su->st) fprintf(stderr, "bench_dlrm: %s\n", pdde_last_error(ctx));
    return su->st;
}

/* Times two setups (either may be missing: ok 0) over reps runs of n batches, interleaved so that both
 * see the same load, after one untimed run each (every batch's rows exist); the medians into rate. */
static void time_pair(setup *a, int ok_a, setup *b, int ok_b, long n, int reps, double *rate_a, double *rate_b) {
    setup *su[2] = {a, b};
    int ok[2] = {ok_a, ok_b};
    double *rate[2] = {rate_a, rate_b};
    for (int k = 0; k < 2; k++) if (ok[k]) run(su[k], n), reset_counts(su[k]);
    for (int i = 0; i < reps; i++)
        for (int k = 0; k < 2; k++) su[k]->times[i] = ok[k] ? run(su[k], n) : NAN;
    for (int k = 0; k < 2; k++) *rate[k] = ok[k] && !su[k]->st ? bench_median(su[k]->times, reps) : NAN;
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
        double t0 = wall_now();
        for (long i = 0; i < n; i += CHUNK) {
            long m = n - i < CHUNK ? n - i : CHUNK;
            for (long k = 0; k < m; k++) ids[k] = (uint64_t)(i + k) * 0x9E3779B97F4A7C15ull;
            pdde_ps_table_pull(t, (size_t)m, ids, out);
        }
        double per = (double)(mallinfo2().uordblks + mallinfo2().hblkhd - before) / (double)n;
        printf("table, dim 16, SGD: %9ld ids  %6.1f bytes per id (allocator; a row's values are 64)  %.2f M ids/s\n",
               n, per, (double)n / (wall_now() - t0) / 1e6);
        if (per > worst) worst = per;
        pdde_ps_table_free(t);
    }
    free(ids), free(out);
    return worst;
}

int main(int argc, char **argv) {
    long batches = 40;
    int reps = 3, batch = 512;
    const char *cluster_path = "build/cluster.json";
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && !strcmp(a, "--batches")) batches = atol(v);
        else if (v && !strcmp(a, "--reps")) reps = atoi(v);
        else if (v && !strcmp(a, "--batch")) batch = atoi(v);
        else if (v && !strcmp(a, "--cluster")) cluster_path = v;
        else { /* (--help, an unknown flag, or one without its value) */
            fprintf(stderr, "usage: bench_dlrm [--batches N (40)] [--reps N (3)] [--batch N (512)] [--cluster FILE (build/cluster.json)]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 16 || batches < 1 || batch < 1) { fprintf(stderr, "bench_dlrm: bad arguments\n"); return 2; }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) { fprintf(stderr, "bench_dlrm: no context\n"); return 1; }
    const char *path = "build/bench-dlrm.tsv";
    long lines = batches * batch + batch;
    corpus data = {0};
    if (dlrm_synthesize(path, lines, 100000, 5, NULL) || corpus_load(path, &data) || data.n_lines != lines) { fprintf(stderr, "bench_dlrm: cannot make %s\n", path); return 1; }
    {
        enum { CAL = 1024 };
        const char *cal[CAL];
        int n_cal = data.n_lines < CAL ? (int)data.n_lines : CAL;
        for (int i = 0; i < n_cal; i++) cal[i] = data.text + data.line[i];
        parse_s = dlrm_parse_seconds(cal, n_cal);
    }
    int accel = pdde_device_find(ctx, "cuda", 0);
    if (accel < 0) accel = pdde_device_find(ctx, "opencl", 0);
    pdde_device_props props = {0};
    if (accel >= 0) pdde_device_get_props(ctx, accel, &props);
    /* the cost model's cluster (pdde-bench's measurements of this machine) sizes the pipelines */
    pdde_cluster *cluster = NULL;
    if (access(cluster_path, R_OK) == 0 && pdde_cluster_load(ctx, cluster_path, &cluster))
        fprintf(stderr, "bench_dlrm: %s: %s\n", cluster_path, pdde_last_error(ctx));
    int cpu_id = dlrm_cluster_device(cluster, "cpu"), accel_id = accel >= 0 ? dlrm_cluster_device(cluster, props.backend) : -1;
    printf("dlrm: batch %d, %ld batches per run, median of %d; accelerator: %s; pipelines sized by %s%s\n", batch, batches, reps,
           accel >= 0 ? props.name : "none", cluster ? "the cost model on " : "a measured balance (no cluster file: make bench-dlrm writes one)",
           cluster ? cluster_path : "");
    static setup su[4];
    const char *names[4] = {"cpu only", "accel only", "hetero", "cpu pipeline"};
    int ok[4] = {0, 0, 0, 0};
    double rate[4] = {NAN, NAN, NAN, NAN}, accel_dense_ms = NAN;
    /* The accelerator's two first, then freed: its runtime's threads (PoCL's, on these same cores) would
     * take from the CPU's runs. accel only: every stage in turn, the dense network on the accelerator;
     * hetero: the pipeline, stages 1 and 3 on CPU threads, stage 2 (dense) on the accelerator. */
    if (accel >= 0) {
        ok[1] = setup_init(&su[1], ctx, &data, batch, accel, 0, cluster, cpu_id, accel_id, 0) == PDDE_OK;
        ok[2] = setup_init(&su[2], ctx, &data, batch, accel, 1, cluster, cpu_id, accel_id, 0) == PDDE_OK;
        time_pair(&su[1], ok[1], &su[2], ok[2], batches, reps, &rate[1], &rate[2]);
        if (ok[1]) accel_dense_ms = 1e3 * su[1].stage_s[1] / (double)su[1].batches, report_stages(names[1], &su[1]), setup_free(&su[1]);
        if (ok[2]) report_pipeline(names[2], &su[2]), setup_free(&su[2]);
    }
    /* cpu only: every stage in turn on the CPU; cpu pipeline: the same pipeline with the dense stage on
     * the CPU, in a context of one thread fewer than the cores (the stage threads of 1 and 3 get one) */
    pdde_context *pipe_ctx = ctx;
    pdde_context_params hp = PDDE_CONTEXT_PARAMS_INIT;
    hp.n_threads = pdde_context_thread_count(ctx) > 1 ? pdde_context_thread_count(ctx) - 1 : 1;
    hp.backends = "cpu"; /* (another device runtime's threads would only compete for the cores) */
    if (pdde_context_init(&hp, &pipe_ctx)) pipe_ctx = ctx;
    ok[0] = setup_init(&su[0], ctx, &data, batch, -1, 0, cluster, cpu_id, cpu_id, 0) == PDDE_OK;
    ok[3] = setup_init(&su[3], pipe_ctx, &data, batch, -1, 1, cluster, cpu_id, cpu_id, 0) == PDDE_OK;
    time_pair(&su[0], ok[0], &su[3], ok[3], batches, reps, &rate[0], &rate[3]);
    if (ok[0]) report_stages(names[0], &su[0]);
    if (ok[3]) report_pipeline(names[3], &su[3]);
    double cpu_dense_ms = ok[0] ? 1e3 * su[0].stage_s[1] / (double)su[0].batches : NAN;
    /* the cost model's single-worker stage times against the stages in turn on one thread (cpu only) */
    double pull_pred_ms = 1e3 * su[0].stages[0].predicted_s, pull_ms = ok[0] ? 1e3 * su[0].stage_s[0] / (double)su[0].batches : NAN;
    double pull_cpu_ms = ok[0] ? 1e3 * su[0].stage_cpu[0] / (double)su[0].batches : NAN;
    if (ok[0] && cluster) /* (CPU time: what a loaded machine's other programs do not inflate) */
        printf("cost model against the stages in turn: parse + pull %.2f ms predicted (parsing %.2f us a line), %.2f measured (%.2fx; CPU time %.2f, %.2fx); "
               "push %.2f predicted, %.2f measured (%.2fx; CPU time %.2f, %.2fx)\n", pull_pred_ms, 1e6 * parse_s, pull_ms, pull_pred_ms / pull_ms,
               pull_cpu_ms, pull_pred_ms / pull_cpu_ms, 1e3 * su[0].stages[2].predicted_s, 1e3 * su[0].stage_s[2] / (double)su[0].batches,
               su[0].stages[2].predicted_s / (su[0].stage_s[2] / (double)su[0].batches), 1e3 * su[0].stage_cpu[2] / (double)su[0].batches,
               su[0].stages[2].predicted_s / (su[0].stage_cpu[2] / (double)su[0].batches));
    for (int k = 0; k < 4; k++) {
        printf("%-12s %9.0f samples/s", names[k], rate[k]);
        if (k >= 2) printf("  (stages 1, 3 on CPU threads; stage 2, dense, on %s)", k == 2 ? (accel >= 0 ? props.name : "-") : "the CPU");
        printf("\n");
    }
    for (int k = 0; k < 4; k += 3) if (ok[k]) setup_free(&su[k]);
    if (pipe_ctx != ctx) pdde_context_free(pipe_ctx);
    double cpu = rate[0], acc = rate[1], het = rate[2], best = isnan(acc) || cpu > acc ? cpu : acc;
    if (!isnan(accel_dense_ms) && !isnan(cpu_dense_ms))
        printf("dense step in turn: %.2f ms per batch on %s, %.2f ms on the CPU (%.1fx); a pipeline runs at its slowest stage's pace\n",
               accel_dense_ms, props.name, cpu_dense_ms, accel_dense_ms / cpu_dense_ms);
    /* The sparse stages alone (the dense stage empty): parse + pull and push with 1, 2 and up to half
     * the cores' workers each, timed in alternation with 1 (the table's locks and the parser decide how
     * they scale) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int wmax = cores / 2 > 8 ? 8 : (int)(cores / 2);
    double sparse[3] = {NAN, NAN, NAN}, sparse_1b = NAN;
    {
        static setup one, two;
        int ok1 = setup_init(&one, ctx, &data, batch, -1, 1, NULL, -1, -1, 1) == PDDE_OK;
        int ok2 = setup_init(&two, ctx, &data, batch, -1, 1, NULL, -1, -1, 2) == PDDE_OK;
        time_pair(&one, ok1, &two, ok2, batches, reps, &sparse[0], &sparse[1]);
        if (ok2) setup_free(&two);
        if (wmax > 2 && setup_init(&two, ctx, &data, batch, -1, 1, NULL, -1, -1, wmax) == PDDE_OK) {
            time_pair(&one, ok1, &two, 1, batches, reps, &sparse_1b, &sparse[2]);
            setup_free(&two);
        }
        if (ok1) setup_free(&one);
        printf("sparse stages alone (dense stage empty): %.0f samples/s with 1 worker each, %.0f with 2 (%.2fx)", sparse[0], sparse[1], sparse[1] / sparse[0]);
        if (wmax > 2) printf(", %.0f with %d (%.2fx the 1 timed beside it, %.0f)", sparse[2], wmax, sparse[2] / sparse_1b, sparse_1b);
        printf("\n");
    }
    const char *max_env = getenv("BENCH_DLRM_MAX_IDS");
    double bpi = bytes_per_id(ctx, max_env ? atol(max_env) : 10000000);
    double load = NAN;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) { if (fscanf(la, "%lf", &load) != 1) load = NAN; fclose(la); }
    printf("RESULT dlrm cpu_only=%.0f accel_only=%.0f hetero=%.0f hetero_ratio=%.2f bytes_per_id=%.1f cpu_pipeline=%.0f cpu_pipeline_ratio=%.2f "
           "pull_pred_ms=%.2f pull_ms=%.2f pull_pred_ratio=%.2f pull_cpu_ms=%.2f sparse_w1=%.0f sparse_w2=%.0f sparse_wmax=%.0f sparse_wmax_n=%d load=%.1f\n",
           cpu, acc, het, het / best, bpi, rate[3], rate[3] / best, pull_pred_ms, pull_ms, pull_pred_ms / pull_ms, pull_cpu_ms, sparse[0], sparse[1], sparse[2],
           wmax > 2 ? wmax : 2, load);
    free(data.text), free(data.line);
    pdde_cluster_free(cluster);
    pdde_context_free(ctx);
    return 0;
}
