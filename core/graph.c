/* core/graph.c — graph building. Nodes are created in topological order (a node's inputs exist before it), so the
 * id order is a valid schedule. Errors are sticky: the first one is kept and later calls return NULL. */
/* (A part of pdde.c, included there in layer order: it uses the parts before it.) */

pdde_status pdde_graph_status(const pdde_graph *g) { return g ? g->status : PDDE_ERR_INVALID_ARG; }
pdde_context *pdde_graph_context(const pdde_graph *g) { return g ? g->ctx : NULL; }
int pdde_graph_tensor_count(const pdde_graph *g) { return g ? g->n : 0; }
pdde_tensor *pdde_graph_tensor(const pdde_graph *g, int id) { return g && id >= 0 && id < g->n ? g->nodes[id] : NULL; }

void pdde_graph_set_layer(pdde_graph *g, int layer) {
    if (!g) return;
    if (layer < -1 || layer > PDDE_MAX_LAYER_ID) graph_fail(g, PDDE_ERR_INVALID_ARG, "set_layer: layer %d is not in -1..%d", layer, PDDE_MAX_LAYER_ID);
    else g->layer = layer;
}

pdde_status pdde_graph_set_recompute(pdde_graph *g, int layer, int on) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    if (layer < 0 || layer > PDDE_MAX_LAYER_ID)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "set_recompute: layer %d must be in 0..%d", layer, PDDE_MAX_LAYER_ID);
    /* pdde_backward decides which activations the backward pass reads: too late after it */
    if (g->has_backward)
        return pdde_error(g->ctx, PDDE_ERR_STATE, "set_recompute: layer %d: call before pdde_backward", layer);
    if (layer >= g->n_recompute) {
        if (!on) return PDDE_OK;
        int n = layer + 1 > 2 * g->n_recompute ? layer + 1 : 2 * g->n_recompute;
        uint8_t *r = realloc(g->recompute, (size_t)n);
        if (!r) return pdde_error(g->ctx, PDDE_ERR_OOM, "set_recompute: out of memory");
        memset(r + g->n_recompute, 0, (size_t)(n - g->n_recompute));
        g->recompute = r, g->n_recompute = n;
    }
    g->recompute[layer] = on != 0;
    return PDDE_OK;
}

pdde_status pdde_graph_set_compute_dtype(pdde_graph *g, pdde_dtype dt) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    if (dt != PDDE_F32 && dt != PDDE_BF16 && dt != PDDE_F16)
        return pdde_error(g->ctx, PDDE_ERR_DTYPE, "set_compute_dtype: %s is not a compute dtype (f32, bf16 or f16)", pdde_dtype_name(dt));
    /* the backward pass follows the forward's matmuls; the loss scaling is decided with the optimizer */
    if (g->has_backward)
        return pdde_error(g->ctx, PDDE_ERR_STATE, "set_compute_dtype: %s: call before pdde_backward", pdde_dtype_name(dt));
    g->compute_dtype = dt;
    return PDDE_OK;
}

pdde_tensor *pdde_graph_find(const pdde_graph *g, const char *name) {
    for (int i = 0; g && name && i < g->n; i++)
        if (strcmp(g->nodes[i]->name, name) == 0) return g->nodes[i];
    return NULL;
}

/* The name a node gets unless it is given one: its op and id. */
static void default_name(const pdde_tensor *t, char name[64]) { snprintf(name, 64, "%s.%d", pdde_op_name(t->op), t->id); }

/* The element count of a shape: -1 and *numel when no dim is negative and the product of the
 * nonzero dims is at most 2^60 (bytes of up to 8-byte elements fit in an int64); else the first
 * negative dim, or -2. */
static int shape_numel(int ndim, const int64_t *shape, int64_t *numel) {
    int64_t n = 1;
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return i;
        if (shape[i] == 0) { empty = true; continue; }
        if (shape[i] > ((int64_t)1 << 60) / n) return -2;
        n *= shape[i];
    }
    *numel = empty ? 0 : n;
    return -1;
}

/* Creates a node. Any NULL source means an earlier error: propagate it. */
static pdde_tensor *new_node(pdde_graph *g, pdde_op op, pdde_dtype dt, int ndim, const int64_t *shape, int nsrc,
                             pdde_tensor *const *src) {
    if (!g || g->status != PDDE_OK) return NULL;
    for (int i = 0; i < nsrc; i++) {
        if (!src[i]) return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: input %d is NULL", pdde_op_name(op), i);
        /* a tensor of another graph would be read through ids that mean other nodes here */
        if (src[i]->id < 0 || src[i]->id >= g->n || g->nodes[src[i]->id] != src[i])
            return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: input %d (%s) belongs to another graph", pdde_op_name(op), i, src[i]->name);
    }
    if (ndim < 0 || ndim > PDDE_MAX_DIMS)
        return graph_fail(g, PDDE_ERR_SHAPE, "%s: %d dims (at most %d)", pdde_op_name(op), ndim, PDDE_MAX_DIMS);
    if (ndim > 0 && !shape) return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: shape is NULL", pdde_op_name(op));
    /* zero-sized dims are legal (empty tensors); sizes are bounded so that no byte count, stride or
     * offset computed from them overflows */
    int64_t numel;
    int bad = shape_numel(ndim, shape, &numel);
    if (bad >= 0) return graph_fail(g, PDDE_ERR_SHAPE, "%s: negative dim %d (%lld)", pdde_op_name(op), bad, (long long)shape[bad]);
    if (bad == -2) return graph_fail(g, PDDE_ERR_SHAPE, "%s: more than 2^60 elements (dims of an empty tensor count too)", pdde_op_name(op));
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        pdde_tensor **nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) return graph_fail(g, PDDE_ERR_OOM, "graph: out of memory");
        g->nodes = nodes;
        g->cap = cap;
    }
    pdde_tensor *t = calloc(1, sizeof *t);
    if (!t) return graph_fail(g, PDDE_ERR_OOM, "graph: out of memory");
    t->id = g->n;
    t->op = op;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nsrc = nsrc;
    for (int i = 0; i < nsrc; i++) t->src[i] = src[i];
    t->device = -1;
    t->layer = g->layer;
    t->phase = g->has_optimizer ? PDDE_PHASE_OPTIMIZER : g->has_backward ? PDDE_PHASE_BACKWARD : PDDE_PHASE_FORWARD;
    default_name(t, t->name);
    g->nodes[g->n++] = t;
    return t;
}

pdde_status pdde_tensor_set_name(pdde_tensor *t, const char *name) {
    if (!t || !name || strlen(name) >= sizeof t->name) return PDDE_ERR_INVALID_ARG;
    strcpy(t->name, name);
    return PDDE_OK;
}

static int leaf_name_cmp(const void *a, const void *b) {
    const pdde_tensor *x = *(pdde_tensor *const *)a, *y = *(pdde_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

/* Checkpoints, snapshots and pdde_graph_find know an input, parameter or state by its name:
 * pdde_param and pdde_input refuse a name in use, but pdde_tensor_set_name (which has no graph) can
 * give one a leaf's name after; a session refuses such a graph before it trains and saves. */
static pdde_status graph_check_leaf_names(pdde_graph *g) {
    pdde_tensor **leaves = malloc((size_t)g->n * sizeof *leaves);
    if (!leaves) return pdde_error(g->ctx, PDDE_ERR_OOM, "graph: out of memory");
    int n = 0;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->op == PDDE_OP_NONE) leaves[n++] = g->nodes[i];
    qsort(leaves, (size_t)n, sizeof *leaves, leaf_name_cmp);
    pdde_status st = PDDE_OK;
    for (int i = 1; i < n && !st; i++)
        if (!strcmp(leaves[i - 1]->name, leaves[i]->name))
            st = pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "session: tensors %d and %d are both named %s (pdde_tensor_set_name?): a checkpoint "
                            "could not tell them apart; give each input, parameter and state its own name", leaves[i - 1]->id, leaves[i]->id,
                            leaves[i]->name);
    free(leaves);
    return st;
}

void pdde_mark_output(pdde_tensor *t) { if (t) t->flags |= PDDE_TENSOR_OUTPUT; }
void pdde_mark_state(pdde_tensor *t) { if (t && t->op == PDDE_OP_NONE && (t->flags & PDDE_TENSOR_INPUT)) t->flags |= PDDE_TENSOR_STATE; }

static pdde_tensor *new_leaf(pdde_graph *g, const char *name, pdde_dtype dt, int ndim, const int64_t *shape,
                             uint32_t flags) {
    if (!g || g->status != PDDE_OK) return NULL;
    if ((unsigned)dt >= PDDE_DTYPE_COUNT) return graph_fail(g, PDDE_ERR_DTYPE, "%s: unknown dtype %d", name ? name : "leaf", dt);
    if (ndim > 0 && !shape) return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: shape is NULL", name ? name : "leaf");
    /* checkpoints, snapshots and pdde_graph_find know a parameter or state by its name: one tensor a name */
    char stored[sizeof ((pdde_tensor *)0)->name];
    const pdde_tensor *holder = name ? (snprintf(stored, sizeof stored, "%s", name), pdde_graph_find(g, stored)) : NULL;
    if (holder)
        return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: the name %s is already used in this graph (by tensor %d)%s",
                          flags & PDDE_TENSOR_PARAM ? "param" : flags & PDDE_TENSOR_INPUT ? "input" : "state", stored, holder->id,
                          strlen(name) >= sizeof stored ? " (names are cut to 63 characters)" : "");
    pdde_tensor *t = new_node(g, PDDE_OP_NONE, dt, ndim, shape, 0, NULL);
    if (!t) return NULL;
    t->flags = flags;
    if (name) snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

pdde_tensor *pdde_input(pdde_graph *g, const char *name, pdde_dtype dt, int ndim, const int64_t *shape) {
    return new_leaf(g, name, dt, ndim, shape, PDDE_TENSOR_INPUT);
}

pdde_tensor *pdde_param(pdde_graph *g, const char *name, int ndim, const int64_t *shape, float init_std) {
    if (g && !isfinite(init_std)) return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: init_std %g is not finite", name ? name : "param", init_std);
    pdde_tensor *t = new_leaf(g, name, PDDE_F32, ndim, shape, PDDE_TENSOR_PARAM);
    if (t) pdde_op_set_f32(t, PDDE_P_PARAM_INIT_STD, init_std);
    return t;
}

static pdde_tensor *new_const(pdde_graph *g, const char *name, int ndim, const int64_t *shape, float value) {
    pdde_tensor *t = new_leaf(g, name, PDDE_F32, ndim, shape, PDDE_TENSOR_CONST);
    if (t) pdde_op_set_f32(t, PDDE_P_CONST_VALUE, value);
    return t;
}

static pdde_tensor *new_state(pdde_graph *g, const char *name, const pdde_tensor *like, uint32_t extra) {
    pdde_tensor *t = new_leaf(g, name, PDDE_F32, like->ndim, like->shape, PDDE_TENSOR_STATE | extra);
    if (t) t->layer = like->layer, t->device = like->device;
    return t;
}

/* Computation is in f32: the kernels read these inputs as floats (a 2- or 8-byte dtype would be read
 * past its end). Data movement (permute, concat, slice) also takes i32. false after a graph error. */
static bool dtypes_ok(pdde_graph *g, pdde_op op, int n, pdde_tensor *const *xs, bool any_4_bytes) {
    for (int i = 0; i < n; i++)
        if (xs[i] && xs[i]->dtype != PDDE_F32 && !(any_4_bytes && xs[i]->dtype == PDDE_I32)) {
            graph_fail(g, PDDE_ERR_DTYPE, "%s: %s is %s, expected f32%s", pdde_op_name(op), xs[i]->name, pdde_dtype_name(xs[i]->dtype),
                       any_4_bytes ? " or i32" : "");
            return false;
        }
    return true;
}

static pdde_tensor *unary(pdde_graph *g, pdde_op op, pdde_tensor *x) {
    if (!x) return new_node(g, op, PDDE_F32, 0, NULL, 1, &x);
    if (x->dtype != PDDE_F32)
        return graph_fail(g, PDDE_ERR_DTYPE, "%s: %s is %s, expected f32", pdde_op_name(op), x->name, pdde_dtype_name(x->dtype));
    return new_node(g, op, PDDE_F32, x->ndim, x->shape, 1, &x);
}

/* numpy broadcasting of b onto a: right-aligned, each dim of b equal to a's or 1; the result has a's
 * shape (pdde broadcasts the second operand only, which is what bias adds and masks need). */
static pdde_tensor *binary(pdde_graph *g, pdde_op op, pdde_tensor *a, pdde_tensor *b) {
    pdde_tensor *src[2] = {a, b};
    if (!a || !b) return new_node(g, op, PDDE_F32, 0, NULL, 2, src);
    if (a->dtype != PDDE_F32 || b->dtype != PDDE_F32)
        return graph_fail(g, PDDE_ERR_DTYPE, "%s: %s and %s must be f32", pdde_op_name(op), a->name, b->name);
    bool ok = b->ndim <= a->ndim;
    for (int i = 0; ok && i < b->ndim; i++) {
        int64_t da = a->shape[a->ndim - 1 - i], db = b->shape[b->ndim - 1 - i];
        ok = db == da || db == 1;
    }
    if (!ok) {
        char sa[96], sb[96];
        shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb);
        return graph_fail(g, PDDE_ERR_SHAPE, "%s: %s %s cannot be broadcast with %s %s", pdde_op_name(op), a->name, sa, b->name, sb);
    }
    return new_node(g, op, PDDE_F32, a->ndim, a->shape, 2, src);
}

pdde_tensor *pdde_add(pdde_graph *g, pdde_tensor *a, pdde_tensor *b) { return binary(g, PDDE_OP_ADD, a, b); }
pdde_tensor *pdde_sub(pdde_graph *g, pdde_tensor *a, pdde_tensor *b) { return binary(g, PDDE_OP_SUB, a, b); }
pdde_tensor *pdde_mul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b) { return binary(g, PDDE_OP_MUL, a, b); }
pdde_tensor *pdde_bias_add(pdde_graph *g, pdde_tensor *x, pdde_tensor *bias) { return binary(g, PDDE_OP_ADD, x, bias); }
pdde_tensor *pdde_gelu(pdde_graph *g, pdde_tensor *x) { return unary(g, PDDE_OP_GELU, x); }
pdde_tensor *pdde_relu(pdde_graph *g, pdde_tensor *x) { return unary(g, PDDE_OP_RELU, x); }
pdde_tensor *pdde_silu(pdde_graph *g, pdde_tensor *x) { return unary(g, PDDE_OP_SILU, x); }

pdde_tensor *pdde_bias_gelu(pdde_graph *g, pdde_tensor *x, pdde_tensor *bias) {
    if (x && bias && (x->ndim < 1 || bias->ndim != 1 || bias->shape[0] != x->shape[x->ndim - 1])) {
        char sx[96], sb[96];
        shape_str(x, sx, sizeof sx), shape_str(bias, sb, sizeof sb);
        return graph_fail(g, PDDE_ERR_SHAPE, "bias_gelu: bias %s %s must be 1-D of the last dim of %s %s", bias->name, sb, x->name, sx);
    }
    return binary(g, PDDE_OP_BIAS_GELU, x, bias);
}

pdde_tensor *pdde_scale(pdde_graph *g, pdde_tensor *a, float s) {
    if (!isfinite(s)) return graph_fail(g, PDDE_ERR_INVALID_ARG, "scale: factor %g of %s is not finite", s, a ? a->name : "NULL");
    pdde_tensor *t = unary(g, PDDE_OP_SCALE, a);
    if (t) pdde_op_set_f32(t, PDDE_P_SCALE, s);
    return t;
}

/* Under a compute dtype, x's low-precision copy: made at x's first matmul and shared by all later
 * ones (a weight is converted once per step however often it is used; its gradient GEMMs read the
 * same copy the forward made, as torch.autocast's saved tensors do). */
static pdde_tensor *autocast(pdde_graph *g, pdde_tensor *x) {
    if (!x || g->compute_dtype == PDDE_F32 || x->dtype != PDDE_F32) return x;
    if (x->id >= g->n_cast_of) {
        int n = x->id + 1 > 2 * g->n_cast_of ? x->id + 1 : 2 * g->n_cast_of;
        pdde_tensor **c = realloc(g->cast_of, (size_t)n * sizeof *c);
        if (!c) return graph_fail(g, PDDE_ERR_OOM, "matmul: out of memory");
        memset(c + g->n_cast_of, 0, (size_t)(n - g->n_cast_of) * sizeof *c);
        g->cast_of = c, g->n_cast_of = n;
    }
    if (!g->cast_of[x->id]) g->cast_of[x->id] = pdde_cast(g, x, g->compute_dtype);
    return g->cast_of[x->id];
}

pdde_tensor *pdde_matmul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b, int trans_a, int trans_b) {
    if (g && g->status == PDDE_OK && a && b) a = autocast(g, a), b = autocast(g, b);
    pdde_tensor *src[2] = {a, b};
    if (!a || !b) return new_node(g, PDDE_OP_MATMUL, PDDE_F32, 0, NULL, 2, src);
    char sa[96], sb[96];
    shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb);
    /* bf16 x bf16 and f16 x f16 accumulate and return f32 (mixed precision) */
    if (a->dtype != b->dtype || (a->dtype != PDDE_F32 && a->dtype != PDDE_BF16 && a->dtype != PDDE_F16))
        return graph_fail(g, PDDE_ERR_DTYPE, "matmul: %s (%s) and %s (%s) must both be f32, both bf16 or both f16", a->name,
                          pdde_dtype_name(a->dtype), b->name, pdde_dtype_name(b->dtype));
    if (a->ndim < 2 || b->ndim < 2)
        return graph_fail(g, PDDE_ERR_SHAPE, "matmul: %s %s and %s %s need at least 2 dims", a->name, sa, b->name, sb);
    int64_t M = a->shape[a->ndim - (trans_a ? 1 : 2)], Ka = a->shape[a->ndim - (trans_a ? 2 : 1)];
    int64_t Kb = b->shape[b->ndim - (trans_b ? 1 : 2)], N = b->shape[b->ndim - (trans_b ? 2 : 1)];
    /* batch dims: equal, or one side 2-D (shared by every batch) */
    bool batch_ok = a->ndim == 2 || b->ndim == 2 || a->ndim == b->ndim;
    for (int i = 0; batch_ok && a->ndim == b->ndim && i < a->ndim - 2; i++) batch_ok = a->shape[i] == b->shape[i];
    if (Ka != Kb || !batch_ok)
        return graph_fail(g, PDDE_ERR_SHAPE, "matmul: %s %s%s and %s %s%s do not fit (inner %lld vs %lld)", a->name, sa,
                          trans_a ? "^T" : "", b->name, sb, trans_b ? "^T" : "", (long long)Ka, (long long)Kb);
    const pdde_tensor *big = a->ndim >= b->ndim ? a : b;
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, big->shape, sizeof shape);
    shape[big->ndim - 2] = M, shape[big->ndim - 1] = N;
    pdde_tensor *t = new_node(g, PDDE_OP_MATMUL, PDDE_F32, big->ndim, shape, 2, src);
    if (t) pdde_op_set_i32(t, PDDE_P_MATMUL_TRANS_A, trans_a != 0), pdde_op_set_i32(t, PDDE_P_MATMUL_TRANS_B, trans_b != 0);
    if (t && a->dtype == PDDE_F16) g->loss_scaling = true; /* f16's range needs it (bf16 has f32's) */
    return t;
}

static pdde_tensor *norm_node(pdde_graph *g, pdde_op op, pdde_tensor *x, pdde_tensor *gamma, pdde_tensor *beta, float eps) {
    pdde_tensor *src[3] = {x, gamma, beta};
    int nsrc = op == PDDE_OP_LAYERNORM ? 3 : 2;
    if (!x || !gamma || (nsrc == 3 && !beta)) return new_node(g, op, PDDE_F32, 0, NULL, nsrc, src);
    if (!dtypes_ok(g, op, nsrc, src, false)) return NULL;
    if (!(eps >= 0) || !isfinite(eps)) return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: eps %g of %s must be finite and >= 0", pdde_op_name(op), eps, x->name);
    if (x->ndim < 1) return graph_fail(g, PDDE_ERR_SHAPE, "%s: %s is a scalar; it normalises over a last dim", pdde_op_name(op), x->name);
    int64_t C = x->shape[x->ndim - 1];
    for (int i = 1; i < nsrc; i++)
        if (src[i]->ndim != 1 || src[i]->shape[0] != C)
            return graph_fail(g, PDDE_ERR_SHAPE, "%s: %s must have shape [%lld] (the last dim of %s)", pdde_op_name(op),
                              src[i]->name, (long long)C, x->name);
    pdde_tensor *t = new_node(g, op, PDDE_F32, x->ndim, x->shape, nsrc, src);
    if (t) pdde_op_set_f32(t, PDDE_P_NORM_EPS, eps > 0 ? eps : 1e-5f);
    return t;
}

pdde_tensor *pdde_layernorm(pdde_graph *g, pdde_tensor *x, pdde_tensor *gamma, pdde_tensor *beta, float eps) {
    return norm_node(g, PDDE_OP_LAYERNORM, x, gamma, beta, eps);
}
pdde_tensor *pdde_rmsnorm(pdde_graph *g, pdde_tensor *x, pdde_tensor *gamma, float eps) {
    return norm_node(g, PDDE_OP_RMSNORM, x, gamma, NULL, eps);
}

pdde_tensor *pdde_rope(pdde_graph *g, pdde_tensor *x, float base) {
    if (x && (x->ndim != 4 || x->shape[3] % 2)) {
        char sx[96];
        shape_str(x, sx, sizeof sx);
        return graph_fail(g, PDDE_ERR_SHAPE, "rope: %s %s must be [B, T, H, D] with D even", x->name, sx);
    }
    if (x && !(base > 0 && isfinite(base))) return graph_fail(g, PDDE_ERR_INVALID_ARG, "rope: base %g of %s must be finite and > 0", base, x->name);
    pdde_tensor *t = unary(g, PDDE_OP_ROPE, x);
    if (t) pdde_op_set_f32(t, PDDE_P_ROPE_BASE, base);
    return t;
}

pdde_tensor *pdde_rope_llama3(pdde_graph *g, pdde_tensor *x, float base, float factor, float low_freq, float high_freq, float original) {
    if (x && !(factor >= 1 && low_freq > 0 && high_freq > low_freq && original > 0 && isfinite(factor) && isfinite(high_freq) && isfinite(original)))
        return graph_fail(g, PDDE_ERR_INVALID_ARG, "rope of %s: LLaMA 3's factor %g (>= 1), low_freq %g and high_freq %g (0 < low < high) and "
                          "original context %g (> 0), finite", x->name, factor, low_freq, high_freq, original);
    pdde_tensor *t = pdde_rope(g, x, base);
    if (t) {
        pdde_op_set_f32(t, PDDE_P_ROPE_FACTOR, factor), pdde_op_set_f32(t, PDDE_P_ROPE_LOW, low_freq);
        pdde_op_set_f32(t, PDDE_P_ROPE_HIGH, high_freq), pdde_op_set_f32(t, PDDE_P_ROPE_ORIGINAL, original);
    }
    return t;
}

pdde_tensor *pdde_softmax(pdde_graph *g, pdde_tensor *x, int causal) {
    pdde_tensor *t = unary(g, PDDE_OP_SOFTMAX, x);
    if (t && causal && (t->ndim < 2 || t->shape[t->ndim - 1] != t->shape[t->ndim - 2]))
        return graph_fail(g, PDDE_ERR_SHAPE, "softmax: a causal softmax of %s needs square last two dims", x->name);
    if (t) pdde_op_set_i32(t, PDDE_P_SOFTMAX_CAUSAL, causal != 0);
    return t;
}

static bool attention_inputs_ok(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v) {
    if (!q || !k || !v) return graph_fail(g, PDDE_ERR_INVALID_ARG, "attention: NULL input"), false;
    if (q->ndim != 4 || !same_shape(q, k) || !same_shape(q, v) || q->shape[3] < 1)
        return graph_fail(g, PDDE_ERR_SHAPE, "attention: q, k, v (%s, %s, %s) must all be [B, H, T, D] with D >= 1", q->name, k->name, v->name), false;
    /* bf16 / f16 as matmul takes them: all three of one dtype, f32 accumulation */
    if (q->dtype != k->dtype || q->dtype != v->dtype || (q->dtype != PDDE_F32 && q->dtype != PDDE_BF16 && q->dtype != PDDE_F16))
        return graph_fail(g, PDDE_ERR_DTYPE, "attention: q, k, v (%s %s, %s %s, %s %s) must all be f32, all bf16 or all f16",
                          q->name, pdde_dtype_name(q->dtype), k->name, pdde_dtype_name(k->dtype), v->name, pdde_dtype_name(v->dtype)), false;
    return true;
}

/* A document-masked attention's starts: NULL (plain causal attention), or i32 [B, T] of its q */
static bool attention_starts_ok(pdde_graph *g, const pdde_tensor *starts, int64_t B, int64_t T) {
    if (!starts) return true;
    if (starts->dtype != PDDE_I32 || starts->ndim != 2 || starts->shape[0] != B || starts->shape[1] != T)
        return graph_fail(g, PDDE_ERR_SHAPE, "attention: starts %s must be i32 [B, T] = [%lld, %lld] (each query's first key)",
                          starts->name, (long long)B, (long long)T), false;
    return true;
}

/* The fused op writes [B,H,T,D+1] f32 (the output and each row's logsumexp, which its backward reads);
 * the caller gets the output columns. Under a compute dtype q, k, v are converted as a matmul's
 * operands are (torch.autocast runs attention in bf16 too): its GEMMs read the 2-byte copies, and the
 * backward keeps those instead of the f32 originals. Statistics, softmax and the output stay f32. */
static pdde_tensor *attention_apart(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v, pdde_tensor *starts) {
    if (g && g->status == PDDE_OK && q && k && v) q = autocast(g, q), k = autocast(g, k), v = autocast(g, v);
    if (!attention_inputs_ok(g, q, k, v) || !attention_starts_ok(g, starts, q->shape[0], q->shape[2])) return NULL;
    pdde_tensor *src[4] = {q, k, v, starts};
    int64_t shape[4] = {q->shape[0], q->shape[1], q->shape[2], q->shape[3] + 1};
    pdde_tensor *y = new_node(g, PDDE_OP_ATTENTION, PDDE_F32, 4, shape, starts ? 4 : 3, src);
    if (y) pdde_op_set_f32(y, PDDE_P_ATTENTION_SCALE, 1.0f / sqrtf((float)q->shape[3]));
    if (y && q->dtype == PDDE_F16) g->loss_scaling = true; /* its gradients, as an f16 matmul's, need it */
    return pdde_slice(g, y, 3, 0, q->shape[3]);
}
pdde_tensor *pdde_attention(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v) { return attention_apart(g, q, k, v, NULL); }
pdde_tensor *pdde_attention_docs(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v, pdde_tensor *starts) {
    if (!starts) return graph_fail(g, PDDE_ERR_INVALID_ARG, "attention_docs: NULL starts");
    return attention_apart(g, q, k, v, starts);
}

/* The packed form: q, k, v read in place from qkv [B, T, H*3*D] (head-major: head h's q, k, v are
 * columns h*3D + [0, D), [D, 2D), [2D, 3D)), the output written as [B, T, H*D] (head h in columns
 * h*D + [0, D)), the layout the projections around it use, so no slice or permute runs around it. The
 * node's memory also holds each row's logsumexp after the output (pdde_tensor_nbytes counts it). */
static pdde_tensor *attention_packed(pdde_graph *g, pdde_tensor *qkv, int heads, pdde_tensor *starts) {
    if (g && g->status == PDDE_OK && qkv) qkv = autocast(g, qkv);
    if (!qkv) return new_node(g, PDDE_OP_ATTENTION, PDDE_F32, 0, NULL, 1, &qkv);
    if (!g || g->status != PDDE_OK) return NULL;
    if (qkv->ndim != 3 || heads < 1 || qkv->shape[2] % (3 * (int64_t)heads) || qkv->shape[2] == 0)
        return graph_fail(g, PDDE_ERR_SHAPE, "attention_qkv: %s must be [B, T, H*3*D] with H = %d heads and D >= 1", qkv->name, heads);
    if (qkv->dtype != PDDE_F32 && qkv->dtype != PDDE_BF16 && qkv->dtype != PDDE_F16)
        return graph_fail(g, PDDE_ERR_DTYPE, "attention_qkv: %s is %s: f32, bf16 or f16 wanted", qkv->name, pdde_dtype_name(qkv->dtype));
    int64_t D = qkv->shape[2] / (3 * (int64_t)heads);
    if (D > INT32_MAX) return graph_fail(g, PDDE_ERR_SHAPE, "attention_qkv: head dim %lld too large", (long long)D);
    if (!attention_starts_ok(g, starts, qkv->shape[0], qkv->shape[1])) return NULL;
    int64_t shape[3] = {qkv->shape[0], qkv->shape[1], heads * D};
    pdde_tensor *src[2] = {qkv, starts};
    pdde_tensor *y = new_node(g, PDDE_OP_ATTENTION, PDDE_F32, 3, shape, starts ? 2 : 1, src);
    if (y) pdde_op_set_i32(y, PDDE_P_ATTENTION_QKV_D, (int32_t)D), pdde_op_set_f32(y, PDDE_P_ATTENTION_SCALE, 1.0f / sqrtf((float)D));
    if (y && qkv->dtype == PDDE_F16) g->loss_scaling = true;
    return y;
}
pdde_tensor *pdde_attention_qkv(pdde_graph *g, pdde_tensor *qkv, int heads) { return attention_packed(g, qkv, heads, NULL); }
pdde_tensor *pdde_attention_qkv_docs(pdde_graph *g, pdde_tensor *qkv, int heads, pdde_tensor *starts) {
    if (!starts) return graph_fail(g, PDDE_ERR_INVALID_ARG, "attention_qkv_docs: NULL starts");
    return attention_packed(g, qkv, heads, starts);
}

pdde_status pdde_attention_window(pdde_graph *g, pdde_tensor *starts, int window) {
    if (!g || g->status != PDDE_OK) return g ? g->status : PDDE_ERR_INVALID_ARG;
    if (!starts || starts->op != PDDE_OP_NONE || starts->dtype != PDDE_I32 || !(starts->flags & PDDE_TENSOR_INPUT))
        return graph_fail(g, PDDE_ERR_INVALID_ARG, "attention_window: %s must be the i32 input given as an attention's starts",
                          starts ? starts->name : "NULL"), g->status;
    if (window < 1) return graph_fail(g, PDDE_ERR_INVALID_ARG, "attention_window: window %d of %s: at least 1 key wanted", window, starts->name), g->status;
    pdde_op_set_i32(starts, PDDE_P_STARTS_WINDOW, window);
    return PDDE_OK;
}

pdde_tensor *pdde_attention_unfused(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v) {
    if (!attention_inputs_ok(g, q, k, v)) return NULL;
    pdde_tensor *att = pdde_matmul(g, q, k, 0, 1);
    att = pdde_scale(g, att, 1.0f / sqrtf((float)q->shape[3]));
    att = pdde_softmax(g, att, 1);
    return pdde_matmul(g, att, v, 0, 0);
}

pdde_tensor *pdde_cross_entropy(pdde_graph *g, pdde_tensor *logits, pdde_tensor *targets) {
    pdde_tensor *src[2] = {logits, targets};
    if (!logits || !targets) return new_node(g, PDDE_OP_CROSS_ENTROPY, PDDE_F32, 0, NULL, 2, src);
    if (!dtypes_ok(g, PDDE_OP_CROSS_ENTROPY, 1, src, false)) return NULL;
    if (logits->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logits->shape[0] || targets->dtype != PDDE_I32)
        return graph_fail(g, PDDE_ERR_SHAPE, "cross_entropy: logits %s must be [N, V] f32 and targets %s [N] i32",
                          logits->name, targets->name);
    int64_t one = 1;
    pdde_tensor *t = new_node(g, PDDE_OP_CROSS_ENTROPY, PDDE_F32, 1, &one, 2, src);
    if (t) t->flags |= PDDE_TENSOR_LOSS;
    return t;
}

pdde_tensor *pdde_embedding(pdde_graph *g, pdde_tensor *table, pdde_tensor *ids) {
    pdde_tensor *src[2] = {table, ids};
    if (!table || !ids) return new_node(g, PDDE_OP_EMBEDDING, PDDE_F32, 0, NULL, 2, src);
    if (!dtypes_ok(g, PDDE_OP_EMBEDDING, 1, src, false)) return NULL;
    if (table->ndim != 2 || ids->dtype != PDDE_I32 || ids->ndim + 1 > PDDE_MAX_DIMS)
        return graph_fail(g, PDDE_ERR_SHAPE, "embedding: table %s must be [V, C] and ids %s i32", table->name, ids->name);
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
    shape[ids->ndim] = table->shape[1];
    return new_node(g, PDDE_OP_EMBEDDING, PDDE_F32, ids->ndim + 1, shape, 2, src);
}

pdde_tensor *pdde_reshape(pdde_graph *g, pdde_tensor *x, int ndim, const int64_t *shape) {
    if (!x) return new_node(g, PDDE_OP_RESHAPE, PDDE_F32, 0, NULL, 1, &x);
    int64_t n = 0;
    if (ndim < 0 || ndim > PDDE_MAX_DIMS || (ndim > 0 && !shape))
        return graph_fail(g, PDDE_ERR_SHAPE, "reshape: %s: %d dims (at most %d) or a NULL shape", x->name, ndim, PDDE_MAX_DIMS);
    if (shape_numel(ndim, shape, &n) != -1) return new_node(g, PDDE_OP_RESHAPE, x->dtype, ndim, shape, 1, &x); /* (its message) */
    if (n != pdde_tensor_numel(x)) {
        char sx[96];
        shape_str(x, sx, sizeof sx);
        return graph_fail(g, PDDE_ERR_SHAPE, "reshape: %s %s has %lld elements, the new shape %lld", x->name, sx,
                          (long long)pdde_tensor_numel(x), (long long)n);
    }
    pdde_tensor *t = new_node(g, PDDE_OP_RESHAPE, x->dtype, ndim, shape, 1, &x);
    if (t) t->flags |= PDDE_TENSOR_VIEW;
    return t;
}

pdde_tensor *pdde_permute(pdde_graph *g, pdde_tensor *x, const int *perm) {
    if (!x) return new_node(g, PDDE_OP_PERMUTE, PDDE_F32, 0, NULL, 1, &x);
    if (!perm) return graph_fail(g, PDDE_ERR_INVALID_ARG, "permute: %s: perm is NULL", x->name);
    if (!dtypes_ok(g, PDDE_OP_PERMUTE, 1, &x, true)) return NULL;
    int64_t shape[PDDE_MAX_DIMS];
    int seen = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= x->ndim || (seen >> perm[i] & 1))
            return graph_fail(g, PDDE_ERR_INVALID_ARG, "permute: %s: perm is not a permutation of 0..%d", x->name, x->ndim - 1);
        seen |= 1 << perm[i];
        shape[i] = x->shape[perm[i]];
    }
    pdde_tensor *t = new_node(g, PDDE_OP_PERMUTE, x->dtype, x->ndim, shape, 1, &x);
    for (int i = 0; t && i < x->ndim; i++) pdde_op_set_i32(t, PDDE_P_PERMUTE_DIM0 + i, perm[i]);
    return t;
}

pdde_tensor *pdde_transpose(pdde_graph *g, pdde_tensor *x, int d0, int d1) {
    if (!x) return pdde_permute(g, x, NULL);
    if (d0 < 0) d0 += x->ndim;
    if (d1 < 0) d1 += x->ndim;
    if (d0 < 0 || d1 < 0 || d0 >= x->ndim || d1 >= x->ndim)
        return graph_fail(g, PDDE_ERR_INVALID_ARG, "transpose: %s has %d dims, asked for %d and %d", x->name, x->ndim, d0, d1);
    int perm[PDDE_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    perm[d0] = d1, perm[d1] = d0;
    return pdde_permute(g, x, perm);
}

pdde_tensor *pdde_concat(pdde_graph *g, int n, pdde_tensor *const *xs, int axis) {
    if (n < 1 || n > PDDE_MAX_SRC || !xs) return graph_fail(g, PDDE_ERR_INVALID_ARG, "concat: %d inputs (1..%d)", n, PDDE_MAX_SRC);
    for (int i = 0; i < n; i++)
        if (!xs[i]) return new_node(g, PDDE_OP_CONCAT, PDDE_F32, 0, NULL, n, xs);
    const pdde_tensor *x0 = xs[0];
    if (!dtypes_ok(g, PDDE_OP_CONCAT, 1, xs, true)) return NULL;
    if (axis < 0) axis += x0->ndim;
    if (axis < 0 || axis >= x0->ndim) return graph_fail(g, PDDE_ERR_INVALID_ARG, "concat: bad axis for %s", x0->name);
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof shape);
    shape[axis] = 0;
    for (int i = 0; i < n; i++) {
        bool ok = xs[i]->ndim == x0->ndim && xs[i]->dtype == x0->dtype;
        for (int d = 0; ok && d < x0->ndim; d++) ok = d == axis || xs[i]->shape[d] == x0->shape[d];
        if (!ok) return graph_fail(g, PDDE_ERR_SHAPE, "concat: %s does not match %s outside axis %d", xs[i]->name, x0->name, axis);
        shape[axis] += xs[i]->shape[axis];
    }
    pdde_tensor *t = new_node(g, PDDE_OP_CONCAT, x0->dtype, x0->ndim, shape, n, xs);
    if (t) pdde_op_set_i32(t, PDDE_P_CONCAT_AXIS, axis);
    return t;
}

pdde_tensor *pdde_slice(pdde_graph *g, pdde_tensor *x, int axis, int64_t start, int64_t len) {
    if (!x) return new_node(g, PDDE_OP_SLICE, PDDE_F32, 0, NULL, 1, &x);
    if (!dtypes_ok(g, PDDE_OP_SLICE, 1, &x, true)) return NULL;
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis >= x->ndim || start < 0 || len < 0 || start > x->shape[axis] || len > x->shape[axis] - start)
        return graph_fail(g, PDDE_ERR_SHAPE, "slice: %lld elements from %lld along axis %d are not inside %s", (long long)len,
                          (long long)start, axis, x->name);
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[axis] = len;
    pdde_tensor *t = new_node(g, PDDE_OP_SLICE, x->dtype, x->ndim, shape, 1, &x);
    if (t && start > INT32_MAX) return graph_fail(g, PDDE_ERR_UNSUPPORTED, "slice: start %lld of %s is beyond 2^31 - 1", (long long)start, x->name);
    if (t) pdde_op_set_i32(t, PDDE_P_SLICE_AXIS, axis), pdde_op_set_i32(t, PDDE_P_SLICE_START, (int32_t)start);
    return t;
}

pdde_tensor *pdde_split(pdde_graph *g, pdde_tensor *x, int axis, int n, pdde_tensor **out) {
    if (!x || n < 1 || !out) return graph_fail(g, PDDE_ERR_INVALID_ARG, "split: NULL input or output, or n < 1");
    int ax = axis < 0 ? axis + x->ndim : axis;
    if (ax < 0 || ax >= x->ndim || x->shape[ax] % n)
        return graph_fail(g, PDDE_ERR_SHAPE, "split: axis %d of %s is not divisible into %d parts", axis, x->name, n);
    int64_t len = x->shape[ax] / n;
    for (int i = 0; i < n; i++) out[i] = pdde_slice(g, x, ax, i * len, len);
    return out[0];
}

static pdde_tensor *reduce(pdde_graph *g, pdde_op op, pdde_tensor *x, int axis, int keepdim) {
    if (!x) return new_node(g, op, PDDE_F32, 0, NULL, 1, &x);
    if (!dtypes_ok(g, op, 1, &x, false)) return NULL;
    int64_t shape[PDDE_MAX_DIMS];
    int nd = 0;
    if (axis == -1 && !keepdim) shape[nd++] = 1; /* a full reduction is a [1] scalar */
    else {
        if (axis < -1 || axis >= x->ndim) return graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: axis %d of %s", pdde_op_name(op), axis, x->name);
        for (int i = 0; i < x->ndim; i++) {
            if (axis == -1 || i == axis) { if (keepdim) shape[nd++] = 1; }
            else shape[nd++] = x->shape[i];
        }
        if (nd == 0) shape[nd++] = 1;
    }
    pdde_tensor *t = new_node(g, op, PDDE_F32, nd, shape, 1, &x);
    if (t) pdde_op_set_i32(t, PDDE_P_REDUCE_AXIS, axis), pdde_op_set_i32(t, PDDE_P_REDUCE_KEEPDIM, keepdim != 0);
    return t;
}

pdde_tensor *pdde_sum(pdde_graph *g, pdde_tensor *x, int axis, int keepdim) { return reduce(g, PDDE_OP_SUM, x, axis, keepdim); }
pdde_tensor *pdde_mean(pdde_graph *g, pdde_tensor *x, int axis, int keepdim) { return reduce(g, PDDE_OP_MEAN, x, axis, keepdim); }

pdde_tensor *pdde_dropout(pdde_graph *g, pdde_tensor *x, float p, uint64_t seed) {
    if (!(p >= 0 && p < 1)) return graph_fail(g, PDDE_ERR_INVALID_ARG, "dropout: p = %g must be in [0, 1)", p);
    pdde_tensor *t = unary(g, PDDE_OP_DROPOUT, x);
    if (t)
        pdde_op_set_f32(t, PDDE_P_DROPOUT_P, p), pdde_op_set_i32(t, PDDE_P_DROPOUT_SEED_LO, (int32_t)(uint32_t)seed),
            pdde_op_set_i32(t, PDDE_P_DROPOUT_SEED_HI, (int32_t)(uint32_t)(seed >> 32));
    return t;
}

pdde_tensor *pdde_cast(pdde_graph *g, pdde_tensor *x, pdde_dtype to) {
    if (!x) return new_node(g, PDDE_OP_CAST, to, 0, NULL, 1, &x);
    if ((unsigned)to >= PDDE_DTYPE_COUNT) return graph_fail(g, PDDE_ERR_DTYPE, "cast: unknown dtype %d", to);
    return new_node(g, PDDE_OP_CAST, to, x->ndim, x->shape, 1, &x);
}

#include "moe.c"
