/* gpt — trains a GPT-2-style model on any text file with pdde, then samples from it.
 *
 *   ./build/gpt                                   # small model on a fortunes file, all CPU threads
 *   ./build/gpt --data corpus.txt --layers 6 --width 256 --steps 2000 --ckpt-dir ckpt --resume
 *   ./build/gpt --blocks-on opencl                # embedding/head on the CPU, the blocks on OpenCL
 *   ./build/gpt --recompute                       # recompute the blocks in backward: less activation memory
 *   ./build/pdde-run -n 2 ./build/gpt --dp 2 --zero 1   # data parallel on 2 ranks, ZeRO-1
 *   ./build/pdde-run -n 4 ./build/gpt --dp 2 --tp 2     # data x tensor parallel from dist attributes
 *   ./build/pdde-run -n 4 ./build/gpt --dp 2 --pp 2 --micro 4   # data x pipeline parallel, 1F1B
 *
 * Text is tokenized byte by byte (vocabulary 256). 90% of the file trains, 10% validates. */
#define _GNU_SOURCE
#include "pdde.h"
#include "gpt.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct {
    gpt_config model;
    int steps, val_every, val_batches, sample_len, threads, ckpt_every, resume, recompute, show_program, comm_bf16, dp, tp, pp, pp_chunks, micro, gpipe, zero;
    int stop_after, reschedule;
    float lr, weight_decay, clip;
    uint64_t seed;
    const char *data, *ckpt_dir, *blocks_on, *plan, *cluster, *trace, *metrics;
    pdde_dtype dtype;      /* --dtype: the matmuls' compute dtype (mixed precision) */
    pdde_plan parsed_plan; /* --plan: its stage cuts */
} options;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: gpt [--data FILE] [--layers N] [--heads N] [--width N] [--ctx N] [--vocab N] [--batch N]\n"
            "           [--steps N] [--lr X] [--weight-decay X] [--clip X] [--seed N] [--threads N]\n"
            "           [--val-every N] [--sample-len N] [--ckpt-dir DIR] [--ckpt-every N] [--resume]\n"
            "           [--stop-after N]   (save and stop after step N, as an interrupted run would; --resume goes on)\n"
            "           [--reschedule]     (with --resume: follow this run's --steps/--lr schedule instead of the\n"
            "                              checkpoint's, which a resumed run keeps by default)\n"
            "           [--recompute] [--blocks-on BACKEND] [--dp N] [--tp N] [--pp N] [--zero 0-3]   (run under pdde-run -n dp*tp*pp)\n"
            "           [--micro N] [--gpipe]   (micro-batches per step; pipeline schedule GPipe instead of 1F1B)\n"
            "           [--pp-chunks N]    (interleaved stages: N runs of layers per stage; --micro a multiple of --pp)\n"
            "           [--show-program]   (print each rank's local program: nodes, shapes, attributes, communication)\n"
            "           [--comm-bf16]      (tensor/pipeline/ZeRO collectives carry bf16 instead of f32)\n"
            "           [--dtype f32|bf16|f16]   (mixed precision: matmuls in bf16 or f16 with f32 accumulation, f32 master\n"
            "                              weights; f16 scales the loss dynamically, the log shows the scale and skipped steps)\n"
            "           [--trace FILE]     (a Chrome/Perfetto trace of every step; under pdde-run -n N each rank writes\n"
            "                              FILE.rank<R>: use pdde-run --trace FILE to get them merged into FILE)\n"
            "           [--metrics FILE]   (one JSON line per step: step, loss, lr, tokens/s, memory; build/pdde-plot\n"
            "                              draws the loss of one or several such files)\n"
            "           [--plan dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0[,chunks=N][,stages=3:3][,rc=2:0][,blocks=1]]   (all of\n"
            "                              the above at once, stages = layers per pipeline stage of the layers + 2, rc = the\n"
            "                              first layers of each stage recomputed, blocks=1: stage s on ranks s*dp*tp.., as\n"
            "                              pdde-plan --auto prints; ,place=opencl[:A-B]: the blocks, or layers A..B, on that\n"
            "                              backend's device, as --blocks-on (with stages: those each stage holds);\n"
            "                              shares=3:1: dp index i (each of its stages) runs shares[i] x mb\n"
            "                              micro-batches, for devices of different speeds)\n"
            "           [--plan auto [--cluster FILE]]   (the planner chooses for the ranks the launcher started, from the\n"
            "                              devices FILE describes; default build/cluster.json, written by pdde-bench)\n");
}

static int parse(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *iv = NULL;
        float *fv = NULL;
        if (!strcmp(a, "--resume")) { o->resume = 1; continue; }
        if (!strcmp(a, "--gpipe")) { o->gpipe = 1; continue; }
        if (!strcmp(a, "--recompute")) { o->recompute = 1; continue; }
        if (!strcmp(a, "--show-program")) { o->show_program = 1; continue; }
        if (!strcmp(a, "--comm-bf16")) { o->comm_bf16 = 1; continue; }
        if (!strcmp(a, "--reschedule")) { o->reschedule = 1; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        if (!v) { fprintf(stderr, "gpt: %s needs a value\n", a); return -1; }
        if (!strcmp(a, "--layers")) iv = &o->model.layers;
        else if (!strcmp(a, "--heads")) iv = &o->model.heads;
        else if (!strcmp(a, "--width")) iv = &o->model.width;
        else if (!strcmp(a, "--ctx")) iv = &o->model.ctx;
        else if (!strcmp(a, "--vocab")) iv = &o->model.vocab;
        else if (!strcmp(a, "--batch")) iv = &o->model.batch;
        else if (!strcmp(a, "--steps")) iv = &o->steps;
        else if (!strcmp(a, "--val-every")) iv = &o->val_every;
        else if (!strcmp(a, "--sample-len")) iv = &o->sample_len;
        else if (!strcmp(a, "--threads")) iv = &o->threads;
        else if (!strcmp(a, "--ckpt-every")) iv = &o->ckpt_every;
        else if (!strcmp(a, "--stop-after")) iv = &o->stop_after;
        else if (!strcmp(a, "--dp")) iv = &o->dp;
        else if (!strcmp(a, "--tp")) iv = &o->tp;
        else if (!strcmp(a, "--pp")) iv = &o->pp;
        else if (!strcmp(a, "--pp-chunks")) iv = &o->pp_chunks;
        else if (!strcmp(a, "--micro")) iv = &o->micro;
        else if (!strcmp(a, "--zero")) iv = &o->zero;
        else if (!strcmp(a, "--lr")) fv = &o->lr;
        else if (!strcmp(a, "--weight-decay")) fv = &o->weight_decay;
        else if (!strcmp(a, "--clip")) fv = &o->clip;
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--ckpt-dir")) o->ckpt_dir = v;
        else if (!strcmp(a, "--blocks-on")) o->blocks_on = v;
        else if (!strcmp(a, "--plan")) o->plan = v;
        else if (!strcmp(a, "--cluster")) o->cluster = v;
        else if (!strcmp(a, "--dtype")) {
            o->dtype = v && !strcmp(v, "bf16") ? PDDE_BF16 : v && !strcmp(v, "f16") ? PDDE_F16 : PDDE_F32;
            if (!v || (strcmp(v, "f32") && o->dtype == PDDE_F32)) { fprintf(stderr, "gpt: --dtype takes f32, bf16 or f16\n"); return -1; }
        }
                else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--metrics")) o->metrics = v;
        else { fprintf(stderr, "gpt: unknown flag %s\n", a); usage(stderr); return -1; }
        char *end = NULL;
        long x = 0;
        if (iv) { x = strtol(v, &end, 10); if (end == v || *end || x < 0) { fprintf(stderr, "gpt: %s wants a non-negative integer, got '%s'\n", a, v); return -1; } *iv = (int)x; }
        if (iv && x > 1 << 24) { fprintf(stderr, "gpt: %s %s is too large (at most 2^24)\n", a, v); return -1; }
        if (fv) {
            *fv = strtof(v, &end);
            if (end == v || *end || !isfinite(*fv) || *fv < 0) { fprintf(stderr, "gpt: %s wants a finite number >= 0, got '%s'\n", a, v); return -1; }
        }
        i++;
    }
    if (o->plan && strcmp(o->plan, "auto")) {
        pdde_plan *p = &o->parsed_plan;
        if (pdde_plan_parse(o->plan, p)) { fprintf(stderr, "gpt: --plan '%s': %s\n  want dp=N,tp=N,pp=N,mb=N,zero=0-3,recompute=0|1[,chunks=N][,stages=A:B:..][,rc=A:B:..][,comm=bf16][,sched=gpipe][,blocks=1][,place=BACKEND[:A-B]][,shares=A:B:..]\n  (shares: one per dp index, each >= 1)\n", o->plan, p->why); return -1; }
        o->dp = p->dp, o->tp = p->tp, o->pp = p->pp, o->micro = p->micro, o->zero = p->zero, o->recompute = p->recompute, o->pp_chunks = p->chunks;
        if (p->shares[0] && p->pp > 1 && p->zero >= 2) {
            fprintf(stderr, "gpt: --plan '%s': shares= with pipeline stages needs ZeRO 0 or 1 (2 and 3 have collectives in every micro-batch)\n", o->plan);
            return -1;
        }
        if (p->place[0] && (p->chunks > 1 || o->blocks_on)) {
            fprintf(stderr, "gpt: --plan '%s': place= puts layers of each stage on a second device: not with chunks or --blocks-on\n", o->plan);
            return -1;
        }
    }
    gpt_config *m = &o->model;
    if (m->layers < 1 || m->heads < 1 || m->width < 1 || m->ctx < 2 || m->vocab < 256 || m->batch < 1 || m->width % m->heads) {
        fprintf(stderr, "gpt: need layers, heads, batch >= 1, ctx >= 2, vocab >= 256 (byte tokens) and width divisible by heads\n");
        return -1;
    }
    static const struct { const char *name; int min; } at_least_one[] = {{"--dp", 1}, {"--tp", 1}, {"--pp", 1}, {"--micro", 1}};
    const int *plan_v[] = {&o->dp, &o->tp, &o->pp, &o->micro};
    for (int k = 0; k < 4; k++)
        if (*plan_v[k] < at_least_one[k].min) { fprintf(stderr, "gpt: %s must be >= 1, got %d\n", at_least_one[k].name, *plan_v[k]); return -1; }
    if (o->zero > 3 || (o->zero > 1 && o->dp < 2)) { fprintf(stderr, "gpt: --zero %d: stages are 0..3 (2 and 3 need --dp)\n", o->zero); return -1; }
    gpt_plan shares = {.dp = o->dp, .shares = o->plan && o->parsed_plan.shares[0] ? o->parsed_plan.shares : NULL};
    long units = gpt_plan_units(&shares); /* dp, or the sum of the shares */
    if (units * o->micro > m->batch || m->batch % (units * o->micro) || o->pp > m->layers + 2 || (long)o->dp * o->tp * o->pp > 1 << 16) {
        fprintf(stderr, "gpt: --dp (or the sum of the plan's shares) x --micro must divide --batch (the global batch), --pp at most layers + 2, at most 2^16 ranks\n");
        return -1;
    }
    return 0;
}

/* --plan auto: the planner's best plan for the ranks the launcher started (all of them), on the devices
 * of the cluster file. Every rank computes the same plan from the same file; rank 0 says what it chose
 * and what came next. */
static int choose_plan(pdde_context *ctx, options *o) {
    pdde_comm_env env = {.world_size = 1};
#ifdef PDDE_HAVE_UCX
    if (pdde_comm_env_read(ctx, &env)) env.world_size = 1, env.rank = 0; /* no launcher: one process */
#endif
    const char *path = o->cluster ? o->cluster : "build/cluster.json";
    pdde_plan_devices d;
    pdde_plan plans[8];
    int nf = 0, nr = 0;
    pdde_status st = gpt_plan_devices(ctx, path, &o->model, env.world_size, &d);
    if (st) {
        fprintf(stderr, "gpt: --plan auto: %s (build/pdde-bench -o %s measures this machine)\n", pdde_last_error(ctx), path);
        return 1;
    }
    st = gpt_plan_search(ctx, &o->model, &d, 1, plans, 8, &nf, &nr);
    pdde_plan_devices_free(&d);
    if (st) {
        fprintf(stderr, "gpt: --plan auto: %s\n", pdde_last_error(ctx));
        return 1;
    }
    o->parsed_plan = plans[0];
    pdde_plan *p = &o->parsed_plan;
    o->dp = p->dp, o->tp = p->tp, o->pp = p->pp, o->micro = p->micro, o->zero = p->zero, o->recompute = p->recompute, o->pp_chunks = p->chunks;
    if (env.rank == 0) {
        char s[256];
        pdde_plan_str(p, s, sizeof s);
        printf("gpt: the planner chose %s for %d rank%s: predicted %.3g s/step, %.3g MB on the fullest device (%s)\n", s, env.world_size,
               env.world_size > 1 ? "s" : "", p->step_s, p->peak_bytes / 1e6, path);
        for (int i = 1; i < nf && i < 4; i++) {
            pdde_plan_str(&plans[i], s, sizeof s);
            printf("gpt:   next: %s, %.3g s/step (%+.1f%%)\n", s, plans[i].step_s, 100 * (plans[i].step_s / p->step_s - 1));
        }
    }
    return 0;
}

#define TRY(call)                                                                              \
    do {                                                                                       \
        pdde_status st_ = (call);                                                              \
        if (st_ != PDDE_OK) {                                                                  \
            fprintf(stderr, "gpt: %s failed: %s: %s\n", #call, pdde_status_str(st_), pdde_last_error(ctx)); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* What a rank writes its batches with: its plan and data-parallel index (gpt_write_batch). */
typedef struct {
    const gpt_plan *plan;
    int dp_index, batch; /* batch: the global batch's rows */
} feeder;

/* Mean loss over a few validation batches (forward only). */
static float validate(pdde_session *s, gpt_model *m, pdde_data *val, int batches, const feeder *f, int32_t *x, int32_t *y) {
    uint64_t pos = pdde_data_position(val);
    double sum = 0;
    pdde_data_set_position(val, 0); /* the same validation windows every time */
    for (int i = 0; i < batches; i++) {
        pdde_data_next_batch(val, f->batch, m->cfg.ctx, 99, x, y);
        if (gpt_write_batch(s, m, f->plan, f->dp_index, x, y) != PDDE_OK || pdde_session_run(s, PDDE_RUN_FORWARD) != PDDE_OK) return NAN;
        sum += pdde_session_loss(s);
    }
    pdde_data_set_position(val, pos);
    return (float)(sum / batches);
}

/* The whole vocab row `row` of the logits at sampling: under vocab-parallel tensor parallelism each
 * rank holds `cols` = V / tp consecutive columns of it (in tp order), gathered from the ranks of this
 * rank's tp group (mesh rank ((d * tp) + t) * pp + s, on process pdde_plan_process_of_rank(plan, .)); every
 * rank takes part (those without the logits, other pipeline stages, send zeros). */
static void gather_vocab_row(pdde_comm *comm, const options *o, const float *row, int cols, float *all, float *whole) {
#ifdef PDDE_HAVE_UCX
    int ranks = o->dp * o->tp * o->pp, me = pdde_comm_rank(comm), mine = 0;
    const pdde_plan *plan = o->plan ? &o->parsed_plan : NULL;
    if (pdde_comm_allgather(comm, row, all, (size_t)cols, PDDE_F32) != PDDE_OK) return;
    for (int r = 0; r < ranks; r++)
        if ((plan ? pdde_plan_process_of_rank(plan, r) : r) == me) mine = r;
    int s = mine % o->pp, d = mine / o->pp / o->tp;
    for (int t = 0; t < o->tp; t++) {
        int r = (d * o->tp + t) * o->pp + s, proc = plan ? pdde_plan_process_of_rank(plan, r) : r;
        memcpy(whole + (size_t)t * cols, all + (size_t)proc * cols, (size_t)cols * sizeof *whole);
    }
#else
    (void)comm, (void)o, (void)row, (void)cols, (void)all, (void)whole;
#endif
}

/* Samples n bytes: the context fills every row of the batch, the next byte comes from the logits at
 * the last filled position (temperature 0.8). Every rank runs it; the ones holding the logits (the
 * last pipeline stage) can read them, and `print` says which one prints. */
static void sample(pdde_session *s, gpt_model *m, pdde_comm *comm, const options *o, const feeder *f, int n, int print) {
    int T = m->cfg.ctx, V = m->cfg.vocab, BT = f->batch * T;
    uint64_t seed = o->seed;
    int32_t *ids = calloc((size_t)BT, sizeof *ids);
    const pdde_tensor *block = pdde_session_tensor(s, m->logits); /* this rank's (NULL: another stage's) */
    size_t bytes = block ? pdde_tensor_nbytes(block) : sizeof(float);
    /* this rank's columns of a row: V, or V / tp under vocab-parallel tensor parallelism */
    int cols = block ? (int)block->shape[block->ndim - 1] : V / o->tp, split = comm && o->tp > 1 && V % o->tp == 0;
    float *logits = malloc(bytes), *zeros = calloc((size_t)V, sizeof *zeros), *whole = malloc((size_t)V * sizeof *whole);
    float *all = malloc((size_t)(split ? o->dp * o->tp * o->pp : 1) * cols * sizeof *all);
    char *text = malloc((size_t)n + 2);
    int len = 0, filled = 1;
    ids[0] = '\n';
    for (int k = 0; k < n; k++) {
        for (int r = 1; r < BT / T; r++) memcpy(ids + r * T, ids, (size_t)T * sizeof *ids);
        if (gpt_write_batch(s, m, f->plan, f->dp_index, ids, NULL) != PDDE_OK || pdde_session_run(s, PDDE_RUN_FORWARD) != PDDE_OK) break;
        bool have = block && pdde_session_read(s, m->logits, logits, bytes) == PDDE_OK;
        if (!have) print = 0; /* another stage's */
        const float *row = have ? logits + (size_t)(filled - 1) * cols : zeros;
        if (split) gather_vocab_row(comm, o, row, cols, all, whole), row = whole;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < 256; v++) mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < 256; v++) sum += exp((row[v] - mx) / 0.8);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double r = (double)(seed >> 11) / 9007199254740992.0 * sum, acc = 0;
        int next = 255;
        for (int v = 0; v < 256; v++) if ((acc += exp((row[v] - mx) / 0.8)) >= r) { next = v; break; }
        text[len++] = (char)next;
        if (filled == T) { memmove(ids, ids + 1, (size_t)(T - 1) * sizeof *ids); filled--; }
        ids[filled++] = next;
    }
    text[len] = 0;
    if (print) printf("---- sample ----\n%s\n----------------\n", text);
    free(ids), free(logits), free(zeros), free(whole), free(all), free(text);
}

int main(int argc, char **argv) {
    options o = {
        .model = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8},
        .steps = 600, .val_every = 100, .val_batches = 8, .sample_len = 300, .ckpt_every = 200,
        .lr = 3e-3f, .weight_decay = 0.1f, .clip = 1.0f, .seed = 1337, .dp = 1, .tp = 1, .pp = 1, .micro = 1,
        .data = "/usr/share/games/fortunes/songs-poems",
    };
    if (parse(argc, argv, &o)) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);

    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = o.threads;
    cp.seed = o.seed;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { fprintf(stderr, "gpt: cannot create a context\n"); return 1; }
    pdde_data *train, *val;
    TRY(pdde_data_open_part(ctx, o.data, 0.0, 0.9, &train));
    TRY(pdde_data_open_part(ctx, o.data, 0.9, 1.0, &val));
    if (pdde_data_token_count(val) <= o.model.ctx) { fprintf(stderr, "gpt: %s is too short for a context of %d\n", o.data, o.model.ctx); return 1; }

    /* Several ranks: every parallelism comes from distributed attributes — one global graph (of one
     * micro-batch), annotated for the plan, completed, and run SPMD by each rank. */
    pdde_comm *comm = NULL;
    if (o.plan && !strcmp(o.plan, "auto") && choose_plan(ctx, &o)) return 1;
    int rank = 0, ranks = o.dp * o.tp * o.pp;
    if (ranks > 1) {
#ifdef PDDE_HAVE_UCX
        pdde_comm_params pp = PDDE_COMM_PARAMS_INIT;
        TRY(pdde_comm_init(ctx, &pp, &comm));
        if (pdde_comm_size(comm) != ranks) {
            fprintf(stderr, "gpt: --dp %d x --tp %d x --pp %d but the launcher started %d ranks\n", o.dp, o.tp, o.pp, pdde_comm_size(comm));
            return 1;
        }
        rank = pdde_comm_rank(comm);
#else
        fprintf(stderr, "gpt: --dp needs pdde built with UCX\n");
        return 1;
#endif
    }
    pdde_graph *g;
    gpt_model m;
    TRY(pdde_graph_init(ctx, &g));
    TRY(pdde_graph_set_compute_dtype(g, o.dtype));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = o.lr, op.weight_decay = o.weight_decay, op.clip_norm = o.clip;
    op.schedule = PDDE_LR_COSINE, op.warmup_steps = o.steps / 20, op.total_steps = o.steps, op.min_lr_ratio = 0.1f;
    /* recompute: only the residual stream between blocks is kept for backward */
    gpt_plan plan = {.dp = o.dp, .tp = o.tp, .pp = o.pp, .micro = o.micro, .zero = o.zero, .recompute = o.recompute, .pp_chunks = o.pp_chunks};
    if (o.plan) plan = gpt_plan_of(&o.parsed_plan);
    TRY(gpt_build_plan(g, &o.model, &plan, &op, &m));
    pdde_mark_output(m.logits);

    /* placement: with --blocks-on, the transformer blocks (layers 1..L) go to that backend's device 0 */
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    sp.pipeline_schedule = o.gpipe || (o.plan && o.parsed_plan.schedule == PDDE_PIPELINE_GPIPE) ? PDDE_PIPELINE_GPIPE : PDDE_PIPELINE_1F1B;
    if (o.comm_bf16 || (o.plan && o.parsed_plan.comm_dtype == PDDE_BF16)) sp.comm_dtype = PDDE_BF16;
    sp.trace = o.trace;
    int *layer_dev = calloc((size_t)o.model.layers + 2, sizeof *layer_dev);
    const char *where = "cpu";
    const pdde_plan *placed = o.plan && o.parsed_plan.place[0] ? &o.parsed_plan : NULL; /* --plan ...,place=B: the plan's layers */
    if (o.blocks_on || placed) {
        const char *backend = o.blocks_on ? o.blocks_on : placed->place;
        int dev = pdde_device_find(ctx, backend, 0);
        if (dev < 0) {
            fprintf(stderr, "gpt: no device of backend '%s' (see build/pdde-info)\n", backend);
            return 1;
        }
        for (int l = 0; l < o.model.layers + 2; l++)
            if (o.blocks_on ? l >= 1 && l <= o.model.layers : pdde_plan_layer_on_device(placed, o.model.layers + 2, l)) layer_dev[l] = dev;
        sp.layer_devices = layer_dev, sp.n_layer_devices = o.model.layers + 2;
        where = backend;
    }
    pdde_session *s;
    TRY(pdde_session_init(g, &sp, &s));
    if (o.show_program) pdde_session_dump(s, stdout);
    pdde_memory_stats ms;
    pdde_session_memory(s, &ms);
    printf("gpt: %d layers, %d heads, width %d, context %d, batch %d: %.2fM parameters; blocks on %s%s, %d threads",
           o.model.layers, o.model.heads, o.model.width, o.model.ctx, o.model.batch, (double)gpt_n_params(&o.model) / 1e6,
           where, o.recompute ? " (recomputed)" : "", pdde_context_thread_count(ctx));
    if (ranks > 1) printf("; %d ranks: dp %d x tp %d x pp %d%s%s", ranks, o.dp, o.tp, o.pp, o.zero ? ", ZeRO-" : "", o.zero ? (const char *[]){"", "1", "2", "3"}[o.zero] : "");
    if (o.micro > 1) printf("; %d micro-batches%s", o.micro, o.pp > 1 ? (o.gpipe ? " (GPipe)" : " (1F1B)") : "");
    printf("\n");
    printf("gpt: data %s (%lld training tokens); memory: params %.1f MB, grads %.1f MB, adam %.1f MB, activations %.1f MB (plan) of %.1f MB\n",
           o.data, (long long)pdde_data_token_count(train), ms.param_bytes / 1e6, ms.grad_bytes / 1e6, ms.optimizer_bytes / 1e6,
           ms.arena_bytes / 1e6, ms.activation_bytes / 1e6);

    char ckpt[4096] = "";
    if (o.ckpt_dir) {
        mkdir(o.ckpt_dir, 0755);
        /* ZeRO-1 shards the optimizer state: every rank keeps its own file */
        snprintf(ckpt, sizeof ckpt, "%s/gpt.ckpt", o.ckpt_dir); /* whole tensors, whatever the plan */
        if (o.resume) {
            pdde_checkpoint_extra ex = {.use_graph_schedule = o.reschedule};
            pdde_status st = pdde_checkpoint_load(s, ckpt, &ex);
            if (st == PDDE_OK) {
                pdde_data_set_position(train, ex.data_position);
                printf("gpt: resumed from %s at step %lld\n", ckpt, (long long)pdde_session_step(s));
                const pdde_optimizer_params *was = &ex.schedule;
                if (ex.schedule_differs && rank == 0)
                    printf("gpt: the checkpoint's run scheduled lr %.3g over %lld steps (warmup %lld); this one asks for lr %.3g over %lld "
                           "(warmup %lld): %s (lr of the next step %.3g)\n", was->lr, (long long)was->total_steps,
                           (long long)was->warmup_steps, op.lr, (long long)op.total_steps, (long long)op.warmup_steps,
                           o.reschedule ? "--reschedule: CHANGING to this run's schedule" : "keeping the checkpoint's schedule (--reschedule changes it)",
                           pdde_session_lr(s));
            } else if (st != PDDE_ERR_NOT_FOUND) {
                fprintf(stderr, "gpt: cannot resume: %s\n", pdde_last_error(ctx));
                return 1;
            }
        }
    }

    FILE *metrics = NULL; /* rank 0 writes it: the loss and the schedule are the same on every rank */
    if (o.metrics && rank == 0 && !(metrics = fopen(o.metrics, o.resume ? "a" : "w"))) {
        fprintf(stderr, "gpt: --metrics %s: cannot open it for writing\n", o.metrics);
        return 1;
    }
    size_t bt = (size_t)o.model.batch * o.model.ctx;
    feeder feed = {&plan, rank / (o.tp * o.pp), o.model.batch}; /* (mesh [dp, tp, pp]: pp innermost) */
    int32_t *x = malloc(bt * sizeof *x), *y = malloc(bt * sizeof *y);
    double t0 = now(), tlast = t0;
    int64_t first = pdde_session_step(s);
    float ema_tps = 0;
    int64_t last = o.stop_after > 0 && o.stop_after < o.steps ? o.stop_after : o.steps;
    for (int64_t step = first; step < last; step++) {
        TRY(pdde_data_next_batch(train, o.model.batch, o.model.ctx, o.seed, x, y)); /* the global batch */
        float lr = pdde_session_lr(s); /* this step's (the schedule of the run a resume continues) */
        /* under SPMD every rank gets its block of each micro-batch from its attributes (uneven shares:
         * its share of the micro-batches) */
        TRY(gpt_write_batch(s, &m, &plan, feed.dp_index, x, y));
        TRY(pdde_session_run(s, PDDE_RUN_STEP));
        float loss = pdde_session_loss(s); /* the step's loss, the same on every rank */
        double t = now(), dt = t - tlast;
        tlast = t;
        float tps = (float)(bt / dt);
        ema_tps = step == first ? tps : 0.9f * ema_tps + 0.1f * tps;
        double eta = (double)(o.steps - step - 1) * bt / ema_tps;
        pdde_loss_scale_stats sc;
        pdde_session_loss_scale(s, &sc);
        char scaling[64] = "";
        if (sc.enabled) snprintf(scaling, sizeof scaling, "  scale %g%s (%lld skipped)", sc.scale, sc.last_skipped ? " SKIPPED" : "", (long long)sc.skipped_steps);
        if (rank == 0 && (step % 10 == 0 || step + 1 == o.steps || sc.last_skipped))
            printf("step %5lld/%d  loss %.4f  lr %.2e  %7.0f tok/s  ETA %4.0fs%s\n", (long long)step + 1, o.steps,
                   loss, lr, ema_tps, eta, scaling);
        if (metrics) {
            pdde_session_memory(s, &ms);
            fprintf(metrics, "{\"step\":%lld,\"loss\":%.6g,\"lr\":%.6g,\"tokens_per_s\":%.1f,\"step_s\":%.6f,\"memory_bytes\":%zu,\"time_s\":%.3f}\n",
                    (long long)step + 1, loss, lr, tps, dt, ms.allocated_bytes, t - t0);
            fflush(metrics);
        }
        if (((o.val_every && (step + 1) % o.val_every == 0) || step + 1 == last)) {
            float vloss = validate(s, &m, val, o.val_batches, &feed, x, y);
            if (rank == 0) printf("step %5lld  validation loss %.4f\n", (long long)step + 1, vloss);
            if (metrics) fprintf(metrics, "{\"step\":%lld,\"val_loss\":%.6g}\n", (long long)step + 1, vloss), fflush(metrics);
        }
        if (ckpt[0] && ((o.ckpt_every && (step + 1) % o.ckpt_every == 0) || step + 1 == last)) {
            pdde_checkpoint_extra ex = {.data_position = pdde_data_position(train)};
            TRY(pdde_checkpoint_save(s, ckpt, &ex));
        }
    }
    if (rank == 0) printf("gpt: trained %lld steps in %.1f s%s\n", (long long)(last - first > 0 ? last - first : 0), now() - t0,
                          last < o.steps ? " (--stop-after: --resume continues)" : "");
    if (metrics) fclose(metrics);
    if (o.sample_len > 0) sample(s, &m, comm, &o, &feed, o.sample_len, rank == (o.pp > 1 ? ranks - 1 : 0));
    free(x), free(y), free(layer_dev);
    pdde_session_free(s);
    pdde_graph_free(g);
#ifdef PDDE_HAVE_UCX
    pdde_comm_free(comm);
#endif
    pdde_data_close(train), pdde_data_close(val);
    pdde_context_free(ctx);
    return 0;
}
