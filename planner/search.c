/* planner/search.c — the global planner: chooses how to run a layered model on a set of devices.
 *
 * It enumerates the data / tensor / pipeline degrees, two layouts of the ranks on the devices (pp
 * innermost, or a block of devices per stage), micro-batch counts, interleaved stages, ZeRO stages,
 * f32 or bf16 collectives, recompute per layer and (devices of different speeds) uneven
 * data-parallel shares, cuts the layers into pipeline stages sized by each
 * stage's devices (speed and memory), predicts every candidate's step time and per-device memory, and
 * returns the fastest plans that fit with the rejected ones and why. It reads the symbolic graph
 * through the public API only (a 260B-parameter model is a few thousand nodes of metadata) and
 * allocates no tensor data. pdde_plan_auto wraps it for a cluster object.
 *
 * The estimate is analytic, per layer, so that thousands of candidates on thousands of devices are
 * ranked in seconds:
 *   - work per layer from the graph: GEMM FLOPs, memory traffic of the other ops, parameters,
 *     activations kept for backward (what the backward nodes read, when the graph has them), bytes
 *     crossing to later layers, tensor-parallel reductions;
 *   - a stage's time per micro-batch: forward + backward (its own nodes' work when the graph has
 *     them, else twice the forward) + forward again of the layers it recomputes, on its slowest
 *     device (FLOP/s for GEMMs, B/s for the rest, half of which tensor parallelism does not split, at
 *     least the device's op latency per op: what makes many small micro-batches slow),
 *     tensor-parallel allreduces and stage-crossing sends on alpha-beta links (within or across
 *     hosts, as the ranks fall; collectives in bf16 carry half the bytes and cast on each side);
 *   - 1F1B: step = (m + (p - 1) / v) * max over stages of (per-micro time + the stage's gradient
 *     reduction and optimizer update spread over those slots; ZeRO-1/2 gather each updated shard
 *     back, one allgather per parameter tensor);
 *   - memory per device: parameters, gradients, AdamW state (each divided by dp as the ZeRO stage
 *     says), activations of the micro-batches the schedule keeps alive (of a recomputed layer its
 *     outputs only, plus the stage's largest layer while it is recomputed).
 * Stage boundaries come from a dynamic program that minimises the slowest stage exactly (each
 * stage's cost grows with its range, the prefix optimum with the prefix, so the split point is found
 * by bisection: O(stages x layers x log layers) per candidate). A stage recomputes the fewest of its
 * first layers that make it fit (more recomputed never needs more memory, so bisection finds them);
 * that is the fastest choice for the stage, so the recompute dimension folds into the DP. Where every
 * rank has a second device (pdde_plan_devices.place_*), one-stage plans are also tried with the middle
 * layers placed there: each part timed on its own device, the boundary activations and their
 * gradients copied over the link between them, each device's memory checked alone. What depends
 * only on the degrees and the layout (links, each stage's slowest device) is computed once for all
 * the rest, and a candidate whose GEMM work alone cannot beat the last plan kept is skipped. */

#include "planner_impl.h"

#include <float.h>

typedef struct {
    int n_layers;
    double *flops;   /* [L] forward GEMM FLOPs of the layer for the graph's whole batch */
    double *bytes;   /* [L] forward memory traffic of its other ops */
    double *params;  /* [L] parameter bytes */
    double *acts;    /* [L] activation bytes backward keeps */
    double *out;     /* [L] bytes of the layer's results read by later layers */
    double *tp_ar;   /* [L] bytes allreduced per forward under tensor parallelism */
    int *tp_n;       /* [L] allreduces per forward under tensor parallelism */
    double *ops;     /* [L] forward ops (each costs at least a device's op latency per micro-batch) */
    double *tensors; /* [L] parameter tensors (ZeRO-1/2 gathers each one back after its update) */
    /* [L] the same of the backward nodes, when the graph has them (else backward = 2 x forward) */
    double *bflops, *bbytes, *bops;
    /* for O(1) stage costs: prefix sums of the per-layer figures (PROF_* rows of L + 1) and sparse
     * tables of the largest layer activation and parameters over ranges of 2^j layers */
    double *prefix, *max_acts, *max_params;
} plan_profile;

enum { PROF_FLOPS, PROF_BYTES, PROF_PARAMS, PROF_ACTS, PROF_OUT, PROF_TP_AR, PROF_OPS, PROF_TENSORS, PROF_BFLOPS, PROF_BBYTES, PROF_BOPS, PROF_TP_N, PROF_COUNT };

static void plan_profile_free(plan_profile *p) {
    free(p->flops);
    free(p->tp_n);
    free(p->prefix);
}

/* The sum of figure q over layers [a, b). */
static double prof_sum(const plan_profile *p, int q, int a, int b) {
    const double *row = p->prefix + (size_t)q * (p->n_layers + 1);
    return row[b] - row[a];
}

/* The largest figure of a layer in [a, b) (b > a) from its sparse table. */
static double prof_max(const plan_profile *p, const double *table, int a, int b) {
    int j = 0;
    while ((2 << j) <= b - a) j++;
    const double *lv = table + (size_t)j * p->n_layers;
    return fmax(lv[a], lv[b - (1 << j)]);
}

static double prof_max_acts(const plan_profile *p, int a, int b) { return prof_max(p, p->max_acts, a, b); }

static pdde_status plan_profile_index(pdde_context *ctx, plan_profile *p) {
    int L = p->n_layers, levels = 1;
    while ((1 << levels) <= L) levels++;
    p->prefix = malloc(((size_t)PROF_COUNT * (L + 1) + 2 * (size_t)levels * L) * sizeof *p->prefix);
    if (!p->prefix) return pdde_error(ctx, PDDE_ERR_OOM, "plan: out of memory");
    p->max_acts = p->prefix + (size_t)PROF_COUNT * (L + 1);
    p->max_params = p->max_acts + (size_t)levels * L;
    const double *fig[PROF_COUNT - 1] = {p->flops, p->bytes, p->params, p->acts, p->out, p->tp_ar, p->ops, p->tensors, p->bflops, p->bbytes, p->bops};
    for (int q = 0; q < PROF_COUNT; q++) {
        double *row = p->prefix + (size_t)q * (L + 1);
        row[0] = 0;
        for (int l = 0; l < L; l++) row[l + 1] = row[l] + (q == PROF_TP_N ? (double)p->tp_n[l] : fig[q][l]);
    }
    double *tables[2] = {p->max_acts, p->max_params};
    const double *figs[2] = {p->acts, p->params};
    for (int k = 0; k < 2; k++) {
        double *tb = tables[k];
        memcpy(tb, figs[k], (size_t)L * sizeof *tb);
        for (int j = 1; j < levels; j++)
            for (int l = 0; l + (1 << j) <= L; l++) tb[(size_t)j * L + l] = fmax(tb[(size_t)(j - 1) * L + l], tb[(size_t)(j - 1) * L + l + (1 << (j - 1))]);
    }
    return PDDE_OK;
}

/* Layer l's work, read off the forward nodes. A layer's GEMMs with a weight parameter alternate
 * column- and row-parallel under Megatron tensor parallelism: every second one ends in an allreduce of
 * its output, and so does an embedding lookup (vocab parallel). */
static pdde_status plan_profile_build(pdde_graph *g, int n_layers, plan_profile *p) {
    memset(p, 0, sizeof *p);
    int n = g->n, L = 1;
    for (int i = 0; i < n && n_layers <= 0; i++) {
        const pdde_tensor *t = g->nodes[i];
        if (t->layer + 1 > L) L = t->layer + 1;
    }
    if (n_layers > 0) L = n_layers;
    p->n_layers = L;
    double *mem = calloc((size_t)L * 11, sizeof *mem);
    int *cnt = calloc((size_t)L * 2, sizeof *cnt);
    uint8_t *counted = calloc((size_t)n, 1);
    if (!mem || !cnt || !counted) {
        free(mem), free(cnt), free(counted);
        return pdde_error(g->ctx, PDDE_ERR_OOM, "plan: out of memory");
    }
    p->flops = mem, p->bytes = mem + L, p->params = mem + 2 * L, p->acts = mem + 3 * L, p->out = mem + 4 * L, p->tp_ar = mem + 5 * L, p->ops = mem + 6 * L, p->tensors = mem + 7 * L;
    p->bflops = mem + 8 * L, p->bbytes = mem + 9 * L, p->bops = mem + 10 * L;
    p->tp_n = cnt;
    int *weight_gemms = cnt + L;
    for (int i = 0; i < n; i++) {
        const pdde_tensor *t = g->nodes[i];
        int l = t->layer >= 0 && t->layer < L ? t->layer : 0;
        double nb = (double)pdde_tensor_nbytes(t);
        if (t->op == PDDE_OP_NONE) {
            if (t->flags & PDDE_TENSOR_PARAM) p->params[l] += nb, p->tensors[l] += 1;
            continue;
        }
        if (t->phase == PDDE_PHASE_BACKWARD && !(t->flags & PDDE_TENSOR_VIEW)) {
            p->bops[l] += 1;
            if (t->op == PDDE_OP_MATMUL) {
                const pdde_tensor *a = t->src[0];
                p->bflops[l] += 2.0 * (double)pdde_tensor_numel(t) * (double)(pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A) ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1]);
            } else if (t->op == PDDE_OP_ATTENTION_BACK) { /* (GEMM work, as the forward's) */
                p->bflops[l] += pdde_attention_flops(t);
            } else {
                p->bbytes[l] += nb;
                for (int k = 0; k < t->nsrc; k++) p->bbytes[l] += (double)pdde_tensor_nbytes(t->src[k]);
            }
        }
        if (t->phase != PDDE_PHASE_FORWARD) continue;
        if (!(t->flags & PDDE_TENSOR_VIEW)) p->acts[l] += nb, p->ops[l] += 1;
        /* mixed precision: an activation converted for a matmul is kept for backward in its 2-byte form
         * only (the f32 original, read by nothing else of the backward pass, is freed) */
        if (t->op == PDDE_OP_CAST && t->src[0]->op != PDDE_OP_NONE && pdde_dtype_size(t->dtype) < pdde_dtype_size(t->src[0]->dtype))
            p->acts[l] -= (double)pdde_tensor_nbytes(t->src[0]);
        if (t->op == PDDE_OP_MATMUL) {
            const pdde_tensor *a = t->src[0];
            int64_t k = pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A) ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
            p->flops[l] += 2.0 * (double)pdde_tensor_numel(t) * (double)k;
            if (t->src[1]->flags & PDDE_TENSOR_PARAM && ++weight_gemms[l] % 2 == 0) p->tp_ar[l] += nb, p->tp_n[l]++;
        } else if (t->op == PDDE_OP_ATTENTION) {
            p->flops[l] += pdde_attention_flops(t);
        } else if (!(t->flags & PDDE_TENSOR_VIEW)) {
            p->bytes[l] += nb;
            for (int k = 0; k < t->nsrc; k++) p->bytes[l] += (double)pdde_tensor_nbytes(t->src[k]);
            if (t->op == PDDE_OP_EMBEDDING) p->tp_ar[l] += nb, p->tp_n[l]++;
        }
        for (int k = 0; k < t->nsrc; k++) {
            const pdde_tensor *s = t->src[k];
            if (s->op == PDDE_OP_NONE || counted[s->id] || s->layer < 0 || s->layer >= t->layer || s->layer >= L) continue;
            counted[s->id] = 1;
            p->out[s->layer] += (double)pdde_tensor_nbytes(s);
        }
    }
    /* With its backward in the graph, a layer keeps what its backward nodes read of its forward
     * outputs (through views), not every forward output: the memory plan reuses the rest. */
    memset(counted, 0, (size_t)n);
    bool has_backward = false;
    for (int i = 0; i < n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if (t->op == PDDE_OP_NONE || t->phase != PDDE_PHASE_BACKWARD) continue;
        if (!has_backward) memset(p->acts, 0, (size_t)L * sizeof *p->acts), has_backward = true;
        for (int k = 0; k < t->nsrc; k++) {
            const pdde_tensor *s = t->src[k];
            while (s->flags & PDDE_TENSOR_VIEW && s->nsrc > 0) s = s->src[0];
            if (s->op == PDDE_OP_NONE || s->phase != PDDE_PHASE_FORWARD || counted[s->id]) continue;
            counted[s->id] = 1;
            p->acts[s->layer >= 0 && s->layer < L ? s->layer : 0] += (double)pdde_tensor_nbytes(s);
        }
    }
    free(counted);
    pdde_status st = plan_profile_index(g->ctx, p);
    if (st) plan_profile_free(p);
    return st;
}

/* The devices of one candidate, after those the plan leaves out: the plan's i-th device is dev[i]. */
typedef struct {
    const pdde_plan_devices *d;
    const int *dev;
    int n;
    const bool *blocking; /* [d->n_devices] lowering prefetches no ZeRO-3 gather there (plan_blocking_gathers) */
    bool regather;        /* lowering gathers ZeRO-3's parameters again for backward (lower_regather_on, read once a search) */
} plan_ranks;

static int plan_host(const plan_ranks *r, int i) { return r->d->host ? r->d->host[r->dev[i]] : 0; }

/* alpha-beta time of a ring allreduce of `bytes` over n ranks on one link kind. */
static double ring_allreduce_s(double bytes, int n, double bw, double lat) {
    if (n <= 1 || bytes <= 0) return 0;
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}

/* Does the group {first + i * stride : i < n} of the plan's devices span hosts? */
static bool plan_group_spans_hosts(const plan_ranks *r, int first, int stride, int n) {
    for (int i = 1; i < n; i++)
        if (plan_host(r, first + i * stride) != plan_host(r, first)) return true;
    return false;
}

/* Per-stage device figures of a candidate: the slowest and smallest device among the stage's ranks;
 * blocking_gathers: lowering prefetches no ZeRO-3 gather on some of them (their backend's memory). */
typedef struct {
    double flops, mem_bw, memory, op_latency;
    int worst_mem_device;
    bool blocking_gathers;
} plan_stage_devices;

/* Each device's !lower_prefetch_on_backend, decided once a search (it reads the environment: too slow for the
 * search's inner loops); NULL: out of memory. */
static bool *plan_blocking_gathers(const pdde_plan_devices *d) {
    bool *b = malloc((size_t)d->n_devices * sizeof *b);
    for (int i = 0; b && i < d->n_devices; i++) b[i] = !lower_prefetch_on_backend(d->backend ? d->backend[i] : NULL);
    return b;
}

/* How a stage recomputes: nothing, every layer, the fewest of its first layers that make it fit (the
 * search), or the counts a plan gives (rc_given). */
enum { RC_NONE, RC_ALL, RC_FEWEST, RC_GIVEN };

typedef struct {
    const plan_profile *prof;
    const pdde_plan_params *params;
    const plan_ranks *ranks;
    int dp, tp, pp, m, zero, v, rc, gpipe, blocks;
    const int *rc_given;
    double wire; /* bytes a collective carries per f32 byte: 1, or 0.5 in bf16 (with a cast each side) */
    double tp_bw, tp_lat, dp_bw, dp_lat, pp_bw, pp_lat;
    plan_stage_devices st[PDDE_PLAN_MAX_STAGES];
    /* uneven data parallelism: dp index i runs shares[i] x m micro-batches of 1 / (units x m) of the
     * batch, on each stage on the slowest device of its tp group there (plan_index_devices); rep[i]:
     * the slowest over its stages; most: the largest share; shares NULL: equal, units = dp */
    const int *shares;
    int units, most;
    plan_stage_devices rep[PDDE_PLAN_MAX_SHARES];
    double slots; /* m + (pp - 1) / v: the step in units of the slowest stage's per-micro time */
    const char *no_link; /* the group ("tp", "dp", "pp") whose devices have no link between them */
    /* placement: layers [place_first, place_last) on each rank's second device, the slowest and
     * smallest of which is `placed` (place_ok: every rank has one) */
    int place, place_first, place_last;
    bool place_ok;
    plan_stage_devices placed;
} plan_eval;

/* What a stage does per micro-batch, summed over its runs of layers (one, or `chunks` interleaved). */
typedef struct {
    double flops, bytes, ops, params, tp_ar, tp_n; /* forward work, parameters, tensor-parallel allreduces */
    double bflops, bbytes, bops, tensors;         /* backward work (0 ops: the graph has none); parameter tensors */
    double kept, biggest;                         /* activation bytes kept for backward; the largest layer's */
    double layer_params;                          /* the parameters of its largest layer (by bytes) */
    double r_flops, r_bytes, r_ops, r_tp_n;        /* forward work done again for recompute */
    double send;                                  /* bytes sent on to later stages */
    int n_send;
    int n_layers;                                 /* layers (ZeRO-3's prefetch hides all but the first's gathers) */
} stage_work;

/* Adds layers [a, b) with their first k recomputed. */
static void work_add(const plan_eval *e, stage_work *w, int a, int b, int k) {
    const plan_profile *p = e->prof;
    w->flops += prof_sum(p, PROF_FLOPS, a, b), w->bytes += prof_sum(p, PROF_BYTES, a, b), w->ops += prof_sum(p, PROF_OPS, a, b);
    w->params += prof_sum(p, PROF_PARAMS, a, b), w->tp_ar += prof_sum(p, PROF_TP_AR, a, b), w->tp_n += prof_sum(p, PROF_TP_N, a, b);
    w->bflops += prof_sum(p, PROF_BFLOPS, a, b), w->bbytes += prof_sum(p, PROF_BBYTES, a, b), w->bops += prof_sum(p, PROF_BOPS, a, b);
    w->tensors += prof_sum(p, PROF_TENSORS, a, b);
    w->n_layers += b - a;
    w->layer_params = fmax(w->layer_params, prof_max(p, p->max_params, a, b));
    w->kept += prof_sum(p, PROF_OUT, a, a + k) + prof_sum(p, PROF_ACTS, a + k, b);
    /* a recomputed layer's activations exist during its own backward: the stage's largest bounds it (so
     * that more layers recomputed never needs more memory) */
    if (k > 0) w->biggest = fmax(w->biggest, prof_max_acts(p, a, b));
    w->r_flops += prof_sum(p, PROF_FLOPS, a, a + k), w->r_bytes += prof_sum(p, PROF_BYTES, a, a + k);
    w->r_ops += prof_sum(p, PROF_OPS, a, a + k), w->r_tp_n += prof_sum(p, PROF_TP_N, a, a + k);
    if (e->pp > 1 && b < p->n_layers) w->send += p->out[b - 1], w->n_send++;
}

/* Whether lowering prefetches ZeRO-3's gathers (lower_zero3_prefetch) on devices d: on for each one's
 * backend, and equal shares (uneven ones' phantom micro-batches keep them blocking). */
static bool zero3_prefetched(const plan_eval *e, const plan_stage_devices *d) { return !d->blocking_gathers && !e->shares; }

/* Bytes one device of stage s (devices d: the stage's own, or its placement target's) holds. */
static double stage_memory(const plan_eval *e, int s, const plan_stage_devices *d, const stage_work *w) {
    double dp = e->dp, params = w->params / e->tp, per_micro = 1.0 / ((double)e->units * e->m * e->tp);
    double weights = e->zero >= 3 ? params / dp : params;
    double grads = e->zero >= 2 ? params / dp : params;
    double adam = 2 * (e->zero >= 1 ? params / dp : params);
    /* micro-batches (chunks, interleaved) whose activations the schedule keeps alive on stage s: GPipe
     * all of them, 1F1B those in flight */
    double m = (double)e->m * (e->shares ? e->most : 1); /* (uneven shares: the largest share's) */
    double alive = e->gpipe ? m
                 : e->v > 1 ? fmin(m * e->v, 2.0 * (e->pp - s - 1) + (e->v - 1) * e->pp + 1) / e->v
                            : fmin(m, (double)(e->pp - s));
    /* ZeRO-3: the parameters gathered whole over dp where they are used, in each micro-batch's arena:
     * a layer's at a time, gathered again for backward (lowering's regathering), else every layer's
     * from its forward to its backward (PDDE_ZERO3_REGATHER=0); with the prefetch the next layer's
     * too (PDDE_ZERO3_PREFETCH) */
    double layers = zero3_prefetched(e, d) ? 2 : 1;
    double gathered = e->zero >= 3 && e->dp > 1 ? (e->ranks->regather ? fmin(layers * w->layer_params / e->tp, params) : params) : 0;
    return weights + grads + adam + (alive * w->kept + w->biggest) * per_micro + alive * gathered;
}

/* A collective of `bytes` (f32) in the wire's dtype: casting there and back reads and writes it. */
static double cast_s(const plan_eval *e, const plan_stage_devices *d, double bytes) {
    return e->wire < 1 ? 3 * bytes / d->mem_bw + 2 * d->op_latency : 0;
}

/* ZeRO-3's gathers of a micro-batch (forward and again backward) of wbytes of parameters per rank. */
static double zero3_gather_s(const plan_eval *e, const plan_stage_devices *d, double wbytes) {
    double dp = e->dp;
    if (e->zero < 3 || e->dp < 2) return 0;
    return 2 * ((dp - 1) / dp * wbytes * e->wire / e->dp_bw + (dp - 1) * e->dp_lat + cast_s(e, d, wbytes / dp));
}

/* The plan's index of the device running member i (d * tp + t) of stage s. */
static int plan_member(const plan_eval *e, int s, int i) { return e->blocks ? s * e->dp * e->tp + i : i * e->pp + s; }

/* x becomes the slowest and smallest of itself and device dev. */
static void devices_take(plan_stage_devices *x, const plan_ranks *r, int dev) {
    const pdde_plan_devices *d = r->d;
    if (d->flops[dev] < x->flops) x->flops = d->flops[dev];
    if (d->mem_bw[dev] < x->mem_bw) x->mem_bw = d->mem_bw[dev];
    if (d->memory[dev] < x->memory) x->memory = d->memory[dev], x->worst_mem_device = dev;
    if (d->op_latency && d->op_latency[dev] > x->op_latency) x->op_latency = d->op_latency[dev];
    if (r->blocking[dev]) x->blocking_gathers = true;
}

/* The slowest and smallest device of data-parallel index i's tensor-parallel group on stage s. */
static plan_stage_devices plan_index_devices(const plan_eval *e, int s, int i) {
    plan_stage_devices x = {DBL_MAX, DBL_MAX, DBL_MAX, 0, 0, false};
    for (int t = 0; t < e->tp; t++) devices_take(&x, e->ranks, e->ranks->dev[plan_member(e, s, i * e->tp + t)]);
    return x;
}

/* One micro-batch's forward, backward and recompute of work w on devices d, with its tensor-parallel
 * allreduces, stage-crossing sends and ZeRO-3 gathers; *fwd_s: the forward's compute. */
static double micro_time(const plan_eval *e, const plan_stage_devices *d, const stage_work *w, double *fwd_s) {
    double share = 1.0 / ((double)e->units * e->m * e->tp);
    /* about half of a block's other ops (its layernorms, residual adds) run whole on every tensor-parallel rank */
    double bytes_share = share * (0.5 * e->tp + 0.5);
    double fwd = w->flops / d->flops * share + w->bytes / d->mem_bw * bytes_share + w->ops * d->op_latency;
    double bwd = w->bops > 0 ? w->bflops / d->flops * share + w->bbytes / d->mem_bw * bytes_share + w->bops * d->op_latency
                             : 2 * fwd; /* a graph without its backward: twice the forward */
    double t = fwd + bwd + w->r_flops / d->flops * share + w->r_bytes / d->mem_bw * bytes_share + w->r_ops * d->op_latency;
    if (e->tp > 1 && w->tp_n > 0) { /* forward, backward and recompute: an allreduce per row-parallel linear */
        double per = w->tp_ar / ((double)e->units * e->m) / w->tp_n;
        t += (2 * w->tp_n + w->r_tp_n) * (ring_allreduce_s(per * e->wire, e->tp, e->tp_bw, e->tp_lat) + cast_s(e, d, per));
    }
    double wbytes = w->params / e->tp;
    if (w->n_send) t += 2 * (w->send / ((double)e->units * e->m) / e->pp_bw + w->n_send * e->pp_lat);
    /* parameters gathered for forward and again for backward; with the prefetch each layer's gathers
     * travel while the layer before it computes: the first layer's of a pass wait, the others where
     * they outlast that compute */
    double gather = zero3_gather_s(e, d, wbytes);
    if (gather > 0 && zero3_prefetched(e, d) && w->n_layers > 1) gather -= fmin(gather * (w->n_layers - 1) / w->n_layers, t);
    t += gather;
    *fwd_s = fwd;
    return t;
}

/* A stage's time per micro-batch on devices d, plus its gradient reduction and optimizer update spread
 * over the step's slots. */
static double stage_time_on(const plan_eval *e, const plan_stage_devices *d, const stage_work *w) {
    double fwd, t = micro_time(e, d, w, &fwd);
    /* uneven shares (d a stage's devices): the dp index whose pipeline takes longest on its devices
     * paces the step: its shares[i] x m micro-batches and the fill and drain, in the step's slots; a
     * smaller share also makes the larger one's ZeRO-3 gathers (phantom micro-batches) */
    int s = d >= e->st && d < e->st + e->pp ? (int)(d - e->st) : -1;
    for (int i = 0; e->shares && s >= 0 && i < e->dp; i++) {
        plan_stage_devices di = plan_index_devices(e, s, i);
        double f, ti = micro_time(e, &di, w, &f), runs = ((double)e->shares[i] * e->m + (e->pp - 1.0) / e->v) / e->slots;
        ti = runs * ti + (double)(e->most - e->shares[i]) * e->m / e->slots * zero3_gather_s(e, &di, w->params / e->tp);
        if (i == 0 || ti > t) t = ti, fwd = runs * f;
    }
    double dp = e->dp, wbytes = w->params / e->tp;
    double sync = e->dp > 1 ? ring_allreduce_s(wbytes * e->wire, e->dp, e->dp_bw, e->dp_lat) + cast_s(e, d, wbytes) : 0;
    if (e->params->overlap_dp) sync = fmax(0, sync - e->m * fwd * 2);
    double update = 32.0 / 4.0 * (e->zero >= 1 ? wbytes / dp : wbytes) / d->mem_bw; /* AdamW: p, g, m, v in; p, m, v out */
    if ((e->zero == 1 || e->zero == 2) && e->dp > 1) /* each updated shard gathered back into its parameter, one allgather a tensor */
        update += (dp - 1) / dp * wbytes * e->wire / e->dp_bw + w->tensors * (dp - 1) * e->dp_lat + cast_s(e, d, wbytes / dp);
    return t + (sync + update) / e->slots;
}

static double stage_time(const plan_eval *e, int s, const stage_work *w) { return stage_time_on(e, &e->st[s], w); }

/* The layers stage s recomputes of its run [a, b), as e->rc says; -1 when the stage does not fit. */
static int stage_recompute(const plan_eval *e, int s, int a, int b, stage_work *w) {
    int n = b - a, k;
    double room = e->st[s].memory;
    stage_work x;
#define WORK_FITS(kk) (memset(&x, 0, sizeof x), work_add(e, &x, a, b, (kk)), stage_memory(e, s, &e->st[s], &x) <= room)
    if (e->rc == RC_NONE || e->rc == RC_ALL || e->rc == RC_GIVEN) {
        k = e->rc == RC_NONE ? 0 : e->rc == RC_ALL ? n : e->rc_given[s] < n ? e->rc_given[s] : n;
        if (!WORK_FITS(k)) k = -1;
    } else if (WORK_FITS(0)) {
        k = 0;
    } else if (!WORK_FITS(n)) {
        k = -1;
    } else { /* memory falls as more layers are recomputed (from one on): the fewest that fit */
        int lo = 1, hi = n;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (WORK_FITS(mid)) hi = mid;
            else lo = mid + 1;
        }
        k = lo;
    }
#undef WORK_FITS
    if (w && k >= 0) memset(w, 0, sizeof *w), work_add(e, w, a, b, k);
    return k;
}

static double stage_time_placed(const plan_eval *e, int s, int a, int b, double *m_own, double *m_placed);

/* Stage s's cost for layers [a, b); DBL_MAX when they do not fit its memory (its devices', and with a
 * placement its second devices'). */
static double stage_cost(const plan_eval *e, int s, int a, int b) {
    stage_work w;
    if (e->place) {
        double m_own, m_placed, t = stage_time_placed(e, s, a, b, &m_own, &m_placed);
        return m_own > e->st[s].memory || m_placed > e->placed.memory ? DBL_MAX : t;
    }
    return stage_recompute(e, s, a, b, &w) < 0 ? DBL_MAX : stage_time(e, s, &w);
}

/* Interleaved stages: stage s holds runs s, s + pp, ... of the even cut of the layers into pp x v runs
 * (as pdde_strategy_pipeline_interleaved cuts them), each recomputed whole or not at all. */
static void stage_runs(const plan_eval *e, int s, stage_work *w) {
    int L = e->prof->n_layers, R = e->pp * e->v;
    memset(w, 0, sizeof *w);
    for (int r = s; r < R; r += e->pp) work_add(e, w, r * L / R, (r + 1) * L / R, e->rc == RC_ALL ? (r + 1) * L / R - r * L / R : 0);
}

/* Min over cuts of layers [0, L) into pp stages of the slowest stage's cost; cut[s] = first layer of s.
 * best[s][j] = the best for the first j layers on stages 0..s. Both terms are monotone in the split
 * point i (best[s-1][i] grows with i, stage_cost(s, i, j) shrinks), so bisection finds the crossing. */
static double plan_cut_stages(const plan_eval *e, int *cut, double *best, int *arg) {
    int L = e->prof->n_layers, S = e->pp;
    for (int j = 0; j <= L; j++) best[j] = j > 0 ? stage_cost(e, 0, 0, j) : DBL_MAX;
    for (int s = 1; s < S; s++) {
        double *prev = best + (size_t)(s - 1) * (L + 1), *cur = best + (size_t)s * (L + 1);
        int crossing = s; /* moves right as j grows (cost(i, j) grows with j): no need to look left of it */
        for (int j = 0; j <= L; j++) {
            cur[j] = DBL_MAX, arg[(size_t)s * (L + 1) + j] = -1;
            if (j < s + 1) continue;
            int lo = crossing, hi = j - 1; /* stage s takes [i, j), i in [s, j - 1] */
            while (lo < hi) {       /* first i where prev[i] >= cost(i, j) */
                int mid = (lo + hi) / 2;
                if (prev[mid] >= stage_cost(e, s, mid, j)) hi = mid;
                else lo = mid + 1;
            }
            crossing = lo;
            for (int i = lo - 1; i <= lo; i++) {
                if (i < s || i > j - 1) continue;
                double c = fmax(prev[i], stage_cost(e, s, i, j));
                if (c < cur[j]) cur[j] = c, arg[(size_t)s * (L + 1) + j] = i;
            }
        }
    }
    double result = best[(size_t)(S - 1) * (L + 1) + L];
    int j = L;
    cut[S] = L;
    for (int s = S - 1; s > 0; s--) j = cut[s] = result < DBL_MAX ? arg[(size_t)s * (L + 1) + j] : s;
    cut[0] = 0;
    return result;
}

/* The links each group's traffic crosses and each stage's slowest and smallest device: they depend on
 * the degrees and the layout only, so the search computes them once for all micro-batch counts, ZeRO
 * stages, dtypes and recompute choices. */
static void plan_links(plan_eval *e) {
    const plan_ranks *r = e->ranks;
    const pdde_plan_devices *d = r->d;
    int members = e->dp * e->tp, tp_stride = plan_member(e, 0, 1), dp_stride = plan_member(e, 0, e->tp);
    bool tp_x = plan_group_spans_hosts(r, 0, tp_stride, e->tp), dp_x = plan_group_spans_hosts(r, 0, dp_stride, e->dp);
    bool pp_x = plan_group_spans_hosts(r, 0, e->pp > 1 ? plan_member(e, 1, 0) : 1, e->pp);
    e->tp_bw = tp_x ? d->inter_bw : d->intra_bw, e->tp_lat = tp_x ? d->inter_lat : d->intra_lat;
    e->dp_bw = dp_x ? d->inter_bw : d->intra_bw, e->dp_lat = dp_x ? d->inter_lat : d->intra_lat;
    e->pp_bw = pp_x ? d->inter_bw : d->intra_bw, e->pp_lat = pp_x ? d->inter_lat : d->intra_lat;
    e->no_link = e->tp > 1 && !(e->tp_bw > 0) ? "tensor" : e->dp > 1 && !(e->dp_bw > 0) ? "data" : e->pp > 1 && !(e->pp_bw > 0) ? "pipeline" : NULL;
    for (int s = 0; s < e->pp; s++) {
        plan_stage_devices *sd = &e->st[s];
        sd->flops = sd->mem_bw = sd->memory = DBL_MAX, sd->op_latency = 0, sd->blocking_gathers = false;
        for (int i = 0; i < members; i++) {
            int dev = r->dev[plan_member(e, s, i)];
            plan_stage_devices *rd = e->dp <= PDDE_PLAN_MAX_SHARES ? &e->rep[i / e->tp] : NULL; /* its dp index's, over the stages */
            if (rd && i % e->tp == 0 && s == 0) *rd = (plan_stage_devices){DBL_MAX, DBL_MAX, DBL_MAX, 0, dev, false};
            devices_take(sd, r, dev);
            if (rd) devices_take(rd, r, dev);
        }
    }
    plan_stage_devices *pl = &e->placed;
    pl->flops = pl->mem_bw = pl->memory = DBL_MAX, pl->op_latency = 0, pl->worst_mem_device = 0;
    pl->blocking_gathers = !lower_prefetch_on_backend(d->place_backend);
    e->place_ok = d->place_flops && d->place_mem_bw && d->place_memory;
    for (int i = 0; i < r->n && e->place_ok; i++) {
        int dev = r->dev[i];
        e->place_ok = d->place_flops[dev] > 0 && d->place_mem_bw[dev] > 0 && d->place_memory[dev] > 0;
        if (d->place_flops[dev] < pl->flops) pl->flops = d->place_flops[dev];
        if (d->place_mem_bw[dev] < pl->mem_bw) pl->mem_bw = d->place_mem_bw[dev];
        if (d->place_memory[dev] < pl->memory) pl->memory = d->place_memory[dev], pl->worst_mem_device = dev;
        if (d->op_latency && d->op_latency[dev] > pl->op_latency) pl->op_latency = d->op_latency[dev];
    }
}

/* Uneven shares for the dp indices of candidate e (links computed), out of `units` micro-batch
 * units: each index's share in proportion to its speed on the model's forward work (its devices' time
 * for a micro-batch), at least 1, rounded down and the units left to the largest remainders. False
 * when the devices are alike (equal shares are the plan) or the shares come out equal. */
static bool plan_shares(const plan_eval *e, int units, int *shares) {
    if (e->dp < 2 || e->dp > PDDE_PLAN_MAX_SHARES || units <= e->dp) return false;
    int L = e->prof->n_layers;
    double speed[PDDE_PLAN_MAX_SHARES], total = 0, fastest = 0, slowest = DBL_MAX;
    for (int i = 0; i < e->dp; i++) {
        const plan_stage_devices *d = &e->rep[i];
        double t = prof_sum(e->prof, PROF_FLOPS, 0, L) / d->flops + prof_sum(e->prof, PROF_BYTES, 0, L) / d->mem_bw +
                   prof_sum(e->prof, PROF_OPS, 0, L) * d->op_latency;
        speed[i] = 1 / t, total += speed[i], fastest = fmax(fastest, speed[i]), slowest = fmin(slowest, speed[i]);
    }
    if (fastest < 1.05 * slowest) return false;
    int given = 0;
    double rest[PDDE_PLAN_MAX_SHARES];
    for (int i = 0; i < e->dp; i++) {
        double exact = units * speed[i] / total;
        shares[i] = exact < 1 ? 1 : (int)exact, rest[i] = exact - shares[i], given += shares[i];
    }
    while (given != units) { /* the largest remainders take the units left (the smallest give back what the minimum of 1 took) */
        int k = -1;
        for (int i = 0; i < e->dp; i++)
            if ((given < units || shares[i] > 1) && (k < 0 || (given < units ? rest[i] > rest[k] : rest[i] < rest[k]))) k = i;
        shares[k] += given < units ? 1 : -1, rest[k] += given < units ? -1 : 1, given += given < units ? 1 : -1;
    }
    for (int i = 1; i < e->dp; i++)
        if (shares[i] != shares[0]) return true;
    return false;
}

enum { PLAN_SHARE_OPTIONS = 64 }; /* uneven share vectors tried per degree and layout, at most */

/* Appends to v[*n..) every way of giving indices k..dp-1 `left` units, each at least 1 (v[*n][0..k)
 * given), but the equal one; v needs room for one more (the prefix is carried there). */
static void plan_share_compositions(int dp, int k, int left, int (*v)[PDDE_PLAN_MAX_SHARES], int *n) {
    if (k == dp - 1) {
        v[*n][k] = left;
        bool equal = true;
        for (int i = 1; i < dp; i++) equal &= v[*n][i] == v[*n][0];
        if (!equal) memcpy(v[*n + 1], v[*n], sizeof v[0]), (*n)++;
        return;
    }
    for (int x = 1; x <= left - (dp - k - 1); x++) v[*n][k] = x, plan_share_compositions(dp, k + 1, left - x, v, n);
}

/* The uneven share vectors the search tries for candidate e (links computed) on a global batch:
 * devices of different speeds only; out of u = dp + 1 .. 4 dp units dividing the batch, every vector
 * when there are at most PLAN_SHARE_OPTIONS - 1 of them all told (a few devices: the estimate's best
 * for sure), else each u's in proportion to the indices' speeds (plan_shares). v[n], units[n]: the
 * options (v needs room for one more); their count. */
static int plan_share_options(const plan_eval *e, int64_t batch, int (*v)[PDDE_PLAN_MAX_SHARES], int *units) {
    int n = 0, dp = e->dp, probe[PDDE_PLAN_MAX_SHARES];
    if (!plan_shares(e, dp + 1, probe)) return 0; /* (alike, or dp out of range) */
    double all = 0; /* compositions of u into dp parts: C(u - 1, dp - 1) */
    for (int u = dp + 1; u <= 4 * dp && u <= batch; u++) {
        double c = 1;
        for (int j = 1; j < dp; j++) c = c * (u - j) / j;
        all += batch % u ? 0 : c - (u % dp == 0);
    }
    for (int u = dp + 1; u <= 4 * dp && u <= batch; u++) {
        if (batch % u) continue;
        if (all < PLAN_SHARE_OPTIONS) {
            int before = n;
            plan_share_compositions(dp, 0, u, v, &n);
            for (int k = before; k < n; k++) units[k] = u;
        } else if (plan_shares(e, u, v[n]) && (n == 0 || memcmp(v[n], v[n - 1], sizeof v[0]))) {
            units[n++] = u;
        }
    }
    return n;
}

/* False when no cut can fit: the stages' weights, gradients and optimizer state, spread as evenly as
 * layers allow, exceed what the stages' devices hold together (the DP would only confirm it). */
static bool plan_may_fit(const plan_eval *e) {
    double dp = e->dp, per = prof_sum(e->prof, PROF_PARAMS, 0, e->prof->n_layers) / e->tp;
    double state = (e->zero >= 3 ? per / dp : per) + (e->zero >= 2 ? per / dp : per) + 2 * (e->zero >= 1 ? per / dp : per);
    double room = 0;
    for (int s = 0; s < e->pp; s++) room += e->st[s].memory;
    return state <= room;
}

/* A step time no cut can beat: every stage does at least its GEMMs' share (forward and backward:
 * the graph's backward GEMMs, or twice the forward's), so the slowest stage takes at least the whole
 * model's GEMM work over the stages' summed speed. */
static double plan_lower_bound(const plan_eval *e) {
    double speed = 0;
    for (int s = 0; s < e->pp; s++) speed += e->place ? fmax(e->st[s].flops, e->placed.flops) : e->st[s].flops;
    int L = e->prof->n_layers;
    double fwd = prof_sum(e->prof, PROF_FLOPS, 0, L), bwd = prof_sum(e->prof, PROF_BOPS, 0, L) > 0 ? prof_sum(e->prof, PROF_BFLOPS, 0, L) : 2 * fwd;
    if (e->shares) { /* uneven shares: at best every device busy all the step, at its own speed */
        double sum = 0;
        for (int i = 0; i < e->dp; i++)
            for (int s = 0; s < e->pp; s++) sum += plan_index_devices(e, s, i).flops;
        return (fwd + bwd) / e->tp / sum;
    }
    return e->slots * (fwd + bwd) / ((double)e->dp * e->m * e->tp) / speed;
}

/* Stage s with layers [a, b) of which those in [place_first, place_last) run on each rank's second
 * device: each part's work on its device (the placed part at the slowest rank's second device), the
 * activations crossing each boundary between the parts copied there in forward and their gradients
 * back in backward; *m_own, *m_placed: the memory of each device (its part's parameters, state and
 * activations). The stage's send to the next goes from the part holding its last layer. */
static double stage_time_placed(const plan_eval *e, int s, int a, int b, double *m_own, double *m_placed) {
    const plan_profile *p = e->prof;
    int L = p->n_layers, pa = e->place_first > a ? e->place_first : a, pb = e->place_last < b ? e->place_last : b;
    if (pb < pa) pa = pb = b; /* nothing of the stage placed */
    stage_work own, placed;
    memset(&own, 0, sizeof own), memset(&placed, 0, sizeof placed);
    work_add(e, &own, a, pa, 0), work_add(e, &own, pb, b, 0), work_add(e, &placed, pa, pb, 0);
    stage_work *last = pb == b && pb > pa ? &placed : &own;
    own.send = placed.send = 0, own.n_send = placed.n_send = 0;
    if (e->pp > 1 && b < L) last->send = p->out[b - 1], last->n_send = 1;
    double crossing = (pa > a && pb > pa ? p->out[pa - 1] : 0) + (pb < b && pb > pa ? p->out[pb - 1] : 0);
    double n_cross = (pa > a && pb > pa) + (pb < b && pb > pa);
    double copies = 2 * (crossing / ((double)e->units * e->m) / e->ranks->d->place_bw + n_cross * e->ranks->d->place_lat);
    *m_own = stage_memory(e, s, &e->st[s], &own), *m_placed = stage_memory(e, s, &e->placed, &placed);
    return stage_time_on(e, &e->st[s], &own) + (pb > pa ? stage_time_on(e, &e->placed, &placed) : 0) + copies;
}

/* A plan whose layers [place_first, place_last) run on each rank's second device: each stage as
 * stage_time_placed says, cut by the dynamic program (or as given: fixed_cut), nothing recomputed;
 * each device's memory against what it holds. */
static double plan_evaluate_placed(plan_eval *e, pdde_plan *plan, double *best, int *arg, bool fixed_cut) {
    int L = e->prof->n_layers;
    double worst = 0;
    if (!fixed_cut && e->pp > 1 && plan_cut_stages(e, plan->stage_first, best, arg) == DBL_MAX) /* the memory of an even cut says why */
        for (int s = 0; s <= e->pp; s++) plan->stage_first[s] = s * L / e->pp;
    if (e->pp == 1) plan->stage_first[0] = 0, plan->stage_first[1] = L;
    plan->recompute = 0, plan->peak_bytes = 0, plan->peak_device = -1;
    for (int s = 0; s < e->pp; s++) {
        int a = plan->stage_first[s], b = plan->stage_first[s + 1];
        double m_own, m_placed;
        worst = fmax(worst, stage_time_placed(e, s, a, b, &m_own, &m_placed));
        plan->recompute_layers[s] = 0;
        if (fmax(m_own, m_placed) > plan->peak_bytes)
            plan->peak_bytes = fmax(m_own, m_placed), plan->peak_device = m_own >= m_placed ? e->st[s].worst_mem_device : e->placed.worst_mem_device;
        if (plan->why[0]) continue;
        if (m_placed > e->placed.memory)
            snprintf(plan->why, sizeof plan->why, "out of memory on the %s device of device %d (stage %d, layers %d-%d placed there) by %.2f GiB (%.0f bytes)",
                     plan->place, e->placed.worst_mem_device, s, e->place_first > a ? e->place_first : a, (e->place_last < b ? e->place_last : b) - 1,
                     (m_placed - e->placed.memory) / 1073741824.0, m_placed - e->placed.memory);
        else if (m_own > e->st[s].memory)
            snprintf(plan->why, sizeof plan->why, "out of memory on device %d (stage %d: its layers beside those placed on %s) by %.2f GiB (%.0f bytes)",
                     e->st[s].worst_mem_device, s, plan->place, (m_own - e->st[s].memory) / 1073741824.0, m_own - e->st[s].memory);
    }
    plan->bubble_s = (e->slots - e->m) * worst;
    if (plan->why[0]) return plan->step_s = DBL_MAX;
    return plan->step_s = e->slots * worst;
}

/* Fills plan's prediction for candidate e (links computed: plan_links); returns its step time (DBL_MAX
 * when it does not fit, with plan->why saying where). fixed_cut: plan->stage_first is given. */
static double plan_evaluate(plan_eval *e, pdde_plan *plan, double *best, int *arg, bool fixed_cut) {
    int L = e->prof->n_layers;
    plan->dp = e->dp, plan->tp = e->tp, plan->pp = e->pp, plan->micro = e->m, plan->zero = e->zero, plan->chunks = e->v;
    plan->schedule = e->gpipe ? PDDE_PIPELINE_GPIPE : PDDE_PIPELINE_1F1B, plan->comm_dtype = e->wire < 1 ? PDDE_BF16 : PDDE_F32;
    plan->stage_blocks = e->blocks, plan->why[0] = 0;
    for (int i = 0; i < PDDE_PLAN_MAX_SHARES; i++) plan->shares[i] = e->shares && i < e->dp ? e->shares[i] : 0;
    plan->place[0] = 0, plan->place_first = plan->place_last = 0;
    if (e->place) {
        snprintf(plan->place, sizeof plan->place, "%s", e->ranks->d->place_backend);
        if (e->place_first != 1 || e->place_last != L - 1 || L <= 2) plan->place_first = e->place_first, plan->place_last = e->place_last;
    }
    if (e->no_link) {
        snprintf(plan->why, sizeof plan->why, "no link between the devices of a %s-parallel group", e->no_link);
        return plan->step_s = DBL_MAX;
    }
    if (e->place) return plan_evaluate_placed(e, plan, best, arg, fixed_cut);
    if (e->v > 1) /* interleaved: the even cut of runs (stage_first: an even cut, the layers' count per stage) */
        for (int s = 0; s <= e->pp; s++) plan->stage_first[s] = s * L / e->pp;
    bool fits = fixed_cut || e->v > 1 || plan_may_fit(e);
    double worst = fits && !fixed_cut && e->v == 1 ? plan_cut_stages(e, plan->stage_first, best, arg) : 0;
    if (worst == DBL_MAX) fits = false;
    if (!fits && e->v == 1) /* the memory of an even cut says why */
        for (int s = 0; s <= e->pp; s++) plan->stage_first[s] = s * L / e->pp;
    plan->peak_bytes = 0, plan->peak_device = -1, plan->recompute = 1;
    for (int s = 0; s < e->pp; s++) {
        int a = plan->stage_first[s], b = plan->stage_first[s + 1], k = b - a;
        stage_work w;
        if (e->v > 1) {
            stage_runs(e, s, &w), k = e->rc == RC_ALL ? b - a : 0;
        } else if ((k = stage_recompute(e, s, a, b, &w)) < 0) { /* does not fit: the memory with what it may recompute */
            k = e->rc == RC_NONE ? 0 : e->rc == RC_GIVEN && e->rc_given[s] < b - a ? e->rc_given[s] : b - a;
            memset(&w, 0, sizeof w), work_add(e, &w, a, b, k);
        }
        plan->recompute_layers[s] = k;
        if (k < b - a) plan->recompute = 0;
        double m = stage_memory(e, s, &e->st[s], &w);
        if (m > plan->peak_bytes) plan->peak_bytes = m, plan->peak_device = e->st[s].worst_mem_device;
        if (m > e->st[s].memory) {
            fits = false;
            if (!plan->why[0])
                snprintf(plan->why, sizeof plan->why, "out of memory on device %d (stage %d) by %.2f GiB (%.0f bytes)", e->st[s].worst_mem_device, s,
                         (m - e->st[s].memory) / 1073741824.0, m - e->st[s].memory);
        }
        if (fixed_cut || e->v > 1) worst = fmax(worst, stage_time(e, s, &w));
    }
    if (!fits) {
        if (!plan->why[0]) snprintf(plan->why, sizeof plan->why, "no cut of the layers into %d stages fits in memory", e->pp);
        return plan->step_s = DBL_MAX;
    }
    plan->step_s = e->slots * worst;
    plan->bubble_s = (e->slots - e->m) * worst;
    return plan->step_s;
}

/* Keeps the k best (smallest key) of a stream of plans, sorted. */
static void plan_keep(pdde_plan *list, int *n, int k, const pdde_plan *p, double key) {
    if (k <= 0 || (*n == k && key >= list[k - 1].step_s)) return;
    int i = *n < k ? (*n)++ : k - 1;
    while (i > 0 && list[i - 1].step_s > key) list[i] = list[i - 1], i--;
    list[i] = *p;
    list[i].step_s = key;
}

/* Rejected plans are ranked by what they would cost if they fitted (an even cut, memory ignored), so the
 * reasons shown are those of the plans a user would want. */
static double plan_unconstrained(plan_eval *e) {
    plan_stage_devices keep[PDDE_PLAN_MAX_STAGES];
    memcpy(keep, e->st, sizeof keep);
    double worst = 0;
    int L = e->prof->n_layers;
    for (int s = 0; s < e->pp; s++) {
        e->st[s].memory = DBL_MAX;
        stage_work w;
        if (e->v > 1) stage_runs(e, s, &w);
        else stage_recompute(e, s, s * L / e->pp, (s + 1) * L / e->pp, &w);
        worst = fmax(worst, stage_time(e, s, &w));
    }
    memcpy(e->st, keep, sizeof keep);
    return e->slots * worst;
}

/* A placed plan's time had it fitted (every device's memory ignored; an even cut). */
static double plan_placed_unconstrained(plan_eval *e) {
    plan_eval free_memory = *e;
    for (int s = 0; s < e->pp; s++) free_memory.st[s].memory = DBL_MAX;
    free_memory.placed.memory = DBL_MAX;
    pdde_plan p;
    memset(&p, 0, sizeof p);
    for (int s = 0; s <= e->pp; s++) p.stage_first[s] = s * e->prof->n_layers / e->pp;
    return plan_evaluate_placed(&free_memory, &p, NULL, NULL, true);
}

static pdde_status plan_check_inputs(pdde_context *ctx, const pdde_plan_devices *d, const pdde_plan_params *p) {
    if (d->n_devices < 1 || !d->flops || !d->mem_bw || !d->memory)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: devices need n_devices >= 1, flops, mem_bw and memory");
    for (int i = 0; i < d->n_devices; i++)
        if (!(d->flops[i] > 0) || !(d->mem_bw[i] > 0) || !(d->memory[i] > 0) || (d->op_latency && !(d->op_latency[i] >= 0 && d->op_latency[i] < 1))) {
            /* named as the cluster has it (the ranks' devices are its devices' copies), with the families
             * a calibration must measure together: a figure of 0 is one pdde-bench did not measure */
            char families[128] = "";
            for (int j = 0, n = 0; j < d->n_devices && n < (int)sizeof families; j++) {
                const char *b = d->backend ? d->backend[j] : "cpu";
                if (!strstr(families, b)) n += snprintf(families + n, sizeof families - (size_t)n, "%s%s", n ? "," : "", b);
            }
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: cluster device %d (%s, rank %d's): flops %g, mem_bw %g, memory %g must be positive; "
                              "op_latency %g in [0, 1) (a cluster file: run pdde-bench --devices %s%s%s)", d->cluster_device ? d->cluster_device[i] : i,
                              d->backend ? d->backend[i] : "cpu", i, d->flops[i], d->mem_bw[i], d->memory[i], d->op_latency ? d->op_latency[i] : 0,
                              families, d->place_flops && !strstr(families, d->place_backend) ? "," : "",
                              d->place_flops && !strstr(families, d->place_backend) ? d->place_backend : "");
        }
    if (!(d->intra_bw >= 0) || !(d->inter_bw >= 0) || !(d->intra_lat >= 0) || !(d->inter_lat >= 0) || isinf(d->intra_bw + d->inter_bw))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: link bandwidths (0 = no link) and latencies must be finite and >= 0");
    if (p->batch < 1) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: params.batch (the global batch of the graph) must be >= 1");
    if (d->place_flops && (!d->place_mem_bw || !d->place_memory || !d->place_backend[0] || !(d->place_bw > 0) || isinf(d->place_bw) || !(d->place_lat >= 0)))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: devices.place_flops needs place_mem_bw, place_memory, place_backend (\"%.15s\") and "
                          "a link to it: place_bw %g B/s > 0, place_lat %g s >= 0", d->place_backend, d->place_bw, d->place_lat);
    return PDDE_OK;
}

/* order[0..N): the devices, fastest first (stable), so that a plan on n < N devices leaves out the
 * slowest. */
static void plan_order_devices(const pdde_plan_devices *d, int *order) {
    for (int i = 0; i < d->n_devices; i++) order[i] = i;
    for (int i = 1; i < d->n_devices; i++)
        for (int j = i; j > 0 && d->flops[order[j]] > d->flops[order[j - 1]]; j--) { int t = order[j]; order[j] = order[j - 1], order[j - 1] = t; }
}

/* dev[0..n): the n fastest devices in the cluster's order (so a host's devices stay together). */
static void plan_pick_devices(const int *order, int n, int *dev) {
    for (int i = 0; i < n; i++) dev[i] = order[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && dev[j] < dev[j - 1]; j--) { int t = dev[j]; dev[j] = dev[j - 1], dev[j - 1] = t; }
}

pdde_status pdde_plan_evaluate(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params, pdde_plan *plan) {
    pdde_context *ctx = g ? g->ctx : NULL;
    if (!g || !devices || !params || !plan) return PDDE_ERR_INVALID_ARG;
    pdde_status st = plan_check_inputs(ctx, devices, params);
    if (st) return st;
    pdde_plan *p = plan;
    int n = p->dp * p->tp * p->pp, units = p->shares[0] > 0 ? 0 : p->dp, most = 0;
    for (int i = 0; i < PDDE_PLAN_MAX_SHARES && !units; i++) {
        if ((i < p->dp) != (p->shares[i] > 0) || p->dp < 2 || p->dp > PDDE_PLAN_MAX_SHARES || (p->pp > 1 && p->zero >= 2))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: shares: want dp = %d shares >= 1 (dp 2..%d), and with pipeline stages "
                              "(pp %d) ZeRO 0 or 1 (zero %d: the collectives of 2 and 3 in every micro-batch are made up by phantom "
                              "micro-batches in one stage only); share %d is %d", p->dp, PDDE_PLAN_MAX_SHARES, p->pp, p->zero, i, p->shares[i]);
        if (i == p->dp - 1)
            for (int k = 0; k < p->dp; k++) units += p->shares[k], most = p->shares[k] > most ? p->shares[k] : most;
    }
    if (p->dp < 1 || p->tp < 1 || p->pp < 1 || p->pp > PDDE_PLAN_MAX_STAGES || n > devices->n_devices || p->micro < 1 || p->chunks < 1 ||
        p->zero < 0 || p->zero > 3 || params->batch % ((int64_t)units * p->micro) || (p->comm_dtype != PDDE_F32 && p->comm_dtype != PDDE_BF16) ||
        (p->schedule != PDDE_PIPELINE_1F1B && p->schedule != PDDE_PIPELINE_GPIPE))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: dp %d x tp %d x pp %d (of %d devices), mb %d, zero %d, chunks %d, comm %s, schedule %d: "
                          "out of range or the batch %lld does not divide by dp (or the shares' sum) x mb", p->dp, p->tp, p->pp, devices->n_devices, p->micro, p->zero,
                          p->chunks, pdde_dtype_name(p->comm_dtype), (int)p->schedule, (long long)params->batch);
    plan_profile prof;
    if ((st = plan_profile_build(g, params->n_layers, &prof))) return st;
    int L = prof.n_layers, *order = malloc((size_t)devices->n_devices * sizeof *order), *dev = malloc((size_t)n * sizeof *dev);
    bool *blocking = plan_blocking_gathers(devices);
    if (!order || !dev || !blocking) {
        st = pdde_error(ctx, PDDE_ERR_OOM, "plan: out of memory");
    } else if (p->pp * p->chunks > L) {
        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: %d stages x %d chunks for %d layers", p->pp, p->chunks, L);
    } else if (p->chunks == 1) {
        if (p->stage_first[p->pp] == 0) /* no cut given: an even one */
            for (int s = 0; s <= p->pp; s++) p->stage_first[s] = s * L / p->pp;
        for (int s = 0; s < p->pp && !st; s++)
            if (p->stage_first[s] >= p->stage_first[s + 1] || (s == 0 && p->stage_first[0]) || (s == p->pp - 1 && p->stage_first[p->pp] != L))
                st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: stages must cut layers 0..%d into non-empty runs", L - 1);
    }
    if (!st) {
        plan_order_devices(devices, order);
        plan_pick_devices(order, n, dev);
        plan_ranks ranks = {devices, dev, n, blocking, lower_regather_on()};
        bool given = false;
        for (int s = 0; s < p->pp; s++) given |= p->recompute_layers[s] > 0;
        plan_eval e = {.prof = &prof, .params = params, .ranks = &ranks, .dp = p->dp, .tp = p->tp, .pp = p->pp, .m = p->micro,
                       .zero = p->zero, .v = p->chunks, .rc = p->recompute == 1 ? RC_ALL : given ? RC_GIVEN : RC_NONE,
                       .rc_given = p->recompute_layers, .gpipe = p->schedule == PDDE_PIPELINE_GPIPE, .blocks = p->stage_blocks,
                       .wire = p->comm_dtype == PDDE_BF16 ? 0.5 : 1, .shares = p->shares[0] > 0 ? p->shares : NULL, .units = units, .most = most, .place = p->place[0] != 0};
        e.slots = e.m + (double)(e.pp - 1) / e.v;
        plan_links(&e);
        plan_place_range(p, L, &e.place_first, &e.place_last);
        if (e.place && (!e.place_ok || e.shares || p->chunks > 1 || given || p->recompute == 1 || strcmp(p->place, devices->place_backend) || e.place_first >= e.place_last))
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan: place=%s (layers %d-%d) needs no chunks, no recompute and equal shares on devices whose "
                            "second device is a %s one (devices.place_backend \"%s\"%s)", p->place, e.place_first, e.place_last - 1, p->place,
                            devices->place_backend, e.place_ok ? "" : ", not every device has one");
        else
            plan_evaluate(&e, p, NULL, NULL, true);
        if (!st && params->cluster && params->build) st = plan_simulate(g, devices, params, dev, p);
    }
    free(order), free(dev), free(blocking);
    plan_profile_free(&prof);
    return st;
}

pdde_status pdde_plan_search(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params,
                             pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected) {
    pdde_context *ctx = g ? g->ctx : NULL;
    if (!g || !devices || !plans || max_plans < 1 || !n_fit || !n_rejected) return PDDE_ERR_INVALID_ARG;
    const pdde_plan_devices *d = devices;
    pdde_plan_params pp = params ? *params : (pdde_plan_params)PDDE_PLAN_PARAMS_INIT;
    pdde_status st = plan_check_inputs(ctx, d, &pp);
    if (st) return st;
    int max_micro = pp.max_micro > 0 ? pp.max_micro : 64;

    plan_profile prof;
    if ((st = plan_profile_build(g, pp.n_layers, &prof))) return st;
    int L = prof.n_layers, N = d->n_devices;
    int *order = malloc((size_t)N * sizeof *order);
    double *best = malloc((size_t)PDDE_PLAN_MAX_STAGES * (L + 1) * sizeof *best);
    int *arg = malloc((size_t)PDDE_PLAN_MAX_STAGES * (L + 1) * sizeof *arg), *dev = malloc((size_t)N * sizeof *dev);
    bool *blocking = plan_blocking_gathers(d);
    int keep_rejected = max_plans / 4 > 0 ? max_plans / 4 : 1, keep_fit = max_plans - keep_rejected;
    pdde_plan *rejected = malloc((size_t)keep_rejected * sizeof *rejected);
    if (!order || !best || !arg || !dev || !rejected || !blocking) {
        st = pdde_error(ctx, PDDE_ERR_OOM, "plan: out of memory");
        goto done;
    }
    plan_order_devices(d, order);
    pdde_moe_cost_params moe = PDDE_MOE_COST_PARAMS_INIT;
    bool has_moe = pp.cluster && plan_moe_params(g, &moe); /* (expert parallelism: by the MoE cost model, on the cluster) */
    bool regather = lower_regather_on();
    const char *unlinked = NULL; /* a group of devices without a link's bandwidth that kept plans off both lists */
    int a2a_hier = has_moe ? moe_a2a_hier_mode() : -1;

    /* Plans on every device, and on fewer that leave the slowest out: on small clusters any number,
     * on big ones only without the devices under half the fastest's speed. */
    int nf = 0, nr = 0, n_fast = 0;
    while (n_fast < N && d->flops[order[n_fast]] >= 0.5 * d->flops[order[0]]) n_fast++;
    for (int n = N; n >= 1; n--) {
        if ((N > 16 && n != N && n != n_fast) || (pp.use_all_devices && n != N)) continue;
        plan_pick_devices(order, n, dev);
        plan_ranks ranks = {d, dev, n, blocking, regather};
        for (int tp = 1; tp <= n; tp++) {
            if (n % tp || (tp > 1 && (pp.no_tp || (pp.tp_divisor > 0 && pp.tp_divisor % tp)))) continue;
            for (int pipe = 1; pipe * tp <= n; pipe++) {
                if ((n / tp) % pipe || pipe > L || pipe > PDDE_PLAN_MAX_STAGES || (pipe > 1 && pp.no_pp)) continue;
                int dpd = n / tp / pipe;
                if (pp.batch % dpd) continue;
                /* the layouts: pp innermost, and with stages, each stage on a block of devices */
                for (int blocks = 0; blocks <= (pipe > 1 && !pp.no_stage_blocks); blocks++) {
                    plan_eval links = {.prof = &prof, .params = &pp, .ranks = &ranks, .dp = dpd, .tp = tp, .pp = pipe, .blocks = blocks, .units = dpd};
                    plan_links(&links);
                    /* equal shares, then (devices of different speeds) uneven ones out of dp + 1 .. 4 dp units */
                    int options[PLAN_SHARE_OPTIONS + 1][PDDE_PLAN_MAX_SHARES], option_units[PLAN_SHARE_OPTIONS + 1];
                    option_units[0] = dpd;
                    int n_options = 1 + plan_share_options(&links, pp.batch, options + 1, option_units + 1);
                    for (int o = 0; o < n_options; o++)
                    for (int m = 1; m <= max_micro && m <= pp.batch / option_units[o]; m++) {
                        if (pp.batch % ((int64_t)option_units[o] * m)) continue;
                        links.shares = o ? options[o] : NULL, links.units = option_units[o], links.most = 0;
                        for (int i = 0; o && i < dpd; i++) links.most = options[o][i] > links.most ? options[o][i] : links.most;
                        /* interleaved stages (Megatron's virtual pipeline: m a multiple of the stages) */
                        for (int v = 1; v <= 4; v *= 2) {
                            if (v > 1 && (pipe == 1 || pp.no_interleave || m % pipe || v * pipe > L)) continue;
                            /* bf16 collectives only where there are collectives */
                            for (int bf = 0; bf <= (!pp.no_bf16_comm && dpd * tp > 1); bf++)
                                /* (uneven shares with stages: ZeRO 0 or 1; 2 and 3 reduce or gather in every
                                 * micro-batch, which the smaller shares make up by phantom ones in one stage only) */
                                for (int zero = 0; zero <= (dpd > 1 && !pp.no_zero ? (links.shares && pipe > 1 ? 1 : 3) : 0); zero++)
                                    /* recompute: the fewest layers per stage that fit; interleaved runs all or none.
                                     * GPipe is not tried: under this estimate it takes 1F1B's time with more
                                     * activations alive (pdde_plan_evaluate predicts it). Placement (one stage,
                                     * every rank with a second device): the middle layers there, nothing recomputed */
                                    for (int rc = v > 1 ? RC_NONE : RC_FEWEST; rc <= (v > 1 ? RC_ALL : RC_FEWEST + (links.place_ok && !links.shares)); rc++) {
                                        plan_eval e = links;
                                        e.m = m, e.v = v, e.zero = zero, e.wire = bf ? 0.5 : 1;
                                        e.rc = pp.no_recompute ? RC_NONE : rc;
                                        e.slots = m + (double)(pipe - 1) / v;
                                        if (v == 1 && rc == RC_FEWEST + 1) /* (past RC_FEWEST: the placed candidate) */
                                            e.place = 1, e.rc = RC_NONE, e.place_first = L > 2 ? 1 : 0, e.place_last = L > 2 ? L - 1 : L;
                                        if (pp.no_recompute && rc == RC_ALL) continue;
                                        if (nf == keep_fit && !e.no_link && plan_lower_bound(&e) >= plans[keep_fit - 1].step_s) continue;
                                        pdde_plan cand;
                                        memset(&cand, 0, sizeof cand);
                                        double t = plan_evaluate(&e, &cand, best, arg, false);
                                        if (t < DBL_MAX) plan_keep(plans, &nf, keep_fit, &cand, t);
                                        /* the MoE layers' experts split over the tp axis, or over the dp axis or
                                         * groups of ep of its ranks (the tokens over all dp ranks; with tp, each
                                         * expert's hidden units over tp too; ZeRO-3 gathers the parameters'
                                         * shards over the group axis before use): the step and the memory change
                                         * as the MoE cost model says */
                                        int ep_all = tp > 1 ? tp : dpd;
                                        bool moe_ok = has_moe && pipe == 1 && !e.place && !e.no_link && cand.step_s < DBL_MAX;
                                        for (int ep = 2; moe_ok && ep <= (tp > 1 && dpd - 1 > tp ? dpd - 1 : ep_all); ep++)
                                            /* (with tp > 1, ep = tp twice: the tp axis, then groups of tp of the dp ranks) */
                                            for (int tp_axis = tp > 1 && ep == tp; tp_axis >= 0; tp_axis--) {
                                                bool groups = tp > 1 ? !tp_axis : ep < dpd;
                                                if (moe.experts % ep || (tp > 1 && !groups ? 0 : dpd % ep) || (tp > 1 && groups && ep >= dpd) ||
                                                    (groups && e.shares))
                                                    continue;
                                                double dt = 0, dm = 0;
                                                pdde_moe_cost_params q = moe;
                                                q.zero = zero;
                                                plan_zero3_gathers gathers = {zero3_prefetched(&e, &e.st[0]), regather};
                                                if ((st = plan_moe_delta(ctx, pp.cluster, N, dev, dpd, tp, &q, ep, groups, gathers, a2a_hier, &dt, &dm))) goto done;
                                                pdde_plan with = cand;
                                                with.ep = ep, with.ep_dp = tp > 1 && groups && ep == tp;
                                                with.step_s += dt, with.peak_bytes += dm; /* (a plan that did not fit: its time had it fitted) */
                                                if (with.step_s > 0 && with.peak_bytes <= d->memory[with.peak_device >= 0 ? with.peak_device : dev[0]])
                                                    with.why[0] = 0, plan_keep(plans, &nf, keep_fit, &with, with.step_s);
                                            }
                                        if (t == DBL_MAX && !(moe_ok && ep_all > 1 && moe.experts % ep_all == 0) && !e.no_link) plan_keep(rejected, &nr, keep_rejected, &cand, e.place ? plan_placed_unconstrained(&e) : plan_unconstrained(&e));
                                        if (e.no_link && !unlinked) unlinked = e.no_link;
                                    }
                        }
                    }
                }
            }
        }
    }
    if (pp.cluster && pp.build) { /* the best by the estimate, ranked by simulating their real programs */
        int kept = 0;
        for (int i = 0; i < nf && !st; i++) {
            pdde_plan p = plans[i];
            plan_pick_devices(order, p.dp * p.tp * p.pp, dev);
            if ((st = plan_simulate(g, d, &pp, dev, &p))) break;
            if (p.why[0]) plan_keep(rejected, &nr, keep_rejected, &p, p.step_s);
            else plan_keep(plans, &kept, nf, &p, p.step_s); /* (kept <= i: the unread ones stay where they are) */
        }
        if (st) goto done;
        nf = kept;
    }
    for (int i = 0; i < nr && nf + i < max_plans; i++) plans[nf + i] = rejected[i];
    *n_fit = nf, *n_rejected = nr < max_plans - nf ? nr : max_plans - nf;
    if (nf == 0 && !nr && unlinked) /* (no other reason to give: say why those plans were not timed) */
        st = pdde_error(ctx, PDDE_ERR_NO_PLAN, "plan: no plan fits on %d devices: the devices of a %s-parallel group have no link "
                        "bandwidth between them (the cluster's intra / nic bandwidth is 0: a file from pdde-bench --no-comm; "
                        "run pdde-bench without --no-comm, or give the links a bandwidth)", N, unlinked);
    else if (nf == 0) st = pdde_error(ctx, PDDE_ERR_NO_PLAN, "plan: no plan fits on %d devices%s%s", N, nr ? "; the closest: " : "", nr ? rejected[0].why : "");
done:
    free(order), free(best), free(arg), free(dev), free(rejected), free(blocking);
    plan_profile_free(&prof);
    return st;
}

pdde_status pdde_plan_auto(pdde_graph *g, const pdde_cluster *cluster, const pdde_plan_params *params, pdde_plan *plan) {
    pdde_context *ctx = g ? g->ctx : NULL;
    if (!g || !cluster || !params || !plan) return PDDE_ERR_INVALID_ARG;
    /* the devices' GEMM speed at the graph's largest GEMM, on one device's share of its rows */
    int64_t m = 0, n = 0, k = 0;
    double most = 0;
    for (int i = 0; i < g->n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if (t->op != PDDE_OP_MATMUL || t->phase != PDDE_PHASE_FORWARD) continue;
        const pdde_tensor *a = t->src[0];
        int64_t cols = t->shape[t->ndim - 1], kk = pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A) ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
        double flops = 2.0 * (double)pdde_tensor_numel(t) * (double)kk;
        if (flops > most) most = flops, n = cols, k = kk, m = pdde_tensor_numel(t) / (cols > 0 ? cols : 1);
    }
    int nd = pdde_cluster_device_count(cluster);
    if (nd > 0 && m / nd > 0) m /= nd;
    pdde_plan_devices d;
    pdde_status st = pdde_plan_devices_init(ctx, cluster, m, n, k, &d);
    if (st) return st;
    pdde_plan plans[8];
    int nf = 0, nr = 0;
    st = pdde_plan_search(g, &d, params, plans, 8, &nf, &nr);
    if (!st) *plan = plans[0];
    pdde_plan_devices_free(&d);
    return st;
}

pdde_status pdde_plan_replan(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params, const pdde_plan *old,
                             pdde_plan *out) {
    if (!g || !devices || !params || !out) return PDDE_ERR_INVALID_ARG;
    pdde_plan_params pp = *params;
    pp.use_all_devices = 1; /* the job's ranks are the devices it has now */
    enum { KEEP = 8 };
    pdde_plan plans[KEEP];
    int nf = 0, nr = 0;
    pdde_status st = pdde_plan_search(g, devices, &pp, plans, KEEP, &nf, &nr);
    if (st) return st;
    *out = plans[0];
    if (old && old->dp * old->tp * old->pp == devices->n_devices) { /* the old plan still has its ranks */
        pdde_plan again = *old;
        /* kept when it fits and is within 1% of the best: changing plans costs a reshard of the state */
        if (pdde_plan_evaluate(g, devices, &pp, &again) == PDDE_OK && !again.why[0] && again.step_s <= 1.01 * plans[0].step_s) *out = again;
    }
    return PDDE_OK;
}
