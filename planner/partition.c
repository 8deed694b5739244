/* planner/partition.c — SPMD execution of a completed graph: each rank's partition (local shapes,
 * its pipeline stage's nodes), the reshard nodes between what a producer gives and what a consumer
 * requires, the send/recv pairs between stages, the distributed forms of vocab-parallel ops, and
 * running the reshard collectives. Included by pdde.c inside the executor (it works on the session),
 * not by planner.c: the rest of planner/ is pure graph analysis.
 *
 *   partition: every tensor gets this rank's local shape (a dim split over mesh axis a is divided by
 *              the axis size); the global shapes come back when the session is freed.
 *   reshard:   where an op requires of an input another attr than its producer gives, nodes are
 *              inserted per mesh axis: partial -> whole = allreduce (avg for a pending mean),
 *              partial -> split = reduce-scatter, split -> whole = allgather, whole -> split = a
 *              local slice, split on another dim = alltoall, whole -> partial sum = the value on
 *              the axis' first rank and zeros elsewhere.
 * The collectives run on one communicator per mesh axis (the ranks that differ only along it). */

/* The graph mesh's axis that axis a of mesh (the graph's mesh or a slice of it) is. */
static int graph_axis(const pdde_session *s, const pdde_mesh *mesh, int a) {
    return mesh == s->mesh ? a : pdde_mesh_axis(s->mesh, mesh->names[a]);
}

#ifdef PDDE_HAVE_COMM
static bool on_this_rank(const pdde_session *s, const pdde_tensor *t) {
    return !t->dist.mesh || mesh_index_of(t->dist.mesh, s->rank) >= 0;
}

/* Whether a uses mesh axis p (a dim split over it, or partial over it). */
static bool attr_uses_axis(const pdde_dist_attr *a, int p) {
    return (attr_split_axes(a) >> p & 1) || (a->partial >> p & 1);
}

static bool dist_same(const pdde_dist_attr *a, const pdde_dist_attr *b, int ndim) {
    if (a->partial != b->partial || (a->partial & (a->partial_avg ^ b->partial_avg))) return false;
    for (int d = 0; d < ndim; d++)
        if (a->dims_mapping[d] != b->dims_mapping[d]) return false;
    return true;
}

static int dim_on_axis(const pdde_dist_attr *a, int ndim, int axis) {
    for (int d = 0; d < ndim; d++)
        if (a->dims_mapping[d] == axis) return d;
    return -1;
}

/* A reshard step over graph mesh axis `axis`: a node reading x with x's local shape changed along dim grow (times the axis size)
 * and dim shrink (divided by it); -1 for none. iparams[5] is the dim that changes (the grown one of an
 * alltoall, whose split dim is iparams[7]). */
static pdde_tensor *reshard_node(pdde_session *s, pdde_op op, pdde_tensor *x, int axis, int grow, int shrink,
                                 const pdde_dist_attr *attr) {
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    int n = s->mesh->shape[axis];
    if (grow >= 0) shape[grow] *= n;
    if (shrink >= 0) shape[shrink] /= n;
    pdde_tensor *t = new_node(s->g, op, x->dtype, x->ndim, shape, 1, &x);
    if (!t) return NULL;
    t->phase = x->phase;
    t->dist = *attr;
    t->iparams[4] = axis, t->iparams[5] = grow >= 0 ? grow : shrink, t->iparams[6] = 1; /* [6]: an SPMD reshard */
    t->iparams[7] = shrink;
    return t;
}

/* Appends one reshard step to the schedule, in the consumer's phase. NULL on failure. */
static pdde_tensor *reshard_push(pdde_session *s, pdde_tensor *t, pdde_phase phase, int slot) {
    if (!t || session_push(s, t, slot)) return NULL;
    t->phase = phase;
    return t;
}

/* The steps along mesh axis a turning t (attr *cur, updated) towards want. With gather_only, just
 * the split on a is gathered (the split it wants is done by a later call). NULL on failure. */
/* A collective reshard step (op over graph mesh axis ga, reduce op rop where it reduces). With the
 * session's comm_dtype narrower than t's f32, the data crosses the wire in it: a cast on each side
 * (what is sent, and what was received, rounded). */
static pdde_tensor *reshard_collective(pdde_session *s, pdde_op op, pdde_tensor *t, int ga, int grow, int shrink, int rop,
                                       const pdde_dist_attr *attr, pdde_phase phase, int slot) {
    bool narrow = s->comm_dtype != PDDE_F32 && t->dtype == PDDE_F32;
    if (narrow) {
        pdde_tensor *c = new_node(s->g, PDDE_OP_CAST, s->comm_dtype, t->ndim, t->shape, 1, &t);
        if (c) c->dist = t->dist;
        t = reshard_push(s, c, phase, slot);
    }
    t = t ? reshard_push(s, reshard_node(s, op, t, ga, grow, shrink, attr), phase, slot) : NULL;
    if (t) t->iparams[0] = rop;
    if (t && narrow) {
        pdde_tensor *c = new_node(s->g, PDDE_OP_CAST, PDDE_F32, t->ndim, t->shape, 1, &t);
        if (c) c->dist = t->dist;
        t = reshard_push(s, c, phase, slot);
    }
    return t;
}

static pdde_tensor *reshard_axis(pdde_session *s, pdde_tensor *t, pdde_dist_attr *cur, const pdde_dist_attr *want, int a,
                                 bool gather_only, pdde_phase phase, int slot) {
    int ga = graph_axis(s, want->mesh, a); /* the communicator and coordinate along a */
    int have_dim = dim_on_axis(cur, t->ndim, a), want_dim = gather_only ? -1 : dim_on_axis(want, t->ndim, a);
    if (s->mesh->shape[ga] == 1) { /* one rank along a: split, partial and whole are the same data */
        if (have_dim >= 0) cur->dims_mapping[have_dim] = -1;
        if (want_dim >= 0) cur->dims_mapping[want_dim] = (int8_t)a;
        uint8_t bit = (uint8_t)(1u << a);
        cur->partial = (uint8_t)((cur->partial & ~bit) | (gather_only ? 0 : want->partial & bit));
        cur->partial_avg = (uint8_t)((cur->partial_avg & ~bit) | (gather_only ? 0 : want->partial_avg & bit));
        return t;
    }
    bool partial = cur->partial >> a & 1, want_partial = want->partial >> a & 1;
    if (gather_only) partial = false;
    if (partial && !want_partial) {
        cur->partial &= (uint8_t)~(1u << a);
        int rop = (cur->partial_avg >> a & 1) ? PDDE_REDUCE_AVG : PDDE_REDUCE_SUM;
        cur->partial_avg &= (uint8_t)~(1u << a);
        if (want_dim >= 0 && have_dim < 0) { /* partial -> split: reduce-scatter */
            cur->dims_mapping[want_dim] = (int8_t)a;
            t = reshard_collective(s, PDDE_OP_REDUCE_SCATTER, t, ga, -1, want_dim, rop, cur, phase, slot);
            have_dim = want_dim;
        } else {
            t = reshard_collective(s, PDDE_OP_ALLREDUCE, t, ga, -1, -1, rop, cur, phase, slot);
        }
    }
    if (t && !gather_only && want_partial && !partial && !(want->partial_avg >> a & 1)) {
        /* whole -> partial sum: the first rank along the axis keeps the value, the others zero */
        cur->partial |= (uint8_t)(1u << a);
        t = reshard_push(s, reshard_node(s, PDDE_OP_SCALE, t, ga, -1, -1, cur), phase, slot);
        if (t) t->fparams[0] = s->coords[ga] == 0 ? 1.0f : 0.0f, t->iparams[6] = 0;
    }
    if (t && have_dim >= 0 && want_dim >= 0 && have_dim != want_dim) { /* split on another dim: alltoall */
        cur->dims_mapping[have_dim] = -1, cur->dims_mapping[want_dim] = (int8_t)a;
        t = reshard_collective(s, PDDE_OP_ALLTOALL, t, ga, have_dim, want_dim, 0, cur, phase, slot);
        have_dim = want_dim;
    }
    if (t && have_dim >= 0 && have_dim != want_dim) { /* split -> whole: allgather */
        cur->dims_mapping[have_dim] = -1;
        t = reshard_collective(s, PDDE_OP_ALLGATHER, t, ga, have_dim, -1, 0, cur, phase, slot);
        have_dim = -1;
    }
    if (t && want_dim >= 0 && have_dim < 0) { /* whole -> split: this rank's slice */
        cur->dims_mapping[want_dim] = (int8_t)a;
        t = reshard_push(s, reshard_node(s, PDDE_OP_SLICE, t, ga, -1, want_dim, cur), phase, slot);
        if (t) t->iparams[0] = want_dim, t->iparams[1] = (int32_t)(t->shape[want_dim] * s->coords[ga]), t->iparams[6] = 0;
    }
    return t;
}

/* The chain of nodes turning x, laid out as `have`, into attr want (both on want's mesh), for a
 * consumer in phase `phase`, axis by axis. A dim holds one axis' split at a time, so an axis whose
 * wanted dim is still split over another axis (the two swap dims) only gathers at first and takes its
 * new split after the others moved. */
static pdde_tensor *reshard(pdde_session *s, pdde_tensor *x, const pdde_dist_attr *have, const pdde_dist_attr *want,
                            pdde_phase phase, int slot) {
    pdde_dist_attr cur = *have;
    pdde_tensor *t = x;
    unsigned later = 0;
    int n_axes = want->mesh->ndim;
    for (int a = 0; a < n_axes && t; a++) {
        int want_dim = dim_on_axis(want, x->ndim, a), there = want_dim >= 0 ? cur.dims_mapping[want_dim] : -1;
        if (there >= 0 && there != a) later |= 1u << a;
        t = reshard_axis(s, t, &cur, want, a, later >> a & 1, phase, slot);
    }
    for (int a = 0; a < n_axes && t; a++)
        if (later >> a & 1) t = reshard_axis(s, t, &cur, want, a, false, phase, slot);
    return t;
}

/* After an update ran on a slice of a whole parameter: allgather the slices into the parameter itself
 * (the node writes the parameter's memory: src0 is the parameter, src1 the updated slice). */
static pdde_status gather_into_param(pdde_session *s, pdde_tensor *update, pdde_tensor *param, int slot) {
    const pdde_dist_attr *want = pdde_op_input_dist(s->g, update, 0);
    int axis = -1, dim = -1;
    for (int d = 0; d < param->ndim; d++)
        if (want->dims_mapping[d] >= 0 && param->dist.dims_mapping[d] != want->dims_mapping[d]) {
            if (axis >= 0) return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s: an update split over two mesh axes", update->name);
            axis = graph_axis(s, want->mesh, want->dims_mapping[d]), dim = d;
        }
    if (axis < 0) return PDDE_OK;
    pdde_tensor *src[2] = {param, update};
    pdde_tensor *t = new_node(s->g, PDDE_OP_ALLGATHER, param->dtype, param->ndim, param->shape, 2, src);
    if (!t || session_push(s, t, slot)) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    t->phase = update->phase;
    t->dist = param->dist;
    t->flags |= PDDE_TENSOR_INPLACE;
    t->iparams[4] = axis, t->iparams[5] = dim, t->iparams[6] = 1;
    return PDDE_OK;
}

/* The local shape of a tensor of global shape gshape laid out as a; false if a split dim does not divide. */
static bool local_shape_of(const int64_t *gshape, int ndim, const pdde_dist_attr *a, int64_t *shape) {
    memcpy(shape, gshape, PDDE_MAX_DIMS * sizeof *shape);
    for (int d = 0; a->mesh && d < ndim; d++) {
        int ax = a->dims_mapping[d];
        if (ax < 0) continue;
        if (shape[d] % a->mesh->shape[ax]) return false;
        shape[d] /= a->mesh->shape[ax];
    }
    return true;
}

/* What a tensor became for a requirement (resharded, or sent/received across stages): made once and
 * read by every consumer with that requirement, so a partial activation read by three ops is reduced
 * once, not three times. Leaves that change in place during a step are the exception: gradient
 * accumulators and optimizer state (in backward and in the update) and parameters (in the update), so
 * their copies serve one phase, and a parameter's forward copy serves backward too. */
static bool cache_reusable(const pdde_tensor *x, pdde_phase made, pdde_phase now) {
    if (x->op != PDDE_OP_NONE || made == now) return true;
    return !(x->flags & (PDDE_TENSOR_STATE | PDDE_TENSOR_GRAD)) && made != PDDE_PHASE_OPTIMIZER && now != PDDE_PHASE_OPTIMIZER;
}

typedef struct { pdde_tensor *x, *node; pdde_dist_attr want; pdde_phase phase; } reshard_done;
typedef struct { reshard_done *items; int n, cap; } reshard_cache;

static pdde_tensor *cache_find(const reshard_cache *c, const pdde_tensor *x, const pdde_dist_attr *want, pdde_phase phase) {
    for (int i = 0; i < c->n; i++)
        if (c->items[i].x == x && attr_equal(&c->items[i].want, want) && cache_reusable(x, c->items[i].phase, phase))
            return c->items[i].node;
    return NULL;
}

static pdde_status cache_add(pdde_session *s, reshard_cache *c, pdde_tensor *x, const pdde_dist_attr *want, pdde_phase phase,
                             pdde_tensor *node) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        reshard_done *items = realloc(c->items, (size_t)cap * sizeof *items);
        if (!items) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        c->items = items, c->cap = cap;
    }
    c->items[c->n++] = (reshard_done){x, node, *want, phase};
    return PDDE_OK;
}

/* Tensors crossing pipeline stages: a producer on one mesh, a consumer on another of the same shape.
 * The rank at each place of the producer's mesh sends to the rank at the same place of the consumer's,
 * the tensor resharded first (on the producer's mesh) to the mapping the consumer requires. Each
 * (tensor, requirement) crosses once per micro-batch (reshard_cache). */
static pdde_tensor *cross_stages(pdde_session *s, reshard_cache *done, pdde_tensor *consumer, int k,
                                 const pdde_dist_attr *want, pdde_status *st) {
    pdde_tensor *x = consumer->src[k], *node = cache_find(done, x, want, consumer->phase);
    if (node) return node;
    const pdde_mesh *from = x->dist.mesh, *to = want->mesh;
    bool same_shape = from->ndim == to->ndim;
    for (int a = 0; same_shape && a < to->ndim; a++) same_shape = from->shape[a] == to->shape[a];
    if (!same_shape) {
        *st = pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s reads %s from a mesh of another shape (send/recv pairs ranks of equal-shaped meshes)",
                         consumer->name, x->name);
        return NULL;
    }
    int here_from = mesh_index_of(from, s->rank), here_to = mesh_index_of(to, s->rank);
    if (here_from >= 0 && here_to >= 0) {
        *st = pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s moves between two meshes that share rank %d (pipeline stages must not overlap)",
                         x->name, s->rank);
        return NULL;
    }
    int slot = s->slot[consumer->id], tag = (consumer->id * PDDE_MAX_SRC + k) & 0xfffff;
    if (here_from >= 0) { /* producer side: reshard here to the consumer's mapping, then send */
        pdde_dist_attr there = *want;
        there.mesh = from;
        pdde_tensor *r = dist_same(&x->dist, &there, x->ndim) ? x : reshard(s, x, &x->dist, &there, consumer->phase, slot);
        node = r ? new_node(s->g, PDDE_OP_SEND, x->dtype, r->ndim, r->shape, 1, &r) : NULL;
        if (node) node->iparams[0] = to->ranks[here_from], node->dist = there, node->flags |= PDDE_TENSOR_VIEW;
    } else { /* consumer side: receive the block this rank needs */
        int64_t shape[PDDE_MAX_DIMS];
        local_shape_of(s->global_shapes[x->id], x->ndim, want, shape);
        node = new_node(s->g, PDDE_OP_RECV, x->dtype, x->ndim, shape, 0, NULL);
        if (node) node->iparams[0] = from->ranks[here_to], node->dist = *want;
    }
    if (node) node->iparams[1] = tag, node->phase = consumer->phase;
    if (!node || session_push(s, node, slot) || session_track(s)) {
        *st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        return NULL;
    }
    *st = cache_add(s, done, x, want, consumer->phase, node);
    return *st ? NULL : node;
}

/* What input k of node needs (on this rank, which runs node): x as it is, resharded, seen on a slice
 * of its mesh, or received from another stage. NULL with *st set on failure. */
static pdde_tensor *session_input(pdde_session *s, reshard_cache *cache, pdde_tensor *node, int k, pdde_status *st) {
    const pdde_dist_attr *want = pdde_op_input_dist(s->g, node, k);
    pdde_tensor *x = node->src[k];
    if (!want || !want->mesh || !x->dist.mesh || attr_equal(&x->dist, want)) return x;
    pdde_tensor *done = cache_find(cache, x, want, node->phase);
    if (done) return done;
    pdde_dist_attr have = x->dist;
    if (!mesh_same(x->dist.mesh, want->mesh)) {
        int p = mesh_sub_axis(x->dist.mesh, want->mesh);
        if (p < 0) return cross_stages(s, cache, node, k, want, st);
        if (attr_uses_axis(&x->dist, p)) {
            *st = pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s reads %s, split or partial over mesh axis %s, on a slice across that axis",
                             node->name, x->name, x->dist.mesh->names[p]);
            return NULL;
        }
        have = attr_on_mesh(&x->dist, want->mesh); /* the same local data, fewer ranks */
    }
    if (dist_same(&have, want, x->ndim)) return x;
    pdde_tensor *r = reshard(s, x, &have, want, node->phase, s->slot[node->id]);
    *st = r ? cache_add(s, cache, x, want, node->phase, r) : pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    return *st ? NULL : r;
}

/* Vocab-parallel ops (Megatron's; Paddle's c_embedding and c_softmax_with_cross_entropy, chosen from
 * the dist attrs as a DistributedOperatorImpl is): where completion left the vocab dim of an
 * embedding table, of its gradient or of the logits split over a mesh axis, the plain kernel would
 * take the local block for the whole vocab. The node gets its distributed form through iparams:
 * [0] = the first vocab id this rank holds, [1] = the whole vocab, [2] = the graph mesh axis (whose
 * communicator the cross-entropy reduces its rows on). The embeddings stay the device's kernels
 * (ids outside the range: zero rows, or skipped); the cross-entropy is run by the session
 * (run_cross_entropy_vocab). An axis of size 1 leaves the whole vocab here: nothing to do. */
static pdde_status session_vocab_parallel(pdde_session *s, pdde_tensor *t) {
    const pdde_dist_attr *a;
    int dim;
    int64_t local;
    switch (t->op) {
    case PDDE_OP_EMBEDDING: a = pdde_op_input_dist(s->g, t, 0), dim = 0, local = t->src[0]->shape[0]; break;
    case PDDE_OP_EMBEDDING_BACK: a = &t->dist, dim = 0, local = t->shape[0]; break;
    case PDDE_OP_CROSS_ENTROPY: case PDDE_OP_CROSS_ENTROPY_BACK: a = pdde_op_input_dist(s->g, t, 0), dim = 1, local = t->src[0]->shape[1]; break;
    default: return PDDE_OK;
    }
    if (!a || !a->mesh || a->dims_mapping[dim] < 0) return PDDE_OK;
    int axis = graph_axis(s, a->mesh, a->dims_mapping[dim]), n = s->mesh->shape[axis];
    if (n == 1) return PDDE_OK;
    if (local * n > INT32_MAX)
        return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s: a vocab of %lld split over mesh axis %s exceeds int32 ids",
                          t->name, (long long)(local * n), s->mesh->names[axis]);
    t->iparams[0] = (int32_t)(local * s->coords[axis]), t->iparams[1] = (int32_t)(local * n), t->iparams[2] = axis;
    session_device *sd = &s->devs[s->slot[t->id]];
    bool runs = t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_CROSS_ENTROPY_BACK ? sd->host : sd->iface->supports_op(sd->dev, t);
    if (!runs)
        return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "session: %s: %s with the vocab split over mesh axis %s needs a device that runs "
                          "its vocab-parallel form (the CPU's)", t->name, pdde_op_name(t->op), s->mesh->names[axis]);
    return PDDE_OK;
}

/* Data parallelism's overlap, from the attributes: a gradient accumulator holding a pending reduction
 * (partial over dp) is reduced where the update requires it, in the optimizer phase. That collective
 * is started instead right after the accumulator's last grad_accum in backward (in the step's last
 * micro-batch), so it travels while the rest of backward runs, and a COMM_WAIT takes its place before
 * the optimizer. The early start only happens in a run that ends with the update (s->early_starts);
 * otherwise (backward alone, one call per micro-batch) the wait runs the reduction itself. Host memory
 * and collectives that need no packing only; the others stay where they are. */
static pdde_status overlap_gradient_reductions(pdde_session *s) {
    for (int i = 0; i < s->n_order && s->overlap_gradients; i++) {
        pdde_tensor *c = s->order[i], *acc = c->src[0];
        bool reduction = c->iparams[6] == 1 && c->phase == PDDE_PHASE_OPTIMIZER && c->nsrc == 1 &&
                         (c->op == PDDE_OP_ALLREDUCE || (c->op == PDDE_OP_REDUCE_SCATTER && c->iparams[5] == 0));
        if (!reduction || acc->op != PDDE_OP_NONE || !(acc->flags & PDDE_TENSOR_GRAD) || !s->devs[s->slot[c->id]].host) continue;
        int last_write = -1; /* the accumulator's last grad_accum in backward */
        for (int k = 0; k < i; k++)
            if (s->order[k]->op == PDDE_OP_GRAD_ACCUM && s->order[k]->src[0] == acc) last_write = k;
        if (last_write < 0) continue;
        for (int k = i + 1; k < s->n_order; k++) /* its readers read the wait instead */
            for (int j = 0; j < s->order[k]->nsrc; j++)
                if (s->order[k]->src[j] == c) s->order[k]->src[j] = NULL;
        pdde_tensor *w = new_node(s->g, PDDE_OP_COMM_WAIT, c->dtype, c->ndim, c->shape, 1, &c);
        if (!w || session_push(s, w, s->slot[c->id])) return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        w->phase = PDDE_PHASE_OPTIMIZER, w->flags |= PDDE_TENSOR_VIEW, w->dist = c->dist;
        for (int k = i + 1; k < s->n_order - 1; k++)
            for (int j = 0; j < s->order[k]->nsrc; j++)
                if (!s->order[k]->src[j]) s->order[k]->src[j] = w;
        /* the collective moves up to just after the last write, and the wait (appended) takes its place */
        memmove(&s->order[last_write + 2], &s->order[last_write + 1], (size_t)(i - last_write - 1) * sizeof *s->order);
        s->order[last_write + 1] = c;
        memmove(&s->order[i + 2], &s->order[i + 1], (size_t)(s->n_order - i - 2) * sizeof *s->order);
        s->order[i + 1] = w; /* after the node that was before the collective */
        i++;
        c->phase = PDDE_PHASE_BACKWARD, c->iparams[3] = 1; /* [3]: started early, completed by its wait */
        c->layer = acc->layer; /* (it runs in the pass of its accumulator's layer) */
    }
    return s->requests || (s->requests = calloc((size_t)s->g->n, sizeof *s->requests)) ? PDDE_OK
                                                                                       : pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
}

/* The nodes scheduled from position `from` on that have no layer get `layer` (pipeline chunks run
 * by layer: see session_setup_micro). */
static void inherit_layer(pdde_session *s, int from, int layer) {
    for (int i = from; i < s->n_order; i++)
        if (s->order[i]->layer < 0) s->order[i]->layer = layer;
}

static pdde_status session_partition(pdde_session *s, int n_user_nodes) {
    pdde_graph *g = s->g;
    int n = g->n; /* the user's nodes and the copies between devices */
    if (!g->planner || g->planner->n_completed < n_user_nodes)
        return pdde_error(s->ctx, PDDE_ERR_STATE, "session: SPMD execution needs pdde_complete on the whole graph first");
    s->mesh = g->planner->mesh;
    s->rank = pdde_comm_rank(s->world);
    if (pdde_comm_size(s->world) != s->mesh->n_ranks)
        return pdde_error(s->ctx, PDDE_ERR_DIST_ATTR, "session: the mesh has %d ranks, the world %d", s->mesh->n_ranks, pdde_comm_size(s->world));
    pdde_status st = pdde_mesh_coords(s->mesh, s->rank, s->coords);
    if (st) return pdde_error(s->ctx, st, "session: rank %d is not in the graph's mesh", s->rank);
    /* one communicator per mesh axis: ranks whose other coordinates agree */
    for (int a = 0; a < s->mesh->ndim && !st; a++) {
        int color = 0;
        for (int b = 0; b < s->mesh->ndim; b++)
            if (b != a) color = color * s->mesh->shape[b] + s->coords[b];
        st = pdde_comm_split(s->world, color, s->coords[a], &s->axis_comm[a]);
    }
    if (st) return st;
    /* partition: local shapes (global ones saved) */
    if (!(s->global_shapes = malloc((size_t)n * sizeof *s->global_shapes)) || !(s->elsewhere = calloc((size_t)n, sizeof *s->elsewhere)))
        return pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
    s->n_global_shapes = n;
    for (int i = 0; i < n; i++) {
        pdde_tensor *t = g->nodes[i];
        memcpy(s->global_shapes[i], t->shape, sizeof t->shape);
        if (!local_shape_of(s->global_shapes[i], t->ndim, &t->dist, t->shape)) {
            char attr[128];
            pdde_dist_attr_str(&t->dist, attr, sizeof attr);
            return pdde_error(s->ctx, PDDE_ERR_DIST_ATTR, "session: %s cannot be split as %s", t->name, attr);
        }
    }
    /* reshard: walk the schedule, keeping this rank's nodes and inserting the conversions each op needs
     * of its inputs; where another stage's node reads a tensor of this rank's stage, the send */
    pdde_tensor **old = s->order;
    int n_old = s->n_order;
    s->order = NULL, s->n_order = s->cap_order = 0;
    reshard_cache cache = {0};
    for (int i = 0; i < n_old && !st; i++) {
        pdde_tensor *t = old[i];
        int slot = s->slot[t->id];
        if (!on_this_rank(s, t)) {
            s->elsewhere[t->id] = true;
            for (int k = 0; k < t->nsrc && !st; k++) {
                const pdde_dist_attr *want = pdde_op_input_dist(g, t, k);
                int mark = s->n_order;
                if (want && on_this_rank(s, t->src[k]) && !mesh_same(t->src[k]->dist.mesh, want->mesh) &&
                    mesh_sub_axis(t->src[k]->dist.mesh, want->mesh) < 0)
                    cross_stages(s, &cache, t, k, want, &st);
                inherit_layer(s, mark, t->src[k]->layer); /* a send runs with the layer that produced it */
            }
            s->slot[t->id] = -1;
            continue;
        }
        pdde_tensor *param = t->src[0], *grad = t->nsrc > 1 ? t->src[1] : NULL;
        int mark = s->n_order;
        for (int k = 0; k < t->nsrc && !st && t->id < n; k++) {
            pdde_tensor *r = session_input(s, &cache, t, k, &st);
            if (r) t->src[k] = r;
        }
        inherit_layer(s, mark, t->layer); /* reshards and receives run with their consumer's layer */
        if (!st) st = session_vocab_parallel(s, t);
        if (!st && session_push(s, t, slot)) st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
        /* a sharded update of a whole parameter (ZeRO-1/2): gather the updated shards back into it */
        if (!st && (t->op == PDDE_OP_ADAMW_UPDATE || t->op == PDDE_OP_SGD_UPDATE) && t->src[0] != param)
            st = gather_into_param(s, t, param, slot);
        /* ...and an update that read a slice of a whole gradient accumulator zeroed only the slice */
        if (!st && (t->op == PDDE_OP_ADAMW_UPDATE || t->op == PDDE_OP_SGD_UPDATE) && t->src[1] != grad) {
            pdde_tensor *zero = new_node(g, PDDE_OP_SCALE, grad->dtype, grad->ndim, grad->shape, 1, &grad);
            if (!zero || session_push(s, zero, slot)) st = pdde_error(s->ctx, PDDE_ERR_OOM, "session: out of memory");
            else zero->phase = t->phase, zero->flags |= PDDE_TENSOR_INPLACE, zero->dist = grad->dist, zero->fparams[0] = 0.0f;
        }
    }
    free(cache.items);
    free(old);
    return st ? st : overlap_gradient_reductions(s);
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
    int from = t->iparams[5], to = t->iparams[7];
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

/* An SPMD reshard collective, blocking: allreduce, reduce-scatter, allgather or alltoall along tensor
 * dims, from in (x's data) to out (t's), both in host memory. */
static pdde_status reshard_on_host(pdde_session *s, pdde_tensor *t, const pdde_tensor *x, char *in, char *out) {
    pdde_comm *c = s->axis_comm[t->iparams[4]];
    int dim = t->iparams[5], n = pdde_comm_size(c);
    size_t nin = (size_t)pdde_tensor_numel(x), nout = (size_t)pdde_tensor_numel(t), esz = pdde_dtype_size(t->dtype);
    if (t->op == PDDE_OP_ALLREDUCE) return pdde_comm_allreduce(c, in, out, nin, t->dtype, (pdde_reduce_op)t->iparams[0]);
    if (t->op == PDDE_OP_ALLTOALL) return run_alltoall(s, c, n, x, in, t, out);
    char *tmp = dim == 0 ? NULL : malloc((t->op == PDDE_OP_ALLGATHER ? nout : nin) * esz);
    if (dim != 0 && !tmp) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
    pdde_status st;
    if (t->op == PDDE_OP_REDUCE_SCATTER) {
        if (tmp) blocks_along(tmp, in, x->shape, x->ndim, dim, n, esz, true);
        st = pdde_comm_reduce_scatter(c, tmp ? tmp : in, out, nout, t->dtype, (pdde_reduce_op)t->iparams[0]);
    } else {
        st = pdde_comm_allgather(c, in, tmp ? tmp : out, nin, t->dtype);
        if (!st && tmp) blocks_along(tmp, out, t->shape, t->ndim, dim, n, esz, false);
    }
    free(tmp);
    return st;
}

/* A gradient reduction moved up by overlap_gradient_reductions, started without waiting (host memory,
 * no packing: that function only moves those); its COMM_WAIT completes it. */
static pdde_status start_reduction(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *x = t->src[0];
    pdde_comm *c = s->axis_comm[t->iparams[4]];
    char *in = (char *)x->data + x->offset, *out = (char *)t->data + t->offset;
    pdde_comm_request **req = (pdde_comm_request **)&s->requests[t->id];
    return t->op == PDDE_OP_ALLREDUCE
               ? pdde_comm_iallreduce(c, in, out, (size_t)pdde_tensor_numel(x), t->dtype, (pdde_reduce_op)t->iparams[0], req)
               : pdde_comm_ireduce_scatter(c, in, out, (size_t)pdde_tensor_numel(t), t->dtype, (pdde_reduce_op)t->iparams[0], req);
}

/* A reshard, blocking; on device memory through host memory (the transport reads host buffers). */
static pdde_status run_reshard(pdde_session *s, pdde_tensor *t) {
    pdde_tensor *x = t->src[t->nsrc - 1]; /* (a write-back allgather reads its second input) */
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
 * of the vocab, split over mesh axis iparams[2] (session_vocab_parallel): Megatron's vocab-parallel
 * cross-entropy. Per row: the max over the whole vocab (allreduce MAX), then the sum of exp(l - max)
 * and the target's logit where this rank holds it, 0 elsewhere (one allreduce SUM of both); loss =
 * mean over the rows with a target of log(sum) + max - target logit: rows, not [N, V] logits, cross
 * the wire. The backward recomputes the two reductions rather than keeping them from the forward:
 * micro-batches run through per-micro-batch arenas, and recomputing needs no storage that outlives
 * a node. Host helpers of the executor rather than CPU kernels: the row statistics interleave with
 * collectives on the axis communicator, which backends never see, and SPMD runs on host memory. */
static pdde_status run_cross_entropy_vocab(pdde_session *s, pdde_tensor *t) {
    const pdde_tensor *lt = t->src[0];
    int64_t N = lt->shape[0], V = lt->shape[1], first = t->iparams[0], vocab = t->iparams[1];
    const float *logits = (const float *)((const char *)lt->data + lt->offset);
    const int32_t *tg = (const int32_t *)((const char *)t->src[1]->data + t->src[1]->offset);
    pdde_comm *c = s->axis_comm[t->iparams[2]];
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
        return pdde_error(s->ctx, st, "%s: %s", t->name, pdde_last_error(s->ctx));
    }
    float *out = (float *)((char *)t->data + t->offset);
    if (t->op == PDDE_OP_CROSS_ENTROPY) {
        double loss = 0;
        for (int64_t r = 0; r < N; r++)
            if (tg[r] >= 0 && tg[r] < vocab) loss += logf(sum[r]) + mx[r] - target[r];
        out[0] = (float)(loss / (double)(count ? count : 1));
    } else { /* dlogits = (softmax - onehot) * dloss / count, on this rank's columns */
        const pdde_tensor *dl = t->src[2];
        float dscale = ((const float *)((const char *)dl->data + dl->offset))[0] / (float)(count ? count : 1);
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
#endif
