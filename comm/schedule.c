/* comm/schedule.c — how collectives run: an operation is a set of programs, a program a sequence of
 * steps, a step at most one send and one receive (posted together) followed by a local action
 * (reduce the received data, copy, divide for averages). Algorithms (collectives.c) only build
 * programs; this file runs them, non-blocking, several programs of one operation at once so that the
 * segments of a large message pipeline. Everything here runs under the world lock. */

#ifndef PDDE_COMM_SCHEDULE_C
#define PDDE_COMM_SCHEDULE_C

#include "world.c"

enum { STEP_NONE = 0, STEP_REDUCE, STEP_COPY, STEP_DIV };

typedef struct {
    int send_peer, recv_peer;   /* world ranks; -1 = none */
    uint8_t round;              /* tag of the message: sender and receiver agree on it */
    uint8_t action;
    const char *sbuf;
    size_t slen;                /* bytes */
    char *rbuf;
    size_t rlen;
    char *dst;                  /* reduce: dst op= src (count elements); copy: count bytes; div: dst /= n */
    const char *src;
    size_t count;
} comm_step;

typedef struct {
    comm_step *steps;
    int n, cap;
    int round;                  /* next free round, advanced by the builders */
    int cur;                    /* the step in flight */
    int posted;
    int oom;                    /* a builder ran out of memory: the program is incomplete */
    void *sreq, *rreq;
} comm_prog;

struct pdde_comm_request {
    pdde_comm *comm;
    comm_world *w;
    comm_prog *progs;
    int nprog, max_active;      /* programs, and how many may run at once */
    uint64_t tagbase;
    pdde_dtype dtype;
    pdde_reduce_op op;
    int divisor;                /* for PDDE_REDUCE_AVG */
    void *scratch;              /* freed with the request (or kept with it in the world's spare) */
    size_t scratch_cap;         /* bytes allocated at scratch */
    int progs_cap;              /* programs allocated at progs (each keeps its steps array) */
    int done, detached;
    pdde_status status;
    char msg[256];
    const char *kind;           /* what a timeout names: "send", "recv" or the collective's algorithm */
    int peer, tag;              /* a send's or receive's world rank and tag (-1: a collective) */
    pdde_comm_request *prev, *next; /* the world's running operations */
    /* an operation that runs without programs (shm.c's collectives on shared memory) advances itself:
     * returns 1 if anything moved */
    int (*advance)(pdde_comm_request *r);
    comm_shm_op shm;
};

/* Element i of n equal-as-possible parts of [0, count). */
static void comm_part(size_t count, int n, int i, size_t *off, size_t *len) {
    *off = count * (size_t)i / (size_t)n;
    *len = count * (size_t)(i + 1) / (size_t)n - *off;
}

/* ------------------------------------------------------------------------------------------------
 * Reduction kernels: dst[i] = dst[i] op src[i]. Half types are widened to f32 and rounded back;
 * every operation is commutative, so a pair of ranks reducing each other's data agrees bit for bit. */

#define COMM_REDUCE_LOOP(T, LOAD, STORE)                                                        \
    do {                                                                                        \
        T *d = dst; const T *s = src;                                                           \
        switch (op) {                                                                           \
        case PDDE_REDUCE_SUM: case PDDE_REDUCE_AVG:                                             \
            for (size_t i = 0; i < n; i++) { d[i] = STORE(LOAD(d[i]) + LOAD(s[i])); } break;    \
        case PDDE_REDUCE_MAX:                                                                   \
            for (size_t i = 0; i < n; i++) { if (LOAD(s[i]) > LOAD(d[i])) d[i] = s[i]; } break; \
        case PDDE_REDUCE_MIN:                                                                   \
            for (size_t i = 0; i < n; i++) { if (LOAD(s[i]) < LOAD(d[i])) d[i] = s[i]; } break; \
        }                                                                                       \
    } while (0)
#define COMM_ID(x) (x)

static void comm_reduce(void *dst, const void *src, size_t n, pdde_dtype t, pdde_reduce_op op) {
    switch (t) {
    case PDDE_F32: COMM_REDUCE_LOOP(float, COMM_ID, COMM_ID); break;
    case PDDE_F16: COMM_REDUCE_LOOP(uint16_t, pdde_f16_to_f32, pdde_f32_to_f16); break;
    case PDDE_BF16: COMM_REDUCE_LOOP(uint16_t, pdde_bf16_to_f32, pdde_f32_to_bf16); break;
    case PDDE_I32: COMM_REDUCE_LOOP(int32_t, COMM_ID, COMM_ID); break;
    case PDDE_I64: COMM_REDUCE_LOOP(int64_t, COMM_ID, COMM_ID); break;
    default: break;
    }
}

/* x /= divisor, for averages (integer division for integer types). */
static void comm_divide(void *x, size_t n, pdde_dtype t, int divisor) {
    size_t i;
    switch (t) {
    case PDDE_F32: { float *d = x; for (i = 0; i < n; i++) d[i] /= (float)divisor; break; }
    case PDDE_F16: { uint16_t *d = x; for (i = 0; i < n; i++) d[i] = pdde_f32_to_f16(pdde_f16_to_f32(d[i]) / (float)divisor); break; }
    case PDDE_BF16: { uint16_t *d = x; for (i = 0; i < n; i++) d[i] = pdde_f32_to_bf16(pdde_bf16_to_f32(d[i]) / (float)divisor); break; }
    case PDDE_I32: { int32_t *d = x; for (i = 0; i < n; i++) d[i] /= divisor; break; }
    case PDDE_I64: { int64_t *d = x; for (i = 0; i < n; i++) d[i] /= divisor; break; }
    default: break;
    }
}

/* ------------------------------------------------------------------------------------------------
 * Building */

/* Small requests are recycled: one released request waits in the world's spare slot, with its
 * programs, their step arrays and its scratch, so that a loop of small operations allocates nothing
 * (malloc/free were ~20% of the instructions of an 8-byte allreduce). Larger ones are freed. */
#define COMM_SPARE_MAX_PROGS 8
#define COMM_SPARE_MAX_SCRATCH (256u << 10)

static void req_free_mem(pdde_comm_request *r) {
    for (int i = 0; i < r->progs_cap; i++) free(r->progs[i].steps);
    free(r->progs);
    free(r->scratch);
    free(r);
}

static pdde_status req_alloc(pdde_comm *c, int nprog, pdde_dtype t, pdde_reduce_op op, pdde_comm_request **out) {
    comm_world *w = c->w;
    int np = nprog > 0 ? nprog : 1;
    pdde_comm_request *r = atomic_exchange(&w->spare, NULL);
    if (r && r->progs_cap < np) { req_free_mem(r); r = NULL; }
    if (r) {
        comm_prog *progs = r->progs;
        int progs_cap = r->progs_cap;
        void *scratch = r->scratch;
        size_t scratch_cap = r->scratch_cap;
        for (int i = 0; i < np; i++) { /* keep each program's step array, forget its steps */
            comm_step *steps = progs[i].steps;
            int cap = progs[i].cap;
            memset(&progs[i], 0, sizeof progs[i]);
            progs[i].steps = steps;
            progs[i].cap = cap;
        }
        memset(r, 0, sizeof *r);
        r->progs = progs; r->progs_cap = progs_cap;
        r->scratch = scratch; r->scratch_cap = scratch_cap;
    } else {
        r = calloc(1, sizeof *r);
        if (r) r->progs = calloc((size_t)np, sizeof *r->progs);
        if (!r || !r->progs) { free(r); return pdde_error(w->ctx, PDDE_ERR_OOM, "comm: out of memory"); }
        r->progs_cap = np;
    }
    r->comm = c;
    r->w = w;
    r->nprog = nprog;
    r->max_active = nprog;
    r->dtype = t;
    r->op = op;
    r->divisor = c->size;
    r->peer = r->tag = -1;
    *out = r;
    return PDDE_OK;
}

/* Frees a finished (or never started) request, or keeps it as the world's spare. */
static void req_release(pdde_comm_request *r) {
    if (!r) return;
    if (r->progs_cap <= COMM_SPARE_MAX_PROGS && r->scratch_cap <= COMM_SPARE_MAX_SCRATCH) {
        r = atomic_exchange(&r->w->spare, r);
        if (!r) return;
    }
    req_free_mem(r);
}

/* Allocates the request's scratch memory plus room for the off/len arrays the builders use. */
static pdde_status req_scratch(pdde_comm_request *r, size_t bytes) {
    if (bytes <= r->scratch_cap) return PDDE_OK; /* a recycled request's scratch is large enough */
    free(r->scratch);
    r->scratch_cap = 0;
    if (!(r->scratch = malloc(bytes)))
        return pdde_error(r->w->ctx, PDDE_ERR_OOM, "comm: out of memory (%zu bytes of scratch)", bytes);
    r->scratch_cap = bytes;
    return PDDE_OK;
}

/* Frees a request that could not be built and reports st. */
static pdde_status req_abandon(pdde_comm_request *r, pdde_status st) {
    pdde_context *ctx = r->w->ctx;
    req_release(r);
    return st == PDDE_ERR_OOM ? pdde_error(ctx, st, "comm: out of memory") : st;
}

/* A new step with no transfer and no action; NULL when out of memory (the builder checks once). */
static comm_step *prog_step(comm_prog *p, int round) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 8;
        comm_step *s = realloc(p->steps, (size_t)cap * sizeof *s);
        if (!s) { p->oom = 1; return NULL; }
        p->steps = s; p->cap = cap;
    }
    comm_step *s = &p->steps[p->n++];
    memset(s, 0, sizeof *s);
    s->send_peer = s->recv_peer = -1;
    s->round = (uint8_t)round;
    return s;
}

/* Convenience builders used by the algorithms. They report failure through prog_ok(). */
static void prog_xfer(comm_prog *p, int round, int send_peer, const void *sbuf, size_t slen, int recv_peer,
                      void *rbuf, size_t rlen) {
    comm_step *s = prog_step(p, round);
    if (!s) return;
    s->send_peer = send_peer; s->sbuf = sbuf; s->slen = slen;
    s->recv_peer = recv_peer; s->rbuf = rbuf; s->rlen = rlen;
}

static void prog_action(comm_prog *p, int action, void *dst, const void *src, size_t count) {
    if (p->oom) return;
    if (!p->n || p->steps[p->n - 1].action) {
        if (!prog_step(p, 0)) return;
    }
    comm_step *s = &p->steps[p->n - 1];
    s->action = (uint8_t)action; s->dst = dst; s->src = src; s->count = count;
}

/* ------------------------------------------------------------------------------------------------
 * Running */

static uint64_t req_tag(const pdde_comm_request *r, int prog, int round) {
    return r->tagbase | (uint64_t)(prog & 0xff) << 8 | (uint64_t)(round & 0xff);
}

static void step_action(pdde_comm_request *r, comm_step *s) {
    switch (s->action) {
    case STEP_REDUCE: comm_reduce(s->dst, s->src, s->count, r->dtype, r->op); break;
    case STEP_COPY: if (s->count && s->dst != s->src) memmove(s->dst, s->src, s->count); break;
    case STEP_DIV: comm_divide(s->dst, s->count, r->dtype, r->divisor); break;
    default: break;
    }
}

static void world_unlink(comm_world *w, pdde_comm_request *r) {
    if (r->prev) r->prev->next = r->next; else if (w->active == r) w->active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void req_finish(pdde_comm_request *r, pdde_status st) {
    comm_world *w = r->w;
    for (int i = 0; i < r->nprog; i++) {
        comm_prog *p = &r->progs[i];
        if (p->sreq) { w->tp->cancel(w->tr, p->sreq); p->sreq = NULL; }
        if (p->rreq) { w->tp->cancel(w->tr, p->rreq); p->rreq = NULL; }
    }
    r->status = st;
    r->done = 1;
    world_unlink(w, r);
    if (r->scratch_cap > COMM_SPARE_MAX_SCRATCH) { /* large: give it back before the caller frees the request */
        free(r->scratch);
        r->scratch = NULL;
        r->scratch_cap = 0;
    }
    if (r->detached) req_release(r);
}

/* Tests one transport request; returns 1 when it is finished. Failures poison the world. */
static int req_test_one(pdde_comm_request *r, void **req, int peer, pdde_status *st) {
    int done = 0;
    pdde_status s = r->w->tp->test(*req, &done, NULL);
    if (s) {
        *req = NULL;
        *st = s;
        comm_fail(r->w, s == PDDE_ERR_PEER_LOST ? s : PDDE_ERR_COMM, "rank %d: connection to rank %d %s", r->w->rank,
                  peer, s == PDDE_ERR_PEER_LOST ? "lost (peer died?)" : "failed");
        return 1;
    }
    if (done) *req = NULL;
    return done;
}

/* Advances one program as far as it goes without waiting. Returns 1 if anything moved. */
static int prog_advance(pdde_comm_request *r, int idx, pdde_status *st) {
    comm_world *w = r->w;
    comm_prog *p = &r->progs[idx];
    int moved = 0;
    while (p->cur < p->n && !*st) {
        comm_step *s = &p->steps[p->cur];
        if (!p->posted) {
            uint64_t tag = req_tag(r, idx, s->round);
            pdde_status e = PDDE_OK;
            if (s->recv_peer >= 0)
                e = w->tp->irecv(w->recv[s->recv_peer], s->rbuf, s->rlen, tag, PDDE_MEM_HOST, &p->rreq);
            if (!e && s->send_peer >= 0)
                e = w->tp->isend(w->send[s->send_peer], s->sbuf, s->slen, tag, PDDE_MEM_HOST, &p->sreq);
            if (e) {
                *st = e;
                comm_fail(w, e == PDDE_ERR_PEER_LOST ? e : PDDE_ERR_COMM, "rank %d: cannot post a transfer (%s)",
                          w->rank, pdde_status_str(e));
                return 1;
            }
            p->posted = 1;
            moved = 1;
        }
        if (p->rreq && !req_test_one(r, &p->rreq, s->recv_peer, st)) return moved;
        if (p->sreq && !req_test_one(r, &p->sreq, s->send_peer, st)) return moved;
        if (*st) return 1;
        step_action(r, s);
        p->cur++;
        p->posted = 0;
        moved = 1;
    }
    return moved;
}

/* Advances an operation; finishes it when all its programs are done or one failed. Programs run in
 * a sliding window: program s starts once program s - max_active is done, so the two may share
 * scratch memory (slot s % max_active, see req_slot). */
static int req_advance(pdde_comm_request *r) {
    if (r->advance) return r->advance(r);
    pdde_status st = PDDE_OK;
    int moved = 0, finished = 0;
    for (int i = 0; i < r->nprog && !st; i++) {
        comm_prog *p = &r->progs[i], *before = i >= r->max_active ? &r->progs[i - r->max_active] : NULL;
        if (p->cur == p->n) { finished++; continue; }
        if (before && before->cur != before->n) continue;
        moved |= prog_advance(r, i, &st);
        if (p->cur == p->n) { finished++; moved = 1; }
    }
    if (st) { req_finish(r, st); return 1; }
    if (finished == r->nprog) req_finish(r, PDDE_OK);
    return moved;
}

/* Scratch slots an operation needs, and the slot of program s. */
static int req_nslots(const pdde_comm_request *r) { return r->nprog < r->max_active ? r->nprog : r->max_active; }
static int req_slot(const pdde_comm_request *r, int s) { return s % r->max_active; }

/* Drives the transport and every running operation of the world. Returns 1 if anything moved. */
static int world_progress(comm_world *w) {
    /* After a failure the transport is not driven again (until its connections are force-closed):
     * a cancelled receive that had already matched a large message could still be written into a
     * buffer the caller has freed since the error. */
    int moved = !w->failed && w->tp->progress(w->tr) > 0;
    for (pdde_comm_request *r = w->active, *next; r && !w->failed; r = next) {
        next = r->next;
        moved |= req_advance(r);
    }
    if (w->failed && w->active) {
        /* comm_fail only records the failure; the operations still running are ended here, where no
         * list walk is in progress */
        while (w->active) req_finish(w->active, w->failed);
        moved = 1;
    }
    return moved;
}

#endif /* PDDE_COMM_SCHEDULE_C */
