/* planner/simulate.c — the cost model on a plan's real programs: every rank lowered (lower.c), as its
 * session would lower it, and each node of its step turned into what the executor does with it (a
 * cost.c op): compute on the device the node is placed on, reshard collectives on their axis' group
 * with their real size and dtype (blocking, or started early in the last backward and completed at
 * their COMM_WAIT), sends and receives paired by tag across ranks, the vocab-parallel cross-entropy's
 * row reductions, the micro-batch passes in the schedule's order, the update and the step's loss
 * allreduce. Each rank's memory is its memory plan's (memplan.c), so the simulated peak is what the
 * session allocates. Included by pdde.c after memplan.c. */
#include "planner_impl.h"

#include <float.h>

typedef struct {
    pdde_cost_program *cp;
    const pdde_program *P;
    int rank, world;
    int *group_of;        /* [PDDE_MAX_MESH_DIMS * world]: cost group of (axis, the group's first rank); -1 = none yet */
    const pdde_cost_plan *plan;
    int *started;         /* by program node id: cost op index of an early collective started this step, -1 */
} sim_rank;

static pdde_collective sim_collective(pdde_op op) {
    return op == PDDE_OP_ALLREDUCE ? PDDE_COLL_ALLREDUCE : op == PDDE_OP_REDUCE_SCATTER ? PDDE_COLL_REDUCE_SCATTER
         : op == PDDE_OP_ALLGATHER ? PDDE_COLL_ALLGATHER : PDDE_COLL_ALLTOALL;
}

/* The cost group of this rank's communicator along graph mesh axis a. */
static int sim_group(sim_rank *s, int a) {
    const int *ranks = s->P->group[a];
    int *slot = &s->group_of[(size_t)a * (size_t)s->world + (size_t)ranks[0]];
    if (*slot < 0) *slot = pdde_cost_program_group(s->cp, s->P->mesh->shape[a], ranks);
    return *slot;
}

static void sim_name(pdde_cost_op *op, const pdde_tensor *t, int micro) {
    snprintf(op->name, sizeof op->name, "%c%d %.12s %.14s", "FBU"[t->phase], micro, pdde_op_name(t->op), t->name);
}

static int sim_collective_op(sim_rank *s, const pdde_tensor *t, int micro, int async) {
    const pdde_program_node *in = &s->P->info[t->id];
    pdde_cost_op op;
    memset(&op, 0, sizeof op);
    op.kind = PDDE_COST_COLLECTIVE, op.phase = t->phase, op.micro = micro, op.last_use = -1, op.async = async;
    op.coll = sim_collective(t->op), op.algo = PDDE_ALGO_AUTO, op.dtype = t->dtype;
    /* (the calibration's convention: the whole buffer of an allreduce, the gathered result of an
     * allgather, the input of a reduce-scatter or an alltoall) */
    op.count = in->bucket_members ? (t->op == PDDE_OP_ALLREDUCE ? 1 : s->P->mesh->shape[in->axis]) * in->bucket_block
                                  : pdde_tensor_numel(t->op == PDDE_OP_ALLGATHER ? t : t->src[0]);
    if ((op.group = sim_group(s, in->axis)) < 0) return op.group;
    sim_name(&op, t, micro);
    return pdde_cost_program_add(s->cp, s->rank, &op);
}

/* A compute node: its class, bytes and GEMM work (local; a fused attention's too), on the device it is
 * placed on. */
static int sim_compute_op(sim_rank *s, const pdde_tensor *t, int micro) {
    pdde_cost_op op;
    memset(&op, 0, sizeof op);
    op.kind = PDDE_COST_COMPUTE, op.phase = t->phase, op.micro = micro, op.dtype = t->dtype, op.last_use = -1;
    op.op_class = pdde_op_class_of(t);
    if (!(t->flags & PDDE_TENSOR_VIEW)) op.bytes = cost_node_bytes(t);
    cost_node_gemm(t, &op);
    const pdde_cost_plan *pl = s->plan;
    if (pl->local_devices && t->device >= 0 && t->device < pl->n_local_devices && pl->local_devices[t->device] >= 0)
        op.placed = 1, op.placed_device = pl->local_devices[t->device];
    sim_name(&op, t, micro);
    int k = pdde_cost_program_add(s->cp, s->rank, &op);
    double padded = cost_moe_padded_bytes(t);
    if (k >= 0 && padded > 0) { /* (the by-expert buffer's scan and zeroing: memory work beside the GEMM) */
        pdde_cost_op pad = op;
        pad.op_class = PDDE_OPCLASS_ELEMENTWISE, pad.m = pad.n = pad.k = 0, pad.flops = 0, pad.bytes = padded;
        k = pdde_cost_program_add(s->cp, s->rank, &pad);
    }
    return k;
}

/* The MoE token exchange (an ALLTOALL with the layer's expert ids, run_alltoall_moe in the executor):
 * the per-expert counts (an alltoall of E integers), the routed rows only (this rank's tokens x k,
 * the ids' count, under even routing both ways), and the host work around them: packing and
 * unpacking those rows and zeroing the padded output. */
static int sim_moe_exchange(sim_rank *s, const pdde_tensor *t, int micro) {
    const pdde_program_node *in = &s->P->info[t->id];
    const pdde_tensor *x = t->src[0], *ids = t->src[1], *tok = in->dim == 1 ? x : t;
    int64_t E = tok->shape[0], S = tok->shape[1], rows = pdde_tensor_numel(ids), row = pdde_tensor_numel(tok) / (E * S > 0 ? E * S : 1);
    int group = sim_group(s, in->axis), k = group;
    for (int i = 0; i < 2 && k >= 0; i++) {
        pdde_cost_op op;
        memset(&op, 0, sizeof op);
        op.kind = PDDE_COST_COLLECTIVE, op.phase = t->phase, op.micro = micro, op.last_use = -1, op.group = group;
        op.coll = PDDE_COLL_ALLTOALL, op.algo = PDDE_ALGO_AUTO;
        op.dtype = i ? t->dtype : PDDE_I32, op.count = i ? rows * row : E;
        sim_name(&op, t, micro);
        k = pdde_cost_program_add(s->cp, s->rank, &op);
    }
    if (k < 0) return k;
    pdde_cost_op host;
    memset(&host, 0, sizeof host);
    host.kind = PDDE_COST_COMPUTE, host.phase = t->phase, host.micro = micro, host.dtype = t->dtype, host.last_use = -1;
    host.op_class = PDDE_OPCLASS_ELEMENTWISE;
    host.bytes = 4.0 * (double)rows * (double)row * (double)pdde_dtype_size(t->dtype) + (double)pdde_tensor_nbytes(t);
    sim_name(&host, t, micro);
    return pdde_cost_program_add(s->cp, s->rank, &host);
}

static int sim_p2p_op(sim_rank *s, const pdde_tensor *t, int micro) {
    const pdde_program_node *in = &s->P->info[t->id];
    pdde_cost_op op;
    memset(&op, 0, sizeof op);
    op.kind = t->op == PDDE_OP_SEND ? PDDE_COST_SEND : PDDE_COST_RECV, op.phase = t->phase, op.micro = micro, op.last_use = -1;
    op.peer = in->peer, op.tag = in->tag, op.count = pdde_tensor_numel(t), op.dtype = t->dtype;
    sim_name(&op, t, micro);
    return pdde_cost_program_add(s->cp, s->rank, &op);
}

/* The vocab-parallel cross-entropy (forward or backward): the row statistics on the host, with an
 * allreduce of the row maxima and one of the sums and target logits over the vocab axis. */
static int sim_vocab_ce(sim_rank *s, const pdde_tensor *t, int micro) {
    int k = sim_compute_op(s, t, micro), group = k >= 0 ? sim_group(s, s->P->info[t->id].vocab_axis) : k;
    int64_t rows = t->src[0]->shape[0];
    for (int i = 0; i < 2 && k >= 0; i++) {
        pdde_cost_op op;
        memset(&op, 0, sizeof op);
        op.kind = PDDE_COST_COLLECTIVE, op.phase = t->phase, op.micro = micro, op.last_use = -1, op.group = group;
        op.coll = PDDE_COLL_ALLREDUCE, op.algo = PDDE_ALGO_AUTO, op.dtype = PDDE_F32, op.count = rows * (i + 1);
        snprintf(op.name, sizeof op.name, "%c%d vocab ce allreduce", "FBU"[t->phase], micro);
        k = group < 0 ? group : pdde_cost_program_add(s->cp, s->rank, &op);
    }
    return k;
}

/* A gradient bucket's member (lower_buckets): the first completes its bucket — waits for it if it
 * started early, runs it if it did not start in this step — and the copies out are left uncharged. */
static int sim_bucket_member(sim_rank *s, const pdde_tensor *t, int micro) {
    const pdde_tensor *b = s->P->info[t->id].bucket;
    int *started = &s->started[b->id], k = 0;
    if (*started == -1) k = sim_collective_op(s, b, micro, 0);
    if (*started >= 0) {
        pdde_cost_op op;
        memset(&op, 0, sizeof op);
        op.kind = PDDE_COST_WAIT, op.phase = t->phase, op.micro = micro, op.last_use = -1, op.wait = *started;
        sim_name(&op, t, micro);
        k = pdde_cost_program_add(s->cp, s->rank, &op);
    }
    *started = -2; /* (done) */
    return k;
}

/* One pass of the step (phase < 0: every phase, a step of one micro-batch). */
static int sim_pass(sim_rank *s, int phase, int micro, int chunk, bool early) {
    const pdde_program *P = s->P;
    int k = 0;
    for (int i = 0; i < P->n_order && k >= 0; i++) {
        const pdde_tensor *t = P->order[i];
        const pdde_program_node *in = &P->info[t->id];
        if (t->op == PDDE_OP_NONE || t->op == PDDE_OP_RESHAPE || (phase >= 0 && (int)t->phase != phase)) continue;
        if (in->grad_direct && micro <= 0) continue; /* (a step's gradient written where it is accumulated: lower_direct_grads) */
        if (chunk >= 0 && t->phase != PDDE_PHASE_OPTIMIZER && in->chunk != chunk) continue;
        bool collective = t->op >= PDDE_OP_ALLREDUCE && t->op <= PDDE_OP_ALLGATHER && in->axis >= 0;
        if (in->bucket) {
            k = sim_bucket_member(s, t, micro);
        } else if (collective && in->prefetch) { /* ZeRO-3's gather started a layer ahead, in every pass: its wait completes it */
            k = s->started[t->id] = sim_collective_op(s, t, micro, 1);
        } else if (collective && in->early) { /* started in the step's last backward pass only; else its wait runs it */
            if (early) k = s->started[t->id] = sim_collective_op(s, t, micro, 1);
        } else if (collective && t->op == PDDE_OP_ALLTOALL && t->nsrc > 1) {
            k = sim_moe_exchange(s, t, micro);
        } else if (collective && in->bucket_members && t->phase == PDDE_PHASE_BACKWARD) { /* a micro-batch's bucket: its members wait */
            k = s->started[t->id] = sim_collective_op(s, t, micro, 1);
        } else if (collective) {
            k = sim_collective_op(s, t, micro, 0);
            if (in->bucket_members && k >= 0) s->started[t->id] = -2; /* (its members copy out) */
        } else if (t->op == PDDE_OP_COMM_WAIT) {
            const pdde_tensor *c = t->src[0];
            if (s->started[c->id] < 0) {
                k = sim_collective_op(s, c, micro, 0);
            } else {
                pdde_cost_op op;
                memset(&op, 0, sizeof op);
                op.kind = PDDE_COST_WAIT, op.phase = t->phase, op.micro = micro, op.last_use = -1, op.wait = s->started[c->id];
                sim_name(&op, t, micro);
                k = pdde_cost_program_add(s->cp, s->rank, &op);
                s->started[c->id] = -1;
            }
        } else if (t->op == PDDE_OP_SEND || t->op == PDDE_OP_RECV) {
            k = sim_p2p_op(s, t, micro);
        } else if ((t->op == PDDE_OP_CROSS_ENTROPY || t->op == PDDE_OP_CROSS_ENTROPY_BACK) && in->vocab_axis >= 0) {
            k = sim_vocab_ce(s, t, micro);
        } else if (pdde_tensor_numel(t) > 0) {
            k = sim_compute_op(s, t, micro);
        }
    }
    return k < 0 ? k : 0;
}

/* A phantom micro-batch's pass (uneven shares under ZeRO-2/3): what the executor runs of it, the
 * collectives over the shares' axis and the accumulations of what they bring (program_phantom_runs). */
static int sim_phantom_pass(sim_rank *s, int phase, int micro) {
    const pdde_program *P = s->P;
    int k = 0;
    for (int i = 0; i < P->n_order && k >= 0; i++) {
        const pdde_tensor *t = P->order[i];
        if ((int)t->phase != phase || !program_phantom_runs(P, t)) continue;
        k = t->op == PDDE_OP_GRAD_ACCUM ? sim_compute_op(s, t, micro) : sim_collective_op(s, t, micro, 0);
    }
    return k < 0 ? k : 0;
}

/* The cluster device id of the i-th device in the cluster's order (-1 past the end). */
static int sim_device_at(const pdde_cluster *c, int i) {
    for (int h = 0; h < c->n_machines; h++) {
        if (i < c->machines[h].n_devices) return c->machines[h].devices[i].id;
        i -= c->machines[h].n_devices;
    }
    return -1;
}

pdde_status pdde_cost_program_from_plan(const pdde_cluster *c, const pdde_graph *g, const pdde_session_params *params,
                                        const pdde_cost_plan *plan, pdde_cost_program **out) {
    if (!c || !g || !out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    pdde_cost_plan none = {0, NULL, NULL, 0};
    const pdde_cost_plan *pl = plan ? plan : &none;
    int world = pl->world_size > 0 ? pl->world_size : 0, R = world ? world : 1, nd = pdde_cluster_device_count(c);
    if (nd < 1) return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "cost: cluster \"%s\" has no devices", c->name);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    if (params) sp = *params;
    pdde_cost_program *cp = NULL;
    int *group_of = malloc((size_t)PDDE_MAX_MESH_DIMS * (size_t)R * sizeof *group_of), world_group = -1;
    pdde_status st = group_of ? pdde_cost_program_init(R, &cp) : PDDE_ERR_OOM;
    for (int i = 0; group_of && i < PDDE_MAX_MESH_DIMS * R; i++) group_of[i] = -1;
    if (!st && world) {
        int *all = malloc((size_t)R * sizeof *all);
        for (int r = 0; all && r < R; r++) all[r] = r;
        world_group = all ? pdde_cost_program_group(cp, R, all) : PDDE_ERR_OOM;
        free(all);
        if (world_group < 0) st = world_group;
    }
    for (int r = 0; r < R && !st; r++) {
        int dev = pl->rank_devices ? pl->rank_devices[r] : sim_device_at(c, nd >= R ? r : 0);
        if (!pdde_cluster_find_device(c, dev, NULL)) {
            st = pdde_error(g->ctx, PDDE_ERR_NOT_FOUND, "cost: rank %d runs on device %d, which cluster \"%s\" does not have", r, dev, c->name);
            break;
        }
        pdde_lower_params lp = program_lower_params(g, &sp, world, r);
        lp.host_busy = true; /* (a CPU rank takes its share of all the machine's cores, as the search prices it) */
        const pdde_cluster_device *cd = pdde_cluster_find_device(c, dev, NULL);
        /* the whole rank on its cluster device: lowering's fusions as that device's backend runs them (this host's
         * devices may be others); with layers placed on this host's devices, as they run them */
        if (!sp.n_layer_devices && cd->spec >= 0 && cd->spec < c->n_specs && c->specs[cd->spec].backend[0])
            lp.fusion_backend = c->specs[cd->spec].backend;
        pdde_program *P;
        if ((st = program_lower(g, &lp, &P))) break;
        program_memory mem;
        if (!(st = program_plan_memory(g->ctx, P, !sp.no_memory_reuse, &mem))) {
            st = pdde_cost_program_set_rank(cp, r, dev, (double)mem.stats.allocated_bytes + (double)mem.stats.transfer_bytes);
            program_memory_free(&mem);
        }
        sim_rank s = {cp, P, r, R, group_of, pl, malloc((size_t)(P->n ? P->n : 1) * sizeof(int))};
        if (!st && !s.started) st = PDDE_ERR_OOM;
        for (int i = 0; !st && i < P->n; i++) s.started[i] = -1;
        if (!st && P->n_micro + P->n_phantom > 1) {
            for (int i = 0; i < P->n_step && !st; i++)
                st = P->step[i].phantom ? sim_phantom_pass(&s, (int)P->step[i].phase, P->step[i].micro)
                                        : sim_pass(&s, (int)P->step[i].phase, P->step[i].micro, P->step[i].chunk, P->step[i].early);
        } else if (!st) {
            st = sim_pass(&s, -1, 0, -1, true);
        }
        if (!st && world) { /* the step's loss: mean and count, allreduced over the world */
            pdde_cost_op op;
            memset(&op, 0, sizeof op);
            op.kind = PDDE_COST_COLLECTIVE, op.phase = PDDE_PHASE_OPTIMIZER, op.micro = -1, op.last_use = -1, op.group = world_group;
            op.coll = PDDE_COLL_ALLREDUCE, op.algo = PDDE_ALGO_AUTO, op.dtype = PDDE_F32, op.count = 2;
            snprintf(op.name, sizeof op.name, "loss allreduce");
            int k = pdde_cost_program_add(cp, r, &op);
            if (k < 0) st = k;
        }
        free(s.started);
        program_free(P);
        if (st == PDDE_ERR_OOM) st = pdde_error(g->ctx, st, "cost: out of memory");
    }
    free(group_of);
    if (st) {
        pdde_cost_program_free(cp);
        return st;
    }
    *out = cp;
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Plans of the search, simulated (pdde_plan_params.cluster and .build) */

/* A placed plan's devices, for lowering g here and timing it on the cluster: layer_devices[l] is this
 * process's first device of the plan's backend for the layers it places (else -1, the rank's own), and
 * local[] maps that local device to the cluster's device of that backend on the machine of cluster
 * device rank_device (both malloc'ed). */
static pdde_status sim_placement(const pdde_graph *g, const pdde_cluster *c, const pdde_plan *plan, int rank_device, int **layer_devices,
                                 int *n_layers, int **local, int *n_local) {
    int here = pdde_device_find(g->ctx, plan->place, 0), machine = -1, there = -1, L = 0;
    if (here < 0) return pdde_error(g->ctx, PDDE_ERR_NOT_FOUND, "no %s device in this process", plan->place);
    pdde_cluster_find_device(c, rank_device, &machine);
    const pdde_cluster_machine *m = machine >= 0 ? &c->machines[machine] : NULL;
    for (int i = 0; m && i < m->n_devices && there < 0; i++)
        if (!strcmp(c->specs[m->devices[i].spec].backend, plan->place)) there = m->devices[i].id;
    if (there < 0) return pdde_error(g->ctx, PDDE_ERR_NOT_FOUND, "no %s device on the machine of cluster device %d", plan->place, rank_device);
    for (int i = 0; i < g->n; i++) L = g->nodes[i]->layer + 1 > L ? g->nodes[i]->layer + 1 : L;
    int *d = malloc((size_t)(L > 0 ? L : 1) * sizeof *d), *map = malloc((size_t)(here + 1) * sizeof *map);
    if (!d || !map) {
        free(d), free(map);
        return pdde_error(g->ctx, PDDE_ERR_OOM, "plan: out of memory");
    }
    for (int l = 0; l < L; l++) d[l] = pdde_plan_layer_on_device(plan, L, l) ? here : -1;
    for (int i = 0; i < here; i++) map[i] = -1;
    map[here] = there;
    *layer_devices = d, *n_layers = L, *local = map, *n_local = here + 1;
    return PDDE_OK;
}

pdde_status pdde_plan_cost_program(const pdde_cluster *c, const pdde_graph *g, const pdde_plan *plan, const int *rank_devices,
                                   pdde_cost_program **out) {
    if (!c || !g || !plan || !out) return g ? pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan_cost_program: an argument is NULL") : PDDE_ERR_INVALID_ARG;
    int n = plan->dp * plan->tp * plan->pp;
    pdde_cost_plan cpl = {n > 1 ? n : 0, rank_devices, NULL, 0};
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    int *layer_devices = NULL, *local = NULL;
    pdde_status st = PDDE_OK;
    if (plan->place[0])
        st = sim_placement(g, c, plan, rank_devices ? rank_devices[0] : sim_device_at(c, 0), &layer_devices, &sp.n_layer_devices, &local,
                           &cpl.n_local_devices);
    sp.layer_devices = layer_devices, cpl.local_devices = local;
    if (!st) st = pdde_cost_program_from_plan(c, g, &sp, &cpl, out);
    free(layer_devices), free(local);
    return st;
}

PDDE_PRIVATE pdde_status plan_simulate(pdde_graph *g, const pdde_plan_devices *d, const pdde_plan_params *pp, const int *dev,
                                       pdde_plan *plan) {
    pdde_context *ctx = g->ctx;
    const pdde_cluster *c = pp->cluster;
    int n = plan->dp * plan->tp * plan->pp, nd = pdde_cluster_device_count(c);
    int *rank_devices = malloc((size_t)n * sizeof *rank_devices);
    pdde_graph *pg = NULL;
    pdde_cost_program *cp = NULL;
    pdde_cost_result *r = NULL;
    pdde_status st = rank_devices ? pdde_graph_init(ctx, &pg) : pdde_error(ctx, PDDE_ERR_OOM, "plan: out of memory");
    for (int k = 0; !st && k < n; k++)
        rank_devices[k] = sim_device_at(c, d->cluster_device ? d->cluster_device[dev[k]] : nd == d->n_devices ? dev[k] : 0);
    if (!st && (st = pp->build(pg, plan, pp->build_user))) {
        char s[160];
        pdde_plan_str(plan, s, sizeof s);
        st = pdde_error(ctx, st, "plan %s: building its graph: %s", s, pdde_last_error(ctx));
    }
    if (!st && (st = pdde_plan_cost_program(c, pg, plan, rank_devices, &cp)) == PDDE_ERR_NOT_FOUND && plan->place[0]) {
        /* (sim_placement's: no such device here or on that machine; the plan is out, not the search) */
        snprintf(plan->why, sizeof plan->why, "place=%s: simulated where this process and the cluster's machine have such a device; here: %s",
                 plan->place, pdde_last_error(ctx));
        plan->step_s = DBL_MAX, plan->peak_device = -1;
        free(rank_devices);
        pdde_graph_free(pg);
        return PDDE_OK;
    }
    if (!st) st = pdde_cost_simulate(ctx, c, cp, &r);
    if (!st) {
        plan->step_s = r->step_time, plan->bubble_s = 0, plan->peak_bytes = 0, plan->peak_device = -1, plan->why[0] = 0;
        for (int k = 0; k < n; k++) {
            if (r->idle[k] > plan->bubble_s) plan->bubble_s = r->idle[k];
            if (r->peak_memory[k] > plan->peak_bytes) plan->peak_bytes = r->peak_memory[k], plan->peak_device = dev[k];
            if (r->peak_memory[k] > d->memory[dev[k]] && !plan->why[0])
                snprintf(plan->why, sizeof plan->why, "out of memory on device %d (rank %d) by %.2f GiB (simulated)", dev[k], k,
                         (r->peak_memory[k] - d->memory[dev[k]]) / 1073741824.0);
        }
    }
    pdde_cost_result_free(r);
    pdde_cost_program_free(cp);
    pdde_graph_free(pg);
    free(rank_devices);
    return st;
}
