/* core/profile.c — PDDE_PROFILE=device: a timeline of each run on the device, taken without making
 * the host wait. Around every node (or multi-tensor update group) the session launches on a device,
 * an event is recorded on its stream before and after; at the run's end, where the host waits for the
 * devices anyway, the events' device times are read. A node's interval runs from the time its stream
 * reached the event before it to the time it reached the event after it (so it includes any gap the
 * host left between the node's own kernels). Events come from a pool per device, made during the
 * first run and reused by the later ones.
 * Per run it keeps the wall time (pdde_session_run on the host), the time the host spent issuing (from
 * the run's start to its last enqueue, less its waits for a device), those waits, the busy time of the
 * busiest device (the union of its intervals), and per op the device time, the host's issue time and
 * the calls, and the time the device idled right before the op's nodes. The first run (kernel builds, first-touch allocations) is left out of the figures once
 * there are others.
 * Under a trace (PDDE_TRACE) the timed nodes' events are these intervals, on the host's clock from the
 * time the run's first node on the device was issued (the device idles then, after the last run's
 * wait), instead of host times around a wait per node.
 * A part of pdde.c: included by core/session.c (it uses the session's private types and helpers). */

typedef struct {
    int64_t runs, ops, waits, op_calls[PDDE_OP_COUNT];
    double wall_ms, busy_ms, span_ms, issue_ms, wait_ms, op_ms[PDDE_OP_COUNT], op_host_ms[PDDE_OP_COUNT];
    double op_gap_ms[PDDE_OP_COUNT]; /* the device idle right before the op's nodes (after the node before on it) */
} profile_totals;

enum { PROFILE_GAPS = 5 };

struct session_profile {
    struct profile_pool { void **ev; int n, cap, used; } *pool; /* per device slot: n events made */
    struct profile_node { const pdde_tensor *t; int micro, slot, ev; double host_s, wait_s, host_us; } *node; /* this run's, in issue order */
    int n_node, cap_node, open;     /* open: the node begun and not ended (-1: none) */
    double *iv;                 /* scratch: intervals (start, end) of one device */
    double run_t0, issue_t1;    /* this run's start and the end of its issue (host monotonic seconds) */
    double wait_s, issue_wait_s;/* this run's waits for a device: all, and those before the end of its issue */
    int64_t n_wait, issue_waits;
    bool stopped;               /* an event call failed: said once, no more timing */
    struct profile_gap { const pdde_tensor *t; double ms; } gap[PROFILE_GAPS]; /* the last run's longest idles, longest first */
    profile_totals first, rest;
};

static bool profile_can_time(const pdde_backend_iface *f) {
    return IFACE_HAS(f, stream_create_timed) && IFACE_HAS(f, event_create_timed) && IFACE_HAS(f, event_elapsed) &&
           IFACE_HAS(f, event_record) && IFACE_HAS(f, event_free);
}

/* PDDE_PROFILE=device asked: s->devprof is set before the devices are opened (their streams are then
 * made timed where they can be); profile_open decides once they are. */
static pdde_status profile_want(pdde_session *s) {
    if (!(s->devprof = calloc(1, sizeof *s->devprof))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    s->devprof->open = -1;
    return PDDE_OK;
}

static void profile_free(pdde_session *s) {
    struct session_profile *p = s->devprof;
    if (!p) return;
    for (int d = 0; p->pool && d < s->n_devs; d++) {
        for (int k = 0; k < p->pool[d].n; k++) s->devs[d].iface->event_free(s->devs[d].dev, p->pool[d].ev[k]);
        free(p->pool[d].ev);
    }
    free(p->pool);
    free(p->node);
    free(p->iv);
    free(p);
    s->devprof = NULL;
}

/* After the devices are open: device timing where every device but the CPU can time; else one line
 * and PDDE_PROFILE=1's host timers. */
static pdde_status profile_open(pdde_session *s) {
    const char *without = NULL;
    bool any = false;
    for (int d = 0; d < s->n_devs; d++) {
        if (s->devs[d].host) continue;
        any = true;
        if (!profile_can_time(s->devs[d].iface)) without = s->devs[d].iface->name;
    }
    if (!any || without) {
        fprintf(stderr, "pdde: PDDE_PROFILE=device: the %s backend cannot time on the device; timing on the host, synchronising "
                        "after each node (PDDE_PROFILE=1)\n", without ? without : s->n_devs ? s->devs[0].iface->name : "cpu");
        profile_free(s);
        s->profile = true;
        return PDDE_OK;
    }
    if (!(s->devprof->pool = calloc((size_t)s->n_devs, sizeof *s->devprof->pool))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    return PDDE_OK;
}

static void profile_stop(pdde_session *s) {
    if (!s->devprof->stopped) fprintf(stderr, "pdde: PDDE_PROFILE=device: timing stopped: %s\n", pdde_last_error(s->ctx));
    s->devprof->stopped = true;
}

static double trace_now_us(void);
static void trace_node(pdde_session *s, const pdde_tensor *t, int micro, double ts, double dur);

static void profile_run_begin(pdde_session *s) {
    s->devprof->n_node = 0, s->devprof->open = -1;
    for (int d = 0; d < s->n_devs; d++) s->devprof->pool[d].used = 0;
    s->devprof->run_t0 = s->devprof->issue_t1 = monotonic_seconds();
    s->devprof->wait_s = s->devprof->issue_wait_s = 0, s->devprof->n_wait = s->devprof->issue_waits = 0;
}

/* The host waits for sd's stream, timed (device_sync; and before a read of the session's, which may wait
 * inside the backend's read). A node that waits (the check before the first update) starts after: its
 * event before is recorded again, so that the device's idle time while the host waited and then went on
 * is the node's idle before it, not its time. */
static pdde_status profile_wait(pdde_session *s, session_device *sd) {
    struct session_profile *p = s->devprof;
    double t0 = monotonic_seconds();
    pdde_status st = sd->iface->stream_sync(sd->dev, sd->stream);
    p->wait_s += monotonic_seconds() - t0, p->n_wait++;
    if (p->open >= 0 && !p->stopped) {
        struct profile_node *n = &p->node[p->open];
        session_device *nd = &s->devs[n->slot];
        if (nd->iface->event_record(nd->dev, p->pool[n->slot].ev[n->ev], nd->stream)) profile_stop(s);
        if (s->trace) n->host_us = trace_now_us();
    }
    return st;
}

/* Before node t (the first of a group) runs: the event before it, if it runs on a device's stream;
 * returns its index among the run's timed nodes, or -1. */
static int profile_node_begin(pdde_session *s, const pdde_tensor *t, int micro) {
    struct session_profile *p = s->devprof;
    int slot = s->slot[t->id];
    session_device *sd = &s->devs[slot];
    if (p->stopped || sd->host || program_runs_itself(s->prog, t)) return -1;
    struct profile_pool *pool = &p->pool[slot];
    if (p->n_node == p->cap_node) {
        int cap = p->cap_node ? 2 * p->cap_node : 256;
        struct profile_node *n = realloc(p->node, (size_t)cap * sizeof *n);
        if (!n) return pdde_error(s->ctx, PDDE_ERR_OOM, "profile: out of memory"), profile_stop(s), -1;
        p->node = n, p->cap_node = cap;
    }
    while (pool->used + 2 > pool->n) { /* (the first run fills the pool; later ones reuse it) */
        if (pool->n == pool->cap) {
            int cap = pool->cap ? 2 * pool->cap : 256;
            void **ev = realloc(pool->ev, (size_t)cap * sizeof *ev);
            if (!ev) return pdde_error(s->ctx, PDDE_ERR_OOM, "profile: out of memory"), profile_stop(s), -1;
            pool->ev = ev, pool->cap = cap;
        }
        if (sd->iface->event_create_timed(sd->dev, &pool->ev[pool->n])) return profile_stop(s), -1;
        pool->n++;
    }
    if (sd->iface->event_record(sd->dev, pool->ev[pool->used], sd->stream)) return profile_stop(s), -1;
    p->node[p->n_node] = (struct profile_node){t, micro, slot, pool->used, monotonic_seconds(), p->wait_s, s->trace ? trace_now_us() : 0};
    pool->used += 2;
    return p->open = p->n_node++;
}

static void profile_node_end(pdde_session *s, int i) {
    struct session_profile *p = s->devprof;
    struct profile_node *n = &p->node[i];
    session_device *sd = &s->devs[n->slot];
    p->open = -1;
    n->host_s = monotonic_seconds() - n->host_s - (p->wait_s - n->wait_s); /* (its issue, not its waits) */
    if (!p->stopped && sd->iface->event_record(sd->dev, p->pool[n->slot].ev[n->ev + 1], sd->stream)) profile_stop(s);
    p->issue_t1 = monotonic_seconds(), p->issue_wait_s = p->wait_s, p->issue_waits = p->n_wait;
}

static int profile_cmp_start(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* After the run's final wait for the devices (st: the run's status; a failed run is not counted). */
static void profile_run_end(pdde_session *s, pdde_status st) {
    struct session_profile *p = s->devprof;
    double wall_ms = 1e3 * (monotonic_seconds() - p->run_t0);
    if (st || p->stopped) return;
    profile_totals *T = p->first.runs ? &p->rest : &p->first, run = {0};
    memset(p->gap, 0, sizeof p->gap);
    if (!(p->iv = realloc(p->iv, (size_t)(2 * p->n_node + 2) * sizeof *p->iv))) {
        pdde_error(s->ctx, PDDE_ERR_OOM, "profile: out of memory");
        profile_stop(s);
        return;
    }
    for (int d = 0; d < s->n_devs; d++) {
        int n_iv = 0;
        void *origin = NULL; /* the device's first event this run: the times are offsets from it */
        double origin_us = 0, prev_e = -1;
        for (int i = 0; i < p->n_node; i++) {
            struct profile_node *n = &p->node[i];
            if (n->slot != d) continue;
            session_device *sd = &s->devs[d];
            void **ev = p->pool[d].ev;
            double b = 0, e = 0;
            if (!origin) origin = ev[n->ev], origin_us = n->host_us;
            if (sd->iface->event_elapsed(sd->dev, origin, ev[n->ev], &b) || sd->iface->event_elapsed(sd->dev, origin, ev[n->ev + 1], &e)) {
                profile_stop(s);
                return;
            }
            if (e < b) e = b; /* (a clock's rounding) */
            if (prev_e >= 0 && b > prev_e) {
                run.op_gap_ms[n->t->op] += b - prev_e;
                int k = PROFILE_GAPS; /* (kept in order: insertion) */
                while (k > 0 && p->gap[k - 1].ms < b - prev_e) k--;
                if (k < PROFILE_GAPS) {
                    memmove(&p->gap[k + 1], &p->gap[k], (size_t)(PROFILE_GAPS - 1 - k) * sizeof *p->gap);
                    p->gap[k] = (struct profile_gap){n->t, b - prev_e};
                }
            }
            prev_e = e;
            run.op_ms[n->t->op] += e - b, run.op_host_ms[n->t->op] += 1e3 * n->host_s, run.op_calls[n->t->op]++, run.ops++;
            p->iv[2 * n_iv] = b, p->iv[2 * n_iv + 1] = e, n_iv++;
            if (s->trace) trace_node(s, n->t, n->micro, origin_us + 1e3 * b, 1e3 * (e - b));
        }
        /* the union of the intervals (several streams of a device may overlap) */
        qsort(p->iv, (size_t)n_iv, 2 * sizeof *p->iv, profile_cmp_start);
        double busy = 0, lo = 0, hi = -1, last = 0;
        for (int k = 0; k < n_iv; k++) {
            double b = p->iv[2 * k], e = p->iv[2 * k + 1];
            if (e > last) last = e;
            if (b > hi) busy += hi > lo ? hi - lo : 0, lo = b, hi = e;
            else if (e > hi) hi = e;
        }
        busy += hi > lo ? hi - lo : 0;
        if (busy > run.busy_ms) run.busy_ms = busy, run.span_ms = n_iv ? last - p->iv[0] : 0;
    }
    T->runs++, T->ops += run.ops;
    T->wall_ms += wall_ms, T->busy_ms += run.busy_ms, T->span_ms += run.span_ms;
    T->issue_ms += 1e3 * (p->issue_t1 - p->run_t0 - p->issue_wait_s), T->wait_ms += 1e3 * p->issue_wait_s, T->waits += p->issue_waits;
    for (int op = 0; op < PDDE_OP_COUNT; op++)
        T->op_ms[op] += run.op_ms[op], T->op_host_ms[op] += run.op_host_ms[op], T->op_calls[op] += run.op_calls[op],
        T->op_gap_ms[op] += run.op_gap_ms[op];
}

/* The figures reported: the runs after the first, or the first alone. */
static const profile_totals *profile_figures(const pdde_session *s) {
    return s->devprof->rest.runs ? &s->devprof->rest : &s->devprof->first;
}

pdde_status pdde_session_device_profile(const pdde_session *s, pdde_device_profile *out) {
    if (!s || !out) return PDDE_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (!s->devprof) return pdde_error(s->ctx, PDDE_ERR_STATE, "device_profile: the session does not time on the device (PDDE_PROFILE=device)");
    const profile_totals *T = profile_figures(s);
    double n = T->runs ? (double)T->runs : 1;
    out->runs = T->runs;
    out->wall_ms = T->wall_ms / n, out->busy_ms = T->busy_ms / n, out->span_ms = T->span_ms / n, out->host_issue_ms = T->issue_ms / n;
    out->host_wait_ms = T->wait_ms / n, out->host_waits = (double)T->waits / n;
    out->idle_pct = out->wall_ms > 0 ? 100.0 * (out->wall_ms - out->busy_ms) / out->wall_ms : 0;
    out->ops = (double)T->ops / n;
    return PDDE_OK;
}

double pdde_session_device_op_ms(const pdde_session *s, pdde_op op) {
    if (!s || !s->devprof || (unsigned)op >= PDDE_OP_COUNT) return 0;
    const profile_totals *T = profile_figures(s);
    return T->runs ? T->op_ms[op] / (double)T->runs : 0;
}

static void profile_print(const pdde_session *s) {
    pdde_device_profile f;
    if (!s->devprof->pool) return; /* (a session that failed to start) */
    if (pdde_session_device_profile(s, &f) || !f.runs) {
        fprintf(stderr, "pdde device profile: no run timed\n");
        return;
    }
    const profile_totals *T = profile_figures(s);
    double n = (double)T->runs, total = 0;
    for (int op = 0; op < PDDE_OP_COUNT; op++) total += T->op_ms[op];
    fprintf(stderr, "pdde device profile: %lld run%s%s; per run: wall %.3f ms, device busy %.3f ms (span %.3f), idle %.1f%%, host issue %.3f ms, "
                    "%.0f ops; before the run's end the host waited %.3f ms for a device (%.1f times)\n",
            (long long)T->runs, T->runs == 1 ? "" : "s", s->devprof->rest.runs ? " (the first left out)" : "", f.wall_ms, f.busy_ms,
            f.span_ms, f.idle_pct, f.host_issue_ms, f.ops, f.host_wait_ms, f.host_waits);
    fprintf(stderr, "  %-22s %10s %6s %10s %8s %14s\n", "op", "device ms", "%", "issue ms", "calls", "idle before ms");
    for (int op = 0; op < PDDE_OP_COUNT; op++)
        if (T->op_calls[op])
            fprintf(stderr, "  %-22s %10.3f %5.1f%% %10.3f %8.1f %14.3f\n", pdde_op_name((pdde_op)op), T->op_ms[op] / n,
                    100.0 * T->op_ms[op] / (total > 0 ? total : 1), T->op_host_ms[op] / n, (double)T->op_calls[op] / n, T->op_gap_ms[op] / n);
    fprintf(stderr, "  the last run's longest idles on a device, before:");
    for (int k = 0; k < PROFILE_GAPS && s->devprof->gap[k].t; k++)
        fprintf(stderr, "%s %s (%s) %.3f ms", k ? "," : "", s->devprof->gap[k].t->name, pdde_op_name(s->devprof->gap[k].t->op), s->devprof->gap[k].ms);
    fprintf(stderr, "\n");
    fprintf(stderr, "PROFILE device busy_ms=%.3f wall_ms=%.3f idle_pct=%.1f host_issue_ms=%.3f ops=%.0f host_wait_ms=%.3f\n", f.busy_ms,
            f.wall_ms, f.idle_pct, f.host_issue_ms, f.ops, f.host_wait_ms);
}
