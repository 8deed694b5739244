/* core/session.c — the session and its executor. Compiling a graph:
 *   1. lowers it to this rank's local program (planner/lower.c): the nodes the step needs, placed on
 *      devices, COPY nodes at device boundaries, local shapes, communication, the pipeline schedule,
 *   2. opens the program's devices and checks that each runs its nodes (supports_op),
 *   3. plans memory per device: persistent tensors (parameters, optimizer state, inputs) in one buffer,
 *      everything else in one arena where tensors whose lifetimes do not overlap share bytes.
 * Running walks the program's order pass by pass, skipping what a pass leaves out; collectives,
 * send/recv and the vocab-parallel cross-entropy run here, on comm/. */
/* (A part of pdde.c, included there in layer order: it uses the parts before it.) */

typedef struct {
    int device;                 /* global device index */
    const pdde_backend_iface *iface;
    void *dev, *stream;
    bool host;                  /* CPU: data handles are host pointers */
    void *arena, *persist;      /* buffer handles */
    void **arenas;              /* n_live arenas (arenas[0] = arena): one per micro-batch in flight */
    size_t arena_bytes, persist_bytes;
    void *copy_stream;          /* a second stream for its gradient buckets' host copies (NULL: none) */
    void *copy_ev[2];           /* [0] on stream: what the copies wait for; [1] on copy_stream: what stream waits for */
} session_device;

/* A SEND node's data in flight: copied out of the arena so the arena can be reused at once. */
struct session_send {
    const pdde_tensor *node;    /* the SEND node (what a failed wait names) */
    char *copy;                 /* n_live copies of the node's bytes */
    void **requests;            /* n_live pending sends (pdde_comm_request) */
};

struct pdde_session {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_program *prog;         /* this rank's local program (the session's own: it writes run-time
                                   params, data and offsets into its nodes) */
    session_device *devs;
    int n_devs;
    int *slot;                  /* per program node id: index into devs */
    uint8_t *overwritten;       /* per program node id: its memory is reused within the step (not readable after) */
    pdde_tensor **order;        /* the program's run order */
    int n_order;
    void **staging;             /* per program node id of a COPY node between two devices: host bounce buffer */
    int64_t step;
    uint32_t run_counter;
    float last_loss;
    int64_t loss_tokens;        /* pdde_session_set_loss_tokens (0: each micro-batch's own mean) */
    pdde_optimizer_params schedule; /* the learning rate's: the graph optimizer's, or a checkpoint's */
    pdde_tensor *loss;
    pdde_memory_stats mem;
    void **requests;            /* per program node id of a collective started early: its pending request */
    bool *bucket_done;          /* per program node id of a gradient bucket: completed in this run */
    int gradient_collectives;   /* issued by the last run (pdde_session_gradient_collectives) */
    int64_t exchanged_rows;     /* by the last run (pdde_session_exchanged_rows) */
    pdde_comm *world;           /* SPMD execution of a completed graph (NULL: none) */
    pdde_comm *axis_comm[PDDE_MAX_MESH_DIMS];
    const struct session_collective_path *collective_path; /* how gradient buckets travel */
    const pdde_device_collectives_iface *dcoll; /* pdde_session_params.device_collectives */
    void *dcoll_impl[PDDE_MAX_MESH_DIMS];       /* its communicator of each axis (NULL: not made) */
    void **dcoll_buf;           /* per program node id of a bucket it serves: the bucket's device buffer */
    struct session_dstream { session_device *sd; void *stream; void **ev; } *dcoll_ds; /* per such node id: its copies' and
                                   collective's stream (NULL: the device's), events ready, packed, done */
    struct session_own_buffer { void *p; session_device *sd; bool pinned; } *own_buffers; /* device buckets' */
    int n_own_buffers;
    void **copy_done;           /* per program node id of a bucket copied on a copy stream: its reads' event */
    pdde_tensor *copy_pending;  /* the bucket whose reads are in flight, its collective not started yet */
    int stream_copies;          /* bucket copies the last run put on copy streams (pdde_session_stream_copies) */
    void *comm_staging;         /* host bounce buffer for collectives on device memory */
    size_t comm_staging_bytes;
    char *moe_exchange; /* the expert exchange's send and receive rows (its largest node's worst case) */
    bool moe_exchange_registered; /* ... from pdde_comm_buffer_alloc: the host's other ranks copy its rows straight out */
    session_device *comm_staging_dev;
    /* ZeRO-3's prefetched gathers with device memory: their host regions (lowering's staging_offset),
     * pinned by prefetch_staging_dev where it can be; the device whose stream may still write out of
     * them (synchronized before a region is filled again) */
    char *prefetch_staging;
    session_device *prefetch_staging_dev, *prefetch_unsynced;
    bool prefetch_staging_pinned;
    /* gathers and reduce-scatters along a dim other than 0: where their blocks are reordered (the
     * largest's size: program_gather_scratch_bytes) */
    char *gather_scratch;
    size_t gather_scratch_bytes;
    /* micro-batches and pipeline stages (from the program) */
    int n_micro, n_stages, n_chunks, n_live;
    bool early_starts;          /* this pass is the step's last backward and the update follows: gradient
                                   reductions start as soon as their accumulator is final */
    bool bind;                  /* tensors are pointed at a micro-batch's memory before each node */
    size_t *input_base;         /* per program node id of an input: offset of its micro-batch 0 (then one slot each) */
    int *send_of;               /* per program node id of a SEND: its index in sends */
    pdde_tensor **update_group; /* n_order slots: the update nodes of one multi-tensor launch */
    struct session_send *sends; /* per SEND node: host copies in flight, one per live micro-batch */
    int n_sends;
    bool profile;               /* PDDE_PROFILE=1: time per op, printed when the session is freed */
    struct session_profile *devprof; /* PDDE_PROFILE=device: timed on the device (core/profile.c; NULL: off) */
    bool check_nonfinite;       /* PDDE_CHECK_NONFINITE=1: every node's output is checked (debugging) */
    bool update_checked;        /* this run checked the loss and gradient norm before its first update */
    bool loss_read;             /* ...and read the loss then (loss_value): its end need not read it again */
    float loss_value;
    int64_t host_syncs;         /* waits for a device's stream (pdde_session_host_syncs) */
    void *zeros;                /* zeros written where a device has no zero slot (zeros_bytes; grown as needed) */
    size_t zeros_bytes;
    bool pass_has_loss;         /* this run computes the loss in the pass that updates */
    /* dynamic loss scaling (graphs with f16 matmuls): the scale is the backward's seed, a checkpointed
     * tensor; this is its value */
    bool loss_scaling, skip_update;
    bool scaling_pass;          /* a training pass of a session that scales its loss */
    pdde_loss_scale_stats scaler;
    double op_seconds[PDDE_OP_COUNT];
    int64_t op_calls[PDDE_OP_COUNT];
    int64_t op_runs[PDDE_OP_COUNT]; /* nodes run, profiling or not (pdde_session_op_runs) */
    /* The parameters' low-precision copies (PDDE_TENSOR_SHADOW) hold bf16/f16 of their parameters'
     * values: a run that starts so skips their casts (the updates rewrite them). A run that computed
     * them or kept them fresh leaves this set; a failed run, or any write of a parameter, clears it. */
    bool shadows_fresh, skip_shadow_casts;
    struct session_trace *trace; /* pdde_session_params.trace / PDDE_TRACE (NULL: off) */
    /* the check before the step's first update, left to its end (check_after_step): the norm the
     * updates read (NULL: checked before them, or no update), the micro-batch, and the norm read */
    const pdde_tensor *deferred_norm;
    int deferred_micro;
    float norm_value;
    /* called once per updating run, before its first update (elastic snapshots copied while the step's
     * forward and backward run must be done by then) */
    void (*update_hook)(void *arg);
    void *update_hook_arg;
    /* gradients written straight into their accumulators (lower_direct_grads): the producers that may
     * (direct_x, each with its own offset in the arena), whether they point at their accumulators now,
     * and whether those accumulators hold zeros (as a session starts and every update leaves them) */
    pdde_tensor **direct_x;
    size_t *direct_offset;
    int n_direct;
    bool direct_bound, grads_zero;
};

static pdde_status trace_open(pdde_session *s, const char *path);

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool program_runs_itself(const pdde_program *P, const pdde_tensor *t);
#include "profile.c" /* PDDE_PROFILE=device */

/* The host waits for sd's stream (counted where it is a device's: pdde_session_host_syncs). */
static pdde_status device_sync(pdde_session *s, session_device *sd) {
    if (!sd->host) s->host_syncs++;
    if (s->devprof && !sd->host) return profile_wait(s, sd);
    return sd->iface->stream_sync(sd->dev, sd->stream);
}

static int session_slot_for(pdde_session *s, int device) {
    for (int i = 0; i < s->n_devs; i++)
        if (s->devs[i].device == device) return i;
    session_device *d = realloc(s->devs, (size_t)(s->n_devs + 1) * sizeof *d);
    if (!d) return -1;
    s->devs = d;
    session_device *sd = &s->devs[s->n_devs];
    memset(sd, 0, sizeof *sd);
    sd->device = device;
    if (registry_device_get(s->ctx, s->ctx->registry, device, &sd->iface, &sd->dev) != PDDE_OK) return -1;
    sd->host = strcmp(sd->iface->name, "cpu") == 0;
    bool timed = s->devprof && profile_can_time(sd->iface); /* (PDDE_PROFILE=device) */
    if ((timed ? sd->iface->stream_create_timed : sd->iface->stream_create)(sd->dev, &sd->stream) != PDDE_OK) return -1;
    return s->n_devs++;
}

/* Nodes the executor runs itself rather than a backend's compute: copies between devices and the
 * communication (on comm/). */
static bool program_runs_itself(const pdde_program *P, const pdde_tensor *t) {
    const pdde_program_node *in = &P->info[t->id];
    return t->op == PDDE_OP_COPY || t->op == PDDE_OP_COMM_WAIT || t->op == PDDE_OP_SEND || t->op == PDDE_OP_RECV ||
           (t->op >= PDDE_OP_ALLREDUCE && t->op <= PDDE_OP_ALLGATHER && in->axis >= 0);
}

/* Opens the program's devices (a slot each) and checks that each runs its nodes. */
static pdde_status session_place(pdde_session *s) {
    pdde_program *P = s->prog;
    if (!(s->slot = malloc((size_t)(P->n + 1) * sizeof *s->slot))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    for (int i = 0; i < P->n; i++) s->slot[i] = -1;
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *t = P->order[i];
        int slot = session_slot_for(s, t->device);
        if (slot < 0) {
            return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session: %s is placed on device %d, which cannot be opened (%s)", t->name, t->device,
                              pdde_last_error(s->ctx));
        }
        s->slot[t->id] = slot;
        session_device *sd = &s->devs[slot];
        bool vocab_ce = P->info[t->id].vocab_axis >= 0 && (t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_CROSS_ENTROPY_BACK);
        bool asks = t->op != PDDE_OP_NONE && !program_runs_itself(P, t) && !vocab_ce; /* (whether the device runs it) */
        bool runs = asks ? sd->iface->supports_op(sd->dev, t) != 0 : t->op == PDDE_OP_NONE || program_runs_itself(P, t) || sd->host;
        if (asks && runs) t->flags |= PDDE_TENSOR_SUPPORTED; /* (asked once here, not at every compute) */
        if (!runs) {
            pdde_device_props props;
            registry_device_props(s->ctx->registry, t->device, &props);
            if (P->info[t->id].vocab_axis >= 0)
                return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s: %s with the vocab split over mesh axis %s needs a device that "
                                  "runs its vocab-parallel form (the CPU's)", t->name, pdde_op_name(t->op), P->mesh->names[P->info[t->id].vocab_axis]);
            return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: device %d (%s) cannot run op %s (node %s)", t->device, props.name,
                              pdde_op_name(t->op), t->name);
        }
    }
    s->order = P->order, s->n_order = P->n_order;
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Communication of the executor: host staging for device memory, request completion, sends. */

#ifdef PDDE_HAVE_COMM
/* The host bounce buffer for collectives on device memory (page-locked where the backend can). */
static void comm_staging_free(pdde_session *s) {
    session_device *sd = s->comm_staging_dev;
    if (s->comm_staging && IFACE_HAS(sd->iface, host_free)) sd->iface->host_free(sd->dev, s->comm_staging);
    else free(s->comm_staging);
    s->comm_staging = NULL, s->comm_staging_bytes = 0;
}

/* (sized once by the memory plan, session_allocate: it grows only where that missed a need; counted in
 * transfer_bytes either way) */
static void *comm_staging(pdde_session *s, session_device *sd, size_t bytes) {
    if (bytes <= s->comm_staging_bytes) return s->comm_staging;
    s->mem.transfer_bytes -= s->comm_staging_bytes;
    comm_staging_free(s);
    s->comm_staging_dev = sd;
    if (IFACE_HAS(sd->iface, host_alloc)) { if (sd->iface->host_alloc(sd->dev, bytes, &s->comm_staging)) s->comm_staging = NULL; }
    else s->comm_staging = malloc(bytes);
    if (s->comm_staging) s->comm_staging_bytes = bytes, s->mem.transfer_bytes += bytes;
    return s->comm_staging;
}

static pdde_status run_reshard(pdde_session *s, pdde_tensor *t);

static const pdde_program_node *node_info(const pdde_session *s, const pdde_tensor *t) { return &s->prog->info[t->id]; }

static void bind_micro(pdde_session *s, pdde_tensor *t, int m);
static char *host_bytes(const pdde_tensor *t) { return (char *)t->data + t->offset; }

/* Gradient buckets (lowering's: lower_buckets in planner/lower.c). A bucket node packs its members'
 * inputs into its flat buffer (an allreduce's in place; a reduce-scatter's or gather's rank-major,
 * its result after them) and runs one collective, started early or blocking; each member copies its
 * part of the result out, the first one completing the bucket (waiting for it, or running it when
 * this run did not start it). The bucket's buffer is host memory; members on a device are read into
 * it through the device's stream (one synchronisation a bucket) and written back from it. */

/* A member's input: the gradient it reduces, or the updated shard it gathers (its bucket is last). */
static const pdde_tensor *bucket_member_input(const pdde_tensor *m) { return m->src[m->nsrc - 2]; }

/* Bytes from the start of bucket b's buffer to its result. */
static size_t bucket_result_at(pdde_session *s, const pdde_tensor *b) {
    const pdde_program_node *bi = node_info(s, b);
    size_t ranks = b->op == PDDE_OP_REDUCE_SCATTER ? (size_t)pdde_comm_size(s->axis_comm[bi->axis]) : b->op == PDDE_OP_ALLGATHER ? 1 : 0;
    return ranks * (size_t)bi->bucket_block * pdde_dtype_size(b->dtype);
}

/* A bucket on a copy stream (copy_done): its members' device. */
static session_device *copy_dev(pdde_session *s, const pdde_tensor *b) {
    return &s->devs[s->slot[bucket_member_input(node_info(s, b)->bucket_next)->id]];
}

static pdde_status bucket_pack(pdde_session *s, pdde_tensor *b, int micro) {
    const pdde_program_node *bi = node_info(s, b);
    size_t esz = pdde_dtype_size(b->dtype), block = (size_t)bi->bucket_block * esz;
    int n = b->op == PDDE_OP_REDUCE_SCATTER ? pdde_comm_size(s->axis_comm[bi->axis]) : 1; /* (blocks of dim 0: contiguous) */
    session_device *dev = NULL; /* the members' device, when not the host */
    pdde_status st = PDDE_OK;
    /* on the device's copy stream: after the kernels that made the gradients, beside the backward that
     * goes on (the gradients live until their members: nothing later writes them); the collective
     * starts once the reads' event is done (copy_flush) */
    session_device *cd = s->copy_done && s->copy_done[b->id] ? copy_dev(s, b) : NULL;
    if (cd && !(st = cd->iface->event_record(cd->dev, cd->copy_ev[0], cd->stream))) st = cd->iface->stream_wait_event(cd->dev, cd->copy_stream, cd->copy_ev[0]);
    for (pdde_tensor *m = bi->bucket_next; m && !st; m = node_info(s, m)->bucket_next) {
        pdde_tensor *x = (pdde_tensor *)bucket_member_input(m);
        if (s->bind) bind_micro(s, x, micro);
        size_t part = pdde_tensor_nbytes(x) / (size_t)n, at = (size_t)node_info(s, m)->bucket_offset * esz;
        session_device *sd = &s->devs[s->slot[x->id]];
        if (!sd->host) dev = sd;
        for (int r = 0; r < n && !st; r++) {
            char *to = host_bytes(b) + (size_t)r * block + at;
            if (sd->host) memcpy(to, host_bytes(x) + (size_t)r * part, part);
            else st = sd->iface->read(sd->dev, cd ? cd->copy_stream : sd->stream, x->data, x->offset + (size_t)r * part, to, part);
            s->stream_copies += cd != NULL;
        }
    }
    if (cd) return st ? st : cd->iface->event_record(cd->dev, s->copy_done[b->id], cd->copy_stream);
    return st || !dev ? st : device_sync(s, dev);
}

/* Bucket b's collective over its axis: started (*req kept) or, req NULL, blocking. */
static pdde_status host_collective(pdde_session *s, pdde_tensor *b, pdde_comm_request **req) {
    const pdde_program_node *bi = node_info(s, b);
    pdde_comm *c = s->axis_comm[bi->axis];
    size_t count = (size_t)bi->bucket_block;
    char *buf = host_bytes(b), *result = buf + bucket_result_at(s, b);
    pdde_reduce_op op = (pdde_reduce_op)bi->reduce;
    if (b->op == PDDE_OP_ALLREDUCE) return req ? pdde_comm_iallreduce(c, buf, buf, count, b->dtype, op, req) : pdde_comm_allreduce(c, buf, buf, count, b->dtype, op);
    if (b->op == PDDE_OP_REDUCE_SCATTER)
        return req ? pdde_comm_ireduce_scatter(c, buf, result, count, b->dtype, op, req) : pdde_comm_reduce_scatter(c, buf, result, count, b->dtype, op);
    return req ? pdde_comm_iallgather(c, buf, result, count, b->dtype, req) : pdde_comm_allgather(c, buf, result, count, b->dtype);
}

/* Starts the collective of the bucket whose reads are in flight on a copy stream, once they are done
 * (*pending: that bucket, for the caller's error). Its ranks' collectives keep their order: the
 * executor flushes before any other collective. */
static pdde_status copy_flush(pdde_session *s, pdde_tensor **pending) {
    pdde_tensor *b = *pending = s->copy_pending;
    if (!b) return PDDE_OK;
    s->copy_pending = NULL;
    session_device *cd = copy_dev(s, b);
    s->host_syncs++;
    pdde_status st = cd->iface->event_sync(cd->dev, s->copy_done[b->id]);
    return st ? st : host_collective(s, b, (pdde_comm_request **)&s->requests[b->id]);
}

/* A started bucket on a copy stream waits there (copy_pending) until the next collective or member;
 * one at the update waits for its reads, then runs. */
static pdde_status bucket_collective(pdde_session *s, pdde_tensor *b, pdde_comm_request **req) {
    if (!s->copy_done || !s->copy_done[b->id]) return host_collective(s, b, req);
    pdde_tensor *older;
    pdde_status st = copy_flush(s, &older);
    if (st) return st;
    if (req) { *req = NULL, s->copy_pending = b; return PDDE_OK; }
    session_device *cd = copy_dev(s, b);
    s->host_syncs++;
    st = cd->iface->event_sync(cd->dev, s->copy_done[b->id]);
    return st ? st : host_collective(s, b, NULL);
}

static pdde_status bucket_unpack(pdde_session *s, pdde_tensor *m);

/* The collectives' path: how a gradient bucket is filled, reduced and emptied, whether its members
 * live in host or device memory. The staged path: members on a device are read into the bucket's
 * host buffer through the device's stream, pdde_comm's host collective runs on it, and the results are
 * written back. The device path (below: pdde_device_collectives_iface, NCCL's shape) fills the same
 * three calls; the executor and the lowering do not change (comm/README.md). */
typedef struct session_collective_path {
    pdde_status (*pack)(pdde_session *s, pdde_tensor *bucket, int micro);            /* members' inputs in */
    pdde_status (*collective)(pdde_session *s, pdde_tensor *bucket, pdde_comm_request **req); /* req NULL: blocking */
    pdde_status (*unpack)(pdde_session *s, pdde_tensor *member);                     /* its part of the result out */
} session_collective_path;
static const session_collective_path collective_path_staged = {bucket_pack, bucket_collective, bucket_unpack};

/* The device path (pdde_device_collectives_iface): a bucket it serves is gathered into its device
 * buffer, reduced there and scattered back, all ordered on its members' device stream; the others
 * are staged. */
static session_device *dbucket_dev(pdde_session *s, const pdde_tensor *b) {
    return &s->devs[s->slot[bucket_member_input(node_info(s, b)->bucket_next)->id]];
}

/* A bucket's device buffer has the host bucket's layout (an allreduce's members in place; a
 * reduce-scatter's or gather's rank-major blocks, its result after them): n blocks of each member
 * in (a reduce-scatter's n ranks' parts of its gradient, else its whole input). */
static pdde_status dbucket_pack(pdde_session *s, pdde_tensor *b, int micro) {
    if (!s->dcoll_buf[b->id]) return bucket_pack(s, b, micro);
    session_device *sd = dbucket_dev(s, b);
    const struct session_dstream *ds = &s->dcoll_ds[b->id];
    void *cs = ds->stream ? ds->stream : sd->stream;
    size_t esz = pdde_dtype_size(b->dtype), block = (size_t)node_info(s, b)->bucket_block * esz;
    int n = b->op == PDDE_OP_REDUCE_SCATTER ? pdde_comm_size(s->axis_comm[node_info(s, b)->axis]) : 1;
    pdde_status st = PDDE_OK;
    /* on a stream of its own: after the kernels that made the gradients, beside the backward that goes on */
    if (ds->stream && !(st = sd->iface->event_record(sd->dev, ds->ev[0], sd->stream))) st = sd->iface->stream_wait_event(sd->dev, cs, ds->ev[0]);
    for (pdde_tensor *m = node_info(s, b)->bucket_next; m && !st; m = node_info(s, m)->bucket_next) {
        pdde_tensor *x = (pdde_tensor *)bucket_member_input(m);
        if (s->bind) bind_micro(s, x, micro);
        size_t part = pdde_tensor_nbytes(x) / (size_t)n, at = (size_t)node_info(s, m)->bucket_offset * esz;
        for (int r = 0; r < n && !st; r++)
            st = sd->iface->copy(sd->dev, cs, x->data, x->offset + (size_t)r * part, s->dcoll_buf[b->id], (size_t)r * block + at, part);
    }
    /* (the device's later kernels wait for the copies, whose sources the memory plan may reuse, not
     * for the collective) */
    if (ds->stream && !st && !(st = sd->iface->event_record(sd->dev, ds->ev[1], cs))) st = sd->iface->stream_wait_event(sd->dev, sd->stream, ds->ev[1]);
    return st;
}

/* (ordered on the stream: no request; the bucket is done once it is enqueued) */
static pdde_status dbucket_collective(pdde_session *s, pdde_tensor *b, pdde_comm_request **req) {
    if (!s->dcoll_buf[b->id]) return bucket_collective(s, b, req);
    const pdde_program_node *bi = node_info(s, b);
    if (req) *req = NULL;
    pdde_tensor *older; /* (a staged bucket's collective waiting for its copies goes first: the ranks' order) */
    pdde_status st = copy_flush(s, &older);
    if (st) return st;
    session_device *sd = dbucket_dev(s, b);
    const struct session_dstream *ds = &s->dcoll_ds[b->id];
    void *cs = ds->stream ? ds->stream : sd->stream, *buf = s->dcoll_buf[b->id], *impl = s->dcoll_impl[bi->axis];
    size_t count = (size_t)bi->bucket_block;
    pdde_reduce_op op = (pdde_reduce_op)bi->reduce;
    if (b->op == PDDE_OP_ALLREDUCE) st = s->dcoll->allreduce(impl, cs, buf, 0, count, b->dtype, op);
    else if (b->op == PDDE_OP_REDUCE_SCATTER) st = s->dcoll->reduce_scatter(impl, cs, buf, 0, buf, bucket_result_at(s, b), count, b->dtype, op);
    else st = s->dcoll->allgather(impl, cs, buf, 0, buf, bucket_result_at(s, b), count, b->dtype);
    return st || !ds->stream ? st : sd->iface->event_record(sd->dev, ds->ev[2], ds->stream);
}

/* A member's part of the result out: its shard of a reduce-scatter, or every rank's block of a
 * gather into its parameter. */
static pdde_status dbucket_unpack(pdde_session *s, pdde_tensor *m) {
    const pdde_program_node *in = node_info(s, m);
    pdde_tensor *b = in->bucket;
    if (!s->dcoll_buf[b->id]) return bucket_unpack(s, m);
    session_device *sd = dbucket_dev(s, b);
    const struct session_dstream *ds = &s->dcoll_ds[b->id];
    size_t esz = pdde_dtype_size(m->dtype), at = (size_t)in->bucket_offset * esz, block = (size_t)node_info(s, b)->bucket_block * esz;
    size_t result = bucket_result_at(s, b);
    void *buf = s->dcoll_buf[b->id];
    pdde_status st = ds->stream ? sd->iface->stream_wait_event(sd->dev, sd->stream, ds->ev[2]) : PDDE_OK; /* (the result, on the device's stream) */
    if (m->op != PDDE_OP_ALLGATHER) return st ? st : sd->iface->copy(sd->dev, sd->stream, buf, result + at, m->data, m->offset, pdde_tensor_nbytes(m));
    size_t part = pdde_tensor_nbytes(bucket_member_input(m)); /* (the gathered parameter: m's memory) */
    for (int r = 0; r < pdde_comm_size(s->axis_comm[in->axis]) && !st; r++)
        st = sd->iface->copy(sd->dev, sd->stream, buf, result + (size_t)r * block + at, m->data, m->offset + (size_t)r * part, part);
    return st;
}
static const session_collective_path collective_path_device = {dbucket_pack, dbucket_collective, dbucket_unpack};

/* The buckets pdde_session_params.device_collectives serves: allreduce buckets, and reduce-scatter and
 * gather buckets (ZeRO's) where it has those slots, whose members are all on one device of its
 * backend, which has the copy slot; each gets a device buffer, each axis one
 * communicator of the implementation (made on every rank at once: they all have the same buckets). An
 * implementation that is unavailable (no libnccl) leaves them staged, with a notice. */
/* The device collectives a session of params uses (*dc NULL: none): params->device_collectives, else
 * PDDE_DEVICE_COLLECTIVES=nccl (off by default); pdde_predict_memory asks the same. */
static pdde_status session_device_collectives(pdde_context *ctx, const pdde_session_params *params, const pdde_device_collectives_iface **out) {
    const pdde_device_collectives_iface *dc = params ? params->device_collectives : NULL;
    const char *env = getenv("PDDE_DEVICE_COLLECTIVES");
    *out = NULL;
    if (!dc && env && *env && strcmp(env, "none")) {
        if (strcmp(env, "nccl"))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "session: PDDE_DEVICE_COLLECTIVES=%s: expected nccl or none", env);
        dc = pdde_nccl_collectives();
    }
    if (dc && (dc->api_version != PDDE_DEVICE_COLLECTIVES_API_VERSION || dc->struct_size < sizeof *dc || !dc->init || !dc->allreduce || !dc->free))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "session: device_collectives \"%s\": expected api_version %d and every slot",
                          dc->name ? dc->name : "?", PDDE_DEVICE_COLLECTIVES_API_VERSION);
    *out = dc;
    return PDDE_OK;
}

static pdde_status session_device_buckets(pdde_session *s, const pdde_session_params *params) {
    const pdde_device_collectives_iface *dc;
    pdde_status st0 = session_device_collectives(s->ctx, params, &dc);
    if (st0 || !dc) return st0;
    if (!(s->dcoll_buf = calloc((size_t)s->prog->n + 1, sizeof *s->dcoll_buf)) || !(s->dcoll_ds = calloc((size_t)s->prog->n + 1, sizeof *s->dcoll_ds)))
        return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    s->dcoll = dc;
    s->collective_path = &collective_path_device;
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *b = s->order[i];
        const pdde_program_node *bi = &s->prog->info[b->id];
        /* (the same test as pdde_predict_memory's: planner/memplan.c) */
        if (!program_device_bucket_served(s->ctx, s->prog, b, dc)) continue;
        session_device *sd = dbucket_dev(s, b);
        if (!s->dcoll_impl[bi->axis]) {
            pdde_device_collectives_params p = {s->ctx, s->axis_comm[bi->axis], sd->iface, sd->dev, 60};
            pdde_status st = dc->init(&p, &s->dcoll_impl[bi->axis]);
            if (st == PDDE_ERR_UNAVAILABLE) {
                pdde_log(PDDE_LOG_WARN, "pdde: device collectives \"%s\" unavailable (%s): the gradient buckets go through host memory\n",
                        dc->name ? dc->name : "?", pdde_last_error(s->ctx));
                s->dcoll_impl[bi->axis] = NULL;
                return PDDE_OK; /* (every rank finds the same) */
            }
            if (st) return st;
        }
        pdde_status st = sd->iface->buffer_alloc(sd->dev, pdde_tensor_nbytes(b), &s->dcoll_buf[b->id]);
        if (st) return st;
        s->mem.allocated_bytes += pdde_tensor_nbytes(b);
        /* (its host buffer, pinned where it can be, is no longer needed) */
        for (int k = 0; k < s->n_own_buffers; k++) {
            struct session_own_buffer *ob = &s->own_buffers[k];
            if (ob->p != b->data) continue;
            if (ob->pinned) ob->sd->iface->host_free(ob->sd->dev, ob->p);
            else free(ob->p);
            ob->p = b->data = NULL, ob->pinned = false;
            s->mem.transfer_bytes -= pdde_tensor_nbytes(b) + 1;
            break;
        }
        /* a stream of its own where the backend has streams and events (else the device's: in order) */
        struct session_dstream *ds = &s->dcoll_ds[b->id];
        if (IFACE_HAS(sd->iface, event_create) && IFACE_HAS(sd->iface, event_record) && IFACE_HAS(sd->iface, stream_wait_event) &&
            (ds->ev = calloc(3, sizeof *ds->ev))) {
            ds->sd = sd;
            for (int k = 0; k < 3 && !st; k++) st = sd->iface->event_create(sd->dev, &ds->ev[k]);
            if (!st) st = sd->iface->stream_create(sd->dev, &ds->stream);
            if (st) return st;
        }
    }
    return PDDE_OK;
}

/* Host buckets whose members all live on one device with streams and events copy on a second stream
 * of that device (copy_stream), beside its backward. PDDE_COPY_STREAM=1 for every such backend, 0 for
 * none; by default OpenCL's (the CUDA and Level Zero paths have not run on a GPU). */
static pdde_status session_copy_streams(pdde_session *s) {
    int mode = pdde_env_bool("PDDE_COPY_STREAM", -1);
    if (mode == 0 || !s->requests) return PDDE_OK;
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *b = s->order[i];
        const pdde_program_node *bi = &s->prog->info[b->id];
        if (!bi->own_buffer || !bi->bucket_next || (s->dcoll_buf && s->dcoll_buf[b->id])) continue;
        session_device *sd = copy_dev(s, b);
        const pdde_backend_iface *f = sd->iface;
        bool one = !sd->host && (mode > 0 || !strcmp(f->name, "opencl")) && IFACE_HAS(f, event_create) && IFACE_HAS(f, event_record) &&
                   IFACE_HAS(f, event_sync) && IFACE_HAS(f, stream_wait_event);
        for (pdde_tensor *m = bi->bucket_next; m && one; m = node_info(s, m)->bucket_next)
            one = &s->devs[s->slot[bucket_member_input(m)->id]] == sd && &s->devs[s->slot[m->id]] == sd;
        if (!one) continue;
        if (!s->copy_done && !(s->copy_done = calloc((size_t)s->prog->n + 1, sizeof *s->copy_done)))
            return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        pdde_status st = PDDE_OK;
        for (int k = 0; k < 2 && !st; k++)
            if (!sd->copy_ev[k]) st = f->event_create(sd->dev, &sd->copy_ev[k]);
        if (!st && !sd->copy_stream) st = f->stream_create(sd->dev, &sd->copy_stream);
        if (!st) st = f->event_create(sd->dev, &s->copy_done[b->id]);
        if (st) return st;
    }
    return PDDE_OK;
}

/* Bucket b's inputs in, and its collective: blocking, or started (its request kept for its first member). */
static pdde_status bucket_run(pdde_session *s, pdde_tensor *b, int micro, bool start) {
    pdde_status st = s->collective_path->pack(s, b, micro);
    if (st) return st;
    s->gradient_collectives++;
    return s->collective_path->collective(s, b, start ? (pdde_comm_request **)&s->requests[b->id] : NULL);
}

/* t's error st, what comm said after it (pdde_error formats before it stores: it may read its own text) */
static pdde_status comm_error(pdde_session *s, const pdde_tensor *t, pdde_status st, const char *what) {
    return pdde_error(s->ctx, st, "%s%s: %s", t->name, what, pdde_last_error(s->ctx));
}

static pdde_status bucket_error(pdde_session *s, pdde_tensor *t, const pdde_tensor *b, pdde_status st) {
    char what[sizeof b->name + 64];
    const char *of = b->op == PDDE_OP_ALLGATHER ? "parameter shards" : "gradients";
    int n = node_info(s, b)->bucket_members;
    if (t == b) snprintf(what, sizeof what, " (a gradient bucket of %d %s)", n, of);
    else snprintf(what, sizeof what, " (in gradient bucket %s of %d %s)", b->name, n, of);
    return comm_error(s, t, st, what);
}

/* The bucket node: an early one starts in the pass that starts early reductions (else its first
 * member runs it), a micro-batch's (ZeRO-2/3's reduce-scatters, in backward; its members one bucket
 * later: lower_buckets) starts in every pass, one at the update runs now. */
static pdde_status run_bucket(pdde_session *s, pdde_tensor *b, int micro) {
    bool early = node_info(s, b)->early, start = early || (b->phase == PDDE_PHASE_BACKWARD && s->requests);
    if (early && !s->early_starts) return PDDE_OK;
    pdde_status st = bucket_run(s, b, micro, start);
    if (st) return bucket_error(s, b, b, st);
    /* (no request: it was ordered on a device stream, or waits for its copies) */
    s->bucket_done[b->id] = !start || (!s->requests[b->id] && s->copy_pending != b);
    return PDDE_OK;
}

/* A member: its part of the bucket's result out (into its parameter, for a gather). */
static pdde_status run_bucket_member(pdde_session *s, pdde_tensor *m, int micro) {
    const pdde_program_node *in = node_info(s, m);
    pdde_tensor *b = in->bucket;
    pdde_comm_request **req = (pdde_comm_request **)&s->requests[b->id];
    pdde_tensor *pending;
    pdde_status st = copy_flush(s, &pending);
    if (st) return bucket_error(s, m, pending, st);
    if (!s->bucket_done[b->id] && *req) {
        st = pdde_comm_wait(*req, -1);
        if (st != PDDE_ERR_TIMEOUT) pdde_comm_request_free(*req), *req = NULL;
    } else if (!s->bucket_done[b->id]) {
        st = bucket_run(s, b, micro, false);
    }
    if (st) return bucket_error(s, m, b, st);
    s->bucket_done[b->id] = true;
    return s->collective_path->unpack(s, m);
}

static pdde_status bucket_unpack(pdde_session *s, pdde_tensor *m) {
    const pdde_program_node *in = node_info(s, m);
    pdde_tensor *b = in->bucket;
    pdde_status st = PDDE_OK;
    size_t esz = pdde_dtype_size(m->dtype), at = (size_t)in->bucket_offset * esz, block = (size_t)node_info(s, b)->bucket_block * esz;
    const char *result = host_bytes(b) + bucket_result_at(s, b);
    session_device *sd = &s->devs[s->slot[m->id]];
    /* on the copy stream: after what the device's stream did before (m's memory may be another
     * tensor's until then), and before what it does next (the update reads m) */
    session_device *cd = s->copy_done && s->copy_done[b->id] ? sd : NULL;
    void *stream = cd ? cd->copy_stream : sd->stream;
    if (cd && !(st = cd->iface->event_record(cd->dev, cd->copy_ev[0], cd->stream))) st = cd->iface->stream_wait_event(cd->dev, cd->copy_stream, cd->copy_ev[0]);
    if (m->op != PDDE_OP_ALLGATHER) {
        if (sd->host) memcpy(host_bytes(m), result + at, pdde_tensor_nbytes(m));
        else if (!st) st = sd->iface->write(sd->dev, stream, m->data, m->offset, result + at, pdde_tensor_nbytes(m)), s->stream_copies += cd != NULL;
    } else {
        size_t part = pdde_tensor_nbytes(bucket_member_input(m)); /* (the gathered parameter: m's memory) */
        for (int r = 0; r < pdde_comm_size(s->axis_comm[in->axis]) && !st; r++) {
            if (sd->host) memcpy(host_bytes(m) + (size_t)r * part, result + (size_t)r * block + at, part);
            else st = sd->iface->write(sd->dev, stream, m->data, m->offset + (size_t)r * part, result + (size_t)r * block + at, part), s->stream_copies += cd != NULL;
        }
    }
    /* (the bucket's buffer is reused once its members are out: a device's writes complete first; on a
     * copy stream, whose next reads into it come after them, the host touches it again only after those) */
    if (cd) return st || (st = cd->iface->event_record(cd->dev, cd->copy_ev[1], cd->copy_stream)) ? st : cd->iface->stream_wait_event(cd->dev, cd->stream, cd->copy_ev[1]);
    return st || sd->host ? st : device_sync(s, sd);
}

static void blocks_along(char *packed, char *x, const int64_t *xshape, int ndim, int dim, int n, size_t esz, bool pack);

/* The session's scratch for collective t's `bytes` packed rank by rank along a dim other than 0; NULL
 * (an error in ctx) where they exceed it: the session sized it at init for the program's largest
 * (program_gather_scratch_bytes), so a larger one is a bug in that sizing, not a reason to allocate. */
static char *gather_scratch(pdde_session *s, const pdde_tensor *t, size_t bytes) {
    if (bytes <= s->gather_scratch_bytes && s->gather_scratch) return s->gather_scratch;
    pdde_error(s->ctx, PDDE_ERR_STATE, "%s: its %zu bytes packed along dim %d exceed the gathers' scratch of %zu bytes (sized for the "
               "program's largest)", t->name, bytes, node_info(s, t)->dim, s->gather_scratch_bytes);
    return NULL;
}

/* A prefetched gather along a dim other than 0 arrived rank by rank (block r of the result at r x the
 * input's size): its blocks into their places along that dim. */
static pdde_status unpack_gathered(pdde_session *s, pdde_tensor *t) {
    size_t bytes = pdde_tensor_nbytes(t);
    char *out = (char *)t->data + t->offset, *tmp = gather_scratch(s, t, bytes);
    if (!tmp) return PDDE_ERR_STATE;
    memcpy(tmp, out, bytes);
    blocks_along(tmp, out, t->shape, t->ndim, node_info(s, t)->dim, pdde_comm_size(s->axis_comm[node_info(s, t)->axis]),
                 pdde_dtype_size(t->dtype), false);
    return PDDE_OK;
}

/* A prefetched gather into device memory, arrived in its host region (rank-major blocks): written into
 * the device, each block in its place along the gather's dim, ordered on the device's stream (the
 * region is filled again only after that stream is synchronized: start_gather). */
static pdde_status write_gathered(pdde_session *s, pdde_tensor *t) {
    const pdde_program_node *in = node_info(s, t);
    const pdde_tensor *x = t->src[0];
    session_device *td = &s->devs[s->slot[t->id]];
    const char *result = s->prefetch_staging + in->staging_offset + (s->devs[s->slot[x->id]].host ? 0 : pdde_tensor_nbytes(x));
    int n = pdde_comm_size(s->axis_comm[in->axis]);
    size_t esz = pdde_dtype_size(t->dtype);
    int64_t outer = 1, inner = 1, len = t->shape[in->dim] / n;
    for (int d = 0; d < in->dim; d++) outer *= t->shape[d];
    for (int d = in->dim + 1; d < t->ndim; d++) inner *= t->shape[d];
    s->prefetch_unsynced = td;
    if (in->dim == 0) return td->iface->write(td->dev, td->stream, t->data, t->offset, result, pdde_tensor_nbytes(t));
    pdde_status st = PDDE_OK;
    for (int r = 0; r < n && !st; r++)
        for (int64_t o = 0; o < outer && !st; o++)
            st = td->iface->write(td->dev, td->stream, t->data, t->offset + (size_t)((o * t->shape[in->dim] + r * len) * inner) * esz,
                                  result + (size_t)(r * outer * len * inner + o * len * inner) * esz, (size_t)(len * inner) * esz);
    return st;
}

/* COMM_WAIT completes the collective it reads (started early: overlap_gradient_reductions); if the
 * run did not start it, it runs it now. */
static pdde_status run_wait(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *c = t->src[0];
    pdde_comm_request **started = (pdde_comm_request **)&s->requests[c->id];
    if (!*started) {
        s->gradient_collectives += node_info(s, c)->data_parallel;
        return run_reshard(s, c);
    }
    pdde_status st = pdde_comm_wait(*started, -1);
    if (st != PDDE_ERR_TIMEOUT) pdde_comm_request_free(*started), *started = NULL;
    if (!st && node_info(s, c)->prefetch && !s->devs[s->slot[c->id]].host) st = write_gathered(s, c);
    else if (!st && node_info(s, c)->prefetch && node_info(s, c)->dim > 0) st = unpack_gathered(s, c);
    return st ? comm_error(s, t, st, "") : PDDE_OK;
}

/* After a failed run: requests still in flight are detached (they finish or fail on their own). */
static void drop_requests(pdde_session *s) {
    for (int i = 0; s->requests && i < s->prog->n; i++)
        if (s->requests[i]) pdde_comm_request_free(s->requests[i]), s->requests[i] = NULL;
}

/* Completes the sends to other pipeline stages (at the end of a step: their copies are reused next). */
static pdde_status wait_sends(pdde_session *s) {
    for (int i = 0; i < s->n_sends; i++)
        for (int k = 0; k < s->n_live; k++) {
            pdde_comm_request **req = (pdde_comm_request **)&s->sends[i].requests[k];
            if (!*req) continue;
            pdde_status st = pdde_comm_wait(*req, -1);
            if (st != PDDE_ERR_TIMEOUT) pdde_comm_request_free(*req), *req = NULL;
            /* (the first failure ends the step: the others are dropped, not each waited for in turn) */
            if (st) return comm_error(s, s->sends[i].node, st, " (sent in this step)");
        }
    return PDDE_OK;
}

static void drop_sends(pdde_session *s) {
    for (int i = 0; i < s->n_sends; i++)
        for (int k = 0; k < s->n_live; k++)
            if (s->sends[i].requests[k]) pdde_comm_request_free(s->sends[i].requests[k]), s->sends[i].requests[k] = NULL;
}

/* t's bytes into host memory (from a device through its stream). */
static pdde_status read_host(pdde_session *s, const pdde_tensor *t, void *dst) {
    session_device *sd = &s->devs[s->slot[t->id]];
    if (sd->host) { memcpy(dst, (const char *)t->data + t->offset, pdde_tensor_nbytes(t)); return PDDE_OK; }
    pdde_status st = sd->iface->read(sd->dev, sd->stream, t->data, t->offset, dst, pdde_tensor_nbytes(t));
    return st ? st : device_sync(s, sd);
}

/* Host bytes into t (synchronously: the caller may reuse src at once). */
static pdde_status write_host(pdde_session *s, pdde_tensor *t, const void *src) {
    session_device *sd = &s->devs[s->slot[t->id]];
    if (sd->host) { memcpy((char *)t->data + t->offset, src, pdde_tensor_nbytes(t)); return PDDE_OK; }
    pdde_status st = sd->iface->write(sd->dev, sd->stream, t->data, t->offset, src, pdde_tensor_nbytes(t));
    return st ? st : device_sync(s, sd);
}

/* RECV: from another stage's rank, into a device through host memory. */
static pdde_status run_recv(pdde_session *s, pdde_tensor *t) {
    session_device *sd = &s->devs[s->slot[t->id]];
    size_t count = (size_t)pdde_tensor_numel(t);
    const pdde_program_node *in = node_info(s, t);
    if (sd->host) return pdde_comm_recv(s->world, (char *)t->data + t->offset, count, t->dtype, in->peer, in->tag);
    void *buf = comm_staging(s, sd, pdde_tensor_nbytes(t));
    if (!buf) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: no host staging memory", t->name);
    pdde_status st = pdde_comm_recv(s->world, buf, count, t->dtype, in->peer, in->tag);
    return st ? st : write_host(s, t, buf);
}

/* SEND: the data to another stage's rank, copied out first (the arena is reused before it arrives). */
static pdde_status run_send(pdde_session *s, pdde_tensor *t, int micro) {
    struct session_send *ss = &s->sends[s->send_of[t->id]];
    int k = micro % s->n_live;
    size_t n = pdde_tensor_nbytes(t);
    pdde_comm_request **req = (pdde_comm_request **)&ss->requests[k];
    if (*req) { /* the copy of micro-batch micro - n_live: delivered long since, in every schedule */
        pdde_status st = pdde_comm_wait(*req, -1);
        if (st != PDDE_ERR_TIMEOUT) pdde_comm_request_free(*req), *req = NULL;
        if (st) return comm_error(s, t, st, "");
    }
    pdde_status st = read_host(s, t, ss->copy + (size_t)k * n);
    if (st) return st;
    return pdde_comm_isend(s->world, ss->copy + (size_t)k * n, (size_t)pdde_tensor_numel(t), t->dtype, node_info(s, t)->peer,
                           node_info(s, t)->tag, req);
}

/* Moves blocks along dim: packed[r] = x[..., r*len:(r+1)*len, ...] (pack) or the reverse (unpack);
 * elements of esz bytes. */
static void blocks_along(char *packed, char *x, const int64_t *xshape, int ndim, int dim, int n, size_t esz, bool pack) {
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= xshape[d];
    for (int d = dim + 1; d < ndim; d++) inner *= xshape[d];
    int64_t len = xshape[dim] / n, block = outer * len * inner;
    for (int r = 0; r < n; r++)
        for (int64_t o = 0; o < outer; o++) {
            char *p = packed + (size_t)(r * block + o * len * inner) * esz, *q = x + (size_t)((o * xshape[dim] + r * len) * inner) * esz;
            memcpy(pack ? p : q, pack ? q : p, (size_t)(len * inner) * esz);
        }
}

/* Split on dim from -> split on dim to, over communicator c of n ranks: block r of x along `to` goes to
 * rank r, and the block from rank r is block r of the output along `from`. Blocks along dim 0 are
 * already contiguous, so those sides need no packing. */
static pdde_status run_alltoall(pdde_session *s, pdde_comm *c, int n, const pdde_tensor *x, char *in, pdde_tensor *t, char *out) {
    int from = node_info(s, t)->dim, to = node_info(s, t)->split_dim;
    size_t esz = pdde_dtype_size(t->dtype), count = (size_t)pdde_tensor_numel(x) / (size_t)n;
    char *tmp = from == 0 && to == 0 ? NULL : malloc((size_t)n * count * esz * (from && to ? 2 : 1));
    if ((from || to) && !tmp) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
    char *send = to ? tmp : in, *recv = from ? (to ? tmp + (size_t)n * count * esz : tmp) : out;
    if (to) blocks_along(send, in, x->shape, x->ndim, to, n, esz, true);
    pdde_status st = pdde_comm_alltoall(c, send, recv, count, t->dtype);
    if (!st && from) blocks_along(recv, out, t->shape, t->ndim, from, n, esz, false);
    free(tmp);
    return st;
}

/* Expert parallelism's token exchange, dropless (an alltoall that lowering gave the expert ids, its
 * src[1]): the token side is [E, S, ...] (each expert's block of S rows, its first `count` rows this
 * rank's tokens routed there, the rest zeros), the expert side [E/n, n S, ...] (expert j's rows from
 * rank r at r S). Each rank counts its tokens per expert from its ids and sends every expert's owner
 * its counts first (an alltoall of E/n integers a rank); then an alltoallv carries only the routed
 * rows: to the experts (from = 1) or back to the tokens (from = 0). Rows nobody sent are zeros, as
 * the padded exchange would have carried: the experts' GEMMs and activations keep zero rows zero. */
static pdde_status run_alltoall_moe(pdde_session *s, pdde_comm *c, int n, const pdde_tensor *x, const char *in, pdde_tensor *t, char *out,
                                    const int32_t *id, int64_t nk) {
    bool to_experts = node_info(s, t)->dim == 1;
    const pdde_tensor *tok = to_experts ? x : t;
    int64_t E = tok->shape[0], S = tok->shape[1], El = E / n;
    size_t row = (size_t)(pdde_tensor_numel(tok) / (E * S > 0 ? E * S : 1)) * pdde_dtype_size(t->dtype);
    if (E % n || tok->ndim < 3) return pdde_error(s->ctx, PDDE_ERR_SHAPE, "%s: %lld experts over %d ranks", t->name, (long long)E, n);
    int32_t *cnt = calloc((size_t)(2 * E), sizeof *cnt), *rc = cnt + E; /* mine; for my experts, each rank's */
    size_t *a = malloc((size_t)4 * (size_t)n * sizeof *a), *sc = a, *sd = a + n, *rn = a + 2 * n, *rd = a + 3 * n;
    char *sbuf = NULL, *rbuf = NULL;
    pdde_status st = cnt && a ? PDDE_OK : pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
    for (int64_t i = 0; i < nk && !st; i++) {
        if (id[i] < 0 || id[i] >= E) st = pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "%s: expert id %d is not in 0..%lld", t->name, id[i], (long long)E - 1);
        else cnt[id[i]] += cnt[id[i]] < S; /* (past S: dropped by the dispatch) */
    }
    if (!st) st = pdde_comm_alltoall(c, cnt, rc, (size_t)El, PDDE_I32);
    size_t ns = 0, nr = 0;
    for (int q = 0; q < n && !st; q++) { /* rows sent to and received from rank q */
        sc[q] = rn[q] = 0;
        for (int64_t j = 0; j < El; j++) sc[q] += (size_t)(to_experts ? cnt[q * El + j] : rc[q * El + j]), rn[q] += (size_t)(to_experts ? rc[q * El + j] : cnt[q * El + j]);
        sd[q] = ns, rd[q] = nr, ns += sc[q], nr += rn[q];
    }
    if (!st && (ns * row > pdde_tensor_nbytes(x) || nr * row > pdde_tensor_nbytes(t) || !s->moe_exchange))
        st = pdde_error(s->ctx, PDDE_ERR_STATE, "%s: %zu rows out and %zu in exceed the exchange's buffers", t->name, ns, nr);
    if (!st) sbuf = s->moe_exchange, rbuf = s->moe_exchange + pdde_tensor_nbytes(x);
    int me = pdde_comm_rank(c);
    for (int q = 0; q < n && !st; q++) {
        char *p = sbuf + sd[q] * row;
        for (int64_t j = 0; j < El; j++) { /* to the experts: expert q El + j's block; back: rank q's rows of expert j */
            size_t k = (size_t)(to_experts ? cnt[q * El + j] : rc[q * El + j]);
            memcpy(p, in + (size_t)(to_experts ? (q * El + j) * S : j * n * S + q * S) * row, k * row), p += k * row;
        }
        s->exchanged_rows += q != me ? (int64_t)sc[q] : 0;
    }
    for (int q = 0; q < n && !st; q++) sc[q] *= row / pdde_dtype_size(t->dtype), sd[q] *= row / pdde_dtype_size(t->dtype),
                                       rn[q] *= row / pdde_dtype_size(t->dtype), rd[q] *= row / pdde_dtype_size(t->dtype);
    if (!st) st = pdde_comm_alltoallv(c, sbuf, sc, sd, rbuf, rn, rd, t->dtype);
    if (!st) memset(out, 0, pdde_tensor_nbytes(t));
    for (int q = 0; q < n && !st; q++) {
        const char *p = rbuf + rd[q] * pdde_dtype_size(t->dtype);
        for (int64_t j = 0; j < El; j++) {
            size_t k = (size_t)(to_experts ? rc[q * El + j] : cnt[q * El + j]);
            memcpy(out + (size_t)(to_experts ? j * n * S + q * S : (q * El + j) * S) * row, p, k * row), p += k * row;
        }
    }
    free(cnt), free(a);
    return st;
}

/* A reshard collective, blocking: allreduce, reduce-scatter, allgather or alltoall along tensor dims,
 * from in (x's data) to out (t's), both in host memory, over the group of the node's mesh axis. */
static pdde_status reshard_on_host(pdde_session *s, pdde_tensor *t, const pdde_tensor *x, char *in, char *out) {
    const pdde_program_node *info = node_info(s, t);
    pdde_comm *c = s->axis_comm[info->axis];
    int dim = info->dim, n = pdde_comm_size(c);
    size_t nin = (size_t)pdde_tensor_numel(x), nout = (size_t)pdde_tensor_numel(t), esz = pdde_dtype_size(t->dtype);
    if (t->op == PDDE_OP_ALLREDUCE) return pdde_comm_allreduce(c, in, out, nin, t->dtype, (pdde_reduce_op)info->reduce);
    if (t->op == PDDE_OP_ALLTOALL && t->nsrc > 1) {
        const pdde_tensor *ids = t->src[1];
        void *host = s->devs[s->slot[ids->id]].host ? NULL : malloc(pdde_tensor_nbytes(ids) + 1);
        pdde_status st = s->devs[s->slot[ids->id]].host ? PDDE_OK : host ? read_host(s, ids, host) : pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
        if (!st) st = run_alltoall_moe(s, c, n, x, in, t, out, host ? host : (const int32_t *)((const char *)ids->data + ids->offset), pdde_tensor_numel(ids));
        free(host);
        return st;
    }
    if (t->op == PDDE_OP_ALLTOALL) return run_alltoall(s, c, n, x, in, t, out);
    char *tmp = dim == 0 ? NULL : gather_scratch(s, t, (t->op == PDDE_OP_ALLGATHER ? nout : nin) * esz);
    if (dim != 0 && !tmp) return PDDE_ERR_STATE;
    pdde_status st;
    if (t->op == PDDE_OP_REDUCE_SCATTER) {
        if (tmp) blocks_along(tmp, in, x->shape, x->ndim, dim, n, esz, true);
        st = pdde_comm_reduce_scatter(c, tmp ? tmp : in, out, nout, t->dtype, (pdde_reduce_op)info->reduce);
    } else {
        st = pdde_comm_allgather(c, in, tmp ? tmp : out, nin, t->dtype);
        if (!st && tmp) blocks_along(tmp, out, t->shape, t->ndim, dim, n, esz, false);
    }
    return st;
}

/* A gradient reduction that lowering started early (host memory, no packing: only those are), started
 * without waiting; its COMM_WAIT completes it. */
static pdde_status start_reduction(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *x = t->src[0];
    const pdde_program_node *info = node_info(s, t);
    pdde_comm *c = s->axis_comm[info->axis];
    char *in = (char *)x->data + x->offset, *out = (char *)t->data + t->offset;
    pdde_comm_request **req = (pdde_comm_request **)&s->requests[t->id];
    s->gradient_collectives++;
    return t->op == PDDE_OP_ALLREDUCE
               ? pdde_comm_iallreduce(c, in, out, (size_t)pdde_tensor_numel(x), t->dtype, (pdde_reduce_op)info->reduce, req)
               : pdde_comm_ireduce_scatter(c, in, out, (size_t)pdde_tensor_numel(t), t->dtype, (pdde_reduce_op)info->reduce, req);
}

/* ZeRO-3's gather of a parameter that lowering starts a layer ahead, started without waiting in every
 * pass that runs it; its COMM_WAIT completes it (and puts the blocks of a gather along another dim than
 * 0 in their places). Device memory goes through the gather's host region: the shard is read out
 * (the device's stream synchronized: it is in the region before the collective reads it), and the
 * wait writes the result in (write_gathered). */
static pdde_status start_gather(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *x = t->src[0];
    pdde_comm_request **req = (pdde_comm_request **)&s->requests[t->id];
    session_device *xd = &s->devs[s->slot[x->id]], *td = &s->devs[s->slot[t->id]];
    char *in = (char *)x->data + x->offset, *out = (char *)t->data + t->offset;
    pdde_status st = PDDE_OK;
    if (!xd->host || !td->host) {
        char *region = s->prefetch_staging ? s->prefetch_staging + node_info(s, t)->staging_offset : NULL;
        if (!region) return pdde_error(s->ctx, PDDE_ERR_STATE, "%s: a prefetched gather on device memory without host staging", t->name);
        /* (an earlier gather's writes out of this region may be in flight on a device's stream) */
        session_device *pending = s->prefetch_unsynced;
        s->prefetch_unsynced = NULL;
        if (pending && (pending != xd || xd->host)) st = device_sync(s, pending);
        if (!xd->host) {
            in = region;
            if (!st) st = xd->iface->read(xd->dev, xd->stream, x->data, x->offset, in, pdde_tensor_nbytes(x));
            if (!st) st = device_sync(s, xd);
        }
        if (!td->host) out = region + (xd->host ? 0 : pdde_tensor_nbytes(x));
    }
    if (!st) st = pdde_comm_iallgather(s->axis_comm[node_info(s, t)->axis], in, out, (size_t)pdde_tensor_numel(x), t->dtype, req);
    return st ? comm_error(s, t, st, " (prefetched)") : PDDE_OK;
}

/* A reshard, blocking; on device memory through host memory (the transport reads host buffers). */
static pdde_status run_reshard(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *x = t->src[t->op == PDDE_OP_ALLGATHER ? t->nsrc - 1 : 0]; /* (a write-back allgather reads its second input) */
    if (s->devs[s->slot[x->id]].host && s->devs[s->slot[t->id]].host)
        return reshard_on_host(s, t, x, (char *)x->data + x->offset, (char *)t->data + t->offset);
    size_t nx = pdde_tensor_nbytes(x), nt = pdde_tensor_nbytes(t);
    char *buf = comm_staging(s, &s->devs[s->slot[t->id]], nx + nt);
    if (!buf) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: no host staging memory (%zu bytes)", t->name, nx + nt);
    pdde_status st = read_host(s, x, buf);
    if (!st) st = reshard_on_host(s, t, x, buf, buf + nx);
    return st ? st : write_host(s, t, buf + nx);
}

/* A cross-entropy (or its backward) whose logits [N, V/n] are this rank's columns [first, first + V/n)
 * of the vocab, split over the mesh axis vocab_axis (lowering's vocab-parallel form): Megatron's
 * vocab-parallel cross-entropy. Per row: the max over the whole vocab (allreduce MAX), then the sum of
 * exp(l - max) and the target's logit where this rank holds it, 0 elsewhere (one allreduce SUM of
 * both); loss = mean over the rows with a target of log(sum) + max - target logit: rows, not [N, V]
 * logits, cross the wire. The backward recomputes the two reductions rather than keeping them from the
 * forward: micro-batches run through per-micro-batch arenas, and recomputing needs no storage that
 * outlives a node. Host code of the executor rather than CPU kernels: the row statistics interleave
 * with collectives on the axis communicator, which backends never see, and SPMD runs on host memory. */
static pdde_status run_cross_entropy_vocab(pdde_session *s, pdde_tensor *t) {
    const pdde_tensor *lt = t->src[0];
    int64_t N = lt->shape[0], V = lt->shape[1], first = pdde_op_i32(t, PDDE_P_VOCAB_FIRST), vocab = pdde_op_i32(t, PDDE_P_VOCAB_SIZE);
    const float *logits = (const float *)((const char *)lt->data + lt->offset);
    const int32_t *tg = (const int32_t *)((const char *)t->src[1]->data + t->src[1]->offset);
    pdde_comm *c = s->axis_comm[node_info(s, t)->vocab_axis];
    for (int64_t r = 0; t->op == PDDE_OP_CROSS_ENTROPY && r < N; r++) /* (every rank of the axis holds these targets) */
        if (tg[r] >= vocab)
            return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "%s: target %d at position %lld is outside the %lld classes of %s [0, %lld)",
                              t->name, tg[r], (long long)r, (long long)vocab, lt->name, (long long)vocab);
    float *mx = calloc((size_t)(3 * N + 1), sizeof *mx), *sum = mx + N, *target = sum + N; /* sum, target: one allreduce */
    if (!mx) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
    for (int64_t r = 0; r < N; r++) {
        const float *row = logits + r * V;
        float m = -INFINITY;
        for (int64_t i = 0; i < V; i++) m = row[i] > m ? row[i] : m;
        mx[r] = m;
    }
    pdde_status st = pdde_comm_allreduce(c, mx, mx, (size_t)N, PDDE_F32, PDDE_REDUCE_MAX);
    int64_t count = 0;
    for (int64_t r = 0; r < N && !st; r++) {
        const float *row = logits + r * V;
        float e = 0;
        for (int64_t i = 0; i < V; i++) e += exp_fast(row[i] - mx[r]);
        sum[r] = e;
        target[r] = tg[r] >= first && tg[r] < first + V ? row[tg[r] - first] : 0.0f;
        count += tg[r] >= 0 && tg[r] < vocab;
    }
    if (!st) st = pdde_comm_allreduce(c, sum, sum, (size_t)(2 * N), PDDE_F32, PDDE_REDUCE_SUM);
    if (st) {
        free(mx);
        return comm_error(s, t, st, "");
    }
    float *out = (float *)((char *)t->data + t->offset);
    if (t->op == PDDE_OP_CROSS_ENTROPY) {
        double loss = 0;
        for (int64_t r = 0; r < N; r++)
            if (tg[r] >= 0 && tg[r] < vocab) loss += logf(sum[r]) + mx[r] - target[r];
        out[0] = (float)(loss / pdde_ce_divisor(t, count ? count : 1));
    } else { /* dlogits = (softmax - onehot) * dloss / count, on this rank's columns */
        const pdde_tensor *dl = t->src[2];
        float dscale = ((const float *)((const char *)dl->data + dl->offset))[0] / (float)pdde_ce_divisor(t, count ? count : 1);
        for (int64_t r = 0; r < N; r++) {
            float *d = out + r * V;
            const float *row = logits + r * V;
            if (tg[r] < 0 || tg[r] >= vocab) { memset(d, 0, (size_t)V * sizeof *d); continue; }
            float lse = mx[r] + logf(sum[r]);
            for (int64_t i = 0; i < V; i++) d[i] = exp_fast(row[i] - lse) * dscale;
            if (tg[r] >= first && tg[r] < first + V) d[tg[r] - first] -= dscale;
        }
    }
    free(mx);
    return PDDE_OK;
}

/* One communicator per axis of the graph's mesh: the ranks whose other coordinates agree (the groups
 * of the programs lowering makes). Made before lowering, which may fail on some ranks only: every rank
 * takes part in these collective calls first. */
static pdde_status session_split_world(pdde_session *s) {
    const struct planner_graph *pg = s->g->planner;
    if (!pg || !pg->mesh || !pg->n_completed) return PDDE_OK; /* (lowering says what is missing) */
    const pdde_mesh *mesh = pg->mesh;
    int coords[PDDE_MAX_MESH_DIMS], rank = pdde_comm_rank(s->world);
    if (pdde_comm_size(s->world) != mesh->n_ranks)
        return pdde_error(s->ctx, PDDE_ERR_DIST_ATTR, "session: the mesh has %d ranks, the world %d", mesh->n_ranks, pdde_comm_size(s->world));
    pdde_status st = pdde_mesh_coords(mesh, rank, coords);
    if (st) return pdde_error(s->ctx, st, "session: rank %d is not in the graph's mesh", rank);
    for (int a = 0; a < mesh->ndim && !st; a++) st = pdde_comm_split(s->world, mesh_axis_color(mesh, coords, a), coords[a], &s->axis_comm[a]);
    return st;
}
#endif

/* The memory plan (planner/memplan.c, which the cost model's prediction shares): each node's offset,
 * each device's persistent buffer and activation arena. */
static pdde_status session_plan_memory(pdde_session *s, bool reuse) {
    program_memory m;
    pdde_status st = program_plan_memory(s->ctx, s->prog, reuse, &m);
    if (st) return st;
    if (m.n_devs != s->n_devs) { /* (both open devices in the order the nodes first use them) */
        program_memory_free(&m);
        return pdde_error(s->ctx, PDDE_ERR_STATE, "session: the memory plan has %d devices, the session %d", m.n_devs, s->n_devs);
    }
    for (int d = 0; d < m.n_devs; d++) {
        s->devs[d].persist_bytes = m.devs[d].persist_bytes;
        s->devs[d].arena_bytes = m.devs[d].arena_bytes;
    }
    for (int i = 0; s->input_base && i < s->n_order; i++) {
        const pdde_tensor *t = s->order[i];
        if (is_persistent(t) && (t->flags & PDDE_TENSOR_INPUT)) s->input_base[t->id] = t->offset;
    }
    s->mem = m.stats;
    free(s->overwritten);
    s->overwritten = m.overwritten, m.overwritten = NULL;
    s->mem.allocated_bytes = s->mem.persistent_allocated_bytes = s->mem.transfer_bytes = 0; /* counted as allocated */
    program_memory_free(&m);
    return PDDE_OK;
}

#define SPLITMIX64_STEP 0x9E3779B97F4A7C15ull /* what each call adds to the state */

/* Deterministic initial values: a per-tensor stream (seed, name), so a parameter's initial value
 * does not depend on the order the model was built in. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += SPLITMIX64_STEP);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

/* Elements [first, first + n) of a parameter's normal(0, std) stream, into out. Element g is the cosine
 * (g even) or sine (g odd) of Box-Muller pair g / 2, which takes the stream's calls 2(g/2) and 2(g/2)+1;
 * splitmix64's state is a counter, so any pair is computed directly, without the elements before it. */
static void normal_values(uint64_t stream, int64_t first, int64_t n, float std, float *out) {
    for (int64_t g = first; g < first + n;) {
        uint64_t state = stream + (uint64_t)(g / 2) * 2 * SPLITMIX64_STEP;
        double u1 = ((splitmix64(&state) >> 11) + 1.0) / 9007199254740993.0;
        double u2 = (splitmix64(&state) >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1));
        if (g % 2 == 0) out[g++ - first] = std * (float)(r * cos(2 * M_PI * u2));
        if (g < first + n) out[g++ - first] = std * (float)(r * sin(2 * M_PI * u2));
    }
}

/* A parameter's initial values are those of the whole (one-process) tensor, so a rank holding a block
 * of a split parameter (tensor parallel, ZeRO-3) starts from that block of the one-process model: each
 * local element takes the stream's value at its global index. The block's offset along a split dim is
 * the local size times this rank's coordinate on the mesh axis it is split over; within a run of local
 * elements that are consecutive globally (the dims from the innermost split one on), indexes follow. */
static void init_param_normal(const pdde_program *P, const pdde_tensor *t, uint64_t stream, float std, float *f) {
    int64_t n = pdde_tensor_numel(t), gshape[PDDE_MAX_DIMS], first[PDDE_MAX_DIMS] = {0};
    int coords[PDDE_MAX_MESH_DIMS], inner = -1;
    bool split = P->mesh && t->dist.mesh && pdde_mesh_coords(t->dist.mesh, P->rank, coords) == PDDE_OK;
    for (int d = 0; d < t->ndim; d++) {
        int ax = split && d < t->dist.ndim ? t->dist.dims_mapping[d] : -1;
        gshape[d] = ax >= 0 ? t->shape[d] * t->dist.mesh->shape[ax] : t->shape[d];
        first[d] = ax >= 0 ? t->shape[d] * coords[ax] : 0;
        if (ax >= 0) inner = d;
    }
    int64_t run = 1; /* local elements consecutive in the global tensor */
    for (int d = inner < 0 ? 0 : inner; d < t->ndim; d++) run *= t->shape[d];
    for (int64_t i = 0; i < n && run > 0; i += run) {
        int64_t g = 0, rest = i; /* the global index of local element i */
        for (int d = 0; d < t->ndim; d++) {
            int64_t below = 1;
            for (int e = d + 1; e < t->ndim; e++) below *= t->shape[e];
            g = g * gshape[d] + first[d] + rest / below, rest %= below;
        }
        normal_values(stream, g, run, std, f + i);
    }
}

static void init_leaf_values(const pdde_context *ctx, const pdde_program *P, const pdde_tensor *t, void *host) {
    int64_t n = pdde_tensor_numel(t);
    memset(host, 0, pdde_tensor_nbytes(t));
    if (t->dtype != PDDE_F32) return;
    float *f = host, v = pdde_op_f32(t, (t->flags & PDDE_TENSOR_CONST) ? PDDE_P_CONST_VALUE : PDDE_P_PARAM_INIT_STD);
    if (t->flags & PDDE_TENSOR_CONST) {
        for (int64_t i = 0; i < n; i++) f[i] = v;
    } else if (t->flags & PDDE_TENSOR_PARAM) {
        if (v < 0) for (int64_t i = 0; i < n; i++) f[i] = 1.0f;
        else if (v > 0) init_param_normal(P, t, ctx->seed ^ hash_name(t->name), v, f);
    }
}

#include "memory_admission.c"

/* What the session of params would hold on rank `rank` (pdde.h): its memory plan, with the buckets
 * device collectives would serve in device buffers instead of host ones (session_device_buckets;
 * given that the implementation initialises). */
pdde_status pdde_predict_memory(const pdde_graph *g, const pdde_session_params *params, int world_size, int rank, pdde_memory_stats *out) {
    if (!g || !out) return PDDE_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    const pdde_device_collectives_iface *dc = NULL;
    pdde_program *P;
    pdde_status st = PDDE_OK;
#ifdef PDDE_HAVE_COMM
    if (world_size > 0) st = session_device_collectives(g->ctx, params, &dc);
#endif
    if (!st) st = program_lower_rank(g, params, world_size, rank, &P);
    if (st) return st;
    program_memory m;
    st = program_plan_memory(g->ctx, P, !(params && params->no_memory_reuse), &m);
    if (!st) *out = m.stats;
    for (int i = 0; !st && dc && i < P->n_order; i++) {
        const pdde_tensor *b = P->order[i];
        if (!program_device_bucket_served(g->ctx, P, b, dc)) continue;
        out->allocated_bytes += pdde_tensor_nbytes(b);
        out->transfer_bytes -= pdde_tensor_nbytes(b) + 1;
    }
    program_memory_free(&m);
    program_free(P);
    return st;
}
static pdde_status session_allocate(pdde_session *s) {
    pdde_status st = PDDE_OK;
    for (int d = 0; d < s->n_devs && st == PDDE_OK; d++) {
        session_device *sd = &s->devs[d];
        if (!(sd->arenas = calloc((size_t)s->n_live, sizeof *sd->arenas))) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        size_t arena = sd->arena_bytes ? sd->arena_bytes : PDDE_ARENA_ALIGN, persist = sd->persist_bytes ? sd->persist_bytes : PDDE_ARENA_ALIGN;
        for (int k = 0; k < s->n_live && st == PDDE_OK; k++)
            if ((st = sd->iface->buffer_alloc(sd->dev, arena, &sd->arenas[k])) == PDDE_OK) s->mem.allocated_bytes += arena;
        sd->arena = sd->arenas[0];
        if (st == PDDE_OK) st = sd->iface->buffer_alloc(sd->dev, persist, &sd->persist);
        if (st == PDDE_OK) s->mem.allocated_bytes += persist, s->mem.persistent_allocated_bytes += persist;
        if (st == PDDE_OK && sd->host) memset(sd->persist, 0, sd->persist_bytes); /* alignment gaps too */
    }
    if (st != PDDE_OK) return st;
    size_t max_leaf = 0;
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *t = s->order[i];
        session_device *sd = &s->devs[s->slot[t->id]];
        if (is_root_sharing(t)) {
            pdde_tensor *r = storage_root(t);
            t->data = r->data, t->offset = r->offset + storage_offset_in_root(t);
        } else {
            t->data = is_persistent(t) ? sd->persist : sd->arena;
        }
        if (is_persistent(t) && pdde_tensor_nbytes(t) > max_leaf) max_leaf = pdde_tensor_nbytes(t);
        if (t->flags & PDDE_TENSOR_LOSS) s->loss = t;
        if (s->prog->info[t->id].grad_into) s->n_direct++;
    }
    s->direct_x = calloc((size_t)s->n_direct + 1, sizeof *s->direct_x), s->direct_offset = calloc((size_t)s->n_direct + 1, sizeof *s->direct_offset);
    if (!s->direct_x || !s->direct_offset) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    for (int i = 0, k = 0; i < s->n_order; i++)
        if (s->prog->info[s->order[i]->id].grad_into) s->direct_x[k] = s->order[i], s->direct_offset[k++] = s->order[i]->offset;
    s->grads_zero = true; /* (the leaves' initial values) */
    /* leaves get their initial values through one host buffer */
    void *host = malloc(max_leaf ? max_leaf : 1);
    if (!host) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *t = s->order[i];
        if (!is_persistent(t)) continue;
        session_device *sd = &s->devs[s->slot[t->id]];
        init_leaf_values(s->ctx, s->prog, t, host);
        st = sd->iface->write(sd->dev, sd->stream, t->data, t->offset, host, pdde_tensor_nbytes(t));
        if (st == PDDE_OK) st = device_sync(s, sd);
    }
    free(host);
    /* host bounce buffers for copies between two non-host devices or out of the host arena */
    s->staging = calloc((size_t)s->prog->n, sizeof *s->staging);
    s->send_of = calloc((size_t)s->prog->n, sizeof *s->send_of);
    s->update_group = calloc((size_t)s->n_order + 1, sizeof *s->update_group);
    if (!s->staging || !s->send_of || !s->update_group) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *t = s->order[i];
        if (t->op != PDDE_OP_COPY || s->devs[s->slot[t->id]].host) continue;
        if (!(s->staging[t->id] = malloc(pdde_tensor_nbytes(t) + 1))) st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        else s->mem.transfer_bytes += pdde_tensor_nbytes(t) + 1;
    }
    /* sends between pipeline stages: a host copy per live micro-batch */
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *t = s->order[i];
        if (t->op != PDDE_OP_SEND) continue;
        struct session_send *more = realloc(s->sends, (size_t)(s->n_sends + 1) * sizeof *more);
        if (more) s->sends = more;
        struct session_send *ss = more ? &s->sends[s->n_sends] : NULL;
        if (ss) ss->copy = malloc(pdde_tensor_nbytes(t) * (size_t)s->n_live + 1), ss->requests = calloc((size_t)s->n_live, sizeof *ss->requests);
        if (!ss || !ss->copy || !ss->requests) {
            if (ss) free(ss->copy), free(ss->requests);
            st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        } else {
            ss->node = t, s->send_of[t->id] = s->n_sends++;
            s->mem.transfer_bytes += pdde_tensor_nbytes(t) * (size_t)s->n_live + 1;
        }
    }
    /* the expert exchange (an alltoall with the expert ids): its rows sent and received, at most the
     * padded buffers it reads and writes, whatever the routing (planner/memplan.c counts the same) */
    size_t exchange = 0;
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *t = s->order[i];
        size_t b = t->op == PDDE_OP_ALLTOALL && t->nsrc > 1 ? pdde_tensor_nbytes(t->src[0]) + pdde_tensor_nbytes(t) + 1 : 0;
        if (b > exchange) exchange = b;
    }
    if (exchange && st == PDDE_OK) {
#ifdef PDDE_HAVE_COMM
        /* registered memory: the exchange's peers on this host read the rows sent to them with one copy,
         * no system call (comm/buffer.c); plain memory where it cannot be had */
        void *reg = NULL;
        if (pdde_comm_buffer_alloc(s->world, exchange, &reg) == PDDE_OK) s->moe_exchange = reg, s->moe_exchange_registered = true;
#endif
        if (!s->moe_exchange && !(s->moe_exchange = malloc(exchange)))
            st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory (the expert exchange, %zu bytes)", exchange);
        else s->mem.transfer_bytes += exchange;
    }
#ifdef PDDE_HAVE_COMM
    /* gradient buckets of device tensors: host buffers of their own, page-locked where the members'
     * backend can give them (its copies then go by DMA), else malloc'ed */
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *b = s->order[i];
        const pdde_program_node *bi = &s->prog->info[b->id];
        if (!bi->own_buffer) continue;
        struct session_own_buffer *more = realloc(s->own_buffers, (size_t)(s->n_own_buffers + 1) * sizeof *more);
        if (!more) { st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory"); break; }
        s->own_buffers = more;
        struct session_own_buffer *ob = &more[s->n_own_buffers];
        size_t n = pdde_tensor_nbytes(b);
        ob->sd = &s->devs[s->slot[bucket_member_input(bi->bucket_next)->id]], ob->p = NULL;
        ob->pinned = IFACE_HAS(ob->sd->iface, host_alloc) && ob->sd->iface->host_alloc(ob->sd->dev, n, &ob->p) == PDDE_OK && ob->p;
        if (!ob->pinned && !(ob->p = malloc(n + 1))) { st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory (a bucket of %zu bytes)", n); break; }
        s->n_own_buffers++;
        b->data = ob->p, b->offset = 0;
        s->mem.transfer_bytes += n + 1;
    }
    /* the bounce buffer of collectives and receives on device memory outside buckets: as large as the
     * largest (the memory plan's figure), pinned by that one's device where it can be */
    int staging_device = -1;
    size_t staging = st == PDDE_OK ? program_comm_staging_bytes(s->ctx, s->prog, &staging_device) : 0;
    for (int d = 0; staging && d < s->n_devs; d++) {
        if (s->devs[d].device != staging_device) continue;
        if (!comm_staging(s, &s->devs[d], staging)) st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory (host staging of %zu bytes)", staging);
        break;
    }
    /* ZeRO-3's prefetched gathers: the host regions of those with device memory (pinned by the first's
     * device); and the blocks' scratch of gathers and reduce-scatters along another dim than 0 */
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *t = s->order[i];
        const pdde_program_node *in = node_info(s, t);
        if (t->op != PDDE_OP_ALLGATHER || !in->prefetch) continue;
        session_device *xd = &s->devs[s->slot[t->src[0]->id]], *td = &s->devs[s->slot[t->id]];
        if ((xd->host && td->host) || s->prefetch_staging_dev || !s->prog->prefetch_staging_bytes) continue;
        session_device *sd = td->host ? xd : td;
        size_t n = s->prog->prefetch_staging_bytes;
        void *p = NULL;
        bool pinned = IFACE_HAS(sd->iface, host_alloc) && sd->iface->host_alloc(sd->dev, n, &p) == PDDE_OK && p;
        if (!pinned && !(p = malloc(n))) st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory (ZeRO-3's prefetch staging of %zu bytes)", n);
        s->prefetch_staging = p, s->prefetch_staging_dev = sd, s->prefetch_staging_pinned = pinned, s->mem.transfer_bytes += p ? n : 0;
    }
    s->gather_scratch_bytes = st == PDDE_OK ? program_gather_scratch_bytes(s->prog) : 0;
    if (st == PDDE_OK && s->gather_scratch_bytes && !(s->gather_scratch = malloc(s->gather_scratch_bytes)))
        st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory (a gather's scratch of %zu bytes)", s->gather_scratch_bytes);
    s->mem.transfer_bytes += s->gather_scratch ? s->gather_scratch_bytes : 0;
#endif
    return st;
}

/* Micro-batches and pipeline stages, as lowering scheduled them; with several micro-batches (or several
 * alive at once) tensors are pointed at a micro-batch's memory before each node runs. */
static pdde_status session_setup_micro(pdde_session *s) {
    const pdde_program *P = s->prog;
    s->n_micro = P->n_micro, s->n_stages = P->n_stages, s->n_chunks = P->n_chunks, s->n_live = P->n_live;
    s->bind = s->n_micro > 1 || s->n_live > 1;
    if (s->bind && !(s->input_base = calloc((size_t)P->n + 1, sizeof *s->input_base)))
        return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    return PDDE_OK;
}

static void scaler_init(pdde_session *s);
static pdde_status scaler_write(pdde_session *s);

#ifdef PDDE_HAVE_COMM
/* Gradient buckets, early (overlapped) reductions and ZeRO-3's prefetched gathers take host memory
 * only, so a rank whose
 * data-parallel gradients live on a device reduces them one by one at the update; its peers must issue
 * the same collectives in the same order. Where the ranks of an axis group differ in that (a CPU rank
 * beside a PoCL rank), every rank of the world lowers again without buckets and early reductions.
 * Every rank takes part, also one whose lowering failed (lowered false: it only listens). */
static pdde_status session_agree_collectives(pdde_session *s, pdde_graph *g, pdde_lower_params *lp, bool lowered) {
    const struct planner_graph *pg = g->planner;
    unsigned axes = lowered ? s->prog->device_collective_axes : 0;
    float differ = 0;
    pdde_status st = PDDE_OK;
    for (int a = 0; pg && pg->mesh && a < pg->mesh->ndim && !st; a++) {
        float bit = (float)((axes >> a) & 1u), v[2] = {bit, -bit}; /* (max, -min) */
        if (s->axis_comm[a] && !(st = pdde_comm_allreduce(s->axis_comm[a], v, v, 2, PDDE_F32, PDDE_REDUCE_MAX))) differ += v[0] != -v[1];
    }
    if (!st) st = pdde_comm_allreduce(s->world, &differ, &differ, 1, PDDE_F32, PDDE_REDUCE_MAX);
    if (st || differ == 0 || !lowered) return st; /* (the communicator said why) */
    program_free(s->prog), s->prog = NULL;
    lp->gradient_bucket_bytes = -1, lp->overlap_gradients = false, lp->no_zero3_prefetch = true;
    return program_lower(g, lp, &s->prog);
}
#endif

pdde_status pdde_session_init(pdde_graph *g, const pdde_session_params *params, pdde_session **out) {
    if (!g || !out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    if (g->status) return g->status;
    if (g->n == 0) return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "session: the graph is empty");
    if (g->session) return pdde_error(g->ctx, PDDE_ERR_STATE, "session: the graph has a live session; free it first");
    pdde_status names = graph_check_leaf_names(g);
    if (names) return names;
    pdde_session_params p = PDDE_SESSION_PARAMS_INIT;
    if (params) p = *params;
    pdde_session *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(g->ctx, PDDE_ERR_OOM, "session: out of memory");
    s->ctx = g->ctx;
    s->g = g;
    s->last_loss = NAN;
    s->schedule = g->opt;
    static const char *const profiles[] = {"0", "1", "device"}; /* off; host times per op; the device's own, with bounds */
    int profile = pdde_env_choice("PDDE_PROFILE", profiles, 3, 0);
    s->profile = profile == 1;
    s->check_nonfinite = pdde_env_bool("PDDE_CHECK_NONFINITE", 0);
    pdde_lower_params lp = {0, 0, p.device, p.layer_devices, p.n_layer_devices, p.pipeline_schedule, p.comm_dtype, p.overlap_gradients > 0, false,
                            p.gradient_bucket_bytes, NULL, false, false};
    lp.no_cpu_fallback = program_no_cpu_fallback(&p);
    pdde_status st = PDDE_OK;
    if (p.world) {
#ifdef PDDE_HAVE_COMM
        s->world = p.world;
        lp.world_size = pdde_comm_size(p.world), lp.rank = pdde_comm_rank(p.world);
        int hosts = pdde_comm_host_count(p.world) > 0 ? pdde_comm_host_count(p.world) : 1;
        lp.host_busy = lower_host_busy(hosts, lp.world_size, g->ctx->n_threads);
        if (p.overlap_gradients == 0) lp.overlap_gradients = lower_overlap_auto(lp.host_busy);
#else
        st = pdde_error(g->ctx, PDDE_ERR_UNAVAILABLE, "session: SPMD execution needs pdde built with UCX (comm/)");
#endif
    }
#ifdef PDDE_HAVE_COMM
    if (st == PDDE_OK && s->world) st = session_agree_program(g, &p, s->world); /* (before any other collective) */
    if (st == PDDE_OK && s->world) st = session_split_world(s);
    bool agree_started = st == PDDE_OK && s->world; /* (the ranks' failures after here are their own) */
#endif
    if (st == PDDE_OK) st = program_lower(g, &lp, &s->prog);
#ifdef PDDE_HAVE_COMM
    if (s->world && (lp.gradient_bucket_bytes >= 0 || lp.overlap_gradients || !lp.no_zero3_prefetch)) {
        pdde_status agreed = session_agree_collectives(s, g, &lp, st == PDDE_OK);
        if (st == PDDE_OK) st = agreed;
    }
#endif
    if (st == PDDE_OK) st = trace_open(s, p.trace);
    if (st == PDDE_OK && s->prog->n_fallback)
        pdde_log(PDDE_LOG_INFO, "pdde: %d node%s run on the CPU, with copies: their devices do not run %s\n", s->prog->n_fallback,
                s->prog->n_fallback == 1 ? "" : "s", s->prog->fallback);
    if (st == PDDE_OK && profile == 2) st = profile_want(s, p.cluster);
    if (st == PDDE_OK) st = session_place(s);
    if (st == PDDE_OK && s->devprof) st = profile_open(s);
#ifdef PDDE_HAVE_COMM
    if (st == PDDE_OK && s->world && (!(s->requests = calloc((size_t)s->prog->n + 1, sizeof *s->requests)) ||
                                      !(s->bucket_done = calloc((size_t)s->prog->n + 1, sizeof *s->bucket_done))))
        st = pdde_error(g->ctx, PDDE_ERR_OOM, "session: out of memory");
    s->collective_path = &collective_path_staged;
#endif
    if (st == PDDE_OK) st = session_setup_micro(s);
    if (st == PDDE_OK) st = session_plan_memory(s, !p.no_memory_reuse);
    if (st == PDDE_OK) st = session_admit(s, &p);
    if (st == PDDE_OK) st = session_allocate(s);
#ifdef PDDE_HAVE_COMM
    if (agree_started) st = session_agree_started(g->ctx, s->world, st); /* (before the collectives of the device buckets) */
    if (st == PDDE_OK && s->world) st = session_device_buckets(s, &p);
    if (st == PDDE_OK && s->world) st = session_copy_streams(s);
#endif
    if (st != PDDE_OK) {
        pdde_session_free(s);
        return st;
    }
    scaler_init(s);
    if (s->loss_scaling && (st = scaler_write(s))) {
        pdde_session_free(s);
        return st;
    }
    g->session = s;
    *out = s;
    return PDDE_OK;
}

#include "trace.c"

void pdde_session_free(pdde_session *s) {
    if (!s) return;
    if (s->profile) print_profile(s);
    if (s->devprof) profile_print(s), profile_free(s);
    trace_close(s); /* (before the program: events name its nodes) */
    pdde_graph *g = s->g;
    if (g->session == s) g->session = NULL;
    free(s->zeros);
#ifdef PDDE_HAVE_COMM /* first: they point into the device buffers freed below */
    drop_requests(s);
    drop_sends(s);
    comm_staging_free(s);
    if (s->prefetch_unsynced) device_sync(s, s->prefetch_unsynced); /* (its writes read the staging) */
    if (s->prefetch_staging_pinned) s->prefetch_staging_dev->iface->host_free(s->prefetch_staging_dev->dev, s->prefetch_staging);
    else free(s->prefetch_staging);
    free(s->gather_scratch);
    for (int i = 0; s->dcoll_buf && i < s->n_order; i++) {
        int id = s->order[i]->id;
        struct session_dstream *ds = &s->dcoll_ds[id];
        if (s->dcoll_buf[id]) {
            session_device *sd = dbucket_dev(s, s->order[i]);
            sd->iface->stream_sync(sd->dev, ds->stream ? ds->stream : sd->stream); /* (a collective still on the stream uses it) */
            sd->iface->buffer_free(sd->dev, s->dcoll_buf[id]);
        }
        for (int k = 0; ds->ev && k < 3; k++)
            if (ds->ev[k]) ds->sd->iface->event_free(ds->sd->dev, ds->ev[k]);
        if (ds->stream) ds->sd->iface->stream_free(ds->sd->dev, ds->stream);
        if (ds->ev) free(ds->ev);
    }
    free(s->dcoll_buf), free(s->dcoll_ds);
    for (int a = 0; a < PDDE_MAX_MESH_DIMS; a++)
        if (s->dcoll_impl[a]) s->dcoll->free(s->dcoll_impl[a]);
    for (int d = 0; d < s->n_devs; d++) { /* (copies still in flight use the buckets' buffers) */
        session_device *sd = &s->devs[d];
        if (sd->copy_stream) sd->iface->stream_sync(sd->dev, sd->copy_stream), sd->iface->stream_free(sd->dev, sd->copy_stream);
        for (int k = 0; k < 2; k++)
            if (sd->copy_ev[k]) sd->iface->event_free(sd->dev, sd->copy_ev[k]);
    }
    for (int i = 0; s->copy_done && i < s->n_order; i++)
        if (s->copy_done[s->order[i]->id]) copy_dev(s, s->order[i])->iface->event_free(copy_dev(s, s->order[i])->dev, s->copy_done[s->order[i]->id]);
    free(s->copy_done);
    for (int i = 0; i < s->n_own_buffers; i++) {
        struct session_own_buffer *ob = &s->own_buffers[i];
        if (ob->pinned) ob->sd->iface->host_free(ob->sd->dev, ob->p);
        else free(ob->p);
    }
    free(s->own_buffers);
    for (int a = 0; a < PDDE_MAX_MESH_DIMS; a++) pdde_comm_free(s->axis_comm[a]);
#endif
    for (int d = 0; d < s->n_devs; d++) {
        session_device *sd = &s->devs[d];
        for (int k = 0; sd->arenas && k < s->n_live; k++)
            if (sd->arenas[k]) sd->iface->buffer_free(sd->dev, sd->arenas[k]);
        free(sd->arenas);
        if (sd->persist) sd->iface->buffer_free(sd->dev, sd->persist);
        if (sd->stream && sd->iface->stream_free) sd->iface->stream_free(sd->dev, sd->stream);
    }
    for (int i = 0; s->staging && i < s->prog->n; i++) free(s->staging[i]);
    free(s->staging);
    free(s->devs);
    free(s->input_base);
    for (int i = 0; i < s->n_sends; i++) free(s->sends[i].copy), free(s->sends[i].requests);
    free(s->sends);
#ifdef PDDE_HAVE_COMM
    if (s->moe_exchange_registered) pdde_comm_buffer_free(s->moe_exchange);
    else
#endif
        free(s->moe_exchange);
    free(s->send_of);
    free(s->update_group);
    free(s->direct_x), free(s->direct_offset);
    free(s->requests), free(s->bucket_done);
    free(s->slot), free(s->overwritten);
    program_free(s->prog);
    free(s);
    if (g->free_pending && !g->session) pdde_graph_free(g); /* (its pdde_graph_free waited for this) */
}

/* A COPY node moves its input between devices: device -> host directly, anything else through the
 * node's host staging buffer, so the source memory may be reused as soon as the copy is enqueued. */
static pdde_status run_copy(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *x = t->src[0];
    session_device *src = &s->devs[s->slot[x->id]], *dst = &s->devs[s->slot[t->id]];
    size_t n = pdde_tensor_nbytes(t);
    pdde_status st;
    if (dst->host) {
        st = src->iface->read(src->dev, src->stream, x->data, x->offset, (char *)t->data + t->offset, n);
        return st ? st : device_sync(s, src);
    }
    void *bounce = s->staging[t->id];
    if (src->host) memcpy(bounce, (char *)x->data + x->offset, n);
    else {
        st = src->iface->read(src->dev, src->stream, x->data, x->offset, bounce, n);
        if (!st) st = device_sync(s, src);
        if (st) return st;
    }
    return dst->iface->write(dst->dev, dst->stream, t->data, t->offset, bounce, n);
}

/* The phases a run mode runs: forward (FORWARD, FORWARD_BACKWARD, STEP), backward (FORWARD_BACKWARD,
 * STEP), the update (OPTIMIZER, STEP). */
static bool mode_runs_forward(pdde_run_mode mode) { return mode != PDDE_RUN_OPTIMIZER; }
static bool mode_runs_backward(pdde_run_mode mode) { return mode == PDDE_RUN_FORWARD_BACKWARD || mode == PDDE_RUN_STEP; }
static bool mode_runs_update(pdde_run_mode mode) { return mode == PDDE_RUN_OPTIMIZER || mode == PDDE_RUN_STEP; }

#define PHASE_BIT(phase) (1u << (phase))
static unsigned mode_phases(pdde_run_mode mode) {
    return (mode_runs_forward(mode) ? PHASE_BIT(PDDE_PHASE_FORWARD) : 0) | (mode_runs_backward(mode) ? PHASE_BIT(PDDE_PHASE_BACKWARD) : 0) |
           (mode_runs_update(mode) ? PHASE_BIT(PDDE_PHASE_OPTIMIZER) : 0);
}

/* Points t at micro-batch m's memory: an input at its slot m, an activation in arena m % n_live. */
static void bind_micro(pdde_session *s, pdde_tensor *t, int m) {
    if (s->prog->info[t->id].own_buffer) return; /* (a device bucket's buffer is its own) */
    pdde_tensor *r = storage_root(t);
    if (s->direct_bound && s->prog->info[r->id].grad_into) return; /* (the first micro-batch's gradient goes where it is accumulated) */
    if (!is_persistent(r)) t->data = s->devs[s->slot[r->id]].arenas[m % s->n_live];
    else if ((r->flags & PDDE_TENSOR_INPUT) && !(r->flags & PDDE_TENSOR_STATE) && s->n_micro > 1) /* (a state input: one slot) */
        t->offset = s->input_base[r->id] + (size_t)m * program_aligned_bytes(r);
}

/* ------------------------------------------------------------------------------------------------
 * Non-finite guard. Before the first update of a step the loss and, when clipping, the global
 * gradient norm (both computed anyway) are checked: the update never runs on a NaN or an infinity,
 * and the step's gradients are dropped. Without clipping a non-finite gradient with a finite loss is
 * not seen (it would cost a pass over every gradient); PDDE_CHECK_NONFINITE=1 checks every node's
 * output, naming the first one that holds a NaN or an infinity (debugging: it reads every tensor). */

static pdde_status read_local(pdde_session *s, const pdde_tensor *lt, void *dst, size_t nbytes);
static pdde_status write_bound(pdde_session *s, pdde_tensor *lt, const void *src, size_t nbytes);

/* The index of the first NaN or infinity of f32 tensor t (a node of the session), or -1 (device data
 * is read to the host). */
static int64_t first_nonfinite(pdde_session *s, const pdde_tensor *t, float *value) {
    if (t->dtype != PDDE_F32 || !t->data) return -1;
    int64_t n = pdde_tensor_numel(t), at = -1;
    const float *f = s->devs[s->slot[t->id]].host ? (const float *)((const char *)t->data + t->offset) : NULL;
    float *copy = NULL;
    if (!f) {
        if (!(copy = malloc(pdde_tensor_nbytes(t) + 1)) || read_local(s, t, copy, pdde_tensor_nbytes(t))) { free(copy); return -1; }
        f = copy;
    }
    for (int64_t i = 0; i < n && at < 0; i++)
        if (!isfinite(f[i])) at = i, *value = f[i];
    free(copy);
    return at;
}

static const char *tensor_kind(const pdde_tensor *t) {
    return t->flags & PDDE_TENSOR_INPUT ? "input" : t->flags & PDDE_TENSOR_PARAM ? "parameter" : t->flags & PDDE_TENSOR_GRAD ? "gradient" : "tensor";
}

/* "; first in input x[5] = nan": the first leaf (in schedule order, or among `only`'s inputs) with
 * one of `flags` that holds a non-finite value; "" if none does. */
static void first_nonfinite_leaf(pdde_session *s, uint32_t flags, const pdde_tensor *only, int micro, char *buf, size_t n) {
    buf[0] = 0;
    int count = only ? only->nsrc : s->n_order;
    for (int i = 0; i < count; i++) {
        pdde_tensor *t = only ? only->src[i] : s->order[i];
        if (!is_persistent(t) || !(t->flags & flags)) continue;
        if (s->bind) bind_micro(s, t, micro);
        float v;
        int64_t at = first_nonfinite(s, t, &v);
        if (at >= 0) { snprintf(buf, n, "; first in %s %s[%lld] = %g", tensor_kind(t), t->name, (long long)at, v); return; }
    }
}

static pdde_status nonfinite_error(pdde_session *s, const char *what, const pdde_tensor *t, float v, uint32_t culprits, int micro) {
    char first[200];
    first_nonfinite_leaf(s, culprits, NULL, micro, first, sizeof first);
    return pdde_error(s->ctx, PDDE_ERR_NONFINITE, "step %lld, micro-batch %d: %s %s is %g%s%s", (long long)s->step + 1, micro, what,
                      t->name, v, first, first[0] ? "" : " (PDDE_CHECK_NONFINITE=1 names the first node that made it)");
}

/* A cross-entropy target >= V or an embedding id outside its table, which a device's kernel turns into
 * a NaN loss (the CPU's refuse them when they run): the error naming the op, the value and its
 * position, as the CPU's; else PDDE_OK. Reads the targets and ids of micro. */
static pdde_status index_input_error(pdde_session *s, int micro) {
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *t = s->order[i], *tg = t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_EMBEDDING ? t->src[1] : NULL;
        if (!tg || !is_persistent(tg) || pdde_op_i32(t, PDDE_P_VOCAB_SIZE) > 0) continue; /* (the vocab-parallel ones check their own) */
        bool ce = t->op == PDDE_OP_CROSS_ENTROPY;
        int64_t n = pdde_tensor_numel(tg), V = ce ? t->src[0]->shape[t->src[0]->ndim - 1] : t->src[0]->shape[0];
        int32_t *ids = malloc(pdde_tensor_nbytes(tg) + 1);
        if (!ids) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
        if (s->bind) bind_micro(s, tg, micro);
        pdde_status st = read_local(s, tg, ids, pdde_tensor_nbytes(tg));
        for (int64_t r = 0; r < n && !st; r++)
            if (ce && ids[r] >= V)
                st = pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "%s: target %d at position %lld is outside the %lld classes of %s [0, %lld)",
                                t->name, ids[r], (long long)r, (long long)V, t->src[0]->name, (long long)V);
            else if (!ce && (ids[r] < 0 || ids[r] >= V))
                st = pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "%s: id %d at position %lld is outside the table %s [0, %lld)", t->name, ids[r],
                                (long long)r, t->src[0]->name, (long long)V);
        free(ids);
        if (st) return st;
    }
    return PDDE_OK;
}

static pdde_status check_loss(pdde_session *s, float loss, int micro) {
    pdde_status st = isfinite(loss) ? PDDE_OK : index_input_error(s, micro);
    if (st) return st;
    /* (under loss scaling a training pass with an overflow is skipped at the update instead) */
    if (isfinite(loss) || (s->loss_scaling && s->scaling_pass)) return PDDE_OK;
    return nonfinite_error(s, "the loss", s->loss, loss, PDDE_TENSOR_INPUT | PDDE_TENSOR_PARAM, micro);
}

/* Enqueues the read of f32 scalar t into *v (complete when its device's stream is synchronised). */
static pdde_status enqueue_read_scalar(pdde_session *s, const pdde_tensor *t, float *v) {
    session_device *sd = &s->devs[s->slot[t->id]];
    pdde_status st = s->devprof && !sd->host ? profile_wait(s, sd) : PDDE_OK; /* (a read may wait: PDDE_PROFILE=device times it) */
    return st ? st : sd->iface->read(sd->dev, sd->stream, t->data, t->offset, v, sizeof *v);
}

/* The f32 scalars a and b (either may be NULL) read with one wait for each device holding one. */
static pdde_status read_scalars(pdde_session *s, const pdde_tensor *a, float *va, const pdde_tensor *b, float *vb) {
    const pdde_tensor *t[2] = {a, b};
    float *v[2] = {va, vb};
    pdde_status st = PDDE_OK;
    for (int k = 0; k < 2 && !st; k++)
        if (t[k]) st = enqueue_read_scalar(s, t[k], v[k]);
    for (int k = 0; k < 2 && !st; k++)
        if (t[k] && !(k == 1 && a && s->slot[a->id] == s->slot[b->id])) st = device_sync(s, &s->devs[s->slot[t[k]->id]]);
    return st;
}

/* Under several ranks the overflow decision and the loss scale are the world's: pipeline stages and
 * data-parallel ranks each see their own loss and gradients, and a stage unscales by its own copy of
 * the scale while only the loss's stage seeds the backward pass with it. So before the step's first
 * update every rank learns whether any rank saw an overflow, the scale of the ranks holding the loss
 * and whether all ranks hold the same scale; the step is skipped everywhere if any overflowed or the
 * scales differ (a rank unscaled by the wrong one: after set_loss_scale on some ranks, or a checkpoint
 * the stages without the loss did not read it from), and every rank goes on from the loss's scale.
 * Every rank calls it once per updating run: at its first update, or after its run when it has none. */
static pdde_tensor *local_of(const pdde_session *s, const pdde_tensor *t);
static pdde_status scaler_agree(pdde_session *s) {
#ifdef PDDE_HAVE_COMM
    if (!s->world || pdde_comm_size(s->world) < 2) return PDDE_OK;
    bool seeds = local_of(s, s->g->grad_seed) != NULL;
    float v[4] = {s->skip_update ? 1.0f : 0.0f, seeds ? s->scaler.scale : 0.0f, s->scaler.scale, -s->scaler.scale};
    pdde_status st = pdde_comm_allreduce(s->world, v, v, 4, PDDE_F32, PDDE_REDUCE_MAX);
    if (st) return st;
    s->skip_update = v[0] > 0 || v[2] != -v[3];
    if (v[1] > 0) s->scaler.scale = v[1];
#else
    (void)s;
#endif
    return PDDE_OK;
}

/* What the loss lv and the squared norm nv the updates read (loss, norm: NULL where not read) say:
 * an error naming the non-finite one, or under loss scaling whether the step is skipped. */
static pdde_status check_update_scalars(pdde_session *s, const pdde_tensor *loss, float lv, const pdde_tensor *norm, float nv, int micro) {
    pdde_status st;
    if (loss) s->loss_read = true, s->loss_value = lv;
    /* under loss scaling an overflow anywhere makes the loss or the squared norm infinite or NaN: skip
     * (checked after the step, what the kernels did: they skipped when the norm was not finite) */
    if (s->loss_scaling) {
        s->skip_update = (loss && !isfinite(lv) && !s->deferred_norm) || (norm && !isfinite(nv));
        return scaler_agree(s);
    }
    if (loss && (st = check_loss(s, lv, micro))) return st;
    if (norm && !isfinite(nv)) return nonfinite_error(s, "the squared gradient norm", norm, nv, PDDE_TENSOR_GRAD, micro);
    return PDDE_OK;
}

/* Before update u, the step's first: the loss of this pass (when it has one) and the norm u clips by
 * (or that shows an overflow under loss scaling), read together: the step's one wait before its end. */
static pdde_status check_before_update(pdde_session *s, pdde_tensor *u, int micro) {
    s->update_checked = true;
    const pdde_tensor *loss = s->pass_has_loss ? s->loss : NULL;
    const pdde_tensor *norm = s->loss_scaling || pdde_op_f32(u, PDDE_P_UPDATE_CLIP) > 0 ? update_norm(u) : NULL;
    float lv = 0, nv = 0;
    if (loss && s->bind) bind_micro(s, s->loss, micro);
    pdde_status st = read_scalars(s, loss, &lv, norm, &nv);
    return st ? st : check_update_scalars(s, loss, lv, norm, nv, micro);
}

/* Whether the check before update u may wait for the step's end, saving the host a wait in the step:
 * u reads the squared norm, and its kernel does nothing when that is not finite (so nothing changed
 * before the host reports the NaN or skips the overflowed step). Not under several ranks, which agree
 * on a skip before updating (scaler_agree), nor without a norm: a non-finite loss is then seen by the
 * host alone, before the update. And only where the updates end the schedule, so that no later node
 * takes the norm's memory before the host reads it. */
static bool check_after_step(const pdde_session *s, const pdde_tensor *u) {
#ifdef PDDE_HAVE_COMM
    if (s->world && pdde_comm_size(s->world) > 1) return false;
#endif
    if (!update_norm(u)) return false;
    int i = s->n_order - 1;
    while (i >= 0 && (is_update(s->order[i]) || s->order[i]->op == PDDE_OP_NONE || s->order[i]->op == PDDE_OP_RESHAPE) && s->order[i] != u) i--;
    return i >= 0 && s->order[i] == u;
}

/* Before update u: the check of the step's first update, now or (check_after_step) at the step's end. */
static pdde_status before_update(pdde_session *s, pdde_tensor *u, int micro) {
    if (s->update_checked) return PDDE_OK;
    if (s->update_hook) s->update_hook(s->update_hook_arg);
    if (!check_after_step(s, u)) return check_before_update(s, u, micro);
    s->update_checked = true, s->deferred_norm = update_norm(u), s->deferred_micro = micro;
    return PDDE_OK;
}

/* The deferred check's reads, enqueued behind the step's work: the step's end waits for them. */
static pdde_status enqueue_deferred_reads(pdde_session *s) {
    pdde_status st = PDDE_OK;
    if (s->pass_has_loss && s->loss) {
        if (s->bind) bind_micro(s, s->loss, s->deferred_micro);
        st = enqueue_read_scalar(s, s->loss, &s->loss_value);
    }
    return st ? st : enqueue_read_scalar(s, s->deferred_norm, &s->norm_value);
}

/* PDDE_CHECK_NONFINITE: t's output, after it ran. */
static pdde_status check_node(pdde_session *s, pdde_tensor *t, int micro) {
    float v;
    int64_t at = first_nonfinite(s, t, &v);
    if (at < 0) return PDDE_OK;
    char from[200];
    first_nonfinite_leaf(s, PDDE_TENSOR_INPUT | PDDE_TENSOR_PARAM | PDDE_TENSOR_STATE, t, micro, from, sizeof from);
    return pdde_error(s->ctx, PDDE_ERR_NONFINITE, "step %lld, micro-batch %d: %s %s[%lld] = %g is the first non-finite value (%s of %s%s)%s",
                      (long long)s->step + 1, micro, pdde_op_name(t->op), t->name, (long long)at, v, pdde_op_name(t->op),
                      t->nsrc ? t->src[0]->name : "", t->nsrc > 1 ? ", ..." : "", from);
}

static pdde_status zero_bound(pdde_session *s, pdde_tensor *lt);

/* After a non-finite step the gradients accumulated so far are dropped, so the next step starts clean. */
static void drop_gradients(pdde_session *s) {
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *t = s->order[i];
        if (!is_persistent(t) || !(t->flags & PDDE_TENSOR_GRAD)) continue;
        zero_bound(s, t);
    }
    s->grads_zero = true;
}

/* What cross-entropy t divides its summed loss by (PDDE_P_CE_DIVISOR): 0 (its own targets' mean), or
 * under pdde_session_set_loss_tokens the step's targets over the step's parts: this rank's micro-batches
 * over grad_scale (with uneven shares: every rank's, over the dp ranks) times the ranks its rows split
 * over (the mesh axes its result is averaged on) */
static float ce_step_divisor(const pdde_session *s, const pdde_tensor *t) {
    if (s->loss_tokens <= 0) return 0;
    double parts = 1.0 / (double)s->prog->grad_scale;
    const pdde_dist_attr *d = &t->dist;
    for (int a = 0; d->mesh && a < d->mesh->ndim; a++)
        if (d->partial_avg >> a & 1) parts *= d->mesh->shape[a];
    return (float)((double)s->loss_tokens / parts);
}

/* The parameters of this step that the executor sets on t before it runs. */
static void set_run_params(pdde_session *s, pdde_tensor *t, int micro, float lr) {
    if (t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_CROSS_ENTROPY_BACK) pdde_op_set_f32(t, PDDE_P_CE_DIVISOR, ce_step_divisor(s, t));
    if (s->prog->info[t->id].grad_overwrite) pdde_op_set_i32(t, PDDE_P_GRAD_ACCUM_OVERWRITE, s->direct_bound); /* (lower_direct_grads) */
    if (t->op == PDDE_OP_DROPOUT || t->op == PDDE_OP_DROPOUT_BACK) pdde_op_set_i32(t, PDDE_P_DROPOUT_COUNTER, (int32_t)(s->run_counter + (uint32_t)micro));
    if (s->loss_scaling && (is_update(t) || t->op == PDDE_OP_GRAD_NORM_SQ)) /* the gradients are the scale times too large */
        pdde_op_set_f32(t, PDDE_P_UPDATE_GRAD_SCALE, s->prog->grad_scale / s->scaler.scale);
    if (is_update(t)) pdde_op_set_f32(t, PDDE_P_UPDATE_LR, lr), pdde_op_set_i32(t, PDDE_P_UPDATE_STEP, (int32_t)(s->step + 1));
}

static pdde_status run_node(pdde_session *s, pdde_tensor *t, int micro, float lr) {
    set_run_params(s, t, micro, lr);
    if (is_update(t)) {
        pdde_status st = before_update(s, t, micro);
        if (st || s->skip_update) return st;
    }
    if (t->op == PDDE_OP_COPY) return run_copy(s, t);
#ifdef PDDE_HAVE_COMM
    const pdde_program_node *in = node_info(s, t);
    bool collective = t->op >= PDDE_OP_ALLREDUCE && t->op <= PDDE_OP_ALLGATHER && in->axis >= 0;
    if (in->bucket) return run_bucket_member(s, t, micro);
    if (collective && in->bucket_members) return run_bucket(s, t, micro);
    if (s->copy_pending && (collective || t->op == PDDE_OP_COMM_WAIT || t->op == PDDE_OP_SEND || t->op == PDDE_OP_RECV || in->vocab_axis >= 0)) {
        pdde_tensor *pending; /* (the collectives in the order every rank issues them) */
        pdde_status st = copy_flush(s, &pending);
        if (st) return bucket_error(s, t, pending, st);
    }
    if (collective && in->prefetch) return start_gather(s, t);
    if (collective && in->early) return s->early_starts ? start_reduction(s, t) : PDDE_OK; /* (not due in this pass: its wait runs it) */
    if (collective) s->gradient_collectives += in->data_parallel;
    if (collective) return run_reshard(s, t);
    if ((t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_CROSS_ENTROPY_BACK) && in->vocab_axis >= 0) return run_cross_entropy_vocab(s, t);
    if (t->op == PDDE_OP_COMM_WAIT) return run_wait(s, t);
    if (t->op == PDDE_OP_SEND) return run_send(s, t, micro);
    if (t->op == PDDE_OP_RECV) return run_recv(s, t);
#endif
    /* an empty output has nothing to compute (and its kernel's loops over the other dims of an
     * empty tensor, which may be huge, would copy nothing for a long time) */
    if (pdde_tensor_numel(t) == 0) return PDDE_OK;
    session_device *sd = &s->devs[s->slot[t->id]];
    pdde_status st = sd->iface->compute(sd->dev, sd->stream, t);
    if (st == PDDE_ERR_UNSUPPORTED) /* (its supports_op took the node at session init: the backend contradicts itself) */
        return pdde_error(s->ctx, st, "session: node %s (op %s) on device %d: the backend's compute refused a node its supports_op accepted "
                          "(the backend must say no in supports_op, so that the node runs on the CPU): %s", t->name, pdde_op_name(t->op), t->device,
                          pdde_last_error(s->ctx));
    /* timing an asynchronous device needs its stream drained; only when profiling */
    if ((s->profile || (s->trace && !s->devprof)) && !sd->host && st == PDDE_OK) st = device_sync(s, sd);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Multi-tensor updates: the update nodes that follow one another in the schedule (leaves and views
 * between them aside) on one device, with the same parameters but for weight decay and the same
 * gradient norm, go to the backend as one launch (pdde_backend_iface.compute_group); a backend
 * without it, or declining, runs them one by one. The numerics are those of the single updates. */

static bool update_joins(const pdde_session *s, const pdde_tensor *first, const pdde_tensor *t) {
    /* (with or without a bf16 copy to rewrite: each node says) */
    if (t->op != first->op || t->phase != first->phase || t->nsrc - !!update_shadow(t) != first->nsrc - !!update_shadow(first) ||
        s->slot[t->id] != s->slot[first->id])
        return false;
    if (update_norm(t) != update_norm(first)) return false;
    if (update_shadow(t) && update_shadow(first) && update_shadow(t)->dtype != update_shadow(first)->dtype) return false;
    for (int k = 0; k < (int)(sizeof t->iparams / sizeof t->iparams[0]); k++)
        if (k != PDDE_P_UPDATE_SHADOW && t->iparams[k] != first->iparams[k]) return false;
    for (int k = 0; k < (int)(sizeof t->fparams / sizeof t->fparams[0]); k++)
        if (k != PDDE_P_UPDATE_WEIGHT_DECAY && memcmp(&t->fparams[k], &first->fparams[k], sizeof t->fparams[k])) return false;
    return true;
}

/* Gathers in s->update_group the update nodes from order[i] that one launch can take (after setting
 * their parameters of this step); returns the index of the last one in s->order, *n their count. */
static int gather_update_group(pdde_session *s, int i, int micro, float lr, int *n) {
    pdde_tensor *first = s->order[i];
    int last = i;
    *n = 0;
    s->update_group[(*n)++] = first;
    set_run_params(s, first, micro, lr);
    if (!IFACE_HAS(s->devs[s->slot[first->id]].iface, compute_group)) return i;
    for (int j = i + 1; j < s->n_order; j++) {
        pdde_tensor *t = s->order[j];
        if (t->op == PDDE_OP_NONE || t->op == PDDE_OP_RESHAPE) continue;
        if (!is_update(t)) break;
        set_run_params(s, t, micro, lr);
        if (!update_joins(s, first, t)) break;
        s->update_group[(*n)++] = t, last = j;
    }
    return last;
}

/* The n nodes of s->update_group, after the check before the step's first update. */
static pdde_status run_update_group(pdde_session *s, int n, int micro) {
    pdde_tensor **u = s->update_group;
    pdde_status st = before_update(s, u[0], micro);
    if (st || s->skip_update) return st;
    session_device *sd = &s->devs[s->slot[u[0]->id]];
    st = sd->iface->compute_group(sd->dev, sd->stream, u, n);
    if (st == PDDE_ERR_UNSUPPORTED) { /* declined, with nothing enqueued: one by one */
        st = PDDE_OK;
        for (int k = 0; k < n && !st; k++)
            if (pdde_tensor_numel(u[k])) st = sd->iface->compute(sd->dev, sd->stream, u[k]);
    }
    if ((s->profile || (s->trace && !s->devprof)) && !sd->host && st == PDDE_OK) st = device_sync(s, sd);
    return st;
}

/* Points the producers of lower_direct_grads at their accumulators (on) or at their own memory, and
 * the views of what they write with them. */
static void bind_direct(pdde_session *s, bool on) {
    if (on == s->direct_bound) return;
    const pdde_program *P = s->prog;
    for (int k = 0; k < s->n_direct; k++) {
        pdde_tensor *x = s->direct_x[k], *acc = P->info[x->id].grad_into;
        x->data = on ? acc->data : s->devs[s->slot[x->id]].arena, x->offset = on ? acc->offset : s->direct_offset[k];
    }
    for (int i = 0; i < s->n_order; i++) {
        pdde_tensor *t = s->order[i], *r = storage_root(t);
        if (r != t && P->info[r->id].grad_into) t->data = r->data, t->offset = r->offset + storage_offset_in_root(t);
    }
    s->direct_bound = on;
}

/* Runs the scheduled nodes of the phases in `phases` (PHASE_BIT set) for micro-batch `micro`; with
 * chunk >= 0 (interleaved stages), only the forward and backward nodes of that chunk. */
static pdde_status run_chunk(pdde_session *s, unsigned phases, int micro, int chunk, float lr) {
    pdde_status st = PDDE_OK;
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *t = s->order[i];
        if (t->op == PDDE_OP_NONE || t->op == PDDE_OP_RESHAPE || !(phases & PHASE_BIT(t->phase))) continue;
        if ((t->flags & PDDE_TENSOR_SHADOW) && s->skip_shadow_casts) continue;
        if (chunk >= 0 && t->phase != PDDE_PHASE_OPTIMIZER && s->prog->info[t->id].chunk != chunk) continue;
        if (s->direct_bound && s->prog->info[t->id].grad_direct) continue; /* (its gradient's producer wrote the sum) */
        int n_group = 1, last = is_update(t) ? gather_update_group(s, i, micro, lr, &n_group) : i;
        for (int g = 0; s->bind && g < n_group; g++) {
            pdde_tensor *u = n_group > 1 ? s->update_group[g] : t;
            bind_micro(s, u, micro);
            for (int k = 0; k < u->nsrc; k++) bind_micro(s, u->src[k], micro);
        }
        double t0 = s->profile ? monotonic_seconds() : 0, t0_us = s->trace ? trace_now_us() : 0;
        int timed = s->devprof ? profile_node_begin(s, t, micro, n_group) : -1;
        st = n_group > 1 ? run_update_group(s, n_group, micro) : run_node(s, t, micro, lr);
        if (timed >= 0) profile_node_end(s, timed);
        if (s->profile) s->op_seconds[t->op] += monotonic_seconds() - t0, s->op_calls[t->op]++;
        s->op_runs[t->op] += n_group;
        if (s->trace && timed < 0) trace_node(s, t, micro, t0_us, trace_now_us() - t0_us); /* (a group: under its first node's name) */
        bool started_only = t->op >= PDDE_OP_ALLREDUCE && t->op <= PDDE_OP_ALLGATHER && s->prog->info[t->id].early;
        for (int g = 0; g < n_group && !st && s->check_nonfinite && !started_only && t->op != PDDE_OP_SEND && t->op != PDDE_OP_COMM_WAIT; g++)
            st = check_node(s, n_group > 1 ? s->update_group[g] : t, micro);
        i = last;
    }
    return st;
}

/* A phantom micro-batch (uneven shares under ZeRO-2/3, planner_impl.h): the collectives over the
 * shares' axis of this phase that every micro-batch makes, reductions contributing zeros, and the
 * accumulation of what they bring this rank's shard; gathers are discarded. No other node runs. */
static pdde_status run_phantom(pdde_session *s, pdde_phase phase, int micro) {
    pdde_status st = PDDE_OK;
    for (int i = 0; i < s->n_order && st == PDDE_OK; i++) {
        pdde_tensor *t = s->order[i];
        if (t->phase != phase || !program_phantom_runs(s->prog, t)) continue;
        if (s->bind) {
            bind_micro(s, t, micro);
            for (int k = 0; k < t->nsrc; k++) bind_micro(s, t->src[k], micro);
        }
        if (t->op == PDDE_OP_ALLREDUCE || t->op == PDDE_OP_REDUCE_SCATTER) { /* its input was never computed: zeros */
            size_t nbytes = pdde_tensor_nbytes(t->src[0]);
            void *zeros = calloc(1, nbytes + 1);
            st = zeros ? write_bound(s, t->src[0], zeros, nbytes) : pdde_error(s->ctx, PDDE_ERR_OOM, "phantom micro-batch: out of memory");
            free(zeros);
        }
        if (st == PDDE_OK) st = run_node(s, t, micro, 0);
    }
    return st;
}

/* The loss of micro-batch `micro` (this rank holds the loss): added to *sum. */
static pdde_status add_loss(pdde_session *s, int micro, double *sum) {
    float loss;
    if (s->bind) bind_micro(s, s->loss, micro);
    pdde_status st = read_local(s, s->loss, &loss, sizeof loss);
    *sum += loss;
    return st ? st : check_loss(s, loss, micro);
}

/* A run of every micro-batch through this rank's stage: the passes lowering scheduled (the 1F1B or
 * GPipe order, interleaved chunks), then the sends' completion. */
static pdde_status run_micro_batches(pdde_session *s, pdde_run_mode mode, float lr, double *loss_sum) {
    const pdde_program *P = s->prog;
    bool training = mode_runs_backward(mode);
    const pdde_program_pass *passes = training ? P->step : P->forward;
    int n = training ? P->n_step : P->n_forward;
    pdde_status st = PDDE_OK;
    for (int i = 0; i < n && st == PDDE_OK; i++) {
        const pdde_program_pass *ps = &passes[i];
        if (ps->phase == PDDE_PHASE_OPTIMIZER && !mode_runs_update(mode)) continue;
        s->early_starts = ps->early && mode_runs_update(mode);
        double t0_us = s->trace ? trace_now_us() : 0;
        if (ps->phantom) {
            st = run_phantom(s, ps->phase, ps->micro);
            continue;
        }
        /* (a step that starts with zeroed gradients: its first micro-batch writes them where they are accumulated,
         * the others add to them) */
        if (ps->phase == PDDE_PHASE_BACKWARD) bind_direct(s, s->grads_zero && ps->micro == 0);
        st = run_chunk(s, PHASE_BIT(ps->phase), ps->micro, ps->chunk, lr);
        if (s->trace) {
            static const char *const pass_names[] = {"forward", "backward", "update"};
            trace_add(s, pass_names[ps->phase], TRACE_PASS, TRACE_LANE_SCHEDULE, ps->phase == PDDE_PHASE_OPTIMIZER ? -1 : ps->micro, t0_us,
                      trace_now_us() - t0_us);
        }
        s->early_starts = false;
        if (!st && ps->phase == PDDE_PHASE_FORWARD && s->loss && (ps->chunk < 0 || ps->chunk == P->loss_chunk)) st = add_loss(s, ps->micro, loss_sum);
    }
#ifdef PDDE_HAVE_COMM
    if (!st) st = wait_sends(s);
#endif
    return st;
}

static pdde_tensor *local_of(const pdde_session *s, const pdde_tensor *t);

/* ------------------------------------------------------------------------------------------------
 * Dynamic loss scaling (pdde.h): the scale lives in the backward's seed; s->scaler mirrors it. */

static pdde_status scaler_write(pdde_session *s) {
    pdde_tensor *seed = local_of(s, s->g->grad_seed);
    if (!seed) return PDDE_OK; /* (a pipeline stage without the loss) */
    float v[1] = {s->scaler.scale};
    return write_bound(s, seed, v, sizeof v);
}

static pdde_status scaler_load(pdde_session *s) {
    pdde_tensor *seed = local_of(s, s->g->grad_seed);
    float v = s->scaler.scale;
    pdde_status st = seed ? read_local(s, seed, &v, sizeof v) : PDDE_OK;
    if (st == PDDE_OK && !(isfinite(v) && v > 0)) /* (a damaged file: start over from the initial scale) */
        v = PDDE_LOSS_SCALE_INIT, st = scaler_write(s);
    s->scaler.scale = v, s->scaler.good_steps = 0;
    return st;
}

static void scaler_init(pdde_session *s) {
    s->loss_scaling = s->g->loss_scaling && s->g->has_optimizer && s->g->grad_seed;
    s->scaler = (pdde_loss_scale_stats){.enabled = s->loss_scaling, .scale = s->loss_scaling ? PDDE_LOSS_SCALE_INIT : 1.0f};
}

/* After a run that updated (or skipped): torch.cuda.amp.GradScaler.update's rule. */
static pdde_status scaler_after_update(pdde_session *s) {
    pdde_loss_scale_stats *sc = &s->scaler;
    sc->last_skipped = s->skip_update;
    if (s->skip_update) {
        drop_gradients(s);
        sc->skipped_steps++, sc->good_steps = 0;
        sc->scale *= PDDE_LOSS_SCALE_BACKOFF;
        if (s->ctx->log_level >= 1)
            pdde_log(PDDE_LOG_INFO, "pdde: step %lld skipped: the f16 gradients overflowed; loss scale now %g\n", (long long)s->step + 1, sc->scale);
        return scaler_write(s);
    }
    s->step++;
    if (++sc->good_steps < PDDE_LOSS_SCALE_INTERVAL) return PDDE_OK;
    sc->good_steps = 0;
    sc->scale *= PDDE_LOSS_SCALE_GROWTH;
    return scaler_write(s);
}

pdde_status pdde_session_loss_scale(const pdde_session *s, pdde_loss_scale_stats *out) {
    if (!s || !out) return PDDE_ERR_INVALID_ARG;
    *out = s->scaler;
    return PDDE_OK;
}

pdde_status pdde_session_set_loss_scale(pdde_session *s, float scale) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!s->loss_scaling) return pdde_error(s->ctx, PDDE_ERR_STATE, "set_loss_scale: the session does not scale its loss (no f16 matmuls)");
    if (!(isfinite(scale) && scale > 0)) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "set_loss_scale: %g must be finite and > 0", scale);
    s->scaler.scale = scale, s->scaler.good_steps = 0;
    return scaler_write(s);
}

pdde_status pdde_session_set_loss_tokens(pdde_session *s, int64_t n) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (n < 0) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "set_loss_tokens: %lld targets: a count >= 0 expected", (long long)n);
    s->loss_tokens = n;
    return PDDE_OK;
}

pdde_status pdde_session_run(pdde_session *s, pdde_run_mode mode) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (mode != PDDE_RUN_FORWARD && mode != PDDE_RUN_FORWARD_BACKWARD && mode != PDDE_RUN_OPTIMIZER && mode != PDDE_RUN_STEP)
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_run: unknown mode %d", mode);
    bool pipelined = s->n_stages > 1, every_micro = (s->n_micro > 1 || s->prog->n_phantom) && (mode == PDDE_RUN_STEP || mode == PDDE_RUN_FORWARD);
    if (pipelined && (mode == PDDE_RUN_FORWARD_BACKWARD || mode == PDDE_RUN_OPTIMIZER))
        return pdde_error(s->ctx, PDDE_ERR_STATE, "session_run: pipeline stages run whole steps (write each micro-batch with "
                                                  "pdde_session_write_micro, then PDDE_RUN_STEP)");
    if (s->prog->n_phantom && (mode == PDDE_RUN_FORWARD_BACKWARD || mode == PDDE_RUN_OPTIMIZER))
        return pdde_error(s->ctx, PDDE_ERR_STATE, "session_run: uneven shares under ZeRO-2/3 run whole steps (this rank makes %d "
                                                  "phantom micro-batches' collectives for the larger shares): PDDE_RUN_STEP", s->prog->n_phantom);
    pdde_graph *g = s->g;
    float lr = pdde_session_lr(s);
    /* each training pass draws new dropout masks (micro-batch m of a step: counter + m); a forward-only
     * pass reuses the last training pass's masks (so the forward it evaluates is the function that was
     * differentiated); and a training pass that starts with zeroed gradients has their producers write them
     * where they are accumulated */
    if (mode_runs_backward(mode)) s->run_counter++, bind_direct(s, s->grads_zero);
    double loss_sum = 0, t0_us = s->trace ? trace_now_us() : 0;
    if (s->devprof) profile_run_begin(s);
    s->update_checked = s->loss_read = false;
    s->skip_update = false;
    s->deferred_norm = NULL;
    s->scaling_pass = mode_runs_backward(mode);
    s->pass_has_loss = mode_runs_forward(mode) && !every_micro;
    s->early_starts = !every_micro && s->n_micro == 1 && mode == PDDE_RUN_STEP;
    s->gradient_collectives = 0, s->exchanged_rows = 0, s->stream_copies = 0;
    if (s->bucket_done) memset(s->bucket_done, 0, (size_t)s->prog->n * sizeof *s->bucket_done);
    s->skip_shadow_casts = s->shadows_fresh, s->shadows_fresh = false;
    pdde_status st = every_micro ? run_micro_batches(s, mode, lr, &loss_sum) : run_chunk(s, mode_phases(mode), 0, -1, lr);
    if (mode_runs_backward(mode)) s->grads_zero = false;
    s->early_starts = false;
#ifdef PDDE_HAVE_COMM
    pdde_tensor *pending; /* (a bucket whose member runs in a later pass: started now, as without copy streams) */
    if (st == PDDE_OK && (st = copy_flush(s, &pending))) st = bucket_error(s, pending, pending, st);
    s->copy_pending = NULL;
#endif
    if (every_micro && mode_runs_backward(mode)) s->run_counter += (uint32_t)s->n_micro - 1;
    if (st == PDDE_OK && s->deferred_norm) st = enqueue_deferred_reads(s);
    for (int d = 0; d < s->n_devs; d++) {
        pdde_status sync = device_sync(s, &s->devs[d]);
        if (sync == PDDE_OK && s->devs[d].copy_stream) sync = s->devs[d].iface->stream_sync(s->devs[d].dev, s->devs[d].copy_stream);
        if (st == PDDE_OK) st = sync;
    }
    if (s->devprof) profile_run_end(s, st);
    if (st == PDDE_OK && s->deferred_norm) /* (the kernels did nothing if the norm is not finite) */
        st = check_update_scalars(s, s->pass_has_loss ? s->loss : NULL, s->loss_value, s->deferred_norm, s->norm_value, s->deferred_micro);
    /* a rank without update nodes (a pipeline stage without parameters) never reached the check before
     * the first update: it joins the others' skip decision now, before the collectives that follow */
    if (st == PDDE_OK && s->loss_scaling && mode_runs_update(mode) && !s->update_checked) st = scaler_agree(s);
    if (st == PDDE_OK && mode_runs_forward(mode) && s->loss && !every_micro) /* (read before the update, or now) */
        st = s->loss_read ? (loss_sum += s->loss_value, check_loss(s, s->loss_value, 0)) : add_loss(s, 0, &loss_sum);
    if (st == PDDE_ERR_NONFINITE && (mode_runs_backward(mode) || mode_runs_update(mode))) drop_gradients(s);
#ifdef PDDE_HAVE_COMM
    /* the step's loss on every rank: the mean over the micro-batches of the ranks holding one
     * (data-parallel ranks hold their rows' mean per micro-batch, as many micro-batches as their
     * share; other pipeline stages none) */
    if (st == PDDE_OK && mode_runs_forward(mode) && s->world) {
        /* a loss still to be summed over an axis (a sum over a split batch, not a mean): its ranks'
         * parts count that axis' size times, so that the mean over the ranks is their sum */
        const pdde_dist_attr *la = s->loss ? &s->loss->dist : NULL;
        for (int a = 0; la && la->mesh && a < la->mesh->ndim; a++)
            if ((la->partial >> a & 1) && !(la->partial_avg >> a & 1)) loss_sum *= la->mesh->shape[a];
        float sum_and_count[2] = {s->loss ? (float)loss_sum : 0.0f, s->loss ? (float)(every_micro ? s->n_micro : 1) : 0.0f};
        st = pdde_comm_allreduce(s->world, sum_and_count, sum_and_count, 2, PDDE_F32, PDDE_REDUCE_SUM);
        if (st) pdde_error(s->ctx, st, "the step's loss, summed over every rank: %s", pdde_last_error(s->ctx));
        if (st == PDDE_OK) s->last_loss = sum_and_count[1] > 0 ? sum_and_count[0] / sum_and_count[1] : NAN;
    }
    if (st != PDDE_OK && s->world) {
        /* the other ranks are inside the same collectives: fail them now rather than at their timeout */
        char why[sizeof s->ctx->last_error];
        snprintf(why, sizeof why, "%s", pdde_last_error(s->ctx));
        drop_requests(s);
        drop_sends(s);
        if (st != PDDE_ERR_PEER_LOST && st != PDDE_ERR_ABORTED) pdde_comm_abort(s->world);
        pdde_error(s->ctx, st, "%s", why); /* (what the abort raised is not the cause) */
    }
#endif
    if (s->trace) {
        static const char *const run_names[8] = {"run", "forward", "run", "forward+backward", "update", "run", "run", "step"};
        trace_add(s, run_names[mode & 7], TRACE_RUN, TRACE_LANE_SCHEDULE, -1, t0_us, trace_now_us() - t0_us);
    }
    if (st != PDDE_OK) return st;
    s->shadows_fresh = s->skip_shadow_casts || mode_runs_forward(mode); /* (an update kept them, or left them alone) */
    if (mode_runs_forward(mode) && s->loss && !s->world) s->last_loss = (float)(loss_sum / (every_micro ? s->n_micro : 1));
    if (mode_runs_update(mode) && g->has_optimizer) {
        s->grads_zero = true; /* (the updates zero them; a skipped update drops them) */
        if (s->loss_scaling) return scaler_after_update(s);
        s->step++;
    }
    return st;
}

int64_t pdde_session_op_runs(const pdde_session *s, pdde_op op) {
    return s && (unsigned)op < PDDE_OP_COUNT ? s->op_runs[op] : 0;
}

float pdde_session_lr(const pdde_session *s) {
    return s && s->g->has_optimizer ? pdde_lr_at(&s->schedule, s->step) : 0.0f;
}

/* The session's tensor of user tensor t: its block on this rank (NULL: not in the step here). */
static pdde_tensor *local_of(const pdde_session *s, const pdde_tensor *t) {
    const pdde_program *P = s->prog;
    return t && t->id >= 0 && t->id < P->n_user && s->g->nodes[t->id] == t ? P->of_user[t->id] : NULL;
}

const pdde_tensor *pdde_session_tensor(const pdde_session *s, const pdde_tensor *t) { return s ? local_of(s, t) : NULL; }
int pdde_session_node_count(const pdde_session *s) { return s ? s->n_order : 0; }
const pdde_tensor *pdde_session_node(const pdde_session *s, int i) { return s && i >= 0 && i < s->n_order ? s->order[i] : NULL; }

/* Checks that user tensor t is in this rank's step and, unless nbytes is SIZE_MAX, that its block
 * holds nbytes; *local gets the block. */
static pdde_status check_io(pdde_session *s, const pdde_tensor *t, size_t nbytes, const char *what, pdde_tensor **local) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!t) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "%s: the tensor is NULL", what);
    pdde_tensor *lt = local_of(s, t);
    if (!lt) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "%s: %s is not part of this session's schedule", what, t->name);
    if (nbytes != SIZE_MAX && nbytes != pdde_tensor_nbytes(lt))
        return pdde_error(s->ctx, PDDE_ERR_SHAPE, "%s: %s holds %zu bytes on this rank, the buffer %zu", what, t->name, pdde_tensor_nbytes(lt), nbytes);
    *local = lt;
    return PDDE_OK;
}

/* Writes the session's tensor lt where it points now (an input: at the micro-batch it is bound to): its
 * first nbytes (the whole tensor, or the rows a sparse batch reads). */
static pdde_status write_bound(pdde_session *s, pdde_tensor *lt, const void *src, size_t nbytes) {
    session_device *sd = &s->devs[s->slot[lt->id]];
    if (storage_root(lt)->flags & PDDE_TENSOR_PARAM) s->shadows_fresh = false; /* their copies are stale now */
    if (storage_root(lt)->flags & PDDE_TENSOR_GRAD) s->grads_zero = false;      /* the next backward adds to it */
    pdde_status st = sd->iface->write(sd->dev, sd->stream, lt->data, lt->offset, src, nbytes);
    return st ? st : device_sync(s, sd);
}

/* Zeroes the session's tensor lt where it points now: in place on the host, by the backend's zero slot on
 * a device (nothing crosses the bus), else from zeros the host writes. */
static pdde_status zero_bound(pdde_session *s, pdde_tensor *lt) {
    session_device *sd = &s->devs[s->slot[lt->id]];
    size_t n = pdde_tensor_nbytes(lt);
    if (storage_root(lt)->flags & PDDE_TENSOR_PARAM) s->shadows_fresh = false;
    if (sd->host) return memset((char *)lt->data + lt->offset, 0, n), PDDE_OK;
    pdde_status st = IFACE_HAS(sd->iface, zero) ? sd->iface->zero(sd->dev, sd->stream, lt->data, lt->offset, n) : PDDE_ERR_UNSUPPORTED;
    if (st == PDDE_ERR_UNSUPPORTED) {
        if (n > s->zeros_bytes) {
            free(s->zeros), s->zeros_bytes = 0;
            if (!(s->zeros = calloc(1, n))) return pdde_error(s->ctx, PDDE_ERR_OOM, "zeroing %s: out of memory", lt->name);
            s->zeros_bytes = n;
        }
        st = sd->iface->write(sd->dev, sd->stream, lt->data, lt->offset, s->zeros, n);
    }
    return st ? st : device_sync(s, sd);
}

static pdde_status read_local(pdde_session *s, const pdde_tensor *lt, void *dst, size_t nbytes) {
    session_device *sd = &s->devs[s->slot[lt->id]];
    pdde_status st = s->devprof && !sd->host ? profile_wait(s, sd) : PDDE_OK; /* (the read's wait: PDDE_PROFILE=device times it) */
    if (!st) st = sd->iface->read(sd->dev, sd->stream, lt->data, lt->offset, dst, nbytes);
    return st ? st : device_sync(s, sd);
}

/* Writes the first nbytes of input t (of `whole` bytes on this rank: check_io) from src, at the micro-batch
 * it is bound to: the whole tensor (pdde_session_write), or the rows a sparse batch reads (its feed). */
static pdde_status write_first(pdde_session *s, pdde_tensor *t, size_t whole, const void *src, size_t nbytes, const char *what) {
    pdde_tensor *lt = NULL;
    pdde_status st = check_io(s, t, whole, what, &lt);
    if (st) return st;
    if (s->bind) bind_micro(s, lt, 0);
    return write_bound(s, lt, src, nbytes);
}

pdde_status pdde_session_write(pdde_session *s, pdde_tensor *t, const void *src, size_t nbytes) {
    if (s && !src) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_write: %s: src is NULL", t ? t->name : "(NULL tensor)");
    return write_first(s, t, nbytes, src, nbytes, "session_write");
}

pdde_status pdde_session_read(pdde_session *s, const pdde_tensor *t, void *dst, size_t nbytes) {
    pdde_tensor *lt = NULL;
    if (s && !dst) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_read: %s: dst is NULL", t ? t->name : "(NULL tensor)");
    pdde_status st = check_io(s, t, nbytes, "session_read", &lt);
    if (st) return st;
    /* the executor gave its memory to later tensors of the step: what is there now is theirs */
    if (s->overwritten && s->overwritten[lt->id])
        return pdde_error(s->ctx, PDDE_ERR_STATE, "session_read: %s is an intermediate whose memory the step reuses; "
                          "pdde_mark_output it before pdde_session_init to read it after a run", t->name);
    return read_local(s, lt, dst, nbytes);
}

/* Writes the whole (global) user tensor t, from src, into its block lt where that points now: under
 * SPMD execution this rank's block. */
static pdde_status write_global_bound(pdde_session *s, const pdde_tensor *t, pdde_tensor *lt, const void *src, size_t nbytes) {
    if (!s->world || !lt->dist.mesh) {
        if (nbytes != pdde_tensor_nbytes(lt))
            return pdde_error(s->ctx, PDDE_ERR_SHAPE, "session_write_global: %s holds %zu bytes, the buffer %zu", t->name, pdde_tensor_nbytes(lt), nbytes);
        return write_bound(s, lt, src, nbytes);
    }
    /* this rank's block: along each split dim d, [coord * local, (coord + 1) * local) */
    const int64_t *gshape = t->shape;
    int64_t gn = 1, start[PDDE_MAX_DIMS], gst[PDDE_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) gst[d] = gn, gn *= gshape[d];
    size_t esz = pdde_dtype_size(t->dtype);
    if (nbytes != (size_t)gn * esz)
        return pdde_error(s->ctx, PDDE_ERR_SHAPE, "session_write_global: %s holds %lld elements globally, the buffer %zu bytes", t->name, (long long)gn, nbytes);
    for (int d = 0; d < t->ndim; d++) {
        int a = lt->dist.dims_mapping[d];
        start[d] = a >= 0 ? s->prog->coords[program_axis(s->prog, lt->dist.mesh, a)] * lt->shape[d] : 0;
    }
    int64_t n = pdde_tensor_numel(lt);
    char *local = malloc((size_t)n * esz + 1);
    if (!local) return pdde_error(s->ctx, PDDE_ERR_OOM, "session_write_global: out of memory");
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, g = 0;
        for (int d = t->ndim - 1; d >= 0; d--) g += (start[d] + rem % lt->shape[d]) * gst[d], rem /= lt->shape[d];
        memcpy(local + (size_t)i * esz, (const char *)src + (size_t)g * esz, esz);
    }
    pdde_status st = write_bound(s, lt, local, (size_t)n * esz);
    free(local);
    return st;
}

/* Whether user tensor t is in the step on other ranks only (another pipeline stage's): writes to it
 * are ignored. */
static bool held_elsewhere(const pdde_session *s, const pdde_tensor *t) {
    const pdde_program *P = s->prog;
    return t->id >= 0 && t->id < P->n_user && s->g->nodes[t->id] == t && P->elsewhere[t->id];
}

pdde_status pdde_session_write_global(pdde_session *s, pdde_tensor *t, const void *src, size_t nbytes) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!t || !src) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_write_global: %s is NULL", !t ? "the tensor" : "src");
    if (held_elsewhere(s, t)) return PDDE_OK;
    pdde_tensor *lt = NULL;
    pdde_status st = check_io(s, t, SIZE_MAX, "session_write_global", &lt);
    if (!st && s->bind) bind_micro(s, lt, 0);
    return st ? st : write_global_bound(s, t, lt, src, nbytes);
}

pdde_status pdde_session_write_micro(pdde_session *s, pdde_tensor *t, int micro, const void *src, size_t nbytes) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!t || !src) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_write_micro: %s is NULL", !t ? "the tensor" : "src");
    if (held_elsewhere(s, t)) return PDDE_OK;
    pdde_tensor *lt = NULL;
    pdde_status st = check_io(s, t, SIZE_MAX, "session_write_micro", &lt);
    if (st) return st;
    if (!(t->flags & PDDE_TENSOR_INPUT))
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_write_micro: %s is not an input", t->name);
    if (micro < 0 || micro >= s->n_micro)
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session_write_micro: %s: micro-batch %d of %d (the optimizer's grad_accum_steps)",
                          t->name, micro, s->n_micro);
    if (s->bind) bind_micro(s, lt, micro);
    return write_global_bound(s, t, lt, src, nbytes);
}

float pdde_session_loss(pdde_session *s) { return s ? s->last_loss : NAN; }
int64_t pdde_session_step(const pdde_session *s) { return s ? s->step : 0; }
int pdde_session_gradient_collectives(const pdde_session *s) { return s ? s->gradient_collectives : 0; }
int64_t pdde_session_exchanged_rows(const pdde_session *s) { return s ? s->exchanged_rows : 0; }
int pdde_session_micro_batches(const pdde_session *s) { return s ? s->n_micro : 0; }
int64_t pdde_session_host_syncs(const pdde_session *s) { return s ? s->host_syncs : 0; }
int pdde_session_stream_copies(const pdde_session *s) { return s ? s->stream_copies : 0; }

void pdde_session_dump(const pdde_session *s, FILE *f) {
    if (s && f) program_dump(s->prog, f);
}

pdde_status pdde_session_memory(const pdde_session *s, pdde_memory_stats *out) {
    if (!s || !out) return PDDE_ERR_INVALID_ARG;
    *out = s->mem;
    return PDDE_OK;
}
