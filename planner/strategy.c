/* planner/strategy.c — strategies as annotations: data parallel, ZeRO 1-3, Megatron tensor
 * parallel linears and the vocab-parallel embedding only call pdde_shard, each starting from what a tensor already has on the same
 * mesh, so they compose (data parallel, then ZeRO or tensor parallel) and pdde_complete_dist_attrs does the rest.
 * No strategy gets a code path of its own in completion or execution. */

#include "planner_impl.h"

/* t's current mapping on mesh (its annotation there, else replicated) into map. */
static void strategy_current(const pdde_graph *g, const pdde_tensor *t, const pdde_mesh *mesh, int *map) {
    for (int d = 0; d < PDDE_MAX_DIMS; d++) map[d] = -1;
    if (completion_annotated(g->planner, t) && mesh_same(t->dist.mesh, mesh))
        for (int d = 0; d < t->ndim; d++) map[d] = t->dist.dims_mapping[d];
}

static bool strategy_uses(const pdde_tensor *t, const int *map, int axis) {
    for (int d = 0; d < t->ndim; d++)
        if (map[d] == axis) return true;
    return false;
}

/* The axis called name of mesh, or -1 with an error on ctx. */
static int strategy_axis(pdde_graph *g, const pdde_mesh *mesh, const char *name, const char *who) {
    if (!mesh_owned(g->planner, mesh)) {
        pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "%s: the mesh does not belong to this graph", who);
        return -1;
    }
    int ax = pdde_mesh_axis(mesh, name);
    if (ax < 0) pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "%s: the mesh has no axis called %s", who, name ? name : "(null)");
    return ax;
}

pdde_status pdde_strategy_data_parallel(pdde_graph *g, const pdde_mesh *mesh, const char *axis) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    int ax = strategy_axis(g, mesh, axis, "data parallel");
    if (ax < 0) return PDDE_ERR_DIST_ATTR;
    for (int i = 0; i < g->n; i++) {
        pdde_tensor *t = g->nodes[i];
        if (t->op != PDDE_OP_NONE) continue;
        int map[PDDE_MAX_DIMS];
        strategy_current(g, t, mesh, map);
        pdde_status st = PDDE_OK;
        if ((t->flags & PDDE_TENSOR_INPUT) && t->ndim > 0 && map[0] < 0 && !strategy_uses(t, map, ax)) {
            map[0] = ax; /* the batch */
            st = pdde_shard(g, t, mesh, map);
        } else if ((t->flags & PDDE_TENSOR_PARAM) && !completion_annotated(g->planner, t)) {
            st = pdde_shard(g, t, mesh, map); /* replicated on this mesh */
        }
        if (st) return st;
    }
    return PDDE_OK;
}

pdde_status pdde_strategy_data_parallel_groups(pdde_graph *g, const pdde_mesh *mesh, const char *group_axis, const char *axis) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    int gax = strategy_axis(g, mesh, group_axis, "data parallel groups"), ax = gax < 0 ? -1 : strategy_axis(g, mesh, axis, "data parallel groups");
    if (gax < 0 || ax < 0) return PDDE_ERR_DIST_ATTR;
    struct planner_graph *pg = planner_of(g);
    if (gax == ax || strlen(group_axis) >= sizeof pg->group_axis || strlen(axis) >= sizeof pg->batch_axis)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "data parallel groups: axes %s and %s: want two different axes (names under %d characters)",
                          group_axis, axis, (int)sizeof pg->group_axis);
    if (pg->shares) return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "data parallel groups: not with uneven shares");
    pdde_status st = pdde_strategy_data_parallel(g, mesh, axis);
    if (st) return st;
    strcpy(pg->group_axis, group_axis), strcpy(pg->batch_axis, axis);
    return PDDE_OK;
}

pdde_status pdde_strategy_data_parallel_shares(pdde_graph *g, const pdde_mesh *mesh, const char *axis, const int *shares) {
    if (!g || !shares) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    int ax = strategy_axis(g, mesh, axis, "data parallel shares");
    if (ax < 0) return PDDE_ERR_DIST_ATTR;
    int n = mesh->shape[ax], total = 0;
    for (int i = 0; i < n; i++) {
        if (shares[i] < 1 || shares[i] > 1 << 16)
            return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "data parallel shares: share %d of axis %s is %d: want 1..65536 micro-batch units",
                              i, axis, shares[i]);
        total += shares[i];
    }
    struct planner_graph *pg = planner_of(g);
    int *copy = pg ? malloc((size_t)n * sizeof *copy) : NULL;
    if (!copy) return pdde_error(g->ctx, PDDE_ERR_OOM, "data parallel shares: out of memory");
    memcpy(copy, shares, (size_t)n * sizeof *copy);
    free(pg->shares);
    pg->shares = copy, pg->share_mesh = mesh, pg->share_axis = ax, pg->share_total = total;
    return PDDE_OK;
}

pdde_status pdde_strategy_zero(pdde_graph *g, const pdde_mesh *mesh, const char *axis, int stage) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    if (stage < 1 || stage > 3) return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "zero: stage %d (1, 2 or 3)", stage);
    if (!g->has_optimizer) return pdde_error(g->ctx, PDDE_ERR_STATE, "zero: append the optimizer first (its state is what stage 1 splits)");
    int ax = strategy_axis(g, mesh, axis, "zero");
    if (ax < 0) return PDDE_ERR_DIST_ATTR;
    int *owner = completion_owners(g);
    if (!owner) return pdde_error(g->ctx, PDDE_ERR_OOM, "zero: out of memory");
    pdde_status st = PDDE_OK;
    /* creation order: a parameter (stage 3) is split before its state, whose layout starts from it */
    for (int i = 0; i < g->n && !st; i++) {
        pdde_tensor *t = g->nodes[i];
        if (t->op != PDDE_OP_NONE) continue;
        bool param = t->flags & PDDE_TENSOR_PARAM, grad = owner[i] >= 0 && (t->flags & PDDE_TENSOR_GRAD);
        bool opt_state = owner[i] >= 0 && !grad;
        if (!((opt_state && stage >= 1) || (grad && stage >= 2) || (param && stage >= 3))) continue;
        int map[PDDE_MAX_DIMS];
        strategy_current(g, t, mesh, map);
        if (owner[i] >= 0 && !completion_annotated(g->planner, t)) strategy_current(g, g->nodes[owner[i]], mesh, map);
        if (strategy_uses(t, map, ax)) continue;
        int d = 0;
        while (d < t->ndim && (map[d] >= 0 || t->shape[d] % mesh->shape[ax])) d++;
        if (d == t->ndim) continue; /* no dim the axis divides: this one stays whole */
        map[d] = ax;
        st = pdde_shard(g, t, mesh, map);
    }
    free(owner);
    return st;
}

pdde_status pdde_strategy_tensor_parallel_linear(pdde_graph *g, pdde_tensor *w, pdde_tensor *b, const pdde_mesh *mesh,
                                                 const char *axis, pdde_tp_kind kind) {
    if (!g || !w) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    int ax = strategy_axis(g, mesh, axis, "tensor parallel");
    if (ax < 0) return PDDE_ERR_DIST_ATTR;
    if (w->ndim != 2 || (b && (b->ndim != 1 || b->shape[0] != w->shape[1])) || (kind != PDDE_TP_COLUMN && kind != PDDE_TP_ROW))
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "tensor parallel: %s must be [in, out] (and its bias [out]), kind column or row", w->name);
    int map[PDDE_MAX_DIMS];
    strategy_current(g, w, mesh, map);
    /* column: each rank computes its slice of the outputs (x replicated in, y split out);
     * row: each rank multiplies its slice of the inputs (x split in, y partial out) */
    map[kind == PDDE_TP_COLUMN ? 1 : 0] = ax;
    pdde_status st = pdde_shard(g, w, mesh, map);
    if (st || !b) return st;
    strategy_current(g, b, mesh, map);
    if (kind == PDDE_TP_COLUMN) map[0] = ax;
    else if (map[0] == ax) map[0] = -1; /* row parallel: the bias is added once, after the sum */
    return pdde_shard(g, b, mesh, map);
}

/* The table's vocab dim (0) over the axis. The rules do the rest: a lookup in a vocab-split table is
 * partial over the axis (spmd_rule_embedding), a tied head's logits come out split on the vocab
 * (spmd_rule_matmul), and the cross-entropy keeps them split (spmd_rule_cross_entropy); the executor
 * runs those ops in their vocab-parallel form (session_vocab_parallel in core/session.c). */
pdde_status pdde_strategy_vocab_parallel(pdde_graph *g, pdde_tensor *table, const pdde_mesh *mesh, const char *axis) {
    if (!g || !table) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    int ax = strategy_axis(g, mesh, axis, "vocab parallel");
    if (ax < 0) return PDDE_ERR_DIST_ATTR;
    if (table->ndim != 2)
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "vocab parallel: %s must be an embedding table [V, C]", table->name);
    int map[PDDE_MAX_DIMS];
    strategy_current(g, table, mesh, map);
    if (map[1] == ax) map[1] = -1; /* the vocab split takes the axis over from the width */
    map[0] = ax;
    return pdde_shard(g, table, mesh, map); /* (says so when V does not divide by the axis size) */
}

pdde_status pdde_strategy_pipeline(pdde_graph *g, const pdde_mesh *mesh, const char *axis, int n_layers) {
    return pdde_strategy_pipeline_interleaved(g, mesh, axis, n_layers, 1);
}

pdde_status pdde_strategy_pipeline_interleaved(pdde_graph *g, const pdde_mesh *mesh, const char *axis, int n_layers, int chunks) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    int ax = strategy_axis(g, mesh, axis, "pipeline");
    if (ax < 0) return PDDE_ERR_DIST_ATTR;
    int stages = mesh->shape[ax], runs = stages * chunks;
    if (chunks < 1 || n_layers < runs)
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "pipeline: %d layers cannot fill %d stages x %d chunks (mesh axis %s)", n_layers,
                          stages, chunks, axis);
    /* run r: layers [r * n / R, (r + 1) * n / R) on the slice of the mesh at r % S along the axis */
    for (int r = 0; r < runs; r++) {
        const pdde_mesh *stage = pdde_mesh_slice(g, mesh, ax, r % stages);
        if (!stage) return g->status;
        pdde_status st = pdde_graph_set_layer_mesh(g, r * n_layers / runs, (r + 1) * n_layers / runs - 1, stage);
        if (st) return st;
    }
    return PDDE_OK;
}
