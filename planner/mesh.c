/* planner/mesh.c — process meshes: N-d arrays of ranks with named axes, owned by their graph.
 * (Paddle's ProcessMesh{shape, process_ids, dim_names}.) */

#include "planner_impl.h"

PDDE_PRIVATE int mesh_numel(int ndim, const int *shape) {
    int n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

PDDE_PRIVATE bool mesh_owned(const struct planner_graph *pg, const pdde_mesh *m) {
    for (int i = 0; pg && i < pg->n_meshes; i++)
        if (pg->meshes[i] == m) return true;
    return false;
}

PDDE_PRIVATE int mesh_index_of(const pdde_mesh *m, int rank) {
    for (int i = 0; i < m->n_ranks; i++)
        if (m->ranks[i] == rank) return i;
    return -1;
}

/* "[2,4]" for messages */
PDDE_PRIVATE void mesh_shape_str(const pdde_mesh *m, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < m->ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ",%d" : "%d", m->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Validates and stores a mesh; ranks NULL = 0..n-1. Every failure is a sticky graph error. */
static const pdde_mesh *mesh_add(pdde_graph *g, int ndim, const int *shape, const char *const *names, const int *ranks) {
    if (g->status != PDDE_OK) return NULL;
    struct planner_graph *pg = planner_of(g);
    if (!pg) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_OOM, "mesh: out of memory");
    /* ndim 0 only comes from slicing a 1-d mesh: a single rank */
    if (ndim < 0 || ndim > PDDE_MAX_MESH_DIMS || (ndim > 0 && (!shape || !names)))
        return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: %d axes (1..%d, with shape and names)", ndim, PDDE_MAX_MESH_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: axis %d has size %d", i, shape[i]);
        if (!names[i] || !names[i][0] || strlen(names[i]) >= sizeof pg->meshes[0]->names[0])
            return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: axis %d needs a name of 1..15 chars", i);
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: axes %d and %d are both called %s", j, i, names[i]);
    }
    int n = mesh_numel(ndim, shape);
    for (int i = 0; ranks && i < n; i++) {
        if (ranks[i] < 0) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: rank %d at %d is negative", ranks[i], i);
        for (int j = 0; j < i; j++)
            if (ranks[i] == ranks[j]) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: rank %d appears twice", ranks[i]);
    }
    /* later meshes are parts of the job's ranks (the graph's mesh): a mesh asking for more ranks
     * than the job was given, or for ranks outside it, cannot be placed */
    if (pg->mesh) {
        char s[48];
        mesh_shape_str(pg->mesh, s, sizeof s);
        if (n > pg->mesh->n_ranks)
            return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: %d ranks, but the graph's mesh %s has only %d",
                                                 n, s, pg->mesh->n_ranks);
        for (int i = 0; i < n; i++)
            if (mesh_index_of(pg->mesh, ranks ? ranks[i] : i) < 0)
                return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: rank %d is not in the graph's mesh %s",
                                                     ranks ? ranks[i] : i, s);
    }
    if (pg->n_meshes == pg->cap_meshes) {
        int cap = pg->cap_meshes ? 2 * pg->cap_meshes : 8;
        pdde_mesh **m = realloc(pg->meshes, (size_t)cap * sizeof *m);
        if (!m) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_OOM, "mesh: out of memory");
        pg->meshes = m, pg->cap_meshes = cap;
    }
    pdde_mesh *m = calloc(1, sizeof *m + (size_t)n * sizeof(int));
    if (!m) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_OOM, "mesh: out of memory");
    int *r = (int *)(m + 1);
    m->ndim = ndim;
    for (int i = 0; i < ndim; i++) m->shape[i] = shape[i], snprintf(m->names[i], sizeof m->names[i], "%s", names[i]);
    m->n_ranks = n;
    for (int i = 0; i < n; i++) r[i] = ranks ? ranks[i] : i;
    m->ranks = r;
    pg->meshes[pg->n_meshes++] = m;
    if (!pg->mesh) pg->mesh = m;
    return m;
}

const pdde_mesh *pdde_mesh_create(pdde_graph *g, int ndim, const int *shape, const char *const *names, const int *ranks) {
    if (!g) return NULL;
    if (ndim < 1) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh: %d axes (1..%d)", ndim, PDDE_MAX_MESH_DIMS);
    return mesh_add(g, ndim, shape, names, ranks);
}

const pdde_mesh *pdde_mesh_slice(pdde_graph *g, const pdde_mesh *mesh, int axis, int index) {
    if (!g) return NULL;
    if (!mesh_owned(g->planner, mesh))
        return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh slice: the mesh does not belong to this graph");
    if (axis < 0 || axis >= mesh->ndim || index < 0 || index >= mesh->shape[axis])
        return (const pdde_mesh *)graph_fail(g, PDDE_ERR_DIST_ATTR, "mesh slice: axis %d index %d is outside a %d-axis mesh",
                                             axis, index, mesh->ndim);
    int shape[PDDE_MAX_MESH_DIMS], nd = 0;
    const char *names[PDDE_MAX_MESH_DIMS];
    for (int i = 0; i < mesh->ndim; i++)
        if (i != axis) shape[nd] = mesh->shape[i], names[nd++] = mesh->names[i];
    int *ranks = calloc((size_t)(mesh->n_ranks / mesh->shape[axis]), sizeof *ranks);
    if (!ranks) return (const pdde_mesh *)graph_fail(g, PDDE_ERR_OOM, "mesh slice: out of memory");
    /* walk the mesh row-major and keep the ranks whose coordinate along axis is index */
    int k = 0, coords[PDDE_MAX_MESH_DIMS];
    for (int i = 0; i < mesh->n_ranks; i++) {
        pdde_mesh_coords(mesh, mesh->ranks[i], coords);
        if (coords[axis] == index) ranks[k++] = mesh->ranks[i];
    }
    const pdde_mesh *m = mesh_add(g, nd, shape, names, ranks);
    free(ranks);
    return m;
}

const pdde_mesh *pdde_graph_mesh(const pdde_graph *g) { return g && g->planner ? g->planner->mesh : NULL; }

pdde_status pdde_graph_set_mesh(pdde_graph *g, const pdde_mesh *mesh) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (!mesh_owned(g->planner, mesh)) return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "set mesh: the mesh does not belong to this graph");
    g->planner->mesh = mesh;
    return PDDE_OK;
}

int pdde_mesh_axis(const pdde_mesh *mesh, const char *name) {
    for (int i = 0; mesh && name && i < mesh->ndim; i++)
        if (strcmp(mesh->names[i], name) == 0) return i;
    return -1;
}

pdde_status pdde_mesh_coords(const pdde_mesh *mesh, int rank, int *coords) {
    if (!mesh || !coords) return PDDE_ERR_INVALID_ARG;
    int i = mesh_index_of(mesh, rank);
    if (i < 0) return PDDE_ERR_NOT_FOUND;
    for (int d = mesh->ndim - 1; d >= 0; d--) coords[d] = i % mesh->shape[d], i /= mesh->shape[d];
    return PDDE_OK;
}

int pdde_mesh_rank_at(const pdde_mesh *mesh, const int *coords) {
    if (!mesh || (mesh->ndim > 0 && !coords)) return -1;
    int i = 0;
    for (int d = 0; d < mesh->ndim; d++) {
        if (coords[d] < 0 || coords[d] >= mesh->shape[d]) return -1;
        i = i * mesh->shape[d] + coords[d];
    }
    return mesh->ranks[i];
}

/* The axis of `parent` that `sub` drops when sub is one of its slices (pdde_mesh_slice: the other axes
 * in order, each rank at the same coordinates along them), else -1. */
PDDE_PRIVATE int mesh_sub_axis(const pdde_mesh *parent, const pdde_mesh *sub) {
    if (!parent || !sub || sub->ndim != parent->ndim - 1) return -1;
    for (int p = 0; p < parent->ndim; p++) {
        bool match = true;
        for (int a = 0, b = 0; a < parent->ndim && match; a++) {
            if (a == p) continue;
            match = parent->shape[a] == sub->shape[b] && strcmp(parent->names[a], sub->names[b]) == 0;
            b++;
        }
        int pc[PDDE_MAX_MESH_DIMS], sc[PDDE_MAX_MESH_DIMS], fixed = -1;
        for (int i = 0; i < sub->n_ranks && match; i++) {
            match = pdde_mesh_coords(parent, sub->ranks[i], pc) == PDDE_OK && pdde_mesh_coords(sub, sub->ranks[i], sc) == PDDE_OK;
            for (int a = 0, b = 0; a < parent->ndim && match; a++) {
                if (a == p) match = fixed < 0 || pc[a] == fixed, fixed = pc[a];
                else match = pc[a] == sc[b++];
            }
        }
        if (match) return p;
    }
    return -1;
}

/* The sub-mesh layer runs on (pdde_graph_set_layer_mesh), or NULL. */
PDDE_PRIVATE const pdde_mesh *planner_layer_mesh(const struct planner_graph *pg, int layer) {
    return pg && layer >= 0 && layer < pg->n_layer_mesh ? pg->layer_mesh[layer] : NULL;
}

pdde_status pdde_graph_set_layer_mesh(pdde_graph *g, int first_layer, int last_layer, const pdde_mesh *mesh) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    struct planner_graph *pg = planner_of(g);
    if (!pg) return PDDE_ERR_OOM;
    if (!mesh_owned(pg, mesh)) return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "layer mesh: the mesh does not belong to this graph");
    if (first_layer < 0 || last_layer < first_layer)
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "layer mesh: layers %d..%d (want 0 <= first <= last)", first_layer, last_layer);
    if (mesh != pg->mesh && mesh_sub_axis(pg->mesh, mesh) < 0)
        return pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "layer mesh: layers %d..%d: the mesh must be the graph's mesh or a slice of it (pdde_mesh_slice)",
                          first_layer, last_layer);
    if (last_layer >= pg->n_layer_mesh) {
        const pdde_mesh **lm = realloc(pg->layer_mesh, (size_t)(last_layer + 1) * sizeof *lm);
        if (!lm) return pdde_error(g->ctx, PDDE_ERR_OOM, "layer mesh: out of memory");
        for (int l = pg->n_layer_mesh; l <= last_layer; l++) lm[l] = NULL;
        pg->layer_mesh = lm, pg->n_layer_mesh = last_layer + 1;
    }
    for (int l = first_layer; l <= last_layer; l++) pg->layer_mesh[l] = mesh;
    return PDDE_OK;
}

/* The same ranks in the same shape (then a dims mapping means the same thing on both). */
PDDE_PRIVATE bool mesh_same(const pdde_mesh *a, const pdde_mesh *b) {
    if (a == b) return true;
    if (!a || !b || a->ndim != b->ndim || a->n_ranks != b->n_ranks) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return memcmp(a->ranks, b->ranks, (size_t)a->n_ranks * sizeof(int)) == 0;
}
