/* planner/moe_cost.c — the cost model of a Mixture-of-Experts layer under expert parallelism, and the
 * choice of the ep degree (pdde.h "Mixture-of-Experts cost"). What ep changes, per rank and step, over
 * the MoE layers: the token exchange (an all-to-all before and after the experts, forward and
 * backward: tokens x k x width x dtype each, the (ep-1)/ep of it that leaves the rank, over the
 * cluster's links: each pair's share over its own link, a machine's NIC shared by every group's flows
 * through it), the experts' grouped GEMMs (rated by the device's GEMM curve at the rows one expert
 * gets, which ep multiplies; the busiest rank paces the step: its share of a measured or stated
 * routing skew; CPU ranks share their machine's cores), and the experts' parameters, gradients and
 * AdamW state (split over ep; the optimizer state over dp too with ZeRO-1, the gradients with ZeRO-2,
 * all with ZeRO-3) and their gradients' reduction over the dp replicas (less with more ep: fewer
 * experts a rank), with ZeRO-3 each layer's parameter gathers as lowering runs them (prefetched or
 * not). The dense part of the model is the same for every ep and is left out. Included by pdde.c
 * after cost.c. */
#include "planner_impl.h"

#include <math.h>

/* The busiest rank's tokens over the mean, when E experts in runs of E/ep per rank get counts[] (or, with
 * no counts, the busiest expert gets skew x the mean and the others share the rest evenly). */
static double moe_rank_imbalance(const pdde_moe_cost_params *p, int ep) {
    int E = p->experts, per = E / ep;
    if (p->counts) {
        double total = 0, most = 0;
        for (int e = 0; e < E; e++) total += p->counts[e];
        for (int r = 0; r < ep; r++) {
            double load = 0;
            for (int e = r * per; e < (r + 1) * per; e++) load += p->counts[e];
            most = load > most ? load : most;
        }
        return total > 0 ? most / (total / ep) : 1.0;
    }
    double s = p->skew >= 1 ? p->skew : 1.0;
    if (s > E) s = E;
    double rest = E > 1 ? ((double)E - s) / (E - 1) : 0; /* each other expert, in means */
    return (s + (per - 1) * rest) / per;
}

/* A collective run by G groups of S ranks at once, group g's i-th rank members[g * S + i] (count
 * elements of dtype each, as pdde_cost_collective_time takes them): group 0's time as
 * pdde_cost_collective_time gives it (its calibration, its algorithm, each flow at its link's rate),
 * or, where the groups together send more through one machine's NIC than that takes in the time, the
 * NIC's time for all of it. What a machine sends out: in an all-to-all, each member's chunks to
 * peers on other machines; in an allreduce spanning H machines, 2 (H-1)/H of the buffer a machine
 * (two-level or ring, bandwidth-optimal across machines); a reduce-scatter or allgather half that.
 * Where a machine's intra link is a shared resource (a link group: a CPU's memory), the groups' flows
 * run at once on it, step by step, and take longer than one group alone when they do. */
static double moe_groups_time(pdde_context *ctx, const pdde_cluster *c, pdde_collective coll, const int *members, int G, int S, int64_t count,
                              pdde_dtype dtype) {
    if (S < 2 || count <= 0) return 0;
    double t = pdde_cost_collective_time(ctx, c, coll, PDDE_ALGO_AUTO, members, S, count, dtype);
    double bytes = (double)count * (double)pdde_dtype_size(dtype);
    int shared = 0; /* a machine whose devices' links share one resource (a CPU's memory: its intra link's group) */
    for (int m = 0; m < c->n_machines; m++) shared |= c->machines[m].intra.group >= 0;
    if (isfinite(t) && G > 1 && shared) { /* every group's flows at once, step by step (pairwise all-to-all or ring) */
        double tc = cost_groups_at_once(ctx, c, coll == PDDE_COLL_ALLTOALL, members, G, S, coll == PDDE_COLL_ALLREDUCE ? 2 * (S - 1) : S - 1, bytes / S);
        t = isfinite(tc) ? (tc > t ? tc : t) : NAN;
    }
    if (!isfinite(t) || c->n_machines < 2) return t;
    double *out = calloc((size_t)c->n_machines, sizeof *out);
    int *mach = malloc((size_t)S * sizeof *mach);
    if (!out || !mach) {
        free(out), free(mach);
        pdde_error(ctx, PDDE_ERR_OOM, "moe cost: out of memory");
        return NAN;
    }
    for (int g = 0; g < G; g++) {
        int spans = 0;
        for (int i = 0; i < S; i++) {
            mach[i] = -1;
            pdde_cluster_find_device(c, members[(size_t)g * S + i], &mach[i]);
            int first = 1;
            for (int j = 0; j < i; j++) first &= mach[j] != mach[i];
            spans += first;
        }
        for (int i = 0; i < S; i++) {
            if (mach[i] < 0) continue;
            int first = 1, others = 0;
            for (int j = 0; j < S; j++) first &= j >= i || mach[j] != mach[i], others += mach[j] != mach[i];
            if (coll == PDDE_COLL_ALLTOALL) out[mach[i]] += bytes / S * others;
            else if (first && spans > 1) out[mach[i]] += (coll == PDDE_COLL_ALLREDUCE ? 2.0 : 1.0) * bytes * (spans - 1) / spans;
        }
    }
    for (int m = 0; m < c->n_machines; m++)
        if (c->machines[m].nic.bandwidth > 0 && out[m] / c->machines[m].nic.bandwidth > t) t = out[m] / c->machines[m].nic.bandwidth;
    free(out), free(mach);
    return t;
}

PDDE_PRIVATE int moe_a2a_hier_mode(void) { return pdde_env_bool("PDDE_COMM_A2A_HIER", -1); }

/* The token exchange of G groups of S ranks (count elements a rank), as the communicator runs it
 * (comm/alltoall_hier.c): flat, or, where each group spans H > 1 machines with L > 1 of its ranks on
 * each and the comm picks it (mode: moe_a2a_hier_mode, 1, or -1 and a pair's mean message within
 * PDDE_COMM_A2A_HIER_BYTES(H, L)), hierarchical: the counts (H integers a pair) and an all-to-all of
 * everything within each machine at its intra link's rate, then an all-to-all among the ranks of
 * one local index across machines (H-1 messages L times larger: the same bytes through each NIC, L
 * times fewer messages), and two copies of a rank's bytes (packing by local index, the transpose
 * between the stages) at the device's copy rate. varying: an alltoallv, whose automatic choice
 * the ranks first agree on (an allreduce of one integer, paid whichever form it picks). *hier = 1
 * where it priced the hierarchical form. */
static double moe_alltoall_time(pdde_context *ctx, const pdde_cluster *c, const int *members, int G, int S, int64_t count, pdde_dtype dtype,
                                int varying, int mode, int *hier) {
    *hier = 0;
    double t = moe_groups_time(ctx, c, PDDE_COLL_ALLTOALL, members, G, S, count, dtype);
    if (!isfinite(t) || S < 4 || count <= 0 || !mode) return t;
    /* group 0's machines, in order of first appearance, and its ranks on each */
    int *mach = malloc((size_t)S * sizeof *mach), *seen = calloc((size_t)S, sizeof *seen), *host = malloc((size_t)S * sizeof *host);
    int *local = malloc((size_t)G * S * sizeof *local), *cross = malloc((size_t)G * S * sizeof *cross);
    int H = 0, L = 0, ok = mach && seen && host && local && cross;
    for (int i = 0; i < S && ok; i++) {
        mach[i] = -1;
        pdde_cluster_find_device(c, members[i], &mach[i]);
        host[i] = -1;
        for (int j = 0; j < i && host[i] < 0; j++)
            if (mach[j] == mach[i]) host[i] = host[j];
        if (host[i] < 0) host[i] = H++;
        seen[host[i]]++;
    }
    L = ok ? seen[0] : 0;
    for (int h = 0; h < H && ok; h++) ok &= seen[h] == L;
    ok &= H > 1 && L > 1;
    double esz = (double)pdde_dtype_size(dtype), mean = (double)count * esz / S;
    if (ok && (mode > 0 || mean <= PDDE_COMM_A2A_HIER_BYTES(H, L))) {
        /* every group laid out as group 0: local groups (G H of L), cross groups (G L of H) */
        for (int g = 0; g < G; g++) {
            memset(seen, 0, (size_t)H * sizeof *seen);
            for (int i = 0; i < S; i++) {
                int h = host[i], j = seen[h]++, id = members[(size_t)g * S + i];
                local[((size_t)g * H + h) * L + j] = id;
                cross[((size_t)g * L + j) * H + h] = id;
            }
        }
        double tl = moe_groups_time(ctx, c, PDDE_COLL_ALLTOALL, local, G * H, L, count, dtype);
        double tx = moe_groups_time(ctx, c, PDDE_COLL_ALLTOALL, cross, G * L, H, count, dtype);
        double tn = moe_groups_time(ctx, c, PDDE_COLL_ALLTOALL, local, G * H, L, (int64_t)H * L, PDDE_I64);
        pdde_cost_op copy = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_ELEMENTWISE, .dtype = dtype, .bytes = 4.0 * (double)count * esz};
        double tc = pdde_cost_compute_time(ctx, c, members[0], &copy) * cost_core_sharing(c, members, G * S, PDDE_OPCLASS_ELEMENTWISE);
        t = tl + tx + tn + tc, *hier = 1;
    }
    if (ok && varying && mode < 0) /* the agreement on the choice, paid whichever form it picks */
        t += pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, members, S, 1, PDDE_I64);
    free(mach), free(seen), free(host), free(local), free(cross);
    return t;
}

/* How lowering runs ZeRO-3's gathers on these ranks' devices, as the search decides it: prefetched where
 * lower_prefetch_on_backend says so for every device's backend, regathered for backward unless PDDE_ZERO3_REGATHER=0. Reads the environment: once a run of
 * devices of one spec. */
static plan_zero3_gathers moe_zero3_gathers(const pdde_cluster *c, const int *devices, int n_ranks) {
    plan_zero3_gathers z = {.prefetched = true, .regathered = lower_regather_on()};
    for (int r = 0, last = -1; r < n_ranks && z.prefetched; r++) {
        const pdde_cluster_device *d = pdde_cluster_find_device(c, devices[r], NULL);
        if (!d || d->spec == last || d->spec < 0 || d->spec >= c->n_specs) continue;
        const char *backend = c->specs[last = d->spec].backend;
        z.prefetched = lower_prefetch_on_backend(backend);
    }
    return z;
}

/* pdde_moe_cost_estimate with ZeRO-3's gathers run as `gathers` says, the exchange's form as a2a_hier
 * (moe_a2a_hier_mode). */
static pdde_status moe_cost_estimate(pdde_context *ctx, const pdde_cluster *c, const int *devices, int n_ranks, const pdde_moe_cost_params *p,
                                     int ep, plan_zero3_gathers gathers, int a2a_hier, pdde_moe_cost *out) {
    memset(out, 0, sizeof *out);
    if (!c || !devices || !p || n_ranks < 1)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "moe cost: a cluster, %d devices and the layer's parameters are needed", n_ranks);
    if (p->experts < 1 || p->topk < 1 || p->topk > p->experts || p->width < 1 || p->ffn < 1 || p->layers < 1 || p->tokens < 1)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "moe cost: %d experts, top-%d (1..experts), width %d, ffn %d, %d layers, %lld tokens: each >= 1",
                          p->experts, p->topk, p->width, p->ffn, p->layers, (long long)p->tokens);
    if (ep < 1 || n_ranks % ep || p->experts % ep)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "moe cost: ep %d must divide the %d ranks and the %d experts", ep, n_ranks, p->experts);
    if (p->zero < 0 || p->zero > 3 || (unsigned)p->dtype >= PDDE_DTYPE_COUNT)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "moe cost: ZeRO stage %d (0..3), dtype %d", p->zero, p->dtype);
    int dp = n_ranks / ep, E = p->experts, per = E / ep;
    double C = p->width, F = p->ffn, k = p->topk, esz = (double)pdde_dtype_size(p->dtype);
    double tokens = (double)p->tokens / n_ranks; /* this rank's */
    /* rows each rank sends in one exchange: its tokens' k choices (dropless: the routed rows only, the
     * counts first; a capacity only drops some) */
    double rows = tokens * k;
    /* pdde's buffer by expert (ep > 1): S rows a local expert, ep x a rank's tokens dropless (every
     * token of the group might choose it), else its share of the capacity */
    double S = ep * tokens;
    if (p->capacity_factor > 0 && ep * rows * p->capacity_factor / E < S) S = ep * rows * p->capacity_factor / E;
    out->ep = ep;
    out->imbalance = moe_rank_imbalance(p, ep);
    /* CPU ranks beyond their machine's cores: their collectives at cores / ranks of the calibration's
     * rate (its copies are the ranks' own work, and a rank waits for peers that need a core to arrive) */
    double over = cost_rank_oversubscription(c, devices, n_ranks);
    /* 4 exchanges a layer (dispatch and combine, forward and backward); what leaves the rank */
    out->alltoall_bytes = 4.0 * p->layers * rows * C * esz * (ep - 1) / ep;
    /* the ep groups: ep consecutive ranks each (dp outer), all exchanging at once */
    if (ep > 1) {
        int hier_counts = 0;
        double t = moe_alltoall_time(ctx, c, devices, dp, ep, (int64_t)(rows * C), p->dtype, 1, a2a_hier, &out->alltoall_hier);
        if (!isfinite(t)) return pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe cost: the alltoall over %d ranks: %s", ep, pdde_last_error(ctx));
        /* each exchange sends the counts first (E/ep integers a peer) and packs and unpacks its rows
         * on the host (a copy of the rows each way), zeroing its padded output first (the buffer by
         * expert: S rows a local expert, below) */
        double tc = moe_alltoall_time(ctx, c, devices, dp, ep, per > 0 ? per : 1, PDDE_I32, 0, a2a_hier, &hier_counts);
        pdde_cost_op copy = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_ELEMENTWISE, .dtype = p->dtype,
                             .bytes = 4.0 * rows * C * esz + per * S * C * esz};
        double tp = pdde_cost_compute_time(ctx, c, devices[0], &copy) * cost_core_sharing(c, devices, n_ranks, PDDE_OPCLASS_ELEMENTWISE);
        if (!isfinite(tc) || !isfinite(tp)) return pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe cost: the exchange's counts or copies: %s", pdde_last_error(ctx));
        out->alltoall_s = 4.0 * p->layers * ((t + tc) * over + tp);
        /* the share of a rank's exchanged bytes that crosses machines (its peers elsewhere: each gets
         * as many); the most of any rank */
        for (int r = 0; r < n_ranks; r++) {
            int m = -1, cross = 0, g0 = r / ep * ep;
            pdde_cluster_find_device(c, devices[r], &m);
            for (int q = g0; q < g0 + ep; q++) {
                int mq = -1;
                pdde_cluster_find_device(c, devices[q], &mq);
                cross += mq != m;
            }
            if ((double)cross / (ep - 1) > out->cross_host_share) out->cross_host_share = (double)cross / (ep - 1);
        }
    }
    /* the busiest rank's expert GEMMs: its rows (the mean, tokens x k, times the imbalance; at most
     * the capacity), per local expert; forward 2 GEMMs, backward 4. CPU ranks sharing cores: the
     * others, done first, wait at the exchange and hand their cores over, so the busiest takes the
     * longer of its own GEMMs alone and every rank's (the mean's) at their share of the cores */
    double rank_rows = tokens * k * out->imbalance;
    if (p->capacity_factor > 0 && rank_rows > rows * p->capacity_factor) rank_rows = rows * p->capacity_factor;
    double m = rank_rows / per > 1 ? rank_rows / per : 1;
    pdde_cost_op op = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = (int64_t)m, .n = p->ffn, .k = p->width,
                       .dtype = p->compute_dtype, .gemms = per}; /* (all the rank's experts: one grouped GEMM) */
    op.flops = 2.0 * per * m * C * F;
    double share = cost_core_sharing(c, devices, n_ranks, PDDE_OPCLASS_GEMM), t1 = pdde_cost_compute_time(ctx, c, devices[0], &op);
    if (share > 1 && out->imbalance > 1) {
        pdde_cost_op mean = op;
        mean.m = (int64_t)(rows / per > 1 ? rows / per : 1), mean.flops = 2.0 * per * (double)mean.m * C * F;
        double tm = pdde_cost_compute_time(ctx, c, devices[0], &mean) * share;
        t1 = tm > t1 ? tm : t1;
    } else {
        t1 *= share;
    }
    if (!isfinite(t1)) return pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe cost: the expert GEMM: %s", pdde_last_error(ctx));
    out->expert_gemm_s = p->layers * 6.0 * t1;
    /* the passes over the experts' rows beside the GEMMs, a layer: the activation (forward: 2 x its
     * [rows, F], backward 3 x; on its own curve where measured). ep 1 keeps the routed rows in one
     * block; ep > 1 the buffer by expert, padded with zeros: each [., C] buffer (X) and [., F]
     * buffer (H) is zeroed (4 X: the dispatch, the combine's backward, 2 GEMMs' outputs; 2 H: the
     * other GEMMs' outputs; the exchanges' above) or scanned row by row for its routed rows, a row
     * reduction (3 X and 3 H: the GEMMs' inputs, their weight gradients') */
    double csz = (double)pdde_dtype_size(p->compute_dtype);
    double bx = ep > 1 ? per * S * C * csz : 0, bh = ep > 1 ? per * S * F * csz : rank_rows * F * csz;
    double passes[][3] = {{1, 2 * bh, PDDE_OPCLASS_GELU},     {1, 3 * bh, PDDE_OPCLASS_GELU}, {4, bx, PDDE_OPCLASS_ELEMENTWISE},
                          {2, bh, PDDE_OPCLASS_ELEMENTWISE}, {3, bx, PDDE_OPCLASS_ROW},      {3, bh, PDDE_OPCLASS_ROW}};
    for (int i = 0; i < (ep > 1 ? 6 : 2); i++) { /* (ops, bytes of one, class); ep 1: the first two */
        int cls = (int)passes[i][2];
        pdde_cost_op pass = {.kind = PDDE_COST_COMPUTE, .op_class = cls, .dtype = p->compute_dtype, .bytes = passes[i][1]};
        double t = pdde_cost_compute_time(ctx, c, devices[0], &pass) * cost_core_sharing(c, devices, n_ranks, cls);
        if (!isfinite(t)) return pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe cost: the experts' buffers: %s", pdde_last_error(ctx));
        out->expert_buffer_s += p->layers * passes[i][0] * t;
    }
    /* the efficiency of those GEMMs against one of the rank's whole rows (the dense layer's shape) */
    pdde_cost_op dense = op;
    dense.m = (int64_t)(tokens * k > 1 ? tokens * k : 1), dense.flops = 2.0 * (double)dense.m * C * F;
    double td = pdde_cost_compute_time(ctx, c, devices[0], &dense) * cost_core_sharing(c, devices, n_ranks, PDDE_OPCLASS_GEMM);
    out->gemm_efficiency = td > 0 && t1 > 0 ? (op.flops / t1) / (dense.flops / td) : 1.0;
    /* memory: parameters (f32), gradients (f32), AdamW m and v (2 x f32), of the rank's experts */
    double params = (double)p->layers * per * 2.0 * C * F;
    double shard_opt = p->zero >= 1 ? dp : 1, shard_grad = p->zero >= 2 ? dp : 1, shard_param = p->zero >= 3 ? dp : 1;
    out->expert_param_bytes = 4.0 * params / shard_param + 4.0 * params / shard_grad;
    /* ZeRO-3: the experts gathered whole where they are used: a layer's at a time (regathered for
     * backward), the next layer's too while its prefetch is in flight; else every layer's from its
     * forward to its backward */
    if (p->zero >= 3 && dp > 1)
        out->expert_param_bytes += 4.0 * (gathers.regathered ? fmin(gathers.prefetched ? 2 : 1, p->layers) * params / p->layers : params);
    out->expert_optimizer_bytes = 8.0 * params / shard_opt;
    const pdde_cluster_device *d = pdde_cluster_find_device(c, devices[0], NULL);
    double budget = p->memory_budget > 0 ? p->memory_budget : d ? (double)d->memory : 0;
    out->fits = budget <= 0 || out->expert_param_bytes + out->expert_optimizer_bytes <= budget;
    /* the experts' gradients over their dp replicas (ranks r, r + ep, ...; the ep such groups at
     * once): an allreduce (ZeRO 0, 1), a reduce-scatter (2), and with ZeRO-3 each layer's parameters
     * gathered for its forward and again for its backward */
    if (dp > 1) {
        int *group = malloc((size_t)n_ranks * sizeof *group);
        if (!group) return pdde_error(ctx, PDDE_ERR_OOM, "moe cost: out of memory");
        for (int r = 0; r < ep; r++)
            for (int i = 0; i < dp; i++) group[r * dp + i] = devices[i * ep + r];
        int64_t count = (int64_t)params;
        double t = moe_groups_time(ctx, c, p->zero >= 2 ? PDDE_COLL_REDUCE_SCATTER : PDDE_COLL_ALLREDUCE, group, ep, dp, count,
                                   PDDE_F32); /* (a reduce-scatter's count: its input) */
        double g = p->zero >= 3 ? moe_groups_time(ctx, c, PDDE_COLL_ALLGATHER, group, ep, dp, count / p->layers, PDDE_F32) * over : 0;
        free(group);
        if (!isfinite(t) || !isfinite(g))
            return pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe cost: the experts' gradients over %d replicas: %s", dp, pdde_last_error(ctx));
        /* the gathers, 2 a layer, blocking; prefetched (lowering's lower_zero3_prefetch) a layer's travel
         * while the layer before it in the pass computes: the first layer's of each pass wait whole, the
         * others where they outlast that compute. The compute: the layer's experts (GEMMs and buffer
         * passes; forward 2 of its 6 GEMMs, backward 4), not its exchanges (they wait for the
         * communication stream the gather holds); the dense part, left out here, would hide more */
        double gathers_s = 2.0 * p->layers * g;
        if (gathers.prefetched && g > 0) {
            double layer = (out->expert_gemm_s + out->expert_buffer_s) / p->layers, fwd = layer / 3, bwd = layer - fwd;
            gathers_s = 2 * g + (p->layers - 1) * (fmax(0, g - fwd) + fmax(0, g - bwd));
        }
        out->dp_sync_s = t * over + gathers_s;
    }
    if (ep > 1 && p->grads_over_ep) {
        double t = moe_groups_time(ctx, c, PDDE_COLL_REDUCE_SCATTER, devices, dp, ep, (int64_t)(params * ep), PDDE_F32);
        if (!isfinite(t)) return pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe cost: the experts' gradients over the ep group: %s", pdde_last_error(ctx));
        out->dp_sync_s += t * over;
    }
    out->step_s = out->alltoall_s + out->expert_gemm_s + out->expert_buffer_s + out->dp_sync_s;
    return PDDE_OK;
}

pdde_status pdde_moe_cost_estimate(pdde_context *ctx, const pdde_cluster *c, const int *devices, int n_ranks,
                                   const pdde_moe_cost_params *p, int ep, pdde_moe_cost *out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_moe_cost_estimate: no out");
    plan_zero3_gathers gathers = {false, true};
    if (c && devices && p && p->zero >= 3 && n_ranks > 1) gathers = moe_zero3_gathers(c, devices, n_ranks);
    return moe_cost_estimate(ctx, c, devices, n_ranks, p, ep, gathers, moe_a2a_hier_mode(), out);
}

pdde_status pdde_moe_choose_ep(pdde_context *ctx, const pdde_cluster *c, const int *devices, int n_ranks, const pdde_moe_cost_params *p,
                               pdde_moe_cost *best, pdde_moe_cost *all, int max_all, int *n_all) {
    if (!best) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_moe_choose_ep: no best");
    memset(best, 0, sizeof *best);
    if (n_all) *n_all = 0;
    int found = 0;
    for (int ep = 1; ep <= n_ranks && p && ep <= p->experts; ep++) {
        if (n_ranks % ep || p->experts % ep) continue;
        pdde_moe_cost m;
        pdde_status st = pdde_moe_cost_estimate(ctx, c, devices, n_ranks, p, ep, &m);
        if (st) return st;
        if (all && n_all && *n_all < max_all) all[(*n_all)++] = m;
        /* the fastest that fits; while none fits, the smallest memory */
        bool better = !found || (m.fits && !best->fits) ||
                      (m.fits == best->fits && (m.fits ? m.step_s < best->step_s
                                                       : m.expert_param_bytes + m.expert_optimizer_bytes <
                                                             best->expert_param_bytes + best->expert_optimizer_bytes));
        if (better) *best = m, found = 1;
    }
    if (!found) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "moe choose ep: no parameters, or no ep divides %d ranks and the experts", n_ranks);
    return best->fits ? PDDE_OK
                      : pdde_error(ctx, PDDE_ERR_NO_PLAN, "moe choose ep: the experts need %.3g GB a rank at best (ep %d), more than a device holds",
                                   (best->expert_param_bytes + best->expert_optimizer_bytes) / 1e9, best->ep);
}

/* ---- the planner search's MoE part ---- */

PDDE_PRIVATE int plan_moe_params(const pdde_graph *g, pdde_moe_cost_params *p) {
    *p = (pdde_moe_cost_params)PDDE_MOE_COST_PARAMS_INIT;
    for (int i = 0; g && i < g->n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if (t->op == PDDE_OP_MOE_TOPK && t->src[0]->ndim == 2) {
            p->layers++, p->tokens = t->shape[0], p->topk = (int)t->shape[1], p->experts = pdde_op_i32(t, PDDE_P_MOE_EXPERTS);
        }
        if (t->op == PDDE_OP_MOE_GROUPED_MATMUL && t->nsrc > 1 && t->src[1]->ndim == 3 && p->ffn == 0) { /* the first: x [.., C] w1 -> [.., F] */
            int tb = pdde_op_i32(t, PDDE_P_MOE_TRANS_B);
            p->width = (int)t->src[1]->shape[tb ? 2 : 1], p->ffn = (int)t->src[1]->shape[tb ? 1 : 2];
        }
        if (t->op == PDDE_OP_MOE_DISPATCH && pdde_op_i32(t, PDDE_P_MOE_CAPACITY) > 0 && p->tokens > 0 && p->topk > 0)
            p->capacity_factor = (float)((double)pdde_op_i32(t, PDDE_P_MOE_CAPACITY) * p->experts / ((double)p->tokens * p->topk));
    }
    return p->layers > 0 && p->ffn > 0 && p->width > 0 && p->experts > 1;
}

PDDE_PRIVATE pdde_status plan_moe_delta(pdde_context *ctx, const pdde_cluster *c, int n_plan_devices, const int *dev, int dp, int tp,
                                        const pdde_moe_cost_params *p, int ep, bool groups, plan_zero3_gathers gathers, int a2a_hier,
                                        double *step_s, double *bytes) {
    int n = dp * tp, nd = pdde_cluster_device_count(c);
    int *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return pdde_error(ctx, PDDE_ERR_OOM, "plan: out of memory");
    for (int k = 0; k < n; k++) { /* the cluster's devices in order (one device may stand for every rank) */
        int want = nd == n_plan_devices ? dev[k] : 0, seen = 0;
        ids[k] = -1;
        for (int m = 0; m < c->n_machines && ids[k] < 0; m++)
            for (int i = 0; i < c->machines[m].n_devices && ids[k] < 0; i++, seen++)
                if (seen == want) ids[k] = c->machines[m].devices[i].id;
    }
    /* ep over the dp axis: its experts' gradients summed over the ep group too (pdde's layout by expert
     * sums the rows where the tokens are split); over the tp axis (tp > 1 and not groups: ep = tp): not
     * (the tokens are whole there) */
    pdde_moe_cost_params q = *p, qe = *p;
    q.grads_over_ep = qe.grads_over_ep = tp == 1;
    if (tp > 1 && (groups || ep != tp)) {
        /* groups of ep of the dp ranks with each expert's hidden units over tp: a rank of each tp group
         * stands for it (same tokens; the exchange's peers are tp apart), with its share of the hidden
         * units (the reduction of the experts' outputs over tp is left out, as the dense layers' is) */
        for (int k = 0; k < dp; k++) ids[k] = ids[k * tp];
        n = dp, q.grads_over_ep = qe.grads_over_ep = 1, qe.ffn = p->ffn / tp > 0 ? p->ffn / tp : 1;
    }
    pdde_moe_cost one, with;
    pdde_status st = moe_cost_estimate(ctx, c, ids, n, &q, 1, gathers, a2a_hier, &one);
    if (!st) st = moe_cost_estimate(ctx, c, ids, n, &qe, ep, gathers, a2a_hier, &with);
    free(ids);
    if (st) return st;
    *step_s = with.step_s - one.step_s;
    *bytes = with.expert_param_bytes + with.expert_optimizer_bytes - one.expert_param_bytes - one.expert_optimizer_bytes;
    return PDDE_OK;
}
