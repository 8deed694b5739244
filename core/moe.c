/* core/moe.c — Mixture-of-Experts graph building: the routing, permutation and grouped-GEMM ops
 * (pdde.h "Mixture-of-Experts"), the balance loss made of ordinary ops, and their gradients
 * (moe_backward, called by pdde_backward). Included by pdde.c. */

static pdde_tensor *moe_node(pdde_graph *g, pdde_op op, pdde_dtype dt, int64_t rows, int64_t cols, int nsrc, pdde_tensor *const *src,
                             int64_t experts, int64_t capacity, unsigned flags) {
    pdde_tensor *t = new_node(g, op, dt, 2, (int64_t[]){rows, cols}, nsrc, src);
    if (t) {
        pdde_op_set_i32(t, PDDE_P_MOE_EXPERTS, (int32_t)experts);
        pdde_op_set_i32(t, PDDE_P_MOE_CAPACITY, (int32_t)capacity);
        pdde_op_set_i32(t, PDDE_P_MOE_FLAGS, (int32_t)flags);
    }
    return t;
}

/* NULL inputs propagate an earlier error; the rest are checked here with names and shapes. */
static bool moe_is(const pdde_tensor *t, pdde_dtype dt, int ndim) { return t && t->dtype == dt && t->ndim == ndim; }
/* an activation the permutation and the grouped GEMM take: f32, or bf16 (a bf16 compute dtype) */
static bool moe_act(const pdde_tensor *t, int ndim) { return t && (t->dtype == PDDE_F32 || t->dtype == PDDE_BF16) && t->ndim == ndim; }

/* Under a bf16 compute dtype the activations the permutation moves and the grouped GEMM's operands are
 * bf16 (autocast: the tokens' copy is the router matmul's), the GEMMs accumulate and write f32 and the
 * combine sums into f32, as a dense matmul does. The router's logits, top-k, gate weights and the
 * balance loss stay f32: top-k of rounded scores would tie where f32 does not (and pick another expert
 * on another device), and the loss is a mean of small products. Under f16 the MoE ops stay f32 (its
 * range would need loss scaling inside the permutation). */
static pdde_tensor *moe_lowp(pdde_graph *g, pdde_tensor *x) { return g->compute_dtype == PDDE_BF16 ? autocast(g, x) : x; }

static bool moe_idx_ok(pdde_graph *g, const char *op, const pdde_tensor *idx) {
    if (moe_is(idx, PDDE_I32, 2) && idx->shape[1] >= 1) return true;
    if (idx) graph_fail(g, PDDE_ERR_SHAPE, "%s: expert ids %s must be i32 [N, k] with k >= 1", op, idx->name);
    return false;
}

static bool moe_experts_ok(pdde_graph *g, const char *op, int64_t experts, int64_t capacity) {
    if (experts >= 1 && experts <= INT32_MAX && capacity >= 0 && capacity <= INT32_MAX / (experts > 0 ? experts : 1)) return true;
    graph_fail(g, PDDE_ERR_INVALID_ARG, "%s: %lld experts (>= 1) and a capacity of %lld rows (>= 0, 0 = dropless) per expert", op,
               (long long)experts, (long long)capacity);
    return false;
}

/* rows of the expert-ordered buffer */
static int64_t moe_buffer_rows(const pdde_tensor *idx, int64_t experts, int64_t capacity) {
    return capacity > 0 ? experts * capacity : pdde_tensor_numel(idx);
}

int64_t pdde_moe_capacity(int64_t tokens, int k, int experts, float factor) {
    if (!(factor > 0) || experts < 1 || tokens < 0 || k < 1) return 0;
    double c = ceil((double)factor * (double)tokens * k / experts);
    return c < 1 ? 1 : c > INT32_MAX ? INT32_MAX : (int64_t)c;
}

int64_t pdde_moe_dropped(const int32_t *counts, int experts, int64_t capacity) {
    int64_t d = 0;
    for (int e = 0; capacity > 0 && counts && e < experts; e++) d += counts[e] > capacity ? counts[e] - capacity : 0;
    return d;
}

pdde_tensor *pdde_moe_topk(pdde_graph *g, pdde_tensor *logits, pdde_tensor *bias, int k, unsigned flags) {
    if (!g || g->status) return NULL;
    if (!logits) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_topk: logits is NULL");
    if (!moe_is(logits, PDDE_F32, 2) || logits->shape[1] < 1)
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_topk: logits %s must be f32 [N, E] with E >= 1", logits->name);
    int64_t E = logits->shape[1];
    if (k < 1 || k > E) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_topk: k = %d, expected 1..%lld (the experts of %s)", k, (long long)E, logits->name);
    if (bias && (!moe_is(bias, PDDE_F32, 1) || bias->shape[0] != E))
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_topk: bias %s must be f32 [%lld], one per expert", bias->name, (long long)E);
    if (flags & ~(PDDE_MOE_SIGMOID | PDDE_MOE_NO_NORMALIZE)) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_topk: unknown flags 0x%x", flags);
    pdde_tensor *src[2] = {logits, bias};
    return moe_node(g, PDDE_OP_MOE_TOPK, PDDE_I32, logits->shape[0], k, bias ? 2 : 1, src, E, 0, flags);
}

pdde_tensor *pdde_moe_gate(pdde_graph *g, pdde_tensor *logits, pdde_tensor *idx, unsigned flags) {
    if (!g || g->status) return NULL;
    if (!logits || !idx) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_gate: NULL input");
    if (!moe_is(logits, PDDE_F32, 2) || !moe_idx_ok(g, "moe_gate", idx) || idx->shape[0] != logits->shape[0] || idx->shape[1] > logits->shape[1])
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_gate: logits %s must be f32 [N, E] and ids %s i32 [N, k <= E]", logits->name, idx->name);
    if (flags & ~(PDDE_MOE_SIGMOID | PDDE_MOE_NO_NORMALIZE)) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_gate: unknown flags 0x%x", flags);
    pdde_tensor *src[2] = {logits, idx};
    return moe_node(g, PDDE_OP_MOE_GATE, PDDE_F32, idx->shape[0], idx->shape[1], 2, src, logits->shape[1], 0, flags);
}

pdde_tensor *pdde_moe_counts(pdde_graph *g, pdde_tensor *idx, int experts) {
    if (!g || g->status) return NULL;
    if (!moe_idx_ok(g, "moe_counts", idx) || !moe_experts_ok(g, "moe_counts", experts, 0)) return idx ? NULL : graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_counts: idx is NULL");
    pdde_tensor *t = new_node(g, PDDE_OP_MOE_COUNTS, PDDE_I32, 1, (int64_t[]){experts}, 1, &idx);
    if (t) pdde_op_set_i32(t, PDDE_P_MOE_EXPERTS, experts);
    return t;
}

pdde_tensor *pdde_moe_dispatch(pdde_graph *g, pdde_tensor *x, pdde_tensor *idx, int experts, int64_t capacity) {
    if (!g || g->status) return NULL;
    if (!x || !idx) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_dispatch: NULL input");
    if (!moe_idx_ok(g, "moe_dispatch", idx) || !moe_experts_ok(g, "moe_dispatch", experts, capacity)) return NULL;
    x = moe_lowp(g, x);
    if (!moe_act(x, 2) || x->shape[0] != idx->shape[0])
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_dispatch: tokens %s must be f32 or bf16 [N, C] with the N = %lld rows of %s", x ? x->name : "?",
                          (long long)idx->shape[0], idx->name);
    pdde_tensor *src[2] = {x, idx}; /* (the rows in x's dtype: moved, not rounded) */
    return moe_node(g, PDDE_OP_MOE_DISPATCH, x->dtype, moe_buffer_rows(idx, experts, capacity), x->shape[1], 2, src, experts, capacity, 0);
}

pdde_tensor *pdde_moe_dispatch_experts(pdde_graph *g, pdde_tensor *x, pdde_tensor *idx, int experts, int64_t capacity) {
    if (!g || g->status) return NULL;
    if (capacity < 1) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_dispatch_experts: a capacity of %lld rows (>= 1) per expert", (long long)capacity);
    pdde_tensor *t = pdde_moe_dispatch(g, x, idx, experts, capacity);
    if (!t) return NULL;
    t->ndim = 3, t->shape[0] = experts, t->shape[1] = capacity, t->shape[2] = x->shape[1];
    return t;
}

pdde_tensor *pdde_moe_combine(pdde_graph *g, pdde_tensor *ye, pdde_tensor *idx, pdde_tensor *weights, int experts, int64_t capacity) {
    if (!g || g->status) return NULL;
    if (!ye || !idx) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_combine: NULL input");
    if (!moe_idx_ok(g, "moe_combine", idx) || !moe_experts_ok(g, "moe_combine", experts, capacity)) return NULL;
    if (!(ye = moe_lowp(g, ye))) return NULL;
    bool by_expert = moe_act(ye, 3); /* [E, capacity, C]: pdde_moe_dispatch_experts' layout */
    if (by_expert ? ye->shape[0] != experts || ye->shape[1] != capacity || capacity < 1
                  : !moe_act(ye, 2) || ye->shape[0] != moe_buffer_rows(idx, experts, capacity))
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_combine: expert outputs %s must be f32 or bf16 [%lld, C] (%s) or [%d, %lld, C]", ye->name,
                          (long long)moe_buffer_rows(idx, experts, capacity), capacity ? "experts x capacity" : "N x k", experts, (long long)capacity);
    if (weights && (!moe_is(weights, PDDE_F32, 2) || weights->shape[0] != idx->shape[0] || weights->shape[1] != idx->shape[1]))
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_combine: weights %s must be f32 of the shape of %s [N, k]", weights->name, idx->name);
    pdde_tensor *src[3] = {ye, idx, weights};
    return moe_node(g, PDDE_OP_MOE_COMBINE, PDDE_F32, idx->shape[0], ye->shape[ye->ndim - 1], weights ? 3 : 2, src, experts, capacity, 0);
}

pdde_tensor *pdde_moe_grouped_matmul(pdde_graph *g, pdde_tensor *x, pdde_tensor *w, pdde_tensor *idx, int64_t capacity, int trans_b) {
    if (!g || g->status) return NULL;
    if (!x || !w || (!idx && !moe_act(x, 3))) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_grouped_matmul: NULL input");
    if (!(x = moe_lowp(g, x)) || !(w = moe_lowp(g, w))) return NULL;
    if (x->dtype != w->dtype || !moe_act(w, 3)) /* (bf16 x bf16 accumulates in f32 and writes f32, as matmul) */
        return graph_fail(g, PDDE_ERR_DTYPE, "moe_grouped_matmul: rows %s (%s) and weights %s (%s [E, K, M]) must both be f32 or both bf16", x->name,
                          pdde_dtype_name(x->dtype), w->name, pdde_dtype_name(w->dtype));
    int64_t E = w->shape[0], K = w->shape[trans_b ? 2 : 1], M = w->shape[trans_b ? 1 : 2];
    if (moe_act(x, 3)) { /* [E, S, K] by expert: every row of each expert's block (its capacity) */
        if (x->shape[0] != E || x->shape[2] != K)
            return graph_fail(g, PDDE_ERR_SHAPE, "moe_grouped_matmul: rows %s [E, S, K] and weights %s [E, K, M] disagree", x->name, w->name);
        pdde_tensor *src[2] = {x, w};
        pdde_tensor *t = new_node(g, PDDE_OP_MOE_GROUPED_MATMUL, PDDE_F32, 3, (int64_t[]){E, x->shape[1], M}, 2, src);
        if (t) pdde_op_set_i32(t, PDDE_P_MOE_EXPERTS, (int32_t)E), pdde_op_set_i32(t, PDDE_P_MOE_CAPACITY, (int32_t)x->shape[1]),
               pdde_op_set_i32(t, PDDE_P_MOE_TRANS_B, trans_b != 0);
        return t;
    }
    if (!moe_act(x, 2))
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_grouped_matmul: rows %s must be [R, K] for weights %s [E, K, M]", x->name, w->name);
    if (!moe_idx_ok(g, "moe_grouped_matmul", idx) || !moe_experts_ok(g, "moe_grouped_matmul", E, capacity)) return NULL;
    if (x->shape[1] != K || x->shape[0] != moe_buffer_rows(idx, E, capacity))
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_grouped_matmul: rows %s [%lld, %lld] must be [%lld, %lld] for weights %s and ids %s", x->name,
                          (long long)x->shape[0], (long long)x->shape[1], (long long)moe_buffer_rows(idx, E, capacity), (long long)K, w->name, idx->name);
    pdde_tensor *src[3] = {x, w, idx};
    pdde_tensor *t = moe_node(g, PDDE_OP_MOE_GROUPED_MATMUL, PDDE_F32, x->shape[0], M, 3, src, E, capacity, 0);
    if (t) pdde_op_set_i32(t, PDDE_P_MOE_TRANS_B, trans_b != 0);
    return t;
}

pdde_tensor *pdde_moe_aux_loss(pdde_graph *g, pdde_tensor *logits, pdde_tensor *idx, int experts) {
    if (!g || g->status) return NULL;
    if (!logits || !idx) return graph_fail(g, PDDE_ERR_INVALID_ARG, "moe_aux_loss: NULL input");
    if (!moe_is(logits, PDDE_F32, 2) || logits->shape[1] != experts || !moe_idx_ok(g, "moe_aux_loss", idx) || idx->shape[0] != logits->shape[0])
        return graph_fail(g, PDDE_ERR_SHAPE, "moe_aux_loss: logits %s must be f32 [N, %d] and ids %s i32 [N, k]", logits->name, experts, idx->name);
    /* one op (and one for its gradient), as the cross-entropy: under data parallelism each rank's
     * mean over its own rows, and a gradient of that mean */
    pdde_tensor *src[2] = {logits, pdde_moe_counts(g, idx, experts)};
    pdde_tensor *t = new_node(g, PDDE_OP_MOE_AUX_LOSS, PDDE_F32, 1, (int64_t[]){1}, 2, src);
    if (t) pdde_op_set_i32(t, PDDE_P_MOE_EXPERTS, experts);
    return t;
}

/* The gradients (pdde_backward): the permutation ops are each other's transposes, the grouped GEMM
 * differentiates as a GEMM per expert. Top-k and the counts are choices: no gradient. */
static void moe_backward(pdde_graph *g, pdde_tensor *y, pdde_tensor *dy, pdde_tensor **dsrc) {
    int64_t E = pdde_op_i32(y, PDDE_P_MOE_EXPERTS), cap = pdde_op_i32(y, PDDE_P_MOE_CAPACITY);
    unsigned flags = (unsigned)pdde_op_i32(y, PDDE_P_MOE_FLAGS);
    pdde_tensor *x = y->src[0];
    switch (y->op) {
    case PDDE_OP_MOE_TOPK: case PDDE_OP_MOE_COUNTS: break;
    case PDDE_OP_MOE_AUX_LOSS: { /* the counts are held constant (Switch's f) */
        pdde_tensor *src[3] = {x, y->src[1], dy};
        dsrc[0] = new_node(g, PDDE_OP_MOE_AUX_LOSS_BACK, PDDE_F32, 2, x->shape, 3, src);
        if (dsrc[0]) pdde_op_set_i32(dsrc[0], PDDE_P_MOE_EXPERTS, (int32_t)E);
        break;
    }
    case PDDE_OP_MOE_GATE: {
        pdde_tensor *src[3] = {x, y->src[1], dy};
        dsrc[0] = moe_node(g, PDDE_OP_MOE_GATE_BACK, PDDE_F32, x->shape[0], x->shape[1], 3, src, E, 0, flags);
        break;
    }
    case PDDE_OP_MOE_DISPATCH: { /* x [N,C] -> rows: back by summing each token's rows */
        if (x->dtype != PDDE_F32 && dy->dtype != x->dtype) dy = pdde_cast(g, dy, x->dtype); /* (bf16 rows back, summed in f32) */
        pdde_tensor *src[3] = {dy, y->src[1], NULL};
        dsrc[0] = moe_node(g, PDDE_OP_MOE_COMBINE, PDDE_F32, x->shape[0], x->shape[1], 2, src, E, cap, 0);
        if (y->nsrc > 2) { /* a weighted dispatch (a combine's gradient): dw = <x[n], dy[row]> */
            pdde_tensor *wsrc[3] = {dy, y->src[1], x};
            dsrc[2] = moe_node(g, PDDE_OP_MOE_COMBINE_BACK_W, PDDE_F32, y->src[2]->shape[0], y->src[2]->shape[1], 3, wsrc, E, cap, 0);
        }
        break;
    }
    case PDDE_OP_MOE_COMBINE: {
        pdde_tensor *src[3] = {dy, y->src[1], y->nsrc > 2 ? y->src[2] : NULL};
        dsrc[0] = moe_node(g, PDDE_OP_MOE_DISPATCH, PDDE_F32, x->shape[0], x->shape[1], y->nsrc > 2 ? 3 : 2, src, E, cap, 0);
        if (dsrc[0] && x->ndim == 3) dsrc[0]->ndim = 3, memcpy(dsrc[0]->shape, x->shape, sizeof x->shape); /* (by expert) */
        if (y->nsrc > 2) {
            pdde_tensor *wsrc[3] = {x, y->src[1], dy};
            dsrc[2] = moe_node(g, PDDE_OP_MOE_COMBINE_BACK_W, PDDE_F32, y->src[2]->shape[0], y->src[2]->shape[1], 3, wsrc, E, cap, 0);
        }
        break;
    }
    case PDDE_OP_MOE_GROUPED_MATMUL: {
        pdde_tensor *w = y->src[1], *idx = y->nsrc > 2 ? y->src[2] : NULL;
        int tb = pdde_op_i32(y, PDDE_P_MOE_TRANS_B);
        if (x->dtype != PDDE_F32 && dy->dtype != x->dtype) dy = pdde_cast(g, dy, x->dtype); /* the gradient GEMMs in bf16 too */
        dsrc[0] = pdde_moe_grouped_matmul(g, dy, w, idx, x->ndim == 3 ? 0 : cap, !tb); /* dx = dy w_e^T */
        pdde_tensor *src[3] = {tb ? dy : x, tb ? x : dy, idx};    /* dw_e = x_e^T dy_e (or its transpose) */
        pdde_tensor *dw = new_node(g, PDDE_OP_MOE_GROUPED_MATMUL_BACK_W, PDDE_F32, 3, w->shape, idx ? 3 : 2, src);
        if (dw) pdde_op_set_i32(dw, PDDE_P_MOE_EXPERTS, (int32_t)E), pdde_op_set_i32(dw, PDDE_P_MOE_CAPACITY, (int32_t)cap);
        dsrc[1] = dw;
        break;
    }
    default:
        graph_fail(g, PDDE_ERR_UNKNOWN_OP, "backward: op %s (%s) has no gradient", pdde_op_name(y->op), y->name);
    }
}
