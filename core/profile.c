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
 * Per op it also keeps what its nodes must move and compute as the cost model counts them (cost_node_work:
 * inputs read once, the output written once; GEMM FLOPs), and, where the device's peaks are known (the
 * session's cluster, where pdde-bench measured the device, else PDDE_PROFILE_PEAKS=GBPS,TFLOPS[,F32_TFLOPS]),
 * the time those would take at the peaks: per node max(bytes / bandwidth, FLOPs / GEMM rate of its dtype).
 * Under a trace (PDDE_TRACE) the timed nodes' events are these intervals, on the host's clock from the
 * time the run's first node on the device was issued (the device idles then, after the last run's
 * wait), instead of host times around a wait per node.
 * A part of pdde.c: included by core/session.c (it uses the session's private types and helpers). */

typedef struct {
    int64_t runs, ops, waits, op_calls[PDDE_OP_COUNT];
    double wall_ms, busy_ms, span_ms, issue_ms, wait_ms, op_ms[PDDE_OP_COUNT], op_host_ms[PDDE_OP_COUNT];
    double op_gap_ms[PDDE_OP_COUNT]; /* the device idle right before the op's nodes (after the node before on it) */
    double op_bytes[PDDE_OP_COUNT], op_flops[PDDE_OP_COUNT], op_bound_ms[PDDE_OP_COUNT]; /* (bound: where peaks are known) */
} profile_totals;

/* A device's peaks: memory bandwidth (B/s) and GEMM rate (FLOP/s) by the dtype of the GEMM's inputs;
 * source 0: unknown (no bound), PROFILE_PEAKS_CLUSTER or PROFILE_PEAKS_ENV. */
enum { PROFILE_PEAKS_CLUSTER = 1, PROFILE_PEAKS_ENV = 2 };
struct profile_peaks { int source; double bw, flops[PDDE_DTYPE_COUNT]; char spec[64]; /* (the cluster's device model) */ };

enum { PROFILE_GAPS = 5 };

struct session_profile {
    struct profile_pool { void **ev; int n, cap, used; } *pool; /* per device slot: n events made */
    struct profile_node { const pdde_tensor *t; int micro, slot, ev; double host_s, wait_s, host_us, bytes, flops; pdde_dtype dtype; } *node; /* this run's, in issue order */
    int n_node, cap_node, open;     /* open: the node begun and not ended (-1: none) */
    double *iv;                 /* scratch: intervals (start, end) of one device */
    double run_t0, issue_t1;    /* this run's start and the end of its issue (host monotonic seconds) */
    double wait_s, issue_wait_s;/* this run's waits for a device: all, and those before the end of its issue */
    int64_t n_wait, issue_waits;
    bool stopped;               /* an event call failed: said once, no more timing */
    const pdde_cluster *cluster;/* pdde_session_params.cluster, until profile_open has read its peaks */
    struct profile_peaks *peaks;/* per device slot */
    int peak_sources;           /* the sources of the timed devices' peaks, or'ed; 0 where one device has none */
    bool partial_peaks;         /* some devices have peaks, not all */
    struct profile_gap { const pdde_tensor *t; double ms; } gap[PROFILE_GAPS]; /* the last run's longest idles, longest first */
    profile_totals first, rest;
};

static bool profile_can_time(const pdde_backend_iface *f) {
    return IFACE_HAS(f, stream_create_timed) && IFACE_HAS(f, event_create_timed) && IFACE_HAS(f, event_elapsed) &&
           IFACE_HAS(f, event_record) && IFACE_HAS(f, event_free);
}

/* PDDE_PROFILE=device asked: s->devprof is set before the devices are opened (their streams are then
 * made timed where they can be); profile_open decides once they are. */
static pdde_status profile_want(pdde_session *s, const pdde_cluster *cluster) {
    if (!(s->devprof = calloc(1, sizeof *s->devprof))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    s->devprof->open = -1, s->devprof->cluster = cluster;
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
    free(p->peaks);
    free(p->node);
    free(p->iv);
    free(p);
    s->devprof = NULL;
}

/* The peaks of the cluster device that stands for device slot d (the same id and backend), where
 * pdde-bench measured it: its best GEMM rate per dtype (a dtype it did not measure: its best of any)
 * and its memory bandwidth. false where the cluster does not have them. */
static bool profile_cluster_peaks(const pdde_session *s, int d, struct profile_peaks *pk) {
    const pdde_cluster *c = s->devprof->cluster;
    const pdde_cluster_device *cd = c ? pdde_cluster_find_device(c, s->devs[d].device, NULL) : NULL;
    if (!cd || cd->spec < 0 || cd->spec >= c->n_specs) return false;
    const pdde_device_spec *sp = &c->specs[cd->spec];
    if (strcmp(sp->backend, s->devs[d].iface->name) || !sp->n_gemm) return false;
    int ne = sp->n_curve[PDDE_OPCLASS_ELEMENTWISE];
    const pdde_curve_point *ew = sp->curve[PDDE_OPCLASS_ELEMENTWISE];
    double bw = sp->mem_bandwidth > 0 ? sp->mem_bandwidth : ne && ew[ne - 1].seconds > 0 ? ew[ne - 1].bytes / ew[ne - 1].seconds : 0, any = 0;
    memset(pk, 0, sizeof *pk);
    for (int i = 0; i < sp->n_gemm; i++) {
        const pdde_gemm_point *g = &sp->gemm[i];
        if ((unsigned)g->dtype < PDDE_DTYPE_COUNT && g->flops > pk->flops[g->dtype]) pk->flops[g->dtype] = g->flops;
        if (g->flops > any) any = g->flops;
    }
    if (!(bw > 0) || !(any > 0) || !isfinite(bw) || !isfinite(any)) return false;
    for (int dt = 0; dt < PDDE_DTYPE_COUNT; dt++)
        if (!(pk->flops[dt] > 0)) pk->flops[dt] = any;
    pk->source = PROFILE_PEAKS_CLUSTER, pk->bw = bw;
    snprintf(pk->spec, sizeof pk->spec, "%s", sp->name);
    return true;
}

/* PDDE_PROFILE_PEAKS=GBPS,TFLOPS[,F32_TFLOPS]: a device's memory bandwidth in GB/s and its GEMM rate in
 * TFLOP/s (with a third figure: the half-precision GEMMs' rate, the third f32's). false: unset, or a bad
 * value (said once a process, at a session's start). */
static bool profile_env_peaks(struct profile_peaks *pk) {
    const char *v = getenv("PDDE_PROFILE_PEAKS");
    if (!v || !*v) return false;
    double x[3];
    int n = 0;
    const char *c = v;
    for (; n < 3; n++) {
        char *end;
        x[n] = strtod(c, &end);
        if (end == c || !isfinite(x[n]) || !(x[n] > 0)) break;
        c = end;
        if (*c != ',') { n++; break; }
        c++;
    }
    if (n < 2 || *c) {
        pdde_env_warn("PDDE_PROFILE_PEAKS", v, "GBPS,TFLOPS or GBPS,TFLOPS,F32_TFLOPS, numbers > 0 (4800,989,67: an H200's bandwidth and "
                      "dense bf16 and f32 rates)", "none: the device profile has no bound column");
        return false;
    }
    memset(pk, 0, sizeof *pk);
    pk->source = PROFILE_PEAKS_ENV, pk->bw = 1e9 * x[0];
    for (int dt = 0; dt < PDDE_DTYPE_COUNT; dt++) pk->flops[dt] = 1e12 * (dt == PDDE_F32 && n == 3 ? x[2] : x[1]);
    return true;
}

/* Each timed device's peaks: the cluster's where it measured the device, else PDDE_PROFILE_PEAKS's. */
static pdde_status profile_peaks_open(pdde_session *s) {
    struct session_profile *p = s->devprof;
    struct profile_peaks env;
    bool have_env = profile_env_peaks(&env);
    if (!(p->peaks = calloc((size_t)s->n_devs, sizeof *p->peaks))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    bool all = true;
    for (int d = 0; d < s->n_devs; d++) {
        if (s->devs[d].host) continue;
        if (!profile_cluster_peaks(s, d, &p->peaks[d]) && have_env) p->peaks[d] = env;
        p->peak_sources |= p->peaks[d].source, all = all && p->peaks[d].source;
    }
    if (!all) p->partial_peaks = p->peak_sources != 0, p->peak_sources = 0;
    p->cluster = NULL; /* (the caller's: not kept past pdde_session_init) */
    return PDDE_OK;
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
        pdde_log(PDDE_LOG_WARN, "pdde: PDDE_PROFILE=device: the %s backend cannot time on the device; timing on the host, synchronising "
                        "after each node (PDDE_PROFILE=1)\n", without ? without : s->n_devs ? s->devs[0].iface->name : "cpu");
        profile_free(s);
        s->profile = true;
        return PDDE_OK;
    }
    if (!(s->devprof->pool = calloc((size_t)s->n_devs, sizeof *s->devprof->pool))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    return profile_peaks_open(s);
}

static void profile_stop(pdde_session *s) {
    if (!s->devprof->stopped) pdde_log(PDDE_LOG_WARN, "pdde: PDDE_PROFILE=device: timing stopped: %s\n", pdde_last_error(s->ctx));
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

/* Before node t (the first of a group of n_group, in s->update_group) runs: the event before it, if it
 * runs on a device's stream; returns its index among the run's timed nodes, or -1. */
static int profile_node_begin(pdde_session *s, const pdde_tensor *t, int micro, int n_group) {
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
    double bytes = 0, flops = 0;
    pdde_dtype dtype = PDDE_F32;
    for (int k = 0; k < n_group; k++) { /* (what the cost model counts: a group is its nodes) */
        double b, f;
        pdde_dtype dt;
        cost_node_work(n_group > 1 ? s->update_group[k] : t, &b, &f, &dt);
        bytes += b, flops += f;
        if (k == 0) dtype = dt;
    }
    if (sd->iface->event_record(sd->dev, pool->ev[pool->used], sd->stream)) return profile_stop(s), -1;
    p->node[p->n_node] = (struct profile_node){t, micro, slot, pool->used, monotonic_seconds(), p->wait_s, s->trace ? trace_now_us() : 0,
                                               bytes, flops, dtype};
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
            const struct profile_peaks *pk = &p->peaks[d];
            run.op_bytes[n->t->op] += n->bytes, run.op_flops[n->t->op] += n->flops;
            if (pk->source) run.op_bound_ms[n->t->op] += 1e3 * fmax(n->bytes / pk->bw, n->flops / pk->flops[n->dtype]);
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
        T->op_gap_ms[op] += run.op_gap_ms[op], T->op_bytes[op] += run.op_bytes[op], T->op_flops[op] += run.op_flops[op],
        T->op_bound_ms[op] += run.op_bound_ms[op];
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
    out->peaks = s->devprof->peak_sources;
    for (int op = 0; op < PDDE_OP_COUNT; op++) {
        out->bytes += T->op_bytes[op] / n, out->flops += T->op_flops[op] / n;
        if (out->peaks) out->bound_ms += T->op_bound_ms[op] / n, out->over_bound_ms += (T->op_ms[op] - T->op_bound_ms[op]) / n;
    }
    return PDDE_OK;
}

double pdde_session_device_op_ms(const pdde_session *s, pdde_op op) {
    if (!s || !s->devprof || (unsigned)op >= PDDE_OP_COUNT) return 0;
    const profile_totals *T = profile_figures(s);
    return T->runs ? T->op_ms[op] / (double)T->runs : 0;
}

/* The PDDE_PROFILE=device report of session s, written to out. */
static void profile_write(const pdde_session *s, FILE *out) {
    pdde_device_profile f;
    if (!s->devprof->pool) return; /* (a session that failed to start) */
    if (pdde_session_device_profile(s, &f) || !f.runs) {
        fprintf(out, "pdde device profile: no run timed\n");
        return;
    }
    const profile_totals *T = profile_figures(s);
    double n = (double)T->runs, total = 0;
    for (int op = 0; op < PDDE_OP_COUNT; op++) total += T->op_ms[op];
    fprintf(out, "pdde device profile: %lld run%s%s; per run: wall %.3f ms, device busy %.3f ms (span %.3f), idle %.1f%%, host issue %.3f ms, "
                    "%.0f ops; before the run's end the host waited %.3f ms for a device (%.1f times)\n",
            (long long)T->runs, T->runs == 1 ? "" : "s", s->devprof->rest.runs ? " (the first left out)" : "", f.wall_ms, f.busy_ms,
            f.span_ms, f.idle_pct, f.host_issue_ms, f.ops, f.host_wait_ms, f.host_waits);
    bool bound = f.peaks != 0;
    for (int d = 0; d < s->n_devs; d++) {
        const struct profile_peaks *pk = &s->devprof->peaks[d];
        if (s->devs[d].host || !pk->source) continue;
        fprintf(out, "  peaks of device %d (%s): ", s->devs[d].device, s->devs[d].iface->name);
        if (pk->source == PROFILE_PEAKS_CLUSTER) fprintf(out, "the cluster's \"%s\", measured by pdde-bench", pk->spec);
        else fprintf(out, "PDDE_PROFILE_PEAKS");
        fprintf(out, ": %.4g GB/s, GEMMs f32 %.4g TFLOP/s, bf16 %.4g, f16 %.4g\n", pk->bw / 1e9, pk->flops[PDDE_F32] / 1e12,
                pk->flops[PDDE_BF16] / 1e12, pk->flops[PDDE_F16] / 1e12);
    }
    if (!bound)
        fprintf(out, "  no peaks%s: no bound column (give the session a cluster pdde-bench measured, or PDDE_PROFILE_PEAKS=GBPS,TFLOPS)\n",
                s->devprof->partial_peaks ? " for every device" : "");
    fprintf(out, "  %-22s %10s %6s %10s %8s %14s %10s %9s %8s", "op", "device ms", "%", "issue ms", "calls", "idle before ms", "MB", "GB/s",
            "TFLOP/s");
    fprintf(out, bound ? " %10s\n" : "\n", "bound ms");
    for (int op = 0; op < PDDE_OP_COUNT; op++)
        if (T->op_calls[op]) {
            double ms = T->op_ms[op] / n;
            fprintf(out, "  %-22s %10.3f %5.1f%% %10.3f %8.1f %14.3f %10.3f %9.2f %8.3f", pdde_op_name((pdde_op)op), ms,
                    100.0 * T->op_ms[op] / (total > 0 ? total : 1), T->op_host_ms[op] / n, (double)T->op_calls[op] / n, T->op_gap_ms[op] / n,
                    T->op_bytes[op] / n / 1e6, ms > 0 ? T->op_bytes[op] / n / ms / 1e6 : 0, ms > 0 ? T->op_flops[op] / n / ms / 1e9 : 0);
            if (bound) fprintf(out, " %10.3f", T->op_bound_ms[op] / n);
            fprintf(out, "\n");
        }
    fprintf(out, "  the last run's longest idles on a device, before:");
    for (int k = 0; k < PROFILE_GAPS && s->devprof->gap[k].t; k++)
        fprintf(out, "%s %s (%s) %.3f ms", k ? "," : "", s->devprof->gap[k].t->name, pdde_op_name(s->devprof->gap[k].t->op), s->devprof->gap[k].ms);
    fprintf(out, "\n");
    /* (for tools/gpu-check.sh: per run, as the table) */
    for (int op = 0; op < PDDE_OP_COUNT; op++)
        if (T->op_calls[op]) {
            double ms = T->op_ms[op] / n, bytes = T->op_bytes[op] / n, flops = T->op_flops[op] / n;
            fprintf(out, "PROFILE op name=%s ms=%.6f calls=%.6g bytes=%.0f flops=%.0f gbps=%.6g tflops=%.6g", pdde_op_name((pdde_op)op), ms,
                    (double)T->op_calls[op] / n, bytes, flops, ms > 0 ? bytes / ms / 1e6 : 0, ms > 0 ? flops / ms / 1e9 : 0);
            if (bound) fprintf(out, " bound_ms=%.6f", T->op_bound_ms[op] / n);
            fprintf(out, "\n");
        }
    fprintf(out, "PROFILE device busy_ms=%.3f wall_ms=%.3f idle_pct=%.1f host_issue_ms=%.3f ops=%.0f host_wait_ms=%.3f bytes=%.0f flops=%.0f",
            f.busy_ms, f.wall_ms, f.idle_pct, f.host_issue_ms, f.ops, f.host_wait_ms, f.bytes, f.flops);
    if (bound)
        fprintf(out, " bound_ms=%.3f over_bound_ms=%.3f peaks=%s", f.bound_ms, f.over_bound_ms,
                f.peaks == PROFILE_PEAKS_CLUSTER ? "cluster" : f.peaks == PROFILE_PEAKS_ENV ? "env" : "cluster+env");
    fprintf(out, "\n");
}

/* The report, to the log a line at a time (stderr by default: gpu-check reads its PROFILE lines there) */
static void profile_print(const pdde_session *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out) return;
    profile_write(s, out);
    fclose(out);
    pdde_log_lines(PDDE_LOG_INFO, text);
    free(text);
}
