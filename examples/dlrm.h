/* dlrm.h — Demonstrates how to build a recommender over parameter-server tables and run its step as
 * an asynchronous pipeline: a DLRM-style CTR model, the Criteo TSV reader, a synthetic
 * Criteo-format generator with a known logistic ground truth, and AUC / logloss (shared by
 * examples/dlrm.c, the tests and the benchmark).
 *
 *   dense [B, 13] (log(1 + max(x, 0)))  -> bottom MLP 13 -> dim (relu)          : [B, 1, dim]
 *   26 sparse ids per sample -> pulled rows of one table (ids keyed by field)    : [B, 26, dim]
 *   concat -> [B, 27 dim] -> top MLP -> hidden (relu) -> 2 logits -> cross-entropy (= logistic loss)
 * Layer 0 is the sparse part (on the CPU), layer 1 the dense network (placed on an accelerator when
 * asked), so a pipeline can run them on different devices. */
#ifndef PDDE_EXAMPLE_DLRM_H
#define PDDE_EXAMPLE_DLRM_H
#include "pdde.h"
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DLRM_DENSE 13
#define DLRM_SPARSE 26
#define DLRM_FIELDS (1 + DLRM_DENSE + DLRM_SPARSE)
#define DLRM_LINE_MAX 4096

/* Where the dense network's parameters are updated: by AdamW (or SGD) in the graph (data-parallel
 * over the workers: pdde_sparse_allreduce_dense), or held on the parameter servers (the graph has no
 * optimizer; pdde_sparse_batch_hold_dense). */
typedef enum { DLRM_DENSE_ADAMW = 0, DLRM_DENSE_SGD, DLRM_DENSE_ON_SERVERS } dlrm_dense_update;

typedef struct {
    int batch, dim, hidden;
    float lr;                 /* dense AdamW / SGD */
    dlrm_dense_update dense;
} dlrm_config;
#define DLRM_CONFIG_INIT {256, 8, 64, 0.01f, DLRM_DENSE_ADAMW} /* build/dlrm's defaults */

typedef struct {
    dlrm_config cfg;
    pdde_tensor *dense, *labels, *logits, *loss;
    pdde_sparse_embedding *emb;
} dlrm_model;

typedef struct {
    int label;
    float dense[DLRM_DENSE];
    uint64_t ids[DLRM_SPARSE];  /* (field << 32) | the hex value; PDDE_SPARSE_NO_ID when empty */
} dlrm_sample;

/* Seconds on a clock: CLOCK_MONOTONIC for wall time, CLOCK_PROCESS_CPUTIME_ID for the process's CPU time. */
static inline double dlrm_seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline pdde_tensor *dlrm_linear(pdde_graph *g, const char *name, pdde_tensor *x, int64_t in, int64_t out) {
    char n[64];
    snprintf(n, sizeof n, "%s.w", name);
    pdde_tensor *w = pdde_param(g, n, 2, (int64_t[]){in, out}, 1.0f / sqrtf((float)in));
    snprintf(n, sizeof n, "%s.b", name);
    pdde_tensor *b = pdde_param(g, n, 1, (int64_t[]){out}, 0.0f);
    return pdde_bias_add(g, pdde_matmul(g, x, w, 0, 0), b);
}

/* Builds forward, backward and the dense optimizer; returns pdde_graph_status(g). */
static inline pdde_status dlrm_build(pdde_graph *g, const dlrm_config *c, dlrm_model *m) {
    int64_t B = c->batch, D = c->dim;
    m->cfg = *c;
    pdde_graph_set_layer(g, 0);
    pdde_tensor *emb = pdde_sparse_embedding_init(g, "emb", B, DLRM_SPARSE, 1, c->dim, PDDE_POOL_SUM, &m->emb);
    pdde_graph_set_layer(g, 1);
    m->dense = pdde_input(g, "dense", PDDE_F32, 2, (int64_t[]){B, DLRM_DENSE});
    m->labels = pdde_input(g, "labels", PDDE_I32, 1, (int64_t[]){B});
    pdde_tensor *bottom = pdde_relu(g, dlrm_linear(g, "bottom", m->dense, DLRM_DENSE, D));
    pdde_tensor *parts[2] = {pdde_reshape(g, bottom, 3, (int64_t[]){B, 1, D}), emb};
    pdde_tensor *x = pdde_reshape(g, pdde_concat(g, 2, parts, 1), 2, (int64_t[]){B, (DLRM_SPARSE + 1) * D});
    pdde_tensor *h = pdde_relu(g, dlrm_linear(g, "top1", x, (DLRM_SPARSE + 1) * D, c->hidden));
    m->logits = dlrm_linear(g, "top2", h, c->hidden, 2);
    m->loss = pdde_cross_entropy(g, m->logits, m->labels);
    pdde_mark_output(m->logits);
    pdde_graph_set_layer(g, -1);
    pdde_status st = pdde_graph_status(g);
    if (!st) st = pdde_backward(g, m->loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = c->lr;
    if (!st && c->dense == DLRM_DENSE_ADAMW) st = pdde_optimizer_adamw(g, &op);
    if (!st && c->dense == DLRM_DENSE_SGD) st = pdde_optimizer_sgd(g, &op);
    return st;
}

/* Writes one batch of samples into the model's dense inputs. */
static inline pdde_status dlrm_feed_dense(pdde_session *s, const dlrm_model *m, const dlrm_sample *b) {
    int B = m->cfg.batch;
    float *x = malloc((size_t)B * DLRM_DENSE * sizeof *x);
    int32_t *y = malloc((size_t)B * sizeof *y);
    pdde_status st = x && y ? PDDE_OK : PDDE_ERR_OOM;
    for (int i = 0; i < B && !st; i++) memcpy(x + i * DLRM_DENSE, b[i].dense, sizeof b[i].dense), y[i] = b[i].label;
    if (!st) st = pdde_session_write(s, m->dense, x, (size_t)B * DLRM_DENSE * sizeof *x);
    if (!st) st = pdde_session_write(s, m->labels, y, (size_t)B * sizeof *y);
    free(x), free(y);
    return st;
}

static inline void dlrm_batch_ids(const dlrm_sample *b, int n, uint64_t *ids) {
    for (int i = 0; i < n; i++) memcpy(ids + (size_t)i * DLRM_SPARSE, b[i].ids, sizeof b[i].ids);
}

/* P(click) of each sample from the logits [B, 2]. */
static inline void dlrm_probs(const float *logits, int n, double *p) {
    for (int i = 0; i < n; i++) p[i] = 1.0 / (1.0 + exp((double)logits[2 * i] - (double)logits[2 * i + 1]));
}

/* ------------------------------------------------------------------------------------------------
 * Criteo TSV: label, 13 integers, 26 hex ids (up to 8 digits), tab-separated, any field may be empty
 * (an empty integer is 0, an empty id PDDE_SPARSE_NO_ID). A malformed line (field count, a bad
 * number, over DLRM_LINE_MAX bytes) is counted and skipped with a message naming the file and line. */

typedef struct {
    FILE *f;
    char path[512];
    long line;
    long malformed, messages;
    char buf[DLRM_LINE_MAX + 3]; /* (a longest line, its "\r\n" and the NUL) */
} dlrm_reader;

static inline int dlrm_reader_open(dlrm_reader *r, const char *path) {
    memset(r, 0, sizeof *r);
    snprintf(r->path, sizeof r->path, "%s", path);
    r->f = fopen(path, "r");
    if (!r->f) fprintf(stderr, "dlrm: cannot open %s: %s\n", path, strerror(errno));
    return r->f ? 0 : -1;
}

static inline void dlrm_reader_close(dlrm_reader *r) { if (r->f) fclose(r->f), r->f = NULL; }

static inline void dlrm_reader_rewind(dlrm_reader *r) { rewind(r->f), r->line = 0; }

static inline int dlrm_reader_bad(dlrm_reader *r, const char *why, int field) {
    r->malformed++;
    if (r->messages++ < 10) fprintf(stderr, "dlrm: %s:%ld: malformed line skipped: %s (field %d)\n", r->path, r->line, why, field + 1);
    return 0;
}

/* Parses one line into s: 1 ok, 0 malformed (counted). An integer is [+-]digits within int64, an id 1 to
 * 8 hex digits. By hand, in one pass over the bytes: this is most of the pipeline's first stage. */
static inline int dlrm_parse_line(dlrm_reader *r, const char *line, dlrm_sample *s) {
    const char *p = line;
    if ((p[0] != '0' && p[0] != '1') || (p[1] && p[1] != '\t')) return dlrm_reader_bad(r, "label is not 0 or 1", 0);
    s->label = *p++ - '0';
    for (int j = 0; j < DLRM_DENSE; j++) {
        if (*p++ != '\t') return dlrm_reader_bad(r, "fewer than 40 fields", j);
        int neg = *p == '-', sign = neg || *p == '+', digits = 0;
        uint64_t x = 0;
        for (p += sign; *p >= '0' && *p <= '9'; p++, digits++)
            if (__builtin_mul_overflow(x, 10, &x) || __builtin_add_overflow(x, (uint64_t)(*p - '0'), &x)) break;
        if ((*p && *p != '\t') || (sign && !digits) || x > (UINT64_C(1) << 63) - !neg) return dlrm_reader_bad(r, "bad integer", 1 + j);
        s->dense[j] = neg ? 0.0f : (float)log1p((double)x);
    }
    for (int j = 0; j < DLRM_SPARSE; j++) {
        if (*p++ != '\t') return dlrm_reader_bad(r, "fewer than 40 fields", DLRM_DENSE + j);
        uint64_t x = 0;
        int digits = 0;
        for (;; p++, digits++) { /* (a digit's value without a branch on its kind: they come in random order) */
            unsigned c = (unsigned char)*p, decimal = c - '0', letter = (c | 32) - 'a';
            if (decimal >= 10 && letter >= 6) break;
            x = x << 4 | (decimal < 10 ? decimal : letter + 10);
        }
        if (*p && *p != '\t') return dlrm_reader_bad(r, "bad hex id", 1 + DLRM_DENSE + j);
        if (digits > 8) return dlrm_reader_bad(r, "id longer than 8 hex digits", 1 + DLRM_DENSE + j);
        s->ids[j] = digits ? (uint64_t)j << 32 | x : PDDE_SPARSE_NO_ID;
    }
    return *p ? dlrm_reader_bad(r, "more than 40 fields", DLRM_FIELDS) : 1;
}

/* The next well-formed sample: 1, or 0 at the end of the file. */
static inline int dlrm_reader_next(dlrm_reader *r, dlrm_sample *s) {
    for (;;) {
        /* A full buffer is told by fgets's NUL in its last byte, not by strlen, which a NUL byte in the
         * line cuts short: the rest of the line would then be read as lines of their own. */
        r->buf[sizeof r->buf - 1] = 1;
        if (!fgets(r->buf, sizeof r->buf, r->f)) break;
        r->line++;
        size_t len = r->buf[sizeof r->buf - 1] == 0 ? sizeof r->buf - 1 : strlen(r->buf);
        int ended = len && r->buf[len - 1] == '\n', full = len == sizeof r->buf - 1;
        if (ended) r->buf[--len] = 0;
        if (len && r->buf[len - 1] == '\r') r->buf[--len] = 0;
        if (!ended && full) { /* over-long, and more of it to come: skip the rest of it */
            int ch;
            while ((ch = fgetc(r->f)) != EOF && ch != '\n') {}
        }
        /* (measured without its line end: a CRLF line is as long as the same line with LF) */
        if (len > DLRM_LINE_MAX || (!ended && full)) {
            dlrm_reader_bad(r, "line longer than 4096 bytes", 0);
            continue;
        }
        if (dlrm_parse_line(r, r->buf, s)) return 1;
    }
    return 0;
}

/* Seconds to parse one line on this thread: the median of 5 passes over lines[0..n) by the thread's CPU
 * clock, as pdde-bench times the table's calls (a calibration of stage 1, which parses as well as
 * pulls where it reads text; dlrm_stages_predict). */
static inline double dlrm_parse_seconds(const char *const *lines, int n) {
    dlrm_reader r;
    memset(&r, 0, sizeof r);
    snprintf(r.path, sizeof r.path, "calibration");
    dlrm_sample s;
    double t[5];
    for (int pass = 0; pass < 5; pass++) {
        double t0 = dlrm_seconds(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < n; i++) dlrm_parse_line(&r, lines[i], &s);
        t[pass] = dlrm_seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
        for (int j = pass; j > 0 && t[j] < t[j - 1]; j--) { double x = t[j]; t[j] = t[j - 1], t[j - 1] = x; }
    }
    return n > 0 ? t[2] / n : 0;
}

/* ------------------------------------------------------------------------------------------------
 * Synthetic data: every field f has `vocab` ids with a true weight normal(0, 0.5) (id k of field f has
 * weight w(f, k)), drawn by popularity (a Zipf-like law: low k far more often); the 13 integers are
 * geometric counts whose log enters with a true coefficient; P(click) = sigmoid(bias + sum of the
 * weights of the sample's ids + sum a_j log(1 + x_j)). The ground-truth probability of each sample is
 * known, so the best achievable AUC (its AUC) is known too. */

typedef struct { uint64_t s; } dlrm_rng;
static inline uint64_t dlrm_next(dlrm_rng *r) {
    uint64_t x = (r->s += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline double dlrm_uniform(dlrm_rng *r) { return ((double)(dlrm_next(r) >> 11) + 0.5) * 0x1.0p-53; }
static inline double dlrm_gauss(dlrm_rng *r) { return sqrt(-2 * log(dlrm_uniform(r))) * cos(6.283185307179586 * dlrm_uniform(r)); }

static inline double dlrm_true_weight(uint64_t seed, int field, uint32_t k) {
    dlrm_rng r = {seed ^ ((uint64_t)field << 40) ^ (uint64_t)k * 0x2545f4914f6cdd1dull};
    dlrm_next(&r);
    return 0.5 * dlrm_gauss(&r);
}

/* Writes n samples to path; p_true[i] (if not NULL) gets sample i's true click probability. Returns 0
 * or -1 (message printed). */
static inline int dlrm_synthesize(const char *path, long n, int vocab, uint64_t seed, double *p_true) {
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "dlrm: cannot create %s: %s\n", path, strerror(errno)); return -1; }
    dlrm_rng r = {seed * 2654435761u + 1};
    double a[DLRM_DENSE];
    for (int j = 0; j < DLRM_DENSE; j++) a[j] = 0.3 * dlrm_gauss(&r);
    for (long i = 0; i < n; i++) {
        double logit = -0.5;
        int x[DLRM_DENSE];
        uint32_t k[DLRM_SPARSE];
        for (int j = 0; j < DLRM_DENSE; j++) {
            x[j] = (int)floor(log(dlrm_uniform(&r)) / log(0.8)); /* geometric, mean 4 */
            logit += a[j] * log1p(x[j]);
        }
        for (int j = 0; j < DLRM_SPARSE; j++) {
            k[j] = (uint32_t)((double)vocab * pow(dlrm_uniform(&r), 2.0)); /* popular ids first */
            logit += dlrm_true_weight(seed, j, k[j]);
        }
        double p = 1 / (1 + exp(-logit));
        if (p_true) p_true[i] = p;
        fprintf(f, "%d", dlrm_uniform(&r) < p);
        for (int j = 0; j < DLRM_DENSE; j++) {
            if (j == 3 && i % 17 == 0) fputs("\t", f); /* some empty integers, as in Criteo */
            else fprintf(f, "\t%d", x[j]);
        }
        for (int j = 0; j < DLRM_SPARSE; j++) fprintf(f, "\t%08x", (unsigned)(k[j] * 2654435761u));
        fputc('\n', f);
    }
    if (fclose(f)) { fprintf(stderr, "dlrm: cannot write %s: %s\n", path, strerror(errno)); return -1; }
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Metrics */

typedef struct { double p; int y; } dlrm_scored;

static inline int dlrm_cmp_scored(const void *a, const void *b) {
    double x = ((const dlrm_scored *)a)->p, y = ((const dlrm_scored *)b)->p;
    return (x > y) - (x < y);
}

/* Area under the ROC curve (ties count half); NaN when one class is missing or a score is NaN. */
static inline double dlrm_auc(const double *p, const int *y, long n) {
    dlrm_scored *v = malloc((size_t)n * sizeof *v);
    if (!v) return NAN;
    for (long i = 0; i < n; i++) {
        if (isnan(p[i])) { free(v); return NAN; }
        v[i].p = p[i], v[i].y = y[i];
    }
    qsort(v, (size_t)n, sizeof *v, dlrm_cmp_scored);
    double rank_sum = 0, pos = 0;
    for (long i = 0; i < n;) {
        long j = i;
        while (j < n && v[j].p == v[i].p) j++;
        double mid = (double)(i + j + 1) / 2; /* the mean 1-based rank of the tie group */
        for (long k = i; k < j; k++) if (v[k].y) rank_sum += mid, pos++;
        i = j;
    }
    free(v);
    double neg = (double)n - pos;
    return pos && neg ? (rank_sum - pos * (pos + 1) / 2) / (pos * neg) : NAN;
}

static inline double dlrm_logloss(const double *p, const int *y, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) {
        double q = p[i] < 1e-7 ? 1e-7 : p[i] > 1 - 1e-7 ? 1 - 1e-7 : p[i];
        s -= y[i] ? log(q) : log(1 - q);
    }
    return s / (double)n;
}
/* ------------------------------------------------------------------------------------------------
 * Steps. A training step: pull the batch's rows, forward + backward, the dense gradients averaged
 * over the workers (dense_comm; NULL: one worker), the dense update, the rows' gradients pushed. */

/* The dense part of a step on a batch whose rows are pulled into sb: forward + backward, the rows'
 * gradients collected into sb, the dense gradients averaged over the workers, the dense update. */
static inline pdde_status dlrm_step_dense(pdde_session *s, const dlrm_model *m, pdde_sparse_batch *sb, pdde_comm *dense_comm,
                                          const dlrm_sample *b) {
    pdde_status st = pdde_sparse_batch_feed(sb, s);
    if (!st) st = dlrm_feed_dense(s, m, b);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_sparse_batch_collect(sb, s);
    if (!st) st = pdde_sparse_allreduce_dense(s, dense_comm);
    if (!st) st = pdde_session_run(s, PDDE_RUN_OPTIMIZER);
    return st;
}

static inline pdde_status dlrm_train_step(pdde_session *s, const dlrm_model *m, pdde_sparse_batch *sb, pdde_ps_client *c,
                                          pdde_comm *dense_comm, const dlrm_sample *b, uint64_t *ids_scratch) {
    dlrm_batch_ids(b, m->cfg.batch, ids_scratch);
    pdde_status st = pdde_sparse_batch_pull(sb, c, ids_scratch);
    if (!st) st = dlrm_step_dense(s, m, sb, dense_comm, b);
    if (!st) st = pdde_sparse_batch_push(sb, c);
    return st;
}

/* The same step as the three stages of the asynchronous heterogeneous pipeline (pdde_pipeline):
 * 1 "pull" (CPU threads): the batch's samples from get_batch (reading and parsing), its rows pulled;
 * 2 "dense" (the session's device, one worker): dlrm_step_dense; 3 "push" (CPU): the rows' gradients.
 * A batch lives in a dlrm_slot while in flight. */
typedef struct {
    dlrm_sample *samples;
    uint64_t *ids;
    pdde_sparse_batch *sb;
} dlrm_slot;

typedef struct {
    const dlrm_model *m;
    pdde_session *s;
    pdde_ps_client *c;
    pdde_comm *dense_comm;
    pdde_status (*get_batch)(void *user, int64_t k, dlrm_sample *out); /* batch k's samples */
    void *user;
} dlrm_stages;

static inline pdde_status dlrm_stage_pull(void *u, void *slot, int64_t k, int worker) {
    const dlrm_stages *d = u;
    dlrm_slot *sl = slot;
    (void)worker;
    pdde_status st = d->get_batch(d->user, k, sl->samples);
    if (!st) dlrm_batch_ids(sl->samples, d->m->cfg.batch, sl->ids);
    return st ? st : pdde_sparse_batch_pull(sl->sb, d->c, sl->ids);
}
static inline pdde_status dlrm_stage_dense(void *u, void *slot, int64_t k, int worker) {
    const dlrm_stages *d = u;
    (void)k, (void)worker;
    return dlrm_step_dense(d->s, d->m, ((dlrm_slot *)slot)->sb, d->dense_comm, ((dlrm_slot *)slot)->samples);
}
static inline pdde_status dlrm_stage_push(void *u, void *slot, int64_t k, int worker) {
    (void)k, (void)worker;
    return pdde_sparse_batch_push(((dlrm_slot *)slot)->sb, ((const dlrm_stages *)u)->c);
}

/* The three stages over d (workers: 0 = sized by the pipeline; the dense stage has one session). */
static inline void dlrm_stages_fill(dlrm_stages *d, pdde_pipeline_stage st[3]) {
    memset(st, 0, 3 * sizeof *st);
    st[0] = (pdde_pipeline_stage){"pull", dlrm_stage_pull, d, 0, 0, 0};
    st[1] = (pdde_pipeline_stage){"dense", dlrm_stage_dense, d, 1, 1, 0};
    st[2] = (pdde_pipeline_stage){"push", dlrm_stage_push, d, 0, 0, 0};
}

/* Each stage's seconds per batch on one worker (pdde_pipeline_stage.predicted_s) from the planner's
 * cost model on cluster c (a pdde-bench file; pdde_cluster_detect's has no rates): "pull" the batch's
 * B lines parsed (parse_s a line: dlrm_parse_seconds; 0 where the samples come parsed) and its B x 26
 * ids pulled, "push" their rows' update by the table optimizer, both by pdde_cost_ps_time on the CPU
 * device cpu_id (pdde-bench's ps_pull / ps_push curves: the hash probes and cache misses of a table
 * larger than the caches); "dense" the model's step (pdde_cost_program_from_graph of g) simulated on
 * device dense_id. A stage the cluster cannot time (no curve or peak figure for its device) is left
 * at 0, so the pipeline measures a balance instead; returns how many stages were predicted (0..3). */
static inline int dlrm_stages_predict(pdde_context *ctx, const pdde_cluster *c, const pdde_graph *g, const dlrm_model *m,
                                      pdde_ps_optimizer table_optimizer, int cpu_id, int dense_id, double parse_s, pdde_pipeline_stage st[3]) {
    double ids = (double)m->cfg.batch * DLRM_SPARSE;
    st[0].predicted_s = (double)m->cfg.batch * parse_s + pdde_cost_ps_time(ctx, c, cpu_id, 0, ids, m->cfg.dim, table_optimizer);
    st[2].predicted_s = pdde_cost_ps_time(ctx, c, cpu_id, 1, ids, m->cfg.dim, table_optimizer);
    st[1].predicted_s = NAN;
    pdde_cost_program *p = NULL;
    pdde_cost_result *r = NULL;
    if (!pdde_cost_program_from_graph(g, dense_id, &p) && !pdde_cost_simulate(ctx, c, p, &r)) st[1].predicted_s = r->step_time;
    pdde_cost_result_free(r);
    pdde_cost_program_free(p);
    int known = 0;
    for (int k = 0; k < 3; k++) {
        if (!(st[k].predicted_s > 0 && isfinite(st[k].predicted_s))) st[k].predicted_s = 0;
        known += st[k].predicted_s > 0;
    }
    return known;
}

/* The id of the first device of machine h of cluster c whose spec has this backend ("cpu", "opencl", ...); -1: none. */
static inline int dlrm_machine_device(const pdde_cluster *c, int h, const char *backend) {
    for (int d = 0; c && h >= 0 && h < c->n_machines && d < c->machines[h].n_devices; d++)
        if (!strcmp(c->specs[c->machines[h].devices[d].spec].backend, backend)) return c->machines[h].devices[d].id;
    return -1;
}

/* The same, of the whole cluster (its machines in order). */
static inline int dlrm_cluster_device(const pdde_cluster *c, const char *backend) {
    for (int h = 0; c && h < c->n_machines; h++)
        if (dlrm_machine_device(c, h, backend) >= 0) return dlrm_machine_device(c, h, backend);
    return -1;
}

/* Per stage: its workers, the time per batch the sizing used (predicted or measured) and the time it
 * took (busy), and how long its threads waited for the stage before (starved) or for room after
 * (blocked), as fractions of the run's wall time. */
static inline void dlrm_pipeline_report(FILE *f, const char *prefix, const pdde_pipeline *pl, const pdde_pipeline_stage *stages) {
    pdde_pipeline_stats ps;
    pdde_pipeline_stats_get(pl, &ps);
    fprintf(f, "%ssized from %s\n", prefix, ps.sizing);
    for (int k = 0; k < ps.n_stages; k++) {
        const pdde_pipeline_stage_stats *s = &ps.stage[k];
        double nb = (double)(s->batches ? s->batches : 1), wall = ps.wall_s > 0 ? ps.wall_s : 1;
        fprintf(f, "%s%s x%d: sized at %.2f ms, took %.2f ms per batch (busy %.0f%%, starved %.0f%%, blocked %.0f%% of its threads' time)\n",
                prefix, stages[k].name, s->workers, 1e3 * s->predicted_s, 1e3 * s->busy_s / nb, 100 * s->busy_s / wall / s->workers,
                100 * s->starved_s / wall / s->workers, 100 * s->blocked_s / wall / s->workers);
    }
}

static inline pdde_status dlrm_slot_init(dlrm_slot *sl, const dlrm_model *m) {
    memset(sl, 0, sizeof *sl);
    sl->samples = malloc((size_t)m->cfg.batch * sizeof *sl->samples);
    sl->ids = malloc((size_t)m->cfg.batch * DLRM_SPARSE * sizeof *sl->ids);
    if (!sl->samples || !sl->ids) return PDDE_ERR_OOM;
    return pdde_sparse_batch_init(m->emb, &sl->sb);
}
static inline void dlrm_slot_free(dlrm_slot *sl) {
    free(sl->samples), free(sl->ids), pdde_sparse_batch_free(sl->sb);
    memset(sl, 0, sizeof *sl);
}

/* Click probabilities of n samples, every one (the last batch filled up to the graph's batch). */
static inline pdde_status dlrm_predict(pdde_session *s, const dlrm_model *m, pdde_sparse_batch *sb, pdde_ps_client *c,
                                       const dlrm_sample *samples, long n, double *p, uint64_t *ids_scratch) {
    int B = m->cfg.batch;
    float *logits = malloc((size_t)B * 2 * sizeof *logits);
    double *last = malloc((size_t)B * sizeof *last);
    dlrm_sample *tail = malloc((size_t)B * sizeof *tail);
    pdde_status st = logits && last && tail ? PDDE_OK : PDDE_ERR_OOM;
    for (long i = 0; i < n && !st; i += B) {
        /* the graph takes whole batches: the last, shorter one is filled with copies of its last sample
         * (the same ids: no row is added by them) and their predictions left out */
        long rows = n - i < B ? n - i : B;
        const dlrm_sample *batch = samples + i;
        if (rows < B) {
            for (long r = 0; r < B; r++) tail[r] = samples[i + (r < rows ? r : rows - 1)];
            batch = tail;
        }
        dlrm_batch_ids(batch, B, ids_scratch);
        st = pdde_sparse_batch_pull(sb, c, ids_scratch);
        if (!st) st = pdde_sparse_batch_feed(sb, s);
        if (!st) st = dlrm_feed_dense(s, m, batch);
        if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
        if (!st) st = pdde_session_read(s, m->logits, logits, (size_t)B * 2 * sizeof *logits);
        if (!st) dlrm_probs(logits, B, rows < B ? last : p + i);
        if (!st && rows < B) memcpy(p + i, last, (size_t)rows * sizeof *p);
    }
    free(logits), free(last), free(tail);
    return st;
}

/* Reads every well-formed sample of path (malformed lines counted in *malformed). NULL on error. */
static inline dlrm_sample *dlrm_load(const char *path, long *n, long *malformed) {
    dlrm_reader r;
    *n = 0;
    if (dlrm_reader_open(&r, path)) return NULL;
    long cap = 1024;
    dlrm_sample *v = malloc((size_t)cap * sizeof *v);
    while (v) {
        if (*n == cap) {
            dlrm_sample *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!w) { free(v); v = NULL; break; }
            v = w;
        }
        if (!dlrm_reader_next(&r, &v[*n])) break;
        (*n)++;
    }
    if (malformed) *malformed = r.malformed;
    dlrm_reader_close(&r);
    return v;
}
#endif
