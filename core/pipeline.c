/* core/pipeline.c — the asynchronous pipeline: stage functions on worker threads joined by bounded queues.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

#include "../backends/deadline.h"

/* ================================================================================================
 * Asynchronous pipeline (pdde.h): stage functions on worker threads, bounded queues of slots between
 * them. Queue k feeds stage k (queue 0 holds the free slots); the last stage gives its slots back to
 * queue 0. A stage's last worker to finish closes the queue after it, so the stages drain in order.
 * Errors: a stage's message is its worker thread's own (errors are per thread: backends/base.c); the
 * run's first error is kept in the pipeline under its lock (that message copied at once, or a note
 * that the stage left none) and raised on the calling thread once every worker has joined. */

typedef struct { void *slot; int64_t index; } pipe_item;

typedef struct {
    pipe_item *v;
    int head, n, cap;
    int open_producers;      /* workers of the stage before still running (queue 0: not used) */
} pipe_queue;

typedef struct {
    int64_t batches;
    double busy_s, cpu_s, starved_s, blocked_s;
} pipe_counts;

struct pdde_pipeline {
    pdde_context *ctx;
    pdde_pipeline_params p;
    pdde_pipeline_stage stage[PDDE_PIPELINE_MAX_STAGES];
    int workers[PDDE_PIPELINE_MAX_STAGES];
    double per_batch_s[PDDE_PIPELINE_MAX_STAGES]; /* what sizing used */
    bool sized;
    pipe_queue q[PDDE_PIPELINE_MAX_STAGES];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t next, end;       /* the run's next batch to start, and its end */
    pdde_status st;          /* the run's first error */
    bool failed;
    char error[sizeof ((pdde_context *)0)->last_error]; /* its message */
    pdde_pipeline_stats stats;
};

static double pipe_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

pdde_status pdde_pipeline_init(pdde_context *ctx, const pdde_pipeline_params *p, pdde_pipeline **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_pipeline_init: no out");
    *out = NULL;
    if (!p || p->n_stages < 1 || p->n_stages > PDDE_PIPELINE_MAX_STAGES || !p->stages || !p->slots || p->n_slots < 1 ||
        p->queue_depth < 0 || p->max_threads < 0 || p->calibrate_batches < 0 || !(p->timeout_s >= 0))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pipeline: %d stages (1..%d), %d slots (>= 1), queue depth %d, max threads %d, "
                          "calibrate %d, timeout %g (none negative)", p ? p->n_stages : 0, PDDE_PIPELINE_MAX_STAGES,
                          p ? p->n_slots : 0, p ? p->queue_depth : 0, p ? p->max_threads : 0, p ? p->calibrate_batches : 0, p ? p->timeout_s : 0.0);
    for (int k = 0; k < p->n_stages; k++) {
        const pdde_pipeline_stage *s = &p->stages[k];
        if (!s->fn || s->workers < 0 || s->max_workers < 0 || (s->max_workers && s->workers > s->max_workers) || !(s->predicted_s >= 0))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pipeline: stage %d (%s): %s, workers %d, max_workers %d, predicted_s %g", k,
                              s->name ? s->name : "?", s->fn ? "a function" : "no function", s->workers, s->max_workers, s->predicted_s);
    }
    pdde_pipeline *pl = calloc(1, sizeof *pl);
    if (!pl) return pdde_error(ctx, PDDE_ERR_OOM, "pipeline: out of memory");
    pl->ctx = ctx, pl->p = *p;
    if (!pl->p.queue_depth || pl->p.queue_depth > p->n_slots) pl->p.queue_depth = p->n_slots;
    if (!pl->p.max_threads) pl->p.max_threads = pdde_context_thread_count(ctx);
    if (!pl->p.calibrate_batches) pl->p.calibrate_batches = 3;
    if (pl->p.timeout_s == 0) pl->p.timeout_s = 60;
    pl->p.stages = NULL;
    memcpy(pl->stage, p->stages, (size_t)p->n_stages * sizeof *pl->stage);
    bool all_fixed = true;
    for (int k = 0; k < p->n_stages; k++) {
        if (!pl->stage[k].name) pl->stage[k].name = "stage";
        pl->workers[k] = pl->stage[k].workers;
        all_fixed &= pl->workers[k] > 0;
        /* queue 0 holds every slot; the others queue_depth */
        pl->q[k].cap = k ? pl->p.queue_depth : p->n_slots;
        if (!(pl->q[k].v = malloc((size_t)pl->q[k].cap * sizeof *pl->q[k].v))) { pdde_pipeline_free(pl); return pdde_error(ctx, PDDE_ERR_OOM, "pipeline: out of memory"); }
    }
    if (all_fixed) {
        pl->sized = true;
        snprintf(pl->stats.sizing, sizeof pl->stats.sizing, "as given");
    }
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->cv, NULL);
    pl->stats.n_stages = p->n_stages;
    *out = pl;
    return PDDE_OK;
}

void pdde_pipeline_free(pdde_pipeline *pl) {
    if (!pl) return;
    for (int k = 0; k < PDDE_PIPELINE_MAX_STAGES; k++) free(pl->q[k].v);
    if (pl->stats.n_stages) pthread_mutex_destroy(&pl->mu), pthread_cond_destroy(&pl->cv);
    free(pl);
}

/* Records the run's first error and its message (the caller holds mu) and wakes every waiting thread. */
static void pipe_fail(pdde_pipeline *pl, pdde_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void pipe_fail(pdde_pipeline *pl, pdde_status st, const char *fmt, ...) {
    if (!pl->failed) {
        pl->failed = true, pl->st = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pl->error, sizeof pl->error, fmt, ap);
        va_end(ap);
    }
    pthread_cond_broadcast(&pl->cv);
}

/* Stage k's failure st on batch index, into out: the message its call raised (on whichever context),
 * or a note that it raised none (errors_before: error_count() before the call), never an older
 * message of the thread's nor another thread's. */
static void pipe_stage_error(const pdde_pipeline *pl, int k, int64_t index, pdde_status st, uint64_t errors_before, char *out, size_t cap) {
    bool told = error_count() != errors_before;
    snprintf(out, cap, "pipeline: stage %d (%.32s), batch %lld: %.900s%s", k, pl->stage[k].name, (long long)index,
             told ? error_here() : pdde_status_str(st), told ? "" : " (the stage left no message)");
}

/* Gives every stage without a fixed worker count its share of max_threads, from per_batch_s. */
static void pipe_size(pdde_pipeline *pl, const char *source) {
    int n = pl->p.n_stages, used = 0;
    for (int k = 0; k < n; k++) {
        if (!pl->stage[k].workers) pl->workers[k] = 1;
        used += pl->workers[k];
    }
    for (; used < pl->p.max_threads; used++) {
        int best = -1;
        for (int k = 0; k < n; k++) {
            const pdde_pipeline_stage *s = &pl->stage[k];
            if (s->workers || (s->max_workers && pl->workers[k] >= s->max_workers)) continue;
            if (best < 0 || pl->per_batch_s[k] / pl->workers[k] > pl->per_batch_s[best] / pl->workers[best]) best = k;
        }
        /* a thread only where it shortens the slowest stage: adding to another one takes a core from it */
        double slowest = 0;
        for (int k = 0; k < n; k++) slowest = fmax(slowest, pl->per_batch_s[k] / pl->workers[k]);
        if (best < 0 || pl->per_batch_s[best] / pl->workers[best] < slowest) break;
        pl->workers[best]++;
    }
    char *b = pl->stats.sizing;
    size_t cap = sizeof pl->stats.sizing, len = 0;
    double slowest = 0, in_turn = 0;
    len += (size_t)snprintf(b, cap, "%s:", source);
    for (int k = 0; k < n && len < cap; k++) {
        slowest = fmax(slowest, pl->per_batch_s[k] / pl->workers[k]), in_turn += pl->per_batch_s[k];
        len += (size_t)snprintf(b + len, cap - len, " %s %.3g ms x %d%s", pl->stage[k].name, 1e3 * pl->per_batch_s[k], pl->workers[k],
                                pl->stage[k].workers ? " (fixed)" : "");
    }
    if (len < cap) snprintf(b + len, cap - len, "; predicted %.3g ms per batch (the slowest stage per worker), %.3g ms in turn", 1e3 * slowest, 1e3 * in_turn);
    pl->sized = true;
    if (pl->ctx->log_level >= 1) pdde_log(PDDE_LOG_INFO, "pdde: pipeline sized from %s\n", b);
}

typedef struct {
    pdde_pipeline *pl;
    int stage, worker;
    pipe_counts c;
} pipe_worker;

/* Takes the next batch for stage k (the caller holds mu): false when the run is over for the stage
 * (no batches left, the stage before has finished, or an error). */
static bool pipe_get(pdde_pipeline *pl, int k, pipe_item *it) {
    pipe_queue *q = &pl->q[k];
    struct timespec dl = cond_deadline(pl->p.timeout_s);
    for (;;) {
        if (pl->failed || (k == 0 && pl->next >= pl->end)) return false;
        if (q->n > 0) {
            *it = q->v[q->head];
            q->head = (q->head + 1) % q->cap, q->n--;
            if (k == 0) it->index = pl->next++;
            pthread_cond_broadcast(&pl->cv);
            return true;
        }
        if (k > 0 && q->open_producers == 0) return false;
        if (pthread_cond_timedwait(&pl->cv, &pl->mu, &dl) == ETIMEDOUT) {
            pipe_fail(pl, PDDE_ERR_TIMEOUT, "pipeline: stage %d (%s) waited %g s for %s", k, pl->stage[k].name, pl->p.timeout_s,
                      k ? "a batch from the stage before" : "a free slot");
            return false;
        }
    }
}

/* Puts a batch into queue k (the caller holds mu): false on an error or a timeout. */
static bool pipe_put(pdde_pipeline *pl, int k, pipe_item it, int from) {
    pipe_queue *q = &pl->q[k];
    struct timespec dl = cond_deadline(pl->p.timeout_s + 1);
    while (q->n == q->cap && !pl->failed)
        if (pthread_cond_timedwait(&pl->cv, &pl->mu, &dl) == ETIMEDOUT) {
            pipe_fail(pl, PDDE_ERR_TIMEOUT, "pipeline: stage %d (%s) waited %g s for room after it", from, pl->stage[from].name,
                      pl->p.timeout_s);
            return false;
        }
    if (pl->failed) return false;
    q->v[(q->head + q->n++) % q->cap] = it;
    pthread_cond_broadcast(&pl->cv);
    return true;
}

static void *pipe_worker_main(void *arg) {
    pipe_worker *w = arg;
    pdde_pipeline *pl = w->pl;
    int k = w->stage, n = pl->p.n_stages;
    double cpu0 = pipe_clock(CLOCK_THREAD_CPUTIME_ID);
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        pipe_item it;
        double t0 = pipe_clock(CLOCK_MONOTONIC);
        bool got = pipe_get(pl, k, &it);
        double t1 = pipe_clock(CLOCK_MONOTONIC);
        w->c.starved_s += t1 - t0;
        if (!got) break;
        pthread_mutex_unlock(&pl->mu);
        uint64_t errors_before = error_count();
        pdde_status st = pl->stage[k].fn(pl->stage[k].user, it.slot, it.index, w->worker);
        double t2 = pipe_clock(CLOCK_MONOTONIC);
        w->c.busy_s += t2 - t1, w->c.batches++;
        pthread_mutex_lock(&pl->mu);
        if (st) {
            char msg[sizeof pl->error];
            pipe_stage_error(pl, k, it.index, st, errors_before, msg, sizeof msg);
            pipe_fail(pl, st, "%s", msg);
            break;
        }
        bool put = pipe_put(pl, (k + 1) % n, it, k); /* the last stage frees the slot */
        w->c.blocked_s += pipe_clock(CLOCK_MONOTONIC) - t2;
        if (!put) break;
    }
    if (k + 1 < n && --pl->q[k + 1].open_producers == 0) pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    w->c.cpu_s = pipe_clock(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    return NULL;
}

static void pipe_count(pdde_pipeline *pl, int k, const pipe_counts *c) {
    pdde_pipeline_stage_stats *s = &pl->stats.stage[k];
    s->batches += c->batches, s->busy_s += c->busy_s, s->cpu_s += c->cpu_s, s->starved_s += c->starved_s, s->blocked_s += c->blocked_s;
}

/* The measured balance: the first batches through every stage in turn, on this thread (wall time: a
 * device stage's work is not on this thread's CPU clock). */
static pdde_status pipe_calibrate(pdde_pipeline *pl, int64_t first, int64_t m) {
    int n = pl->p.n_stages;
    for (int64_t b = 0; b < m; b++)
        for (int k = 0; k < n; k++) {
            pipe_counts c = {1, 0, 0, 0, 0};
            double t0 = pipe_clock(CLOCK_MONOTONIC), c0 = pipe_clock(CLOCK_THREAD_CPUTIME_ID);
            uint64_t errors_before = error_count();
            pdde_status st = pl->stage[k].fn(pl->stage[k].user, pl->p.slots[0], first + b, 0);
            c.busy_s = pipe_clock(CLOCK_MONOTONIC) - t0, c.cpu_s = pipe_clock(CLOCK_THREAD_CPUTIME_ID) - c0;
            pipe_count(pl, k, &c);
            if (st) {
                char msg[sizeof pl->error];
                pipe_stage_error(pl, k, first + b, st, errors_before, msg, sizeof msg);
                return pdde_error(pl->ctx, st, "%s", msg);
            }
            /* the fastest batch: on a shared machine the slower ones measure other processes' load */
            if (b == 0 || c.busy_s < pl->per_batch_s[k]) pl->per_batch_s[k] = c.busy_s;
        }
    char source[64];
    snprintf(source, sizeof source, "a balance measured over %lld batches", (long long)m);
    pipe_size(pl, source);
    return PDDE_OK;
}

pdde_status pdde_pipeline_size(pdde_pipeline *pl) {
    if (!pl) return PDDE_ERR_INVALID_ARG;
    for (int k = 0; k < pl->p.n_stages; k++)
        if (!(pl->stage[k].predicted_s > 0))
            return pdde_error(pl->ctx, PDDE_ERR_INVALID_ARG, "pipeline: stage %d (%s) has no predicted_s to be sized from", k, pl->stage[k].name);
    if (pl->sized) return PDDE_OK;
    for (int k = 0; k < pl->p.n_stages; k++) pl->per_batch_s[k] = pl->stage[k].predicted_s;
    pipe_size(pl, "the given predictions");
    return PDDE_OK;
}

pdde_status pdde_pipeline_run(pdde_pipeline *pl, int64_t first, int64_t n) {
    if (!pl || n < 0 || first < 0) return pl ? pdde_error(pl->ctx, PDDE_ERR_INVALID_ARG, "pipeline: run of %lld batches from %lld", (long long)n, (long long)first) : PDDE_ERR_INVALID_ARG;
    int ns = pl->p.n_stages;
    double w0 = pipe_clock(CLOCK_MONOTONIC), c0 = pipe_clock(CLOCK_PROCESS_CPUTIME_ID);
    int64_t end = first + n;
    pdde_status st = PDDE_OK;
    if (!pl->sized && n > 0) {
        bool predicted = true;
        for (int k = 0; k < ns; k++) predicted &= pl->stage[k].predicted_s > 0;
        if (predicted) st = pdde_pipeline_size(pl);
        else {
            int64_t m = n < pl->p.calibrate_batches ? n : pl->p.calibrate_batches;
            st = pipe_calibrate(pl, first, m);
            first += m;
        }
    }
    int total = 0;
    for (int k = 0; k < ns; k++) total += pl->workers[k];
    pipe_worker *w = calloc((size_t)total, sizeof *w);
    pthread_t *th = calloc((size_t)total, sizeof *th);
    if (!st && (!w || !th)) st = pdde_error(pl->ctx, PDDE_ERR_OOM, "pipeline: out of memory");
    if (!st && first < end) {
        for (int k = 0; k < ns; k++) pl->q[k].head = pl->q[k].n = 0, pl->q[k].open_producers = k ? pl->workers[k - 1] : 0;
        for (int i = 0; i < pl->p.n_slots; i++) pl->q[0].v[pl->q[0].n++] = (pipe_item){pl->p.slots[i], -1};
        pl->next = first, pl->end = end, pl->failed = false, pl->st = PDDE_OK;
        int started = 0;
        for (int k = 0, i = 0; k < ns; k++)
            for (int j = 0; j < pl->workers[k]; j++, i++) {
                w[i].pl = pl, w[i].stage = k, w[i].worker = j;
                if (pthread_create(&th[i], NULL, pipe_worker_main, &w[i])) {
                    pthread_mutex_lock(&pl->mu);
                    pipe_fail(pl, PDDE_ERR_OOM, "pipeline: cannot start a thread of stage %d (%s)", k, pl->stage[k].name);
                    /* the threads that would have closed the queues after this stage never run */
                    for (int kk = k + 1; kk < ns; kk++) pl->q[kk].open_producers = 0;
                    pthread_mutex_unlock(&pl->mu);
                    k = ns;
                    break;
                }
                started = i + 1;
            }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL), pipe_count(pl, w[i].stage, &w[i].c);
        if (pl->failed) st = pdde_error(pl->ctx, pl->st, "%s", pl->error); /* every worker has joined: this thread alone writes */
    }
    free(w), free(th);
    pl->stats.batches += n;
    pl->stats.wall_s += pipe_clock(CLOCK_MONOTONIC) - w0;
    pl->stats.process_cpu_s += pipe_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
    return st;
}

void pdde_pipeline_stats_reset(pdde_pipeline *pl) {
    if (!pl) return;
    memset(pl->stats.stage, 0, sizeof pl->stats.stage);
    pl->stats.batches = 0, pl->stats.wall_s = pl->stats.process_cpu_s = 0;
}

void pdde_pipeline_stats_get(const pdde_pipeline *pl, pdde_pipeline_stats *out) {
    if (out && !pl) memset(out, 0, sizeof *out);
    if (!pl || !out) return;
    *out = pl->stats;
    for (int k = 0; k < pl->p.n_stages; k++) out->stage[k].workers = pl->workers[k], out->stage[k].predicted_s = pl->per_batch_s[k];
}
