/* core/autodiff.c — autodiff. Walks the forward nodes in reverse creation order and appends, for every node whose
 * gradient is known, the nodes computing its inputs' gradients. Several uses of a tensor add up. */
/* (A part of pdde.c, included there in layer order: it uses the parts before it.) */

static pdde_tensor *node_with(pdde_graph *g, pdde_op op, const pdde_tensor *like, int nsrc, pdde_tensor *const *src) {
    return new_node(g, op, PDDE_F32, like->ndim, like->shape, nsrc, src);
}

/* dy reduced to x's shape (the gradient of a broadcast). */
static pdde_tensor *grad_sum_to(pdde_graph *g, pdde_tensor *dy, const pdde_tensor *x) {
    if (!dy || same_shape(dy, x)) return dy;
    return node_with(g, PDDE_OP_SUM_TO, x, 1, &dy);
}

/* The gradient of a matmul input that may have been broadcast over the batch: sum it back. */
static pdde_tensor *grad_matmul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b, int ta, int tb, const pdde_tensor *like) {
    return grad_sum_to(g, pdde_matmul(g, a, b, ta, tb), like);
}

static pdde_tensor *flatten_rows(pdde_graph *g, pdde_tensor *x) {
    int64_t shape[2] = {1, x->shape[x->ndim - 1]};
    for (int d = 0; d < x->ndim - 1; d++) shape[0] *= x->shape[d]; /* (not numel / last: the last may be 0) */
    return x->ndim == 2 ? x : pdde_reshape(g, x, 2, shape);
}

static void backward_matmul(pdde_graph *g, pdde_tensor *y, pdde_tensor *dy, pdde_tensor **dsrc) {
    pdde_tensor *a = y->src[0], *b = y->src[1];
    int ta = pdde_op_i32(y, PDDE_P_MATMUL_TRANS_A), tb = pdde_op_i32(y, PDDE_P_MATMUL_TRANS_B);
    if (a->dtype != PDDE_F32) dy = pdde_cast(g, dy, a->dtype); /* the gradient GEMMs in bf16/f16 too */
    dsrc[0] = ta ? grad_matmul(g, b, dy, tb, 1, a) : grad_matmul(g, dy, b, 0, !tb, a);
    if (b->ndim == 2 && a->ndim > 2 && !ta) {
        /* b shared over the batch: one GEMM over all rows instead of a batched GEMM and a sum */
        pdde_tensor *a2 = flatten_rows(g, a), *dy2 = flatten_rows(g, dy);
        dsrc[1] = tb ? pdde_matmul(g, dy2, a2, 1, 0) : pdde_matmul(g, a2, dy2, 1, 0);
    } else {
        dsrc[1] = tb ? grad_matmul(g, dy, a, 1, ta, b) : grad_matmul(g, a, dy, !ta, 0, b);
    }
}

static pdde_tensor *expand_back(pdde_graph *g, pdde_tensor *y, pdde_tensor *dy, float scale) {
    pdde_tensor *x = y->src[0];
    int axis = pdde_op_i32(y, PDDE_P_REDUCE_AXIS);
    int64_t shape[PDDE_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = (axis == -1 || i == axis) ? 1 : x->shape[i];
    pdde_tensor *dyk = pdde_reshape(g, dy, x->ndim, shape);
    pdde_tensor *t = node_with(g, PDDE_OP_EXPAND, x, 1, &dyk);
    if (t) pdde_op_set_f32(t, PDDE_P_SCALE, scale);
    return t;
}

/* Fills dsrc[i] with the gradient of y's i-th input given dy (NULL where none). */
static void backward_node(pdde_graph *g, pdde_tensor *y, pdde_tensor *dy, pdde_tensor **dsrc, pdde_tensor **grads) {
    pdde_tensor *x = y->src[0];
    switch (y->op) {
    case PDDE_OP_MATMUL: backward_matmul(g, y, dy, dsrc); break;
    case PDDE_OP_ADD:
        dsrc[0] = grad_sum_to(g, dy, x);
        dsrc[1] = grad_sum_to(g, dy, y->src[1]);
        break;
    case PDDE_OP_SUB:
        dsrc[0] = grad_sum_to(g, dy, x);
        dsrc[1] = pdde_scale(g, grad_sum_to(g, dy, y->src[1]), -1.0f);
        break;
    case PDDE_OP_MUL:
        dsrc[0] = grad_sum_to(g, pdde_mul(g, dy, y->src[1]), x);
        dsrc[1] = grad_sum_to(g, pdde_mul(g, dy, x), y->src[1]);
        break;
    case PDDE_OP_SCALE: dsrc[0] = pdde_scale(g, dy, pdde_op_f32(y, PDDE_P_SCALE)); break;
    case PDDE_OP_GELU: case PDDE_OP_RELU: case PDDE_OP_SILU: {
        pdde_op back = y->op == PDDE_OP_GELU ? PDDE_OP_GELU_BACK : y->op == PDDE_OP_RELU ? PDDE_OP_RELU_BACK : PDDE_OP_SILU_BACK;
        pdde_tensor *src[2] = {x, dy};
        dsrc[0] = node_with(g, back, x, 2, src);
        break;
    }
    case PDDE_OP_BIAS_GELU: { /* the gradient of x + bias, then that sum's backward (as ADD's) */
        pdde_tensor *src[3] = {x, y->src[1], dy};
        pdde_tensor *dpre = node_with(g, PDDE_OP_BIAS_GELU_BACK, x, 3, src);
        dsrc[0] = dpre;
        dsrc[1] = grad_sum_to(g, dpre, y->src[1]);
        break;
    }
    case PDDE_OP_LAYERNORM: case PDDE_OP_RMSNORM: {
        bool ln = y->op == PDDE_OP_LAYERNORM;
        pdde_tensor *src[3] = {x, y->src[1], dy}, *gsrc[2] = {x, dy};
        dsrc[0] = node_with(g, ln ? PDDE_OP_LAYERNORM_BACK : PDDE_OP_RMSNORM_BACK, x, 3, src);
        dsrc[1] = node_with(g, ln ? PDDE_OP_LAYERNORM_BACK_GAMMA : PDDE_OP_RMSNORM_BACK_GAMMA, y->src[1], 2, gsrc);
        if (ln) dsrc[2] = grad_sum_to(g, dy, y->src[2]);
        for (int i = 0; i < 2; i++)
            if (dsrc[i]) pdde_op_set_f32(dsrc[i], PDDE_P_NORM_EPS, pdde_op_f32(y, PDDE_P_NORM_EPS));
        break;
    }
    case PDDE_OP_ROPE: /* a rotation: its gradient is dy rotated back */
        dsrc[0] = node_with(g, PDDE_OP_ROPE, x, 1, &dy);
        if (dsrc[0]) pdde_op_params_copy(dsrc[0], y), pdde_op_set_i32(dsrc[0], PDDE_P_ROPE_INVERSE, !pdde_op_i32(y, PDDE_P_ROPE_INVERSE));
        break;
    case PDDE_OP_SOFTMAX: {
        pdde_tensor *src[2] = {y, dy};
        dsrc[0] = node_with(g, PDDE_OP_SOFTMAX_BACK, x, 2, src);
        break;
    }
    case PDDE_OP_ATTENTION: {
        if (pdde_op_i32(y, PDDE_P_ATTENTION_QKV_D) > 0) { /* packed: dqkv in qkv's layout, no slices */
            pdde_tensor *src[4] = {x, y, dy, y->nsrc > 1 ? y->src[1] : NULL}; /* (the starts, if any, last) */
            dsrc[0] = new_node(g, PDDE_OP_ATTENTION_BACK, PDDE_F32, x->ndim, x->shape, y->nsrc > 1 ? 4 : 3, src);
            if (dsrc[0]) pdde_op_params_copy(dsrc[0], y);
            break;
        }
        /* one node computes dq, dk, dv (stacked on a new leading dim); each input takes its slice */
        pdde_tensor *src[6] = {x, y->src[1], y->src[2], y, dy, y->nsrc > 3 ? y->src[3] : NULL};
        int64_t shape[5] = {3, x->shape[0], x->shape[1], x->shape[2], x->shape[3]};
        pdde_tensor *back = new_node(g, PDDE_OP_ATTENTION_BACK, PDDE_F32, 5, shape, y->nsrc > 3 ? 6 : 5, src);
        if (back) pdde_op_set_f32(back, PDDE_P_ATTENTION_SCALE, pdde_op_f32(y, PDDE_P_ATTENTION_SCALE));
        for (int i = 0; i < 3; i++) dsrc[i] = pdde_reshape(g, pdde_slice(g, back, 0, i, 1), 4, x->shape);
        break;
    }
    case PDDE_OP_CROSS_ENTROPY: {
        pdde_tensor *src[3] = {x, y->src[1], dy};
        dsrc[0] = node_with(g, PDDE_OP_CROSS_ENTROPY_BACK, x, 3, src);
        break;
    }
    case PDDE_OP_EMBEDDING: {
        /* scatter-add into the table's gradient so far (in place), touching only the rows used */
        pdde_tensor *table = x, *base = grads[table->id];
        pdde_tensor *src[3] = {base, y->src[1], dy};
        dsrc[0] = base ? node_with(g, PDDE_OP_EMBEDDING_BACK, table, 3, src) : node_with(g, PDDE_OP_EMBEDDING_BACK, table, 2, src + 1);
        if (dsrc[0] && base) dsrc[0]->flags |= PDDE_TENSOR_INPLACE;
        if (dsrc[0]) grads[table->id] = NULL; /* dsrc[0] already holds the sum */
        break;
    }
    case PDDE_OP_RESHAPE: dsrc[0] = pdde_reshape(g, dy, x->ndim, x->shape); break;
    case PDDE_OP_PERMUTE: {
        int inv[PDDE_MAX_DIMS];
        for (int i = 0; i < y->ndim; i++) inv[pdde_op_i32(y, PDDE_P_PERMUTE_DIM0 + i)] = i;
        dsrc[0] = pdde_permute(g, dy, inv);
        break;
    }
    case PDDE_OP_CONCAT: {
        int axis = pdde_op_i32(y, PDDE_P_CONCAT_AXIS);
        int64_t start = 0;
        for (int i = 0; i < y->nsrc; i++) {
            dsrc[i] = pdde_slice(g, dy, axis, start, y->src[i]->shape[axis]);
            start += y->src[i]->shape[axis];
        }
        break;
    }
    case PDDE_OP_SLICE: {
        dsrc[0] = node_with(g, PDDE_OP_SLICE_BACK, x, 1, &dy);
        if (dsrc[0]) pdde_op_params_copy(dsrc[0], y); /* its axis and start */
        break;
    }
    case PDDE_OP_SUM: dsrc[0] = expand_back(g, y, dy, 1.0f); break;
    case PDDE_OP_MEAN: /* (an empty x has an empty gradient: no factor to compute) */
        dsrc[0] = expand_back(g, y, dy, pdde_tensor_numel(x) ? (float)pdde_tensor_numel(y) / (float)pdde_tensor_numel(x) : 0.0f);
        if (dsrc[0]) pdde_op_set_i32(dsrc[0], PDDE_P_EXPAND_MEAN_OF, y->id + 1); /* (lowering makes its factor the local mean's) */
        break;
    case PDDE_OP_DROPOUT: {
        dsrc[0] = node_with(g, PDDE_OP_DROPOUT_BACK, x, 1, &dy);
        if (dsrc[0]) pdde_op_params_copy(dsrc[0], y); /* its p and seed: the same mask */
        break;
    }
    /* (gradients are f32: the one of a low-precision copy passes through to its f32 original) */
    case PDDE_OP_CAST: dsrc[0] = x->dtype != PDDE_F32 ? NULL : dy->dtype == PDDE_F32 ? dy : pdde_cast(g, dy, PDDE_F32); break;
    case PDDE_OP_MOE_TOPK: case PDDE_OP_MOE_GATE: case PDDE_OP_MOE_COUNTS: case PDDE_OP_MOE_DISPATCH:
    case PDDE_OP_MOE_COMBINE: case PDDE_OP_MOE_GROUPED_MATMUL: case PDDE_OP_MOE_AUX_LOSS: moe_backward(g, y, dy, dsrc); break;
    default:
        graph_fail(g, PDDE_ERR_UNKNOWN_OP, "backward: op %s (%s) has no gradient", pdde_op_name(y->op), y->name);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Recompute (activation checkpointing). The backward pass is emitted in segments, one per run of
 * forward nodes of one layer (walked in reverse). When the segment of a recomputed layer is complete,
 * the layer's forward activations it reads, with everything of the layer they are computed from, are
 * cloned (same op and parameters, inputs mapped onto the clones) and the clones are moved in front of
 * the segment, which then reads them instead. The originals' last readers are then forward nodes, so
 * the memory plan frees them during the forward pass. Working on the emitted segment, rather than
 * predicting what each op's backward reads, keeps the per-op knowledge in backward_node alone. */


typedef struct {
    int layer;              /* layer of the segment being emitted (-1: none) */
    int first;              /* id of the segment's first node */
    pdde_tensor **clone;    /* by forward id: its recomputation, once made */
    bool *want;             /* by forward id: scratch */
} recompute_state;

static bool layer_recomputed(const pdde_graph *g, int layer) {
    return layer >= 0 && layer < g->n_recompute && g->recompute[layer];
}

/* Whether forward node t of `layer` is computed again rather than kept. Losses and outputs are kept to
 * the end of the step anyway; an in-place write into persistent memory (a parameter, state) would be
 * applied twice. */
static bool recomputable(pdde_tensor *t, int layer, int n_fwd) {
    if (t->id >= n_fwd || t->op == PDDE_OP_NONE || t->layer != layer) return false;
    if (t->flags & (PDDE_TENSOR_LOSS | PDDE_TENSOR_OUTPUT)) return false;
    /* a parameter's bf16/f16 copy is kept (its update keeps it across steps: core/optimizer.c) */
    if (t->op == PDDE_OP_CAST && (t->src[0]->flags & PDDE_TENSOR_PARAM)) return false;
    return !((t->flags & PDDE_TENSOR_INPLACE) && is_persistent(storage_root(t->src[0])));
}

/* Reverses nodes [a, b) in place and renumbers them (default names follow their ids). */
static void reverse_nodes(pdde_graph *g, int a, int b) {
    for (int i = a, j = b - 1; i < j; i++, j--) {
        pdde_tensor *t = g->nodes[i];
        g->nodes[i] = g->nodes[j], g->nodes[j] = t;
    }
    for (int i = a; i < b; i++) {
        pdde_tensor *t = g->nodes[i];
        char old[64];
        default_name(t, old);
        t->id = i;
        if (strcmp(t->name, old) == 0) default_name(t, t->name);
    }
}

/* Ends the current segment: if its layer is recomputed, gives it clones of the activations it reads. */
static void recompute_segment(pdde_graph *g, recompute_state *rc, int n_fwd) {
    int layer = rc->layer, first = rc->first, end = g->n;
    if (!layer_recomputed(g, layer) || g->status) return;
    memset(rc->want, 0, (size_t)n_fwd * sizeof *rc->want);
    for (int i = first; i < end; i++)
        for (int k = 0; k < g->nodes[i]->nsrc; k++) {
            pdde_tensor *x = g->nodes[i]->src[k];
            if (recomputable(x, layer, n_fwd) && !rc->clone[x->id]) rc->want[x->id] = true;
        }
    for (int i = n_fwd - 1; i >= 0; i--) /* and what they are computed from, within the layer */
        for (int k = 0; rc->want[i] && k < g->nodes[i]->nsrc; k++) {
            pdde_tensor *x = g->nodes[i]->src[k];
            if (recomputable(x, layer, n_fwd) && !rc->clone[x->id]) rc->want[x->id] = true;
        }
    for (int i = 0; i < n_fwd; i++) {
        if (!rc->want[i]) continue;
        pdde_tensor *t = g->nodes[i], *src[PDDE_MAX_SRC];
        for (int k = 0; k < t->nsrc; k++) src[k] = rc->clone[t->src[k]->id] ? rc->clone[t->src[k]->id] : t->src[k];
        pdde_tensor *c = new_node(g, t->op, t->dtype, t->ndim, t->shape, t->nsrc, src);
        if (!c) return;
        /* the params carry dropout's seed; the executor gives every dropout node the same run
         * counter, so the clone draws the original's mask */
        pdde_op_params_copy(c, t);
        c->flags = t->flags & (PDDE_TENSOR_VIEW | PDDE_TENSOR_INPLACE); /* views of the clones */
        c->layer = t->layer, c->device = t->device;
        rc->clone[i] = c;
    }
    if (g->n == end) return;
    for (int i = first; i < end; i++)
        for (int k = 0; k < g->nodes[i]->nsrc; k++) {
            pdde_tensor *x = g->nodes[i]->src[k];
            if (x->id < n_fwd && rc->clone[x->id]) g->nodes[i]->src[k] = rc->clone[x->id];
        }
    /* rotate [segment | clones] into [clones | segment]: creation order stays a topological order */
    reverse_nodes(g, first, end);
    reverse_nodes(g, end, g->n);
    reverse_nodes(g, first, g->n);
}

pdde_status pdde_backward(pdde_graph *g, pdde_tensor *loss) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    if (!loss) return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "backward: the loss is NULL");
    if (loss->id < 0 || loss->id >= g->n || g->nodes[loss->id] != loss)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "backward: the loss %s belongs to another graph", loss->name);
    if (g->has_backward) return pdde_error(g->ctx, PDDE_ERR_STATE, "backward: the graph already has a backward pass");
    if (pdde_tensor_numel(loss) != 1)
        return pdde_error(g->ctx, PDDE_ERR_SHAPE, "backward: the loss %s must be a scalar", loss->name);
    int n_fwd = g->n;
    /* needs[i]: node i depends on a parameter, so its gradient is wanted */
    bool *needs = calloc((size_t)n_fwd, sizeof *needs);
    pdde_tensor **grads = calloc((size_t)n_fwd, sizeof *grads);
    if (!needs || !grads) { free(needs), free(grads); return pdde_error(g->ctx, PDDE_ERR_OOM, "backward: out of memory"); }
    for (int i = 0; i < n_fwd; i++) {
        pdde_tensor *t = g->nodes[i];
        needs[i] = t->flags & PDDE_TENSOR_PARAM;
        for (int s = 0; s < t->nsrc; s++) needs[i] |= needs[t->src[s]->id];
    }
    /* a parameter's gradient is final once its first consumer (lowest id) has been visited: its
     * accumulation is emitted right then, so the gradient memory is freed early and communication of
     * the gradient (data parallel) can start while the rest of the backward pass runs */
    int *first_use = malloc((size_t)n_fwd * sizeof *first_use);
    recompute_state rc = {.layer = -1};
    if (g->n_recompute > 0) {
        rc.clone = calloc((size_t)n_fwd, sizeof *rc.clone);
        rc.want = calloc((size_t)n_fwd, sizeof *rc.want);
    }
    if (!first_use || (g->n_recompute > 0 && (!rc.clone || !rc.want))) {
        free(needs), free(grads), free(first_use), free(rc.clone), free(rc.want);
        return pdde_error(g->ctx, PDDE_ERR_OOM, "backward: out of memory");
    }
    for (int i = 0; i < n_fwd; i++) first_use[i] = -1;
    for (int i = n_fwd - 1; i >= 0; i--)
        for (int s = 0; s < g->nodes[i]->nsrc; s++) first_use[g->nodes[i]->src[s]->id] = i;
    g->has_backward = true;
    loss->flags |= PDDE_TENSOR_LOSS;
    /* each gradient GEMM takes its forward matmul's dtype (backward_matmul), not the region's */
    pdde_dtype region = g->compute_dtype;
    g->compute_dtype = PDDE_F32;
    grads[loss->id] = g->grad_seed = new_const(g, "loss.grad_seed", loss->ndim, loss->shape, 1.0f);
    for (int i = loss->id; i >= 0 && g->status == PDDE_OK; i--) {
        pdde_tensor *y = g->nodes[i], *dy = grads[i];
        if (dy && y->op != PDDE_OP_NONE) {
            if (y->layer != rc.layer) {
                recompute_segment(g, &rc, n_fwd);
                rc.layer = y->layer, rc.first = g->n;
            }
            pdde_graph_set_layer(g, y->layer);
            pdde_tensor *dsrc[PDDE_MAX_SRC] = {0};
            backward_node(g, y, dy, dsrc, grads);
            for (int s = 0; s < y->nsrc; s++) {
                pdde_tensor *x = y->src[s];
                if (!dsrc[s] || !needs[x->id]) continue;
                grads[x->id] = grads[x->id] ? pdde_add(g, grads[x->id], dsrc[s]) : dsrc[s];
            }
        }
        /* parameters whose last gradient contribution came from node i go into their accumulators */
        for (int s = 0; s < y->nsrc && g->status == PDDE_OK; s++) {
            pdde_tensor *p = y->src[s];
            if (!(p->flags & PDDE_TENSOR_PARAM) || first_use[p->id] != i || !grads[p->id] || p->grad) continue;
            char name[80];
            snprintf(name, sizeof name, "%s.grad", p->name);
            pdde_graph_set_layer(g, p->layer);
            pdde_tensor *acc = new_state(g, name, p, PDDE_TENSOR_GRAD);
            pdde_tensor *src[2] = {acc, grads[p->id]};
            pdde_tensor *upd = node_with(g, PDDE_OP_GRAD_ACCUM, p, 2, src);
            if (upd) upd->flags |= PDDE_TENSOR_INPLACE;
            p->grad = acc;
        }
    }
    recompute_segment(g, &rc, n_fwd);
    free(first_use), free(rc.clone), free(rc.want);
    g->compute_dtype = region;
    pdde_graph_set_layer(g, -1);
    free(needs);
    free(grads);
    return g->status;
}
