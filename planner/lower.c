/* planner/lower.c — lowering: from a completed graph, the lowering params and a rank, that rank's local
 * program (pdde_program, planner_impl.h). A pure function: it reads the graph and writes only the program
 * it returns — no communicator (peers and groups are mesh coordinates turned into ranks), no device,
 * no tensor memory — so a planner can lower every rank of a candidate plan in one process, and a
 * graph can be compiled many times under different plans.
 *
 *   place:     the nodes the step needs (those reaching a loss, an output or an update), each on a
 *              device (its own, its layer's, or the default; views where their storage is), with a
 *              COPY wherever a node reads a tensor that lives on another device.
 *   partition: (with a world) every tensor gets this rank's local shape (a dim split over mesh axis a
 *              is divided by the axis size); nodes of other pipeline stages are left out.
 *   reshard:   where an op requires of an input another attr than its producer gives, nodes are
 *              inserted per mesh axis: partial -> whole = allreduce (avg for a pending mean),
 *              partial -> split = reduce-scatter, split -> whole = allgather, whole -> split = a
 *              local slice, split on another dim = alltoall, whole -> partial sum = the value on
 *              the axis' first rank and zeros elsewhere; across stages, send and recv.
 *   buckets:   (with a world) the data-parallel collectives of small tensors share collectives on flat
 *              buffers (gradient buckets).
 *   schedule:  the pipeline stages (the runs of layers on one mesh), this rank's, its chunks, and the
 *              passes of a step in the 1F1B or GPipe order. */

#include "planner_impl.h"

#include <unistd.h>

enum { LOWER_BLOCK = 128 }; /* program nodes per storage block (small: reused from the heap, rank after rank) */

typedef struct { pdde_tensor *x, *node; pdde_dist_attr want; pdde_phase phase; int next; } reshard_done;

typedef struct {
    pdde_program *P;
    const pdde_graph *g;
    const pdde_lower_params *p;
    pdde_context *ctx;
    int64_t (*gshape)[PDDE_MAX_DIMS]; /* by program id of a placed node: its global shape */
    int n_gshape;
    /* what a tensor became for a requirement, made once: items chained per source program id */
    reshard_done *done;
    int n_done, cap_done;
    int *first_done;                  /* by program id: first item, -1 = none */
    int n_first;
    /* which meshes hold this rank (a mesh's rank list is long; a graph has a few meshes) */
    const pdde_mesh *seen_mesh[32];
    int seen_index[32], n_seen;
    /* which mesh is a slice of which (mesh_sub_axis looks at every rank of both) */
    const pdde_mesh *sub_parent[64], *sub_child[64];
    int sub_result[64], n_sub;
    bool bf16; /* the graph computes in bf16 (lower_graph_bf16): the fusions' defaults depend on it */
    bool regather; /* ZeRO-3: a parameter gathered in forward is gathered again for backward (lower_regather_on) */
} lowering;

/* mesh_sub_axis(parent, sub), remembered per pair. */
static int sub_axis(lowering *L, const pdde_mesh *parent, const pdde_mesh *sub) {
    for (int i = 0; i < L->n_sub; i++)
        if (L->sub_parent[i] == parent && L->sub_child[i] == sub) return L->sub_result[i];
    int p = mesh_sub_axis(parent, sub);
    if (L->n_sub < 64) L->sub_parent[L->n_sub] = parent, L->sub_child[L->n_sub] = sub, L->sub_result[L->n_sub++] = p;
    return p;
}

/* The index of this rank in mesh m (-1: not in it), remembered per mesh. */
static int rank_in(lowering *L, const pdde_mesh *m) {
    for (int i = 0; i < L->n_seen; i++)
        if (L->seen_mesh[i] == m) return L->seen_index[i];
    int at = mesh_index_of(m, L->P->rank);
    if (L->n_seen < 32) L->seen_mesh[L->n_seen] = m, L->seen_index[L->n_seen++] = at;
    return at;
}

/* Whether t (a user node or a program node) runs on this rank. */
static bool on_this_rank(lowering *L, const pdde_tensor *t) { return !t || !t->dist.mesh || rank_in(L, t->dist.mesh) >= 0; }

static pdde_status lower_oom(lowering *L) { return pdde_error(L->ctx, PDDE_ERR_OOM, "lower: out of memory"); }

/* ------------------------------------------------------------------------------------------------
 * Program nodes */

/* A new node of P: a copy of `like` (NULL: zeros) with op, dtype, shape and sources given. */
static pdde_tensor *node_new(pdde_program *P, const pdde_tensor *like, pdde_op op, pdde_dtype dt, int ndim, const int64_t *shape,
                             int nsrc, pdde_tensor *const *src) {
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 1024;
        pdde_tensor **nodes = realloc(P->nodes, (size_t)cap * sizeof *nodes);
        if (nodes) P->nodes = nodes;
        pdde_program_node *info = realloc(P->info, (size_t)cap * sizeof *info);
        if (info) P->info = info;
        if (!nodes || !info) return NULL;
        P->cap = cap;
    }
    if (P->n % LOWER_BLOCK == 0) {
        pdde_tensor **blocks = realloc(P->blocks, (size_t)(P->n_blocks + 1) * sizeof *blocks);
        if (!blocks) return NULL;
        P->blocks = blocks;
        if (!(P->blocks[P->n_blocks] = malloc(LOWER_BLOCK * sizeof(pdde_tensor)))) return NULL;
        P->n_blocks++;
    }
    pdde_tensor *t = &P->blocks[P->n / LOWER_BLOCK][P->n % LOWER_BLOCK];
    if (like) *t = *like;
    else memset(t, 0, sizeof *t), t->layer = -1, t->device = -1;
    t->id = P->n;
    t->op = op, t->dtype = dt, t->ndim = ndim;
    memset(t->shape, 0, sizeof t->shape);
    if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nsrc = nsrc;
    memset(t->src, 0, sizeof t->src);
    for (int i = 0; i < nsrc; i++) t->src[i] = src[i];
    t->grad = NULL, t->data = NULL, t->offset = 0;
    if (!like) snprintf(t->name, sizeof t->name, "%s.%d", pdde_op_name(op), t->id);
    P->info[t->id] = (pdde_program_node){.user = -1, .chunk = -1, .axis = -1, .dim = -1, .split_dim = -1, .peer = -1, .vocab_axis = -1};
    P->nodes[P->n++] = t;
    return t;
}

/* A node made by lowering, named after its op and program id. */
static pdde_tensor *node_add(lowering *L, pdde_op op, pdde_tensor *x, int ndim, const int64_t *shape, int nsrc, pdde_tensor *const *src) {
    pdde_tensor *t = node_new(L->P, NULL, op, x->dtype, ndim, shape, nsrc, src);
    if (t) t->device = x->device, t->phase = x->phase, t->dist = x->dist; /* (layer: -1, inherited later) */
    return t;
}

static int order_push(pdde_program *P, pdde_tensor *t) {
    if (!t) return 1;
    if (P->n_order == P->cap_order) {
        int cap = P->cap_order ? 2 * P->cap_order : 1024;
        pdde_tensor **order = realloc(P->order, (size_t)cap * sizeof *order);
        if (!order) return 1;
        P->order = order, P->cap_order = cap;
    }
    P->order[P->n_order++] = t;
    return 0;
}

PDDE_PRIVATE void program_free(pdde_program *P) {
    if (!P) return;
    for (int b = 0; b < P->n_blocks; b++) free(P->blocks[b]);
    for (int a = 0; a < PDDE_MAX_MESH_DIMS; a++) free(P->group[a]);
    free(P->blocks), free(P->nodes), free(P->info), free(P->order);
    free(P->of_user), free(P->elsewhere), free(P->step), free(P->forward);
    free(P);
}

/* ------------------------------------------------------------------------------------------------
 * Place: the nodes the step needs, their devices, copies at device boundaries */

/* The nodes the step needs (planner_impl.h): what a loss, an output or an update depends on. */
PDDE_PRIVATE uint8_t *lower_needed_nodes(const pdde_graph *g) {
    uint8_t *need = calloc((size_t)g->n + 1, sizeof *need);
    if (!need) return NULL;
    bool any_root = false;
    for (int i = g->n - 1; i >= 0; i--) {
        const pdde_tensor *t = g->nodes[i];
        if ((t->flags & (PDDE_TENSOR_LOSS | PDDE_TENSOR_OUTPUT)) || t->op == PDDE_OP_GRAD_ACCUM ||
            t->op == PDDE_OP_ADAMW_UPDATE || t->op == PDDE_OP_SGD_UPDATE)
            need[i] = 1, any_root = true;
        if (need[i])
            for (int s = 0; s < t->nsrc; s++) need[t->src[s]->id] = 1;
    }
    if (!any_root)
        for (int i = 0; i < g->n; i++) need[i] = 1;
    return need;
}

static int node_device(const pdde_tensor *t, const pdde_lower_params *p) {
    if (t->device >= 0) return t->device;
    if (t->layer >= 0 && p->layer_devices && t->layer < p->n_layer_devices && p->layer_devices[t->layer] >= 0)
        return p->layer_devices[t->layer];
    return p->device;
}

/* The user's nodes this rank's lowering looks at: with a world, those on this rank and those of other
 * ranks that read one of them (a send's consumer) or that one of them reads (a receive's producer);
 * the others (most of them, under pipeline stages) are left alone. Marks need[] 2 for those. */
static void relevant_nodes(lowering *L, uint8_t *need) {
    const pdde_graph *g = L->g;
    for (int i = 0; i < g->n; i++) {
        const pdde_tensor *u = g->nodes[i];
        if (!need[i]) continue;
        bool here = L->p->world_size == 0 || on_this_rank(L, u);
        for (int k = 0; k < u->nsrc && !here; k++) here = need[u->src[k]->id] == 2 && on_this_rank(L, u->src[k]);
        if (!here) continue;
        need[i] = 2;
        for (int k = 0; k < u->nsrc; k++) need[u->src[k]->id] = 2; /* (earlier nodes: already walked) */
    }
}

/* Records that u moves from `device` to the CPU (its op named once in the program's notice). */
static void fallback_note(pdde_program *P, const pdde_tensor *u, int device) {
    char item[64];
    snprintf(item, sizeof item, "%s (device %d)", pdde_op_name(u->op), device);
    P->n_fallback++;
    size_t len = strlen(P->fallback);
    if (strstr(P->fallback, item)) return; /* (no op's name ends another's: "gelu (" is not in "gelu_back (") */
    if (len + strlen(item) + 3 < sizeof P->fallback) snprintf(P->fallback + len, sizeof P->fallback - len, "%s%s", len ? ", " : "", item);
}

/* An op that writes its inputs in place (an optimizer's update, a gradient's accumulation) runs where they
 * live. Where that device cannot run it (a plugin without AdamW), what it writes lives on the CPU instead,
 * and the device's nodes that read it get copies: marks on_cpu[] of those storage roots. */
static void in_place_fallbacks(lowering *L, const uint8_t *need, uint8_t *on_cpu) {
    const pdde_graph *g = L->g;
    for (int i = 0; i < g->n; i++) {
        pdde_tensor *u = g->nodes[i];
        if (need[i] != 2 || u->op == PDDE_OP_NONE || (u->flags & PDDE_TENSOR_VIEW) || !is_root_sharing(u)) continue;
        const pdde_tensor *root = storage_root(u);
        int device = on_cpu[root->id] ? 0 : node_device(root, L->p);
        if (device == 0 || (unsigned)u->op >= PDDE_OP_COUNT || registry_device_supports(L->ctx, L->ctx->registry, device, u)) continue;
        fallback_note(L->P, u, device);
        for (int k = 0; k < u->nsrc; k++)
            if (is_update(u) ? u->src[k] != update_norm(u) : k == 0) on_cpu[storage_root(u->src[k])->id] = 1;
    }
}

static pdde_status lower_place(lowering *L) {
    const pdde_graph *g = L->g;
    pdde_program *P = L->P;
    uint8_t *need = lower_needed_nodes(g), *on_cpu = calloc((size_t)g->n + 1, 1);
    int *device = malloc((size_t)(g->n + 1) * sizeof *device);
    typedef struct { int src_id, device; pdde_tensor *copy; } copy_entry;
    copy_entry *copies = NULL;
    int n_copies = 0, cap_copies = 0;
    if (!need || !on_cpu || !device) { free(need), free(on_cpu), free(device); return lower_oom(L); }
    relevant_nodes(L, need);
    if (!L->p->no_cpu_fallback) in_place_fallbacks(L, need, on_cpu);
    pdde_status st = PDDE_OK;
    for (int i = 0; i < g->n && !st; i++) {
        const pdde_tensor *u = g->nodes[i];
        if (!need[i]) continue;
        if ((unsigned)u->op >= PDDE_OP_COUNT) { st = pdde_error(L->ctx, PDDE_ERR_UNKNOWN_OP, "lower: node %s has unknown op %d", u->name, u->op); break; }
        /* views and in-place ops live where their storage lives */
        device[i] = is_root_sharing(u) ? device[u->src[0]->id] : on_cpu[i] ? 0 : node_device(u, L->p);
        if (u->op != PDDE_OP_NONE && !is_root_sharing(u) && !L->p->no_cpu_fallback && need[i] == 2 &&
            !registry_device_supports(L->ctx, L->ctx->registry, device[i], u))
            fallback_note(P, u, device[i]), device[i] = 0; /* the CPU: device 0 */
        if (need[i] != 2) { /* another rank's, and no neighbour of this rank's */
            P->elsewhere[i] = true;
            continue;
        }
        pdde_tensor *t = node_new(P, u, u->op, u->dtype, u->ndim, u->shape, u->nsrc, u->src);
        if (!t) { st = lower_oom(L); break; }
        P->info[t->id].user = u->id;
        P->of_user[u->id] = t;
        t->device = device[i];
        /* inputs on another device come through a COPY node, made once per (tensor, device) */
        for (int k = 0; k < u->nsrc && !st; k++) {
            pdde_tensor *x = P->of_user[u->src[k]->id];
            if (!x) { t->src[k] = NULL; continue; } /* (not looked at here: t is another rank's) */
            if (x->device != t->device) {
                pdde_tensor *copy = NULL;
                for (int c = 0; c < n_copies && !copy; c++)
                    if (copies[c].src_id == x->id && copies[c].device == t->device) copy = copies[c].copy;
                if (!copy) {
                    if (n_copies == cap_copies) {
                        cap_copies = cap_copies ? 2 * cap_copies : 16;
                        copy_entry *more = realloc(copies, (size_t)cap_copies * sizeof *more);
                        if (!more) { st = lower_oom(L); break; }
                        copies = more;
                    }
                    copy = node_add(L, PDDE_OP_COPY, x, x->ndim, x->shape, 1, &x);
                    if (!copy || order_push(P, copy)) { st = lower_oom(L); break; }
                    copy->phase = t->phase, copy->layer = t->layer, copy->device = t->device;
                    copy->dist = x->dist; /* a copy moves the same block (SPMD execution) */
                    P->info[copy->id].bytes = pdde_tensor_nbytes(copy);
                    copies[n_copies++] = (copy_entry){x->id, t->device, copy};
                }
                x = copy;
            }
            t->src[k] = x;
        }
        if (!st && order_push(P, t)) st = lower_oom(L);
    }
    free(copies);
    free(need), free(on_cpu);
    free(device);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Partition and reshard (with a world) */

/* The graph mesh's axis that axis a of mesh (the graph's mesh or a slice of it) is. */
PDDE_PRIVATE int program_axis(const pdde_program *P, const pdde_mesh *mesh, int a) {
    return mesh == P->mesh ? a : pdde_mesh_axis(P->mesh, mesh->names[a]);
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

/* What op requires of input k of program node t (NULL: no requirement, as for inserted nodes). */
static const pdde_dist_attr *required(const lowering *L, const pdde_tensor *t, int k) {
    int u = L->P->info[t->id].user;
    return u >= 0 ? pdde_op_input_dist_attr(L->g, L->g->nodes[u], k) : NULL;
}

/* A reshard step over graph mesh axis `axis`: a node reading x with x's local shape changed along
 * dim grow (times the axis size) and dim shrink (divided by it); -1 for none. */
static pdde_tensor *reshard_node(lowering *L, pdde_op op, pdde_tensor *x, int axis, int grow, int shrink, const pdde_dist_attr *attr) {
    int64_t shape[PDDE_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    int n = L->P->mesh->shape[axis];
    if (grow >= 0) shape[grow] *= n;
    if (shrink >= 0) shape[shrink] /= n;
    pdde_tensor *t = node_add(L, op, x, x->ndim, shape, 1, &x);
    if (!t) return NULL;
    t->dist = *attr;
    pdde_program_node *in = &L->P->info[t->id];
    in->axis = axis, in->dim = grow >= 0 ? grow : shrink;
    if (op == PDDE_OP_ALLTOALL) in->split_dim = shrink;
    in->bytes = pdde_tensor_nbytes(x);
    return t;
}

/* Appends one reshard step to the order, in the consumer's phase. NULL on failure. */
static pdde_tensor *reshard_push(lowering *L, pdde_tensor *t, pdde_phase phase, int device) {
    if (!t || order_push(L->P, t)) return NULL;
    t->phase = phase, t->device = device;
    return t;
}

static bool is_collective(pdde_op op) { return op >= PDDE_OP_ALLREDUCE && op <= PDDE_OP_ALLGATHER; }

/* Expert parallelism's token exchange: an alltoall between a by-expert buffer [E, S, ...] split on S
 * (the tokens' rows, on their rank) and split on E (on the experts' rank). The buffer's rows that
 * hold tokens are the first of each expert's block, as many as the local ids route there (capped
 * at S): the executor sends only those (alltoallv, the counts exchanged first), so the exchange
 * takes the ids as a second input. Found by walking first inputs up to the by-expert dispatch (or
 * an exchange that already has them): the buffers between are the experts' GEMMs and activations
 * of those same rows. NULL: not such an exchange. */
static pdde_tensor *moe_exchange_ids(pdde_tensor *x, int grow, int shrink) {
    if (x->ndim < 3 || !((grow == 0 && shrink == 1) || (grow == 1 && shrink == 0))) return NULL;
    for (int depth = 0; x && depth < 8; depth++, x = x->nsrc > 0 ? x->src[0] : NULL) {
        if (x->op == PDDE_OP_ALLTOALL && x->nsrc == 2) return x->src[1];
        if (x->op == PDDE_OP_MOE_DISPATCH && x->ndim == 3 && x->nsrc >= 2 && x->src[1]->dtype == PDDE_I32) return x->src[1];
        if (x->op == PDDE_OP_MOE_DISPATCH || x->op == PDDE_OP_MOE_COMBINE || x->op == PDDE_OP_MOE_COMBINE_BACK_W) return NULL;
    }
    return NULL;
}

/* A collective reshard step (op over graph mesh axis ga, reduce op rop where it reduces). With
 * comm_dtype narrower than t's f32, the data crosses the wire in it: a cast on each side (what is
 * sent, and what was received, rounded). */
static pdde_tensor *reshard_collective(lowering *L, pdde_op op, pdde_tensor *t, int ga, int grow, int shrink, int rop,
                                       const pdde_dist_attr *attr, pdde_phase phase, int device) {
    bool narrow = L->p->comm_dtype != PDDE_F32 && t->dtype == PDDE_F32;
    if (narrow) {
        pdde_tensor *c = node_add(L, PDDE_OP_CAST, t, t->ndim, t->shape, 1, &t);
        if (c) c->dtype = L->p->comm_dtype;
        t = reshard_push(L, c, phase, device);
    }
    pdde_tensor *ids = op == PDDE_OP_ALLTOALL ? moe_exchange_ids(t, grow, shrink) : NULL;
    t = t ? reshard_push(L, reshard_node(L, op, t, ga, grow, shrink, attr), phase, device) : NULL;
    if (t) L->P->info[t->id].reduce = rop;
    if (t && ids) t->src[t->nsrc++] = ids; /* (read by the executor: the routed rows' counts) */
    if (t && narrow) {
        pdde_tensor *c = node_add(L, PDDE_OP_CAST, t, t->ndim, t->shape, 1, &t);
        if (c) c->dtype = PDDE_F32;
        t = reshard_push(L, c, phase, device);
    }
    return t;
}

/* The steps along mesh axis a turning t (attr *cur, updated) towards want. With gather_only, just
 * the split on a is gathered (the split it wants is done by a later call). NULL on failure. */
static pdde_tensor *reshard_axis(lowering *L, pdde_tensor *t, pdde_dist_attr *cur, const pdde_dist_attr *want, int a,
                                 bool gather_only, pdde_phase phase, int device) {
    const pdde_program *P = L->P;
    int ga = program_axis(P, want->mesh, a); /* the communicator and coordinate along a */
    int have_dim = dim_on_axis(cur, t->ndim, a), want_dim = gather_only ? -1 : dim_on_axis(want, t->ndim, a);
    if (P->mesh->shape[ga] == 1) { /* one rank along a: split, partial and whole are the same data */
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
            t = reshard_collective(L, PDDE_OP_REDUCE_SCATTER, t, ga, -1, want_dim, rop, cur, phase, device);
            have_dim = want_dim;
        } else {
            t = reshard_collective(L, PDDE_OP_ALLREDUCE, t, ga, -1, -1, rop, cur, phase, device);
        }
    }
    if (t && !gather_only && want_partial && !partial && !(want->partial_avg >> a & 1)) {
        /* whole -> partial sum: the first rank along the axis keeps the value, the others zero */
        cur->partial |= (uint8_t)(1u << a);
        t = reshard_push(L, reshard_node(L, PDDE_OP_SCALE, t, ga, -1, -1, cur), phase, device);
        if (t) pdde_op_set_f32(t, PDDE_P_SCALE, P->coords[ga] == 0 ? 1.0f : 0.0f), L->P->info[t->id].axis = -1, L->P->info[t->id].bytes = 0;
    }
    if (t && have_dim >= 0 && want_dim >= 0 && have_dim != want_dim) { /* split on another dim: alltoall */
        cur->dims_mapping[have_dim] = -1, cur->dims_mapping[want_dim] = (int8_t)a;
        t = reshard_collective(L, PDDE_OP_ALLTOALL, t, ga, have_dim, want_dim, 0, cur, phase, device);
        have_dim = want_dim;
    }
    if (t && have_dim >= 0 && have_dim != want_dim) { /* split -> whole: allgather */
        cur->dims_mapping[have_dim] = -1;
        t = reshard_collective(L, PDDE_OP_ALLGATHER, t, ga, have_dim, -1, 0, cur, phase, device);
        have_dim = -1;
    }
    if (t && want_dim >= 0 && have_dim < 0) { /* whole -> split: this rank's slice */
        cur->dims_mapping[want_dim] = (int8_t)a;
        t = reshard_push(L, reshard_node(L, PDDE_OP_SLICE, t, ga, -1, want_dim, cur), phase, device);
        if (t) {
            pdde_op_set_i32(t, PDDE_P_SLICE_AXIS, want_dim), pdde_op_set_i32(t, PDDE_P_SLICE_START, (int32_t)(t->shape[want_dim] * P->coords[ga]));
            L->P->info[t->id].axis = -1, L->P->info[t->id].dim = -1, L->P->info[t->id].bytes = 0;
        }
    }
    return t;
}

/* The chain of nodes turning x, laid out as `have`, into attr want (both on want's mesh), for a
 * consumer in phase `phase`, axis by axis. A dim holds one axis' split at a time, so an axis whose
 * wanted dim is still split over another axis (the two swap dims) only gathers at first and takes its
 * new split after the others moved. */
static pdde_tensor *reshard(lowering *L, pdde_tensor *x, const pdde_dist_attr *have, const pdde_dist_attr *want, pdde_phase phase, int device) {
    pdde_dist_attr cur = *have;
    pdde_tensor *t = x;
    unsigned later = 0;
    int n_axes = want->mesh->ndim;
    for (int a = 0; a < n_axes && t; a++) {
        int want_dim = dim_on_axis(want, x->ndim, a), there = want_dim >= 0 ? cur.dims_mapping[want_dim] : -1;
        if (there >= 0 && there != a) later |= 1u << a;
        t = reshard_axis(L, t, &cur, want, a, later >> a & 1, phase, device);
    }
    for (int a = 0; a < n_axes && t; a++)
        if (later >> a & 1) t = reshard_axis(L, t, &cur, want, a, false, phase, device);
    return t;
}

/* After an update ran on a slice of a whole parameter: allgather the slices into the parameter itself
 * (the node writes the parameter's memory: src0 is the parameter, src1 the updated slice). */
static pdde_status gather_into_param(lowering *L, pdde_tensor *update, pdde_tensor *param) {
    const pdde_dist_attr *want = required(L, update, 0);
    int axis = -1, dim = -1;
    for (int d = 0; d < param->ndim; d++)
        if (want->dims_mapping[d] >= 0 && param->dist.dims_mapping[d] != want->dims_mapping[d]) {
            if (axis >= 0) {
                /* split over a second axis too (ZeRO over two mesh axes): the slices of the first
                 * gathered into a buffer first, the second gathers that into the parameter */
                pdde_dist_attr part = *want;
                part.dims_mapping[dim] = -1;
                pdde_tensor *g = reshard_push(L, reshard_node(L, PDDE_OP_ALLGATHER, update, axis, dim, -1, &part), update->phase, update->device);
                if (!g) return lower_oom(L);
                update = g;
            }
            axis = program_axis(L->P, want->mesh, want->dims_mapping[d]), dim = d;
        }
    if (axis < 0) return PDDE_OK;
    pdde_tensor *src[2] = {param, update};
    pdde_tensor *t = node_add(L, PDDE_OP_ALLGATHER, param, param->ndim, param->shape, 2, src);
    if (!t || order_push(L->P, t)) return lower_oom(L);
    t->phase = update->phase, t->device = update->device;
    t->dist = param->dist;
    t->flags |= PDDE_TENSOR_INPLACE;
    pdde_program_node *in = &L->P->info[t->id];
    in->axis = axis, in->dim = dim, in->write_back = true, in->bytes = pdde_tensor_nbytes(update);
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
 * their copies serve one phase. A parameter's forward copy serves backward too, except a gathered one
 * (ZeRO-3, lower_regather_on): that is freed after its last forward reader and gathered again for
 * backward, so the whole parameters are not all held from forward to backward. */
static bool cache_reusable(const pdde_tensor *x, pdde_phase made, pdde_phase now) {
    if (x->op != PDDE_OP_NONE || made == now) return true;
    return !(x->flags & (PDDE_TENSOR_STATE | PDDE_TENSOR_GRAD)) && made != PDDE_PHASE_OPTIMIZER && now != PDDE_PHASE_OPTIMIZER;
}

/* ZeRO-3's regathering, on unless PDDE_ZERO3_REGATHER=0 (which keeps each gathered parameter from its
 * forward to its backward: one gather a micro-batch instead of two, at the memory of every layer's
 * whole parameters; cheaper where they are small). Lowering, the memory plan and the cost model read it
 * here, so they agree. */
PDDE_PRIVATE bool lower_regather_on(void) {
    return pdde_env_bool("PDDE_ZERO3_REGATHER", 1);
}

/* Whether x is a parameter's value (the parameter, or its copy onto a device or its cast, as forward
 * reads them) and node, made of x for a requirement, gathered it over a mesh axis. */
static bool gathered_param(const pdde_tensor *x, const pdde_tensor *node) {
    const pdde_tensor *v = x;
    while ((v->op == PDDE_OP_COPY || v->op == PDDE_OP_CAST) && v->nsrc == 1) v = v->src[0];
    if (v->op != PDDE_OP_NONE || !(v->flags & PDDE_TENSOR_PARAM)) return false;
    for (const pdde_tensor *t = node; t && t != x && t->nsrc > 0; t = t->src[0])
        if (t->op == PDDE_OP_ALLGATHER) return true;
    return false;
}

static pdde_tensor *cache_find(const lowering *L, const pdde_tensor *x, const pdde_dist_attr *want, pdde_phase phase) {
    for (int i = x->id < L->n_first ? L->first_done[x->id] : -1; i >= 0; i = L->done[i].next) {
        const reshard_done *d = &L->done[i];
        if (!attr_equal(&d->want, want) || !cache_reusable(x, d->phase, phase)) continue;
        /* (a parameter sent to another stage is not: the receiver sees no gather and keeps its copy, so
         * a second send would have no receive) */
        if (L->regather && d->phase == PDDE_PHASE_FORWARD && phase == PDDE_PHASE_BACKWARD && d->node->op != PDDE_OP_SEND &&
            gathered_param(x, d->node))
            continue;
        return d->node;
    }
    return NULL;
}

static pdde_status cache_add(lowering *L, pdde_tensor *x, const pdde_dist_attr *want, pdde_phase phase, pdde_tensor *node) {
    if (L->n_done == L->cap_done) {
        int cap = L->cap_done ? 2 * L->cap_done : 64;
        reshard_done *items = realloc(L->done, (size_t)cap * sizeof *items);
        if (!items) return lower_oom(L);
        L->done = items, L->cap_done = cap;
    }
    L->done[L->n_done] = (reshard_done){x, node, *want, phase, L->first_done[x->id]};
    L->first_done[x->id] = L->n_done++;
    return PDDE_OK;
}

/* Tensors crossing pipeline stages: a producer on one mesh, a consumer on another of the same shape.
 * The rank at each place of the producer's mesh sends to the rank at the same place of the consumer's,
 * the tensor resharded first (on the producer's mesh) to the mapping the consumer requires. Each
 * (tensor, requirement) crosses once per micro-batch (the reshard cache). */
static pdde_tensor *cross_stages(lowering *L, pdde_tensor *consumer, int k, const pdde_dist_attr *want, pdde_status *st) {
    pdde_program *P = L->P;
    pdde_tensor *x = consumer->src[k], *node = cache_find(L, x, want, consumer->phase);
    if (node) return node;
    const pdde_mesh *from = x->dist.mesh, *to = want->mesh;
    bool same_shape = from->ndim == to->ndim;
    for (int a = 0; same_shape && a < to->ndim; a++) same_shape = from->shape[a] == to->shape[a];
    if (!same_shape) {
        *st = pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: %s reads %s from a mesh of another shape (send/recv pairs ranks of equal-shaped meshes)",
                         consumer->name, x->name);
        return NULL;
    }
    int here_from = rank_in(L, from), here_to = rank_in(L, to);
    if (here_from >= 0 && here_to >= 0) {
        *st = pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: %s moves between two meshes that share rank %d (pipeline stages must not overlap)",
                         x->name, P->rank);
        return NULL;
    }
    /* (the consumer is a user's node: its id is the same on every rank) */
    int tag = (P->info[consumer->id].user * PDDE_MAX_SRC + k) & 0xfffff, peer;
    if (here_from >= 0) { /* producer side: reshard here to the consumer's mapping, then send */
        pdde_dist_attr there = *want;
        there.mesh = from;
        pdde_tensor *r = dist_same(&x->dist, &there, x->ndim) ? x : reshard(L, x, &x->dist, &there, consumer->phase, consumer->device);
        node = r ? node_add(L, PDDE_OP_SEND, r, r->ndim, r->shape, 1, &r) : NULL;
        if (node) node->dist = there, node->flags |= PDDE_TENSOR_VIEW, node->device = consumer->device;
        peer = to->ranks[here_from];
    } else { /* consumer side: receive the block this rank needs */
        int64_t shape[PDDE_MAX_DIMS];
        local_shape_of(L->gshape[x->id], x->ndim, want, shape);
        node = node_add(L, PDDE_OP_RECV, x, x->ndim, shape, 0, NULL);
        if (node) node->dist = *want, node->device = consumer->device;
        peer = from->ranks[here_to];
    }
    if (node) {
        node->phase = consumer->phase, node->flags &= ~(uint32_t)(PDDE_TENSOR_LOSS | PDDE_TENSOR_OUTPUT);
        P->info[node->id].peer = peer, P->info[node->id].tag = tag, P->info[node->id].bytes = pdde_tensor_nbytes(node);
    }
    if (!node || order_push(P, node)) {
        *st = lower_oom(L);
        return NULL;
    }
    *st = cache_add(L, x, want, consumer->phase, node);
    return *st ? NULL : node;
}

/* What input k of node needs (on this rank, which runs node): x as it is, resharded, seen on a slice
 * of its mesh, or received from another stage. NULL with *st set on failure. */
static pdde_tensor *lower_input(lowering *L, pdde_tensor *node, int k, pdde_status *st) {
    const pdde_dist_attr *want = required(L, node, k);
    pdde_tensor *x = node->src[k];
    if (!want || !want->mesh || !x->dist.mesh || attr_equal(&x->dist, want)) return x;
    pdde_tensor *done = cache_find(L, x, want, node->phase);
    if (done) return done;
    pdde_dist_attr have = x->dist;
    if (!mesh_same(x->dist.mesh, want->mesh)) {
        int p = sub_axis(L, x->dist.mesh, want->mesh);
        if (p < 0) return cross_stages(L, node, k, want, st);
        if (attr_uses_axis(&x->dist, p)) {
            *st = pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: %s reads %s, split or partial over mesh axis %s, on a slice across that axis",
                             node->name, x->name, x->dist.mesh->names[p]);
            return NULL;
        }
        have = attr_on_mesh_at(&x->dist, want->mesh, p); /* the same local data, fewer ranks */
    }
    if (dist_same(&have, want, x->ndim)) return x;
    pdde_tensor *r = reshard(L, x, &have, want, node->phase, node->device);
    *st = r ? cache_add(L, x, want, node->phase, r) : lower_oom(L);
    return *st ? NULL : r;
}

/* The gradient of a mean over dims split over a mesh axis: each rank's forward is the mean of its own
 * rows, averaged over the axis (partial with a mean marker). Where the gradient arriving carries the
 * marker (each rank's derivative of its own mean, averaged where summed over those rows) its factor
 * is the local mean's, 1 / (local count), not the graph's 1 / (global count), which would make it
 * the axis size too small. A gradient still to be averaged (partial) is true once reduced: the
 * graph's factor. */
static void lower_mean_gradient(lowering *L, pdde_tensor *t) {
    int of = t->op == PDDE_OP_EXPAND ? pdde_op_i32(t, PDDE_P_EXPAND_MEAN_OF) : 0;
    if (of < 1 || of > L->g->n || L->g->nodes[of - 1]->op != PDDE_OP_MEAN) return;
    const pdde_tensor *mean = L->g->nodes[of - 1];
    const pdde_dist_attr *x = pdde_op_input_dist_attr(L->g, mean, 0);
    int axis = pdde_op_i32(mean, PDDE_P_REDUCE_AXIS);
    const pdde_dist_attr *dy = t->nsrc > 0 && t->src[0] ? &t->src[0]->dist : NULL; /* (as this rank reads it) */
    float f = 1.0f;
    for (int d = 0; x && x->mesh && dy && d < mean->src[0]->ndim; d++) {
        int a = x->dims_mapping[d]; /* the marker, not a pending average (whose reduction gives true values) */
        if ((axis == -1 || d == axis) && a >= 0 && (dy->partial_avg >> a & 1) && !(dy->partial >> a & 1)) f *= (float)x->mesh->shape[a];
    }
    if (f != 1.0f) pdde_op_set_f32(t, PDDE_P_SCALE, pdde_op_f32(t, PDDE_P_SCALE) * f);
}

/* Vocab-parallel ops (Megatron's; Paddle's c_embedding and c_softmax_with_cross_entropy, chosen from
 * the dist attrs as a DistributedOperatorImpl is): where completion left the vocab dim of an
 * embedding table, of its gradient or of the logits split over a mesh axis, the plain kernel would
 * take the local block for the whole vocab. The node gets its distributed form: the op params
 * PDDE_P_VOCAB_FIRST (the first vocab id this rank holds) and PDDE_P_VOCAB_SIZE (the whole vocab), and
 * the mesh axis in vocab_axis (whose group the cross-entropy reduces its rows on). The embeddings stay
 * the device's kernels (ids outside the range: zero rows, or skipped); the executor runs the
 * cross-entropy. An axis of size 1 leaves the whole vocab here: nothing to do. */
static pdde_status lower_vocab_parallel(lowering *L, pdde_tensor *t) {
    const pdde_dist_attr *a;
    int dim;
    int64_t local;
    switch (t->op) {
    case PDDE_OP_EMBEDDING: a = required(L, t, 0), dim = 0, local = t->src[0]->shape[0]; break;
    case PDDE_OP_EMBEDDING_BACK: a = &t->dist, dim = 0, local = t->shape[0]; break;
    case PDDE_OP_CROSS_ENTROPY: case PDDE_OP_CROSS_ENTROPY_BACK: a = required(L, t, 0), dim = 1, local = t->src[0]->shape[1]; break;
    default: return PDDE_OK;
    }
    if (!a || !a->mesh || a->dims_mapping[dim] < 0) return PDDE_OK;
    const pdde_program *P = L->P;
    int axis = program_axis(P, a->mesh, a->dims_mapping[dim]), n = P->mesh->shape[axis];
    if (n == 1) return PDDE_OK;
    if (local * n > INT32_MAX)
        return pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: %s: a vocab of %lld split over mesh axis %s exceeds int32 ids",
                          t->name, (long long)(local * n), P->mesh->names[axis]);
    pdde_op_set_i32(t, PDDE_P_VOCAB_FIRST, (int32_t)(local * P->coords[axis]));
    pdde_op_set_i32(t, PDDE_P_VOCAB_SIZE, (int32_t)(local * n));
    L->P->info[t->id].vocab_axis = axis;
    return PDDE_OK;
}

/* Data parallelism's overlap, from the attributes: a gradient accumulator holding a pending reduction
 * (partial over dp) is reduced where the update requires it, in the optimizer phase. That collective
 * is started instead right after the accumulator's last grad_accum in backward (in the step's last
 * micro-batch), so it travels while the rest of backward runs, and a COMM_WAIT takes its place before
 * the optimizer. The early start only happens in a pass that ends with the update (the pass' early
 * flag); otherwise (backward alone, one call per micro-batch) the wait runs the reduction itself.
 * Collectives that need no packing only, on host memory or (staged by their gradient bucket) on a
 * device; the others stay where they are. */
static pdde_status overlap_gradient_reductions(lowering *L) {
    pdde_program *P = L->P;
    if (!L->p->overlap_gradients) return PDDE_OK;
    int n = P->n;
    pdde_tensor **last_write = calloc((size_t)n + 1, sizeof *last_write); /* by accumulator: its last grad_accum so far */
    pdde_tensor **wait_of = calloc((size_t)n + 1, sizeof *wait_of);       /* by moved collective: its wait */
    pdde_tensor **moved = calloc(2 * (size_t)n + 1, sizeof *moved);       /* by grad_accum: the collectives moved after it,
                                                                             chained by collective in moved[n + id] */
    pdde_tensor **order = malloc((2 * (size_t)P->n_order + 1) * sizeof *order); /* (each moved collective adds its wait) */
    pdde_status st = last_write && wait_of && moved && order ? PDDE_OK : lower_oom(L);
    int n_old = P->n_order;
    for (int i = 0; i < n_old && !st; i++) {
        pdde_tensor *c = P->order[i], *acc = c->src[0];
        if (c->op == PDDE_OP_GRAD_ACCUM) last_write[acc->id] = c;
        pdde_program_node *in = &P->info[c->id];
        bool reduction = in->axis >= 0 && !in->write_back && c->phase == PDDE_PHASE_OPTIMIZER && c->nsrc == 1 &&
                         (c->op == PDDE_OP_ALLREDUCE || (c->op == PDDE_OP_REDUCE_SCATTER && in->dim == 0));
        /* (on a device: only where buckets stage it, on its accumulator's device) */
        if (!reduction || acc->op != PDDE_OP_NONE || !(acc->flags & PDDE_TENSOR_GRAD) || !last_write[acc->id] ||
            (!registry_device_is_host(L->ctx->registry, c->device) && (L->p->gradient_bucket_bytes < 0 || acc->device != c->device)))
            continue;
        /* (the second step of a reduction over two axes: a ZeRO shard reduced again over ep, or a tied weight's over
         * pp. Its accumulator is written from a reduce-scatter whose bucket completes later than its place, with overlap;
         * started here it would read the accumulator before that write) */
        const pdde_tensor *added = last_write[acc->id]->src[1];
        if (added && (added->op == PDDE_OP_REDUCE_SCATTER || added->op == PDDE_OP_ALLREDUCE)) continue;
        pdde_tensor *w = node_add(L, PDDE_OP_COMM_WAIT, c, c->ndim, c->shape, 1, &c);
        if (!w) { st = lower_oom(L); break; }
        w->phase = PDDE_PHASE_OPTIMIZER, w->flags |= PDDE_TENSOR_VIEW, w->dist = c->dist;
        /* (a later one goes first: each is moved to just after the write, as it comes) */
        wait_of[c->id] = w, moved[n + c->id] = moved[last_write[acc->id]->id], moved[last_write[acc->id]->id] = c;
    }
    /* the collective moves up to just after the last write, and its wait takes its place */
    int k = 0;
    for (int i = 0; i < n_old && !st; i++) {
        pdde_tensor *t = P->order[i];
        order[k++] = t->id < n && wait_of[t->id] ? wait_of[t->id] : t;
        for (pdde_tensor *c = t->id < n ? moved[t->id] : NULL; c; c = moved[n + c->id]) {
            order[k++] = c;
            c->phase = PDDE_PHASE_BACKWARD, P->info[c->id].early = true;
            c->layer = c->src[0]->layer; /* (it runs in the pass of its accumulator's layer) */
        }
    }
    /* ...and its readers read the wait */
    for (int i = 0; i < k && !st; i++)
        for (int j = 0; order[i]->op != PDDE_OP_COMM_WAIT && j < order[i]->nsrc; j++) {
            pdde_tensor *x = order[i]->src[j];
            if (x && x->id < n && wait_of[x->id]) order[i]->src[j] = wait_of[x->id];
        }
    if (!st) free(P->order), P->order = order, P->n_order = P->cap_order = k, order = NULL;
    free(last_write), free(wait_of), free(moved), free(order);
    return st;
}

/* The nodes ordered from position `from` on that have no layer get `layer` (pipeline chunks run by
 * layer). */
static void inherit_layer(pdde_program *P, int from, int layer) {
    for (int i = from; i < P->n_order; i++)
        if (P->order[i]->layer < 0) P->order[i]->layer = layer;
}

/* A marked output still pending a sum (or a mean) over mesh axes, such as a data-parallel group's
 * part of a count: reduced right after it, so that pdde_session_read reads what one process would
 * (consumers requiring it whole read the same reduction). */
static pdde_status lower_output_whole(lowering *L, pdde_tensor *t, int user) {
    pdde_dist_attr want = t->dist;
    want.partial = want.partial_avg = 0;
    pdde_tensor *r = reshard(L, t, &t->dist, &want, t->phase, t->device);
    if (!r) return lower_oom(L);
    r->flags |= PDDE_TENSOR_OUTPUT;
    L->P->of_user[user] = r;
    return cache_add(L, t, &want, t->phase, r);
}

static pdde_status lower_partition(lowering *L) {
    const pdde_graph *g = L->g;
    pdde_program *P = L->P;
    if (!g->planner || g->planner->n_completed < g->n)
        return pdde_error(L->ctx, PDDE_ERR_STATE, "lower: SPMD execution needs pdde_complete_dist_attrs on the whole graph first");
    P->mesh = g->planner->mesh;
    if (L->p->world_size != P->mesh->n_ranks)
        return pdde_error(L->ctx, PDDE_ERR_DIST_ATTR, "lower: the mesh has %d ranks, the world %d", P->mesh->n_ranks, L->p->world_size);
    pdde_status st = pdde_mesh_coords(P->mesh, P->rank, P->coords);
    if (st) return pdde_error(L->ctx, st, "lower: rank %d is not in the graph's mesh", P->rank);
    /* the group along each mesh axis: ranks whose other coordinates agree */
    for (int a = 0; a < P->mesh->ndim; a++) {
        if (!(P->group[a] = malloc((size_t)P->mesh->shape[a] * sizeof *P->group[a]))) return lower_oom(L);
        int c[PDDE_MAX_MESH_DIMS];
        memcpy(c, P->coords, sizeof c);
        for (int i = 0; i < P->mesh->shape[a]; i++) c[a] = i, P->group[a][i] = pdde_mesh_rank_at(P->mesh, c);
    }
    /* partition: local shapes (global ones kept for the receives) */
    int n = P->n;
    if (!(L->gshape = malloc((size_t)(n + 1) * sizeof *L->gshape))) return lower_oom(L);
    L->n_gshape = n;
    for (int i = 0; i < n; i++) {
        pdde_tensor *t = P->nodes[i];
        memcpy(L->gshape[i], t->shape, sizeof t->shape);
        if (!local_shape_of(L->gshape[i], t->ndim, &t->dist, t->shape)) {
            char attr[128];
            pdde_dist_attr_str(&t->dist, attr, sizeof attr);
            return pdde_error(L->ctx, PDDE_ERR_DIST_ATTR, "lower: %s cannot be split as %s", t->name, attr);
        }
        if (P->info[i].bytes) P->info[i].bytes = pdde_tensor_nbytes(t);
    }
    /* reshard: walk the placed order, keeping this rank's nodes and inserting the conversions each op
     * needs of its inputs; where another stage's node reads a tensor of this rank's stage, the send */
    pdde_tensor **old = P->order;
    int n_old = P->n_order;
    P->order = NULL, P->n_order = P->cap_order = 0;
    L->n_first = n;
    if (!(L->first_done = malloc((size_t)(n + 1) * sizeof *L->first_done))) st = lower_oom(L);
    for (int i = 0; i < n && !st; i++) L->first_done[i] = -1;
    for (int i = 0; i < n_old && !st; i++) {
        pdde_tensor *t = old[i];
        int user = P->info[t->id].user;
        if (!on_this_rank(L, t)) {
            if (user >= 0) P->elsewhere[user] = true, P->of_user[user] = NULL;
            for (int k = 0; k < t->nsrc && !st; k++) {
                const pdde_dist_attr *want = required(L, t, k);
                int mark = P->n_order;
                if (want && t->src[k] && on_this_rank(L, t->src[k]) && !mesh_same(t->src[k]->dist.mesh, want->mesh) &&
                    sub_axis(L, t->src[k]->dist.mesh, want->mesh) < 0)
                    cross_stages(L, t, k, want, &st);
                if (t->src[k]) inherit_layer(P, mark, t->src[k]->layer); /* a send runs with the layer that produced it */
            }
            continue;
        }
        pdde_tensor *param = t->src[0], *grad = t->nsrc > 1 ? t->src[1] : NULL;
        int mark = P->n_order;
        for (int k = 0; k < t->nsrc && !st; k++) {
            pdde_tensor *r = lower_input(L, t, k, &st);
            if (r) t->src[k] = r;
        }
        inherit_layer(P, mark, t->layer); /* reshards and receives run with their consumer's layer */
        if (!st) lower_mean_gradient(L, t);
        if (!st) st = lower_vocab_parallel(L, t);
        if (!st && order_push(P, t)) st = lower_oom(L);
        if (!st && user >= 0 && (t->flags & PDDE_TENSOR_OUTPUT) && !(t->flags & PDDE_TENSOR_LOSS) && t->dist.mesh && t->dist.partial)
            st = lower_output_whole(L, t, user);
        /* a sharded update of a whole parameter (ZeRO-1/2): gather the updated shards back into it */
        if (!st && is_update(t) && t->src[0] != param)
            st = gather_into_param(L, t, param);
        /* ...and an update that read a slice of a whole gradient accumulator zeroed only the slice */
        if (!st && is_update(t) && t->src[1] != grad) {
            pdde_tensor *zero = node_add(L, PDDE_OP_SCALE, grad, grad->ndim, grad->shape, 1, &grad);
            if (!zero || order_push(P, zero)) st = lower_oom(L);
            else {
                zero->phase = t->phase, zero->device = t->device, zero->flags |= PDDE_TENSOR_INPLACE;
                pdde_op_set_f32(zero, PDDE_P_SCALE, 0.0f);
            }
        }
    }
    free(old);
    return st ? st : overlap_gradient_reductions(L);
}

/* ------------------------------------------------------------------------------------------------
 * The parameters' low-precision copies (PDDE_TENSOR_SHADOW, core/optimizer.c) stay copies that their
 * updates rewrite only where the update writes the very tensor the cast reads, whole and on the cast's
 * device: not a ZeRO shard (the parameter is gathered back after the update), not a copy made at a
 * device boundary. Elsewhere the update drops the copy and the cast runs each step as any other. */
/* Whether casts stay as autocast wrote them: only with PDDE_FOLD_CASTS=0 (to compare; the same losses). */
static bool casts_kept_on(const lowering *L, int device) {
    (void)L, (void)device;
    return !pdde_env_bool("PDDE_FOLD_CASTS", 1);
}

static pdde_status lower_shadows(lowering *L) {
    pdde_program *P = L->P;
    uint8_t *kept = calloc((size_t)P->n + 1, 1);
    if (!kept) return lower_oom(L);
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *u = P->order[i], *c = is_update(u) ? update_shadow(u) : NULL;
        if (!c) continue;
        if (c->op == PDDE_OP_CAST && (c->flags & PDDE_TENSOR_SHADOW) && c->src[0] == u->src[0] && c->device == u->device && !casts_kept_on(L, c->device) &&
            c->phase == PDDE_PHASE_FORWARD && pdde_tensor_numel(c) == pdde_tensor_numel(u->src[0]))
            kept[c->id] = 1;
        else
            u->src[--u->nsrc] = NULL, pdde_op_set_i32(u, PDDE_P_UPDATE_SHADOW, 0);
    }
    for (int i = 0; i < P->n; i++)
        if (P->nodes[i] && (P->nodes[i]->flags & PDDE_TENSOR_SHADOW) && !kept[P->nodes[i]->id]) P->nodes[i]->flags &= ~(uint32_t)PDDE_TENSOR_SHADOW;
    free(kept);
    return PDDE_OK;
}

/* The graph fusions and where each is on by default: on a CUDA device in a graph that computes in bf16,
 * where a GPU run measured them faster than without and their conformance cases correct (GPT-2 124M bf16
 * on an H200, tools/bench/cuda_fusions.sh, cuda_gemm.sh and cuda_memk.sh); PDDE_FUSE_GELU measured no faster, so it
 * stays off. Elsewhere
 * (the CPU, OpenCL, Level Zero, f32 and f16 graphs) they are off until a run there measures them. */
static const struct { const char *name; bool cuda_bf16; } lower_fusions[] = {
    {"PDDE_FUSE_EPILOGUE", true}, {"PDDE_FUSE_GRAD", true}, {"PDDE_FUSE_ADD_LN", true}, {"PDDE_BF16_LOGITS", true},
    {"PDDE_BF16_GRADS", true},    {"PDDE_ATT_LOWP", true},  {"PDDE_FUSE_GELU", false}, {"PDDE_FUSE_BGRAD", true},
    {"PDDE_FUSE_CE", true},
};

PDDE_PRIVATE bool lower_fusion_on(const char *name, const char *backend, bool bf16) {
    int asked = pdde_env_bool(name, -1);
    if (asked >= 0) return asked;
    bool cuda = backend && !strcmp(backend, "cuda") && bf16;
    for (size_t i = 0; i < sizeof lower_fusions / sizeof lower_fusions[0]; i++)
        if (!strcmp(lower_fusions[i].name, name)) return cuda && lower_fusions[i].cuda_bf16;
    return false;
}

PDDE_PRIVATE bool lower_fusion_any(const char *backend, bool bf16) {
    for (size_t i = 0; i < sizeof lower_fusions / sizeof lower_fusions[0]; i++)
        if (lower_fusion_on(lower_fusions[i].name, backend, bf16)) return true;
    return false;
}

PDDE_PRIVATE bool lower_graph_bf16(const pdde_graph *g) {
    for (int i = 0; g && i < g->n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if ((t->op == PDDE_OP_MATMUL || t->op == PDDE_OP_ATTENTION) && t->nsrc > 0 && t->src[0] && t->src[0]->dtype == PDDE_BF16) return true;
    }
    return false;
}

/* A graph fusion's switch for a node on `device` (lower_fusion_on: as the lowering params say, else as the
 * device's backend runs it) */
static bool lower_switch_on(const lowering *L, const char *name, int device) {
    const char *backend = L->p->fusion_backend ? L->p->fusion_backend : registry_device_backend(L->ctx->registry, device);
    return lower_fusion_on(name, backend, L->bf16);
}

/* ...on for some device of the program's nodes (a pass looks at the nodes only then) */
static bool lower_switch_any(const lowering *L, const char *name) {
    if (L->p->fusion_backend) return lower_fusion_on(name, L->p->fusion_backend, L->bf16);
    for (int d = 0; d < L->ctx->registry->n_devices; d++)
        if (lower_switch_on(L, name, d)) return true;
    return false;
}

/* ------------------------------------------------------------------------------------------------
 * The graph fusions. Each pass finds a pattern in the order, checks that it may fold (nothing else reads
 * what goes away, nothing kept changes, one device), rewrites it, asks the device whether it runs the
 * rewritten node (supports_op) and undoes the rewrite where it does not. What they share: */

/* Nodes a fusion leaves as they are: what the user reads (outputs, the loss) and what is written in place */
enum { FUSION_KEPT = PDDE_TENSOR_OUTPUT | PDDE_TENSOR_LOSS | PDDE_TENSOR_INPLACE };

typedef struct {
    lowering *L;
    pdde_program *P; /* NULL: nothing to do (the pass's switch is off on every device) */
    int *readers;    /* how many nodes of the order read each tensor, by id */
    int *at;         /* each node's place in the order, by id (INT32_MAX: not in it) */
} fusion;

/* A fusion pass's start: F->P NULL where switch sw (NULL: none) is off on every device, else F's counts
 * made (fusion_end frees them). */
static pdde_status fusion_begin(lowering *L, const char *sw, fusion *F) {
    pdde_program *P = L->P;
    *F = (fusion){.L = L};
    if (sw && !lower_switch_any(L, sw)) return PDDE_OK;
    F->readers = calloc((size_t)P->n + 1, sizeof *F->readers), F->at = malloc(((size_t)P->n + 1) * sizeof *F->at);
    if (!F->readers || !F->at) { free(F->readers), free(F->at); return lower_oom(L); }
    for (int i = 0; i <= P->n; i++) F->at[i] = INT32_MAX;
    for (int i = 0; i < P->n_order; i++) {
        F->at[P->order[i]->id] = i;
        for (int k = 0; k < P->order[i]->nsrc; k++) /* (the view of a node's second result reads none of its values) */
            if (P->order[i]->src[k] && !pdde_is_lowp_copy_view(P->order[i])) F->readers[P->order[i]->src[k]->id]++;
    }
    F->P = P;
    return PDDE_OK;
}

static void fusion_end(fusion *F) { free(F->readers), free(F->at); }

/* Whether t's device runs t as it stands now (supports_op): a fusion asks after each rewrite */
static bool device_runs(const lowering *L, const pdde_tensor *t) { return registry_device_supports(L->ctx, L->ctx->registry, t->device, t); }

/* The producer behind t's f32 views that nothing else reads and nothing keeps (t itself where none) */
static pdde_tensor *fusion_behind_views(const fusion *F, pdde_tensor *t) {
    while (t->op == PDDE_OP_RESHAPE && (t->flags & PDDE_TENSOR_VIEW) && !(t->flags & FUSION_KEPT) && F->readers[t->id] == 1 &&
           t->dtype == PDDE_F32 && t->nsrc == 1)
        t = t->src[0];
    return t;
}

/* t becomes a view of `of`: of its values, or (beside) of the second result it writes beside them */
static void fusion_make_view(pdde_tensor *t, pdde_tensor *of, bool beside) {
    t->op = PDDE_OP_RESHAPE, t->flags |= PDDE_TENSOR_VIEW, t->src[0] = of, t->nsrc = 1;
    for (int k = 1; k < PDDE_MAX_SRC; k++) t->src[k] = NULL;
    if (beside) pdde_op_set_i32(t, PDDE_P_VIEW_BESIDE, 1);
}

/* t reads x as its last source more where its device runs it so (true); else t stays as it was */
static bool fusion_add_source(const fusion *F, pdde_tensor *t, pdde_tensor *x) {
    t->src[t->nsrc++] = x;
    if (device_runs(F->L, t)) return true;
    t->src[--t->nsrc] = NULL;
    return false;
}

/* The node at place `from` of the order moves to place `to`; those between shift by one */
static void fusion_move(fusion *F, int from, int to) {
    pdde_tensor **o = F->P->order, *t = o[from];
    int lo = from < to ? from : to, hi = from < to ? to : from;
    if (from < to) memmove(o + from, o + from + 1, (size_t)(to - from) * sizeof *o);
    else memmove(o + to + 1, o + to, (size_t)(from - to) * sizeof *o);
    o[to] = t;
    for (int j = lo; j <= hi; j++) F->at[o[j]->id] = j;
}

/* Whether y = op(m, b), with m a plain f32 matmul and b a 1-D f32 bias of m's last dim, can fold into m's
 * epilogue under switch sw: neither m nor y kept, one device, y as large as m, and b computed before m (a
 * bias that lowering derived after the matmul, as a tensor-parallel row layer's, stays apart) */
static bool lower_bias_epilogue_ok(const fusion *F, const pdde_tensor *y, const pdde_tensor *m, const pdde_tensor *b, const char *sw) {
    const uint32_t kept = FUSION_KEPT | PDDE_TENSOR_VIEW;
    return m && b && m->op == PDDE_OP_MATMUL && m->nsrc == 2 && m->dtype == PDDE_F32 && !(m->flags & kept) && !(y->flags & kept) &&
           m->device == y->device && b->device == m->device && b->dtype == PDDE_F32 && b->ndim == 1 && m->ndim >= 2 &&
           b->shape[0] == m->shape[m->ndim - 1] && pdde_tensor_numel(y) == pdde_tensor_numel(m) &&
           !(b->op != PDDE_OP_NONE && F->at[b->id] > F->at[m->id]) && lower_switch_on(F->L, sw, m->device);
}

/* ------------------------------------------------------------------------------------------------
 * A linear layer's epilogue folded into its matmul (PDDE_FUSE_EPILOGUE: on by default on CUDA in bf16, lower_fusion_on). Where an add's
 * first input is a matmul that nothing else reads and its second a 1-D f32 bias of the matmul's last dim,
 * the matmul takes the bias as a third source and adds it to every row of its result (computed in f32
 * as the add was: the same bits), and the add becomes a view of it; then a residual add of such a
 * matmul's result (x + linear(h)) folds the same way (PDDE_P_MATMUL_RESIDUAL: x, its last source, added
 * after the bias). Each is one kernel and one tensor fewer, and the GEMM of a backend with epilogues
 * (cublasLt) adds them on the way out. The backward is untouched: it reads the adds' gradients, never
 * their values. With the switch on, lower_fold_casts also folds a cast into a matmul that it is the only
 * reader of, so a linear layer whose output goes to bf16 (the packed q, k, v) writes bf16 from its GEMM.
 * Only where the matmul's device runs the fused node (supports_op). */
static void epilogue_bias(fusion *F, pdde_tensor *s) {
    pdde_tensor *m = s->nsrc == 2 ? s->src[0] : NULL, *b = s->nsrc == 2 ? s->src[1] : NULL;
    if (s->op != PDDE_OP_ADD || s->dtype != PDDE_F32 || !m || F->readers[m->id] != 1 || !lower_bias_epilogue_ok(F, s, m, b, "PDDE_FUSE_EPILOGUE"))
        return;
    if (!fusion_add_source(F, m, b)) return;
    fusion_make_view(s, m, false);
    F->readers[b->id]++; /* (now the matmul's) */
}

/* A residual add after such a linear (x + (A B + bias)): the matmul adds x too, after its bias, as the add
 * did (x computed before it; the add's other input the matmul through its views) */
static void epilogue_residual(fusion *F, pdde_tensor *s) {
    const uint32_t kept = FUSION_KEPT | PDDE_TENSOR_VIEW;
    pdde_tensor *x = NULL, *m = NULL;
    if (s->op != PDDE_OP_ADD || s->nsrc != 2 || s->dtype != PDDE_F32 || (s->flags & kept) || !lower_switch_on(F->L, "PDDE_FUSE_EPILOGUE", s->device))
        return;
    for (int k = 0; k < 2 && !m; k++) {
        pdde_tensor *v = fusion_behind_views(F, s->src[k]);
        if (v->op == PDDE_OP_MATMUL && v->dtype == PDDE_F32 && F->readers[v->id] == 1 && !pdde_op_i32(v, PDDE_P_MATMUL_RESIDUAL) &&
            v->nsrc < PDDE_MAX_SRC && !(v->flags & kept) && v->device == s->device && pdde_tensor_numel(v) == pdde_tensor_numel(s))
            m = v, x = s->src[1 - k];
    }
    if (!m || x->dtype != PDDE_F32 || x->device != m->device || pdde_tensor_numel(x) != pdde_tensor_numel(m) || x->ndim != s->ndim ||
        (x->op != PDDE_OP_NONE && F->at[x->id] > F->at[m->id]))
        return;
    pdde_tensor *v = s->src[0] == x ? s->src[1] : s->src[0];
    pdde_op_set_i32(m, PDDE_P_MATMUL_RESIDUAL, 1);
    if (!fusion_add_source(F, m, x)) {
        pdde_op_set_i32(m, PDDE_P_MATMUL_RESIDUAL, 0);
        return;
    }
    fusion_make_view(s, v, false);
    F->readers[x->id]++;
}

static pdde_status lower_fuse_epilogue(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_FUSE_EPILOGUE", &F);
    if (st || !F.P) return st;
    for (int i = 0; i < F.P->n_order; i++) epilogue_bias(&F, F.P->order[i]);
    for (int i = 0; i < F.P->n_order; i++) epilogue_residual(&F, F.P->order[i]);
    fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Weight-gradient matmuls folded into their accumulations (PDDE_FUSE_GRAD: on by default on CUDA in bf16, lower_fusion_on). Autodiff
 * adds each parameter's gradient into its accumulator (GRAD_ACCUM, in place); where that gradient is a
 * 2-D matmul (through views) that nothing else reads, the accumulation computes it: its sources become
 * the accumulator and the matmul's operands (with the matmul's transposes), acc += op(A) op(B), which a
 * backend runs as one GEMM with beta 1 (cublasLt) and otherwise as the product and the add it replaces
 * (the same bits), and the matmul leaves the order: one kernel and one gradient-sized tensor fewer a
 * weight. Only where the accumulation's device runs the fused node (supports_op). */
static void grad_into_accumulation(fusion *F, pdde_tensor *u, uint8_t *gone) {
    pdde_tensor *m = u->nsrc == 2 ? u->src[1] : NULL;
    if (u->op != PDDE_OP_GRAD_ACCUM || !m || u->ndim != 2 || u->dtype != PDDE_F32 || !lower_switch_on(F->L, "PDDE_FUSE_GRAD", u->device)) return;
    m = fusion_behind_views(F, m);
    if (m->op != PDDE_OP_MATMUL || m->nsrc != 2 || m->dtype != PDDE_F32 || m->ndim != 2 || m->src[0]->ndim != 2 || m->src[1]->ndim != 2 ||
        pdde_op_i32(m, PDDE_P_MATMUL_BGRAD) || /* (PDDE_FUSE_BGRAD's: its bias gradient's view reads it too) */
        F->readers[m->id] != 1 || (m->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) || m->device != u->device || m->shape[0] != u->shape[0] ||
        m->shape[1] != u->shape[1])
        return;
    pdde_tensor *g = u->src[1];
    u->src[1] = m->src[0], u->src[2] = m->src[1], u->nsrc = 3;
    pdde_op_set_i32(u, PDDE_P_MATMUL_TRANS_A, pdde_op_i32(m, PDDE_P_MATMUL_TRANS_A));
    pdde_op_set_i32(u, PDDE_P_MATMUL_TRANS_B, pdde_op_i32(m, PDDE_P_MATMUL_TRANS_B));
    if (!device_runs(F->L, u)) {
        u->src[1] = g, u->src[2] = NULL, u->nsrc = 2;
        pdde_op_set_i32(u, PDDE_P_MATMUL_TRANS_A, 0), pdde_op_set_i32(u, PDDE_P_MATMUL_TRANS_B, 0);
        return;
    }
    for (pdde_tensor *v = g; v != m; v = v->src[0]) gone[v->id] = 1;
    gone[m->id] = 1;
}

static pdde_status lower_fuse_grad(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_FUSE_GRAD", &F);
    if (st || !F.P) return st;
    pdde_program *P = F.P;
    uint8_t *gone = calloc((size_t)P->n + 1, 1);
    if (!gone) { fusion_end(&F); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++) grad_into_accumulation(&F, P->order[i], gone);
    int k = 0;
    for (int i = 0; i < P->n_order; i++)
        if (!gone[P->order[i]->id]) P->order[k++] = P->order[i];
    P->n_order = k;
    free(gone), fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * A linear layer's bias gradient from its weight-gradient GEMM (PDDE_FUSE_BGRAD; on by default on CUDA in bf16, lower_fusion_on). The
 * bias gradient is a sum_to of the layer's output gradient dy to [N], the weight gradient a matmul op(A) B
 * whose B [K, N] is dy (through views and, under a compute dtype, its cast). Where both read one dy, the
 * matmul also writes B's column sums beside its values (PDDE_P_MATMUL_BGRAD) and the sum_to becomes
 * their view, moved (with what reads it) to after the matmul: one read of dy fewer a layer, and a GEMM
 * with a bias-gradient epilogue (cublasLt's BGRADA) sums on the way. Under a compute dtype the sums are
 * of dy as rounded for the GEMM (as PDDE_BF16_GRADS's are). Runs before PDDE_FUSE_GRAD, which then leaves
 * these matmuls out (they have two readers). Only where the matmul's device runs the fused node. */
static pdde_tensor *bgrad_source(pdde_tensor *t, bool casts) {
    while (t->nsrc == 1 && ((t->op == PDDE_OP_RESHAPE && (t->flags & PDDE_TENSOR_VIEW) && !pdde_op_i32(t, PDDE_P_VIEW_BESIDE)) ||
                            (casts && t->op == PDDE_OP_CAST && !(t->flags & PDDE_TENSOR_SHADOW))))
        t = t->src[0];
    return t;
}

/* The weight-gradient matmul whose B is the dy that the bias gradient s (a sum_to to [N]) sums, or NULL */
static pdde_tensor *bgrad_matmul(const fusion *F, const pdde_tensor *s) {
    const uint32_t kept = FUSION_KEPT | PDDE_TENSOR_VIEW;
    pdde_tensor *dy = s->nsrc == 1 ? bgrad_source(s->src[0], false) : NULL;
    if (s->op != PDDE_OP_SUM_TO || !dy || s->dtype != PDDE_F32 || s->ndim != 1 || (s->flags & kept) || dy->dtype != PDDE_F32 ||
        !lower_switch_on(F->L, "PDDE_FUSE_BGRAD", s->device))
        return NULL;
    for (int j = 0; j < F->P->n_order; j++) {
        pdde_tensor *c = F->P->order[j], *b = c->nsrc == 2 ? c->src[1] : NULL;
        if (c->op == PDDE_OP_MATMUL && b && c->ndim == 2 && c->dtype == PDDE_F32 && !(c->flags & kept) && b->ndim == 2 && c->device == s->device &&
            !pdde_op_i32(c, PDDE_P_MATMUL_TRANS_B) && !pdde_op_i32(c, PDDE_P_MATMUL_ACT) && !pdde_op_i32(c, PDDE_P_MATMUL_RESIDUAL) &&
            !pdde_op_i32(c, PDDE_P_MATMUL_BGRAD) && c->shape[1] == s->shape[0] && b->shape[1] == s->shape[0] &&
            b->shape[0] * b->shape[1] == pdde_tensor_numel(dy) && bgrad_source(b, true) == dy)
            return c;
    }
    return NULL;
}

static pdde_status lower_fuse_bgrad(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_FUSE_BGRAD", &F);
    if (st || !F.P) return st;
    pdde_program *P = F.P;
    uint8_t *late = calloc((size_t)P->n + 1, 1);
    pdde_tensor **tail = malloc(((size_t)P->n_order + 1) * sizeof *tail);
    if (!late || !tail) { free(late), free(tail), fusion_end(&F); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *s = P->order[i], *m = bgrad_matmul(&F, s);
        if (!m) continue;
        int from = i, to = F.at[m->id];
        memset(late, 0, (size_t)P->n + 1);
        late[s->id] = 1; /* (the sum_to and what depends on it between it and the matmul go after the matmul) */
        for (int j = from + 1; j <= to; j++)
            for (int k = 0; k < P->order[j]->nsrc; k++)
                if (P->order[j]->src[k] && late[P->order[j]->src[k]->id]) late[P->order[j]->id] = 1;
        if (to > from && late[m->id]) continue;
        pdde_op_set_i32(m, PDDE_P_MATMUL_BGRAD, 1);
        if (!device_runs(L, m)) {
            pdde_op_set_i32(m, PDDE_P_MATMUL_BGRAD, 0);
            continue;
        }
        memset(s->iparams, 0, sizeof s->iparams);
        fusion_make_view(s, m, true);
        F.readers[m->id]++;
        if (to < from) continue;
        int k = from, n_tail = 0;
        for (int j = from; j <= to; j++) {
            if (late[P->order[j]->id]) tail[n_tail++] = P->order[j];
            else P->order[k++] = P->order[j];
        }
        memcpy(P->order + k, tail, (size_t)n_tail * sizeof *tail);
        for (int j = from; j <= to; j++) F.at[P->order[j]->id] = j;
        i--; /* (another node now stands at i) */
    }
    free(tail), free(late), fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * A layernorm's input gradient summed in its backward (PDDE_FUSE_ADD_LN: on by default on CUDA in bf16, lower_fusion_on). In a residual
 * network the stream x feeds a layernorm and goes on: autodiff adds the layernorm's dx to x's other
 * gradient. Where that add's inputs are a layernorm backward that nothing else reads and a gradient
 * computed before it, the layernorm backward takes the other gradient as a fourth source and adds it to
 * dx on the store (the same bits), and the add becomes a view of it.
 * Forward, a layernorm of a residual add (ln(x + r), the sum going on as the stream): the layernorm reads x
 * and r (PDDE_P_NORM_ADD_IN, r its fourth source), adds them as the add did (the same bits) and writes the
 * sum past its own output; the add becomes the view of that sum (PDDE_P_VIEW_BESIDE), moved to right after
 * the layernorm, which must come before the sum's other readers. */
static void add_ln_forward(fusion *F, int i) {
    const uint32_t kept = FUSION_KEPT | PDDE_TENSOR_VIEW;
    pdde_program *P = F->P;
    pdde_tensor *l = P->order[i], *s = l->nsrc == 3 ? l->src[0] : NULL;
    if (l->op != PDDE_OP_LAYERNORM || !s || s->op != PDDE_OP_ADD || s->nsrc != 2 || s->dtype != PDDE_F32 || (s->flags & kept) ||
        (l->flags & kept) || s->device != l->device || pdde_op_i32(l, PDDE_P_NORM_ADD_IN) || F->at[s->id] > i ||
        !lower_switch_on(F->L, "PDDE_FUSE_ADD_LN", l->device))
        return;
    bool ok = true;
    for (int k = 0; k < 2 && ok; k++)
        ok = s->src[k]->dtype == PDDE_F32 && s->src[k]->device == l->device && pdde_tensor_numel(s->src[k]) == pdde_tensor_numel(s);
    for (int j = F->at[s->id] + 1; j <= i && ok; j++) /* (nothing between the add and the layernorm reads the sum) */
        for (int k = 0; k < P->order[j]->nsrc && ok; k++) ok = P->order[j] == l || P->order[j]->src[k] != s;
    if (!ok) return;
    l->src[0] = s->src[0], l->src[3] = s->src[1], l->nsrc = 4;
    pdde_op_set_i32(l, PDDE_P_NORM_ADD_IN, 1);
    if (!device_runs(F->L, l)) {
        l->src[0] = s, l->src[3] = NULL, l->nsrc = 3;
        pdde_op_set_i32(l, PDDE_P_NORM_ADD_IN, 0);
        return;
    }
    fusion_make_view(s, l, true);
    fusion_move(F, F->at[s->id], i); /* the add (now the view) to right after the layernorm */
}

/* s = dx + r, dx a layernorm backward's that nothing else reads and r computed before it: the layernorm
 * backward adds r on its store, s its view */
static void add_ln_backward(fusion *F, pdde_tensor *s) {
    const uint32_t kept = FUSION_KEPT | PDDE_TENSOR_VIEW;
    if (s->op != PDDE_OP_ADD || s->nsrc != 2 || s->dtype != PDDE_F32 || (s->flags & kept) || !lower_switch_on(F->L, "PDDE_FUSE_ADD_LN", s->device))
        return;
    for (int k = 0; k < 2; k++) {
        pdde_tensor *l = s->src[k], *r = s->src[1 - k];
        if (l->op != PDDE_OP_LAYERNORM_BACK || l->nsrc != 3 || l->dtype != PDDE_F32 || F->readers[l->id] != 1 || (l->flags & kept) ||
            l->device != s->device || r->dtype != PDDE_F32 || r->device != l->device || pdde_tensor_numel(r) != pdde_tensor_numel(l) ||
            pdde_tensor_numel(s) != pdde_tensor_numel(l) || (r->op != PDDE_OP_NONE && F->at[r->id] > F->at[l->id]))
            continue;
        if (!fusion_add_source(F, l, r)) continue;
        fusion_make_view(s, l, false);
        return;
    }
}

static pdde_status lower_fuse_add_ln(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_FUSE_ADD_LN", &F);
    if (st || !F.P) return st;
    for (int i = 0; i < F.P->n_order; i++) add_ln_forward(&F, i);
    for (int i = 0; i < F.P->n_order; i++) add_ln_backward(&F, F.P->order[i]);
    fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Logits in bf16 (PDDE_BF16_LOGITS: on by default on CUDA in bf16, lower_fusion_on). A matmul of bf16 / f16 operands whose only readers
 * are cross-entropies (forward and backward, their logits) writes its operands' dtype: the GEMM rounds
 * each logit once and the loss kernels read half the bytes, as torch.autocast's logits are. Unlike the
 * folds above this changes numbers (the loss of rounded logits: about 2^-9 relative per logit). */
static pdde_status lower_lowp_logits(lowering *L) {
    pdde_program *P = L->P;
    if (!lower_switch_any(L, "PDDE_BF16_LOGITS")) return PDDE_OK;
    /* (its own counts: the readers through a second result's view too) */
    int *readers = calloc((size_t)P->n + 1, sizeof *readers), *ce = calloc((size_t)P->n + 1, sizeof *ce);
    if (!readers || !ce) { free(readers), free(ce); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++)
        for (int k = 0; k < P->order[i]->nsrc; k++) {
            pdde_tensor *c = P->order[i], *x = c->src[k];
            if (!x) continue;
            readers[x->id]++;
            ce[x->id] += k == 0 && (c->op == PDDE_OP_CROSS_ENTROPY || c->op == PDDE_OP_CROSS_ENTROPY_BACK) && !pdde_op_i32(c, PDDE_P_VOCAB_FIRST) &&
                         !pdde_op_i32(c, PDDE_P_VOCAB_SIZE) && c->device == x->device;
        }
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *m = P->order[i];
        pdde_dtype dt = m->nsrc == 2 ? m->src[0]->dtype : PDDE_F32;
        if (m->op != PDDE_OP_MATMUL || m->nsrc != 2 || m->dtype != PDDE_F32 || (dt != PDDE_BF16 && dt != PDDE_F16) ||
            (m->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) || !readers[m->id] || ce[m->id] != readers[m->id] ||
            !lower_switch_on(L, "PDDE_BF16_LOGITS", m->device))
            continue;
        m->dtype = dt;
        bool ok = device_runs(L, m);
        for (int j = i + 1; j < P->n_order && ok; j++) /* (every reader takes the low-precision logits) */
            for (int k = 0; k < P->order[j]->nsrc && ok; k++)
                if (P->order[j]->src[k] == m) ok = device_runs(L, P->order[j]);
        if (!ok) {
            m->dtype = PDDE_F32;
            continue;
        }
        if (P->info[m->id].bytes) P->info[m->id].bytes = pdde_tensor_nbytes(m);
    }
    free(readers), free(ce);
    return PDDE_OK;
}

/* A layernorm backward y (the residual stream's gradient, read in f32 on) whose cast c is the one of
 * lower_bf16_grads: y writes the rounded copy beside its values (the same bits as the cast), and the cast
 * becomes the copy's view */
static void norm_lowp_copy(fusion *F, pdde_tensor *c, pdde_tensor *y) {
    pdde_op_set_i32(y, PDDE_P_NORM_LOWP_COPY, (int32_t)c->dtype);
    if (!device_runs(F->L, y)) {
        pdde_op_set_i32(y, PDDE_P_NORM_LOWP_COPY, 0);
        return;
    }
    fusion_make_view(c, y, true);
}

/* A bias_gelu backward y whose other readers are sum_tos of it: they read its cast (at place i) instead,
 * which moves to right after y */
static void gelu_grad_sums_lowp(fusion *F, int i, pdde_tensor *y, pdde_tensor **sums) {
    pdde_program *P = F->P;
    pdde_tensor *c = P->order[i];
    if (y->op != PDDE_OP_BIAS_GELU_BACK || y->dtype != PDDE_F32 || (y->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) || y->device != c->device ||
        pdde_tensor_numel(y) != pdde_tensor_numel(c) || F->at[y->id] >= i)
        return;
    int n_sums = 0;
    for (int j = F->at[y->id] + 1; j < P->n_order; j++) /* every other reader: a sum_to of y to a suffix of c's shape */
        for (int k = 0; k < P->order[j]->nsrc; k++) {
            pdde_tensor *r = P->order[j];
            if (r->src[k] != y || r == c) continue;
            bool suffix = r->op == PDDE_OP_SUM_TO && k == 0 && r->dtype == PDDE_F32 && r->device == y->device && r->ndim <= c->ndim;
            for (int d = 1; suffix && d <= r->ndim; d++) suffix = r->shape[r->ndim - d] == c->shape[c->ndim - d];
            sums[n_sums++] = suffix ? r : NULL;
        }
    bool ok = n_sums > 0 && n_sums + 1 == F->readers[y->id];
    for (int k = 0; k < n_sums && ok; k++) ok = sums[k] != NULL;
    for (int k = 0; k < n_sums && ok; k++) {
        sums[k]->src[0] = c;
        ok = device_runs(F->L, sums[k]);
    }
    if (!ok) {
        for (int k = 0; k < n_sums; k++)
            if (sums[k]) sums[k]->src[0] = y;
        return;
    }
    fusion_move(F, i, F->at[y->id] + 1);
    F->readers[y->id] -= n_sums, F->readers[c->id] += n_sums;
}

/* ------------------------------------------------------------------------------------------------
 * Gradients kept in bf16 (PDDE_BF16_GRADS: on by default on CUDA in bf16, lower_fusion_on). A bias_gelu backward's gradient is cast to
 * bf16 for the matmuls of the linear before it and read in f32 by the bias's gradient (a sum_to). Where
 * those are its only readers, the sum_to reads the bf16 copy instead (summed in f32, as autocast's
 * linear sums the bf16 gradient for its bias), so the cast is the producer's only reader and
 * lower_fold_casts folds it in: the backward writes bf16 and the cast becomes a view. This changes
 * numbers (each bias gradient summed from rounded values: 2^-9 relative each), hence the switch. The
 * cast (which reads the producer directly) moves up to right after it, ahead of the sum_to that now
 * reads it. Only where the sum_to's device reads the bf16 input (supports_op).
 * And a layernorm backward's gradient, which goes on in f32 (the residual stream) and is cast for the
 * matmuls of the linear before it: the layernorm backward writes the rounded copy too, past its own values
 * in its memory (PDDE_P_NORM_LOWP_COPY; the same bits as the cast), and the cast becomes a view of that
 * copy (memory planning and the session place it: node_alloc_bytes, storage_offset_in_root). With
 * PDDE_FUSE_ADD_LN=1 every residual gradient is such a layernorm backward. */
static pdde_status lower_bf16_grads(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_BF16_GRADS", &F);
    if (st || !F.P) return st;
    pdde_program *P = F.P;
    pdde_tensor **sums = malloc(((size_t)P->n_order * PDDE_MAX_SRC + 1) * sizeof *sums); /* (y's other reads) */
    if (!sums) { fusion_end(&F); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *c = P->order[i], *y = c->nsrc == 1 ? c->src[0] : NULL;
        if (c->op != PDDE_OP_CAST || (c->flags & PDDE_TENSOR_SHADOW) || (c->dtype != PDDE_BF16 && c->dtype != PDDE_F16) || !y ||
            !lower_switch_on(L, "PDDE_BF16_GRADS", c->device))
            continue;
        pdde_tensor *ln = y; /* (through f32 views: PDDE_FUSE_ADD_LN leaves the add it folds as one) */
        while (ln->op == PDDE_OP_RESHAPE && (ln->flags & PDDE_TENSOR_VIEW) && ln->dtype == PDDE_F32 && ln->nsrc == 1) ln = ln->src[0];
        if (ln != y && ln->op == PDDE_OP_LAYERNORM_BACK) y = ln;
        if (y->op == PDDE_OP_LAYERNORM_BACK && y->dtype == PDDE_F32 && !(y->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) && !(c->flags & FUSION_KEPT) &&
            y->device == c->device && pdde_tensor_numel(y) == pdde_tensor_numel(c) && !pdde_op_i32(y, PDDE_P_NORM_LOWP_COPY))
            norm_lowp_copy(&F, c, y);
        else
            gelu_grad_sums_lowp(&F, i, y, sums);
    }
    free(sums), fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Attention's casts (PDDE_ATT_LOWP: on by default on CUDA in bf16, lower_fusion_on). A packed attention's output is cast to bf16 for the
 * output projection, and its backward's dqkv for the matmuls of the qkv linear; both stay read in f32
 * too (the backward reads y; the qkv bias's gradient sums dqkv). Where such a cast reads the node (through
 * views), the node writes the rounded copy beside its values (PDDE_P_ATTENTION_LOWP_COPY; the same bits
 * as the cast) and the cast becomes the copy's view: one kernel and one read of the f32 tensor fewer.
 * Only where the attention's device takes it (supports_op). */
static pdde_status lower_att_lowp(lowering *L) {
    pdde_program *P = L->P;
    if (!lower_switch_any(L, "PDDE_ATT_LOWP")) return PDDE_OK;
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *c = P->order[i], *y = c->nsrc == 1 ? c->src[0] : NULL;
        if (c->op != PDDE_OP_CAST || (c->flags & (PDDE_TENSOR_SHADOW | FUSION_KEPT)) || (c->dtype != PDDE_BF16 && c->dtype != PDDE_F16) || !y ||
            !lower_switch_on(L, "PDDE_ATT_LOWP", c->device))
            continue;
        while (y->op == PDDE_OP_RESHAPE && (y->flags & PDDE_TENSOR_VIEW) && !pdde_op_i32(y, PDDE_P_VIEW_BESIDE) && y->dtype == PDDE_F32 && y->nsrc == 1)
            y = y->src[0];
        if ((y->op != PDDE_OP_ATTENTION && y->op != PDDE_OP_ATTENTION_BACK) || pdde_op_i32(y, PDDE_P_ATTENTION_QKV_D) <= 0 || y->dtype != PDDE_F32 ||
            (y->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) || y->device != c->device || pdde_tensor_numel(y) != pdde_tensor_numel(c) ||
            pdde_op_i32(y, PDDE_P_ATTENTION_LOWP_COPY))
            continue;
        pdde_op_set_i32(y, PDDE_P_ATTENTION_LOWP_COPY, (int32_t)c->dtype);
        if (!device_runs(L, y)) {
            pdde_op_set_i32(y, PDDE_P_ATTENTION_LOWP_COPY, 0);
            continue;
        }
        fusion_make_view(c, y, true);
    }
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Casts folded into their producers. Under a compute dtype a matmul's activation input (and its output's
 * gradient) is cast to bf16; where that cast is the only reader of a layernorm's or a bias_gelu's output
 * (their backward reads their inputs, not the output) or of the logits' gradient (cross_entropy_back),
 * or of a bias_gelu backward's gradient (lower_bf16_grads leaves it so), or of an MoE grouped GEMM's or
 * dispatch's rows (a bf16 MoE: the expert outputs the combine reads, the gradients the GEMMs read),
 * the producer writes bf16 itself, computing in f32 and rounding once
 * on the store as the cast did (the same bits), and the cast becomes a view of it: one kernel and one
 * f32 tensor fewer. Only where the producer's device takes the bf16 output (supports_op). */
static pdde_status lower_fold_casts(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, NULL, &F);
    if (st) return st;
    pdde_program *P = F.P;
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *c = P->order[i], *y = c->nsrc == 1 ? c->src[0] : NULL;
        if (c->op != PDDE_OP_CAST || (c->flags & PDDE_TENSOR_SHADOW) || (c->dtype != PDDE_BF16 && c->dtype != PDDE_F16) || !y) continue;
        y = fusion_behind_views(&F, y); /* (to the producer) */
        bool vocab_split = pdde_op_i32(y, PDDE_P_VOCAB_FIRST) || pdde_op_i32(y, PDDE_P_VOCAB_SIZE); /* (the session runs those) */
        bool matmul = y->op == PDDE_OP_MATMUL && lower_switch_on(L, "PDDE_FUSE_EPILOGUE", y->device); /* (lower_fuse_epilogue) */
        bool moe = y->op == PDDE_OP_MOE_GROUPED_MATMUL || y->op == PDDE_OP_MOE_DISPATCH; /* (the rows a bf16 MoE moves next) */
        if ((y->op != PDDE_OP_LAYERNORM && y->op != PDDE_OP_BIAS_GELU && y->op != PDDE_OP_BIAS_GELU_BACK && !matmul && !moe && (y->op != PDDE_OP_CROSS_ENTROPY_BACK || vocab_split)) ||
            y->dtype != PDDE_F32 || F.readers[y->id] != 1 ||
            y->device != c->device || (y->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) || pdde_tensor_numel(y) != pdde_tensor_numel(c) ||
            casts_kept_on(L, y->device))
            continue;
        y->dtype = c->dtype;
        if (!device_runs(L, y)) {
            y->dtype = PDDE_F32;
            continue;
        }
        if (P->info[y->id].bytes) P->info[y->id].bytes = pdde_tensor_nbytes(y);
        for (pdde_tensor *v = c->src[0]; v != y; v = v->src[0]) v->dtype = c->dtype; /* (the views between) */
        fusion_make_view(c, c->src[0], false);
    }
    fusion_end(&F);
    return PDDE_OK;
}

/* The cross-entropy forward that b (its backward, at place i) differentiates: its place, or -1 */
static int ce_forward_at(const fusion *F, int i, const pdde_tensor *b) {
    for (int j = 0; j < i; j++) {
        const pdde_tensor *c = F->P->order[j];
        if (c->op == PDDE_OP_CROSS_ENTROPY && c->nsrc == 2 && c->src[0] == b->src[0] && c->src[1] == b->src[1] && c->device == b->device &&
            !pdde_op_i32(c, PDDE_P_VOCAB_FIRST) && !pdde_op_i32(c, PDDE_P_VOCAB_SIZE) && !pdde_op_i32(c, PDDE_P_CE_DLOGITS))
            return j;
    }
    return -1;
}

/* ------------------------------------------------------------------------------------------------
 * The cross-entropy's backward in its forward (PDDE_FUSE_CE; on by default on CUDA in bf16, lower_fusion_on). A
 * cross_entropy_back reads the forward's logits and targets and the loss's gradient dloss; where dloss is
 * there before the forward runs (the loss's seed: a leaf), the forward takes dloss and the backward as
 * sources 2 and 3 and writes dlogits = (softmax - onehot) * dloss / count into the backward's memory too
 * (PDDE_P_CE_DLOGITS, in the backward's dtype, so a cast folded into the backward stays folded), as llm.c's
 * fused classifier does: the logits are read once for both. The backward, marked, computes nothing and
 * moves to right before the forward (a forward node: its memory is made there and lives to its last
 * reader, as the unfused dlogits did, while the logits are free after the forward). Runs after the casts
 * are folded (the backward's dtype is final), only where the device runs the fused node. */
static pdde_status lower_fuse_ce(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_FUSE_CE", &F);
    if (st || !F.P) return st;
    pdde_program *P = F.P;
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *b = P->order[i], *dl = b->nsrc == 3 ? b->src[2] : NULL;
        if (b->op != PDDE_OP_CROSS_ENTROPY_BACK || !dl || (b->flags & (FUSION_KEPT | PDDE_TENSOR_VIEW)) || pdde_op_i32(b, PDDE_P_VOCAB_FIRST) ||
            pdde_op_i32(b, PDDE_P_VOCAB_SIZE) || pdde_op_i32(b, PDDE_P_CE_DLOGITS) || dl->dtype != PDDE_F32 || dl->device != b->device ||
            !lower_switch_on(L, "PDDE_FUSE_CE", b->device))
            continue;
        int j = ce_forward_at(&F, i, b);
        pdde_tensor *f = j >= 0 ? P->order[j] : NULL;
        if (!f || (dl->op != PDDE_OP_NONE && F.at[dl->id] > F.at[f->id])) continue;
        f->src[2] = dl, f->src[3] = b, f->nsrc = 4;
        pdde_op_set_i32(f, PDDE_P_CE_DLOGITS, 1 + (int32_t)b->dtype);
        pdde_op_set_i32(b, PDDE_P_CE_DLOGITS, 1);
        if (!device_runs(L, f) || !device_runs(L, b)) {
            f->src[2] = f->src[3] = NULL, f->nsrc = 2;
            pdde_op_set_i32(f, PDDE_P_CE_DLOGITS, 0), pdde_op_set_i32(b, PDDE_P_CE_DLOGITS, 0);
            continue;
        }
        b->phase = f->phase; /* (made with the forward: memory planning allocates it there) */
        fusion_move(&F, i, j); /* (b right before f) */
    }
    fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * GELU in the matmuls' epilogues (PDDE_FUSE_GELU=1; off by default everywhere). A linear layer's bias_gelu reads
 * the matmul before it (h, read by nothing else but the bias_gelu's backward): the matmul takes the bias
 * and writes X = h + bias (the pre-activation, in the bias_gelu's dtype) as its values and gelu(X)
 * beside them (PDDE_MATMUL_GELU: cublasLt's GELU_AUX_BIAS epilogue), the bias_gelu becomes the view of
 * that second result. In backward, the matmul that computes the bias_gelu's output gradient g (its only
 * reader the bias_gelu backward) reads X too and writes g * gelu'(X) (PDDE_MATMUL_DGELU: cublasLt's
 * DGELU), the bias_gelu backward a view of it. Both or neither (the backward needs X); two kernels and an
 * [M, N] f32 tensor fewer a layer. X is computed in f32 as the add was, so in f32 the bits are
 * unfused's; in bf16 X is stored rounded (cublasLt keeps it in the output's dtype) and the backward
 * reads it so: 2^-9 relative on gelu'. Runs after the casts are folded (the dtypes are final), only
 * where the devices run the fused nodes (supports_op). */
static void gelu_into_matmuls(fusion *F, int i) {
    const uint32_t kept = FUSION_KEPT | PDDE_TENSOR_VIEW;
    pdde_program *P = F->P;
    pdde_tensor *gl = P->order[i], *m = gl->nsrc == 2 ? gl->src[0] : NULL, *b = gl->nsrc == 2 ? gl->src[1] : NULL;
    if (gl->op != PDDE_OP_BIAS_GELU || !lower_bias_epilogue_ok(F, gl, m, b, "PDDE_FUSE_GELU")) return;
    /* m's other reader: the bias_gelu backward (x = m, bias = b), whose gradient input comes from a matmul read by nothing else */
    pdde_tensor *gb = NULL, *md = NULL;
    for (int j = i + 1; j < P->n_order && F->readers[m->id] == 2 && !gb; j++)
        if (P->order[j]->op == PDDE_OP_BIAS_GELU_BACK && P->order[j]->nsrc == 3 && P->order[j]->src[0] == m && P->order[j]->src[1] == b)
            gb = P->order[j];
    if (F->readers[m->id] != (gb ? 2 : 1) || (gb && (gb->flags & kept)) || (gb && gb->device != m->device)) return;
    if (gb) {
        md = fusion_behind_views(F, gb->src[2]);
        if (md->op != PDDE_OP_MATMUL || md->nsrc != 2 || md->dtype != PDDE_F32 || F->readers[md->id] != 1 || (md->flags & kept) ||
            md->device != m->device || pdde_tensor_numel(md) != pdde_tensor_numel(m) || md->shape[md->ndim - 1] != m->shape[m->ndim - 1])
            return;
    }
    pdde_dtype xdt = gl->dtype, gdt = gb ? gb->dtype : PDDE_F32;
    m->src[m->nsrc++] = b, m->dtype = xdt;
    pdde_op_set_i32(m, PDDE_P_MATMUL_ACT, PDDE_MATMUL_GELU);
    bool ok = device_runs(F->L, m);
    if (ok && md) {
        md->src[md->nsrc++] = m, md->dtype = gdt;
        pdde_op_set_i32(md, PDDE_P_MATMUL_ACT, PDDE_MATMUL_DGELU);
        ok = device_runs(F->L, md);
        if (!ok) md->src[--md->nsrc] = NULL, md->dtype = PDDE_F32, pdde_op_set_i32(md, PDDE_P_MATMUL_ACT, 0);
    }
    if (!ok) {
        m->src[--m->nsrc] = NULL, m->dtype = PDDE_F32;
        pdde_op_set_i32(m, PDDE_P_MATMUL_ACT, 0);
        return;
    }
    fusion_make_view(gl, m, true);
    if (gb) { /* (the views between md and gb take gb's dtype, as lower_fold_casts does) */
        for (pdde_tensor *v = gb->src[2]; v != md; v = v->src[0]) v->dtype = gdt;
        fusion_make_view(gb, gb->src[2], false);
        memset(gb->iparams, 0, sizeof gb->iparams);
    }
    F->readers[b->id]++;
}

static pdde_status lower_fuse_gelu(lowering *L) {
    fusion F;
    pdde_status st = fusion_begin(L, "PDDE_FUSE_GELU", &F);
    if (st || !F.P) return st;
    for (int i = 0; i < F.P->n_order; i++) gelu_into_matmuls(&F, i);
    fusion_end(&F);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Multi-tensor updates. The executor runs update nodes that follow one another in the order as one
 * launch (pdde_backend_iface.compute_group), so the optimizer phase is reordered to bring them
 * together: first the nodes that need no update (gradient reductions and their waits, ZeRO's slices,
 * the norm), then the updates, then what needs one (ZeRO's gathers back into the parameters, zeroing
 * a sliced gradient), each part in its old order. "Needs" follows memory (storage roots): reading
 * what such a node wrote, or writing what it read or wrote. An update that needs another stays in
 * the third part. Every rank of a stage reorders alike, so its collectives keep one order. */

enum { ROOT_READ = 1, ROOT_WRITTEN = 2 }; /* by storage root: how the nodes put after the updates use it */

/* Whether t touches memory the nodes marked in use use in a conflicting way; with mark, records t's uses. */
static bool update_conflict(pdde_tensor *t, uint8_t *use, bool mark) {
    bool clash = false;
    for (int k = 0; k < t->nsrc; k++) {
        pdde_tensor *r = storage_root(t->src[k]);
        bool written = is_update(t) ? t->src[k] != update_norm(t) : r == storage_root(t); /* (in place) */
        clash |= written ? use[r->id] != 0 : (use[r->id] & ROOT_WRITTEN) != 0;
        if (mark) use[r->id] |= written ? ROOT_WRITTEN : ROOT_READ;
    }
    pdde_tensor *out = storage_root(t);
    clash |= use[out->id] != 0;
    if (mark) use[out->id] |= ROOT_WRITTEN;
    return clash;
}

static pdde_status group_updates(lowering *L) {
    pdde_program *P = L->P;
    uint8_t *use = calloc((size_t)P->n + 1, 1), *part = malloc((size_t)P->n_order + 1);
    int *at = malloc(((size_t)P->n_order + 1) * sizeof *at), n_at = 0;
    pdde_tensor **seq = malloc(((size_t)P->n_order + 1) * sizeof *seq);
    pdde_status st = use && part && at && seq ? PDDE_OK : lower_oom(L);
    for (int i = 0; i < P->n_order && !st; i++) {
        pdde_tensor *t = P->order[i];
        if (t->phase != PDDE_PHASE_OPTIMIZER) continue;
        bool after = update_conflict(t, use, false);
        part[n_at] = after ? 2 : is_update(t) ? 1 : 0;
        if (part[n_at]) update_conflict(t, use, true); /* (an update marks what the later ones must not touch) */
        at[n_at++] = i;
    }
    int n_seq = 0;
    for (int p = 0; p < 3 && !st; p++)
        for (int k = 0; k < n_at; k++)
            if (part[k] == p) seq[n_seq++] = P->order[at[k]];
    for (int k = 0; k < n_at && !st; k++) P->order[at[k]] = seq[k];
    free(use), free(part), free(at), free(seq);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Gradient buckets (torch DDP's). The data-parallel collectives of small tensors — gradient
 * reductions (allreduce, reduce-scatter) and ZeRO's gathers of updated shards — travel in buckets:
 * consecutive ones of one op, mesh axis, reduction, dtype and timing (started early or not) share one
 * collective on a flat buffer of at most gradient_bucket_bytes of gradients (or parameters), the
 * bucket's node. Every rank of an axis lowers the same buckets, so their collectives match. A
 * reduce-scatter or allgather bucket is laid out rank-major, each member's block r at r x block +
 * its offset, so each rank's shard of the bucket is one contiguous block; only dim-0 splits (whose
 * blocks are contiguous) qualify. The bucket node copies its members' inputs in and runs the
 * collective; each member stays in the order as the copy of its result out of the bucket (it reads
 * the bucket node, which lives in the arena until its last member). An early bucket starts where
 * its last member's gradient is final, and its members move to their waits' places (the first one
 * completes it, or runs it when this pass started nothing); a bucket at the update runs where its
 * first member was (every input is final by then: gradient accumulators, and updates before the
 * gathers). */

#define GRADIENT_BUCKET_BYTES ((int64_t)25 << 20) /* torch DDP's bucket_cap_mb */

/* What a collective puts in each rank's block of its bucket (elements): an allreduce its tensor, a
 * reduce-scatter its shard of the result, a gather its updated shard. */
static int64_t bucket_share(const pdde_tensor *c) { return pdde_tensor_numel(c->op == PDDE_OP_ALLGATHER ? c->src[1] : c); }

/* A data-parallel collective: a gradient accumulator's reduction (once a step), the gather of an
 * updated shard back into its parameter (ZeRO), or (ZeRO-2/3, equal shares) a micro-batch's
 * reduce-scatter of a gradient into its split accumulator (accum_only: every reader of it is the
 * grad_accum into that accumulator). */
static bool data_parallel_collective(lowering *L, const pdde_tensor *c, const bool *accum_only) {
    const pdde_program *P = L->P;
    const pdde_program_node *in = &P->info[c->id];
    if (!is_collective(c->op) || in->axis < 0) return false;
    if (c->op == PDDE_OP_ALLGATHER) return in->write_back && c->phase == PDDE_PHASE_OPTIMIZER;
    const pdde_tensor *acc = c->src[0];
    if (c->nsrc == 1 && c->op == PDDE_OP_REDUCE_SCATTER && c->phase == PDDE_PHASE_BACKWARD && !in->early && accum_only[c->id])
        return !(L->g->planner && L->g->planner->shares); /* (uneven shares' phantom micro-batches run each alone) */
    return c->nsrc == 1 && (c->op == PDDE_OP_ALLREDUCE || c->op == PDDE_OP_REDUCE_SCATTER) && (in->early || c->phase == PDDE_PHASE_OPTIMIZER) &&
           acc->op == PDDE_OP_NONE && (acc->flags & PDDE_TENSOR_GRAD);
}

/* A bucket of a micro-batch's reduce-scatters (ZeRO-2/3): in backward, not started early. */
static bool micro_bucket(const pdde_program *P, const pdde_tensor *b) { return b->phase == PDDE_PHASE_BACKWARD && !P->info[b->id].early; }

/* ...that a bucket may carry: split (if at all) on dim 0, what it sends on its own device (host
 * memory, or a device's: its bucket is then host memory the members' data is read into). */
static bool bucket_candidate(lowering *L, const pdde_tensor *c) {
    const pdde_tensor *x = c->src[c->nsrc - 1]; /* (what it sends) */
    return L->P->info[c->id].dim <= 0 && x->device == c->device;
}

/* A collective on device memory: it goes through a host bucket (one of its own when alone), which
 * stages it; with buckets off (cap < 0), alone and at the update, through the session's staging. */
static bool on_device(lowering *L, const pdde_tensor *c) { return !registry_device_is_host(L->ctx->registry, c->device); }

/* Whether c may join the bucket whose first member is f. */
static bool bucket_same_kind(const pdde_program *P, const pdde_tensor *f, const pdde_tensor *c) {
    const pdde_program_node *a = &P->info[f->id], *b = &P->info[c->id];
    return f->op == c->op && f->dtype == c->dtype && f->device == c->device && a->axis == b->axis && a->reduce == b->reduce && a->early == b->early &&
           f->phase == c->phase;
}

typedef struct { pdde_tensor *first, *last; int n, at; int64_t elems; } bucket_fill;

/* Closes a bucket being filled: its node, or (one member) none. */
static pdde_status bucket_close(lowering *L, bucket_fill *b) {
    pdde_program *P = L->P;
    pdde_tensor *f = b->first;
    if (b->n < 2 && !(f && on_device(L, f))) {
        if (f) P->info[f->id].bucket_next = NULL, P->info[f->id].bucket_offset = 0;
        *b = (bucket_fill){0};
        return PDDE_OK;
    }
    int axis = P->info[f->id].axis, n = P->mesh->shape[axis];
    int64_t S = b->elems, total = f->op == PDDE_OP_ALLREDUCE ? S : (int64_t)(n + 1) * S; /* (a reduce-scatter's or gather's result after its input) */
    pdde_tensor *B = node_new(P, NULL, f->op, f->dtype, 1, &total, 0, NULL);
    if (!B) return lower_oom(L);
    pdde_program_node *bi = &P->info[B->id], *fi = &P->info[f->id];
    snprintf(B->name, sizeof B->name, "bucket.%d", B->id);
    for (int d = 0; d < PDDE_MAX_DIMS; d++) B->dist.dims_mapping[d] = -1;
    bool backward = fi->early || f->phase == PDDE_PHASE_BACKWARD; /* (started early, or a micro-batch's) */
    B->device = on_device(L, f) ? 0 : f->device, B->phase = backward ? PDDE_PHASE_BACKWARD : PDDE_PHASE_OPTIMIZER, B->layer = backward ? b->last->layer : -1;
    bi->axis = axis, bi->dim = 0, bi->reduce = fi->reduce, bi->early = fi->early, bi->data_parallel = true;
    bi->bytes = (size_t)(f->op == PDDE_OP_REDUCE_SCATTER ? (int64_t)n * S : S) * pdde_dtype_size(f->dtype);
    bi->bucket_members = b->n, bi->bucket_block = S, bi->bucket_next = f, bi->own_buffer = on_device(L, f);
    for (pdde_tensor *m = f; m; m = P->info[m->id].bucket_next) {
        P->info[m->id].bucket = B;
        m->src[m->nsrc++] = B;
    }
    *b = (bucket_fill){0};
    return PDDE_OK;
}

/* By layer: its run of consecutive layers on one mesh (an interleaved stage's chunk); *n_layers of them.
 * Unplaced layers stay in the run of the last placed one, as lower_stages has them. */
static int *layer_runs(const lowering *L, int *n_layers) {
    const struct planner_graph *pg = L->g->planner;
    *n_layers = pg ? pg->n_layer_mesh : 0;
    int *run = malloc(((size_t)*n_layers + 1) * sizeof *run);
    const pdde_mesh *last = NULL;
    for (int l = 0, r = 0; run && l < *n_layers; l++) {
        const pdde_mesh *m = pg->layer_mesh[l];
        if (m && last && !mesh_same(m, last)) r++;
        if (m) last = m;
        run[l] = r;
    }
    return run;
}
#define RUN_OF(t) ((t)->layer >= 0 && (t)->layer < n_layers ? run[(t)->layer] : -1)

/* The order with the buckets in it: an early bucket in its last member's place and each member in
 * its wait's (whose readers read the member), a bucket at the update before its first member. A
 * micro-batch's bucket starts in its last member's place and (overlap_gradients) completes one
 * bucket later: its members and then their grad_accums (deferred from their places) come after the
 * next micro-batch bucket's start, or before the optimizer (so its collective runs beside the backward
 * that follows, and the gradients live until then: about two buckets of them at once), or before the
 * first node of another run of layers (interleaved stages: each chunk's backward is a pass of its own,
 * run in the order's order of chunks, which the memory plan's lifetimes follow; a chunk's members placed
 * after the next chunk's nodes would be planned into memory of activations that chunk has yet to read);
 * without overlap, right after it. */
static pdde_status bucket_reorder(lowering *L, const int *run, int n_layers) {
    pdde_program *P = L->P;
    pdde_tensor **order = malloc(((size_t)P->n_order + (size_t)P->n + 1) * sizeof *order);
    pdde_tensor **member_of_wait = calloc((size_t)P->n + 1, sizeof *member_of_wait); /* by wait id */
    pdde_tensor **deferred = calloc((size_t)P->n + 1, sizeof *deferred); /* by node id: the micro bucket whose members it reads */
    if (!order || !member_of_wait || !deferred) { free(order), free(member_of_wait), free(deferred); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++)
        for (int j = 0; j < P->order[i]->nsrc; j++) {
            const pdde_tensor *x = P->order[i]->src[j];
            if (x && P->info[x->id].bucket && micro_bucket(P, P->info[x->id].bucket)) deferred[P->order[i]->id] = P->info[x->id].bucket;
        }
    int k = 0;
    pdde_tensor *pending = NULL; /* the micro-batch bucket started last, its members not out yet */
    for (int i = 0; i <= P->n_order; i++) {
        pdde_tensor *t = i < P->n_order ? P->order[i] : NULL;
        pdde_program_node *in = t ? &P->info[t->id] : NULL;
        if (t && deferred[t->id]) continue;
        bool start = t && in->bucket && micro_bucket(P, in->bucket) && !in->bucket_next; /* (its last member) */
        if (t && in->bucket && micro_bucket(P, in->bucket) && !start) continue;
        if (start) order[k++] = in->bucket;
        if (pending && (start || !t || t->phase == PDDE_PHASE_OPTIMIZER || !L->p->overlap_gradients ||
                        (RUN_OF(t) >= 0 && RUN_OF(pending) >= 0 && RUN_OF(t) != RUN_OF(pending)))) {
            for (pdde_tensor *m = P->info[pending->id].bucket_next; m; m = P->info[m->id].bucket_next) order[k++] = m;
            for (int j = 0; j < P->n_order; j++)
                if (deferred[P->order[j]->id] == pending) order[k++] = P->order[j];
            pending = NULL;
        }
        if (start) pending = in->bucket;
        if (!t) break;
        if (start) continue;
        pdde_tensor *m = t->op == PDDE_OP_COMM_WAIT ? t->src[0] : NULL;
        if (m && P->info[m->id].bucket) { /* an early member, copied out here */
            m->phase = t->phase, m->layer = t->layer, P->info[m->id].early = false;
            member_of_wait[t->id] = m, order[k++] = m;
            continue;
        }
        if (in->bucket && in->early) { /* started with its bucket, after the last */
            if (!in->bucket_next) order[k++] = in->bucket;
            continue;
        }
        if (in->bucket && P->info[in->bucket->id].bucket_next == t) order[k++] = in->bucket;
        order[k++] = t;
    }
    for (int i = 0; i < k; i++)
        for (int j = 0; j < order[i]->nsrc; j++)
            if (order[i]->src[j] && member_of_wait[order[i]->src[j]->id]) order[i]->src[j] = member_of_wait[order[i]->src[j]->id];
    free(P->order), free(member_of_wait), free(deferred);
    P->order = order, P->n_order = P->cap_order = k;
    return PDDE_OK;
}

static pdde_status lower_buckets(lowering *L) {
    pdde_program *P = L->P;
    if (!P->world_size) return PDDE_OK;
    int64_t cap = L->p->gradient_bucket_bytes ? L->p->gradient_bucket_bytes : GRADIENT_BUCKET_BYTES;
    int *at = malloc(((size_t)P->n + 1) * sizeof *at); /* by node id: its place in the order */
    if (!at) return lower_oom(L);
    for (int i = 0; i < P->n_order; i++) at[P->order[i]->id] = i;
    /* by node id: every reader of it is a grad_accum into a gradient accumulator (ZeRO-2/3's reduce-scatters) */
    bool *accum_only = malloc(((size_t)P->n + 1) * sizeof *accum_only);
    if (!accum_only) return free(at), lower_oom(L);
    for (int i = 0; i < P->n; i++) accum_only[i] = false;
    for (int i = 0; i < P->n_order; i++) accum_only[P->order[i]->id] = true;
    for (int i = 0; i < P->n_order; i++) {
        const pdde_tensor *t = P->order[i];
        bool accum = t->op == PDDE_OP_GRAD_ACCUM && t->nsrc == 2 && t->src[0]->op == PDDE_OP_NONE && (t->src[0]->flags & PDDE_TENSOR_GRAD);
        for (int j = 0; j < t->nsrc; j++)
            if (t->src[j] && (!accum || j != 1)) accum_only[t->src[j]->id] = false;
    }
    for (int i = 0; i < P->n_order; i++) /* (and read at all: a loss or output is read after the step) */
        if (P->order[i]->flags & (PDDE_TENSOR_LOSS | PDDE_TENSOR_OUTPUT)) accum_only[P->order[i]->id] = false;
    /* a backward bucket's members come from one run of layers, as each chunk's backward is a pass of its
     * own (a bucket spanning two would reduce one chunk's gradients of another micro-batch) */
    int n_layers, *run = layer_runs(L, &n_layers);
    if (!run) return free(at), free(accum_only), lower_oom(L);
    enum { KINDS = 8 };
    bucket_fill open[KINDS] = {{0}};
    pdde_status st = PDDE_OK;
    int n_order = P->n_order;
    for (int i = 0; i < n_order && !st; i++) {
        pdde_tensor *c = P->order[i];
        if (!data_parallel_collective(L, c, accum_only)) continue;
        P->info[c->id].data_parallel = true;
        if (on_device(L, c)) P->device_collective_axes |= 1u << P->info[c->id].axis;
        if (!bucket_candidate(L, c)) continue;
        int n = P->mesh->shape[P->info[c->id].axis];
        int64_t share = bucket_share(c), esz = (int64_t)pdde_dtype_size(c->dtype), per_elem = c->op == PDDE_OP_ALLREDUCE ? esz : n * esz;
        if (cap < 0) continue;
        if (share * per_elem >= cap) { /* alone: on a device, in a bucket of its own (its host buffer) */
            if (on_device(L, c)) {
                bucket_fill one = {c, c, 1, i, share};
                P->info[c->id].bucket_offset = 0, P->info[c->id].bucket_next = NULL;
                st = bucket_close(L, &one);
            }
            continue;
        }
        bucket_fill *b = NULL;
        for (int k = 0; k < KINDS && !b; k++)
            if (open[k].first && bucket_same_kind(P, open[k].first, c) &&
                (c->phase != PDDE_PHASE_BACKWARD || RUN_OF(open[k].first) == RUN_OF(c)))
                b = &open[k];
        /* full, or (at the update) a gather whose update comes after the bucket's place */
        if (b && ((b->elems + share) * per_elem > cap || (c->op == PDDE_OP_ALLGATHER && at[c->src[1]->id] > b->at))) st = bucket_close(L, b);
        for (int k = 0; k < KINDS && !b; k++)
            if (!open[k].first) b = &open[k];
        if (!b) st = bucket_close(L, b = &open[0]); /* (more kinds at once than slots: the first slot's closes) */
        if (st) break;
        if (!b->first) b->first = c, b->at = i;
        else P->info[b->last->id].bucket_next = c;
        P->info[c->id].bucket_offset = b->elems;
        b->elems += share, b->last = c, b->n++;
    }
    for (int k = 0; k < KINDS && !st; k++) st = bucket_close(L, &open[k]);
    if (!st) st = bucket_reorder(L, run, n_layers);
    free(at), free(accum_only), free(run);
    return st;
}
#undef RUN_OF

/* ------------------------------------------------------------------------------------------------
 * Stages and the schedule */

/* Micro-batches and pipeline stages: a step's micro-batch count, the stages (the distinct meshes of
 * the layers placed with pdde_graph_set_layer_mesh, in layer order), this rank's, its chunks, and how
 * many micro-batches' activations it holds at once: all of them under GPipe; under 1F1B, stage s of S
 * starts S - s micro-batches before the first backward comes back. */
static pdde_status lower_stages(lowering *L, int *chunk_of_layer) {
    const pdde_graph *g = L->g;
    pdde_program *P = L->P;
    const struct planner_graph *pg = g->planner;
    if (!P->world_size || !pg || !pg->n_layer_mesh) return PDDE_OK;
    /* the runs of consecutive layers on one mesh, in layer order: the first S runs (distinct, disjoint
     * meshes) are the stages; later runs come back to them round-robin (interleaved stages: a rank
     * holds chunks of layers far apart, Megatron's virtual pipeline) */
    const pdde_mesh *run_mesh[256];
    int n_runs = 0, stages = 0;
    P->stage = -1;
    for (int l = 0; l < pg->n_layer_mesh; l++) {
        const pdde_mesh *m = pg->layer_mesh[l];
        chunk_of_layer[l] = -1;
        if (!m) continue;
        if (!n_runs || !mesh_same(m, run_mesh[n_runs - 1])) {
            if (n_runs == 256) return pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: more than 256 runs of pipeline layers");
            int same = -1;
            for (int r = 0; r < stages; r++)
                if (mesh_same(run_mesh[r], m)) same = r;
            if (same < 0 && n_runs > stages)
                return pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: layer %d starts a new pipeline stage after the stages came back round", l);
            if (same >= 0 && same != n_runs % stages)
                return pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: layer %d comes back to stage %d out of the round-robin order", l, same);
            if (same < 0) {
                for (int r = 0; r < stages; r++)
                    if (rank_in(L, run_mesh[r]) >= 0 && rank_in(L, m) >= 0)
                        return pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: rank %d is in two pipeline stages (layer %d)", P->rank, l);
                if (rank_in(L, m) >= 0) P->stage = stages;
                stages++;
            }
            run_mesh[n_runs++] = m;
        }
        if (rank_in(L, m) >= 0) chunk_of_layer[l] = (n_runs - 1) / stages;
    }
    if (P->stage < 0 && stages > 1)
        return pdde_error(L->ctx, PDDE_ERR_DIST_ATTR, "lower: rank %d is in none of the %d pipeline stages", P->rank, stages);
    if (stages > 1 && n_runs % stages)
        return pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: %d runs of layers over %d pipeline stages: each stage needs as many", n_runs, stages);
    if (stages > 1) P->n_stages = stages, P->n_chunks = n_runs / stages;
    else P->stage = 0;
    return PDDE_OK;
}

static pdde_status pass_push(lowering *L, pdde_program_pass **list, int *n, pdde_program_pass pass) {
    pdde_program_pass *more = realloc(*list, (size_t)(*n + 1) * sizeof *more);
    if (!more) return lower_oom(L);
    *list = more;
    (*list)[(*n)++] = pass;
    return PDDE_OK;
}

/* The passes of a run of every micro-batch (training: forward, backward and the update; else the
 * forwards). One run of layers per rank — 1F1B: stage s of S runs S-s-1 forwards ahead (warm-up),
 * then one forward and one backward in turn, then the remaining backwards (F0 F1 B0 F2 B1 F3 B2 B3 on
 * the first of two stages); GPipe: every forward, then every backward. Interleaved stages (v chunks of
 * layers per rank, Megatron's virtual pipeline): the k-th forward of a rank is chunk (k / S) % v of
 * micro-batch (k / (S v)) S + k % S — S micro-batches through one chunk, then through the next — and
 * its k-th backward the same with the chunks in reverse; 1F1B runs 2 (S - s - 1) + (v - 1) S forwards
 * ahead, then one forward and one backward in turn; GPipe every forward first. Sends never block and
 * receives wait for their data, so the stages pace each other. */
static pdde_status lower_passes(lowering *L, bool training, pdde_program_pass **list, int *n) {
    const pdde_program *P = L->P;
    int S = P->n_stages, v = P->n_chunks, M = P->n_micro, total = M * v, next_f = 0, next_b = 0;
    pdde_status st = PDDE_OK;
    /* phantom micro-batches first (one stage): the last backward, which starts the early reductions,
     * is a real one on every rank */
    for (int k = 0; k < P->n_phantom && !st; k++) {
        st = pass_push(L, list, n, (pdde_program_pass){.phase = PDDE_PHASE_FORWARD, .chunk = -1, .phantom = true});
        if (!st && training) st = pass_push(L, list, n, (pdde_program_pass){.phase = PDDE_PHASE_BACKWARD, .chunk = -1, .phantom = true});
    }
    int ahead = v > 1 ? 2 * (S - P->stage - 1) + (v - 1) * S : S - P->stage - 1; /* forwards before the first backward */
    if (!training || P->schedule == PDDE_PIPELINE_GPIPE || ahead > total) ahead = total;
    while (!st && (next_f < total || (training && next_b < total))) {
        bool forward = next_f < total && (!training || (v > 1 ? next_f < ahead || next_f - ahead <= next_b : next_f - next_b <= ahead));
        int k = forward ? next_f++ : next_b++, m = v > 1 ? k / (S * v) * S + k % S : k, c = v > 1 ? k / S % v : -1;
        if (!forward && v > 1) c = v - 1 - c;
        st = pass_push(L, list, n, (pdde_program_pass){forward ? PDDE_PHASE_FORWARD : PDDE_PHASE_BACKWARD, m, c, !forward && m == M - 1, false});
    }
    /* the update in the last micro-batch's memory: where the early reductions left their results */
    if (!st && training) st = pass_push(L, list, n, (pdde_program_pass){PDDE_PHASE_OPTIMIZER, M - 1, -1, false, false});
    return st;
}

/* Uneven data parallelism: this rank's dp index runs its share of the step's micro-batches, and the
 * update scales the gradients (summed over a rank's micro-batches, averaged over the dp ranks) by
 * dp / (all micro-batches of the step), so every micro-batch weighs the same: the mean loss over
 * every sample, as one process would take it. Clipping's norm reads the same scale. */
static pdde_status lower_shares(lowering *L) {
    const struct planner_graph *pg = L->g->planner;
    pdde_program *P = L->P;
    if (!P->world_size || !P->mesh || !pg || !pg->shares) return PDDE_OK;
    int axis = program_axis(P, pg->share_mesh, pg->share_axis);
    if (axis < 0) return pdde_error(L->ctx, PDDE_ERR_DIST_ATTR, "lower: the data-parallel shares' axis is not an axis of the graph's mesh");
    int n = P->mesh->shape[axis], accum = P->n_micro, most = 0;
    P->n_micro = accum * pg->shares[P->coords[axis]];
    P->grad_scale = (float)n / ((float)accum * (float)pg->share_total);
    P->share_axis = axis;
    for (int i = 0; i < n; i++) most = pg->shares[i] > most ? pg->shares[i] : most;
    for (int i = 0; i < P->n_order && !P->n_phantom; i++) {
        const pdde_tensor *t = P->order[i];
        if (t->phase != PDDE_PHASE_OPTIMIZER && program_phantom_runs(P, t)) P->n_phantom = accum * most - P->n_micro;
    }
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *t = P->order[i];
        if (t->op == PDDE_OP_ADAMW_UPDATE || t->op == PDDE_OP_SGD_UPDATE || t->op == PDDE_OP_GRAD_NORM_SQ)
            pdde_op_set_f32(t, PDDE_P_UPDATE_GRAD_SCALE, P->grad_scale);
    }
    return PDDE_OK;
}

static pdde_status lower_schedule(lowering *L) {
    const pdde_graph *g = L->g;
    pdde_program *P = L->P;
    P->n_micro = g->has_optimizer ? g->opt.grad_accum_steps : 1;
    if (P->n_micro < 1) P->n_micro = 1;
    P->grad_scale = 1.0f / (float)P->n_micro;
    P->share_axis = -1, P->n_phantom = 0;
    pdde_status st = lower_shares(L);
    if (st) return st;
    P->n_stages = 1, P->n_chunks = 1, P->n_live = 1, P->schedule = L->p->schedule, P->loss_chunk = 0;
    if (P->schedule != PDDE_PIPELINE_1F1B && P->schedule != PDDE_PIPELINE_GPIPE)
        return pdde_error(L->ctx, PDDE_ERR_INVALID_ARG, "lower: unknown pipeline schedule %d", (int)P->schedule);
    const struct planner_graph *pg = g->planner;
    int n_layers = pg ? pg->n_layer_mesh : 0;
    int *chunk_of_layer = malloc((size_t)(n_layers + 1) * sizeof *chunk_of_layer);
    if (!chunk_of_layer) return lower_oom(L);
    st = lower_stages(L, chunk_of_layer);
    for (int i = 0; i < P->n_order && !st && P->n_stages > 1; i++) {
        pdde_tensor *t = P->order[i];
        P->info[t->id].chunk = t->layer >= 0 && t->layer < n_layers ? chunk_of_layer[t->layer] : -1;
    }
    if (!st && P->n_chunks > 1) {
        if (P->n_micro % P->n_stages)
            st = pdde_error(L->ctx, PDDE_ERR_INVALID_ARG, "lower: interleaved pipeline stages take micro-batches in groups of the "
                            "stage count: %d micro-batches over %d stages", P->n_micro, P->n_stages);
        /* every forward and backward node runs in one chunk's pass: it must belong to a placed layer */
        for (int i = 0; i < P->n_order && !st; i++) {
            const pdde_tensor *t = P->order[i];
            bool passes = t->op != PDDE_OP_NONE && t->phase != PDDE_PHASE_OPTIMIZER;
            if (passes && P->info[t->id].chunk < 0)
                st = pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: %s runs in no chunk of this rank's stage (layer %d): interleaved "
                                "stages need every forward and backward node in a placed layer", t->name, t->layer);
            if (t->flags & PDDE_TENSOR_LOSS) P->loss_chunk = P->info[t->id].chunk;
        }
        P->n_live = P->n_micro; /* (micro-batches of a group overlap across chunks) */
    } else if (!st && P->n_stages > 1) {
        int ahead = P->n_stages - P->stage;
        P->n_live = P->schedule == PDDE_PIPELINE_GPIPE || ahead > P->n_micro ? P->n_micro : ahead;
    }
    free(chunk_of_layer);
    if (!st && P->n_phantom && P->n_stages > 1) /* (a phantom pass would reuse memory a real one still holds) */
        st = pdde_error(L->ctx, PDDE_ERR_UNSUPPORTED, "lower: uneven data-parallel shares with collectives over %s in every "
                        "micro-batch (ZeRO-2/3) need one pipeline stage, not %d: use ZeRO 0 or 1, or equal shares",
                        P->mesh->names[P->share_axis], P->n_stages);
    if (!st && P->n_micro + P->n_phantom > 1) st = lower_passes(L, true, &P->step, &P->n_step);
    if (!st && P->n_micro + P->n_phantom > 1) st = lower_passes(L, false, &P->forward, &P->n_forward);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * ZeRO-3's prefetch (FSDP's forward and backward prefetch, depth 1). Each pass runs its layers in turn
 * (forward in layer order, backward in reverse); a parameter's gather for a layer's first reader is
 * started instead in the layer that runs before it in the same pass, so it travels while that layer
 * computes, and a COMM_WAIT takes its place (its readers read the wait). A gather started early holds
 * its result from its start to its place: the bytes in flight so, at any place, stay within the
 * largest layer's gathered parameters of a pass (prefetch_budget), so the memory plan's peak grows by
 * at most that much. Gathers take their starts in order: each the earliest in the layer before its own
 * that keeps every place up to its own within the budget, so a layer's gathers start as the layer
 * before it reaches its own (waits them out of flight), about a layer ahead of their readers. A gather
 * with no work left between that start and its place stays blocking. Not the first layer's gathers of a
 * pass, not across interleaved chunks (another pass), never before what they read; every rank of an
 * axis lowers the same order, so the collectives stay matched. Uneven shares' phantom micro-batches
 * (which run a pass' collectives alone) keep the gathers blocking. A gather on device memory goes
 * through host memory (the transport's): its start reads the shard out and starts the collective into
 * host memory, its wait writes the result into the device; each such gather has a region of the
 * program's prefetch staging (prefetch_staging_bytes), shared with gathers whose start comes after its
 * wait, so the staging holds about a layer's gathers. A parameter split over two mesh axes (ZeRO-3 of
 * an expert-parallel model: data axis and expert axis) is gathered in two steps, the second gathering
 * the first's result; both are prefetched: the first starts as a single gather would, its wait comes
 * halfway through the compute before the reader (so each step travels behind some), the second starts
 * right after that wait and waits at its place. The budget and what is held ahead count the first's
 * result (the intermediate buffer, alive until the second completes) as well as the second's. */

/* ZeRO-3's prefetch, on unless PDDE_ZERO3_PREFETCH=0. */
static bool lower_prefetch_on(void) { return pdde_env_bool("PDDE_ZERO3_PREFETCH", -1) != 0; }

/* Whether lowering prefetches a ZeRO-3 gather whose shard and result are on host memory (host_memory)
 * or on a device of `backend`. On host memory only where the host's ranks leave it a core (!host_busy):
 * the transfer is copied by the cores that compute, so on busy ones a prefetch hides nothing and its
 * background progress takes their time (dp 2 on 2 cores, a thread a rank: 22.4 ms a step prefetched,
 * 19.1 blocking). On device memory OpenCL's by default (verified on PoCL); CUDA's and Level Zero's
 * stay blocking until a GPU run measures them. PDDE_ZERO3_PREFETCH=1 prefetches every gather, =0 none.
 * Lowering decides by it, the search's estimate prices the gathers by it. */
PDDE_PRIVATE bool lower_prefetch_gathers(bool host_memory, bool host_busy, const char *backend) {
    if (!lower_prefetch_on()) return false;
    return (host_memory && !host_busy) || pdde_env_bool("PDDE_ZERO3_PREFETCH", -1) == 1 || (backend && !strcmp(backend, "opencl"));
}

/* The same on a cluster device of `backend` as the cost model runs it: "cpu" or none on host memory, whose
 * cores its CPU ranks take all of (busy). The search, the MoE estimate and the simulated programs decide by it. */
PDDE_PRIVATE bool lower_prefetch_on_backend(const char *backend) {
    bool host = !backend || !backend[0] || !strcmp(backend, "cpu");
    return lower_prefetch_gathers(host, true, backend);
}

/* Work a prefetched gather can travel behind: a node that computes (not a leaf, a view, a wait or
 * another gather). */
static bool prefetch_overlaps(const pdde_tensor *t) {
    return t->op != PDDE_OP_NONE && t->op != PDDE_OP_COMM_WAIT && t->op != PDDE_OP_ALLGATHER && !(t->flags & PDDE_TENSOR_VIEW);
}

/* The host bytes a prefetched gather goes through: its shard's, where that is on a device, and its
 * result's, where that is (rounded up, so regions stay aligned). */
static size_t prefetch_staging_need(const pdde_context *ctx, const pdde_tensor *c) {
    size_t need = (registry_device_is_host(ctx->registry, c->src[0]->device) ? 0 : pdde_tensor_nbytes(c->src[0])) +
                  (registry_device_is_host(ctx->registry, c->device) ? 0 : pdde_tensor_nbytes(c));
    return (need + 63) & ~(size_t)63;
}

/* Places each prefetched gather's staging region: a block alive from its start to its wait, so that
 * a region is reused only by a gather that starts after the wait (arena_greedy, as the arenas). */
static pdde_status prefetch_staging_place(lowering *L, pdde_tensor *const *wait_of, int n_nodes) {
    pdde_program *P = L->P;
    int n = 0;
    int *place = malloc(((size_t)P->n + 1) * sizeof *place); /* by node id (the waits' too): its place in the order */
    arena_item *items = malloc(((size_t)P->n_order + 1) * sizeof *items);
    if (!place || !items) { free(place), free(items); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++) place[P->order[i]->id] = i;
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *c = P->order[i];
        size_t need = c->id < n_nodes && wait_of[c->id] ? prefetch_staging_need(L->ctx, c) : 0;
        if (need) items[n++] = (arena_item){need, i, place[wait_of[c->id]->id], c->id, 0, 0};
    }
    int64_t top = arena_greedy(items, n);
    for (int k = 0; k < n && top >= 0; k++) P->info[items[k].id].staging_offset = items[k].offset;
    if (top > 0 && (size_t)top > P->prefetch_staging_bytes) P->prefetch_staging_bytes = (size_t)top;
    free(place), free(items);
    return top < 0 ? lower_oom(L) : PDDE_OK;
}

/* A ZeRO-3 gather of a parameter's value for a forward or backward reader (not a gather of updated
 * shards, a bucket or an early reduction). */
static bool param_gather(const lowering *L, const pdde_tensor *c) {
    const pdde_program_node *in = &L->P->info[c->id];
    return c->op == PDDE_OP_ALLGATHER && in->axis >= 0 && !in->write_back && !in->early && !in->bucket && !in->bucket_members && c->nsrc == 1 &&
           (c->phase == PDDE_PHASE_FORWARD || c->phase == PDDE_PHASE_BACKWARD) && gathered_param(c->src[0], c);
}

/* The second step of a parameter gathered over two mesh axes: a gather of what a param_gather made. */
static bool param_gather_second(const lowering *L, const pdde_tensor *c) {
    const pdde_program_node *in = &L->P->info[c->id];
    return c->op == PDDE_OP_ALLGATHER && in->axis >= 0 && !in->write_back && !in->early && !in->bucket && !in->bucket_members && c->nsrc == 1 &&
           c->src[0]->phase == c->phase && param_gather(L, c->src[0]);
}

/* *budget: the bytes prefetched gathers may hold ahead of their places, the largest layer's gathered
 * parameters in one pass (forward or backward, per micro-batch), two-axis gathers' intermediate
 * buffers included; 0 without any. */
static pdde_status prefetch_budget(lowering *L, size_t *budget) {
    const pdde_program *P = L->P;
    int lo = INT32_MAX, hi = INT32_MIN;
    *budget = 0;
    for (int i = 0; i < P->n_order; i++) {
        int l = P->order[i]->layer;
        if (param_gather(L, P->order[i]) || param_gather_second(L, P->order[i])) lo = l < lo ? l : lo, hi = l > hi ? l : hi;
    }
    if (lo > hi) return PDDE_OK;
    size_t n_layers = (size_t)((int64_t)hi - lo + 1);
    size_t *sum = calloc(2 * n_layers, sizeof *sum); /* [backward?][layer - lo] */
    if (!sum) return lower_oom(L);
    for (int i = 0; i < P->n_order; i++) {
        const pdde_tensor *c = P->order[i];
        if (!param_gather(L, c) && !param_gather_second(L, c)) continue;
        size_t *s = &sum[(c->phase == PDDE_PHASE_BACKWARD) * n_layers + (size_t)(c->layer - lo)];
        *s += node_alloc_bytes(c);
        if (*s > *budget) *budget = *s;
    }
    free(sum);
    return PDDE_OK;
}

static pdde_status lower_zero3_prefetch(lowering *L) {
    pdde_program *P = L->P;
    /* (uneven shares: a rank with the largest share makes no phantoms, but its peers do) */
    if (!P->world_size || L->p->no_zero3_prefetch || !lower_prefetch_on() || (L->g->planner && L->g->planner->shares)) return PDDE_OK;
    int n = P->n_order, n_nodes = P->n;
    int *at = malloc(((size_t)n_nodes + 1) * sizeof *at);          /* by node id: its place in the order */
    int *to = malloc(((size_t)n + 1) * sizeof *to);                /* by place: where a moved gather starts (-1: stays) */
    int *seg_start = malloc(((size_t)n + 1) * sizeof *seg_start); /* by place: the first place of the segment before its own */
    int *wait_at = malloc(((size_t)n + 1) * sizeof *wait_at);     /* by place: where a moved gather's wait goes (its place but for
                                                                     a two-axis gather's first step: where its second starts) */
    int *waits_to = malloc(2 * ((size_t)n + 1) * sizeof *waits_to); /* by place: the first moved gather whose wait goes there, chained
                                                                     in waits_to[n + 1 + its place] */
    pdde_tensor **wait_of = calloc((size_t)n_nodes + 1, sizeof *wait_of);
    pdde_tensor **second_of = calloc((size_t)n_nodes + 1, sizeof *second_of); /* by a two-axis gather's first step: its second */
    pdde_tensor **order = malloc((2 * (size_t)n + 1) * sizeof *order);
    pdde_status st = at && to && seg_start && wait_at && waits_to && wait_of && second_of && order ? PDDE_OK : lower_oom(L);
    for (int i = 0; i <= n_nodes && !st; i++) at[i] = -1;
    for (int i = 0; i < n && !st; i++) at[P->order[i]->id] = i, to[i] = -1, wait_at[i] = i;
    for (int i = 0; i < n && !st; i++)
        if (param_gather_second(L, P->order[i]) && P->order[i]->src[0]->id < n_nodes) second_of[P->order[i]->src[0]->id] = P->order[i];
    /* the segments of each phase: runs of its nodes of one layer (leaves aside) */
    for (int ph = PDDE_PHASE_FORWARD; ph <= PDDE_PHASE_BACKWARD && !st; ph++) {
        int cur = -1, prev = -1, layer = INT32_MIN;
        for (int i = 0; i < n; i++) {
            const pdde_tensor *t = P->order[i];
            if ((int)t->phase != ph || t->op == PDDE_OP_NONE) continue;
            if (t->layer != layer) prev = cur, cur = i, layer = t->layer;
            seg_start[i] = prev;
        }
    }
    size_t budget = 0;
    size_t *ahead = calloc((size_t)n + 1, sizeof *ahead); /* by place: bytes of gathers started before it and waited for after it */
    if (!st) st = ahead ? prefetch_budget(L, &budget) : lower_oom(L);
    bool moved = false;
    for (int i = 0; i < n && !st; i++) {
        pdde_tensor *c = P->order[i];
        if (c->op != PDDE_OP_ALLGATHER || !param_gather(L, c)) continue;
        const pdde_tensor *x = c->src[0];
        bool on_host = registry_device_is_host(L->ctx->registry, c->device) && registry_device_is_host(L->ctx->registry, x->device);
        const char *backend = on_host ? NULL : registry_device_backend(L->ctx->registry, on_device(L, c) ? c->device : x->device);
        const char *model = L->p->fusion_backend; /* (the cost model's program for a cluster device: as that device runs it) */
        if (!(model ? lower_prefetch_on_backend(model) : lower_prefetch_gathers(on_host, L->p->host_busy, backend))) {
            P->device_collective_axes |= 1u << P->info[c->id].axis; /* (peers on host memory would start theirs early) */
            if (second_of[c->id]) P->device_collective_axes |= 1u << P->info[second_of[c->id]->id].axis;
            continue;
        }
        int from = seg_start[i];
        if (from < 0 || P->info[P->order[from]->id].chunk != P->info[c->id].chunk) continue;
        if (x->op != PDDE_OP_NONE && at[x->id] >= from) from = at[x->id] + 1; /* (after what it reads) */
        while (from < i && to[from] < 0 && (param_gather(L, P->order[from]) || param_gather_second(L, P->order[from])))
            from++; /* (after that layer's own blocking gathers: the first layer of a pass waits for those) */
        /* the earliest start from which the gathers in flight ahead of their places, this one with
         * them, stay within the budget at every place up to its own (those earlier in the order took
         * theirs first: a layer's gathers start as the layer before it takes its own from flight) */
        pdde_tensor *second = second_of[c->id];
        size_t bytes = node_alloc_bytes(c), second_bytes = second ? node_alloc_bytes(second) : 0, most = 0;
        int start = i;
        for (int q = i - 1; q >= from; q--) {
            if (ahead[q] > most) most = ahead[q];
            if (most + bytes + second_bytes > budget) break;
            start = q;
        }
        int work = 0; /* (the compute between its start and its wait: none, and it stays blocking) */
        for (int q = start; q < i; q++) work += prefetch_overlaps(P->order[q]);
        if (!work) continue;
        /* a two-axis gather's first step waits at the middle one of that compute (its second starts there
         * and travels behind the rest); with one, the second stays blocking at its place */
        int mid = -1, i2 = second ? at[second->id] : i;
        for (int q = start, seen = 0; second && work >= 2 && mid < 0; q++)
            if (prefetch_overlaps(P->order[q]) && seen++ == work / 2) mid = q;
        if (mid < 0) second = NULL, i2 = i;
        for (int q = start; q < i2; q++) ahead[q] += bytes; /* (the first's result: read by the second until it completes) */
        for (int q = mid; second && q < i2; q++) ahead[q] += second_bytes;
        for (int s = 0; s < (second ? 2 : 1) && !st; s++) {
            pdde_tensor *g = s ? second : c;
            pdde_tensor *w = node_add(L, PDDE_OP_COMM_WAIT, g, g->ndim, g->shape, 1, &g);
            if (!w) { st = lower_oom(L); break; }
            w->flags |= PDDE_TENSOR_VIEW, w->layer = g->layer;
            P->info[w->id].chunk = P->info[g->id].chunk;
            P->info[g->id].early = P->info[g->id].prefetch = true;
            wait_of[g->id] = w, moved = true;
        }
        to[i] = start;
        if (second) wait_at[i] = mid, to[i2] = mid;
    }
    /* the moved gathers start before the node at their new place (in their own order), and their waits
     * take their places; readers read the waits */
    int k = 0;
    for (int j = 0; j < n && !st && moved; j++) seg_start[j] = waits_to[j] = -1; /* (now: the first gather moved to place j, chained in at) */
    for (int i = n - 1; i >= 0 && !st && moved; i--)
        if (to[i] >= 0) {
            at[P->order[i]->id] = seg_start[to[i]], seg_start[to[i]] = i;
            if (wait_at[i] != i) waits_to[n + 1 + i] = waits_to[wait_at[i]], waits_to[wait_at[i]] = i;
        }
    /* (at a place: the waits moved there, then the gathers started there, then the node or its wait) */
    for (int j = 0; j < n && !st && moved; j++) {
        for (int i = waits_to[j]; i >= 0; i = waits_to[n + 1 + i]) order[k++] = wait_of[P->order[i]->id];
        for (int i = seg_start[j]; i >= 0; i = at[P->order[i]->id]) order[k++] = P->order[i];
        pdde_tensor *t = P->order[j];
        if (to[j] < 0) order[k++] = t;
        else if (wait_at[j] == j) order[k++] = wait_of[t->id];
    }
    for (int i = 0; i < k; i++)
        for (int s = 0; order[i]->op != PDDE_OP_COMM_WAIT && s < order[i]->nsrc; s++) {
            pdde_tensor *x = order[i]->src[s];
            if (x && x->id < n_nodes && wait_of[x->id]) order[i]->src[s] = wait_of[x->id];
        }
    if (!st && moved) free(P->order), P->order = order, P->n_order = P->cap_order = k, order = NULL;
    if (!st && moved) st = prefetch_staging_place(L, wait_of, n_nodes);
    free(at), free(to), free(seg_start), free(wait_at), free(waits_to), free(wait_of), free(second_of), free(order), free(ahead);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Gradients written straight into their accumulators (PDDE_DIRECT_GRADS: on unless =0). Autodiff adds
 * each parameter's gradient into its accumulator (GRAD_ACCUM, in place) and the update zeroes the
 * accumulator after reading it, so in a step that starts with zeroed gradients the first micro-batch's
 * accumulation adds to zeros: a kernel, and three passes over the gradient, that change nothing. Where
 * the gradient's producer is a node that nothing else reads (views of what it writes beside its values
 * aside), on the accumulator's device, of its dtype and size, the producer may write into the accumulator
 * itself (grad_into) and the accumulation is then skipped (grad_direct), as PyTorch's autograd assigns a
 * parameter's first gradient instead of adding it. The session chooses per run: a run that starts with
 * gradients left by an earlier one (PDDE_RUN_FORWARD_BACKWARD before it, or a gradient written) points the
 * producers at their own memory and accumulates, as do a step's later micro-batches (a pipeline stage's
 * too: its first backward is micro-batch 0's). Only accumulators an update of the program zeroes (or the
 * zeroing after a sharded update), one accumulation each. The values are the same bits (0 + g is g). */
PDDE_PRIVATE bool lower_direct_grads_on(void) {
    return pdde_env_bool("PDDE_DIRECT_GRADS", 1);
}

/* Whether the executor runs x itself (a copy, communication, a bucket, a vocab-parallel op), not a kernel
 * into its memory */
static bool executor_runs(const pdde_program *P, const pdde_tensor *x) {
    const pdde_program_node *in = &P->info[x->id];
    return x->op == PDDE_OP_COPY || (x->op >= PDDE_OP_ALLREDUCE && x->op <= PDDE_OP_COMM_WAIT) || x->op == PDDE_OP_SEND ||
           x->op == PDDE_OP_RECV || in->bucket || in->bucket_members || in->own_buffer || in->vocab_axis >= 0;
}

/* Whether acc is a gradient accumulator that one accumulation writes and an update zeroes (zeroed, accumulations:
 * lower_direct_grads's counts by id) */
static bool direct_accumulator(const pdde_tensor *acc, const uint8_t *zeroed, const int *accumulations) {
    return acc->op == PDDE_OP_NONE && (acc->flags & PDDE_TENSOR_GRAD) && zeroed[acc->id] && accumulations[acc->id] == 1;
}

static pdde_status lower_direct_grads(lowering *L) {
    pdde_program *P = L->P;
    if (!lower_direct_grads_on() || P->n_phantom) return PDDE_OK;
    /* (several micro-batches: the session binds the producers for micro-batch 0's backward, which must come
     * first in each chunk, as lower_passes orders them) */
    uint8_t *seen = calloc((size_t)P->n_chunks + 1, 1);
    if (!seen) return lower_oom(L);
    bool first_is_zero = true;
    for (int i = 0; i < P->n_step; i++) {
        const pdde_program_pass *ps = &P->step[i];
        int c = ps->chunk < 0 ? 0 : ps->chunk;
        if (ps->phase != PDDE_PHASE_BACKWARD || c > P->n_chunks) continue;
        first_is_zero &= seen[c] || ps->micro == 0;
        seen[c] = 1;
    }
    free(seen);
    if (!first_is_zero) return PDDE_OK;
    int *readers = calloc((size_t)P->n + 1, sizeof *readers), *accumulations = calloc((size_t)P->n + 1, sizeof *accumulations);
    uint8_t *zeroed = calloc((size_t)P->n + 1, 1);
    if (!readers || !accumulations || !zeroed) { free(readers), free(accumulations), free(zeroed); return lower_oom(L); }
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *t = P->order[i];
        for (int k = 0; k < t->nsrc && !pdde_is_lowp_copy_view(t); k++) readers[t->src[k]->id]++;
        if (t->op == PDDE_OP_GRAD_ACCUM) accumulations[t->src[0]->id]++;
        if (is_update(t)) zeroed[storage_root(t->src[1])->id] = 1;
        /* (lower_partition's zeroing of a whole accumulator after an update of its slice) */
        if (t->op == PDDE_OP_SCALE && (t->flags & PDDE_TENSOR_INPLACE) && pdde_op_f32(t, PDDE_P_SCALE) == 0.0f)
            zeroed[storage_root(t->src[0])->id] = 1;
    }
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *u = P->order[i], *acc = u->src[0], *x = u->nsrc == 2 ? u->src[1] : NULL;
        if (u->op != PDDE_OP_GRAD_ACCUM || !direct_accumulator(acc, zeroed, accumulations)) continue;
        if (u->nsrc == 3) { /* (an accumulation that computes its matmul, PDDE_FUSE_GRAD, writes the product instead of adding it) */
            P->info[u->id].grad_overwrite = true;
            continue;
        }
        if (!x || !(u->flags & PDDE_TENSOR_INPLACE) || readers[x->id] != 1) continue;
        /* (through in-place writers that alone read what they write into: an embedding's gradient scattered
         * into the tied head's) */
        pdde_tensor *r = x;
        while ((r->flags & PDDE_TENSOR_INPLACE) && !(r->flags & PDDE_TENSOR_VIEW) && r->nsrc > 0 && readers[r->src[0]->id] == 1 &&
               !pdde_has_beside(r->src[0]) && /* (whose view read later would give r memory of its own: memplan) */
               !(r->flags & (PDDE_TENSOR_OUTPUT | PDDE_TENSOR_LOSS)) && !executor_runs(P, r) && r->device == acc->device)
            r = r->src[0];
        if (is_persistent(r) || is_root_sharing(r) || (r->flags & (PDDE_TENSOR_OUTPUT | PDDE_TENSOR_LOSS)) || executor_runs(P, r) ||
            r->device != acc->device || r->dtype != acc->dtype || pdde_tensor_numel(r) != pdde_tensor_numel(acc))
            continue;
        P->info[r->id].grad_into = acc, P->info[u->id].grad_direct = true;
        P->info[acc->id].grad_into_bytes = node_alloc_bytes(r);
    }
    /* what such a producer writes beside its values (the column sums of a weight gradient's GEMM: the bias's
     * gradient) goes straight into the accumulator placed there */
    for (int i = 0; i < P->n_order; i++) {
        pdde_tensor *u = P->order[i], *acc = u->src[0], *v = u->nsrc == 2 ? u->src[1] : NULL;
        if (u->op != PDDE_OP_GRAD_ACCUM || !v || !pdde_is_lowp_copy_view(v) || P->info[u->id].grad_direct || !(u->flags & PDDE_TENSOR_INPLACE))
            continue;
        pdde_tensor *x = v->src[0], *first = P->info[x->id].grad_into;
        if (!first || P->info[first->id].grad_pair || !direct_accumulator(acc, zeroed, accumulations) || P->info[acc->id].grad_into_bytes ||
            P->info[acc->id].grad_pair || readers[v->id] != 1 ||
            acc->device != first->device || acc->dtype != v->dtype || pdde_tensor_numel(acc) != pdde_tensor_numel(v))
            continue;
        P->info[first->id].grad_pair = acc, P->info[acc->id].grad_pair = first, P->info[u->id].grad_direct = true;
        P->info[first->id].grad_into_bytes = pdde_lowp_copy_offset(x);
    }
    free(readers), free(accumulations), free(zeroed);
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Entry points */

PDDE_PRIVATE pdde_status program_lower(const pdde_graph *g, const pdde_lower_params *p, pdde_program **out) {
    *out = NULL;
    if (g->status) return g->status;
    if (g->n == 0) return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "lower: the graph is empty");
    if (p->world_size > 0 && (p->rank < 0 || p->rank >= p->world_size))
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "lower: rank %d of a world of %d", p->rank, p->world_size);
    if (p->comm_dtype != PDDE_F32 && p->comm_dtype != PDDE_BF16 && p->comm_dtype != PDDE_F16)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "lower: comm_dtype %s (f32, bf16 or f16)", pdde_dtype_name(p->comm_dtype));
    pdde_program *P = calloc(1, sizeof *P);
    lowering L = {.P = P, .g = g, .p = p, .ctx = g->ctx, .bf16 = lower_graph_bf16(g), .regather = lower_regather_on()};
    if (!P) return lower_oom(&L);
    P->g = g, P->world_size = p->world_size, P->rank = p->world_size > 0 ? p->rank : 0, P->n_user = g->n;
    P->of_user = calloc((size_t)g->n, sizeof *P->of_user), P->elsewhere = calloc((size_t)g->n, sizeof *P->elsewhere);
    pdde_status st = P->of_user && P->elsewhere ? lower_place(&L) : lower_oom(&L);
    if (!st && p->world_size > 0) st = lower_partition(&L);
    if (!st) st = lower_shadows(&L);
    if (!st) st = lower_fuse_epilogue(&L);
    if (!st) st = lower_fuse_bgrad(&L);
    if (!st) st = lower_fuse_grad(&L);
    if (!st) st = lower_lowp_logits(&L);
    if (!st) st = lower_fuse_add_ln(&L);
    if (!st) st = lower_bf16_grads(&L);
    if (!st) st = lower_att_lowp(&L);
    if (!st) st = lower_fold_casts(&L);
    if (!st) st = lower_fuse_ce(&L);
    if (!st) st = lower_fuse_gelu(&L);
    if (!st) st = group_updates(&L);
    if (!st) st = lower_buckets(&L);
    if (!st) st = lower_schedule(&L);
    if (!st) st = lower_zero3_prefetch(&L);
    if (!st) st = lower_direct_grads(&L);
    for (int i = 0; !st && i < P->n_order; i++)
        if (P->order[i]->flags & PDDE_TENSOR_LOSS) P->loss = P->order[i];
    free(L.gshape), free(L.done), free(L.first_done);
    if (st) {
        program_free(P);
        return st;
    }
    *out = P;
    return PDDE_OK;
}

PDDE_PRIVATE void program_dump(const pdde_program *P, FILE *f) {
    static const char *const phases[] = {"forward", "backward", "optimizer"};
    fprintf(f, "# local program: %d nodes", P->n_order);
    if (P->world_size) {
        fprintf(f, "; rank %d, mesh", P->rank);
        for (int a = 0; a < P->mesh->ndim; a++) fprintf(f, " %s=%d", P->mesh->names[a], P->mesh->shape[a]);
    }
    if (P->n_micro > 1) fprintf(f, "; %d micro-batches per step", P->n_micro);
    if (P->n_phantom) fprintf(f, " (and %d phantom ones: uneven shares)", P->n_phantom);
    if (P->n_stages > 1)
        fprintf(f, "; pipeline stage %d of %d, %s, %d micro-batches alive", P->stage, P->n_stages,
                P->schedule == PDDE_PIPELINE_GPIPE ? "GPipe" : "1F1B", P->n_live);
    fprintf(f, "\n#  phase     dev  op                   tensor                     local shape    dist attr\n");
    for (int i = 0; i < P->n_order; i++) {
        const pdde_tensor *t = P->order[i];
        const pdde_program_node *in = &P->info[t->id];
        char shape[96], attr[160];
        shape_str(t, shape, sizeof shape);
        pdde_dist_attr_str(&t->dist, attr, sizeof attr);
        fprintf(f, "%-10s %4d  %-20s %-26s %-14s %s", phases[t->phase], t->device, pdde_op_name(t->op), t->name, shape,
                t->dist.mesh ? attr : "");
        if (t->op == PDDE_OP_SEND || t->op == PDDE_OP_RECV)
            fprintf(f, "  %s rank %d (tag %d)", t->op == PDDE_OP_SEND ? "to" : "from", in->peer, in->tag);
        else if (in->bucket)
            fprintf(f, "  out of %s (its elements %lld..)", in->bucket->name, (long long)in->bucket_offset);
        else if (is_collective(t->op) && in->axis >= 0) {
            fprintf(f, "  over %s [", P->mesh->names[in->axis]);
            for (int r = 0; r < P->mesh->shape[in->axis]; r++) fprintf(f, r ? " %d" : "%d", P->group[in->axis][r]);
            fprintf(f, "] %zu bytes%s", in->bytes, in->prefetch ? ", prefetched" : in->early ? ", started early" : "");
            if (in->bucket_members) fprintf(f, ", a bucket of %d", in->bucket_members);
            else if (t->nsrc == 1 && t->src[0]) fprintf(f, ", of %s", t->src[0]->name); /* (a reshard step: what it reads) */
        } else if (t->op == PDDE_OP_COPY)
            fprintf(f, "  from device %d", t->src[0]->device);
        else if (t->op == PDDE_OP_COMM_WAIT)
            fprintf(f, "  completes %s", t->src[0]->name);
        else if (in->grad_into)
            fprintf(f, "  into %s", in->grad_into->name);
        else if (in->grad_direct)
            fprintf(f, "  (skipped in a step that starts with zeroed gradients)");
        else if (in->grad_overwrite)
            fprintf(f, "  (writes, not adds, in a step that starts with zeroed gradients)");
        if (in->chunk >= 0 && P->n_chunks > 1) fprintf(f, "  chunk %d", in->chunk);
        fputc('\n', f);
    }
    for (int i = 0; i < P->n_step; i++)
        fprintf(f, "%s%c%d%s", i ? " " : "# step: ", (P->step[i].phantom ? "fbu" : "FBU")[P->step[i].phase], P->step[i].micro,
                i == P->n_step - 1 ? "\n" : ""); /* (lower case: a phantom micro-batch) */
}

/* No CPU fallback: the session's params ask so, or the environment does (PDDE_CPU_FALLBACK=0). The
 * session and the predictions (pdde_lower_dump, pdde_predict_memory) read it here, so they agree. */
PDDE_PRIVATE bool program_no_cpu_fallback(const pdde_session_params *p) {
    return p->no_cpu_fallback || !pdde_env_bool("PDDE_CPU_FALLBACK", 1);
}

/* Whether `ranks` ranks of `threads` threads each on `hosts` hosts take every core of this host (a
 * host's ranks on host memory then leave no core to move data while they compute). */
PDDE_PRIVATE bool lower_host_busy(int hosts, int ranks, int threads) {
    return sysconf(_SC_NPROCESSORS_ONLN) <= (long)(ranks + hosts - 1) / hosts * threads;
}

/* overlap_gradients' auto: PDDE_OVERLAP_GRADIENTS (1 or 0) where set, else when the host's ranks leave it a core. */
PDDE_PRIVATE bool lower_overlap_auto(bool host_busy) { return pdde_env_bool("PDDE_OVERLAP_GRADIENTS", !host_busy) != 0; }

PDDE_PRIVATE pdde_lower_params program_lower_params(const pdde_graph *g, const pdde_session_params *p, int world_size, int rank) {
    pdde_lower_params lp = {world_size, rank, p->device, p->layer_devices, p->n_layer_devices, p->pipeline_schedule, p->comm_dtype,
                            p->overlap_gradients > 0, program_no_cpu_fallback(p), p->gradient_bucket_bytes, NULL, false, false};
    /* as a session decides them for ranks on one host */
    lp.host_busy = world_size > 0 && lower_host_busy(1, world_size, g->ctx->n_threads);
    if (p->overlap_gradients == 0 && world_size > 0) lp.overlap_gradients = lower_overlap_auto(lp.host_busy);
    return lp;
}

/* The local program of `rank` under params (NULL: the defaults), as that rank's session lowers it. */
PDDE_PRIVATE pdde_status program_lower_rank(const pdde_graph *g, const pdde_session_params *params, int world_size, int rank, pdde_program **out) {
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    if (params) sp = *params;
    pdde_lower_params lp = program_lower_params(g, &sp, world_size, rank);
    return program_lower(g, &lp, out);
}

pdde_status pdde_lower_dump(const pdde_graph *g, const pdde_session_params *params, int world_size, int rank, FILE *f) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    pdde_program *P;
    pdde_status st = program_lower_rank(g, params, world_size, rank, &P);
    if (st) return st;
    if (f) program_dump(P, f);
    program_free(P);
    return PDDE_OK;
}
