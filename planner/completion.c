/* planner/completion.c — annotation and completion. pdde_shard records what the user (or a strategy)
 * decided for a few leaves; pdde_complete_dist_attrs walks the graph in creation order (a topological order),
 * gives every leaf its attr and runs every op's SPMD rule (spmd_rules.c), keeping what each op
 * requires of its inputs; pdde_graph_dump_dist prints the result as a program. */

#include "planner_impl.h"

PDDE_PRIVATE bool completion_annotated(const struct planner_graph *pg, const pdde_tensor *t) {
    return pg && t->id < pg->n_annotated && pg->annotated[t->id];
}

pdde_status pdde_shard(pdde_graph *g, pdde_tensor *t, const pdde_mesh *mesh, const int *dims_mapping) {
    if (!g || !t) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    struct planner_graph *pg = planner_of(g);
    if (!pg) return PDDE_ERR_OOM;
    if (t->id < 0 || t->id >= g->n || g->nodes[t->id] != t)
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "shard: %s is not a tensor of this graph", t->name);
    if (!mesh_owned(pg, mesh))
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "shard: %s: the mesh does not belong to this graph (make it with pdde_mesh_create)", t->name);
    /* computed tensors get their layout from their op's rule; annotating one would have to be pushed
     * back through the rules (Paddle's backward inference), which completion does not do */
    if (t->op != PDDE_OP_NONE)
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "shard: %s is computed by %s; annotate leaves (inputs, parameters, state)",
                          t->name, pdde_op_name(t->op));
    pdde_dist_attr a = attr_replicated(mesh, t->ndim);
    for (int d = 0; d < t->ndim; d++) {
        int ax = dims_mapping ? dims_mapping[d] : -1;
        if (ax < -1 || ax >= mesh->ndim)
            return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "shard: %s dim %d: mesh axis %d is out of range (the mesh has %d axes)",
                              t->name, d, ax, mesh->ndim);
        if (ax < 0) continue;
        for (int e = 0; e < d; e++)
            if (a.dims_mapping[e] == ax)
                return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "shard: %s dims %d and %d are both split over mesh axis %s",
                                  t->name, e, d, mesh->names[ax]);
        if (t->shape[d] % mesh->shape[ax])
            return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "shard: %s dim %d (size %lld) is not divisible by mesh axis %s (size %d)",
                              t->name, d, (long long)t->shape[d], mesh->names[ax], mesh->shape[ax]);
        a.dims_mapping[d] = (int8_t)ax;
    }
    if (t->id >= pg->n_annotated) {
        int n = g->n > 2 * pg->n_annotated ? g->n : 2 * pg->n_annotated;
        uint8_t *p = realloc(pg->annotated, (size_t)n);
        if (!p) return pdde_error(g->ctx, PDDE_ERR_OOM, "shard: out of memory");
        memset(p + pg->n_annotated, 0, (size_t)(n - pg->n_annotated));
        pg->annotated = p, pg->n_annotated = n;
    }
    t->dist = a;
    pg->annotated[t->id] = 1;
    return PDDE_OK;
}

/* For each optimizer state and gradient accumulator, the id of its parameter (-1 for the others). */
PDDE_PRIVATE int *completion_owners(const pdde_graph *g) {
    int *owner = malloc((size_t)(g->n ? g->n : 1) * sizeof *owner);
    if (!owner) return NULL;
    for (int i = 0; i < g->n; i++) owner[i] = -1;
    for (int i = 0; i < g->n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if ((t->flags & PDDE_TENSOR_PARAM) && t->grad) owner[t->grad->id] = t->id;
        if (t->op == PDDE_OP_SGD_UPDATE || t->op == PDDE_OP_ADAMW_UPDATE)
            for (int k = 2; k < t->nsrc; k++)
                if (t->src[k]->op == PDDE_OP_NONE) owner[t->src[k]->id] = t->src[0]->id;
    }
    return owner;
}

/* The seed of the backward pass (pdde_backward's constant 1 for d loss / d loss). */
static bool completion_is_grad_seed(const pdde_tensor *t) {
    return t->op == PDDE_OP_NONE && (t->flags & PDDE_TENSOR_CONST) && t->phase == PDDE_PHASE_BACKWARD &&
           strcmp(t->name, "loss.grad_seed") == 0;
}

/* The gradient a grad_accum adds into accumulator acc (made right after acc by pdde_backward). */
static const pdde_tensor *completion_accumulated(const pdde_graph *g, const pdde_tensor *acc) {
    for (int i = acc->id + 1; i < g->n; i++)
        if (g->nodes[i]->op == PDDE_OP_GRAD_ACCUM && g->nodes[i]->src[0] == acc) return g->nodes[i]->src[1];
    return NULL;
}

/* A leaf's attr: its annotation; else its parameter's (optimizer state, gradient accumulators), or
 * replicated on the graph's mesh. A leaf of a layer placed on a slice of the graph's mesh (a pipeline
 * stage) lives on that slice, and state on its parameter's mesh. The backward seed lives with its
 * loss and carries the mean marker: every rank differentiates its own mean, so what the gradients sum
 * over that axis is averaged (pdde_dist_attr). */
static pdde_dist_attr completion_leaf(const pdde_graph *g, const pdde_tensor *t, const int *owner, const pdde_tensor *loss) {
    const struct planner_graph *pg = g->planner;
    const pdde_mesh *home = owner[t->id] >= 0 ? g->nodes[owner[t->id]]->dist.mesh : planner_layer_mesh(pg, t->layer);
    if (completion_annotated(pg, t)) return home && mesh_sub_axis(t->dist.mesh, home) >= 0 ? attr_on_mesh(&t->dist, home) : t->dist;
    if (owner[t->id] >= 0) {
        pdde_dist_attr a = g->nodes[owner[t->id]]->dist;
        a.ndim = (int8_t)t->ndim, a.partial = a.partial_avg = 0;
        /* a gradient accumulator keeps the pending reduction of what it accumulates (data parallel:
         * partial{dp:avg}), so micro-batches add up locally and the update's requirement reduces the
         * sum once per step */
        const pdde_tensor *g_in = (t->flags & PDDE_TENSOR_GRAD) ? completion_accumulated(g, t) : NULL;
        if (g_in && mesh_same(g_in->dist.mesh, a.mesh)) {
            a.partial = (uint8_t)(g_in->dist.partial & ~attr_split_axes(&a));
            a.partial_avg = (uint8_t)(g_in->dist.partial_avg & a.partial);
        }
        return a;
    }
    if (loss && completion_is_grad_seed(t)) {
        pdde_dist_attr a = attr_replicated(loss->dist.mesh, t->ndim);
        a.partial_avg = loss->dist.partial & loss->dist.partial_avg;
        return a;
    }
    return attr_replicated(home ? home : pg->mesh, t->ndim);
}

pdde_status pdde_complete_dist_attrs(pdde_graph *g) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    struct planner_graph *pg = planner_of(g);
    if (!pg) return PDDE_ERR_OOM;
    if (!pg->mesh) return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "complete: the graph has no mesh (make one with pdde_mesh_create)");
    pdde_dist_attr *req = calloc((size_t)(g->n ? g->n : 1) * PDDE_MAX_SRC, sizeof *req);
    int *owner = completion_owners(g);
    /* data-parallel groups: whether a node holds its group's own values (spmd_ctx.group_local) */
    bool *local = calloc((size_t)(g->n ? g->n : 1), sizeof *local);
    if (!req || !owner || !local) {
        free(req), free(owner), free(local);
        return pdde_error(g->ctx, PDDE_ERR_OOM, "complete: out of memory");
    }
    free(pg->required);
    pg->required = req, pg->n_completed = 0, pg->n_conflicts = 0, pg->oom = false;
    /* the loss pdde_backward differentiated: the last forward loss */
    const pdde_tensor *loss = NULL;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->phase == PDDE_PHASE_FORWARD && (g->nodes[i]->flags & PDDE_TENSOR_LOSS)) loss = g->nodes[i];
    for (int i = 0; i < g->n; i++) {
        pdde_tensor *t = g->nodes[i];
        if (t->op == PDDE_OP_NONE) {
            t->dist = completion_leaf(g, t, owner, loss);
            local[i] = (t->flags & PDDE_TENSOR_INPUT) || (owner[i] >= 0 && (t->flags & PDDE_TENSOR_GRAD)); /* data, accumulated gradients */
            continue;
        }
        spmd_ctx c;
        memset(&c, 0, sizeof c);
        c.pg = pg, c.node = t, c.nsrc = t->nsrc;
        /* an op runs on its layer's mesh if it has one (a pipeline stage), else on its first input's;
         * inputs from another mesh arrive by send/recv */
        c.mesh = planner_layer_mesh(pg, t->layer);
        if (!c.mesh) c.mesh = t->nsrc && t->src[0]->dist.mesh ? t->src[0]->dist.mesh : pg->mesh;
        for (int k = 0; k < t->nsrc; k++) c.in[k] = attr_on_mesh(&t->src[k]->dist, c.mesh), c.group_local |= (unsigned)local[t->src[k]->id] << k;
        c.out_group_local = c.group_local != 0;
        if (spmd_apply(&c, g)) {
            free(owner), free(local);
            return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "complete: node %d '%s' (%s) would be split and pending a sum over one mesh axis: "
                              "its inputs' layouts are not supported together", i, t->name, pdde_op_name(t->op));
        }
        t->dist = c.out;
        local[i] = c.out_group_local;
        memcpy(&req[(size_t)i * PDDE_MAX_SRC], c.req, (size_t)t->nsrc * sizeof *c.req);
    }
    pg->n_completed = g->n;
    free(owner), free(local);
    if (pg->oom) return pdde_error(g->ctx, PDDE_ERR_OOM, "complete: out of memory recording conflicts");
    return PDDE_OK;
}

const pdde_dist_attr *pdde_op_input_dist_attr(const pdde_graph *g, const pdde_tensor *node, int k) {
    if (!g || !node || !g->planner || node->id < 0 || node->id >= g->planner->n_completed || g->nodes[node->id] != node)
        return NULL;
    if (node->op == PDDE_OP_NONE || k < 0 || k >= node->nsrc) return NULL;
    return &g->planner->required[(size_t)node->id * PDDE_MAX_SRC + k];
}

int pdde_complete_conflict_count(const pdde_graph *g) { return g && g->planner ? g->planner->n_conflicts : 0; }

const char *pdde_complete_conflict(const pdde_graph *g, int i) {
    if (!g || !g->planner || i < 0 || i >= g->planner->n_conflicts) return NULL;
    return g->planner->conflicts[i].msg;
}

void pdde_graph_dump_dist(const pdde_graph *g, FILE *f) {
    if (!g || !f) return;
    const struct planner_graph *pg = g->planner;
    if (!pg || !pg->n_completed) {
        fprintf(f, "# dist attrs: not completed (pdde_complete_dist_attrs)\n");
        return;
    }
    char shape[96], have[160], need[160], how[160];
    fprintf(f, "# distributed program: %d nodes; graph mesh", pg->n_completed);
    for (int a = 0; a < pg->mesh->ndim; a++) fprintf(f, " %s=%d", pg->mesh->names[a], pg->mesh->shape[a]);
    fprintf(f, "\n#  id op                   tensor                     shape          dist attr\n");
    for (int i = 0; i < pg->n_completed; i++) {
        const pdde_tensor *t = g->nodes[i];
        shape_str(t, shape, sizeof shape);
        pdde_dist_attr_str(&t->dist, have, sizeof have);
        fprintf(f, "%5d %-20s %-26s %-14s %s%s\n", t->id, pdde_op_name(t->op), t->name, shape, have,
                completion_annotated(pg, t) ? "  (annotated)" : "");
        for (int k = 0; k < t->nsrc; k++) {
            const pdde_dist_attr *r = &pg->required[(size_t)i * PDDE_MAX_SRC + k];
            if (attr_equal(&t->src[k]->dist, r)) continue;
            pdde_dist_attr_str(r, need, sizeof need);
            attr_reshard_str(&t->src[k]->dist, r, how, sizeof how);
            fprintf(f, "        in%d %s needs %s  [%s]\n", k, t->src[k]->name, need, how);
        }
        if ((t->op == PDDE_OP_SGD_UPDATE || t->op == PDDE_OP_ADAMW_UPDATE) && !attr_equal(&t->dist, &t->src[0]->dist)) {
            attr_reshard_str(&t->dist, &t->src[0]->dist, how, sizeof how);
            fprintf(f, "        updated values go back into %s  [%s]\n", t->src[0]->name, how);
        }
    }
    fprintf(f, "# %d conflict%s\n", pg->n_conflicts, pg->n_conflicts == 1 ? "" : "s");
    for (int i = 0; i < pg->n_conflicts; i++) fprintf(f, "#   %s\n", pg->conflicts[i].msg);
}
