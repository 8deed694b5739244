/* planner/planner_impl.h — the private header of the graph IR and the planner: the internal structs
 * (graph, planner state, the local program that lowering returns) and the prototypes the planner's
 * parts share with each other and with pdde.c above them (the context is backends/backend_impl.h's).
 *
 * It sits in planner/ because the top level holds only the public header and the amalgamation, and
 * planner/ is the lowest layer that knows the graph IR: backends/ and comm/ never include it (they
 * see pdde.h and backends/backend_impl.h only), the planner reads the graph and writes programs, and
 * pdde.c (the executor, above them all) runs programs. The executor's session struct stays in
 * pdde.c: no other part may depend on it.
 *
 * Parts are compiled as one unit by pdde.c (PDDE_PRIVATE = static) and, to check that each depends
 * only on this header and the layers below, alone (`make check-parts`: PDDE_PRIVATE empty). */
#ifndef PDDE_PLANNER_IMPL_H
#define PDDE_PLANNER_IMPL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../pdde_extension.h"
#include "../backends/backend_impl.h"

/* comm/ needs UCX; a vendored copy without the comm/ folder simply has no communication */
#if defined(PDDE_HAVE_UCX) && !defined(PDDE_NO_COMM) && __has_include("../comm/comm.c")
#define PDDE_HAVE_COMM 1
#endif
/* the parameter server's table and in-process client need no transport: in every build that has the file */
#if !defined(PDDE_NO_COMM) && __has_include("../comm/ps.c")
#define PDDE_HAVE_PS 1
#endif

/* ------------------------------------------------------------------------------------------------
 * The graph (pdde.c builds it; the context is backends/backend_impl.h's) */

struct pdde_graph {
    pdde_context *ctx;
    pdde_tensor **nodes;
    int n, cap;
    int status;           /* first error while building */
    int layer;            /* layer id for new nodes */
    uint8_t *recompute;   /* by layer id: 1 = recompute its activations in backward (pdde_graph_set_recompute) */
    int n_recompute;
    bool has_backward;
    bool has_optimizer;
    pdde_optimizer_params opt; /* the optimizer appended (for the executor's learning-rate schedule) */
    pdde_dtype compute_dtype;  /* matmuls built now take this dtype (pdde_graph_set_compute_dtype) */
    pdde_tensor **cast_of;     /* by tensor id: its autocast copy, made once and shared by every matmul */
    int n_cast_of;
    pdde_tensor *grad_seed;    /* d loss / d loss: the session writes the loss scale into it */
    bool loss_scaling;         /* f16 matmuls: the session scales the loss dynamically */
    pdde_session *session;     /* the live session (one at a time: it reads the graph's optimizer state) */
    bool free_pending;         /* pdde_graph_free came while the session lived: the session frees the graph */
    struct planner_graph *planner; /* planner/ state: meshes, ops' required input attributes */
    char plan_text[2048];      /* the plan pdde_plan_apply applied (pdde_plan_str, whole: at most about 1.9 kB), "": none; the ranks compare it */
};

static inline bool same_shape(const pdde_tensor *a, const pdde_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* Records the first building error; returns NULL so builders can `return graph_fail(...)`. */
static inline pdde_tensor *graph_fail(pdde_graph *g, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline pdde_tensor *graph_fail(pdde_graph *g, int status, const char *fmt, ...) {
    if (g && g->status == PDDE_OK) { /* (NULL: a builder called without a graph) */
        g->status = status;
        va_list ap;
        va_start(ap, fmt);
        error_vset(g->ctx, fmt, ap);
        va_end(ap);
    }
    return NULL;
}

/* A view or an in-place op: it shares the storage of its first input. */
/* Layers [*first, *last) of n_layers that plan p places on its second device (none: 0, 0). */
static inline void plan_place_range(const pdde_plan *p, int n_layers, int *first, int *last) {
    *first = *last = 0;
    if (!p->place[0]) return;
    if (p->place_last > 0) *first = p->place_first < n_layers ? p->place_first : n_layers, *last = p->place_last < n_layers ? p->place_last : n_layers;
    else *first = n_layers > 2 ? 1 : 0, *last = n_layers > 2 ? n_layers - 1 : n_layers;
}

static inline bool is_root_sharing(const pdde_tensor *t) { return t->nsrc > 0 && (t->flags & (PDDE_TENSOR_VIEW | PDDE_TENSOR_INPLACE)); }
/* The tensor whose memory t uses (t itself unless it is a view or writes in place). */
static inline pdde_tensor *storage_root(pdde_tensor *t) {
    while (is_root_sharing(t)) t = t->src[0];
    return t;
}
/* Where in its root's memory t starts: 0, or past a layernorm (backward)'s own values for the view of its
 * second result (pdde_is_lowp_copy_view: PDDE_BF16_GRADS's copy, PDDE_FUSE_ADD_LN's sum) */
static inline size_t storage_offset_in_root(const pdde_tensor *t) {
    size_t off = 0;
    for (; is_root_sharing(t); t = t->src[0])
        if (pdde_is_lowp_copy_view(t)) off += pdde_lowp_copy_offset(t->src[0]);
    return off;
}
/* The bytes a node's memory takes: its values and, for a layernorm (backward) that writes a second result
 * beside them (pdde_has_beside), that result */
static inline size_t node_alloc_bytes(const pdde_tensor *t) {
    return pdde_has_beside(t) ? pdde_lowp_copy_offset(t) + (size_t)pdde_beside_numel(t) * pdde_dtype_size(pdde_beside_dtype(t))
                              : pdde_tensor_nbytes(t);
}
/* Inputs, parameters, constants and optimizer state are leaves: they live in the persistent buffer, as
 * do the parameters' low-precision copies that their updates keep (PDDE_TENSOR_SHADOW). */
static inline bool is_persistent(const pdde_tensor *t) { return t->op == PDDE_OP_NONE || (t->flags & PDDE_TENSOR_SHADOW); }
/* An optimizer's update: writes its parameter, gradient and state in place. */
static inline bool is_update(const pdde_tensor *t) { return t->op == PDDE_OP_ADAMW_UPDATE || t->op == PDDE_OP_SGD_UPDATE; }
/* An update's squared gradient norm source (clipping, loss scaling), after its parameter, gradient and
 * state; NULL without one. */
static inline pdde_tensor *update_norm(const pdde_tensor *u) {
    int plain = u->op == PDDE_OP_ADAMW_UPDATE ? 4 : 3, shadow = pdde_op_i32(u, PDDE_P_UPDATE_SHADOW) != 0;
    return u->nsrc > plain + shadow ? u->src[plain] : NULL;
}
/* The parameter's low-precision copy an update rewrites (its last source), or NULL. */
static inline pdde_tensor *update_shadow(const pdde_tensor *u) {
    return pdde_op_i32(u, PDDE_P_UPDATE_SHADOW) ? u->src[u->nsrc - 1] : NULL;
}

/* ------------------------------------------------------------------------------------------------
 * Planner state (planner/planner.c and the files it includes) */

/* A conflict that completion resolved by an op's rule (kept for the dump and the tests). */
typedef struct {
    int node, input;
    char msg[224];
} planner_conflict;

/* Per-graph planner state, made on first use and freed with the graph. */
struct planner_graph {
    pdde_mesh **meshes;            /* owned; each allocation holds its ranks after the struct */
    int n_meshes, cap_meshes;
    const pdde_mesh *mesh;         /* the graph's mesh: unannotated inputs and parameters live here */
    const pdde_mesh **layer_mesh;  /* by layer id: the sub-mesh its ops run on (pipeline stage), or NULL */
    int n_layer_mesh;
    /* uneven data parallelism (pdde_strategy_data_parallel_shares): index i of share_mesh's axis
     * share_axis runs shares[i] x grad_accum_steps micro-batches; NULL = equal shares */
    const pdde_mesh *share_mesh;
    int share_axis, *shares, share_total;
    /* data-parallel groups (pdde_strategy_data_parallel_groups): mesh axis group_axis splits the
     * batch outside batch_axis without a layout of its own; "" = none. By name: a pipeline stage's
     * slice of the mesh numbers its axes differently */
    char group_axis[16], batch_axis[16];
    uint8_t *annotated;            /* by tensor id: 1 when pdde_shard set its attr */
    int n_annotated;
    /* results of the last pdde_complete_dist_attrs */
    int n_completed;               /* nodes it covered (0 = not completed) */
    pdde_dist_attr *required;      /* [n_completed * PDDE_MAX_SRC]: what each op requires of input k */
    planner_conflict *conflicts;
    int n_conflicts, cap_conflicts;
    bool oom;                      /* a conflict could not be recorded */
};

PDDE_PRIVATE void planner_graph_free(struct planner_graph *p);
PDDE_PRIVATE struct planner_graph *planner_of(pdde_graph *g);

/* completion.c */
PDDE_PRIVATE bool completion_annotated(const struct planner_graph *pg, const pdde_tensor *t);
PDDE_PRIVATE int *completion_owners(const pdde_graph *g);

/* mesh.c */
PDDE_PRIVATE int mesh_numel(int ndim, const int *shape);
PDDE_PRIVATE bool mesh_owned(const struct planner_graph *pg, const pdde_mesh *m);
PDDE_PRIVATE int mesh_index_of(const pdde_mesh *m, int rank);
PDDE_PRIVATE int mesh_axis_color(const pdde_mesh *m, const int *coords, int a);
PDDE_PRIVATE void mesh_shape_str(const pdde_mesh *m, char *buf, size_t n);
PDDE_PRIVATE int mesh_sub_axis(const pdde_mesh *parent, const pdde_mesh *sub);
PDDE_PRIVATE const pdde_mesh *planner_layer_mesh(const struct planner_graph *pg, int layer);
PDDE_PRIVATE bool mesh_same(const pdde_mesh *a, const pdde_mesh *b);

/* dist_attr.c */
PDDE_PRIVATE pdde_dist_attr attr_replicated(const pdde_mesh *mesh, int ndim);
PDDE_PRIVATE unsigned attr_split_axes(const pdde_dist_attr *a);
PDDE_PRIVATE int attr_dim_of_axis(const pdde_dist_attr *a, int axis);
PDDE_PRIVATE bool attr_equal(const pdde_dist_attr *a, const pdde_dist_attr *b);
PDDE_PRIVATE pdde_dist_attr attr_on_mesh(const pdde_dist_attr *a, const pdde_mesh *mesh);
PDDE_PRIVATE pdde_dist_attr attr_on_mesh_at(const pdde_dist_attr *a, const pdde_mesh *mesh, int p);
PDDE_PRIVATE const char *attr_axis_name(const pdde_mesh *m, int axis);
PDDE_PRIVATE int attr_reshard_str(const pdde_dist_attr *from, const pdde_dist_attr *to, char *buf, size_t n);

/* spmd_rules.c: one op's rule, applied to what its inputs give */
#define SPMD_PINNED 64 /* axis_of value of a letter that must stay replicated (a normalised dim, a cut axis) */
typedef struct {
    struct planner_graph *pg;
    const pdde_tensor *node;
    const pdde_mesh *mesh;                /* the op's mesh */
    int nsrc;
    pdde_dist_attr in[PDDE_MAX_SRC];      /* what the producers give, moved onto the op's mesh */
    pdde_dist_attr req[PDDE_MAX_SRC];     /* answer: what the op requires of each input */
    pdde_dist_attr out;                   /* answer: the output's attr */
    /* einsum-style merging (spmd_merge, spmd_finish) */
    char dims[PDDE_MAX_SRC][PDDE_MAX_DIMS + 1]; /* each input's letters */
    char out_dims[PDDE_MAX_DIMS + 1];
    int8_t axis_of[128];                  /* letter -> mesh axis; -1 replicated; SPMD_PINNED */
    int8_t owner_in[128], owner_dim[128]; /* which input dim gave a letter its axis (for messages) */
    char letter_of_axis[8];               /* mesh axis -> the letter split over it (0 = none) */
    unsigned linear;                      /* bit k: the op is linear in input k (it may be partial) */
    bool additive;                        /* the linear inputs are added: they share one partial */
    unsigned avg_reduce;                  /* a split letter the output lacks is averaged, not summed */
    /* data-parallel groups: bit k set when input k holds its group's own values (from the data, not
     * yet reduced over the groups); answer: whether the output does */
    unsigned group_local;
    bool out_group_local;
} spmd_ctx;
PDDE_PRIVATE int spmd_apply(spmd_ctx *c, const pdde_graph *g);

/* simulate.c: plan (on devices dev[rank], indices into d) simulated from its real programs, pp->build
 * making its graph and pp->cluster the devices: fills step_s, bubble_s (the most idle rank's idle),
 * peak_bytes, peak_device and why (out of memory on a device). */
/* moe_cost.c: the MoE layers of a forward graph as cost parameters (0: it has none), and what expert
 * parallelism of degree ep changes against ep 1 for a plan of dp x tp ranks on the cluster's devices
 * (dev: indices into pdde_plan_devices, whose order the cluster's devices follow): step time and the
 * experts' bytes on a rank. groups: the experts over groups of ep of the dp ranks (with tp > 1, each
 * expert's hidden units over tp too), even where ep = tp; else with tp > 1 and ep = tp the tp axis. */
PDDE_PRIVATE int plan_moe_params(const pdde_graph *g, pdde_moe_cost_params *p);
/* How lowering runs a plan's ZeRO-3 gathers: started a layer ahead (lower_prefetch_gathers on every
 * rank's device, equal shares), gathered again for backward (lower_regather_on). The search decides it
 * once (both read the environment), pdde_moe_cost_estimate from the ranks' devices. */
typedef struct {
    bool prefetched, regathered;
} plan_zero3_gathers;
/* PDDE_COMM_A2A_HIER as the communicator reads it: 0 the flat exchange, 1 the hierarchical one, -1 (unset)
 * its automatic choice. Read once a search or an estimate (moe_cost.c), passed down as a2a_hier. */
PDDE_PRIVATE int moe_a2a_hier_mode(void);
PDDE_PRIVATE pdde_status plan_moe_delta(pdde_context *ctx, const pdde_cluster *c, int n_plan_devices, const int *dev, int dp, int tp,
                                        const pdde_moe_cost_params *p, int ep, bool groups, plan_zero3_gathers gathers, int a2a_hier,
                                        double *step_s, double *bytes);
PDDE_PRIVATE pdde_status plan_simulate(pdde_graph *g, const pdde_plan_devices *d, const pdde_plan_params *pp, const int *dev,
                                       pdde_plan *plan);

/* cluster.c: the query-key pairs a fused attention node of T queries keeps for each batch row and head: the causal
 * triangle T (T + 1) / 2, or under a window W on its starts (pdde_attention_window) the sum over t of min(t + 1, W) */
PDDE_PRIVATE double attention_pairs(const pdde_tensor *node, int64_t T);
/* cluster.c: the scores a tiled kernel computes for it (each batch row and head): for each tile of 128 queries, the
 * key tiles from the one holding its first row's first key (0, or under a window t - W + 1) through the diagonal */
PDDE_PRIVATE double attention_tile_scores(const pdde_tensor *node, int64_t T);
/* cost.c: bytes a node reads and writes (what its op class's time curve is measured by), and the GEMM
 * work of a matmul or fused attention node (shape, FLOPs, dtype) */
PDDE_PRIVATE double cost_node_bytes(const pdde_tensor *x);
PDDE_PRIVATE void cost_node_gemm(const pdde_tensor *x, pdde_cost_op *op);
PDDE_PRIVATE double cost_moe_padded_bytes(const pdde_tensor *x);
PDDE_PRIVATE double cost_op_flops(const pdde_cost_op *op);
/* cost.c: a lowered node's bytes, FLOPs and GEMM dtype together, as the simulation counts them */
PDDE_PRIVATE void cost_node_work(const pdde_tensor *x, double *bytes, double *flops, pdde_dtype *dtype);
PDDE_PRIVATE double cost_core_sharing(const pdde_cluster *c, const int *devices, int n, int op_class);
PDDE_PRIVATE double cost_rank_oversubscription(const pdde_cluster *c, const int *devices, int n);
PDDE_PRIVATE double cost_groups_at_once(pdde_context *ctx, const pdde_cluster *c, int pairwise, const int *members, int G, int S, int steps,
                                        double chunk);

/* ------------------------------------------------------------------------------------------------
 * The local program (planner/lower.c): what one rank runs of a plan, computed from the completed
 * graph, the lowering params and the rank alone — no communicator, no device, no tensor memory — and
 * without changing the user's graph. The executor runs it; a cost model can simulate it.
 *
 * Its nodes are pdde_tensors of their own (so a backend's compute runs them as they are): op, dtype,
 * named op params (pdde.h accessors), the LOCAL shape, src pointing at other nodes of the
 * same program, phase (forward / backward / optimizer), layer, device (always set: a global device
 * index), dist (the attr this block has). `id` is the node's index in `nodes`; data/offset are the
 * executor's to fill. What a node is beyond a kernel call is in its pdde_program_node. */

typedef struct {
    int user;           /* id of the user's graph node this lowers; -1 for a node lowering inserted
                           (copy, cast, reshard collective, slice, send, recv, wait, ...) */
    int chunk;          /* interleaved stages: the chunk of this rank's layers it runs in; -1 = none
                           (optimizer nodes, or a rank with one run of layers) */
    /* communication: collectives (allreduce, reduce_scatter, allgather, alltoall) */
    int axis;           /* the graph mesh axis it runs over; the group is program->group[axis]; -1 */
    int dim;            /* the tensor dim that grows (allgather, alltoall) or shrinks (reduce_scatter) */
    int split_dim;      /* alltoall: the dim the input is split on; -1 otherwise */
    int reduce;         /* allreduce, reduce_scatter: a pdde_reduce_op */
    bool early;         /* a gradient reduction started right after its gradient is final, in the
                           step's last backward pass; its comm_wait completes it */
    bool prefetch;      /* (with early) ZeRO-3's gather of a parameter started a layer ahead of its
                           readers, in every pass that runs it; its comm_wait completes it */
    size_t staging_offset; /* a prefetched gather with device memory: its region of the prefetch staging */
    bool write_back;    /* allgather of an updated slice (src[1]) into the whole parameter (src[0]) */
    /* point to point (send, recv) */
    int peer;           /* the other rank (in the world) */
    int tag;
    /* vocab-parallel ops (embedding, its backward, cross-entropy, its backward): vocab split over
     * mesh axis vocab_axis (-1: not split); the executor runs the cross-entropy's reductions */
    int vocab_axis;
    size_t bytes;       /* what the node moves: a collective's input block, a message, a copy */
    /* gradient buckets (lower_buckets): data-parallel collectives of small tensors carried by one
     * collective on a flat buffer, the bucket's own node. A bucket node: bucket_members > 0, its
     * first member in bucket_next, bucket_block elements per rank's block (an allreduce's whole
     * buffer). A member: bucket = its bucket node, bucket_next the next member, bucket_offset its
     * elements' place in each block; it stays in the order as the copy of its result out of the
     * bucket (its last source). */
    bool data_parallel; /* a gradient reduction or a gather of updated shards (ZeRO): bucketable */
    int bucket_members;
    int64_t bucket_block, bucket_offset;
    pdde_tensor *bucket, *bucket_next;
    bool own_buffer;    /* a bucket of device tensors: its host buffer is the session's (pinned where the
                           members' backend can), not the arena's */
    /* a gradient written straight into its accumulator (lower_direct_grads): on the gradient's producer,
     * that accumulator; on the accumulation it replaces, grad_direct (the session skips it in the first
     * micro-batch of a run that starts with zeroed gradients); on the accumulator, the bytes its producer writes (its values and
     * what it writes beside them: the persistent buffer holds them), and where what it writes beside is a
     * gradient too (a bias's, PDDE_FUSE_BGRAD), grad_pair: that gradient's accumulator, placed right there
     * (each of the two names the other; the first one's grad_into_bytes is where the second starts) */
    pdde_tensor *grad_into, *grad_pair;
    bool grad_direct;
    bool grad_overwrite; /* an accumulation that computes its matmul (PDDE_FUSE_GRAD): it writes instead of adding then */
    size_t grad_into_bytes;
} pdde_program_node;

/* One pass of a step: the nodes of `phase` (forward or backward, for micro-batch `micro`, of chunk
 * `chunk` or all when -1) or the update (phase optimizer, in micro-batch n_micro - 1's memory). */
typedef struct {
    pdde_phase phase;
    int micro;
    int chunk;
    bool early;         /* the step's last backward: early gradient reductions start in it */
    /* a micro-batch this rank does not have (uneven shares under ZeRO-2/3, whose reduce-scatters and
     * gathers run in every micro-batch): only its collectives over the shares' axis run, reducing
     * zeros (program_phantom_runs), so that every rank of the axis makes as many (in micro's memory) */
    bool phantom;
} pdde_program_pass;

typedef struct pdde_program {
    const pdde_graph *g;        /* the graph it lowers (read, never written) */
    int world_size, rank;       /* world_size 0: one process, no distribution */
    const pdde_mesh *mesh;      /* the graph's mesh (NULL without distribution) */
    int coords[PDDE_MAX_MESH_DIMS];        /* this rank's coordinates in it */
    int *group[PDDE_MAX_MESH_DIMS];        /* the ranks along each mesh axis through this rank (the
                                              axis' communicator), mesh->shape[a] each */
    /* nodes */
    pdde_tensor **nodes;        /* by program id */
    pdde_program_node *info;    /* by program id */
    int n, cap;
    pdde_tensor **order;        /* the run order of one pass over every phase (nodes skipped by
                                   phase/chunk as the passes say) */
    int n_order, cap_order;
    /* the user's graph seen from here */
    int n_user;                 /* the graph's node count when lowered */
    pdde_tensor **of_user;      /* by user id: the program node holding that tensor on this rank
                                   (its local block), NULL = not in the step or not on this rank */
    bool *elsewhere;            /* by user id: in the step, but on other ranks (another stage's) */
    pdde_tensor *loss;          /* the loss node on this rank, or NULL */
    /* micro-batches, pipeline stages, the schedule */
    int n_micro;                /* micro-batches per step (the optimizer's grad_accum_steps, times this
                                   rank's share under uneven data parallelism) */
    float grad_scale;           /* what the update multiplies the reduced gradients by: 1 / grad_accum_steps,
                                   or dp / (grad_accum_steps x the shares' sum) with uneven shares */
    int n_stages, stage;        /* pipeline stages (1: none) and this rank's */
    int n_chunks;               /* runs of layers this rank's stage holds (interleaved stages; 1 = one) */
    int loss_chunk;             /* the chunk holding the loss */
    int n_live;                 /* micro-batches whose activations are alive at once */
    pdde_pipeline_schedule schedule;
    pdde_program_pass *step;    /* a training step (PDDE_RUN_STEP), pass by pass */
    int n_step;
    pdde_program_pass *forward; /* a forward-only run of every micro-batch */
    int n_forward;
    /* nodes moved to the CPU because their device does not run their op: how many, and which ops
     * from which devices ("gelu, gelu_back (device 1)"), for the session's one-line notice */
    int n_fallback;
    char fallback[256];
    /* the mesh axes (bit a: axis a) with a data-parallel collective in device memory, which neither
     * buckets nor early reductions take (host memory only): where a group's ranks differ in it, a
     * session lowers every rank again without both, so that peers issue the same collectives */
    unsigned device_collective_axes;
    /* the host memory that prefetched ZeRO-3 gathers with device memory go through (0: none) */
    size_t prefetch_staging_bytes;
    /* storage of the nodes (blocks, so node pointers stay put as the program grows) */
    pdde_tensor **blocks;
    int n_blocks;
    /* uneven shares with collectives over their axis in every micro-batch (ZeRO-2/3): the phantom
     * micro-batches this rank runs first, to make as many of those collectives as the largest share
     * (0: none), and the mesh axis of the shares (-1: even) */
    int n_phantom, share_axis;
} pdde_program;

/* Whether node t of P runs in a phantom pass: a collective over the shares' axis that is due in
 * every micro-batch (not one started early in the last backward), and the accumulation of what a
 * reduction brought (the other ranks' gradients for this rank's shard). */
static inline bool program_phantom_runs(const pdde_program *P, const pdde_tensor *t) {
    const pdde_tensor *c = t->op == PDDE_OP_GRAD_ACCUM && t->nsrc > 1 ? t->src[1] : t;
    if (c->op < PDDE_OP_ALLREDUCE || c->op > PDDE_OP_ALLGATHER || (c != t && c->op == PDDE_OP_ALLGATHER)) return false;
    const pdde_program_node *in = &P->info[c->id];
    return P->share_axis >= 0 && in->axis == P->share_axis && !in->early;
}

/* The lowering params: the plan's parts that are not attributes on the graph. */
typedef struct {
    int world_size;             /* ranks (the graph mesh's); 0 = one process, no distribution */
    int rank;
    int device;                 /* default device of unplaced nodes */
    const int *layer_devices;   /* by layer: its device, -1 = the default */
    int n_layer_devices;
    pdde_pipeline_schedule schedule;
    pdde_dtype comm_dtype;      /* what reshard collectives of f32 tensors carry */
    bool overlap_gradients;     /* gradient reductions start early (on host memory) */
    bool no_cpu_fallback;       /* a node its device cannot run stays there (the session then refuses it) */
    int64_t gradient_bucket_bytes; /* pdde_session_params': 0 = GRADIENT_BUCKET_BYTES, < 0 = no buckets */
    const char *fusion_backend;    /* the fusions' defaults as on this backend's devices (lower_fusion_on; the cost
                                      model's program for a cluster device); NULL: each node's device's own */
    bool no_zero3_prefetch;     /* ZeRO-3's gathers stay blocking where their readers are (else lower_prefetch_gathers decides) */
    bool host_busy;             /* this host's ranks take all its cores (lower_host_busy): host-memory transfers cannot overlap */
} pdde_lower_params;

/* Whether lowering's graph fusion `name` (PDDE_FUSE_*, PDDE_BF16_*, PDDE_ATT_LOWP) is on for a node on a
 * device of `backend` in a graph with bf16 matmuls or not: its variable "1" on, "0" off, else its default
 * there (planner/lower.c). The one rule lowering and the cost model follow. */
PDDE_PRIVATE bool lower_fusion_on(const char *name, const char *backend, bool bf16);
/* Whether any of lowering's graph fusions is on there (the cost model lowers the graph only then). */
PDDE_PRIVATE bool lower_fusion_any(const char *backend, bool bf16);
PDDE_PRIVATE bool lower_direct_grads_on(void);
/* Whether g computes in bf16: a matmul or attention of bf16 operands (pdde_graph_set_compute_dtype). */
PDDE_PRIVATE bool lower_graph_bf16(const pdde_graph *g);

/* The nodes a step needs, by graph node id (1: needed; calloc'd, NULL: out of memory): everything a loss,
 * an output or an optimizer/accumulation node depends on; a graph with none of those (a plain forward
 * graph) keeps every node. Lowering leaves the others out (an input's gradient nobody reads), and the cost
 * model's program of a graph counts only these (planner/lower.c). */
PDDE_PRIVATE uint8_t *lower_needed_nodes(const pdde_graph *g);
/* Whether ZeRO-3 gathers a parameter again for backward (PDDE_ZERO3_REGATHER, default on; planner/lower.c). */
PDDE_PRIVATE bool lower_regather_on(void);
/* Whether ZeRO-3 starts a layer's gathers while the layer before it computes (PDDE_ZERO3_PREFETCH;
 * planner/lower.c), for a gather on host memory (of a host whose ranks take all its cores: host_busy)
 * or on a device of `backend`: lowering decides by it, the search's estimate prices the gathers by it. */
PDDE_PRIVATE bool lower_prefetch_gathers(bool host_memory, bool host_busy, const char *backend);
PDDE_PRIVATE bool lower_prefetch_on_backend(const char *backend);
PDDE_PRIVATE bool lower_host_busy(int hosts, int ranks, int threads);
PDDE_PRIVATE bool lower_overlap_auto(bool host_busy);
/* Lowers g for one rank. The program is freed with program_free. */
PDDE_PRIVATE pdde_status program_lower(const pdde_graph *g, const pdde_lower_params *p, pdde_program **out);
PDDE_PRIVATE void program_free(pdde_program *p);
/* The graph mesh's axis that axis a of mesh (the graph's mesh or a slice of it) is. */
PDDE_PRIVATE int program_axis(const pdde_program *p, const pdde_mesh *mesh, int a);
/* Prints the program (one line per node in run order; the step's passes last). */
PDDE_PRIVATE void program_dump(const pdde_program *p, FILE *f);
/* no CPU fallback: the session params or PDDE_CPU_FALLBACK=0 (the session and the predictions agree) */
PDDE_PRIVATE bool program_no_cpu_fallback(const pdde_session_params *p);
/* The lowering params a session with params p on rank `rank` of world_size ranks on one host uses
 * (overlap_gradients 0, auto: when the ranks of the context's threads leave this machine a core). */
PDDE_PRIVATE pdde_lower_params program_lower_params(const pdde_graph *g, const pdde_session_params *p, int world_size, int rank);
PDDE_PRIVATE pdde_status program_lower_rank(const pdde_graph *g, const pdde_session_params *params, int world_size, int rank, pdde_program **out);

/* ------------------------------------------------------------------------------------------------
 * The memory plan of a local program (planner/memplan.c): what the executor allocates, and what the
 * cost model predicts. */
#define PDDE_ARENA_ALIGN 64

typedef struct {
    int device;            /* global device index */
    size_t persist_bytes;  /* its persistent buffer (leaves, aligned; inputs once per micro-batch) */
    size_t arena_bytes;    /* one micro-batch's activation arena (allocated n_live times) */
} program_device_memory;

typedef struct {
    program_device_memory *devs; /* in the order the program's nodes first use them */
    int n_devs;
    int *slot;                   /* by program node id (of the nodes in order): its index in devs */
    pdde_memory_stats stats;     /* what pdde_session_memory reports for a session of this program */
    uint8_t *overwritten;        /* by program node id: 1 where its memory holds other tensors before the step ends */
} program_memory;

/* A block of an arena with its lifetime: made at step `from`, released after step `to`. */
typedef struct { size_t size; int from, to, id, slot; size_t offset; } arena_item;
/* Places the items (one arena; the largest first places best) so that no two whose lifetimes overlap
 * share bytes: writes their offsets, returns the arena's size (-1: out of memory). */
PDDE_PRIVATE int64_t arena_greedy(arena_item *items, int n);
/* Plans p's memory (reuse = 0: every tensor its own bytes): writes each node's offset (in its device's
 * persistent buffer or arena) and clears the INPLACE flag of in-place nodes whose input is read later. */
PDDE_PRIVATE pdde_status program_plan_memory(pdde_context *ctx, pdde_program *p, bool reuse, program_memory *out);
PDDE_PRIVATE void program_memory_free(program_memory *m);
/* The host bounce buffer that collectives and receives on device memory outside gradient buckets go
 * through (core/session.c, one for the session): the most bytes one of them needs, *device its node's. */
PDDE_PRIVATE size_t program_comm_staging_bytes(pdde_context *ctx, const pdde_program *p, int *device);
/* The host scratch where gathers and reduce-scatters along a dim other than 0 reorder their blocks
 * (core/session.c, one for the session, allocated once): the most bytes one of them reorders. */
PDDE_PRIVATE size_t program_gather_scratch_bytes(const pdde_program *p);
/* Whether device collectives dc serve bucket node b: its op has dc's slot and every member lives on
 * one device of dc's backend, which has the copy slot (the session and pdde_predict_memory ask). */
PDDE_PRIVATE bool program_device_bucket_served(pdde_context *ctx, const pdde_program *p, const pdde_tensor *b, const pdde_device_collectives_iface *dc);
PDDE_PRIVATE size_t program_aligned_bytes(const pdde_tensor *t);
/* cost.c: the first in-place node of g that local device d does not run (NULL: none) */
PDDE_PRIVATE const pdde_tensor *plan_inplace_refused(pdde_context *ctx, const pdde_graph *g, int d);

#endif
