/* core/trace.c — a session's trace (Chrome trace events) and its per-op profile.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ------------------------------------------------------------------------------------------------
 * Traces (Chrome trace event format, which Perfetto and chrome://tracing open): one complete event
 * ("ph":"X") per node run, per micro-batch pass and per run, kept in memory and written when the
 * session is freed. */

enum { TRACE_LANE_COMM = 1000, TRACE_LANE_SCHEDULE = 1001, TRACE_MAX_EVENTS = 4000000 };
enum { TRACE_OP, TRACE_COPY, TRACE_COMM, TRACE_SEND, TRACE_RECV, TRACE_WAIT, TRACE_PASS, TRACE_RUN };
static const char *const trace_cats[] = {"op", "copy", "collective", "send", "recv", "wait", "micro-batch", "run"};

typedef struct {
    const char *name;   /* a program node's name, or a constant */
    uint8_t cat;
    int lane;
    int micro;          /* -1: none */
    int64_t step;
    double ts, dur;     /* microseconds */
} trace_event;

struct session_trace {
    char path[4096];
    int rank;
    trace_event *ev;
    size_t n, cap;
    bool truncated;
};

static double trace_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* the wall clock: ranks on one host share it */
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

/* Turns tracing on for s when asked (path, else PDDE_TRACE); under several ranks the file is
 * path.rank<R>. */
static pdde_status trace_open(pdde_session *s, const char *path) {
    /* Sessions of one process that trace to PDDE_TRACE number their files after the first (path.session<N>):
     * each writes when it is freed, so they would otherwise overwrite each other's traces in silence. */
    static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
    static char env_path[4096]; /* (as long as session_trace.path: a longer one is refused below) */
    static int env_sessions;
    char numbered[4096 + 32];
    if (!path && (path = getenv("PDDE_TRACE")) && *path) {
        pthread_mutex_lock(&env_lock);
        if (strcmp(env_path, path)) snprintf(env_path, sizeof env_path, "%s", path), env_sessions = 0;
        int n = ++env_sessions;
        pthread_mutex_unlock(&env_lock);
        if (n > 1 && snprintf(numbered, sizeof numbered, "%s.session%d", path, n) < (int)sizeof numbered) {
            if (n == 2) pdde_log(PDDE_LOG_INFO, "pdde: trace: %s holds this process's first traced session; the later ones go to %s.session<N>\n", path, path);
            path = numbered;
        }
    }
    if (!path || !*path) return PDDE_OK;
    struct session_trace *tr = calloc(1, sizeof *tr);
    if (!tr) return pdde_error(s->ctx, PDDE_ERR_OOM, "trace: out of memory");
    int rank = 0, size = 1;
    long er, ew; /* (a launcher's, for a run that has no communicator) */
    bool has_rank = pdde_env_int("PDDE_RANK", 0, 0, INT_MAX, &er), has_size = pdde_env_int("PDDE_WORLD_SIZE", 1, 1, INT_MAX, &ew);
    if (has_rank && has_size) rank = (int)er, size = (int)ew;
#ifdef PDDE_HAVE_COMM
    if (s->world) rank = pdde_comm_rank(s->world), size = pdde_comm_size(s->world);
#endif
    tr->rank = rank;
    int n = size > 1 ? snprintf(tr->path, sizeof tr->path, "%s.rank%d", path, rank) : snprintf(tr->path, sizeof tr->path, "%s", path);
    if (n < 0 || (size_t)n >= sizeof tr->path) {
        free(tr);
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "trace: path too long: %.200s...", path);
    }
    s->trace = tr;
    return PDDE_OK;
}

static void trace_add(pdde_session *s, const char *name, int cat, int lane, int micro, double ts, double dur) {
    struct session_trace *tr = s->trace;
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? 2 * tr->cap : 4096;
        trace_event *ev = cap <= TRACE_MAX_EVENTS ? realloc(tr->ev, cap * sizeof *ev) : NULL;
        if (!ev) { tr->truncated = true; return; } /* (the file says so) */
        tr->ev = ev, tr->cap = cap;
    }
    tr->ev[tr->n++] = (trace_event){name, (uint8_t)cat, lane, micro, s->step, ts, dur};
}

/* The category and lane of a node: communication on its own lane, the rest on its device's. */
static void trace_node(pdde_session *s, const pdde_tensor *t, int micro, double ts, double dur) {
    int cat = TRACE_OP, lane = s->devs[s->slot[t->id]].device;
    if (t->op == PDDE_OP_COPY) cat = TRACE_COPY;
    else if (t->op == PDDE_OP_SEND) cat = TRACE_SEND, lane = TRACE_LANE_COMM;
    else if (t->op == PDDE_OP_RECV) cat = TRACE_RECV, lane = TRACE_LANE_COMM;
    else if (t->op == PDDE_OP_COMM_WAIT) cat = TRACE_WAIT, lane = TRACE_LANE_COMM;
    else if (program_runs_itself(s->prog, t)) cat = TRACE_COMM, lane = TRACE_LANE_COMM;
    trace_add(s, t->name, cat, lane, s->n_micro > 1 ? micro : -1, ts, dur);
}

static void trace_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

/* Writes the trace: lane names first, then the events, one per line (pdde-run merges ranks' files
 * line by line: keep this layout). */
static void trace_write(pdde_session *s) {
    struct session_trace *tr = s->trace;
    FILE *f = fopen(tr->path, "w");
    if (!f) {
        pdde_log(PDDE_LOG_WARN, "pdde: trace: cannot write %s: %s\n", tr->path, strerror(errno));
        return;
    }
    fprintf(f, "{\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", tr->rank, tr->rank);
    for (int d = 0; d < s->n_devs; d++) {
        pdde_device_props props;
        if (registry_device_props(s->ctx->registry, s->devs[d].device, &props) != PDDE_OK) snprintf(props.name, sizeof props.name, "?");
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", tr->rank, s->devs[d].device);
        char lane[200];
        snprintf(lane, sizeof lane, "device %d: %s", s->devs[d].device, props.name);
        trace_string(f, lane);
        fprintf(f, "}}");
    }
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"communication\"}}", tr->rank, TRACE_LANE_COMM);
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"schedule\"}}", tr->rank, TRACE_LANE_SCHEDULE);
    if (tr->truncated)
        fprintf(f, ",\n{\"name\":\"truncated\",\"ph\":\"i\",\"s\":\"g\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"args\":{\"kept\":%zu}}", tr->rank,
                TRACE_LANE_SCHEDULE, tr->n ? tr->ev[tr->n - 1].ts : 0.0, tr->n);
    for (size_t i = 0; i < tr->n; i++) {
        const trace_event *e = &tr->ev[i];
        fprintf(f, ",\n{\"name\":");
        trace_string(f, e->name);
        fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{\"step\":%lld", trace_cats[e->cat],
                e->ts, e->dur, tr->rank, e->lane, (long long)e->step);
        if (e->micro >= 0) fprintf(f, ",\"micro\":%d", e->micro);
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
    if (fclose(f)) pdde_log(PDDE_LOG_WARN, "pdde: trace: cannot write %s: %s\n", tr->path, strerror(errno));
}

static void trace_close(pdde_session *s) {
    if (!s->trace) return;
    if (s->trace->n) trace_write(s); /* (a session that never ran, or failed to start, writes nothing) */
    free(s->trace->ev);
    free(s->trace);
    s->trace = NULL;
}

static void print_profile(const pdde_session *s) {
    double total = 0;
    for (int op = 0; op < PDDE_OP_COUNT; op++) total += s->op_seconds[op];
    pdde_log(PDDE_LOG_INFO, "pdde profile: %.3f s in kernels\n", total);
    for (int op = 0; op < PDDE_OP_COUNT; op++)
        if (s->op_calls[op])
            pdde_log(PDDE_LOG_INFO, "  %-22s %9.3f ms %5.1f%% %8lld calls\n", pdde_op_name((pdde_op)op), 1e3 * s->op_seconds[op],
                    100.0 * s->op_seconds[op] / (total > 0 ? total : 1), (long long)s->op_calls[op]);
}
